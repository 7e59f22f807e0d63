//! [`MemoryStore`]: the store kept in memory, for the demo and for tests.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{Error, Result};
use crate::{BoxFuture, Store, Write};

/// A [`Store`] kept in a map in memory: nothing survives the process.
///
/// It follows the same contract as the durable stores, failed state included, and
/// [`MemoryStore::fail_next_commit`] lets gateway tests make a commit fail without a disk.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    entries: BTreeMap<String, Vec<u8>>,
    failure: Option<String>,
    fail_next_commit: Option<String>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next commit fail, applying nothing, with `reason` as the store's failure cause;
    /// the store then stays failed, as a durable store does after an I/O error.
    pub fn fail_next_commit(&self, reason: impl Into<String>) {
        self.lock().fail_next_commit = Some(reason.into());
    }

    // Only map operations run under the lock, and they do not panic (running out of memory
    // aborts), so a poisoned lock cannot hide a half-applied batch and is safe to use.
    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn commit_now(&self, batch: Vec<Write>) -> Result<()> {
        let mut state = self.lock();
        if let Some(cause) = &state.failure {
            return Err(Error::Failed { cause: cause.clone() });
        }
        if let Some(reason) = state.fail_next_commit.take() {
            state.failure = Some(reason.clone());
            return Err(Error::Failed { cause: reason });
        }
        for write in batch {
            match write {
                Write::Put { key, value } => {
                    state.entries.insert(key, value);
                }
                Write::Delete { key } => {
                    state.entries.remove(&key);
                }
            }
        }
        Ok(())
    }

    fn scan_now(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let state = self.lock();
        if let Some(cause) = &state.failure {
            return Err(Error::Failed { cause: cause.clone() });
        }
        Ok(state
            .entries
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect())
    }
}

impl Store for MemoryStore {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.commit_now(batch) })
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>> {
        let result = self.scan_now(prefix);
        Box::pin(async move { result })
    }

    fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn describe(&self) -> String {
        "in memory (nothing survives a restart)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::conformance;

    #[tokio::test]
    async fn memory_store_passes_the_conformance_suite() {
        conformance(&MemoryStore::new()).await;
    }

    #[tokio::test]
    async fn a_commit_told_to_fail_applies_nothing_and_fails_every_later_commit() {
        let store = MemoryStore::new();
        store.commit(vec![Write::put("jobs/a", b"1".to_vec())]).await.unwrap();
        store.fail_next_commit("disk on fire");
        let error = store.commit(vec![Write::put("jobs/b", b"2".to_vec())]).await.unwrap_err();
        assert!(matches!(&error, Error::Failed { cause } if cause == "disk on fire"), "{error}");
        assert_eq!(store.failure().as_deref(), Some("disk on fire"));
        let later = store.commit(vec![]).await.unwrap_err();
        assert!(matches!(&later, Error::Failed { cause } if cause == "disk on fire"), "{later}");
        assert!(matches!(store.scan("").await, Err(Error::Failed { .. })));
    }
}
