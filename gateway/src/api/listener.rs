//! The REST accept loop: admits each connection against the caps, runs the handshake and HTTP/1.1
//! on the connection's own task under the header-read timeout, and drains on shutdown. Used
//! instead of `axum::serve`, which has no timeouts or caps.

use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use super::guard::{Access, Guard};
use super::limits::{Admission, ConnectionTracker, LimitsConfig, MAX_HEAD_BYTES, Slot};
use crate::tls::conn::Handshake;

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
        write_timeout: limits.write_timeout.0,
    };
    let mut connections = JoinSet::new();
    let mut refused: u64 = 0;
    let mut stop = shutdown.clone();
    // Admits one accepted connection and runs it on its own task until `until` flips.
    let mut spawn = |connections: &mut JoinSet<()>, tcp, peer: SocketAddr, until: watch::Receiver<bool>| {
        let (slot, access) = match tracker.admit(peer.ip()) {
            Admission::Serve(slot) => (slot, Access::Full),
            Admission::Reserve(slot, refusal) => (slot, Access::HealthOnly(refusal)),
            Admission::Refuse(refusal) => {
                refused += 1;
                // One line per power of two: a flood is visible without flooding the log.
                if refused.is_power_of_two() {
                    tracing::warn!(client = %peer, ?refusal, refused, counts = ?tracker.counts(), "REST connection refused at the cap");
                }
                return;
            }
        };
        let connection = Connection { tcp, peer, slot, access, settings, guard: guard.clone() };
        connections.spawn(connection.run(handshake.clone(), until));
    };
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
                spawn(&mut connections, tcp, peer, shutdown.clone());
            }
        }
    }
    // Connections the kernel completed but nobody accepted yet would be reset when the listener
    // closes, and their clients could not tell whether the request was acted on. Accept them,
    // answer each one request (the API answers 503 while shutting down), then close them.
    while let Ok(Ok((tcp, peer))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await {
        spawn(&mut connections, tcp, peer, shutdown.clone());
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// How long a connection that has not sent a request yet when the server shuts down (accepted
/// just before, or while draining) has to send one before it is closed: its client may have sent
/// it already, and closing an idle connection then would cut the request off unanswered.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

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
    write_timeout: Duration,
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
        // Flips when the first request's head has been read: from then on a shutdown lets hyper
        // finish what is in flight and close.
        let (asked, first_request) = watch::channel(false);
        let mut first_request_seen = first_request.clone();
        let service = service_fn(move |request| {
            let guard = guard.clone();
            asked.send_replace(true);
            async move { Ok::<_, std::convert::Infallible>(guard.handle(request, client, access).await) }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            // `max_buf_size` alone is not the head limit: hyper reads into all the capacity the
            // buffer happens to have, and a head that arrived in one read was served up to
            // 112 KiB. `max_header_size` counts the head itself, exactly.
            .max_header_size(MAX_HEAD_BYTES)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(!reserve);
        let io = WriteTimeout { io, limit: settings.write_timeout, stalled: None };
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let life = async {
            match end_of_life {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(life);
        // Shutting down: a connection that has served a request closes once the one in flight (if
        // any) is answered; one that has not gets `DRAIN_GRACE` for its first request.
        let (mut draining, mut closing) = (false, false);
        let grace = tokio::time::sleep(Duration::MAX);
        tokio::pin!(grace);
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
                    if *first_request.borrow() {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    } else {
                        grace.as_mut().reset(Instant::now() + DRAIN_GRACE);
                    }
                }
                _ = first_request_seen.wait_for(|asked| *asked), if draining && !closing => {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = &mut grace, if draining && !closing => {
                    closing = true;
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

/// Fails a write that makes no progress for `limit`, so that a client that does not read its
/// answers cannot hold a connection (hyper has no write timeout of its own).
struct WriteTimeout<Io> {
    io: Io,
    limit: Duration,
    /// Running while a write waits on the client.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<Io> WriteTimeout<Io> {
    /// Passes `result` through, timing a write that waits.
    fn timed<T>(&mut self, result: Poll<std::io::Result<T>>, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the client did not read its answer within limits.writeTimeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for WriteTimeout<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<Io> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.timed(result, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_flush(cx);
        self.timed(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.io).poll_shutdown(cx);
        self.timed(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.timed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use axum::routing::get;
    use meridian_proto::duration::HumanDuration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::api::limits::ConnectionCounts;
    use crate::tls::conn::Plain;

    /// Far above every timeout the tests set; only reached when a test fails.
    const DEADLINE: Duration = Duration::from_secs(20);

    /// A handshake that never finishes.
    #[derive(Clone)]
    struct Stalls;

    impl Handshake for Stalls {
        type Io = TcpStream;

        async fn handshake(&self, _tcp: TcpStream) -> std::io::Result<TcpStream> {
            std::future::pending().await
        }
    }

    struct Running {
        addr: SocketAddr,
        tracker: Arc<ConnectionTracker>,
        stop: watch::Sender<bool>,
        served: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    async fn start<H: Handshake>(handshake: H, limits: LimitsConfig) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tracker = ConnectionTracker::new(&limits);
        let (stop, stopped) = watch::channel(false);
        let router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/big", get(|| async { vec![b'x'; 64 << 20] }));
        let served = tokio::spawn({
            let tracker = Arc::clone(&tracker);
            async move { serve(listener, handshake, router, &limits, tracker, stopped).await }
        });
        Running { addr, tracker, stop, served }
    }

    async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
        let mut bytes = Vec::new();
        match tokio::time::timeout(DEADLINE, stream.read_to_end(&mut bytes)).await.expect("closed in time") {
            // Closing with unread bytes resets: still the server closing.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => bytes,
            result => {
                result.unwrap();
                bytes
            }
        }
    }

    async fn wait_for_counts(tracker: &ConnectionTracker, expected: ConnectionCounts) {
        let deadline = Instant::now() + DEADLINE;
        while tracker.counts() != expected {
            assert!(Instant::now() < deadline, "counts {:?}, expected {expected:?}", tracker.counts());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A request head of exactly `size` bytes (padded with one header).
    fn head_of(size: usize) -> Vec<u8> {
        let start = "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Pad: ";
        let end = "\r\n\r\n";
        let mut head = start.as_bytes().to_vec();
        head.resize(size - end.len(), b'p');
        head.extend_from_slice(end.as_bytes());
        head
    }

    /// The status line answered to a head of `size` bytes sent in `pieces` writes (a short pause
    /// between them, so that the server may read each on its own).
    async fn status_for_head(addr: SocketAddr, size: usize, pieces: usize) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = head_of(size);
        for piece in head.chunks(size.div_ceil(pieces)) {
            // The server may close early on an oversize head; the answer is what counts.
            if stream.write_all(piece).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let answer = read_to_close(&mut stream).await;
        String::from_utf8_lossy(&answer).lines().next().unwrap_or("(closed, no answer)").to_string()
    }

    #[tokio::test]
    async fn a_request_head_of_max_head_bytes_is_served_and_one_byte_more_gets_431() {
        let running = start(Plain, LimitsConfig::default()).await;
        for pieces in [1, 3] {
            let served = status_for_head(running.addr, MAX_HEAD_BYTES, pieces).await;
            assert_eq!(served, "HTTP/1.1 200 OK", "{pieces} piece(s)");
            // Before `max_header_size`, heads up to 112 KiB sent in one write were served.
            for size in [MAX_HEAD_BYTES + 1, 112 * 1024] {
                let refused = status_for_head(running.addr, size, pieces).await;
                assert_eq!(refused, "HTTP/1.1 431 Request Header Fields Too Large", "{size} bytes, {pieces} piece(s)");
            }
        }
        running.stop.send(true).unwrap();
        tokio::time::timeout(DEADLINE, running.served).await.unwrap().unwrap().unwrap();
    }

    /// The largest head served, found by bisection: `cargo test -p meridian-gateway --lib --
    /// --ignored --nocapture measure_the_largest_request_head`. Prints 65536 (64 KiB); before
    /// `max_header_size` was set it printed 114688 (112 KiB).
    #[tokio::test]
    #[ignore = "a measurement, not a check"]
    async fn measure_the_largest_request_head_served() {
        let running = start(Plain, LimitsConfig::default()).await;
        let (mut served, mut refused) = (1024, 1024 * 1024);
        while refused - served > 1 {
            let size = (served + refused) / 2;
            if status_for_head(running.addr, size, 1).await.contains(" 200 ") {
                served = size;
            } else {
                refused = size;
            }
        }
        println!("largest request head served: {served} bytes");
    }

    #[tokio::test]
    async fn shutdown_closes_idle_kept_alive_connections_and_returns() {
        let running = start(Plain, LimitsConfig::default()).await;
        let mut kept = TcpStream::connect(running.addr).await.unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
        let mut answer = [0u8; 256];
        let n = tokio::time::timeout(DEADLINE, kept.read(&mut answer)).await.unwrap().unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
        wait_for_counts(&running.tracker, ConnectionCounts { served: 1, reserve: 0 }).await;

        running.stop.send(true).unwrap();
        assert!(read_to_close(&mut kept).await.is_empty());
        tokio::time::timeout(DEADLINE, running.served).await.expect("serve returned in time").unwrap().unwrap();
        assert_eq!(running.tracker.counts(), ConnectionCounts::default());
    }

    #[tokio::test]
    async fn a_connection_accepted_before_shutdown_still_gets_its_first_request_answered() {
        // A client connects, the server accepts it, and the server begins to shut down before
        // the client's request arrives: as when a graceful restart starts between a client's
        // connect and its write. Closing the idle connection then would cut the request off.
        let running = start(Plain, LimitsConfig::default()).await;
        let mut late = TcpStream::connect(running.addr).await.unwrap();
        wait_for_counts(&running.tracker, ConnectionCounts { served: 1, reserve: 0 }).await;
        running.stop.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        late.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await.unwrap();
        let answer = read_to_close(&mut late).await;
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        tokio::time::timeout(DEADLINE, running.served).await.expect("serve returned in time").unwrap().unwrap();
        assert_eq!(running.tracker.counts(), ConnectionCounts::default());
    }

    #[tokio::test]
    async fn connections_waiting_to_be_accepted_at_shutdown_get_an_answer_not_a_reset() {
        // Three clients connect and send their request before the loop runs, and the loop is told
        // to stop before it accepts anything: they wait in the kernel's queue, as a client that
        // connects just as a gateway begins a graceful restart does.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await.unwrap();
            clients.push(client);
        }
        let limits = LimitsConfig::default();
        let tracker = ConnectionTracker::new(&limits);
        let (_stop, stopped) = watch::channel(true);
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        let served = tokio::spawn(async move { serve(listener, Plain, router, &limits, tracker, stopped).await });
        for client in &mut clients {
            let answer = read_to_close(client).await;
            assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        }
        tokio::time::timeout(DEADLINE, served).await.expect("serve returned in time").unwrap().unwrap();
        // Nothing listens any more.
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_stalled_handshake_is_closed_at_the_header_timeout_and_its_slot_freed() {
        let limits =
            LimitsConfig { header_read_timeout: HumanDuration(Duration::from_millis(200)), ..LimitsConfig::default() };
        let running = start(Stalls, limits).await;
        let mut stalled = TcpStream::connect(running.addr).await.unwrap();
        stalled.write_all(b"\x16\x03\x01").await.unwrap();
        let started = Instant::now();
        assert!(read_to_close(&mut stalled).await.is_empty());
        assert!(started.elapsed() >= Duration::from_millis(150), "closed after {:?}", started.elapsed());
        wait_for_counts(&running.tracker, ConnectionCounts::default()).await;
        running.stop.send(true).unwrap();
        tokio::time::timeout(DEADLINE, running.served).await.unwrap().unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_answer_is_cut_off_at_the_write_timeout() {
        let limits =
            LimitsConfig { write_timeout: HumanDuration(Duration::from_millis(300)), ..LimitsConfig::default() };
        let running = start(Plain, limits).await;
        let mut reader_that_stops = TcpStream::connect(running.addr).await.unwrap();
        reader_that_stops.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
        wait_for_counts(&running.tracker, ConnectionCounts { served: 1, reserve: 0 }).await;
        // 64 MiB do not fit in the socket buffers: the write stalls, and the connection goes.
        wait_for_counts(&running.tracker, ConnectionCounts::default()).await;
        running.stop.send(true).unwrap();
        tokio::time::timeout(DEADLINE, running.served).await.unwrap().unwrap().unwrap();
    }
}
