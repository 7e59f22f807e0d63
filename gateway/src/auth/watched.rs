//! A value read from a file and read again when the file changes. A change is a different
//! SHA-256 of the contents, not a different modification time: these files are small, and a
//! timestamp's granularity can hide two writes in the same tick. A file that no longer loads
//! keeps the last good value and is logged as an error once per change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::LoadError;

/// What identifies one version of a file: its contents' digest (`None`: unreadable).
type Stamp = Option<[u8; 32]>;

/// A value loaded from `path`.
pub(crate) struct Watched<T> {
    path: PathBuf,
    loader: fn(&Path) -> Result<T, LoadError>,
    current: RwLock<Arc<T>>,
    /// The version last tried, loaded or not, so a bad file is reported once, not every poll.
    seen: Mutex<Stamp>,
}

impl<T> Watched<T> {
    /// Loads `path` now; an error here stops the gateway from starting.
    pub(crate) fn load(path: PathBuf, loader: fn(&Path) -> Result<T, LoadError>) -> Result<Self, LoadError> {
        let seen = stamp(&path);
        let value = loader(&path)?;
        Ok(Watched { path, loader, current: RwLock::new(Arc::new(value)), seen: Mutex::new(seen) })
    }

    /// The value in force.
    pub(crate) fn current(&self) -> Arc<T> {
        Arc::clone(&self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Loads the file again if it changed; returns whether a new value is in force.
    pub(crate) fn reload_if_changed(&self) -> bool {
        let now = stamp(&self.path);
        {
            let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *seen == now {
                return false;
            }
            *seen = now;
        }
        match (self.loader)(&self.path) {
            Ok(value) => {
                *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(value);
                tracing::info!(file = %self.path.display(), "reloaded");
                true
            }
            Err(error) => {
                tracing::error!(file = %self.path.display(), %error, "keeping the previous version: the changed file does not load");
                false
            }
        }
    }
}

fn stamp(path: &Path) -> Stamp {
    std::fs::read(path).ok().map(|bytes| super::tokens::sha256(&bytes))
}
