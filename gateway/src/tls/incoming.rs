//! Accepting connections for a listener: each handshake runs on its own task under a timeout,
//! so a client that stalls mid-handshake holds only its own connection, and a cap on open
//! connections keeps a flood from exhausting file descriptors. Finished handshakes come out as
//! a stream, which tonic serves from (and the REST loop reads).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use super::conn::Handshake;

/// Limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// A handshake not finished by then drops the connection.
    pub handshake_timeout: Duration,
    /// Connections open at once (handshaking or served); more are closed at accept.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self { handshake_timeout: Duration::from_secs(10), max_connections: 4096 }
    }
}

/// A connection that counts against its listener's cap until it is dropped.
#[derive(Debug)]
pub struct Capped<Io> {
    io: Io,
    _permit: OwnedSemaphorePermit,
}

impl<Io> Capped<Io> {
    /// The connection inside.
    pub fn get_ref(&self) -> &Io {
        &self.io
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Capped<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Capped<Io> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<Io: Connected> Connected for Capped<Io> {
    type ConnectInfo = Io::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Connections that finished their handshake. Dropping it stops accepting and drops the
/// handshakes in progress.
pub struct Incoming<Io> {
    ready: mpsc::Receiver<Capped<Io>>,
    accept: JoinHandle<()>,
}

impl<Io> Stream for Incoming<Io> {
    type Item = std::io::Result<Capped<Io>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx).map(|ready| ready.map(Ok))
    }
}

impl<Io> Drop for Incoming<Io> {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Accepts on `listener` until `shutdown` flips, runs `handshake` on each connection under
/// `limits`, and yields the connections whose handshake succeeded.
pub fn incoming<H: Handshake>(
    listener: TcpListener,
    handshake: H,
    limits: ConnLimits,
    shutdown: watch::Receiver<bool>,
) -> Incoming<H::Io> {
    let (ready_tx, ready) = mpsc::channel(64);
    let accept = tokio::spawn(accept_loop(listener, handshake, limits, shutdown, ready_tx));
    Incoming { ready, accept }
}

async fn accept_loop<H: Handshake>(
    listener: TcpListener,
    handshake: H,
    limits: ConnLimits,
    mut shutdown: watch::Receiver<bool>,
    ready: mpsc::Sender<Capped<H::Io>>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let mut handshakes = JoinSet::new();
    let mut at_cap = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE and friends: back off a little instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = open.clone().try_acquire_owned() else {
                    if !at_cap {
                        tracing::warn!(max = limits.max_connections, "connection cap reached; closing new connections until some end");
                        at_cap = true;
                    }
                    drop(tcp);
                    continue;
                };
                at_cap = false;
                let _ = tcp.set_nodelay(true);
                let handshake = handshake.clone();
                let ready = ready.clone();
                handshakes.spawn(async move {
                    match tokio::time::timeout(limits.handshake_timeout, handshake.handshake(tcp)).await {
                        Ok(Ok(io)) => {
                            let _ = ready.send(Capped { io, _permit: permit }).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::info!(%peer, timeout = ?limits.handshake_timeout, "handshake timed out"),
                    }
                });
            }
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            () = ready.closed() => break,
            () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::conn::Plain;
    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;

    #[derive(Clone)]
    struct Stalls;

    impl Handshake for Stalls {
        type Io = tokio::net::TcpStream;
        async fn handshake(&self, tcp: tokio::net::TcpStream) -> std::io::Result<tokio::net::TcpStream> {
            std::future::pending::<()>().await;
            Ok(tcp)
        }
    }

    async fn listener() -> (TcpListener, std::net::SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_served_again_once_one_ends() {
        let (listener, addr) = listener().await;
        let (_stop, shutdown) = watch::channel(false);
        let limits = ConnLimits { max_connections: 2, ..Default::default() };
        let mut incoming = incoming(listener, Plain, limits, shutdown);
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let first = incoming.next().await.unwrap().unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        // The gateway closes it: the read ends (0 bytes or a reset), it does not hang.
        let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut byte)).await.unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        drop(first);
        let _c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let third = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await.unwrap();
        assert!(third.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_handshake_is_dropped_after_the_timeout_and_blocks_no_one() {
        let (listener, addr) = listener().await;
        let (_stop, shutdown) = watch::channel(false);
        let limits = ConnLimits { handshake_timeout: Duration::from_secs(10), max_connections: 1 };
        let _incoming = incoming(listener, Stalls, limits, shutdown);
        let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        // Auto-advancing paused time: the read returns once the 10 s timeout has dropped it.
        let started = tokio::time::Instant::now();
        let read = stalled.read(&mut byte).await;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(started.elapsed() >= Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
