//! A member cluster on the wire: its identity (`Hello`), inventory and queue pressure, with the
//! label rules a member's own labels follow.

use std::collections::{BTreeMap, BTreeSet};

use super::super::pb;
use super::*;
use crate::inventory::{
    ClusterInfo, GpuRelease, Inventory, NodeFree, NodeShape, PreemptibleGpus, QueueLoad, QueuePressure,
};
use crate::validate::{self};

/// Labels a member reports (its own or a shape's): the label rules of the job spec, and no key
/// with the reserved `meridian.io/` prefix. The first bad entry is refused with its path
/// (`hello.labels.gpu fabric`).
fn labels_from_wire(labels: std::collections::HashMap<String, String>, path: &str) -> Result<BTreeMap<String, String>> {
    let labels: BTreeMap<String, String> = labels.into_iter().collect();
    match validate::member_label_errors(path, &labels).into_iter().next() {
        Some(error) => Err(ConvertError::InvalidLabel { field: error.field, reason: error.reason }),
        None => Ok(labels),
    }
}

impl From<&ClusterInfo> for pb::Hello {
    /// `agent_version` is left empty: it is not part of [`ClusterInfo`]; the agent fills it in.
    fn from(info: &ClusterInfo) -> Self {
        pb::Hello {
            cluster: info.name.clone(),
            region: info.region.clone(),
            tier: pb::Tier::from(info.tier).into(),
            backend: pb::BackendKind::from(info.backend).into(),
            prices: info
                .prices
                .iter()
                .map(|(gpu_type, &usd_per_gpu_hour)| pb::GpuPrice { gpu_type: gpu_type.clone(), usd_per_gpu_hour })
                .collect(),
            supports_containers: info.supports_containers,
            supports_bare_commands: info.supports_bare_commands,
            agent_version: String::new(),
            instance_id: String::new(),
            labels: info.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

impl TryFrom<pb::Hello> for ClusterInfo {
    type Error = ConvertError;
    /// Refuses an empty cluster name or region, an unspecified or unknown tier or backend, a
    /// price without a GPU type, a GPU type priced twice, and a price that is not a finite
    /// number ≥ 0. `agent_version` is dropped (the caller logs it if it wants).
    fn try_from(hello: pb::Hello) -> Result<Self> {
        let name = required(hello.cluster, || "hello.cluster".into())?;
        let region = required(hello.region, || "hello.region".into())?;
        let tier = tier_from_wire("hello.tier", hello.tier)?;
        let backend = backend_from_wire("hello.backend", hello.backend)?;
        let mut prices = BTreeMap::new();
        for (i, price) in hello.prices.into_iter().enumerate() {
            let gpu_type = required(price.gpu_type, || format!("hello.prices[{i}].gpu_type"))?;
            let usd = price.usd_per_gpu_hour;
            if !usd.is_finite() || usd < 0.0 {
                return Err(ConvertError::OutOfRange {
                    field: format!("hello.prices[{i}].usd_per_gpu_hour"),
                    value: usd,
                    expected: "a finite number of US$ per GPU-hour, 0 or more",
                });
            }
            if prices.contains_key(&gpu_type) {
                return Err(ConvertError::Duplicate { field: "hello.prices".into(), key: gpu_type });
            }
            prices.insert(gpu_type, usd);
        }
        let labels = labels_from_wire(hello.labels, "hello.labels")?;
        Ok(ClusterInfo {
            name,
            region,
            tier,
            backend,
            prices,
            supports_containers: hello.supports_containers,
            supports_bare_commands: hello.supports_bare_commands,
            labels,
        })
    }
}

// ---------------------------------------------------------------- inventory

impl From<&Inventory> for pb::Inventory {
    fn from(inventory: &Inventory) -> Self {
        let shapes = inventory
            .shapes
            .iter()
            .map(|shape| pb::NodeShape {
                name: shape.name.clone(),
                gpu_type: shape.gpu_type.clone(),
                gpu_memory_gib: shape.gpu_memory_gib,
                gpus_per_node: shape.gpus_per_node,
                cpu_per_node: shape.cpu_per_node,
                memory_gib_per_node: shape.memory_gib_per_node,
                free: shape
                    .free
                    .iter()
                    .map(|node| pb::NodeFree { gpus: node.gpus, cpu: node.cpu, memory_gib: node.memory_gib })
                    .collect(),
                labels: shape.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect();
        pb::Inventory { shapes }
    }
}

impl TryFrom<pb::Inventory> for Inventory {
    type Error = ConvertError;
    /// Refuses a shape without a name, two shapes with the same name, a shape with GPUs but no
    /// GPU type, and a node reporting more GPUs, CPU or memory free than its shape has per node.
    ///
    /// A shape with `gpus_per_node == 0` is accepted: a cluster whose scheduler also manages
    /// CPU-only nodes may report them, and since every replica needs at least one GPU, placement
    /// can never use them anyway. Refusing them would refuse the whole report.
    fn try_from(inventory: pb::Inventory) -> Result<Self> {
        let mut names = BTreeSet::new();
        let mut shapes = Vec::with_capacity(inventory.shapes.len());
        for (i, shape) in inventory.shapes.into_iter().enumerate() {
            let path = format!("inventory.shapes[{i}]");
            let name = required(shape.name, || format!("{path}.name"))?;
            if !names.insert(name.clone()) {
                return Err(ConvertError::Duplicate { field: "inventory.shapes".into(), key: name });
            }
            if shape.gpus_per_node > 0 && shape.gpu_type.is_empty() {
                return Err(missing(&format!("{path}.gpu_type")));
            }
            let mut free = Vec::with_capacity(shape.free.len());
            for (j, node) in shape.free.into_iter().enumerate() {
                let check = |resource: &str, free: u32, capacity: u32| {
                    if free > capacity {
                        Err(ConvertError::FreeExceedsCapacity {
                            field: format!("{path}.free[{j}].{resource}"),
                            free,
                            capacity,
                        })
                    } else {
                        Ok(())
                    }
                };
                check("gpus", node.gpus, shape.gpus_per_node)?;
                check("cpu", node.cpu, shape.cpu_per_node)?;
                check("memory_gib", node.memory_gib, shape.memory_gib_per_node)?;
                free.push(NodeFree { gpus: node.gpus, cpu: node.cpu, memory_gib: node.memory_gib });
            }
            let labels = labels_from_wire(shape.labels, &format!("{path}.labels"))?;
            shapes.push(NodeShape {
                labels,
                name,
                gpu_type: shape.gpu_type,
                gpu_memory_gib: shape.gpu_memory_gib,
                gpus_per_node: shape.gpus_per_node,
                cpu_per_node: shape.cpu_per_node,
                memory_gib_per_node: shape.memory_gib_per_node,
                free,
            });
        }
        Ok(Inventory { shapes })
    }
}

// ---------------------------------------------------------------- queue pressure

impl From<&QueuePressure> for pb::QueuePressure {
    fn from(pressure: &QueuePressure) -> Self {
        pb::QueuePressure {
            queues: pressure
                .queues
                .iter()
                .map(|q| pb::QueueLoad {
                    queue: q.queue.to_string(),
                    weight: q.weight,
                    pending_jobs: q.pending_jobs,
                    pending_gpus: q.pending_gpus,
                    running_gpus: q.running_gpus,
                })
                .collect(),
            releases: pressure
                .releases
                .iter()
                .map(|r| pb::GpuRelease { after_seconds: r.after_secs, gpus: r.gpus })
                .collect(),
            estimated_wait_seconds: pressure.estimated_wait_secs,
            preemptible: pressure
                .preemptible
                .iter()
                .map(|p| pb::PreemptibleGpus { priority: p.priority, gpus: p.gpus })
                .collect(),
        }
    }
}

impl TryFrom<pb::QueuePressure> for QueuePressure {
    type Error = ConvertError;
    /// Refuses a queue without a name, a queue named twice, and a weight that is not a finite
    /// number > 0.
    ///
    /// Releases are **sorted** ascending by `after_seconds` (stable) rather than refused when out
    /// of order: their order carries no information beyond the times themselves, so sorting loses
    /// nothing, while refusing would throw away an otherwise good report from an agent that merges
    /// several sources.
    fn try_from(pressure: pb::QueuePressure) -> Result<Self> {
        let mut names = BTreeSet::new();
        let mut queues = Vec::with_capacity(pressure.queues.len());
        for (i, q) in pressure.queues.into_iter().enumerate() {
            let queue = required(q.queue, || format!("pressure.queues[{i}].queue"))?;
            if !names.insert(queue.clone()) {
                return Err(ConvertError::Duplicate { field: "pressure.queues".into(), key: queue });
            }
            if !q.weight.is_finite() || q.weight <= 0.0 {
                return Err(ConvertError::OutOfRange {
                    field: format!("pressure.queues[{i}].weight"),
                    value: q.weight,
                    expected: "a finite number greater than 0",
                });
            }
            queues.push(QueueLoad {
                queue: queue.into(),
                weight: q.weight,
                pending_jobs: q.pending_jobs,
                pending_gpus: q.pending_gpus,
                running_gpus: q.running_gpus,
            });
        }
        let mut releases: Vec<GpuRelease> =
            pressure.releases.into_iter().map(|r| GpuRelease { after_secs: r.after_seconds, gpus: r.gpus }).collect();
        releases.sort_by_key(|r| r.after_secs);
        let mut preemptible: Vec<PreemptibleGpus> =
            pressure.preemptible.into_iter().map(|p| PreemptibleGpus { priority: p.priority, gpus: p.gpus }).collect();
        preemptible.sort_by_key(|p| p.priority);
        Ok(QueuePressure { queues, releases, estimated_wait_secs: pressure.estimated_wait_seconds, preemptible })
    }
}
