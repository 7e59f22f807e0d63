//! Meridian's durable store: the seam between the gateway's single-threaded core and the disk.
//!
//! The core produces batches of [`Write`]s; a runtime hands each batch to [`Store::commit`], which
//! applies it with one durable transaction (group commit), and only answers clients once that
//! returns `Ok`. At start-up the gateway rebuilds its state with [`Store::scan`].
//!
//! Implementations:
//! - [`RedbStore`]: an embedded [redb](https://docs.rs/redb) file in the data directory, guarded by
//!   an exclusive `LOCK` file. It imports the previous release's `log.jsonl` once.
//! - [`MemoryStore`]: a map in memory, for the demo and for tests; it can be told to fail a commit.
//!
//! [`testing`] holds test support: a conformance suite that every implementation must pass and a
//! simulated disk for fault injection.
//!
//! ```
//! use meridian_store::{MemoryStore, Store, Write};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> meridian_store::Result<()> {
//! let store = MemoryStore::new();
//! store.commit(vec![Write::put("jobs/1", b"queued".to_vec()), Write::delete("jobs/0")]).await?;
//! assert_eq!(store.scan("jobs/").await?, vec![("jobs/1".to_string(), b"queued".to_vec())]);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod dir_lock;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod memory;
mod old_log;
mod redb_store;
pub mod sealed;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use error::{Error, Result};
pub use memory::MemoryStore;
pub use redb_store::RedbStore;
pub use sealed::{KeyRing, SealedStore};

/// How large one commit may be. The runtime never hands [`Store::commit`] a batch beyond these
/// (a batch is one transaction, so it cannot be split without losing atomicity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Writes (puts and deletes) in one batch at most.
    pub max_writes: usize,
    /// Bytes of keys and values in one batch at most.
    pub max_bytes: usize,
}

impl Limits {
    /// No limit (the embedded stores).
    pub const UNLIMITED: Limits = Limits { max_writes: usize::MAX, max_bytes: usize::MAX };

    /// Whether a batch of `writes` writes holding `bytes` bytes fits.
    pub fn fits(&self, writes: usize, bytes: usize) -> bool {
        writes <= self.max_writes && bytes <= self.max_bytes
    }
}

/// One change in a batch handed to [`Store::commit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` to `value`, replacing any earlier value.
    Put {
        /// The key, e.g. `jobs/7f3a…`.
        key: String,
        /// The value's bytes, stored as given.
        value: Vec<u8>,
    },
    /// Removes `key`; removing a key that is absent is not an error.
    Delete {
        /// The key to remove.
        key: String,
    },
}

impl Write {
    /// A [`Write::Put`] of `value` under `key`.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Write::Put { key: key.into(), value: value.into() }
    }

    /// A [`Write::Delete`] of `key`.
    pub fn delete(key: impl Into<String>) -> Self {
        Write::Delete { key: key.into() }
    }

    /// The key this write changes.
    pub fn key(&self) -> &str {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// A boxed, `Send` future, so that [`Store`] stays object safe (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// The gateway's durable state: batches of writes in, ordered scans out.
///
/// Callers commit one batch at a time and wait for it before answering clients; concurrent
/// commits are allowed but their relative order is then unspecified.
pub trait Store: Send + Sync + 'static {
    /// Applies every write of `batch` atomically; returns Ok only once all of it is durable (fsynced).
    /// After any failure the store is *failed*: this and every later commit returns
    /// Err(Error::Failed{..}) naming the first cause; nothing more is written.
    ///
    /// A commit that returned an error may or may not be durable (the disk may have kept it), but
    /// it is never partly applied.
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>>;

    /// Every (key, value) whose key starts with `prefix`, in key order (used at start-up).
    ///
    /// A failed store refuses scans too ([`Error::Failed`]): what it holds in memory may include
    /// writes that never reached the disk.
    #[allow(clippy::type_complexity, reason = "spelled out so that callers see the shape they get")]
    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>>;

    /// `Some(reason)` once the store has failed (for health checks and 503 bodies).
    ///
    /// The reason is for operators (it may name paths); show clients
    /// [`Error::public_message`] instead.
    fn failure(&self) -> Option<String>;

    /// A short description for logs, e.g. "redb at /var/lib/meridian/meridian.redb".
    fn describe(&self) -> String;

    /// The largest batch [`Store::commit`] takes; a larger one is refused with
    /// [`Error::TooLarge`] before anything is written (and the store does not fail).
    fn limits(&self) -> Limits {
        Limits::UNLIMITED
    }
}

impl Write {
    /// Bytes this write counts against [`Limits::max_bytes`]: its key plus its value.
    pub fn size(&self) -> usize {
        match self {
            Write::Put { key, value } => key.len() + value.len(),
            Write::Delete { key } => key.len(),
        }
    }
}
