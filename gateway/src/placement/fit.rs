//! Best fit of a gang onto a cluster's free nodes, straight from the reported inventory.
//!
//! A gang always lands on one GPU type (a mixed H100/A100 gang runs at the pace of the slowest
//! GPU and is never what a user meant), possibly across several shapes of that type.
//!
//! Best fit fills nodes in order of fewest free GPUs first (ties: shape order, then node order),
//! each as far as it goes. That equals per-replica best fit: once a replica lands on the tightest
//! node, that node has even fewer free GPUs and stays the tightest until it is full.
//!
//! The snapshot carries no index (it is the agents' report as is), so this runs over the raw node
//! lists on every decision and is written for that:
//! - one replica (most jobs): a single pass keeps the tightest node so far and stops at a node
//!   whose free GPUs equal the replica's exactly, which cannot be beaten;
//! - several replicas: one pass builds a histogram of replica capacity per free-GPU count
//!   ("level"), which gives the level where the gang is complete; a second pass, only as far as
//!   needed, picks that last level's nodes in order. Enough exact nodes stop the first pass early.
//!
//! Nothing is sorted and nothing is allocated per cluster.

use meridian_proto::inventory::{NodeFree, NodeShape};
use meridian_proto::spec::JobSpec;

/// GPU types considered per cluster, cheapest first (13 are known; a cluster rarely has more than
/// three, and the cheapest four are the ones worth trying).
pub(crate) const MAX_TYPES: usize = 4;

/// Nodes with this many free GPUs or more share one level and are taken in inventory order;
/// keeps the histogram small whatever size an agent reports.
const LEVEL_CAP: u32 = 256;

/// What one replica needs, and how many replicas there are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    pub(crate) replicas: u32,
    pub(crate) gpus: u32,
    pub(crate) cpu: u32,
    pub(crate) memory_gib: u32,
    pub(crate) min_gpu_memory_gib: u32,
}

/// One GPU type the gang may use on a cluster.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TypeOption {
    /// Index of the first shape of the type; its `gpu_type` names the option.
    pub(crate) first_shape: usize,
    /// US$ per GPU-hour of the type on this cluster.
    pub(crate) price: f64,
}

/// The GPU types the gang may use on a cluster, cheapest first (ties by name). Kept on the stack:
/// this is built for every cluster of every decision.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TypeOptions {
    len: usize,
    items: [TypeOption; MAX_TYPES],
}

/// Where a gang fits now.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Plan {
    /// A single replica, on the tightest node that holds it (the common case, found in one pass).
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
#[derive(Debug, Clone, Copy)]
pub(crate) struct LevelPlan {
    threshold: u32,
    take: u64,
    below_share: f64,
    below_nodes: u32,
    /// Every replica sits on a node with exactly one replica's GPUs free: no leftovers at all.
    exact: bool,
}

/// Result of the first pass.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Survey {
    /// The gang fits on free nodes now.
    Fits(Plan),
    /// It does not; `free_gpus` are the free GPUs of the acceptable nodes (for the wait estimate).
    DoesNotFit { free_gpus: u64 },
}

/// Reusable histogram, so placing a job allocates it once rather than once per cluster.
#[derive(Debug, Default)]
pub(crate) struct Fitter {
    levels: Vec<Level>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Level {
    /// Replicas a node at this level holds by GPUs alone.
    by_gpus: u32,
    replicas: u64,
    nodes: u32,
    /// Σ over nodes of (GPUs left after filling the node) / (GPUs of the node).
    leftover_share: f64,
}

impl Demand {
    /// Per-replica needs of `job`.
    pub(crate) fn of(job: &JobSpec) -> Self {
        let r = &job.gang.resources;
        Self {
            replicas: job.gang.replicas,
            gpus: r.gpus,
            cpu: r.cpu,
            memory_gib: r.memory_gib,
            min_gpu_memory_gib: r.gpu_memory_gib,
        }
    }

