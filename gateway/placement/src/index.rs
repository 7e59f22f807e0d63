//! Each cluster's free nodes bucketed by free GPUs, so best fit reads only the nodes that matter.
//!
//! Best fit wants the node with the fewest free GPUs that still holds a replica. Scanning every
//! node for that was a fifth of placement's time, and most nodes of a busy cluster are full. The
//! index keeps, per shape and per free-GPU count ("level"), a bitset of the nodes at that level,
//! in inventory order, plus the shape's free GPUs. Best fit then starts at the replica's level and
//! reads only nodes that can hold it, in the same order a full scan would meet them, so it picks
//! the same nodes.
//!
//! [`ClusterSnapshot::new`](crate::snapshot::ClusterSnapshot::new) builds it once per snapshot and
//! [`ClusterSnapshot::reserve`](crate::snapshot::ClusterSnapshot::reserve) moves the nodes it changes, which
//! is why the snapshot's inventory is readable but not writable from outside.

use meridian_proto::gpu;
use meridian_proto::inventory::{NodeFree, NodeShape};

use crate::name::{Name, Names};

/// Nodes with this many free GPUs or more share one level and are taken in inventory order;
/// keeps the levels few whatever size an agent reports.
pub(crate) const LEVEL_CAP: u32 = 256;

/// The free-GPU index of one cluster's inventory (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FreeIndex {
    shapes: Vec<ShapeIndex>,
    /// Distinct GPU types in order of first appearance, for "the cluster only has …".
    gpu_types: Names,
}

/// One shape's part of the index.
#[derive(Debug, Clone, PartialEq)]
struct ShapeIndex {
    /// Index of the first shape with the same GPU type: an id for the type within the cluster,
    /// so matching shapes to a type compares integers rather than strings.
    type_id: usize,
    /// The shape's GPU type, shared with every decision that names it.
    gpu_type: Name,
    /// Whether the GPU type is a slice (`a100-80g.1g.10gb`), worked out once per snapshot rather
    /// than per decision.
    slice: bool,
    /// 64-bit words per level (nodes / 64, rounded up).
    words: usize,
    /// Levels `0..=top` one after the other, each a bitset of the nodes at that level.
    bits: Vec<u64>,
    /// Per level: how many nodes, and bounds on their free CPUs and memory.
    levels: Vec<LevelSummary>,
    /// Free GPUs of all the shape's nodes (each at most the node's GPUs).
    free_gpus: u64,
}

/// The nodes of one shape at one level: how many, and bounds on what they have free besides
/// GPUs. Bounds are widened when a node joins and left as they are when one leaves, so they stay
/// true (if loose) between rebuilds: a replica that needs more CPUs than `max_cpu` fits on none
/// of the nodes, one that needs no more than `min_cpu` (and `min_memory_gib`) fits on all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LevelSummary {
    /// Nodes at the level.
    pub(crate) count: u32,
    /// No node at the level has fewer free CPUs.
    pub(crate) min_cpu: u32,
    /// No node at the level has more free CPUs.
    pub(crate) max_cpu: u32,
    /// No node at the level has less free memory, GiB.
    pub(crate) min_memory_gib: u32,
    /// No node at the level has more free memory, GiB.
    pub(crate) max_memory_gib: u32,
}

/// Indices of the nodes at one level of one shape, ascending.
pub(crate) struct NodesAt<'a> {
    words: std::slice::Iter<'a, u64>,
    base: usize,
    current: u64,
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

impl FreeIndex {
    /// Indexes `shapes` as they are now.
    pub(crate) fn new(shapes: &[NodeShape]) -> Self {
        let mut gpu_types: Vec<Name> = Vec::new();
        let mut indexed: Vec<ShapeIndex> = Vec::with_capacity(shapes.len());
        for (index, shape) in shapes.iter().enumerate() {
            let first = shapes[..index].iter().position(|s| s.gpu_type == shape.gpu_type);
            let (type_id, gpu_type) = match first.and_then(|f| indexed.get(f).map(|s| (f, s.gpu_type.clone()))) {
                Some(found) => found,
                None => {
                    let name = Name::from(&shape.gpu_type);
                    gpu_types.push(name.clone());
                    (index, name)
                }
            };
            let top = shape.gpus_per_node.min(LEVEL_CAP) as usize;
            let words = shape.free.len().div_ceil(64);
            let mut entry = ShapeIndex {
                type_id,
                slice: gpu::is_slice(&gpu_type),
                gpu_type,
                words,
                bits: vec![0; (top + 1) * words],
                levels: vec![LevelSummary::EMPTY; top + 1],
                free_gpus: 0,
            };
            for (node, free) in shape.free.iter().enumerate() {
                entry.add(node, &clamp(free, shape));
            }
            indexed.push(entry);
        }
        Self { shapes: indexed, gpu_types: Names::from(gpu_types) }
    }

    /// Records that node `node` of shape `shape` changed from `before` to what `shapes` now says.
    pub(crate) fn moved(&mut self, shapes: &[NodeShape], shape: usize, node: usize, before: &NodeFree) {
        let (Some(entry), Some(nodes)) = (self.shapes.get_mut(shape), shapes.get(shape)) else { return };
        let Some(after) = nodes.free.get(node) else { return };
        entry.remove(node, &clamp(before, nodes));
        entry.add(node, &clamp(after, nodes));
    }

