//! NVML readings → the builtin scheduler's nodes: product names to Meridian GPU types, MIG
//! instances to GPU types of their own.
//!
//! The scheduler's [`NodeSpec`] has one GPU type, so one host becomes one node per GPU type:
//! - whole GPUs of the host's first type (in NVML index order) form the node named like the
//!   host (`gpu-7`);
//! - every other type forms a node `host/<type>`: whole GPUs of a second product
//!   (`gpu-7/l4`), and MIG instances, typed `<base>.<profile>` (`gpu-7/a100-80g.1g.10gb`).
//!
//! A host whose GPUs are all in MIG mode has only `host/<type>` nodes. The host's CPU cores and
//! memory are split between its nodes in proportion to the physical GPUs behind each, so the
//! nodes together never promise more than the host has. MIG types are not in the gateway's
//! built-in catalog: add them to the gateway's GPU types to place jobs on them.

use std::collections::BTreeMap;

use meridian_proto::gpu::GpuCatalog;

use super::HostReadings;
use meridian_scheduler::NodeSpec;

/// NVML product names the agent maps without configuration.
pub const KNOWN_PRODUCTS: &[(&str, &str)] = &[
    ("NVIDIA B200", "b200"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80g"),
    ("NVIDIA A100 80GB PCIe", "a100-80g"),
    ("NVIDIA A100-SXM4-40GB", "a100-40g"),
    ("NVIDIA A100-PCIE-40GB", "a100-40g"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("Tesla V100-SXM2-32GB", "v100"),
    ("Tesla V100-PCIE-32GB", "v100"),
    ("Tesla T4", "t4"),
];

/// One node of this host: what the scheduler sees, and the devices behind its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNode {
    /// The scheduler's node.
    pub spec: NodeSpec,
    /// What `CUDA_VISIBLE_DEVICES` takes for each GPU of the node: NVML indices for whole GPUs,
    /// `MIG-…` UUIDs for MIG instances (`<gpu>:<instance>` when NVML gave no UUID).
    pub devices: Vec<String>,
}

/// Why readings could not become nodes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// NVML found no GPU (or only MIG GPUs without instances).
    #[error("NVML found no usable GPU on this host; declare `nodes` or set `process.gpuDiscovery: none`")]
    NoGpus,
    /// A product the agent cannot name.
    #[error(
        "GPU {index}: unknown product `{product}`; map it to a Meridian GPU type in the agent config, e.g. `process.gpuTypes: {{\"{product}\": <type>}}`"
    )]
    UnknownProduct {
        /// NVML index.
        index: u32,
        /// NVML product name.
        product: String,
    },
}

/// GPUs of one type on this host, in the order first seen.
struct Group {
    gpu_type: String,
    memory_gib: u32,
    devices: Vec<String>,
    /// Physical GPUs behind the devices (a MIG GPU counts once).
    physical: Vec<u32>,
}

/// Maps this host's readings to scheduler nodes (see the module docs). `gpu_types` maps product
/// names to GPU types and wins over [`KNOWN_PRODUCTS`].
pub fn host_nodes(host: &HostReadings, gpu_types: &BTreeMap<String, String>) -> Result<Vec<HostNode>, MappingError> {
    let catalog = GpuCatalog::default();
    let mut groups: Vec<Group> = Vec::new();
    let mut add = |gpu_type: String, memory_gib: u32, device: String, physical: u32| {
        let group = match groups.iter().position(|g| g.gpu_type == gpu_type) {
            Some(i) => &mut groups[i],
            None => {
                groups.push(Group { gpu_type, memory_gib, devices: Vec::new(), physical: Vec::new() });
                let last = groups.len() - 1;
                &mut groups[last]
            }
        };
        group.devices.push(device);
        if !group.physical.contains(&physical) {
            group.physical.push(physical);
        }
    };
    for gpu in &host.gpus {
        let base = gpu_types
            .get(&gpu.name)
            .map(String::as_str)
            .or_else(|| KNOWN_PRODUCTS.iter().find(|(product, _)| *product == gpu.name).map(|(_, t)| *t))
            .ok_or_else(|| MappingError::UnknownProduct { index: gpu.index, product: gpu.name.clone() })?;
        if !gpu.mig_enabled {
            let memory = catalog.memory_gib(base).unwrap_or_else(|| gib_rounded_up(gpu.memory_total_bytes));
            add(base.to_string(), memory, gpu.index.to_string(), gpu.index);
            continue;
        }
        for (slot, mig) in gpu.mig_instances.iter().enumerate() {
            let profile = mig_profile(&mig.name)
                .unwrap_or_else(|| format!("{}g.{}gb", mig.slices, gib_rounded(mig.memory_total_bytes)));
            let memory = profile_memory_gib(&profile).unwrap_or_else(|| gib_rounded(mig.memory_total_bytes));
            let device = mig.uuid.clone().unwrap_or_else(|| format!("{}:{slot}", gpu.index));
            add(format!("{base}.{profile}"), memory, device, gpu.index);
        }
    }
    if groups.is_empty() {
        return Err(MappingError::NoGpus);
    }
    let physical_total: u32 = groups.iter().map(|g| g.physical.len() as u32).sum::<u32>().max(1);
    let share = |amount: u32, physical: u32| -> u32 {
        u32::try_from(u64::from(amount) * u64::from(physical) / u64::from(physical_total)).unwrap_or(amount)
    };
    let whole_first = groups.first().is_some_and(|g| !g.gpu_type.contains('.'));
    Ok(groups
        .into_iter()
        .enumerate()
        .map(|(i, group)| {
            let name = if i == 0 && whole_first {
                host.hostname.clone()
            } else {
                format!("{}/{}", host.hostname, group.gpu_type)
            };
            let physical = group.physical.len() as u32;
            let gpus = group.devices.len() as u32;
            HostNode {
                spec: NodeSpec {
                    name,
                    shape: format!("{}x{gpus}", group.gpu_type),
                    gpu_type: group.gpu_type,
                    gpu_memory_gib: group.memory_gib,
                    gpus,
                    cpu: share(host.cpus, physical),
                    memory_gib: share(host.memory_gib, physical),
                    labels: Default::default(),
                },
                devices: group.devices,
            }
        })
        .collect())
}