    /// Replicas that fit on one empty node of `shape`.
    pub(crate) fn per_empty_node(&self, shape: &NodeShape) -> u32 {
        NodeFree { gpus: shape.gpus_per_node, cpu: shape.cpu_per_node, memory_gib: shape.memory_gib_per_node }
            .replicas_fitting(self.gpus, self.cpu, self.memory_gib)
    }

    /// Replicas that fit on `free`, given that its GPUs alone hold `by_gpus`. Same result as
    /// [`NodeFree::replicas_fitting`], which the property tests check against, but divides only
    /// when CPU or memory is the tighter limit: this runs for every node of every decision.
    fn fitting(&self, free: &NodeFree, by_gpus: u32) -> u32 {
        let limit = |have: u32, need: u32, fits: u32| {
            if need == 0 || u64::from(have) >= u64::from(fits) * u64::from(need) { fits } else { have / need }
        };
        let fits = limit(free.cpu, self.cpu, by_gpus);
        limit(free.memory_gib, self.memory_gib, fits)
    }

    fn accepts(&self, shape: &NodeShape, gpu_type: &str) -> bool {
        shape.gpu_type == gpu_type && shape.gpu_memory_gib >= self.min_gpu_memory_gib
    }
}

impl TypeOptions {
    /// Adds an option, keeping the cheapest [`MAX_TYPES`].
    pub(crate) fn insert(&mut self, option: TypeOption, shapes: &[NodeShape]) {
        let name = |o: &TypeOption| shapes.get(o.first_shape).map_or("", |s| s.gpu_type.as_str());
        let better =
            |a: &TypeOption, b: &TypeOption| a.price.total_cmp(&b.price).then_with(|| name(a).cmp(name(b))).is_lt();
        let mut at = self.len;
        while at > 0 && better(&option, &self.items[at - 1]) {
            at -= 1;
        }
        if at >= MAX_TYPES {
            return;
        }
        let end = self.len.min(MAX_TYPES - 1);
        self.items.copy_within(at..end, at + 1);
        self.items[at] = option;
        self.len = (self.len + 1).min(MAX_TYPES);
    }

    /// The options, best first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &TypeOption> {
        self.items.iter().take(self.len)
    }

    /// The cheapest option.
    pub(crate) fn first(&self) -> Option<&TypeOption> {
        self.iter().next()
    }

    /// Whether there is none.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl TypeOption {
    /// The GPU type's name.
    pub(crate) fn gpu_type<'a>(&self, shapes: &'a [NodeShape]) -> &'a str {
        shapes.get(self.first_shape).map_or("", |s| s.gpu_type.as_str())
    }
}

impl Fitter {
    /// First pass: does the gang fit on free nodes of `gpu_type` now, and how.
    pub(crate) fn survey(&mut self, shapes: &[NodeShape], gpu_type: &str, demand: &Demand) -> Survey {
        let replicas = u64::from(demand.replicas);
        if replicas == 0 {
            let plan = LevelPlan { threshold: 0, take: 0, below_share: 0.0, below_nodes: 0, exact: true };
            return Survey::Fits(Plan::Levels(plan));
        }
        if replicas == 1 {
            return survey_one(shapes, gpu_type, demand);
        }
        let g = demand.gpus;
        let top = shapes.iter().filter(|s| demand.accepts(s, gpu_type)).map(|s| s.gpus_per_node.min(LEVEL_CAP)).max();
        self.levels.clear();
        // Replicas by GPUs alone for each level, computed once here instead of dividing per node.
        self.levels.extend(
            (0..=top.unwrap_or(0))
                .map(|level| Level { by_gpus: level.checked_div(g).unwrap_or(u32::MAX), ..Level::default() }),
        );
        let (mut exact, mut free_gpus) = (0u64, 0u64);
        for shape in shapes.iter().filter(|s| demand.accepts(s, gpu_type)) {
            let node_share = if shape.gpus_per_node == 0 { 0.0 } else { 1.0 / f64::from(shape.gpus_per_node) };
            for node in &shape.free {
                let free = clamp(node, shape);
                free_gpus += u64::from(free.gpus);
                let Some(level) = self.levels.get_mut(free.gpus.min(LEVEL_CAP) as usize) else { continue };
                if level.by_gpus == 0 {
                    continue;
                }
                let fits = demand.fitting(&free, level.by_gpus);
                if fits == 0 {
                    continue;
                }
                if g > 0 && g < LEVEL_CAP && free.gpus == g {
                    exact += 1;
                    if exact >= replicas {
                        let plan =
                            LevelPlan { threshold: g, take: replicas, below_share: 0.0, below_nodes: 0, exact: true };
                        return Survey::Fits(Plan::Levels(plan));
                    }
                }
                level.replicas += u64::from(fits);
                level.nodes += 1;
                level.leftover_share += f64::from(free.gpus - fits.saturating_mul(g).min(free.gpus)) * node_share;
            }
        }
        let (mut placed, mut below_share, mut below_nodes) = (0u64, 0.0, 0u32);
        for (threshold, level) in (0u32..).zip(&self.levels) {
            if placed + level.replicas >= replicas {
                let take = replicas - placed;
                return Survey::Fits(Plan::Levels(LevelPlan {
                    threshold,
                    take,
                    below_share,
                    below_nodes,
                    exact: false,
                }));
            }
            placed += level.replicas;
            below_share += level.leftover_share;
            below_nodes += level.nodes;
        }
        Survey::DoesNotFit { free_gpus }
    }
}

