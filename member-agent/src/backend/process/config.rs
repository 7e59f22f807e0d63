//! The `process:` section of the agent config: how the builtin backend's process runner runs
//! commands and finds this host's GPUs.

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use serde::{Deserialize, Serialize};

/// Settings of the process runner (`runner: process`). Every field has a default:
///
/// ```yaml
/// process:
///   killGrace: 10s        # SIGTERM, then SIGKILL this long after
///   logBytes: 1048576     # output kept per job (1 MiB)
///   gpuDiscovery: nvml    # or `none`: use the declared `nodes`
///   gpuTypes: {}          # NVML product name → Meridian GPU type, for products not built in
///   leaseWatchdog: true   # a process apart from the agent kills the jobs of a frozen or dead agent
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessConfig {
    /// How long a stopped job (cancel, runtime limit, gang failure) has between SIGTERM and
    /// SIGKILL.
    #[serde(default = "default_kill_grace")]
    pub kill_grace: HumanDuration,
    /// Bytes of output kept per job (a ring: the newest bytes win).
    #[serde(default = "default_log_bytes")]
    pub log_bytes: usize,
    /// Where this host's GPUs come from.
    #[serde(default)]
    pub gpu_discovery: GpuDiscovery,
    /// NVML product names mapped to Meridian GPU types, for products the agent does not know
    /// (`"NVIDIA RTX 6000 Ada Generation": rtx6000-ada`); also overrides the built-in names.
    #[serde(default)]
    pub gpu_types: BTreeMap<String, String>,
    /// Run the lease watchdog ([`super::watchdog`]): a process apart from the agent that
    /// SIGKILLs every job's processes `killGrace` after the agent's lease ran out while the agent
    /// is frozen, and at once when the agent died without stopping them. Off: a frozen agent's
    /// jobs run until it thaws, a killed agent's jobs until they end.
    #[serde(default = "default_lease_watchdog")]
    pub lease_watchdog: bool,
}

/// Where the process runner learns this host's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDiscovery {
    /// Ask NVML at start; if NVML cannot start (no driver), fall back to the declared `nodes`.
    #[default]
    Nvml,
    /// Use the declared `nodes` only.
    None,
}

fn default_kill_grace() -> HumanDuration {
    HumanDuration::from_secs(10)
}

fn default_log_bytes() -> usize {
    1 << 20
}

fn default_lease_watchdog() -> bool {
    true
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            kill_grace: default_kill_grace(),
            log_bytes: default_log_bytes(),
            gpu_discovery: GpuDiscovery::default(),
            gpu_types: BTreeMap::new(),
            lease_watchdog: default_lease_watchdog(),
        }
    }
}

impl ProcessConfig {
    /// Pushes every problem as `process.<field>: <reason>`.
    pub fn check(&self, problems: &mut Vec<String>) {
        if self.log_bytes == 0 {
            problems.push("process.logBytes: must be at least 1".to_string());
        }
        if self.kill_grace.0 > Duration::from_secs(3600) {
            problems.push(format!("process.killGrace: {} is longer than 1h", self.kill_grace));
        }
        for (product, gpu_type) in &self.gpu_types {
            if gpu_type.trim().is_empty() {
                problems.push(format!("process.gpuTypes.{product}: must name a GPU type"));
            }
        }
    }
}
