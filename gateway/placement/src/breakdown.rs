//! What a cluster's score is made of: each term kept for `meridian explain`, and the formula that
//! totals them (written out in the [`score`](crate::score) module's doc). The burst gate and the
//! deadline penalty change a breakdown after scoring, so the formula lives with the type.

use serde::{Deserialize, Serialize};

use crate::config::PlacementConfig;
use crate::name::Name;

/// Each term of a cluster's score, kept so `meridian explain` can say why here and not there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScoreBreakdown {
    /// The whole gang fits on free nodes now.
    pub fits_now: bool,
    /// GPU type the gang would use here.
    pub gpu_type: Name,
    /// Seconds until enough GPUs are expected to be free (0 when it fits now).
    pub expected_wait_secs: f64,
    /// `expected_wait_secs` comes from the member's own start quote (its scheduler's plan for a
    /// gang of this shape), not from its release profile; left out of JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub quoted: bool,
    /// The member's quote starts the gang by preempting lower-priority preemptible jobs (after
    /// their grace): the job may be offered now, and the member preempts for it. Left out of JSON
    /// when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preempts: bool,
    /// Seconds to copy the job's data from other regions.
    pub transfer_secs: f64,
    /// max(wait, transfer): when the job is expected to start.
    pub expected_start_secs: f64,
    /// US$ of egress for that copy.
    pub egress_usd: f64,
    /// US$ for the gang's GPUs over the runtime estimate on this GPU type (the estimate ÷ the
    /// type's speed; charge-back rate on owned clusters).
    pub compute_usd: f64,
    /// 0..1: mean share of a touched node's GPUs left free after placing (0 = fills nodes).
    pub fragmentation: f64,
    /// Seconds of waiting one US$ counted for in `total` (lower once the burst threshold passed).
    pub usd_weight_secs: f64,
    /// Seconds added because the job is expected to finish past its `runtime.deadline` here
    /// (`deadlineMissPenaltySecs`); 0, and left out of JSON, otherwise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline_penalty_secs: f64,
    /// The score; lower is better.
    pub total: f64,
}

impl ScoreBreakdown {
    /// Recomputes `total` with `usd_weight_secs` seconds per US$.
    pub(crate) fn reweigh_cost(&mut self, usd_weight_secs: f64, config: &PlacementConfig) {
        self.usd_weight_secs = usd_weight_secs;
        self.total = combine(
            self.expected_start_secs,
            self.compute_usd + self.egress_usd,
            self.fragmentation,
            usd_weight_secs,
            config,
        ) + self.deadline_penalty_secs;
    }

    /// Counts `penalty_secs` for finishing past the job's deadline here.
    pub(crate) fn add_deadline_penalty(&mut self, penalty_secs: f64) {
        self.deadline_penalty_secs += penalty_secs;
        self.total += penalty_secs;
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// The score formula (see the [`score`](crate::score) module's doc).
pub(crate) fn combine(
    expected_start_secs: f64,
    usd: f64,
    fragmentation: f64,
    usd_weight_secs: f64,
    config: &PlacementConfig,
) -> f64 {
    expected_start_secs + usd_weight_secs * usd + config.fragmentation_weight_secs * fragmentation
}
