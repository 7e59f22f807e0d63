//! Wires the parts of a gateway together: reads the store into a [`Core`], starts the
//! [`runtime`](crate::runtime), and serves the [`api`](crate::api) on both listeners until
//! shutdown. The runtime and the APIs do not know each other beyond the [`Handle`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use meridian_core::{Core, Loaded};
use meridian_store::Store;
use tokio::sync::watch;

use crate::config::GatewayConfig;
use crate::runtime::{Fence, Handle, Runtime, now_ms};
use crate::tls::conn::Plain;
use crate::tls::{Listener, TlsHandshake};

/// Addresses the gateway listens on (after binding port 0, the real ports).
#[derive(Debug, Clone, Copy)]
pub struct BoundAddrs {
    /// REST/JSON API.
    pub rest: SocketAddr,
    /// gRPC (agents and the Jobs service).
    pub grpc: SocketAddr,
}

/// Why the gateway could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be read.
    #[error("reading the store ({store}): {source}")]
    Store {
        /// What the store is.
        store: String,
        /// Why.
        #[source]
        source: meridian_store::Error,
    },
    /// A stored record could not be decoded.
    #[error("reading the store ({store}): {source}")]
    Decode {
        /// What the store is.
        store: String,
        /// Why.
        #[source]
        source: meridian_core::record::DecodeError,
    },
    /// The TLS files could not be loaded.
    #[error("{0}")]
    Tls(#[from] crate::tls::Error),
    /// A file named in `auth` could not be read or is invalid.
    #[error("auth: {0}")]
    Auth(#[from] crate::auth::LoadError),
    /// The metrics scrape token could not be read.
    #[error("{0}")]
    Metrics(#[from] crate::metrics::Error),
    /// A listener could not be bound or failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads everything the core starts from.
pub async fn load(config: &GatewayConfig, store: &dyn Store) -> Result<Core, ServeError> {
    let entries = store.scan("").await.map_err(|source| ServeError::Store { store: store.describe(), source })?;
    load_entries(config, entries, &store.describe())
}

/// Builds the core from a scan's `entries` of the store `described`.
pub fn load_entries(
    config: &GatewayConfig,
    entries: Vec<(String, Vec<u8>)>,
    described: &str,
) -> Result<Core, ServeError> {
    let loaded =
        Loaded::decode(entries).map_err(|source| ServeError::Decode { store: described.to_string(), source })?;
    // RandomState is seeded randomly per process: enough to keep ids of two gateways apart.
    let salt = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), now_ms()) as u16;
    Ok(Core::new(config.core_config(), loaded, now_ms(), salt))
}

/// Loads the core from `store`, binds both listeners, then serves REST, gRPC and the runtime
/// until `shutdown` resolves. `on_bound` hears the real addresses and gets a handle (for
/// in-process callers such as the demo) before serving starts. This gateway is always the
/// leader (epoch 0): the embedded store allows one gateway.
pub async fn serve(
    config: GatewayConfig,
    store: Arc<dyn Store>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(BoundAddrs, Handle),
) -> Result<(), ServeError> {
    let prepared = Prepared::new(&config)?;
    let mut core = load(&config, store.as_ref()).await?;
    tracing::info!(store = %store.describe(), jobs = core.job_count(), active = core.active_count(), "state loaded");
    let handle = Handle::new(config.runtime_config(), core.view());
    let terms = move |handle: Handle, _addrs: BoundAddrs, stop: watch::Receiver<bool>| async move {
        Runtime::start_term(core, store, &handle, Fence::unelected(), false, stop).join().await;
    };
    serve_with(config, prepared, handle, terms, shutdown, on_bound).await
}

/// What is read before anything listens: a bad file is a start-up error.
pub(crate) struct Prepared {
    reloader: Option<crate::tls::Reloader>,
    auth: Arc<crate::auth::Authenticator>,
    scrape_access: crate::metrics::ScrapeAccess,
}

impl Prepared {
    pub(crate) fn new(config: &GatewayConfig) -> Result<Prepared, ServeError> {
        let reloader = match &config.tls {
            Some(tls) => Some(crate::tls::Reloader::new(tls)?),
            None => {
                tracing::warn!(
                    "insecure: serving plain text on both ports; agents are not authenticated and anyone who reaches \
                     the gRPC port can speak for any cluster"
                );
                None
            }
        };
        let auth = Arc::new(crate::auth::Authenticator::from_config(config.auth.as_ref())?);
        if !auth.is_on() {
            tracing::warn!(
                "authentication is off: every REST and gRPC Jobs caller is an anonymous admin; configure `auth` \
                 (docs/security.md#users-authentication-authorization-and-secret-values)"
            );
        }
        let scrape_access = crate::metrics::ScrapeAccess::load(&config.metrics, Arc::clone(&auth))?;
        Ok(Prepared { reloader, auth, scrape_access })
    }
}

/// Binds both listeners, runs `terms` (what steps the core: one term, or elections) and serves
/// the APIs on `handle` until `shutdown`.
pub(crate) async fn serve_with<T, F>(
    config: GatewayConfig,
    prepared: Prepared,
    handle: Handle,
    terms: T,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(BoundAddrs, Handle),
) -> Result<(), ServeError>
where
    T: FnOnce(Handle, BoundAddrs, watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let Prepared { reloader, auth, scrape_access } = prepared;
    let limits = config.tls.as_ref().map(crate::tls::TlsConfig::limits).unwrap_or_default();
    let rest_listener = tokio::net::TcpListener::bind(config.listen).await?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen).await?;
    let addrs = BoundAddrs { rest: rest_listener.local_addr()?, grpc: grpc_listener.local_addr()? };

    let (stop_tx, stop_rx) = watch::channel(false);
    let terms = tokio::spawn(terms(handle.clone(), addrs, stop_rx.clone()));
    on_bound(addrs, handle.clone());
    tracing::info!(rest = %addrs.rest, grpc = %addrs.grpc, "gateway listening");
    let metrics = Arc::new(crate::metrics::Metrics::new(handle.clone(), scrape_access));
    tracing::info!(access = ?metrics.access(), "metrics at /metrics");
    let metrics_routes = metrics.router();
    let auth_files = tokio::spawn(Arc::clone(&auth).watch_files(stop_rx.clone()));
    let services = crate::api::Services {
        handle: handle.clone(),
        catalog: config.gpu_catalog(),
        submit_rate: Arc::new(crate::api::SubmitRate::from_config(&config)),
        auth,
    };
    let configs = reloader.as_ref().map(crate::tls::Reloader::subscribe);
    let rest = match &configs {
        Some(configs) => tokio::spawn(crate::api::serve_rest(
            services.clone(),
            rest_listener,
            TlsHandshake::new(configs.clone(), Listener::Rest),
            config.limits.clone(),
            metrics_routes.clone(),
            stop_rx.clone(),
        )),
        None => tokio::spawn(crate::api::serve_rest(
            services.clone(),
            rest_listener,
            Plain,
            config.limits.clone(),
            metrics_routes.clone(),
            stop_rx.clone(),
        )),
    };
    let grpc = tokio::spawn(crate::api::serve_grpc(services, grpc_listener, configs, limits, stop_rx.clone()));
    let reload = reloader.map(|reloader| tokio::spawn(reloader.run(stop_rx.clone())));
    shutdown.await;
    tracing::info!("gateway shutting down");
    handle.close();
    let _ = stop_tx.send(true);
    let (rest, grpc, _) = tokio::join!(rest, grpc, auth_files);
    if let Some(reload) = reload {
        let _ = reload.await;
    }
    if let Err(e) = terms.await {
        tracing::error!(error = %e, "the runtime task ended abnormally");
    }
    rest.map_err(std::io::Error::other)??;
    grpc.map_err(std::io::Error::other)??;
    Ok(())
}
