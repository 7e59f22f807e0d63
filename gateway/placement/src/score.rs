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

use meridian_proto::inventory::GpuRelease;
use meridian_proto::spec::DataRef;

use crate::breakdown::{ScoreBreakdown, combine};
use crate::config::PlacementConfig;
use crate::fit::{Nodes, fit_now};
use crate::need::{Demand, Need};
use crate::network::NetworkTable;
use crate::options::{Span, TypeOption, TypeOptions};
use crate::snapshot::ClusterSnapshot;

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
    let nodes = Nodes::of(cluster, need);
    let hours = need.job.runtime.estimate.as_secs_f64() / 3600.0;
    let (transfer_secs, egress_usd) = regions.get(&cluster.info().region);
    let mut quoted = false;
    let mut preempts = false;
    let (option, fits_now, fragmentation, expected_wait_secs) = match fit_now(nodes, options, demand) {
        Ok((option, plan)) => {
            let fragmentation = plan.fragmentation(nodes, option.span, demand);
            (Some(option), true, fragmentation, 0.0)
        }
        Err(free_gpus) => {
            let guess = expected_wait_secs(cluster, free_gpus, need, config);
            // The member's own plan, where it quoted this shape; else wait for the cheapest type.
            let (option, wait) = match quoted_option(need, cluster, options, transfer_secs, hours, config) {
                Some((option, wait, by_preemption)) => {
                    quoted = true;
                    preempts = by_preemption;
                    // The member counts neither its own queued jobs nor the federation's: with
                    // either waiting ahead, the later estimate counts. A start by preemption
                    // jumps that queue (the victims are of lower priority).
                    let ahead = cluster.pressure.pending_gpus() > 0 || cluster.waiting_gpus() > 0;
                    (Some(option), if ahead && !by_preemption { wait.max(guess) } else { wait })
                }
                None => (options.first().copied(), guess),
            };
            // Which nodes free up first is unknown here, so fragmentation is what the gang would
            // leave on empty nodes.
            let fragmentation = option.map_or(0.0, |o| empty_node_fragmentation(demand, nodes, o.span));
            (option, false, fragmentation, wait)
        }
    };
    let price = option.map_or(0.0, |o| o.price);
    let compute_usd = need.total_gpus as f64 * price * hours;
    let expected_start_secs = expected_wait_secs.max(transfer_secs);
    let total = combine(expected_start_secs, compute_usd + egress_usd, fragmentation, config.usd_to_seconds, config);
    ScoreBreakdown {
        fits_now,
        gpu_type: option.and_then(|o| o.gpu_type(cluster.index())).unwrap_or_default(),
        expected_wait_secs,
        quoted,
        preempts,
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

/// The GPU type to wait for by the member's quote for this shape, with its quoted wait: of the
/// quoted types among `options`, the one whose start and compute cost weigh least. None without
/// a quote, or when the quote names none of them (the caller then guesses).
fn quoted_option(
    need: &Need<'_>,
    cluster: &ClusterSnapshot,
    options: &TypeOptions,
    transfer_secs: f64,
    hours: f64,
    config: &PlacementConfig,
) -> Option<(TypeOption, f64, bool)> {
    if cluster.quotes().is_empty() {
        return None;
    }
    let quote = cluster.quote(need.quote_key())?;
    let mut best: Option<(TypeOption, f64, bool, f64)> = None;
    // Members quote single types: a span waits by the release profile.
    for option in options.iter().filter(|o| !o.span.is_span()) {
        let Some(name) = cluster.index().gpu_type(option.span.first()) else { continue };
        let Some(start) = quote.starts.iter().find(|s| s.gpu_type == *name) else { continue };
        let wait = cluster.secs_until(start.start_at_ms);
        let weight = wait.max(transfer_secs) + config.usd_to_seconds * need.total_gpus as f64 * option.price * hours;
        if best.is_none_or(|(_, _, _, w)| weight < w) {
            best = Some((*option, wait, start.preempts, weight));
        }
    }
    best.map(|(option, wait, preempts, _)| (option, wait, preempts))
}

/// Earliest time the cluster is expected to have enough GPUs for the jobs already waiting in its
/// queues, the federation-queue jobs decided earlier this cycle to wait for it, plus this one: `free_gpus` (free GPUs of the acceptable nodes) plus the release profile.
/// Enough GPUs free now but in the wrong places (the gang did not fit) still need a release.
fn expected_wait_secs(cluster: &ClusterSnapshot, free_gpus: u64, need: &Need<'_>, config: &PlacementConfig) -> f64 {
    let local: u64 = cluster.pressure.queues.iter().map(|q| u64::from(q.pending_gpus)).sum();
    let pending = local.saturating_add(cluster.waiting_gpus());
    let needed = pending.saturating_add(need.total_gpus);
    // GPUs of preemptible jobs of lower priority count as free for this job: the member would
    // preempt them for it (after a grace period the member's quote states). A count, not a fit:
    // only a quote marked `preempts` lets the job be offered on them.
    let free_gpus = free_gpus.saturating_add(cluster.pressure.preemptible_below(need.job.priority));
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

/// Fragmentation if the gang landed on empty nodes of the best-suited shape of the types of `span`.
fn empty_node_fragmentation(demand: &Demand, nodes: Nodes<'_>, span: Span) -> f64 {
    nodes
        .shapes
        .iter()
        .enumerate()
        .filter(|(i, s)| {
            span.covers(nodes.index.type_id(*i)) && s.gpu_memory_gib >= demand.min_gpu_memory_gib && s.gpus_per_node > 0
        })
        .map(|(_, s)| s)
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
