//! Which clusters may run a job at all, and why the others may not.
//!
//! The checks here depend only on the job and on what a cluster *is* (shapes, region, backend,
//! tier, prices, labels), never on what is free now, so the same code answers both "can it go there now"
//! (with [`Rejection::Disconnected`] and [`Rejection::BurstNotYet`] added by the caller) and
//! "could it ever go anywhere" at submit time.

use std::sync::Arc;

use meridian_proto::inventory::{BackendKind, NodeShape, Tier};
use meridian_proto::spec::BurstPolicy;

use crate::need::{Need, PayloadKind};
use crate::options::{Span, TypeOption, TypeOptions};
use crate::reasons::{Reasons, Rejection};
use crate::snapshot::ClusterSnapshot;
use crate::statics::{JobClass, StaticCache, StaticVerdict};

/// Checks everything about `cluster` that does not change with load, pushing each reason it may
/// not run the job onto `reasons`. Returns the GPU types the gang may use, cheapest first;
/// meaningful only when no reason was pushed.
pub(crate) fn static_rejections(need: &Need<'_>, cluster: &ClusterSnapshot, reasons: &mut Reasons) -> TypeOptions {
    let job = need.job;
    let demand = &need.demand;
    let info = cluster.info();
    let shapes = &cluster.inventory().shapes;
    let cloud = info.tier == Tier::Cloud;
    let budget = match job.placement.burst {
        BurstPolicy::After { max_usd_per_hour: Some(max), .. } if cloud => Some(max),
        _ => None,
    };
    let wanted = &job.gang.resources.gpu_types;

    let (mut any_type, mut any_selected, mut any_memory) = (false, false, false);
    let (mut largest_gib, mut largest_node_gpus, mut max_replicas) = (0u32, 0u32, 0u64);
    let mut cheapest_over_budget = f64::INFINITY;
    let mut options = TypeOptions::default();
    let index = cluster.index();
    // Whole-GPU types that could join a span: (id, replicas on empty nodes, hourly price, speed).
    // Only the builtin scheduler takes a gang over several types (Slurm's `--gres` names one
    // type or any, and Kueue gives a pod set one flavor), and only types whose speeds the
    // operator listed are known to run alike.
    let spans = info.backend == BackendKind::Builtin;
    // On the stack: this runs for every cluster of every check that misses the static cache
    // (`fits_now`, `reserve`). Types past the first MAX_SPANNABLE join no span.
    let mut spannable = [(0usize, 0u64, 0.0f64, 0.0f64); MAX_SPANNABLE];
    let mut spannable_len = 0usize;
    // Whether an option (one type or a span) of `capacity` replicas on empty nodes, at `price` a
    // GPU-hour, may run the gang: it holds the gang, and the whole gang's price per hour is within
    // the burst budget (the cheapest price over it is kept for the rejection).
    let mut admits = |capacity: u64, price: f64| {
        if capacity < u64::from(demand.replicas) {
            return false;
        }
        let hourly = need.total_gpus as f64 * price;
        match budget {
            Some(max) if hourly > max => {
                cheapest_over_budget = cheapest_over_budget.min(hourly);
                false
            }
            _ => true,
        }
    };
    for (type_id, first) in shapes.iter().enumerate() {
        // Visit each GPU type once, at its first shape (whose index is the type's id).
        if index.type_id(type_id) != type_id || !accepts_type(wanted, &first.gpu_type, index.is_slice(type_id)) {
            continue;
        }
        any_type = true;
        let mut capacity = 0u64;
        let same_type = |(offset, _): &(usize, &NodeShape)| index.type_id(type_id + offset) == type_id;
        for (_, shape) in shapes[type_id..].iter().enumerate().filter(same_type) {
            // Nodes the nodeSelector rules out count for nothing here.
            if !need.selects(shape) {
                continue;
            }
            any_selected = true;
            largest_gib = largest_gib.max(shape.gpu_memory_gib);
            if shape.gpu_memory_gib < demand.min_gpu_memory_gib {
                continue;
            }
            any_memory = true;
            largest_node_gpus = largest_node_gpus.max(shape.gpus_per_node);
            let per_node = u64::from(demand.per_empty_node(shape));
            capacity = capacity.saturating_add(per_node.saturating_mul(u64::from(shape.node_count())));
        }
        max_replicas = max_replicas.max(capacity);
        let price = cluster.price(type_id);
        if spans
            && capacity > 0
            && type_id < Span::MAX_TYPE_ID
            && !index.is_slice(type_id)
            && let Some(speed) = cluster.known_speed(type_id)
            && let Some(slot) = spannable.get_mut(spannable_len)
        {
            *slot = (type_id, capacity, price, speed);
            spannable_len += 1;
        }
        // Options compete on the price of work: a type twice as fast does an hour's work in half
        // an hour.
        if admits(capacity, price) {
            options.insert(TypeOption { span: Span::one(type_id), price: price / cluster.speed(type_id) }, shapes);
        }
    }
    for (mask, capacity, price, speed) in span_groups(spannable.get(..spannable_len).unwrap_or(&[])) {
        max_replicas = max_replicas.max(capacity);
        if admits(capacity, price)
            && let Some(span) = Span::of_mask(mask)
        {
            options.insert(TypeOption { span, price: price / speed }, shapes);
        }
    }

    if !any_type {
        reasons.push(Rejection::GpuTypeUnavailable { available: index.gpu_types().clone() });
    } else if !any_selected {
        reasons.push(Rejection::NodeSelectorUnmatched {
            selector: need.node_selector_text(),
            node_labels: cluster.node_labels_text(),
        });
    } else if !any_memory {
        reasons.push(Rejection::GpuMemoryTooSmall { wanted_gib: demand.min_gpu_memory_gib, largest_gib });
    } else if max_replicas < u64::from(demand.replicas) {
        reasons.push(Rejection::GangNeverFits {
            replicas: demand.replicas,
            gpus_per_replica: demand.gpus,
            max_replicas,
            largest_node_gpus,
        });
    } else if options.is_empty()
        && let Some(max) = budget
    {
        reasons.push(Rejection::OverBudget { usd_per_hour: cheapest_over_budget, max_usd_per_hour: max });
    }

    let rules = &job.placement;
    if let Some(allowed) = &need.allowed_regions
        && !rules.regions.contains(&info.region)
    {
        reasons.push(Rejection::RegionNotAllowed { region: cluster.region().clone(), allowed: allowed.clone() });
    }
    if let Some(selector) = need.cluster_selector
        && !selector.matches_by(|key| info.label(key))
    {
        reasons.push(Rejection::ClusterSelectorUnmatched {
            selector: need.cluster_selector_text(),
            labels: cluster.labels_text(),
        });
    }
    if !rules.clusters.include.is_empty() && !rules.clusters.include.contains(&info.name) {
        reasons.push(Rejection::ClusterNotIncluded);
    }
    if rules.clusters.exclude.contains(&info.name) {
        reasons.push(Rejection::ClusterExcluded);
    }
    let payload_ok = match need.payload {
        PayloadKind::ContainerImage => info.supports_containers,
        PayloadKind::BareCommand => info.supports_bare_commands,
    };
    if !payload_ok {
        reasons.push(Rejection::PayloadUnsupported { needs: need.payload, backend: info.backend });
    }
    if cloud && rules.burst == BurstPolicy::Never {
        reasons.push(Rejection::BurstNever);
    }
    options
}

