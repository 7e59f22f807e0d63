//! The gateway's APIs: REST/JSON (axum) and gRPC (tonic: users' `Jobs`, agents' `Federation`),
//! thin adapters over the runtime's [`Handle`]. Wire ↔ domain conversion and the mapping of
//! errors to statuses ([`error`]) live here and nowhere else.

pub mod console;
pub mod error;
pub mod events;
pub mod grpc;
pub mod guard;
pub mod limits;
pub mod listener;
pub mod openapi;
pub mod query;
pub mod quota;
pub mod rate;
pub mod redact;
pub mod rest;

use std::sync::Arc;

use meridian_proto::gpu::GpuCatalog;
use meridian_proto::pb;
use tokio::sync::watch;

use crate::tls::conn::{self, Plain};
use crate::tls::{ConnLimits, Listener, ServerConfigs, TlsHandshake};

pub use error::ApiError;
pub use quota::SubmitRate;

use crate::auth::Authenticator;
use crate::runtime::Handle;

/// What both APIs serve from: the runtime, the GPU catalog specs are checked against, the
/// per-tenant submit rates and the authenticator of callers.
#[derive(Clone)]
pub struct Services {
    /// The runtime.
    pub handle: Handle,
    /// GPU types specs may name.
    pub catalog: GpuCatalog,
    /// Per-tenant submit rates.
    pub submit_rate: Arc<SubmitRate>,
    /// Who callers are.
    pub auth: Arc<Authenticator>,
}

/// Serves the REST API on `listener` until `shutdown` flips, each connection through
/// `handshake`, under the connection caps, timeouts and request rate of `limits`. `extra`
/// holds routes served beside the API (`/metrics`), behind the same guard.
pub async fn serve_rest<H: conn::Handshake>(
    services: Services,
    listener: tokio::net::TcpListener,
    handshake: H,
    limits: limits::LimitsConfig,
    extra: axum::Router,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Services { handle, catalog, submit_rate, auth } = services;
    let router = rest::router(rest::RestState { handle, catalog, submit_rate, auth }).merge(extra);
    let tracker = limits::ConnectionTracker::new(&limits);
    listener::serve(listener, handshake, router, &limits, tracker, shutdown).await
}

/// Serves the gRPC services until `shutdown` flips. With `tls`, the agents' stream requires a
/// client certificate naming the cluster; without, anyone may attach (`insecure: true`).
pub async fn serve_grpc(
    services: Services,
    listener: tokio::net::TcpListener,
    tls: Option<watch::Receiver<Arc<ServerConfigs>>>,
    limits: ConnLimits,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Services { handle, catalog, submit_rate, auth } = services;
    let mut stop = shutdown.clone();
    let router = tonic::transport::Server::builder()
        .add_service(pb::federation_server::FederationServer::new(grpc::FederationApi {
            handle: handle.clone(),
            shutdown: shutdown.clone(),
            require_certificate: tls.is_some(),
        }))
        .add_service(pb::jobs_server::JobsServer::new(grpc::JobsApi { handle, catalog, submit_rate, auth }));
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    match tls {
        Some(configs) => {
            let handshake = TlsHandshake::new(configs, Listener::Grpc);
            router
                .serve_with_incoming_shutdown(crate::tls::incoming(listener, handshake, limits, shutdown), stopped)
                .await
        }
        None => {
            router.serve_with_incoming_shutdown(crate::tls::incoming(listener, Plain, limits, shutdown), stopped).await
        }
    }
    .map_err(std::io::Error::other)
}
