//! This host's GPUs, read from NVML: the process runner's inventory when no nodes are declared.
//!
//! [`GpuProbe`] reads devices ([`NvmlProbe`] over `nvml-wrapper`; tests use recorded readings);
//! [`mapping::host_nodes`] turns the readings into the builtin scheduler's nodes. NVML is loaded
//! at run time (`libnvidia-ml.so.1`), so the agent builds and runs on hosts without a driver:
//! [`NvmlProbe::init`] then fails and the agent uses the declared nodes.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

pub mod mapping;

pub use mapping::{HostNode, MappingError, host_nodes};

/// What NVML says about one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    /// NVML index (what `CUDA_VISIBLE_DEVICES` takes for whole GPUs).
    pub index: u32,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Total memory in bytes.
    pub memory_total_bytes: u64,
    /// MIG mode is on now (not merely pending a reset).
    pub mig_enabled: bool,
    /// MIG instances when MIG is on.
    pub mig_instances: Vec<MigReading>,
    /// Percent of the last sample period a kernel ran, when NVML could say.
    pub utilization_percent: Option<u32>,
}

/// One MIG instance of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigReading {
    /// NVML name of the MIG device (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`); the profile is read
    /// from it when present.
    pub name: String,
    /// `MIG-…` UUID, when NVML gave one.
    pub uuid: Option<String>,
    /// Memory of the instance in bytes.
    pub memory_total_bytes: u64,
    /// GPU slices of the instance (the `1` of `1g.10gb`).
    pub slices: u32,
}

/// This host as the mapping needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReadings {
    /// Host name; names the host's nodes.
    pub hostname: String,
    /// CPU cores available to the agent.
    pub cpus: u32,
    /// Host memory in GiB.
    pub memory_gib: u32,
    /// Physical GPUs in NVML index order.
    pub gpus: Vec<GpuReading>,
}

/// Why GPUs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// An NVML call failed.
    #[error("NVML: {what}: {source}")]
    Nvml {
        /// The call.
        what: String,
        /// NVML's error.
        #[source]
        source: NvmlError,
    },
}

/// A source of GPU readings.
pub trait GpuProbe {
    /// Every physical GPU of this host.
    fn read(&self) -> Result<Vec<GpuReading>, ProbeError>;
}

/// [`GpuProbe`] over the NVIDIA driver's NVML library.
pub struct NvmlProbe {
    nvml: Nvml,
}

/// `nvmlDeviceGetMigMode`'s value for "enabled".
const MIG_ENABLED: u32 = 1;

impl NvmlProbe {
    /// Loads and initialises NVML; fails where there is no NVIDIA driver.
    pub fn init() -> Result<Self, ProbeError> {
        Nvml::init().map(|nvml| Self { nvml }).map_err(|source| ProbeError::Nvml { what: "init".into(), source })
    }
}

impl GpuProbe for NvmlProbe {
    fn read(&self) -> Result<Vec<GpuReading>, ProbeError> {
        let fail = |what: String| move |source| ProbeError::Nvml { what, source };
        let count = self.nvml.device_count().map_err(fail("device count".into()))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let device = self.nvml.device_by_index(index).map_err(fail(format!("device {index}")))?;
            let name = device.name().map_err(fail(format!("device {index} name")))?;
            let uuid = device.uuid().map_err(fail(format!("device {index} UUID")))?;
            let memory_total_bytes = device.memory_info().map_err(fail(format!("device {index} memory")))?.total;
            let mig_enabled = match device.mig_mode() {
                Ok(mode) => mode.current == MIG_ENABLED,
                Err(NvmlError::NotSupported) => false,
                Err(source) => return Err(ProbeError::Nvml { what: format!("device {index} MIG mode"), source }),
            };
            let mut mig_instances = Vec::new();
            if mig_enabled {
                let slots = device.mig_device_count().map_err(fail(format!("device {index} MIG device count")))?;
                for slot in 0..slots {
                    let mig = match device.mig_device_by_index(slot) {
                        Ok(mig) => mig,
                        // An empty slot: fewer instances are configured than the GPU could hold.
                        Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                        Err(source) => {
                            return Err(ProbeError::Nvml { what: format!("device {index} MIG device {slot}"), source });
                        }
                    };
                    let what = format!("device {index} MIG device {slot}");
                    mig_instances.push(MigReading {
                        name: mig.name().map_err(fail(format!("{what} name")))?,
                        uuid: mig.uuid().ok(),
                        memory_total_bytes: mig.memory_info().map_err(fail(format!("{what} memory")))?.total,
                        slices: mig.attributes().map(|a| a.gpu_instance_slice_count).unwrap_or(0),
                    });
                }
            }
            let utilization_percent = device.utilization_rates().ok().map(|u| u.gpu);
            gpus.push(GpuReading {
                index,
                name,
                uuid,
                memory_total_bytes,
                mig_enabled,
                mig_instances,
                utilization_percent,
            });
        }
        Ok(gpus)
    }
}

/// This host's name, CPU cores and memory (from `uname`, the CPUs the agent may use, and
/// `/proc/meminfo`), with `gpus`.
pub fn host_readings(gpus: Vec<GpuReading>) -> HostReadings {
    let hostname = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let cpus = std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    let memory_gib = std::fs::read_to_string("/proc/meminfo").ok().as_deref().and_then(mem_total_gib).unwrap_or(0);
    HostReadings { hostname, cpus, memory_gib, gpus }
}

/// `MemTotal` of `/proc/meminfo` text, in GiB (rounded down).
fn mem_total_gib(meminfo: &str) -> Option<u32> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    u32::try_from(kib / (1024 * 1024)).ok()
}

/// Logs each GPU's utilisation at debug level (a line per GPU).
pub fn log_utilization(gpus: &[GpuReading]) {
    for gpu in gpus {
        match gpu.utilization_percent {
            Some(percent) => {
                tracing::debug!(index = gpu.index, name = %gpu.name, utilization_percent = percent, "GPU utilisation")
            }
            None => tracing::debug!(index = gpu.index, name = %gpu.name, "GPU utilisation not available"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_gib() {
        assert_eq!(mem_total_gib("MemTotal:       2113531904 kB\nMemFree: 1 kB\n"), Some(2015));
        assert_eq!(mem_total_gib("nothing"), None);
    }

    #[test]
    fn nvml_initialisation_fails_cleanly_without_a_driver() {
        // This machine has no NVIDIA driver; where one exists the probe must read something.
        match NvmlProbe::init() {
            Err(e) => assert!(e.to_string().starts_with("NVML: init"), "{e}"),
            Ok(probe) => assert!(probe.read().is_ok()),
        }
    }
}
