//! `meridian-agent`: the member agent of one cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use meridian_agent::backend::process::watchdog;
use meridian_agent::config::AgentConfig;

/// Connects a member cluster to a Meridian gateway and runs the jobs it is offered.
#[derive(Parser)]
#[command(name = "meridian-agent", version)]
struct Args {
    /// Agent configuration (YAML): cluster, region, tier, prices, nodes, queues.
    #[arg(short, long, env = "MERIDIAN_AGENT_CONFIG")]
    config: PathBuf,
    /// Gateway gRPC address, or several separated by commas (the gateways of a highly available
    /// control plane, tried in order); overrides the config's `gateway`.
    #[arg(long, env = "MERIDIAN_GATEWAY_GRPC")]
    gateway: Option<String>,
    /// Builtin backend, simulated runner: jobs run for `runtime.estimate × SCALE`; overrides
    /// `timeScale`.
    #[arg(long, value_name = "SCALE")]
    time_scale: Option<f64>,
}

fn main() -> ExitCode {
    // The process runner's lease watchdog is this binary re-executed in a hidden mode; it needs
    // no config and no async runtime, so it is told apart before either.
    let mut args = std::env::args_os().skip(1).peekable();
    if args.peek().is_some_and(|first| first == watchdog::MODE) {
        return watchdog::main(args.skip(1));
    }
    agent_main()
}

#[tokio::main]
async fn agent_main() -> ExitCode {
    // kube's client panics when it cannot tell which rustls crypto provider to use.
    meridian_agent::backend::kubernetes::install_crypto_provider();
    meridian_agent::init_logging("info");
    let args = Args::parse();
    // Checked once the command line's overrides are in: `--gateway https://...` may be what
    // makes the config's `tls` section consistent.
    let mut config = match AgentConfig::load_unchecked(&args.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(64);
        }
    };
    if let Some(gateway) = args.gateway {
        config.gateway = gateway;
    }
    if let Some(scale) = args.time_scale {
        config.time_scale = scale;
    }
    if let Err(e) = config.check(&args.config) {
        eprintln!("error: {e}");
        return ExitCode::from(64);
    }
    let lease_watchdog = match std::env::current_exe() {
        Ok(exe) => Some(exe),
        Err(e) => {
            tracing::error!(
                "cannot find this binary to run the lease watchdog: {e}; a frozen or killed agent's jobs keep running"
            );
            None
        }
    };
    let options = meridian_agent::BuildOptions { lease_watchdog };
    let agent = match meridian_agent::build_agent_with(&config, &options).await {
        Ok(agent) => agent,
        // The scheduler did not answer (Slurm controller or API server down): not a config
        // problem; a supervisor should start the agent again (EX_UNAVAILABLE).
        Err(meridian_agent::BuildError::Backend(e)) if e.is_transient() => {
            eprintln!("error: the member's scheduler is unreachable: {e}");
            return ExitCode::from(69);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(64);
        }
    };
    let agent = match &config.metrics {
        Some(metrics) => match tokio::net::TcpListener::bind(metrics.listen).await {
            Ok(listener) => {
                tracing::info!(listen = %metrics.listen, "serving metrics at /metrics");
                agent.with_metrics_listener(listener)
            }
            Err(e) => {
                eprintln!("error: metrics.listen: cannot listen on {}: {e}", metrics.listen);
                return ExitCode::from(69);
            }
        },
        None => agent,
    };
    agent.run(meridian_agent::shutdown_signal()).await;
    ExitCode::SUCCESS
}
