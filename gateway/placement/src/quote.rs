//! Members' start quotes, as placement reads them.
//!
//! A cluster's release profile says how many GPUs come back when, not of which type nor on which
//! nodes, so the wait placement derives from it is a guess. For a gang it is often wrong both
//! ways: 64 GPUs "back" may be scattered over nodes the gang cannot use, or be of a type it does
//! not want. A *start quote* is the member's own answer: its scheduler's plan says when a gang of
//! this shape starts there, per GPU type (see `LocalBackend::quote` in the agent).
//!
//! The gateway asks for quotes outside placement (a round never waits for one) and keeps the
//! answers per cluster in a [`Quotes`] book, keyed by [`quote_key`]. Placement reads them in
//! [`score`](crate::score): where a gang does not fit now and its cluster has a fresh quote for
//! its shape, the quoted start replaces the guess, per GPU type. The member knows nothing of the
//! federation's own queue and does not count its own queued jobs, so when anything waits ahead
//! there (jobs queued on the member, or federation jobs decided earlier in the round to wait for
//! it) the later of the quote and the guess counts.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use meridian_proto::spec::JobSpec;

use crate::name::Name;

/// One member's quote for one gang shape: when the gang could start there, per GPU type, on the
/// gateway's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Quote {
    /// Per GPU type the member quoted; an empty list means the member says the gang never starts
    /// there (or could not say).
    pub starts: Vec<QuotedStart>,
    /// When the answer arrived (Unix ms).
    pub received_at_ms: i64,
}

/// When a member expects to start a gang on one GPU type.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotedStart {
    /// The GPU type.
    pub gpu_type: Name,
    /// The expected start, Unix ms on the gateway's clock.
    pub start_at_ms: i64,
    /// The start needs the member to preempt lower-priority preemptible jobs: offered the job
    /// now, it queues it and stops them after their grace period.
    pub preempts: bool,
}

/// The quotes one cluster has given, by [`quote_key`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quotes {
    by_key: HashMap<u64, Quote, BuildHasherDefault<KeyHasher>>,
}

/// Hashes a [`quote_key`], which is a hash already, as itself: every placement decision looks up
/// each cluster's quote, and hashing the key again was most of that lookup's cost.
#[derive(Debug, Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; anything else is folded in, so it still works.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

impl Quotes {
    /// No quotes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The quote for shape `key`, if any.
    pub fn get(&self, key: u64) -> Option<&Quote> {
        self.by_key.get(&key)
    }

    /// Keeps `quote` for shape `key`, replacing an older one.
    pub fn insert(&mut self, key: u64, quote: Quote) {
        self.by_key.insert(key, quote);
    }

    /// When the oldest quote arrived (Unix ms), if there is any.
    pub fn oldest_received_ms(&self) -> Option<i64> {
        self.by_key.values().map(|q| q.received_at_ms).min()
    }

    /// Drops quotes that arrived before `oldest_ms`.
    pub fn expire(&mut self, oldest_ms: i64) {
        self.by_key.retain(|_, q| q.received_at_ms >= oldest_ms);
    }
}

/// What a member's answer depends on, hashed: the gang (replicas, per-replica resources, GPU
/// types and memory), the node selector, the priority and whether the job may be preempted. Jobs
/// with the same key get the same quote from a member. Only equality matters; the hash is stable
/// within one process, which is all the gateway's in-memory book needs.
pub fn quote_key(job: &JobSpec) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let r = &job.gang.resources;
    (job.gang.replicas, r.gpus, r.cpu, r.memory_gib, r.gpu_memory_gib, &r.gpu_types).hash(&mut hasher);
    job.placement.node_selector().to_string().hash(&mut hasher);
    (job.priority, job.preemptible).hash(&mut hasher);
    hasher.finish()
}
