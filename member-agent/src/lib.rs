//! Meridian's member agent: one per member cluster. It connects out to the gateway, reports the
//! cluster's inventory and queue pressure, and runs the jobs it accepts on a
//! [`backend::LocalBackend`].
//!
//! - [`agent`]: the event loop, the gateway stream, the outbox and the lease.
//! - [`backend`]: the seam to the member's scheduler ([`backend::LocalBackend`],
//!   [`backend::InventorySource`]) and the builtin implementation.
//! - [`config`]: the agent's YAML configuration.
//! - [`builtin`]: the builtin gang + fair-share scheduler itself (the `meridian-scheduler` crate).

use std::sync::Arc;

use meridian_proto::inventory::BackendKind;

pub mod agent;
pub mod backend;
pub mod config;
pub mod metrics;
pub mod preemption;
pub mod usage;

#[cfg(test)]
mod test_jobs;

pub use meridian_scheduler as builtin;

/// Why an agent could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builtin scheduler refused the declared nodes or queues.
    #[error("builtin scheduler: {0}")]
    Scheduler(#[from] builtin::Error),
    /// The process runner found no GPUs to schedule.
    #[error("process runner: {0}")]
    Discovery(#[from] backend::process::discovery::DiscoveryError),
    /// The backend could not start.
    #[error("backend: {0}")]
    Backend(#[from] backend::BackendError),
}

/// What the `meridian-agent` binary gives the agent it builds beyond the configuration: things
/// a library caller (a test, the demo) does not have.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The agent binary (`std::env::current_exe()`), which the process runner re-executes as
    /// its lease watchdog (`meridian-agent lease-watchdog`, see
    /// [`backend::process::watchdog`]) unless `process.leaseWatchdog` is false. None: no
    /// watchdog.
    pub lease_watchdog: Option<std::path::PathBuf>,
}

/// Builds an agent with the builtin backend from a checked configuration (see [`build_agent`]
/// for every backend), without a lease watchdog.
///
/// Must be called inside a Tokio runtime: the builtin backend starts its driver task here. With
/// the process runner this also reads this host's GPUs from NVML (see
/// [`backend::process::discovery::host_nodes`]).
pub fn agent_from_config(config: &config::AgentConfig) -> Result<agent::Agent, BuildError> {
    agent_from_config_with(config, &BuildOptions::default())
}

/// [`agent_from_config`] with what only the binary provides.
pub fn agent_from_config_with(
    config: &config::AgentConfig,
    options: &BuildOptions,
) -> Result<agent::Agent, BuildError> {
    if config.backend != BackendKind::Builtin {
        return Err(BuildError::Backend(backend::BackendError::permanent(format!(
            "the {} backend is built by `build_agent`",
            backend::backend_name(config.backend)
        ))));
    }
    let mut host_devices = Vec::new();
    let (nodes, runner) = match config.runner {
        config::RunnerKind::Simulated => {
            (config.node_specs(), backend::Runner::Simulated { time_scale: config.time_scale })
        }
        config::RunnerKind::Process => {
            let process = config.process_config();
            let hosts = backend::process::discovery::host_nodes(&process, config.node_specs(), || {
                backend::nvml::NvmlProbe::init().map(|probe| Box::new(probe) as Box<dyn backend::nvml::GpuProbe>)
            })?;
            let settings = backend::process::ProcessSettings {
                kill_grace: process.kill_grace.0,
                log_bytes: process.log_bytes,
                devices: backend::process::discovery::device_table(&hosts),
                lease_watchdog: options.lease_watchdog.clone().filter(|_| process.lease_watchdog),
                cluster: config.cluster.clone(),
            };
            host_devices = hosts.iter().map(|h| (h.spec.name.clone(), h.devices.clone())).collect();
            (hosts.into_iter().map(|h| h.spec).collect(), backend::Runner::Process(settings))
        }
    };
    let mut scheduler = builtin::BuiltinScheduler::new(nodes, config.queue_specs())?;
    let kill_grace = match config.runner {
        config::RunnerKind::Process => config.process_config().kill_grace.0,
        config::RunnerKind::Simulated => std::time::Duration::ZERO,
    };
    scheduler.set_preemption(config.preemption.policy(kill_grace));
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let backend = Arc::new(backend::BuiltinBackend::with_runner(scheduler, runner, events_tx)?);
    let agent = agent::Agent::new(settings(config), backend.clone(), backend, events_rx);
    Ok(with_sampling(agent, config, host_devices))
}

/// `agent` with the utilisation source the config names, if any. NVML that cannot start (no
/// driver) is logged and leaves the agent without one: utilisation is then unknown, not fatal.
fn with_sampling(
    agent: agent::Agent,
    config: &config::AgentConfig,
    devices: Vec<(String, Vec<String>)>,
) -> agent::Agent {
    let Some(utilization) = &config.utilization else { return agent };
    let source: Arc<dyn usage::UtilizationSource> = match (&utilization.file, utilization.nvml) {
        (Some(path), _) => Arc::new(usage::file::FileUtilization::new(path.clone())),
        (None, true) => match usage::nvml::NvmlUtilization::init(devices) {
            Ok(source) => Arc::new(source),
            Err(error) => {
                tracing::warn!(%error, "utilization.nvml: NVML is unavailable; job GPU utilisation stays unknown");
                return agent;
            }
        },
        (None, false) => return agent,
    };
    agent.with_sampling(usage::Sampling { source, interval: utilization.interval.0, window: utilization.window.0 })
}

/// Builds an agent for whichever backend the configuration selects; the Kubernetes backend
/// connects to its API server and the Slurm backend checks its controller (and both read the
/// nodes once) here. No lease watchdog: see [`build_agent_with`].
///
/// Must be called inside a Tokio runtime.
pub async fn build_agent(config: &config::AgentConfig) -> Result<agent::Agent, BuildError> {
    build_agent_with(config, &BuildOptions::default()).await
}

/// [`build_agent`] with what only the binary provides (the lease watchdog).
///
/// Must be called inside a Tokio runtime.
pub async fn build_agent_with(
    config: &config::AgentConfig,
    options: &BuildOptions,
) -> Result<agent::Agent, BuildError> {
    match (config.backend, &config.kubernetes) {
        (BackendKind::Kubernetes, Some(kubernetes)) => {
            let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
            let backend = Arc::new(
                backend::KubernetesBackend::connect(kubernetes.clone(), config.cluster.clone(), events_tx).await?,
            );
            Ok(with_sampling(
                agent::Agent::new(settings(config), backend.clone(), backend, events_rx),
                config,
                Vec::new(),
            ))
        }
        (BackendKind::Slurm, _) => {
            let slurm = config.slurm.clone().unwrap_or_default();
            let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
            let backend = Arc::new(backend::SlurmBackend::new(slurm, config.cluster.clone(), events_tx).await?);
            Ok(with_sampling(
                agent::Agent::new(settings(config), backend.clone(), backend, events_rx),
                config,
                Vec::new(),
            ))
        }
        _ => agent_from_config_with(config, options),
    }
}

fn settings(config: &config::AgentConfig) -> agent::Settings {
    agent::Settings {
        info: config.cluster_info(),
        gateways: config.gateways(),
        tls: config.tls.clone(),
        report_interval: config.report_interval.0,
    }
}

pub use meridian_process::{init_logging, shutdown_signal};
