//! A job's latest placement decision as the core keeps it between rounds and readers see it:
//! made by a round of this process, read back from the store, or a hold for the tenant's quota.

use meridian_placement::{Decision, Omitted};

use crate::quota::{Hold, QuotaWait};
use crate::record::{CandidateView, StoredDecision, ToStored};

/// The latest placement decision of a job: made this run (full detail) or read back from the
/// store (as stored).
#[derive(Debug, Clone)]
pub enum Decided {
    /// Made by a round of this process.
    Live {
        /// When (Unix ms).
        at_ms: i64,
        /// The decision with every cluster's verdict.
        decision: Decision,
    },
    /// Read from the store (the decision that placed the job).
    Stored(StoredDecision),
    /// A round held the job back for its tenant's quota before placing it. Not stored: rounds
    /// work it out again after a restart.
    Quota {
        /// When the job began waiting for this (Unix ms).
        at_ms: i64,
        /// Which limit, with the numbers.
        wait: QuotaWait,
    },
}

impl Decided {
    /// The decision of a job that stays queued, compacted ([`Decision::compact`]): a queued job
    /// keeps it until its next decision, and a federation of 1,000 clusters would otherwise
    /// hold 1,000 verdicts for each of thousands of queued jobs.
    pub(crate) fn waiting(at_ms: i64, decision: Decision) -> Decided {
        Decided::Live { at_ms, decision: decision.compact(meridian_placement::KEPT_FEASIBLE) }
    }

    /// The explanation of `hold` made at `now_ms`, or None when `previous` already says it: a
    /// job that waits round after round for the same reason costs no allocation.
    pub(crate) fn held(previous: Option<&Decided>, hold: Hold<'_>, now_ms: i64) -> Option<Decided> {
        if let Some(Decided::Quota { wait, .. }) = previous
            && hold.is_explained_by(wait)
        {
            return None;
        }
        Some(Decided::Quota { at_ms: now_ms, wait: hold.wait() })
    }

    /// Whether this is a decision a round of this process made less than `max_age_ms` before
    /// `now_ms` (stored decisions and quota holds are never fresh: rounds place those again).
    pub(crate) fn is_fresh(&self, now_ms: i64, max_age_ms: i64) -> bool {
        match self {
            Decided::Live { at_ms, .. } => now_ms.saturating_sub(*at_ms) < max_age_ms,
            Decided::Stored(_) | Decided::Quota { .. } => false,
        }
    }

    /// When it was made (Unix ms), its summary, every verdict it lists and the ones it counts,
    /// for explanations.
    pub(crate) fn explained(&self) -> (i64, String, Vec<CandidateView>, Option<Omitted>) {
        match self {
            Decided::Live { at_ms, decision } => {
                (*at_ms, decision.summary(), CandidateView::all_of(decision), decision.omitted.clone())
            }
            Decided::Stored(stored) => {
                (stored.at_ms, stored.summary.clone(), stored.candidates.clone(), stored.omitted.clone())
            }
            Decided::Quota { at_ms, wait } => (*at_ms, wait.to_string(), Vec::new(), None),
        }
    }
}

impl ToStored for Decided {
    fn to_stored(&self, summary: String) -> StoredDecision {
        match self {
            Decided::Live { at_ms, decision } => StoredDecision {
                at_ms: *at_ms,
                summary,
                candidates: CandidateView::all_of(decision),
                omitted: decision.omitted.clone(),
            },
            Decided::Stored(stored) => StoredDecision { summary, ..stored.clone() },
            Decided::Quota { at_ms, .. } => {
                StoredDecision { at_ms: *at_ms, summary, candidates: Vec::new(), omitted: None }
            }
        }
    }
}
