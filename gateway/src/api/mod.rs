//! The gateway's APIs: REST/JSON (axum) and gRPC (tonic: users' `Jobs`, agents' `Federation`),
//! thin adapters over the runtime's [`Handle`]. Wire ↔ domain conversion and the mapping of
//! errors to statuses ([`error`]) live here and nowhere else.

pub mod conn;
pub mod error;
pub mod grpc;
pub mod rate;
pub mod redact;
pub mod rest;

use std::sync::Arc;

use meridian_proto::gpu::GpuCatalog;
use meridian_proto::pb;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;

pub use error::ApiError;

use crate::auth::Authenticator;
use crate::runtime::Handle;

/// Serves the REST API on `listener` until `shutdown` flips.
pub async fn serve_rest(
    handle: Handle,
    catalog: GpuCatalog,
    auth: Arc<Authenticator>,
    listener: tokio::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, rest::router(rest::RestState { handle, catalog, auth }))
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}

/// Serves the gRPC services until `shutdown` flips.
pub async fn serve_grpc(
    handle: Handle,
    catalog: GpuCatalog,
    auth: Arc<Authenticator>,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut stop = shutdown.clone();
    tonic::transport::Server::builder()
        .add_service(pb::federation_server::FederationServer::new(grpc::FederationApi {
            handle: handle.clone(),
            shutdown,
        }))
        .add_service(pb::jobs_server::JobsServer::new(grpc::JobsApi { handle, catalog, auth }))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .map_err(std::io::Error::other)
}
