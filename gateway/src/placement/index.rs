//! Each cluster's free nodes bucketed by free GPUs, so best fit reads only the nodes that matter.
//!
//! Best fit wants the node with the fewest free GPUs that still holds a replica. Scanning every
//! node for that was a fifth of placement's time, and most nodes of a busy cluster are full. The
//! index keeps, per shape and per free-GPU count ("level"), a bitset of the nodes at that level,
//! in inventory order, plus the shape's free GPUs. Best fit then starts at the replica's level and
//! reads only nodes that can hold it, in the same order a full scan would meet them, so it picks
//! the same nodes.
//!
//! [`ClusterSnapshot::new`](super::ClusterSnapshot::new) builds it once per snapshot and
//! [`ClusterSnapshot::reserve`](super::ClusterSnapshot::reserve) moves the nodes it changes, which
//! is why the snapshot's inventory is readable but not writable from outside.

use meridian_proto::inventory::{NodeFree, NodeShape};

use super::name::Name;

/// Nodes with this many free GPUs or more share one level and are taken in inventory order;
/// keeps the levels few whatever size an agent reports.
pub(crate) const LEVEL_CAP: u32 = 256;

/// The free-GPU index of one cluster's inventory (see the module doc).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct FreeIndex {
    shapes: Vec<ShapeIndex>,
    /// Distinct GPU types in order of first appearance, for "the cluster only has …".
    gpu_types: Vec<Name>,
}

/// One shape's part of the index.
#[derive(Debug, Clone, PartialEq)]
struct ShapeIndex {
    /// Index of the first shape with the same GPU type: an id for the type within the cluster,
    /// so matching shapes to a type compares integers rather than strings.
    type_id: usize,
    /// The shape's GPU type, shared with every decision that names it.
    gpu_type: Name,
    /// 64-bit words per level (nodes / 64, rounded up).
    words: usize,
    /// Levels `0..=top` one after the other, each a bitset of the nodes at that level.
    bits: Vec<u64>,
    /// Nodes per level, so empty levels are skipped without reading their words.
    counts: Vec<u32>,
    /// Free GPUs of all the shape's nodes (each at most the node's GPUs).
    free_gpus: u64,
}

/// Indices of the nodes at one level of one shape, ascending.
pub(crate) struct NodesAt<'a> {
    words: std::slice::Iter<'a, u64>,
    base: usize,
    current: u64,
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
                gpu_type,
                words,
                bits: vec![0; (top + 1) * words],
                counts: vec![0; top + 1],
                free_gpus: 0,
            };
            for (node, free) in shape.free.iter().enumerate() {
                entry.add(node, level(free, shape), free.gpus.min(shape.gpus_per_node));
            }
            indexed.push(entry);
        }
        Self { shapes: indexed, gpu_types }
    }

    /// Records that node `node` of shape `shape` changed from `before` to what `shapes` now says.
    pub(crate) fn moved(&mut self, shapes: &[NodeShape], shape: usize, node: usize, before: &NodeFree) {
        let (Some(entry), Some(nodes)) = (self.shapes.get_mut(shape), shapes.get(shape)) else { return };
        let Some(after) = nodes.free.get(node) else { return };
        entry.remove(node, level(before, nodes), before.gpus.min(nodes.gpus_per_node));
        entry.add(node, level(after, nodes), after.gpus.min(nodes.gpus_per_node));
    }

    /// The type id of shape `shape`: the index of the first shape with its GPU type.
    pub(crate) fn type_id(&self, shape: usize) -> usize {
        self.shapes.get(shape).map_or(usize::MAX, |s| s.type_id)
    }

    /// The GPU type of shape `shape`.
    pub(crate) fn gpu_type(&self, shape: usize) -> Option<&Name> {
        self.shapes.get(shape).map(|s| &s.gpu_type)
    }

    /// Distinct GPU types, in order of first appearance.
    pub(crate) fn gpu_types(&self) -> &[Name] {
        &self.gpu_types
    }

    /// Highest level of shape `shape` (its GPUs per node, at most [`LEVEL_CAP`]).
    pub(crate) fn top(&self, shape: usize) -> Option<u32> {
        let shape = self.shapes.get(shape)?;
        u32::try_from(shape.counts.len().checked_sub(1)?).ok()
    }

    /// Free GPUs of shape `shape`, each node counted at most at its size.
    pub(crate) fn free_gpus(&self, shape: usize) -> u64 {
        self.shapes.get(shape).map_or(0, |s| s.free_gpus)
    }

    /// The nodes of shape `shape` with `level` free GPUs, in inventory order.
    pub(crate) fn nodes_at(&self, shape: usize, level: u32) -> NodesAt<'_> {
        let words = self.shapes.get(shape).and_then(|s| {
            let at = level as usize;
            (s.counts.get(at).copied().unwrap_or(0) > 0).then(|| s.bits.get(at * s.words..(at + 1) * s.words))?
        });
        NodesAt { words: words.unwrap_or(&[]).iter(), base: 0, current: 0 }
    }
}

impl ShapeIndex {
    fn add(&mut self, node: usize, level: u32, gpus: u32) {
        let (word, bit) = (level as usize * self.words + node / 64, node % 64);
        if let (Some(w), Some(count)) = (self.bits.get_mut(word), self.counts.get_mut(level as usize))
            && *w & (1 << bit) == 0
        {
            *w |= 1 << bit;
            *count += 1;
            self.free_gpus += u64::from(gpus);
        }
    }

    fn remove(&mut self, node: usize, level: u32, gpus: u32) {
        let (word, bit) = (level as usize * self.words + node / 64, node % 64);
        if let (Some(w), Some(count)) = (self.bits.get_mut(word), self.counts.get_mut(level as usize))
            && *w & (1 << bit) != 0
        {
            *w &= !(1 << bit);
            *count -= 1;
            self.free_gpus -= u64::from(gpus);
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

/// The level of a node: its free GPUs, at most the node's GPUs and at most [`LEVEL_CAP`].
pub(crate) fn level(free: &NodeFree, shape: &NodeShape) -> u32 {
    free.gpus.min(shape.gpus_per_node).min(LEVEL_CAP)
}
