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

use tokio::time::Instant;

pub mod agent;
pub mod backend;
pub mod config;

pub use meridian_scheduler as builtin;

/// Why an agent could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builtin scheduler refused the declared nodes or queues.
    #[error("builtin scheduler: {0}")]
    Scheduler(#[from] builtin::Error),
    /// The backend could not start.
    #[error("backend: {0}")]
    Backend(#[from] backend::BackendError),
}

/// Builds an agent (with its builtin backend) from a checked configuration.
///
/// Must be called inside a Tokio runtime: the builtin backend starts its driver task here.
pub fn agent_from_config(config: &config::AgentConfig) -> Result<agent::Agent, BuildError> {
    if config.backend == meridian_proto::inventory::BackendKind::Slurm {
        return slurm_agent_from_config(config);
    }
    let scheduler = builtin::BuiltinScheduler::new(config.node_specs(), config.queue_specs())?;
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let backend = Arc::new(backend::BuiltinBackend::new(scheduler, config.time_scale, events_tx)?);
    let settings = agent::Settings {
        info: config.cluster_info(),
        gateway: config.gateway.clone(),
        report_interval: config.report_interval.0,
    };
    Ok(agent::Agent::new(settings, backend.clone(), backend, events_rx))
}

/// Builds an agent over Slurm. The backend checks Slurm once before the agent starts, which
/// needs a multi-threaded Tokio runtime (the agent binary's).
fn slurm_agent_from_config(config: &config::AgentConfig) -> Result<agent::Agent, BuildError> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let slurm = config.slurm.clone().unwrap_or_default();
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let handle = Handle::try_current()
        .map_err(|_| backend::BackendError::permanent("the Slurm backend must be started inside a Tokio runtime"))?;
    if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
        return Err(backend::BackendError::permanent("the Slurm backend needs a multi-threaded Tokio runtime").into());
    }
    let backend =
        Arc::new(tokio::task::block_in_place(|| handle.block_on(backend::SlurmBackend::new(slurm, events_tx)))?);
    let settings = agent::Settings {
        info: config.cluster_info(),
        gateway: config.gateway.clone(),
        report_interval: config.report_interval.0,
    };
    Ok(agent::Agent::new(settings, backend.clone(), backend, events_rx))
}

pub use meridian_process::{init_logging, shutdown_signal};

/// Sleeps until `deadline`, or forever when there is none (a `select!` arm that never fires).
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
