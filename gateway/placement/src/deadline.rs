//! Deadlines: what missing a job's `runtime.deadline` would cost, and when it lets the job burst
//! before its `burst.after`.
//!
//! A deadline counts from submission, so the time already waited in the federation queue is
//! spent. The job's expected finish on a cluster is `expected start + runtime estimate`.
//!
//! - A cluster whose expected finish is past the deadline gets
//!   [`PlacementConfig::deadline_miss_penalty_secs`] added to its score.
//! - When the best owned cluster is expected to miss the deadline, the job is treated as past its
//!   burst threshold now: cloud clusters may take it (its `maxUsdPerHour` still applies, and
//!   `burst: never` still forbids them), and dollars count at the burst weight.
//! - A deadline that even an immediate start would miss is lost: nothing is penalised and it does
//!   not open the burst gate, since paying for the cloud could no longer meet it.
//!
//! The decision summary says which of these applied. A job without a deadline costs one branch.

use std::fmt::{self, Write};

use meridian_proto::inventory::Tier;
use meridian_proto::spec::JobSpec;
use serde::{Deserialize, Serialize};

use crate::config::PlacementConfig;
use crate::reasons::Secs;
use crate::verdict::{Candidate, Verdict};

/// One decision's view of a job's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineOutlook {
    /// Seconds from now to the deadline (negative once it has passed).
    left_secs: f64,
    /// The job's runtime estimate, seconds.
    estimate_secs: f64,
    /// Best owned cluster's expected finish, seconds from now (infinite when no owned cluster may
    /// run the job).
    owned_finish_secs: f64,
}

impl DeadlineOutlook {
    /// The outlook for `job` after `waited_secs` in the queue, given the best owned cluster's
    /// expected start; None when the job has no deadline.
    pub(crate) fn of(job: &JobSpec, waited_secs: f64, best_owned_start_secs: f64) -> Option<Self> {
        let deadline = job.runtime.deadline?;
        let estimate_secs = job.runtime.estimate.as_secs_f64();
        Some(Self {
            left_secs: deadline.as_secs_f64() - waited_secs,
            estimate_secs,
            owned_finish_secs: best_owned_start_secs + estimate_secs,
        })
    }

    /// Whether a cluster that started the job now would finish it in time.
    pub(crate) fn reachable(&self) -> bool {
        self.estimate_secs <= self.left_secs
    }

    /// Whether a start `expected_start_secs` from now would finish after the deadline.
    pub(crate) fn missed_by(&self, expected_start_secs: f64) -> bool {
        expected_start_secs + self.estimate_secs > self.left_secs
    }

    /// Whether the deadline can still be met, but not by the best owned cluster: the job may
    /// burst now.
    pub(crate) fn owned_would_miss(&self) -> bool {
        self.reachable() && self.owned_finish_secs > self.left_secs
    }

    /// Adds the miss penalty to every scored candidate expected to finish late (none when the
    /// deadline is already lost: every cluster would miss it alike).
    pub(crate) fn penalize(&self, candidates: &mut [Candidate], config: &PlacementConfig) {
        if !self.reachable() {
            return;
        }
        for candidate in candidates {
            if let Verdict::Scored(score) = &mut candidate.verdict
                && self.missed_by(score.expected_start_secs)
            {
                score.add_deadline_penalty(config.deadline_miss_penalty_secs);
            }
        }
    }

    /// Appends one sentence on the deadline to `summary`. `may_burst`: the job's burst rule
    /// allows cloud clusters at all.
    pub(crate) fn explain(&self, summary: &mut String, chosen: Option<&Candidate>, may_burst: bool) {
        // Writing to a String cannot fail.
        let _ = write!(summary, " {}", Sentence { outlook: self, chosen, may_burst });
    }
}

/// The deadline sentence of a summary.
struct Sentence<'a> {
    outlook: &'a DeadlineOutlook,
    chosen: Option<&'a Candidate>,
    may_burst: bool,
}

impl fmt::Display for Sentence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.outlook;
        if !o.reachable() {
            return write!(
                f,
                "Deadline in {}: it can no longer be met (the estimate is {}), so it does not change the choice.",
                Secs(o.left_secs.max(0.0)),
                Secs(o.estimate_secs)
            );
        }
        write!(f, "Deadline in {}: ", Secs(o.left_secs))?;
        if o.owned_finish_secs.is_finite() {
            write!(f, "owned clusters expected to finish in {}", Secs(o.owned_finish_secs))?;
        } else {
            f.write_str("no owned cluster can run the job")?;
        }
        if !o.owned_would_miss() {
            return f.write_str(", in time.");
        }
        let chosen_finish = self.chosen.and_then(Candidate::score).map(|s| s.expected_start_secs + o.estimate_secs);
        match (self.chosen, chosen_finish) {
            (Some(chosen), Some(finish)) if chosen.tier == Tier::Cloud => {
                write!(f, ", bursting early: {} is expected to finish in {}", chosen.cluster, Secs(finish))?;
                if o.missed_by(finish - o.estimate_secs) {
                    f.write_str(", still late")?;
                }
                f.write_str(".")
            }
            _ if !self.may_burst => f.write_str(", and the job may not burst (burst: never), so it will be late."),
            (Some(chosen), Some(_)) => {
                write!(f, "; cloud clusters were allowed early but {} still scored best.", chosen.cluster)
            }
            _ => f.write_str("; cloud clusters were allowed early but none can take the job now."),
        }
    }
}
