//! The etcd store and leader election (feature `etcd`), for running several gateways against one
//! replicated state.
//!
//! - [`EtcdStore`] is a [`Store`](crate::Store): a commit is one etcd transaction, a scan reads
//!   page by page at one revision. [`EtcdStore::snapshot`] and [`EtcdStore::follow`] let a
//!   standby keep a copy current: snapshot at a revision, then follow the changes after it.
//! - [`Election`] elects one leader among the gateways with etcd's election API. The winner gets a
//!   [`Leadership`], whose [`Guard`] makes its commits conditional on still holding the election
//!   key ([`EtcdStore::with_guard`]), so a deposed leader's commit fails with
//!   [`Error::NotLeader`](crate::Error::NotLeader) and writes nothing.
//!
//! # Step-down rule
//!
//! The guard protects what goes through etcd. A leader also acts outside etcd (it dispatches
//! jobs), so it must stop acting before another gateway can be elected. The election key lives as
//! long as the leader's lease, and a [`Leadership`] computes a *deadline* before which that lease
//! cannot have expired:
//!
//! 1. A background task sends a keep-alive every `ttl / 4`, one at a time. Before sending it
//!    records `sent = std::time::Instant::now()`.
//! 2. When etcd answers with a TTL above zero, `deadline = sent + ttl - step_down_margin`, unless
//!    the deadline is already later (it never moves backwards). etcd received the keep-alive after
//!    `sent`, so it keeps the lease until at least `sent + ttl`: a new leader cannot exist before
//!    then, and a leader that stops at `deadline` stops `step_down_margin` earlier. The margin
//!    covers the two machines' clocks running at slightly different rates and the time the leader
//!    needs to notice.
//! 3. The first deadline is the lease grant's send time plus `ttl - step_down_margin`.
//! 4. [`Leadership::lost`] flips to `true` once: by timer 20 ms before the deadline (timers fire
//!    late, never early), even when keep-alives hang; or earlier when etcd reports the lease
//!    expired (TTL 0) or the election key is deleted. The task then stops sending keep-alives and
//!    revokes the lease, so that another gateway can be elected without waiting for the TTL.
//!
//! The clock is the std monotonic clock, which keeps counting while the process is stopped
//! (`SIGSTOP`, a debugger): a leader that resumes past its deadline finds itself invalid. It is
//! not tokio's clock, because validity is about real time at etcd, which a paused test clock
//! does not follow.
//!
//! ```no_run
//! use std::time::Duration;
//! use meridian_store::etcd::{EtcdConfig, EtcdStore};
//! use meridian_store::{Store, Write};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = EtcdStore::connect(EtcdConfig::default()).await?;
//! let election = store.election("gateway", Duration::from_secs(10), Duration::from_secs(2))?;
//! let leadership = election.campaign(b"gateway-1".to_vec()).await?;
//! let guarded = store.with_guard(leadership.guard());
//! guarded.commit(vec![Write::put("jobs/1", b"queued".to_vec())]).await?;
//! leadership.resign().await;
//! # Ok(())
//! # }
//! ```

mod config;
mod election;
mod follow;
mod leadership;
mod scan;
mod shared;
mod store;

pub use config::{EtcdConfig, EtcdTls};
pub use election::{Election, ElectionConfigError, Leader};
pub use leadership::Leadership;
pub use store::EtcdStore;

/// One change to a key under the store's prefix, as [`EtcdStore::follow`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The key, without the configured prefix.
    pub key: String,
    /// The new value; `None` when the key was deleted.
    pub value: Option<Vec<u8>>,
    /// The etcd revision of the change (one commit is one revision).
    pub revision: i64,
}

/// What makes a commit conditional: the election key must still exist with this create revision.
///
/// Get it from [`Leadership::guard`] and hand it to [`EtcdStore::with_guard`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    /// The full etcd key of the leader's election entry (prefix included).
    pub key: Vec<u8>,
    /// The create revision that key had when this gateway was elected (its epoch).
    pub create_revision: i64,
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix); an
/// empty prefix, or one of only `0xff` bytes, has no end: `[0]` asks etcd for every key after it.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_last_byte_plus_one() {
        assert_eq!(prefix_end(b"/meridian/"), b"/meridian0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