/// The profile in a MIG device name (`NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`).
fn mig_profile(name: &str) -> Option<String> {
    let profile = name.rsplit_once("MIG ")?.1.trim();
    (profile.contains('g') && profile.ends_with("gb")).then(|| profile.to_string())
}

/// The memory a profile names (`1g.10gb` → 10; `1g.10gb+me` → 10).
fn profile_memory_gib(profile: &str) -> Option<u32> {
    let memory = profile.split('.').nth(1)?;
    memory.split("gb").next()?.parse().ok()
}

const GIB: u64 = 1 << 30;

fn gib_rounded(bytes: u64) -> u32 {
    u32::try_from((bytes + GIB / 2) / GIB).unwrap_or(u32::MAX)
}

fn gib_rounded_up(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(GIB)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::nvml::{GpuReading, MigReading};

    const MIB: u64 = 1 << 20;

    fn gpu(index: u32, name: &str, memory_mib: u64) -> GpuReading {
        GpuReading {
            index,
            name: name.into(),
            uuid: format!("GPU-4b0c2e1a-9f3d-4c6e-8a21-00000000000{index}"),
            memory_total_bytes: memory_mib * MIB,
            mig_enabled: false,
            mig_instances: Vec::new(),
            utilization_percent: Some(0),
        }
    }

    fn host(hostname: &str, cpus: u32, memory_gib: u32, gpus: Vec<GpuReading>) -> HostReadings {
        HostReadings { hostname: hostname.into(), cpus, memory_gib, gpus }
    }

    /// A DGX H100 as NVML reports it (81559 MiB per GPU).
    fn dgx_h100() -> HostReadings {
        host("dgx-01", 224, 2015, (0..8).map(|i| gpu(i, "NVIDIA H100 80GB HBM3", 81559)).collect())
    }

    /// An 8×A100-80GB host with GPUs 0 and 1 in MIG mode, 7 × 1g.10gb each (9856 MiB per
    /// instance, as NVML reports them).
    fn a100_with_mig() -> HostReadings {
        let mut gpus: Vec<GpuReading> = (0..8).map(|i| gpu(i, "NVIDIA A100-SXM4-80GB", 81920)).collect();
        for parent in &mut gpus[..2] {
            parent.mig_enabled = true;
            parent.mig_instances = (0..7)
                .map(|slot| MigReading {
                    name: "NVIDIA A100-SXM4-80GB MIG 1g.10gb".into(),
                    uuid: Some(format!("MIG-5e2a7c3d-{:04}-5b1f-9c0e-7d3a2b1c{slot:04}", parent.index)),
                    memory_total_bytes: 9856 * MIB,
                    slices: 1,
                })
                .collect();
        }
        host("a100-07", 128, 1007, gpus)
    }

    fn l4_host() -> HostReadings {
        host("l4-box", 48, 188, (0..4).map(|i| gpu(i, "NVIDIA L4", 23034)).collect())
    }

    #[test]
    fn an_h100_host_is_one_node_named_by_the_host() {
        let nodes = host_nodes(&dgx_h100(), &BTreeMap::new()).unwrap();
        assert_eq!(nodes.len(), 1);
        let node = &nodes[0];
        assert_eq!(
            node.spec,
            NodeSpec {
                name: "dgx-01".into(),
                shape: "h100x8".into(),
                gpu_type: "h100".into(),
                gpu_memory_gib: 80,
                gpus: 8,
                cpu: 224,
                memory_gib: 2015,
                labels: Default::default(),
            }
        );
        assert_eq!(node.devices, (0..8).map(|i| i.to_string()).collect::<Vec<_>>());
    }

    #[test]
    fn mig_instances_become_a_node_of_their_own_type_with_uuids_as_devices() {
        let nodes = host_nodes(&a100_with_mig(), &BTreeMap::new()).unwrap();
        assert_eq!(nodes.len(), 2, "{nodes:?}");
        // GPU 0 is in MIG mode, so the MIG group is seen first; whole GPUs still get the host's name.
        let whole = nodes.iter().find(|n| n.spec.gpu_type == "a100-80g").unwrap();
        assert_eq!(whole.spec.name, "a100-07/a100-80g");
        assert_eq!((whole.spec.gpus, whole.spec.gpu_memory_gib), (6, 80));
        assert_eq!(whole.devices, vec!["2", "3", "4", "5", "6", "7"]);
        let mig = nodes.iter().find(|n| n.spec.gpu_type == "a100-80g.1g.10gb").unwrap();
        assert_eq!(mig.spec.name, "a100-07/a100-80g.1g.10gb");
        assert_eq!((mig.spec.gpus, mig.spec.gpu_memory_gib), (14, 10));
        assert!(mig.devices.iter().all(|d| d.starts_with("MIG-")), "{:?}", mig.devices);
        // CPU and memory split by physical GPUs: 6 of 8 and 2 of 8.
        assert_eq!((whole.spec.cpu, mig.spec.cpu), (96, 32));
        assert_eq!((whole.spec.memory_gib, mig.spec.memory_gib), (755, 251));
        assert!(whole.spec.cpu + mig.spec.cpu <= 128);
    }

    #[test]
    fn whole_gpus_seen_first_take_the_hosts_name() {
        let mut readings = a100_with_mig();
        readings.gpus.rotate_left(2);
        let nodes = host_nodes(&readings, &BTreeMap::new()).unwrap();
        assert_eq!(nodes[0].spec.name, "a100-07");
        assert_eq!(nodes[1].spec.name, "a100-07/a100-80g.1g.10gb");
    }

    #[test]
    fn a_mig_profile_is_derived_from_slices_and_memory_when_the_name_lacks_it() {
        let mut readings = a100_with_mig();
        for mig in &mut readings.gpus[0].mig_instances {
            mig.name = "MIG device".into();
            mig.uuid = None;
        }
        let nodes = host_nodes(&readings, &BTreeMap::new()).unwrap();
        let mig = nodes.iter().find(|n| n.spec.gpu_type == "a100-80g.1g.10gb").unwrap();
        assert!(mig.devices.contains(&"0:3".to_string()), "{:?}", mig.devices);
    }

    #[test]
    fn an_l4_host_maps_to_l4_with_the_catalog_memory() {
        let nodes = host_nodes(&l4_host(), &BTreeMap::new()).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(
            (nodes[0].spec.name.as_str(), nodes[0].spec.gpu_type.as_str(), nodes[0].spec.gpus),
            ("l4-box", "l4", 4)
        );
        assert_eq!(nodes[0].spec.gpu_memory_gib, 24);
    }

    #[test]
    fn an_unknown_product_names_the_product_and_the_config_key() {
        let readings = host("ws", 32, 128, vec![gpu(0, "NVIDIA RTX 6000 Ada Generation", 49140)]);
        let err = host_nodes(&readings, &BTreeMap::new()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("NVIDIA RTX 6000 Ada Generation") && text.contains("process.gpuTypes"), "{text}");

        let mapped = BTreeMap::from([("NVIDIA RTX 6000 Ada Generation".to_string(), "rtx6000-ada".to_string())]);
        let nodes = host_nodes(&readings, &mapped).unwrap();
        assert_eq!((nodes[0].spec.gpu_type.as_str(), nodes[0].spec.gpu_memory_gib), ("rtx6000-ada", 48));
    }

    #[test]
    fn a_host_without_gpus_is_an_error() {
        assert_eq!(host_nodes(&host("x", 1, 1, Vec::new()), &BTreeMap::new()), Err(MappingError::NoGpus));
    }

    #[test]
    fn mapped_nodes_are_accepted_by_the_scheduler() {
        for readings in [dgx_h100(), a100_with_mig(), l4_host()] {
            let nodes = host_nodes(&readings, &BTreeMap::new()).unwrap();
            let specs = nodes.into_iter().map(|n| n.spec).collect();
            meridian_scheduler::BuiltinScheduler::new(specs, vec![meridian_scheduler::QueueSpec::new("default", 1.0)])
                .unwrap();
        }
    }
}
