//! `meridian`: the gateway server, the demo, and the user command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use meridian_cli::{ClientArgs, UserCommand};
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::config::store::StoreKind;
use meridian_gateway::server;
use meridian_store::{KeyRing, RedbStore, SealedStore};

/// Meridian: submit GPU jobs once, run them on the best cluster of the federation.
#[derive(Parser)]
#[command(name = "meridian", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the federation gateway (control plane).
    Gateway(GatewayArgs),
    /// Run a self-contained demo: a gateway and three member clusters in this process.
    Demo(meridian::demo::DemoArgs),
    /// Replay a workload over a simulated federation and compare placement policies.
    Sim(meridian_sim::command::SimArgs),
    /// Make a development CA and certificates for the gateway and its agents.
    #[command(subcommand)]
    Certs(meridian::certs::CertsCommand),
    #[command(flatten)]
    User(UserCommand),
}

#[derive(clap::Args)]
struct GatewayArgs {
    /// Gateway configuration (YAML). Without one, defaults apply (see docs/operations.md).
    #[arg(short, long, env = "MERIDIAN_CONFIG")]
    config: Option<PathBuf>,
    /// REST address; overrides `listen`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// gRPC address; overrides `grpcListen`.
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// Data directory of the embedded store; overrides `dataDir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Once listening, write `{"rest": ADDR, "grpc": ADDR}` here (useful with port 0).
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    // One crypto provider for the whole process (rustls, tonic), chosen before any TLS is set up.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Gateway(args) => {
            meridian_process::init_logging("info");
            run_gateway(args).await
        }
        Command::Demo(args) => {
            meridian_process::init_logging("error");
            match meridian::demo::run(args, &mut std::io::stdout()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Sim(args) => match meridian_sim::command::run(&args, cli.client.output, &mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Certs(command) => match meridian::certs::run(command, &mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::User(command) => {
            let mut out = std::io::stdout();
            match meridian_cli::run(command, &cli.client, &mut out).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run_gateway(args: GatewayArgs) -> ExitCode {
    let path = args.config.clone().unwrap_or_else(|| PathBuf::from("<defaults>"));
    let mut config = match &args.config {
        Some(path) => match GatewayConfig::load(path) {
            Ok(config) => config,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(64);
            }
        },
        None => GatewayConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(grpc) = args.grpc_listen {
        config.grpc_listen = grpc;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Err(e) = config.check(&path) {
        eprintln!("error: {e}");
        return ExitCode::from(64);
    }
    let ready_file = args.ready_file;
    let on_bound = move |addrs: server::BoundAddrs, _| {
        println!("meridian gateway listening: rest={} grpc={}", addrs.rest, addrs.grpc);
        if let Some(path) = &ready_file {
            let text = format!("{{\"rest\":\"{}\",\"grpc\":\"{}\"}}\n", addrs.rest, addrs.grpc);
            let tmp = path.with_extension("tmp");
            if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
                eprintln!("warning: cannot write ready file {}: {e}", path.display());
            }
        }
    };
    let result = match config.store.kind {
        StoreKind::Embedded => {
            let keys = match open_keys(&config) {
                Ok(keys) => keys,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(64);
                }
            };
            let store = match RedbStore::open(&config.data_dir) {
                Ok(store) => SealedStore::new(store, keys),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match store.reseal().await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(values = n, key = store.keys().primary_id(), "resealed values with the primary key")
                }
                Err(e) => {
                    eprintln!("error: resealing stored values: {e}");
                    return ExitCode::FAILURE;
                }
            }
            server::serve(config, Arc::new(store), meridian_process::shutdown_signal(), on_bound).await
        }
        StoreKind::Etcd => match run_elected(config, on_bound).await {
            Ok(result) => result,
            Err(code) => return code,
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A bad tokens, key or scrape token file is bad configuration.
        Err(e @ (server::ServeError::Auth(_) | server::ServeError::Metrics(_))) => {
            eprintln!("error: {e}");
            ExitCode::from(64)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The secrets key ring: `secrets.keyFile` when set (it must exist), else
/// `<dataDir>/secrets.key`, created on first start.
fn open_keys(config: &GatewayConfig) -> Result<Arc<KeyRing>, meridian_store::Error> {
    let keys = match &config.secrets.key_file {
        Some(path) => KeyRing::load(path)?,
        None => KeyRing::load_or_create(&config.data_dir.join("secrets.key"))?,
    };
    Ok(Arc::new(keys))
}

/// Serves as one of several gateways on etcd. Err: the exit code of a start-up failure.
#[cfg(feature = "etcd")]
async fn run_elected(
    config: GatewayConfig,
    on_bound: impl FnOnce(server::BoundAddrs, meridian_gateway::runtime::Handle),
) -> Result<Result<(), server::ServeError>, ExitCode> {
    let keys = open_keys(&config).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(64)
    })?;
    let Some(etcd) = config.store.etcd.as_ref() else {
        eprintln!("error: store.etcd: required with `kind: etcd`");
        return Err(ExitCode::from(64));
    };
    let store = meridian_store::etcd::EtcdStore::connect(etcd.to_store_config()).await.map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })?;
    println!("meridian gateway: store {}", meridian_store::Store::describe(&store));
    let elected = meridian_gateway::ha::Elected { store, keys };
    Ok(meridian_gateway::ha::serve_elected(config, elected, meridian_process::shutdown_signal(), on_bound).await)
}

/// Without the etcd store built in, `config.check` has already refused `kind: etcd`.
#[cfg(not(feature = "etcd"))]
async fn run_elected(
    _config: GatewayConfig,
    _on_bound: impl FnOnce(server::BoundAddrs, meridian_gateway::runtime::Handle),
) -> Result<Result<(), server::ServeError>, ExitCode> {
    eprintln!("error: store.kind: etcd needs a gateway built with `--features etcd`");
    Err(ExitCode::from(64))
}