/// One replica: the node with the fewest free GPUs that holds it, first in inventory order among
/// equals; a node with exactly the replica's GPUs free cannot be beaten and ends the search.
/// Compares levels only, so the common case does no division and no histogram.
fn survey_one(shapes: &[NodeShape], gpu_type: &str, demand: &Demand) -> Survey {
    let g = demand.gpus;
    let mut best_level = u32::MAX;
    let mut best: Option<(usize, usize, u32)> = None; // (shape, node, free GPUs)
    let mut free_gpus = 0u64;
    'shapes: for (shape_index, shape) in shapes.iter().enumerate().filter(|(_, s)| demand.accepts(s, gpu_type)) {
        for (node_index, node) in shape.free.iter().enumerate() {
            let gpus = node.gpus.min(shape.gpus_per_node);
            free_gpus += u64::from(gpus);
            let too_small = u32::from(gpus < g).wrapping_neg(); // all ones when the node is too full
            let level = gpus.min(LEVEL_CAP) | too_small;
            if level < best_level {
                let free = clamp(node, shape);
                if free.cpu >= demand.cpu && free.memory_gib >= demand.memory_gib {
                    best_level = level;
                    best = Some((shape_index, node_index, gpus));
                    if gpus == g {
                        break 'shapes;
                    }
                }
            }
        }
    }
    match best {
        Some((shape, node, free)) => {
            let per_node = shapes.get(shape).map_or(0, |s| s.gpus_per_node);
            Survey::Fits(Plan::One { shape, node, share: leftover_share(free, 1, g, per_node) })
        }
        None => Survey::DoesNotFit { free_gpus },
    }
}

impl Plan {
    /// Mean over the nodes the gang touches of (GPUs left free / GPUs of the node): 0 when the
    /// gang fills nodes exactly, near 1 when it breaks whole nodes for a sliver.
    pub(crate) fn fragmentation(&self, shapes: &[NodeShape], gpu_type: &str, demand: &Demand) -> f64 {
        match self {
            Plan::One { share, .. } => *share,
            Plan::Levels(plan) => plan.fragmentation(shapes, gpu_type, demand),
        }
    }

    /// Calls `on_node(shape, node, replicas)` for every node the gang takes.
    pub(crate) fn for_each_node(
        &self,
        shapes: &[NodeShape],
        gpu_type: &str,
        demand: &Demand,
        mut on_node: impl FnMut(usize, usize, u32),
    ) {
        match self {
            Plan::One { shape, node, .. } => on_node(*shape, *node, 1),
            Plan::Levels(plan) => {
                plan.walk(shapes, gpu_type, demand, true, on_node);
            }
        }
    }
}