    /// The type id of shape `shape`: the index of the first shape with its GPU type.
    pub(crate) fn type_id(&self, shape: usize) -> usize {
        self.shapes.get(shape).map_or(usize::MAX, |s| s.type_id)
    }

    /// Whether the GPU type of shape `shape` is a slice (`a100-80g.1g.10gb`).
    pub(crate) fn is_slice(&self, shape: usize) -> bool {
        self.shapes.get(shape).is_some_and(|s| s.slice)
    }

    /// The GPU type of shape `shape`.
    pub(crate) fn gpu_type(&self, shape: usize) -> Option<&Name> {
        self.shapes.get(shape).map(|s| &s.gpu_type)
    }

    /// Distinct GPU types, in order of first appearance.
    pub(crate) fn gpu_types(&self) -> &Names {
        &self.gpu_types
    }

    /// Highest level of shape `shape` (its GPUs per node, at most [`LEVEL_CAP`]).
    pub(crate) fn top(&self, shape: usize) -> Option<u32> {
        let shape = self.shapes.get(shape)?;
        u32::try_from(shape.levels.len().checked_sub(1)?).ok()
    }

    /// Free GPUs of shape `shape`, each node counted at most at its size.
    pub(crate) fn free_gpus(&self, shape: usize) -> u64 {
        self.shapes.get(shape).map_or(0, |s| s.free_gpus)
    }

    /// What is at `level` in shape `shape`; None when no node is.
    pub(crate) fn level(&self, shape: usize, level: u32) -> Option<&LevelSummary> {
        self.shapes.get(shape)?.levels.get(level as usize).filter(|l| l.count > 0)
    }

    /// The nodes of shape `shape` with `level` free GPUs, in inventory order.
    pub(crate) fn nodes_at(&self, shape: usize, level: u32) -> NodesAt<'_> {
        let words = self.shapes.get(shape).and_then(|s| {
            let at = level as usize;
            (s.levels.get(at)?.count > 0).then(|| s.bits.get(at * s.words..(at + 1) * s.words))?
        });
        NodesAt { words: words.unwrap_or(&[]).iter(), base: 0, current: 0 }
    }
}

impl LevelSummary {
    const EMPTY: Self = Self { count: 0, min_cpu: u32::MAX, max_cpu: 0, min_memory_gib: u32::MAX, max_memory_gib: 0 };
}

impl ShapeIndex {
    /// Adds node `node`, with `free` already clamped to the shape.
    fn add(&mut self, node: usize, free: &NodeFree) {
        let at = free.gpus.min(LEVEL_CAP) as usize;
        let (word, bit) = (at * self.words + node / 64, node % 64);
        if let (Some(w), Some(level)) = (self.bits.get_mut(word), self.levels.get_mut(at))
            && *w & (1 << bit) == 0
        {
            *w |= 1 << bit;
            level.count += 1;
            level.min_cpu = level.min_cpu.min(free.cpu);
            level.max_cpu = level.max_cpu.max(free.cpu);
            level.min_memory_gib = level.min_memory_gib.min(free.memory_gib);
            level.max_memory_gib = level.max_memory_gib.max(free.memory_gib);
            self.free_gpus += u64::from(free.gpus);
        }
    }

    /// Removes node `node`, with `free` (clamped) what it had when added.
    fn remove(&mut self, node: usize, free: &NodeFree) {
        let at = free.gpus.min(LEVEL_CAP) as usize;
        let (word, bit) = (at * self.words + node / 64, node % 64);
        if let (Some(w), Some(level)) = (self.bits.get_mut(word), self.levels.get_mut(at))
            && *w & (1 << bit) != 0
        {
            *w &= !(1 << bit);
            level.count -= 1;
            self.free_gpus -= u64::from(free.gpus);
        }
    }
}

impl Iterator for NodesAt<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.current == 0 {
            self.current = *self.words.next()?;
            self.base += 64;
        }
        let bit = self.current.trailing_zeros() as usize;
        self.current &= self.current - 1;
        Some(self.base - 64 + bit)
    }
}

#[cfg(test)]
impl FreeIndex {
    /// Whether this index, kept in step by `moved`, holds the same nodes at the same levels as
    /// `rebuilt` (a fresh index of the same inventory), with bounds at least as wide.
    pub(crate) fn agrees_with(&self, rebuilt: &FreeIndex) -> bool {
        self.gpu_types == rebuilt.gpu_types
            && self.shapes.len() == rebuilt.shapes.len()
            && self.shapes.iter().zip(&rebuilt.shapes).all(|(kept, fresh)| {
                kept.type_id == fresh.type_id
                    && kept.bits == fresh.bits
                    && kept.free_gpus == fresh.free_gpus
                    && kept.levels.len() == fresh.levels.len()
                    && kept.levels.iter().zip(&fresh.levels).all(|(k, f)| {
                        k.count == f.count
                            && (f.count == 0
                                || (k.min_cpu <= f.min_cpu
                                    && k.max_cpu >= f.max_cpu
                                    && k.min_memory_gib <= f.min_memory_gib
                                    && k.max_memory_gib >= f.max_memory_gib))
                    })
            })
    }
}
