//! The per-job timers time alone acts on: offers waiting for their answer (and offers being
//! withdrawn), and `Unknown` jobs waiting for their cluster. In memory only: after a restart
//! an offer in flight is `Unknown` anyway, and `Unknown` jobs count from the restart.
//!
//! What happens when a timer is due is in `expiry.rs`; a job's change drops the timers its new
//! state no longer has ([`Timers::settle`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use meridian_proto::job::JobState;

use crate::record::JobRecord;

/// The timers, by job id.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// Offers in flight: since when (Unix ms), or since the last withdrawal was sent.
    offered_at: HashMap<String, i64>,
    /// Offers withdrawn after the offer timeout, waiting for the member to confirm that it does
    /// not run them.
    withdrawing: HashSet<String>,
    /// `Unknown` jobs: since when their cluster was last heard (Unix ms).
    unknown_since: HashMap<String, i64>,
}

impl Timers {
    /// Starts (or restarts) the offer timer of job `id` at `at_ms`.
    pub(crate) fn offered(&mut self, id: String, at_ms: i64) {
        self.offered_at.insert(id, at_ms);
    }

    /// Marks the offer of job `id` withdrawn; true the first time.
    pub(crate) fn withdraw(&mut self, id: String) -> bool {
        self.withdrawing.insert(id)
    }

    /// Whether the offer of job `id` is being withdrawn.
    pub(crate) fn is_withdrawing(&self, id: &str) -> bool {
        self.withdrawing.contains(id)
    }

    /// Starts the lost-job timer of job `id`, counted from `since_ms` (when its cluster was last
    /// heard).
    pub(crate) fn unknown(&mut self, id: String, since_ms: i64) {
        self.unknown_since.insert(id, since_ms);
    }

    /// Removes and returns, oldest first, the offers unanswered for at least `timeout`.
    pub(crate) fn due_offers(&mut self, now_ms: i64, timeout: Duration) -> Vec<String> {
        take_due(&mut self.offered_at, now_ms, timeout)
    }

    /// Removes and returns, oldest first, the jobs `Unknown` for at least `timeout`.
    pub(crate) fn due_unknown(&mut self, now_ms: i64, timeout: Duration) -> Vec<String> {
        take_due(&mut self.unknown_since, now_ms, timeout)
    }

    /// Drops the timers `job`'s state no longer has (an answered offer, a job heard from again).
    pub(crate) fn settle(&mut self, job: &JobRecord) {
        if job.state != JobState::Offered {
            self.offered_at.remove(&job.id);
            self.withdrawing.remove(&job.id);
        }
        if job.state != JobState::Unknown {
            self.unknown_since.remove(&job.id);
        }
    }
}

/// `d` in milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Removes and returns, oldest first, the ids whose timer started at least `timeout` before `now_ms`.
fn take_due(timers: &mut HashMap<String, i64>, now_ms: i64, timeout: Duration) -> Vec<String> {
    let timeout = millis(timeout);
    let mut due: Vec<(i64, String)> = timers
        .iter()
        .filter(|(_, since)| now_ms.saturating_sub(**since) >= timeout)
        .map(|(id, since)| (*since, id.clone()))
        .collect();
    due.sort();
    for (_, id) in &due {
        timers.remove(id);
    }
    due.into_iter().map(|(_, id)| id).collect()
}
