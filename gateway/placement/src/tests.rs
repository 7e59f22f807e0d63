//! Placement behaviour end to end, one file per concept: one test per rule, plus properties over
//! random federations. The helpers here build the clusters and jobs every file uses.

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::{
    ClusterInfo, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure, Tier,
};
use meridian_proto::spec::{BurstPolicy, DataRef, JobSpec, Resources};
use meridian_proto::testing;

use super::*;

mod best_fit;
mod burst;
mod deadlines;
mod filter;
mod holds;
mod properties;
mod quotes;
mod score;
mod selectors;
mod spans;
mod statics;

fn shape(gpu_type: &str, gpus_per_node: u32, free_gpus: &[u32]) -> NodeShape {
    NodeShape {
        name: format!("{gpu_type}-x{gpus_per_node}"),
        gpu_type: gpu_type.to_owned(),
        gpu_memory_gib: match gpu_type {
            "h100" | "a100-80g" => 80,
            "l4" => 24,
            _ => 40,
        },
        gpus_per_node,
        cpu_per_node: 16 * gpus_per_node,
        memory_gib_per_node: 128 * gpus_per_node,
        free: free_gpus.iter().map(|&g| NodeFree { gpus: g, cpu: 16 * g, memory_gib: 128 * g }).collect(),
        labels: Default::default(),
    }
}

fn info(name: &str, region: &str, tier: Tier) -> ClusterInfo {
    let prices = [("h100", 4.0), ("a100-80g", 2.0), ("l4", 0.8)];
    let mut info = testing::cluster_info(name);
    info.region = region.to_owned();
    info.tier = tier;
    info.prices = prices.iter().map(|(t, p)| ((*t).to_owned(), if tier == Tier::Cloud { *p } else { 0.0 })).collect();
    info
}

fn cluster(name: &str, region: &str, tier: Tier, shapes: Vec<NodeShape>) -> ClusterSnapshot {
    ClusterSnapshot::new(info(name, region, tier), Inventory { shapes }, QueuePressure::default(), true)
}

fn busy(name: &str, region: &str, tier: Tier, shapes: Vec<NodeShape>, wait_secs: u64) -> ClusterSnapshot {
    let total: u32 = shapes.iter().map(NodeShape::gpus_total).sum();
    let pressure = QueuePressure {
        queues: vec![QueueLoad {
            queue: "default".into(),
            weight: 1.0,
            pending_jobs: 1,
            pending_gpus: 0,
            running_gpus: total,
        }],
        releases: vec![GpuRelease { after_secs: wait_secs, gpus: total }],
        estimated_wait_secs: wait_secs,
        preemptible: Vec::new(),
    };
    ClusterSnapshot::new(info(name, region, tier), Inventory { shapes }, pressure, true)
}

/// `c` with `gpu_type` at `usd_per_gpu_hour` (a snapshot's report is read-only once built).
fn priced(c: ClusterSnapshot, gpu_type: &str, usd_per_gpu_hour: f64) -> ClusterSnapshot {
    let mut info = c.info().clone();
    info.prices.insert(gpu_type.to_owned(), usd_per_gpu_hour);
    ClusterSnapshot::new(info, c.inventory().clone(), (*c.pressure).clone(), c.connected)
}

/// `replicas` × `gpus` GPUs (4 CPUs and 32 GiB per GPU) of job `train`, with a container image.
fn job(replicas: u32, gpus: u32) -> JobSpec {
    let mut spec = testing::spec(testing::JOB);
    spec.name = "train".into();
    spec.tenant = "research".into();
    spec.gang.replicas = replicas;
    spec.gang.resources =
        Resources { gpus, gpu_types: vec![], gpu_memory_gib: 0, cpu: 4 * gpus, memory_gib: 32 * gpus };
    spec.payload.image = Some("registry/train:1".into());
    spec.payload.command.clear();
    spec
}

fn federation(clusters: Vec<ClusterSnapshot>) -> FederationSnapshot {
    FederationSnapshot::new(clusters, NetworkTable::default_seeded())
}

fn rejections(decision: &Decision, cluster: &str) -> Vec<Rejection> {
    decision.candidates.iter().find(|c| c.cluster == cluster).map(|c| c.reasons().to_vec()).unwrap_or_default()
}

fn chosen(decision: &Decision) -> Option<&str> {
    decision.chosen.as_ref().map(|c| c.cluster.as_str())
}

/// Owned cluster `q` with two full 8-GPU H100 nodes and the given pressure.
fn full_h100_pair(pressure: QueuePressure) -> ClusterSnapshot {
    ClusterSnapshot::new(
        info("q", "us-east", Tier::Owned),
        Inventory { shapes: vec![shape("h100", 8, &[0, 0])] },
        pressure,
        true,
    )
}

fn labelled(mut info: ClusterInfo, labels: &[(&str, &str)]) -> ClusterInfo {
    info.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    info
}

fn with_labels(mut shape: NodeShape, name: &str, labels: &[(&str, &str)]) -> NodeShape {
    shape.name = name.to_owned();
    shape.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    shape
}

fn snapshot(info: ClusterInfo, shapes: Vec<NodeShape>) -> ClusterSnapshot {
    ClusterSnapshot::new(info, Inventory { shapes }, QueuePressure::default(), true)
}
