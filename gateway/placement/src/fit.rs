//! Best fit of a gang onto a cluster's free nodes.
//!
//! A gang lands on one GPU type, possibly across several shapes of that type, or on a span of
//! types of equal speed (`options.rs`): a gang's replicas step together, so a gang mixing an
//! H100 with an A100 runs at the A100's pace, which is never what its user meant, while A100
//! 40 GB and 80 GB nodes run it alike.
//!
//! Best fit fills nodes in order of fewest free GPUs first (ties: shape order, then node order),
//! each as far as it goes. That equals per-replica best fit: once a replica lands on the tightest
//! node, that node has even fewer free GPUs and stays the tightest until it is full.
//!
//! Nodes are read through the snapshot's [`FreeIndex`], level by level (a level is a count of free
//! GPUs), starting at the replica's GPUs, so full and too-small nodes are never looked at:
//! - one replica (most jobs): the first node at the lowest level that also has the CPUs and
//!   memory wins;
//! - several replicas: levels are added up from the bottom until they hold the gang; the level
//!   where that happens is taken only as far as needed, in inventory order.
//!
//! The answers equal those of a scan over every node (`scan.rs`, kept as the reference for the
//! property tests). Nothing is sorted and nothing is allocated per cluster.

use meridian_proto::inventory::{NodeFree, NodeShape};
use meridian_proto::selector::Selector;

use crate::index::{FreeIndex, LEVEL_CAP, clamp};
use crate::need::{Demand, Need};
use crate::options::{Span, TypeOption, TypeOptions};
use crate::snapshot::ClusterSnapshot;

#[cfg(test)]
pub(crate) mod scan;

/// A cluster's nodes as best fit reads them: the inventory, its free-GPU index, and the job's
/// nodeSelector (shapes it rules out are never looked at).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nodes<'a> {
    pub(crate) shapes: &'a [NodeShape],
    pub(crate) index: &'a FreeIndex,
    /// The job's nodeSelector; None accepts every shape (most jobs: no label is looked up).
    pub(crate) selector: Option<&'a Selector>,
}

/// Where a gang fits now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Plan {
    /// A single replica, on the tightest node that holds it (the common case).
    One {
        shape: usize,
        node: usize,
        /// GPUs left free on the node / GPUs of the node.
        share: f64,
    },
    /// Several replicas, by levels.
    Levels(LevelPlan),
}

/// Everything below `threshold` free GPUs that can hold a replica is filled, then `take` more
/// replicas from nodes at exactly `threshold`, in inventory order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LevelPlan {
    threshold: u32,
    take: u64,
    below_share: f64,
    below_nodes: u32,
    /// Every replica sits on a node with exactly one replica's GPUs free: no leftovers at all.
    exact: bool,
}

/// Whether a gang fits now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Survey {
    /// The gang fits on free nodes now.
    Fits(Plan),
    /// It does not; `free_gpus` are the free GPUs of the acceptable nodes (for the wait estimate).
    DoesNotFit { free_gpus: u64 },
}

impl<'a> Nodes<'a> {
    /// The nodes of `cluster` that `need`'s nodeSelector accepts, and their index.
    pub(crate) fn of(cluster: &'a ClusterSnapshot, need: &Need<'a>) -> Self {
        Self { shapes: &cluster.inventory().shapes, index: cluster.index(), selector: need.node_selector }
    }

    /// Whether the nodeSelector accepts the nodes of `shape`.
    pub(crate) fn selects(self, shape: &NodeShape) -> bool {
        self.selector.is_none_or(|selector| selector.matches(&shape.labels))
    }

