//! The REST accept loop: admits each connection against the caps, runs the handshake and HTTP/1.1
//! on the connection's own task under the header-read timeout, and drains on shutdown. Used
//! instead of `axum::serve`, which has no timeouts or caps.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conn::Handshake;
use super::guard::{Access, Guard};
use super::limits::{Admission, ConnectionTracker, LimitsConfig, MAX_HEAD_BYTES, Slot};

/// Pause after an accept error that is not the client's fault (out of file descriptors), so
/// that the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` with `limits`, each connection through `handshake`, until
/// `shutdown` flips; then stops accepting, lets requests in flight finish (each bounded by the
/// timeouts) and returns.
pub async fn serve<H: Handshake>(
    listener: TcpListener,
    handshake: H,
    router: Router,
    limits: &LimitsConfig,
    tracker: Arc<ConnectionTracker>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    warn_if_short_of_descriptors(limits);
    let guard = Guard::new(router, limits);
    let settings = ConnectionSettings {
        header_read_timeout: limits.header_read_timeout.0,
        reserve_timeout: limits.reserve_timeout.0,
    };
    let mut connections = JoinSet::new();
    let mut refused: u64 = 0;
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) if is_per_connection(&error) => continue,
                    Err(error) => {
                        tracing::warn!(%error, open = connections.len(), "REST accept failed; backing off");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let (slot, access) = match tracker.admit(peer.ip()) {
                    Admission::Serve(slot) => (slot, Access::Full),
                    Admission::Reserve(slot, refusal) => (slot, Access::HealthOnly(refusal)),
                    Admission::Refuse(refusal) => {
                        refused += 1;
                        // One line per power of two: a flood is visible without flooding the log.
                        if refused.is_power_of_two() {
                            tracing::warn!(client = %peer, ?refusal, refused, counts = ?tracker.counts(), "REST connection refused at the cap");
                        }
                        continue;
                    }
                };
                let connection = Connection { tcp, peer, slot, access, settings, guard: guard.clone() };
                connections.spawn(connection.run(handshake.clone(), shutdown.clone()));
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Descriptors kept for everything that is not a REST connection: the gRPC port and its agents,
/// the store, logs.
const OTHER_DESCRIPTORS: u64 = 256;

/// Warns when the caps could run the process out of file descriptors before they apply: then
/// accepts fail and `/healthz` and agents go unanswered, which the caps exist to prevent.
fn warn_if_short_of_descriptors(limits: &LimitsConfig) {
    let needed = (limits.max_connections + limits.reserve_connections) as u64 + OTHER_DESCRIPTORS;
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    if let Some(open_files) = open_files
        && open_files < needed
    {
        tracing::warn!(
            open_files,
            needed,
            "limits.maxConnections + limits.reserveConnections leave too few file descriptors under the \
             open-file limit (ulimit -n); lower limits.maxConnections or raise the limit"
        );
    }
}

/// Resolves once `shutdown` flips (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Accept errors that concern one connection (it was reset before it was accepted); the
/// listener is fine.
fn is_per_connection(error: &std::io::Error) -> bool {
    matches!(error.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset)
}

#[derive(Debug, Clone, Copy)]
struct ConnectionSettings {
    header_read_timeout: Duration,
    reserve_timeout: Duration,
}

/// One accepted connection and what it may do.
struct Connection {
    tcp: TcpStream,
    peer: SocketAddr,
    /// Held for the connection's life; dropping it frees its place under the caps.
    slot: Slot,
    access: Access,
    settings: ConnectionSettings,
    guard: Guard,
}

impl Connection {
    async fn run<H: Handshake>(self, handshake: H, mut shutdown: watch::Receiver<bool>) {
        let Connection { tcp, peer, slot, access, settings, guard } = self;
        let _slot = slot;
        let reserve = access != Access::Full;
        // A reserve connection lives for one short request; a slow client cannot keep it.
        let end_of_life = reserve.then(|| Instant::now() + settings.reserve_timeout);
        let header_read_timeout = if reserve {
            settings.header_read_timeout.min(settings.reserve_timeout)
        } else {
            settings.header_read_timeout
        };
        let _ = tcp.set_nodelay(true);
        let io = match tokio::time::timeout(header_read_timeout, handshake.handshake(tcp)).await {
            Ok(Ok(io)) => io,
            Ok(Err(error)) => {
                tracing::debug!(client = %peer, %error, "REST handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(client = %peer, "REST handshake timed out");
                return;
            }
        };
        let client = peer.ip();
        let service = service_fn(move |request| {
            let guard = guard.clone();
            async move { Ok::<_, std::convert::Infallible>(guard.handle(request, client, access).await) }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(!reserve);
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let life = async {
            match end_of_life {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(life);
        let mut draining = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(client = %peer, %error, "REST connection ended with an error");
                    }
                    return;
                }
                () = stopped(&mut shutdown), if !draining => {
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = &mut life => {
                    tracing::debug!(client = %peer, "reserve connection outlived limits.reserveTimeout; closed");
                    return;
                }
            }
        }
    }
}
