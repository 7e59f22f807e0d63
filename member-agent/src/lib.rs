//! Meridian's member agent: one per member cluster. It connects out to the gateway, reports the
//! cluster's inventory and queue pressure, and runs the jobs it accepts on a [`backend::LocalBackend`].

pub mod agent;
pub mod backend;
pub mod builtin;
pub mod config;

/// Why an agent could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The builtin scheduler refused the declared nodes or queues.
    #[error("builtin scheduler: {0}")]
    Scheduler(#[from] builtin::Error),
}

/// Builds an agent (with its builtin backend) from a checked configuration.
pub fn agent_from_config(config: &config::AgentConfig) -> Result<agent::Agent, BuildError> {
    let scheduler = builtin::BuiltinScheduler::new(config.node_specs(), config.queue_specs())?;
    let backend = backend::BuiltinBackend::new(scheduler, config.time_scale);
    Ok(agent::Agent::new(config.cluster_info(), config.gateway.clone(), config.report_interval.0, Box::new(backend)))
}

/// Starts `tracing` output on stderr; `MERIDIAN_LOG` (or `RUST_LOG`) sets the filter.
pub fn init_logging(default_filter: &str) {
    let filter = std::env::var("MERIDIAN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_filter.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on the first SIGINT or SIGTERM; a second signal exits the process at once.
pub async fn shutdown_signal() {
    wait_for_signal().await;
    tracing::info!("shutting down (signal again to force)");
    tokio::spawn(async {
        wait_for_signal().await;
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