    /// The shapes of the GPU types of `span` with enough GPU memory for `demand` whose labels
    /// the nodeSelector accepts, in inventory order.
    fn acceptable(self, span: Span, demand: &Demand) -> impl Iterator<Item = (usize, &'a NodeShape)> + 'a {
        let (index, min_memory) = (self.index, demand.min_gpu_memory_gib);
        // A type's shapes start at its id: earlier shapes have other types.
        let from = span.first().min(self.shapes.len());
        self.shapes[from..].iter().enumerate().map(move |(offset, shape)| (from + offset, shape)).filter(
            move |(i, shape)| {
                span.covers(index.type_id(*i)) && shape.gpu_memory_gib >= min_memory && self.selects(shape)
            },
        )
    }

    /// The highest level of any acceptable shape.
    fn top(self, span: Span, demand: &Demand) -> Option<u32> {
        self.acceptable(span, demand).filter_map(|(i, _)| self.index.top(i)).max()
    }

    /// Free GPUs of the acceptable shapes.
    fn free_gpus(self, span: Span, demand: &Demand) -> u64 {
        self.acceptable(span, demand).map(|(i, _)| self.index.free_gpus(i)).sum()
    }

    /// Every acceptable node at `level`: (shape, node, what is free), in inventory order.
    fn at_level(
        self,
        span: Span,
        demand: &Demand,
        level: u32,
    ) -> impl Iterator<Item = (usize, usize, &'a NodeShape, NodeFree)> + 'a {
        let index = self.index;
        self.acceptable(span, demand).flat_map(move |(s, shape)| {
            index
                .nodes_at(s, level)
                .filter_map(move |n| shape.free.get(n).map(|free| (s, n, shape, clamp(free, shape))))
        })
    }
}

/// Does the gang fit on free nodes of the types of `span` now, and how.
pub(crate) fn survey(nodes: Nodes<'_>, span: Span, demand: &Demand) -> Survey {
    let replicas = u64::from(demand.replicas);
    if replicas == 0 {
        let plan = LevelPlan { threshold: 0, take: 0, below_share: 0.0, below_nodes: 0, exact: true };
        return Survey::Fits(Plan::Levels(plan));
    }
    if replicas == 1 {
        return survey_one(nodes, span, demand);
    }
    let g = demand.gpus;
    let (mut placed, mut below_share, mut below_nodes) = (0u64, 0.0, 0u32);
    for level in 0..=nodes.top(span, demand).unwrap_or(0) {
        // Replicas by GPUs alone at this level; levels below one replica's GPUs hold none.
        let by_gpus = level.checked_div(g).unwrap_or(u32::MAX);
        if by_gpus == 0 {
            continue;
        }
        let (mut here, mut share, mut count) = (0u64, 0.0, 0u32);
        for (_, _, shape, free) in nodes.at_level(span, demand, level) {
            let fits = demand.fitting(&free, by_gpus);
            if fits == 0 {
                continue;
            }
            here += u64::from(fits);
            if placed + here >= replicas {
                // One replica per node with exactly its GPUs free: nothing is left over.
                let exact = g > 0 && g < LEVEL_CAP && level == g;
                let take = replicas - placed;
                return Survey::Fits(Plan::Levels(LevelPlan {
                    threshold: level,
                    take,
                    below_share,
                    below_nodes,
                    exact,
                }));
            }
            let node_share = if shape.gpus_per_node == 0 { 0.0 } else { 1.0 / f64::from(shape.gpus_per_node) };
            share += f64::from(free.gpus - fits.saturating_mul(g).min(free.gpus)) * node_share;
            count += 1;
        }
        placed += here;
        below_share += share;
        below_nodes += count;
    }
    Survey::DoesNotFit { free_gpus: nodes.free_gpus(span, demand) }
}

/// One replica: the node with the fewest free GPUs that holds it, first in inventory order among
/// equals. Levels go up from the replica's GPUs, so the first node that has the CPUs and memory
/// too is the answer.
fn survey_one(nodes: Nodes<'_>, span: Span, demand: &Demand) -> Survey {
    let g = demand.gpus;
    for level in g.min(LEVEL_CAP)..=nodes.top(span, demand).unwrap_or(0) {
        for (shape_index, shape) in nodes.acceptable(span, demand) {
            let Some(summary) = nodes.index.level(shape_index, level) else { continue };
            if demand.cpu > summary.max_cpu || demand.memory_gib > summary.max_memory_gib {
                continue; // no node at this level has the CPUs or memory
            }
            // Below the cap a node's level is its free GPUs, so when every node at the level has
            // the CPUs and memory too, the first one is the answer without reading it.
            let all_fit =
                level < LEVEL_CAP && demand.cpu <= summary.min_cpu && demand.memory_gib <= summary.min_memory_gib;
            for node in nodes.index.nodes_at(shape_index, level) {
                let gpus = if all_fit {
                    level
                } else {
                    let Some(free) = shape.free.get(node).map(|n| clamp(n, shape)) else { continue };
                    if free.gpus < g || free.cpu < demand.cpu || free.memory_gib < demand.memory_gib {
                        continue;
                    }
                    free.gpus
                };
                let share = leftover_share(gpus, 1, g, shape.gpus_per_node);
                return Survey::Fits(Plan::One { shape: shape_index, node, share });
            }
        }
    }
    Survey::DoesNotFit { free_gpus: nodes.free_gpus(span, demand) }
}

impl Plan {
    /// Mean over the nodes the gang touches of (GPUs left free / GPUs of the node): 0 when the
    /// gang fills nodes exactly, near 1 when it breaks whole nodes for a sliver.
    pub(crate) fn fragmentation(&self, nodes: Nodes<'_>, span: Span, demand: &Demand) -> f64 {
        match self {
            Plan::One { share, .. } => *share,
            Plan::Levels(plan) => plan.fragmentation(nodes, span, demand),
        }
    }

    /// Calls `on_node(shape, node, replicas)` for every node the gang takes.
    pub(crate) fn for_each_node(
        &self,
        nodes: Nodes<'_>,
        span: Span,
        demand: &Demand,
        mut on_node: impl FnMut(usize, usize, u32),
    ) {
        match self {
            Plan::One { shape, node, .. } => on_node(*shape, *node, 1),
            Plan::Levels(plan) => {
                plan.walk(nodes, span, demand, true, on_node);
            }
        }
    }
}

impl LevelPlan {
    fn fragmentation(&self, nodes: Nodes<'_>, span: Span, demand: &Demand) -> f64 {
        if self.exact {
            return 0.0;
        }
        let (share, taken) = self.walk(nodes, span, demand, false, |_, _, _| {});
        let touched = self.below_nodes + taken;
        if touched == 0 { 0.0 } else { (self.below_share + share) / f64::from(touched) }
    }

    /// Takes the nodes of the last level (and, with `below`, of every lower level that holds a
    /// replica). Returns the leftover share and count of the last-level nodes taken.
    fn walk(
        &self,
        nodes: Nodes<'_>,
        span: Span,
        demand: &Demand,
        below: bool,
        mut on_node: impl FnMut(usize, usize, u32),
    ) -> (f64, u32) {
        let g = demand.gpus;
        // Whole nodes by what is free on each, as the survey counted them below the threshold.
        let fitting = |free: &NodeFree| {
            if free.gpus < g { 0 } else { demand.fitting(free, free.gpus.checked_div(g).unwrap_or(u32::MAX)) }
        };
        if below {
            for level in 0..self.threshold {
                for (shape, node, _, free) in nodes.at_level(span, demand, level) {
                    let fits = fitting(&free);
                    if fits > 0 {
                        on_node(shape, node, fits);
                    }
                }
            }
        }
        let (mut take, mut share, mut taken) = (self.take, 0.0, 0u32);
        for (shape, node, nodes_shape, free) in nodes.at_level(span, demand, self.threshold) {
            if take == 0 {
                break;
            }
            let fits = fitting(&free);
            if fits == 0 {
                continue;
            }
            // `used` ≤ `fits`, a u32, so the conversion cannot fail.
            let used = u32::try_from(take.min(u64::from(fits))).unwrap_or(fits);
            take -= u64::from(used);
            share += leftover_share(free.gpus, used, g, nodes_shape.gpus_per_node);
            taken += 1;
            on_node(shape, node, used);
        }
        (share, taken)
    }
}

/// The first option (cheapest first) whose gang fits on free nodes now, with its plan; otherwise
/// the free GPUs of all acceptable nodes (each type counted once, though a span shares its types
/// with their own options). Placement and [`reserve`] both decide through this, so a
/// reservation takes exactly the nodes the decision assumed.
///
/// [`reserve`]: crate::snapshot::ClusterSnapshot::reserve
pub(crate) fn fit_now(nodes: Nodes<'_>, options: &TypeOptions, demand: &Demand) -> Result<(TypeOption, Plan), u64> {
    let mut free_gpus = 0u64;
    // Types counted so far, by id (spans hold only ids below `Span::MAX_TYPE_ID`, so a type
    // above it is never counted twice).
    let mut counted = 0u64;
    for option in options.iter() {
        match survey(nodes, option.span, demand) {
            Survey::Fits(plan) => return Ok((*option, plan)),
            Survey::DoesNotFit { free_gpus: free } if !option.span.is_span() => {
                let id = option.span.first();
                if id >= Span::MAX_TYPE_ID || counted >> id & 1 == 0 {
                    free_gpus += free;
                }
                if id < Span::MAX_TYPE_ID {
                    counted |= 1 << id;
                }
            }
            Survey::DoesNotFit { .. } => {
                for id in option.span.type_ids() {
                    if counted >> id & 1 == 0 {
                        free_gpus += nodes.free_gpus(Span::one(id), demand);
                        counted |= 1 << id;
                    }
                }
            }
        }
    }
    Err(free_gpus)
}

fn leftover_share(free_gpus: u32, replicas: u32, gpus_per_replica: u32, gpus_per_node: u32) -> f64 {
    if gpus_per_node == 0 {
        return 0.0;
    }
    let left = free_gpus.saturating_sub(replicas.saturating_mul(gpus_per_replica));
    f64::from(left) / f64::from(gpus_per_node)
}
