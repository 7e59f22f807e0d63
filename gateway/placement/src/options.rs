//! The GPU types a gang may use on one cluster, cheapest first: what the static checks find
//! (`filter.rs`) and best fit tries in turn (`fit.rs`). An option is one type, or a span of
//! types of equal speed that a gang too large for any one of them may spread over.

use meridian_proto::gpu::SPAN_SEPARATOR;
use meridian_proto::inventory::NodeShape;

use crate::index::FreeIndex;
use crate::name::Name;

/// GPU types considered per cluster, cheapest first (13 are known; a cluster rarely has more than
/// three, and the cheapest four are the ones worth trying).
pub(crate) const MAX_TYPES: usize = 4;

/// The GPU types one option lets a gang use on a cluster: a single type, or a *span* of several
/// whole-GPU types of equal speed (A100 40 GB and 80 GB nodes), over which the gang may spread.
/// A type is named by its id in the cluster's [`FreeIndex`]: the index of its first shape.
///
/// Eight bytes, as the plain type id it replaced: every static verdict keeps up to
/// [`MAX_TYPES`] of these per cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// The lowest type id of the span (for a single type, the type).
    first: u32,
    /// For a span, bit `t` is set for every type id `t` in it (ids below
    /// [`Span::MAX_TYPE_ID`] only); 0 for a single type.
    mask: u32,
}

impl Span {
    /// Types with ids from here on cannot join a span (a cluster rarely has more than a few
    /// shapes).
    pub(crate) const MAX_TYPE_ID: usize = 32;

    /// A single GPU type.
    pub(crate) fn one(type_id: usize) -> Self {
        // A type id is a shape's index: far below 2³².
        Self { first: u32::try_from(type_id).unwrap_or(u32::MAX), mask: 0 }
    }

    /// The types whose ids are set in `mask` (ids below [`Self::MAX_TYPE_ID`]); a mask of one
    /// type is that type. None when `mask` is empty or names a higher id.
    pub(crate) fn of_mask(mask: u64) -> Option<Self> {
        let mask = u32::try_from(mask).ok().filter(|&m| m != 0)?;
        let first = mask.trailing_zeros();
        Some(if mask.count_ones() == 1 { Self { first, mask: 0 } } else { Self { first, mask } })
    }

    /// Whether the gang may use nodes of type `type_id`.
    pub(crate) fn covers(self, type_id: usize) -> bool {
        if self.mask == 0 {
            type_id == self.first as usize
        } else {
            type_id < Self::MAX_TYPE_ID && self.mask >> type_id & 1 == 1
        }
    }

    /// The lowest type id: no shape before it has a type of the span.
    pub(crate) fn first(self) -> usize {
        self.first as usize
    }

    /// Whether this spans several types.
    pub(crate) fn is_span(self) -> bool {
        self.mask != 0
    }

    /// The type ids, lowest first.
    pub(crate) fn type_ids(self) -> impl Iterator<Item = usize> {
        let single = (self.mask == 0).then_some(self.first());
        let spanned = (0..Self::MAX_TYPE_ID).filter(move |&t| self.mask >> t & 1 == 1);
        single.into_iter().chain(spanned)
    }
}

/// One GPU type, or span of types, the gang may use on a cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct TypeOption {
    /// The type, or the types of a span.
    pub(crate) span: Span,
    /// US$ per reference GPU-hour of work on this type here: its hourly price ÷ its relative
    /// speed ([`PlacementConfig::gpu_speed`](crate::PlacementConfig::gpu_speed); 1 when unknown).
    /// A span costs what its dearest type does: the member may give the gang any of them.
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
        // Ties: a single type before a span (its price is its dearest type's, so the span's
        // cheaper types are listed first), then by name.
        let name = |o: &TypeOption| shapes.get(o.span.first()).map_or("", |s| s.gpu_type.as_str());
        let better = |a: &TypeOption, b: &TypeOption| {
            a.price
                .total_cmp(&b.price)
                .then_with(|| a.span.is_span().cmp(&b.span.is_span()))
                .then_with(|| name(a).cmp(name(b)))
                .is_lt()
        };
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
    /// The GPU type's name, shared with the snapshot; for a span, its types' names joined by
    /// [`SPAN_SEPARATOR`] in type order (`a100-40g+a100-80g`), made now.
    pub(crate) fn gpu_type(&self, index: &FreeIndex) -> Option<Name> {
        if !self.span.is_span() {
            return index.gpu_type(self.span.first()).cloned();
        }
        let mut joined = String::new();
        for type_id in self.span.type_ids() {
            let name = index.gpu_type(type_id)?;
            if !joined.is_empty() {
                joined.push(SPAN_SEPARATOR);
            }
            joined.push_str(name);
        }
        Some(Name::from(joined))
    }
}
