//! Which nodes and devices the process runner schedules: this host's GPUs from NVML, or the
//! nodes declared in the config.

use super::config::{GpuDiscovery, ProcessConfig};
use super::devices::DeviceTable;
use crate::backend::nvml::{self, GpuProbe, HostNode, MappingError, ProbeError};
use meridian_scheduler::NodeSpec;

/// Why the process runner has no nodes to schedule.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// NVML is unavailable and no node is declared.
    #[error(
        "no GPUs to run jobs on: {reason}, and the config declares no `nodes`; declare this host's GPUs under `nodes` (with `process.gpuDiscovery: none` to skip NVML)"
    )]
    NoNodes {
        /// Why NVML gave nothing.
        reason: String,
    },
    /// NVML read the GPUs but they could not be mapped (an unknown product).
    #[error("GPU discovery: {0}")]
    Mapping(#[from] MappingError),
}

/// The nodes the process runner schedules.
///
/// With `gpuDiscovery: nvml`, NVML's view of this host wins when NVML works; when it cannot
/// start or read (no driver), one warning is logged and the declared nodes are used, and with
/// none declared that is an error. With `gpuDiscovery: none`, the declared nodes are used.
pub fn host_nodes(
    config: &ProcessConfig,
    declared: Vec<NodeSpec>,
    open_probe: impl FnOnce() -> Result<Box<dyn GpuProbe>, ProbeError>,
) -> Result<Vec<HostNode>, DiscoveryError> {
    if config.gpu_discovery == GpuDiscovery::None {
        return Ok(declared_host_nodes(declared));
    }
    let readings = open_probe().and_then(|probe| probe.read());
    match readings {
        Ok(gpus) => {
            nvml::log_utilization(&gpus);
            let host = nvml::host_readings(gpus);
            let nodes = nvml::host_nodes(&host, &config.gpu_types)?;
            for node in &nodes {
                tracing::info!(
                    node = %node.spec.name,
                    gpu_type = %node.spec.gpu_type,
                    gpus = node.spec.gpus,
                    devices = %node.devices.join(","),
                    "GPUs discovered by NVML"
                );
            }
            Ok(nodes)
        }
        Err(e) if declared.is_empty() => Err(DiscoveryError::NoNodes { reason: e.to_string() }),
        Err(e) => {
            tracing::warn!("GPU discovery: {e}; using the {} declared nodes", declared.len());
            Ok(declared_host_nodes(declared))
        }
    }
}

/// Declared nodes as this host's devices: they partition the host's GPUs, numbered across the
/// nodes in declaration order (two declared 4-GPU nodes are GPUs 0–3 and 4–7).
pub fn declared_host_nodes(declared: Vec<NodeSpec>) -> Vec<HostNode> {
    let mut next = 0_u32;
    declared
        .into_iter()
        .map(|spec| {
            let devices = (next..next + spec.gpus).map(|i| i.to_string()).collect();
            next += spec.gpus;
            HostNode { spec, devices }
        })
        .collect()
}

/// The device table of `nodes`.
pub fn device_table(nodes: &[HostNode]) -> DeviceTable {
    DeviceTable::new(nodes.iter().map(|n| (n.spec.name.clone(), n.devices.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::nvml::GpuReading;

    struct Recorded(Vec<GpuReading>);

    impl GpuProbe for Recorded {
        fn read(&self) -> Result<Vec<GpuReading>, ProbeError> {
            Ok(self.0.clone())
        }
    }

    fn declared(name: &str, gpus: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            shape: format!("l4x{gpus}"),
            gpu_type: "l4".into(),
            gpu_memory_gib: 24,
            gpus,
            cpu: 8,
            memory_gib: 32,
            labels: Default::default(),
        }
    }

    fn no_driver() -> Result<Box<dyn GpuProbe>, ProbeError> {
        crate::backend::nvml::NvmlProbe::init().map(|p| Box::new(p) as Box<dyn GpuProbe>).and_then(|_| {
            // Where a driver exists, pretend it does not, so the test means the same everywhere.
            Err(ProbeError::Nvml { what: "init".into(), source: nvml_wrapper::error::NvmlError::LibraryNotFound })
        })
    }

    #[test]
    fn without_nvml_the_declared_nodes_are_used_with_consecutive_indices() {
        let nodes = host_nodes(&ProcessConfig::default(), vec![declared("a", 2), declared("b", 2)], no_driver).unwrap();
        assert_eq!(nodes[0].devices, vec!["0", "1"]);
        assert_eq!(nodes[1].devices, vec!["2", "3"]);
    }

    #[test]
    fn without_nvml_and_without_nodes_the_error_says_what_to_declare() {
        let err = host_nodes(&ProcessConfig::default(), Vec::new(), no_driver).unwrap_err();
        assert!(err.to_string().contains("declare this host's GPUs under `nodes`"), "{err}");
    }

    #[test]
    fn nvml_readings_win_over_declared_nodes() {
        let gpus = vec![GpuReading {
            index: 0,
            name: "NVIDIA L4".into(),
            uuid: "GPU-1".into(),
            memory_total_bytes: 23034 << 20,
            mig_enabled: false,
            mig_instances: Vec::new(),
            utilization_percent: Some(17),
        }];
        let nodes = host_nodes(&ProcessConfig::default(), vec![declared("a", 2)], move || Ok(Box::new(Recorded(gpus))))
            .unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!((nodes[0].spec.gpu_type.as_str(), nodes[0].spec.gpus), ("l4", 1));
    }
}