impl LevelPlan {
    fn fragmentation(&self, shapes: &[NodeShape], gpu_type: &str, demand: &Demand) -> f64 {
        if self.exact {
            return 0.0;
        }
        let (share, nodes) = self.walk(shapes, gpu_type, demand, false, |_, _, _| {});
        let touched = self.below_nodes + nodes;
        if touched == 0 { 0.0 } else { (self.below_share + share) / f64::from(touched) }
    }

    /// Second pass over the nodes of the last level (and, with `below`, all lower levels).
    /// Returns the leftover share and count of the last-level nodes taken.
    fn walk(
        &self,
        shapes: &[NodeShape],
        gpu_type: &str,
        demand: &Demand,
        below: bool,
        mut on_node: impl FnMut(usize, usize, u32),
    ) -> (f64, u32) {
        let g = demand.gpus;
        let (mut take, mut below_left) = (self.take, if below { self.below_nodes } else { 0 });
        let (mut share, mut nodes) = (0.0, 0u32);
        for (shape_index, shape) in shapes.iter().enumerate().filter(|(_, s)| demand.accepts(s, gpu_type)) {
            for (node_index, node) in shape.free.iter().enumerate() {
                if take == 0 && below_left == 0 {
                    return (share, nodes);
                }
                let free = clamp(node, shape);
                if free.gpus < g {
                    continue;
                }
                let level = free.gpus.min(LEVEL_CAP);
                if level > self.threshold || (level < self.threshold && !below) {
                    continue;
                }
                let fits = demand.fitting(&free, free.gpus.checked_div(g).unwrap_or(u32::MAX));
                if fits == 0 {
                    continue;
                }
                if level < self.threshold {
                    below_left = below_left.saturating_sub(1);
                    on_node(shape_index, node_index, fits);
                } else if take > 0 {
                    // `used` ≤ `fits`, a u32, so the conversion cannot fail.
                    let used = u32::try_from(take.min(u64::from(fits))).unwrap_or(fits);
                    take -= u64::from(used);
                    share += leftover_share(free.gpus, used, g, shape.gpus_per_node);
                    nodes += 1;
                    on_node(shape_index, node_index, used);
                }
            }
        }
        (share, nodes)
    }
}

/// The first option (cheapest first) whose gang fits on free nodes now, with its plan; otherwise
/// the free GPUs of all acceptable nodes. Placement and [`reserve`] both decide through this, so a
/// reservation takes exactly the nodes the decision assumed.
///
/// [`reserve`]: super::ClusterSnapshot::reserve
pub(crate) fn fit_now(
    fitter: &mut Fitter,
    shapes: &[NodeShape],
    options: &TypeOptions,
    demand: &Demand,
) -> Result<(TypeOption, Plan), u64> {
    let mut free_gpus = 0u64;
    for option in options.iter() {
        match fitter.survey(shapes, option.gpu_type(shapes), demand) {
            Survey::Fits(plan) => return Ok((*option, plan)),
            Survey::DoesNotFit { free_gpus: free } => free_gpus += free,
        }
    }
    Err(free_gpus)
}

/// A node never has more free than it has: an agent reporting otherwise must not make placement
/// promise resources that do not exist.
pub(crate) fn clamp(free: &NodeFree, shape: &NodeShape) -> NodeFree {
    NodeFree {
        gpus: free.gpus.min(shape.gpus_per_node),
        cpu: free.cpu.min(shape.cpu_per_node),
        memory_gib: free.memory_gib.min(shape.memory_gib_per_node),
    }
}

fn leftover_share(free_gpus: u32, replicas: u32, gpus_per_replica: u32, gpus_per_node: u32) -> f64 {
    if gpus_per_node == 0 {
        return 0.0;
    }
    let left = free_gpus.saturating_sub(replicas.saturating_mul(gpus_per_replica));
    f64::from(left) / f64::from(gpus_per_node)
}
