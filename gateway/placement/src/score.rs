//! How good a feasible cluster is for a job, in seconds: lower is better.
//!
//! ```text
//! total = max(expected wait, data transfer time)          // data copies while the job waits
//!       + usd_to_seconds × (compute US$ + egress US$)     // × burst_usd_weight × after ÷ owned wait,
//!                                                         //   past burst.after
//! compute US$ = GPUs × price of the type ÷ its speed × runtime estimate
//!       + fragmentation_weight_secs × fragmentation       // 0 = fills nodes, ~1 = breaks whole nodes
//!       + deadline_miss_penalty_secs                      // only if expected to finish past runtime.deadline
//! ```

use std::collections::BTreeMap;

use meridian_proto::inventory::GpuRelease;
use meridian_proto::spec::DataRef;
use serde::{Deserialize, Serialize};

use super::filter::Need;
use super::fit::{Demand, Nodes, TypeOptions, fit_now};
use super::name::Name;
use super::network::NetworkTable;
use super::snapshot::ClusterSnapshot;

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
}

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
        .collect()
    }
}

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

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// The score formula (see the module doc).
fn combine(
    expected_start_secs: f64,
    usd: f64,
    fragmentation: f64,
    usd_weight_secs: f64,
    config: &PlacementConfig,
) -> f64 {
    expected_start_secs + usd_weight_secs * usd + config.fragmentation_weight_secs * fragmentation
}

/// Transfer time and egress per cluster region, computed once per region per decision: clusters
/// share a handful of regions, so this saves most network lookups.
pub(crate) struct RegionCosts<'a> {
    data: &'a [DataRef],
    network: &'a NetworkTable,
    cache: Vec<(&'a str, f64, f64)>,
}

impl<'a> RegionCosts<'a> {
    pub(crate) fn new(data: &'a [DataRef], network: &'a NetworkTable) -> Self {
        Self { data, network, cache: Vec::new() }
    }

    /// (transfer seconds, egress US$) to bring all data to `region`.
    pub(crate) fn get(&mut self, region: &'a str) -> (f64, f64) {
        if self.data.is_empty() {
            return (0.0, 0.0);
        }
        if let Some(&(_, secs, usd)) = self.cache.iter().find(|(r, _, _)| *r == region) {
            return (secs, usd);
        }
        let (mut secs, mut usd) = (0.0, 0.0);
        for data in self.data {
            let copy = self.network.copy(&data.region, region, data.size_gib);
            secs += copy.secs;
            usd += copy.usd;
        }
        self.cache.push((region, secs, usd));
        (secs, usd)
    }
}

/// Scores a cluster that passed the filter, for the GPU types in `options`.
pub(crate) fn score<'a>(
    need: &Need<'_>,
    cluster: &'a ClusterSnapshot,
    options: &TypeOptions,
    regions: &mut RegionCosts<'a>,
    config: &PlacementConfig,
) -> ScoreBreakdown {
    let demand = &need.demand;
    let nodes = cluster.nodes_for(need);
    let (option, fits_now, fragmentation, expected_wait_secs) = match fit_now(nodes, options, demand) {
        Ok((option, plan)) => {
            let fragmentation = plan.fragmentation(nodes, option.type_id, demand);
            (Some(option), true, fragmentation, 0.0)
        }
        Err(free_gpus) => {
            // Wait for the cheapest type; which nodes free up first is unknown, so fragmentation
            // is what the gang would leave on empty nodes.
            let option = options.first().copied();
            let gpu_type = option.and_then(|o| o.gpu_type(cluster.index()));
            let fragmentation = gpu_type.map_or(0.0, |t| empty_node_fragmentation(demand, nodes, t));
            (option, false, fragmentation, expected_wait_secs(cluster, free_gpus, need.total_gpus, config))
        }
    };
    let price = option.map_or(0.0, |o| o.price);
    let hours = need.job.runtime.estimate.as_secs_f64() / 3600.0;
    let compute_usd = need.total_gpus as f64 * price * hours;
    let (transfer_secs, egress_usd) = regions.get(&cluster.info().region);
    let expected_start_secs = expected_wait_secs.max(transfer_secs);
    let total = combine(expected_start_secs, compute_usd + egress_usd, fragmentation, config.usd_to_seconds, config);
    ScoreBreakdown {
        fits_now,
        gpu_type: option.and_then(|o| o.gpu_type(cluster.index()).cloned()).unwrap_or_default(),
        expected_wait_secs,
        transfer_secs,
        expected_start_secs,
        egress_usd,
        compute_usd,
        fragmentation,
        usd_weight_secs: config.usd_to_seconds,
        deadline_penalty_secs: 0.0,
        total,
    }
}

/// Earliest time the cluster is expected to have enough GPUs for the jobs already waiting in its
/// queues, the federation-queue jobs decided earlier this cycle to wait for it, plus this one: `free_gpus` (free GPUs of the acceptable nodes) plus the release profile.
/// Enough GPUs free now but in the wrong places (the gang did not fit) still need a release.
fn expected_wait_secs(cluster: &ClusterSnapshot, free_gpus: u64, job_gpus: u64, config: &PlacementConfig) -> f64 {
    let local: u64 = cluster.pressure.queues.iter().map(|q| u64::from(q.pending_gpus)).sum();
    let pending = local.saturating_add(cluster.waiting_gpus());
    let needed = pending.saturating_add(job_gpus);
    // Agents send releases ascending; sort a copy only if one did not.
    let releases = &cluster.pressure.releases;
    let (earliest, last) = if releases.windows(2).all(|w| w[0].after_secs <= w[1].after_secs) {
        earliest_enough(releases, free_gpus, needed)
    } else {
        let mut sorted = releases.clone();
        sorted.sort_by_key(|r| r.after_secs);
        earliest_enough(&sorted, free_gpus, needed)
    };
    if let Some(secs) = earliest {
        return secs as f64;
    }
    // Beyond the profile: trust the agent's own estimate if it gave one, but never less than the
    // last release it predicted.
    match cluster.pressure.estimated_wait_secs {
        0 => config.unknown_wait_secs.max(last as f64),
        estimate => estimate.max(last) as f64,
    }
}

/// The first release (ascending) after which `available` plus released GPUs reach `needed`, and
/// the time of the last release looked at.
fn earliest_enough(releases: &[GpuRelease], mut available: u64, needed: u64) -> (Option<u64>, u64) {
    let mut last = 0;
    for release in releases {
        available = available.saturating_add(u64::from(release.gpus));
        last = release.after_secs;
        if available >= needed {
            return (Some(release.after_secs), last);
        }
    }
    (None, last)
}

/// Fragmentation if the gang landed on empty nodes of the best-suited shape of `gpu_type`.
fn empty_node_fragmentation(demand: &Demand, nodes: Nodes<'_>, gpu_type: &str) -> f64 {
    nodes
        .shapes
        .iter()
        .filter(|s| s.gpu_type == gpu_type && s.gpu_memory_gib >= demand.min_gpu_memory_gib && s.gpus_per_node > 0)
        .filter(|s| nodes.selects(s))
        .filter_map(|shape| {
            let per_node = demand.per_empty_node(shape).min(demand.replicas);
            (per_node > 0).then(|| {
                let left = shape.gpus_per_node.saturating_sub(per_node.saturating_mul(demand.gpus));
                f64::from(left) / f64::from(shape.gpus_per_node)
            })
        })
        .fold(f64::INFINITY, f64::min)
        .min(1.0)
}
