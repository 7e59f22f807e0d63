//! Reloading the certificate, key and client CA when they change on disk, without a restart.
//!
//! The files are polled (modification time and size) rather than watched: polling works the
//! same on every file system, including the symlink swaps Kubernetes does for mounted secrets.
//! A change that does not load (a half-written file, a key that does not match) keeps the old
//! configuration and logs an ERROR naming the file; the next change is tried again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use super::{ServerConfigs, TlsConfig};

/// What is known of one file: enough to notice that it changed.
type Stamp = Option<(SystemTime, u64)>;

/// Owns the current [`ServerConfigs`] and replaces them when the files change.
pub struct Reloader {
    config: TlsConfig,
    stamps: Vec<Stamp>,
    current: watch::Sender<Arc<ServerConfigs>>,
}

impl Reloader {
    /// Loads the files once; fails when they do not load (the gateway does not start).
    pub fn new(config: &TlsConfig) -> super::Result<Self> {
        let stamps = stamps(config);
        let configs = super::load(config)?;
        let (current, _) = watch::channel(Arc::new(configs));
        Ok(Self { config: config.clone(), stamps, current })
    }

    /// The current configurations; each new connection reads the latest.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ServerConfigs>> {
        self.current.subscribe()
    }

    /// Checks the files once; reloads when one changed. Returns whether a new configuration is
    /// now in use.
    pub fn check(&mut self) -> bool {
        let now = stamps(&self.config);
        if now == self.stamps {
            return false;
        }
        self.stamps = now;
        match super::load(&self.config) {
            Ok(configs) => {
                self.current.send_replace(Arc::new(configs));
                tracing::info!(cert = %self.config.cert.display(), "TLS certificate, key and client CA reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS files changed but do not load; keeping the previous ones");
                false
            }
        }
    }

    /// Polls every `reloadInterval` until `shutdown` flips.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.reload_interval.0);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Three small local files: cheap enough to stat and read on the runtime.
                _ = tick.tick() => {
                    self.check();
                }
                () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => return,
            }
        }
    }
}

fn stamps(config: &TlsConfig) -> Vec<Stamp> {
    [&config.cert, &config.key, &config.client_ca].into_iter().map(|path: &PathBuf| stamp(path)).collect()
}

fn stamp(path: &PathBuf) -> Stamp {
    // `metadata` follows symlinks, so a swapped link target counts as a change.
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
