//! Reserving a gang on a cluster once it is offered there: the same filter and best fit the
//! decision made, then the nodes it picked lose what the gang uses, so later decisions in the same
//! placement cycle see them as used.
//!
//! These are methods of [`ClusterSnapshot`], written here rather than in `snapshot.rs` because they
//! run the filter and best fit, which read the snapshot: the snapshot itself stays below them.

use meridian_proto::inventory::NodeFree;
use meridian_proto::spec::JobSpec;

use crate::filter::eligible_options;
use crate::fit::{Nodes, fit_now};
use crate::need::Need;
use crate::snapshot::ClusterSnapshot;

impl ClusterSnapshot {
    /// Whether the whole gang of `job` fits on this cluster's free nodes now, on a GPU type it
    /// may use here. The same test [`reserve`](Self::reserve) makes, without changing anything.
    pub fn fits_now(&self, job: &JobSpec) -> bool {
        let need = Need::of(job);
        eligible_options(&need, self)
            .is_some_and(|options| fit_now(Nodes::of(self, &need), &options, &need.demand).is_ok())
    }

    /// Takes the gang's resources off the free nodes that placement assumed (best fit, on the
    /// cheapest acceptable GPU type that fits now), so later decisions in the same placement cycle
    /// see them as used.
    ///
    /// Returns false, changing nothing, when the whole gang does not fit on free nodes now or the
    /// job may never run here.
    pub fn reserve(&mut self, job: &JobSpec) -> bool {
        let need = Need::of(job);
        let Some(options) = eligible_options(&need, self) else { return false };
        let nodes = Nodes::of(self, &need);
        let Ok((option, plan)) = fit_now(nodes, &options, &need.demand) else {
            return false;
        };
        let mut taken: Vec<(usize, usize, u32)> = Vec::new();
        plan.for_each_node(nodes, option.span, &need.demand, |shape, node, replicas| {
            taken.push((shape, node, replicas));
        });
        let demand = need.demand;
        for (shape, node, replicas) in taken {
            let used = NodeFree {
                gpus: replicas.saturating_mul(demand.gpus),
                cpu: replicas.saturating_mul(demand.cpu),
                memory_gib: replicas.saturating_mul(demand.memory_gib),
            };
            self.take(shape, node, &used);
        }
        true
    }
}
