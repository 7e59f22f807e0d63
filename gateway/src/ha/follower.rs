//! A standby's read view: a snapshot of the store, then its changes as etcd reports them,
//! decoded into records and shown through the [`Handle`] as a [`meridian_core::ReadView`].
//!
//! The view is rebuilt from the decoded records after changes, at most every
//! [`MIN_REBUILD_GAP`] and never more often than twice the last rebuild's cost, so a busy
//! leader cannot make its standbys spend more than about a third of a core on following. When
//! etcd cannot be reached the view stays as it was (reads keep working, marked by the role
//! only) and the follower snapshots again once it can.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_core::record::{CLUSTER_PREFIX, DECISION_PREFIX, JOB_PREFIX};
use meridian_core::{Core, CoreConfig, Loaded};
use meridian_store::KeyRing;
use meridian_store::etcd::{Change, EtcdStore};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::runtime::{Handle, now_ms};

/// The shortest time between two rebuilds of the view.
pub const MIN_REBUILD_GAP: Duration = Duration::from_millis(100);

/// The longest pause between attempts to reach etcd.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The decoded records the view is built from.
#[derive(Default)]
struct Mirror {
    loaded: BTreeMap<String, Loaded>,
}

impl Mirror {
    /// Applies one stored value (None: deleted). A value that cannot be opened or decoded is
    /// left out and logged: the leader wrote it, so it is this gateway's key or release that
    /// is wrong.
    fn apply(&mut self, keys: &KeyRing, key: String, value: Option<Vec<u8>>) {
        let Some(value) = value else {
            self.loaded.remove(&key);
            return;
        };
        if !(key.starts_with(JOB_PREFIX) || key.starts_with(CLUSTER_PREFIX) || key.starts_with(DECISION_PREFIX)) {
            return;
        }
        let opened = match keys.open(&key, &value) {
            Ok(opened) => opened,
            Err(e) => {
                tracing::error!(%key, error = %e, "a standby cannot open a stored value; is its secrets key file the leader's?");
                return;
            }
        };
        match Loaded::decode([(key.clone(), opened)]) {
            Ok(loaded) => {
                self.loaded.insert(key, loaded);
            }
            Err(e) => tracing::error!(%key, error = %e, "a standby cannot decode a stored record"),
        }
    }

    fn build(&self, config: &CoreConfig) -> meridian_core::ReadView {
        let mut loaded = Loaded::default();
        for record in self.loaded.values() {
            loaded.jobs.extend(record.jobs.iter().cloned());
            loaded.clusters.extend(record.clusters.iter().cloned());
            loaded.decisions.extend(record.decisions.iter().cloned());
        }
        Core::follower(config.clone(), loaded, now_ms()).view()
    }
}

/// Follows `store` into `handle`'s view until `stop` flips.
pub(crate) async fn run(
    store: EtcdStore,
    keys: Arc<KeyRing>,
    config: CoreConfig,
    handle: Handle,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let snapshot = tokio::select! {
            snapshot = store.snapshot("") => snapshot,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (entries, revision) = match snapshot {
            Ok(snapshot) => snapshot,
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, "a standby cannot read etcd; its view stays as it was");
                    warned = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        warned = false;
        backoff = Duration::from_millis(100);
        let mut mirror = Mirror::default();
        let mut changed: Vec<String> = Vec::new();
        for (i, (key, value)) in entries.into_iter().enumerate() {
            if let Some(id) = key.strip_prefix(JOB_PREFIX) {
                changed.push(id.to_string());
            }
            mirror.apply(&keys, key, Some(value));
            // A standby that wins the election stops following at once: its own load must not
            // wait behind (or compete with) a view it will not show.
            if i % 1024 == 1023 {
                tokio::task::yield_now().await;
                if *stop.borrow() {
                    return;
                }
            }
        }
        if *stop.borrow() {
            return;
        }
        let started = std::time::Instant::now();
        handle.publish_standby_view(mirror.build(&config), &changed);
        handle.set_standby_warm(true);
        let mut gap = MIN_REBUILD_GAP.max(started.elapsed() * 2);
        tracing::debug!(revision, "standby view loaded");
        changed.clear();
        let mut changes = store.follow(revision);
        let mut next_build = Instant::now() + gap;
        let mut dirty = false;
        loop {
            tokio::select! {
                batch = changes.recv() => match batch {
                    Some(Ok(batch)) => {
                        absorb(&mut mirror, &keys, batch, &mut changed);
                        dirty = true;
                    }
                    Some(Err(e)) => {
                        tracing::info!(error = %e, "a standby's watch ended; reading the store again");
                        break;
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(next_build), if dirty => {
                    let started = std::time::Instant::now();
                    handle.publish_standby_view(mirror.build(&config), &changed);
                    changed.clear();
                    dirty = false;
                    gap = MIN_REBUILD_GAP.max(started.elapsed() * 2);
                    next_build = Instant::now() + gap;
                }
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// Applies a batch of changes; remembers which jobs changed.
fn absorb(mirror: &mut Mirror, keys: &KeyRing, batch: Vec<Change>, changed: &mut Vec<String>) {
    for change in batch {
        if let Some(id) = change.key.strip_prefix(JOB_PREFIX) {
            changed.push(id.to_string());
        }
        mirror.apply(keys, change.key, change.value);
    }
}