/// Whole-GPU types per cluster that may join spans (a cluster rarely has more than three).
const MAX_SPANNABLE: usize = 8;

/// The spans a gang may spread over: every group of two or more of `types` (id, replicas on
/// empty nodes, hourly price, speed) with the same speed, as (mask of ids, replicas on empty
/// nodes, hourly price of its dearest type, speed). A gang steps at the pace of its slowest
/// replica, so only types of equal speed are mixed.
fn span_groups(types: &[(usize, u64, f64, f64)]) -> impl Iterator<Item = (u64, u64, f64, f64)> + '_ {
    types.iter().enumerate().filter_map(move |(at, &(_, _, _, speed))| {
        // Each group once, at its first type.
        if types[..at].iter().any(|t| t.3 == speed) {
            return None;
        }
        let group = || types[at..].iter().filter(move |t| t.3 == speed);
        if group().count() < 2 {
            return None;
        }
        let mask = group().fold(0u64, |m, t| m | 1 << t.0);
        let capacity = group().map(|t| t.1).fold(0u64, u64::saturating_add);
        let price = group().map(|t| t.2).fold(0.0, f64::max);
        Some((mask, capacity, price, speed))
    })
}

/// Whether a job listing `wanted` GPU types may use `gpu_type` (`slice`: whether it is a slice
/// type). A job that lists none takes any whole GPU but never a slice (`a100-80g.1g.10gb`):
/// slices go only to jobs that name them.
fn accepts_type(wanted: &[String], gpu_type: &str, slice: bool) -> bool {
    if wanted.is_empty() { !slice } else { wanted.iter().any(|t| t == gpu_type) }
}

/// The GPU types the job may use on `cluster`, or None when the cluster may never run it.
pub(crate) fn eligible_options(need: &Need<'_>, cluster: &ClusterSnapshot) -> Option<TypeOptions> {
    let mut reasons = Reasons::default();
    let options = static_rejections(need, cluster, &mut reasons);
    reasons.is_empty().then_some(options)
}

/// Every cluster's static verdict for `need`'s class, in `clusters` order, from `cache`: kept
/// ones where still valid (made for the same cluster snapshot), the others made now and kept for
/// the next decision (see `statics.rs`).
pub(crate) fn static_verdicts(
    cache: &StaticCache,
    need: &Need<'_>,
    clusters: &[ClusterSnapshot],
) -> Arc<[StaticVerdict]> {
    let hash = JobClass::hash_of(need.job);
    let kept = cache.get(hash, need.job);
    if let Some(kept) = &kept
        && kept.len() == clusters.len()
        && kept.iter().zip(clusters).all(|(verdict, cluster)| verdict.is_for(cluster.statics_id()))
    {
        return Arc::clone(kept);
    }
    let made: Arc<[StaticVerdict]> = clusters
        .iter()
        .enumerate()
        .map(|(at, cluster)| {
            let still = kept.as_ref().and_then(|k| k.get(at)).filter(|v| v.is_for(cluster.statics_id()));
            match still {
                Some(verdict) => verdict.clone(),
                None => {
                    let mut reasons = Reasons::default();
                    let options = static_rejections(need, cluster, &mut reasons);
                    StaticVerdict::new(cluster.statics_id(), reasons, options)
                }
            }
        })
        .collect();
    cache.put(hash, need.job, Arc::clone(&made));
    made
}
