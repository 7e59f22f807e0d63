//! State the driver writes and handles read: one lock type, one place that decides what a
//! poisoned lock means (a panic while the value was being replaced; the value itself is intact).

use std::sync::{Arc, Mutex};

/// A value shared between the driver and every handle.
#[derive(Debug, Default)]
pub(crate) struct Shared<T>(Arc<Mutex<T>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Shared<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Arc::new(Mutex::new(value)))
    }

    /// Runs `f` with the value; the lock is held only for `f`.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        match self.0.lock() {
            Ok(mut value) => f(&mut value),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }
}

impl<T: Clone> Shared<T> {
    /// A copy of the value (for an `Arc`, a new reference).
    pub(crate) fn get(&self) -> T {
        self.with(|value| value.clone())
    }

    /// Replaces the value.
    pub(crate) fn set(&self, value: T) {
        self.with(|slot| *slot = value);
    }
}
