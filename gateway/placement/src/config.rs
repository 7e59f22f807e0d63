//! The weights placement is configured with (`placement:` in the gateway's config): what money,
//! fragmentation, unknown waits and missed deadlines are worth in seconds, when holds start, and
//! how fast each GPU type is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Weights that turn money and fragmentation into seconds of delay. The defaults read as
/// documentation of what the federation values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct PlacementConfig {
    /// Seconds of waiting one US$ is worth. Default 60: a job may wait one more minute to save a
    /// dollar, so an 8×H100 hour on cloud (≈US$32) must save about half an hour of waiting.
    pub usd_to_seconds: f64,
    /// Seconds of delay that breaking a whole node (fragmentation 1.0) is worth. Default 300:
    /// enough to prefer a half-used node over a fresh one, far too little to make a job wait.
    pub fragmentation_weight_secs: f64,
    /// Expected wait when a cluster's release profile never frees enough GPUs and its agent gives
    /// no estimate of its own. Default 21,600 (6 h): an unknown wait is long, not free.
    pub unknown_wait_secs: f64,
    /// Once a job's burst threshold has passed (every owned cluster is expected to keep it waiting
    /// longer than `burst.after`), compute dollars count at this fraction of `usd_to_seconds`.
    /// The job's `maxUsdPerHour` already caps what it may spend, and its owner said that waiting
    /// past `after` is worth paying for. Default 0.1: a cloud cluster that starts hours sooner
    /// wins; one that saves only minutes still loses to a cheaper owned cluster.
    pub burst_usd_weight: f64,
    /// A queued gang that has waited this long and cannot start yet holds its best cluster (see
    /// [`crate::Holds`]): other jobs may use that cluster's free GPUs only if they are
    /// expected to finish before the gang is expected to start. Default 1,800 (30 min): long
    /// enough that most jobs never need a hold, short enough that a large gang is not starved
    /// by a stream of small ones.
    pub hold_after_secs: f64,
    /// Relative training throughput per GPU type (`h100: 2.5`, `v100: 0.4`); a type not listed
    /// counts as 1. A job's `runtime.estimate` is read as its run time on a type of speed 1, so on
    /// a type of speed 2 it costs half as many GPU-hours: the cheapest type for a job is the one
    /// with the lowest price ÷ speed. Empty (the default): every type is equally fast.
    pub gpu_speed: BTreeMap<String, f64>,
    /// Seconds of delay that finishing past a job's `runtime.deadline` is worth, added to the
    /// score of every cluster where the job is expected to finish late. Default 21,600 (6 h): a cluster that meets the
    /// deadline beats one that misses it unless the latter starts hours sooner or the former costs
    /// far more; the job's burst budget still bounds what it may spend.
    pub deadline_miss_penalty_secs: f64,
    /// For a queued job that cannot start now, the gateway asks this many of its best-scored
    /// clusters (those that cannot start it now either) for a start quote: when their own
    /// scheduler would start a gang of this shape (see `docs/architecture.md#start-quotes`).
    /// Default 3; 0 asks none, and placement estimates every wait from release profiles.
    pub quote_candidates: u32,
    /// How long a member's start quote is used before it is asked again. Default 60 s: quotes
    /// move as jobs start and end, and asking costs the member a plan (on Slurm, an
    /// `sbatch --test-only`).
    pub quote_ttl_secs: f64,
    /// When the cluster that could start a job now needs a data copy longer than this (seconds),
    /// the round first asks the feasible clusters nearer the data (a copy more than this much
    /// shorter) that cannot start it now for a start quote, and the job waits for the answer
    /// (one round trip) instead of copying at once. Default 60: a copy of a minute or less is
    /// never delayed for a question; a long one is worth a round trip to learn whether the
    /// cluster by the data frees the GPUs sooner than the copy ends. Very high: never ask.
    pub quote_before_copy_secs: f64,
    /// How many members a queued job that cannot start now may wait on as **sibling copies**:
    /// queued in each member's own scheduler (which plans and reserves for it exactly), started
    /// by whichever is ready first under a start lock the gateway grants once (see
    /// `docs/architecture.md#sibling-copies`). Chosen by score, so cost and data still count.
    /// Default 0 (off); at most [`MAX_SIBLING_COPIES`].
    pub sibling_copies: u32,
    /// How long a job that could start now on a member holding its sibling copy waits for that
    /// copy to ask for the start lock before it is offered there as usual (an offer replaces the
    /// copy with a new job at the back of that member's queue). Default 15 s: a few of Slurm's
    /// main scheduling passes and the agent's status polls; raise it where copies start only at
    /// backfill passes (`bf_interval`, 30 s by default). 0 offers at once.
    pub copy_start_grace_secs: f64,
}

/// The most sibling copies a job may have.
pub const MAX_SIBLING_COPIES: u32 = 8;

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            usd_to_seconds: 60.0,
            fragmentation_weight_secs: 300.0,
            unknown_wait_secs: 21_600.0,
            burst_usd_weight: 0.1,
            hold_after_secs: 1_800.0,
            gpu_speed: BTreeMap::new(),
            deadline_miss_penalty_secs: 21_600.0,
            quote_candidates: 3,
            quote_ttl_secs: 60.0,
            quote_before_copy_secs: 60.0,
            sibling_copies: 0,
            copy_start_grace_secs: 15.0,
        }
    }
}

impl PlacementConfig {
    /// Every out-of-range weight, each naming its field under `prefix` (`placement.`): all must
    /// be finite and not negative.
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        [
            ("usdToSeconds", self.usd_to_seconds),
            ("fragmentationWeightSecs", self.fragmentation_weight_secs),
            ("unknownWaitSecs", self.unknown_wait_secs),
            ("burstUsdWeight", self.burst_usd_weight),
            ("holdAfterSecs", self.hold_after_secs),
            ("deadlineMissPenaltySecs", self.deadline_miss_penalty_secs),
            ("quoteTtlSecs", self.quote_ttl_secs),
            ("quoteBeforeCopySecs", self.quote_before_copy_secs),
            ("copyStartGraceSecs", self.copy_start_grace_secs),
        ]
        .into_iter()
        .filter(|(_, value)| !(value.is_finite() && *value >= 0.0))
        .map(|(field, value)| format!("{prefix}{field}: {value} must be a finite number >= 0"))
        .chain(
            self.gpu_speed
                .iter()
                .filter(|(_, speed)| !(speed.is_finite() && **speed > 0.0))
                .map(|(gpu, speed)| format!("{prefix}gpuSpeed.{gpu}: {speed} must be a finite number > 0")),
        )
        .chain(
            (self.sibling_copies > MAX_SIBLING_COPIES).then(|| {
                format!("{prefix}siblingCopies: {} must be at most {MAX_SIBLING_COPIES}", self.sibling_copies)
            }),
        )
        .collect()
    }
}
