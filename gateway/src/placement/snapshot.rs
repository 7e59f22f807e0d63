//! What placement reads about the federation for one placement cycle.

use meridian_proto::inventory::{ClusterInfo, Inventory, NodeFree, QueuePressure};
use meridian_proto::spec::JobSpec;

use super::filter::{Need, eligible_options};
use super::fit::{Fitter, clamp, fit_now};
use super::network::NetworkTable;

/// Everything placement knows about one member cluster at one moment: its last report and whether
/// its agent is connected. Placement reads the report as it is, with no index to keep in step.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSnapshot {
    /// Identity, region, tier, backend and prices.
    pub info: ClusterInfo,
    /// Node shapes with what is free on each node (less anything [`reserve`](Self::reserve)d).
    pub inventory: Inventory,
    /// How busy the cluster's own queues are.
    pub pressure: QueuePressure,
    /// Whether the agent is connected; a disconnected cluster is never chosen.
    pub connected: bool,
}

/// The whole federation as placement sees it for one cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FederationSnapshot {
    /// Member clusters; names are unique.
    pub clusters: Vec<ClusterSnapshot>,
    /// Links between regions, for data transfer time and egress cost.
    pub network: NetworkTable,
}

impl ClusterSnapshot {
    /// A snapshot of one cluster's report.
    pub fn new(info: ClusterInfo, inventory: Inventory, pressure: QueuePressure, connected: bool) -> Self {
        Self { info, inventory, pressure, connected }
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
        let shapes = &self.inventory.shapes;
        let Ok((option, plan)) = fit_now(&mut Fitter::default(), shapes, &options, &need.demand) else {
            return false;
        };
        let mut taken: Vec<(usize, usize, u32)> = Vec::new();
        plan.for_each_node(shapes, option.gpu_type(shapes), &need.demand, |shape, node, replicas| {
            taken.push((shape, node, replicas));
        });
        let demand = need.demand;
        for (shape_index, node_index, replicas) in taken {
            let Some(shape) = self.inventory.shapes.get_mut(shape_index) else { continue };
            let Some(before) = shape.free.get(node_index).map(|n| clamp(n, shape)) else { continue };
            if let Some(node) = shape.free.get_mut(node_index) {
                *node = NodeFree {
                    gpus: before.gpus.saturating_sub(replicas.saturating_mul(demand.gpus)),
                    cpu: before.cpu.saturating_sub(replicas.saturating_mul(demand.cpu)),
                    memory_gib: before.memory_gib.saturating_sub(replicas.saturating_mul(demand.memory_gib)),
                };
            }
        }
        true
    }
}

impl FederationSnapshot {
    /// A snapshot of `clusters` with the given network table.
    pub fn new(clusters: Vec<ClusterSnapshot>, network: NetworkTable) -> Self {
        Self { clusters, network }
    }

    /// The cluster named `name`.
    pub fn cluster(&self, name: &str) -> Option<&ClusterSnapshot> {
        self.clusters.iter().find(|c| c.info.name == name)
    }

    /// The cluster named `name`, to [`reserve`](ClusterSnapshot::reserve) on it.
    pub fn cluster_mut(&mut self, name: &str) -> Option<&mut ClusterSnapshot> {
        self.clusters.iter_mut().find(|c| c.info.name == name)
    }
}
