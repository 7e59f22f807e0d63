//! The reference best fit: the scan over every node that placement v1 shipped with, kept for the
//! property test that the indexed best fit ([`super`]) picks the same nodes with the same numbers.

use meridian_proto::inventory::NodeShape;

use super::{LevelPlan, Plan, Survey, leftover_share};
use crate::index::{LEVEL_CAP, clamp};
use crate::need::Demand;

/// Reusable histogram of replica capacity per level.
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

fn accepts(demand: &Demand, shape: &NodeShape, gpu_type: &str) -> bool {
    shape.gpu_type == gpu_type && shape.gpu_memory_gib >= demand.min_gpu_memory_gib
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
        let top = shapes.iter().filter(|s| accepts(demand, s, gpu_type)).map(|s| s.gpus_per_node.min(LEVEL_CAP)).max();
        self.levels.clear();
        // Replicas by GPUs alone for each level, computed once here instead of dividing per node.
        self.levels.extend(
            (0..=top.unwrap_or(0))
                .map(|level| Level { by_gpus: level.checked_div(g).unwrap_or(u32::MAX), ..Level::default() }),
        );
        let (mut exact, mut free_gpus) = (0u64, 0u64);
        for shape in shapes.iter().filter(|s| accepts(demand, s, gpu_type)) {
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
    'shapes: for (shape_index, shape) in shapes.iter().enumerate().filter(|(_, s)| accepts(demand, s, gpu_type)) {
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

/// [`Plan::fragmentation`], by scanning.
pub(crate) fn fragmentation(plan: &Plan, shapes: &[NodeShape], gpu_type: &str, demand: &Demand) -> f64 {
    match plan {
        Plan::One { share, .. } => *share,
        Plan::Levels(plan) => {
            if plan.exact {
                return 0.0;
            }
            let (share, nodes) = walk(plan, shapes, gpu_type, demand, false, |_, _, _| {});
            let touched = plan.below_nodes + nodes;
            if touched == 0 { 0.0 } else { (plan.below_share + share) / f64::from(touched) }
        }
    }
}

/// [`Plan::for_each_node`], by scanning.
pub(crate) fn for_each_node(
    plan: &Plan,
    shapes: &[NodeShape],
    gpu_type: &str,
    demand: &Demand,
    mut on_node: impl FnMut(usize, usize, u32),
) {
    match plan {
        Plan::One { shape, node, .. } => on_node(*shape, *node, 1),
        Plan::Levels(plan) => {
            walk(plan, shapes, gpu_type, demand, true, on_node);
        }
    }
}

/// Second pass over the nodes of the last level (and, with `below`, all lower levels).
/// Returns the leftover share and count of the last-level nodes taken.
fn walk(
    plan: &LevelPlan,
    shapes: &[NodeShape],
    gpu_type: &str,
    demand: &Demand,
    below: bool,
    mut on_node: impl FnMut(usize, usize, u32),
) -> (f64, u32) {
    let g = demand.gpus;
    let (mut take, mut below_left) = (plan.take, if below { plan.below_nodes } else { 0 });
    let (mut share, mut nodes) = (0.0, 0u32);
    for (shape_index, shape) in shapes.iter().enumerate().filter(|(_, s)| accepts(demand, s, gpu_type)) {
        for (node_index, node) in shape.free.iter().enumerate() {
            if take == 0 && below_left == 0 {
                return (share, nodes);
            }
            let free = clamp(node, shape);
            if free.gpus < g {
                continue;
            }
            let level = free.gpus.min(LEVEL_CAP);
            if level > plan.threshold || (level < plan.threshold && !below) {
                continue;
            }
            let fits = demand.fitting(&free, free.gpus.checked_div(g).unwrap_or(u32::MAX));
            if fits == 0 {
                continue;
            }
            if level < plan.threshold {
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
