//! The GPU types a gang may use on one cluster, cheapest first: what the static checks find
//! (`filter.rs`) and best fit tries in turn (`fit.rs`).

use meridian_proto::inventory::NodeShape;

use crate::index::FreeIndex;
use crate::name::Name;

/// GPU types considered per cluster, cheapest first (13 are known; a cluster rarely has more than
/// three, and the cheapest four are the ones worth trying).
pub(crate) const MAX_TYPES: usize = 4;

/// One GPU type the gang may use on a cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TypeOption {
    /// The type's id in the cluster's [`FreeIndex`]: the index of its first shape.
    pub(crate) type_id: usize,
    /// US$ per reference GPU-hour of work on this type here: its hourly price ÷ its relative
    /// speed ([`PlacementConfig::gpu_speed`](crate::PlacementConfig::gpu_speed); 1 when unknown).
    pub(crate) price: f64,
}

/// The GPU types the gang may use on a cluster, cheapest first (ties by name). Kept on the stack:
/// this is built for every cluster of every decision.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TypeOptions {
    len: usize,
    items: [TypeOption; MAX_TYPES],
}

impl TypeOptions {
    /// Adds an option, keeping the cheapest [`MAX_TYPES`].
    pub(crate) fn insert(&mut self, option: TypeOption, shapes: &[NodeShape]) {
        if self.len == 0 {
            // Most clusters offer one acceptable type: nothing to compare.
            self.items[0] = option;
            self.len = 1;
            return;
        }
        let name = |o: &TypeOption| shapes.get(o.type_id).map_or("", |s| s.gpu_type.as_str());
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
    /// The GPU type's name, shared with the snapshot.
    pub(crate) fn gpu_type<'a>(&self, index: &'a FreeIndex) -> Option<&'a Name> {
        index.gpu_type(self.type_id)
    }
}
