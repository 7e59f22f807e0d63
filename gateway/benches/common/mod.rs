//! What the bench binaries share: how long to run, the gateway config a bench needs, a
//! keep-alive HTTP/1.1 connection and latency quantiles.
//!
//! Each bench binary `#[allow(dead_code)]`s this module: not every bench uses every part.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use meridian_gateway::api::limits::LimitsConfig;
use meridian_gateway::config::GatewayConfig;

/// Errors of the bench binaries.
pub(crate) type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Whether this run is the short pass. `cargo bench` passes `--bench` and gets the full run;
/// `cargo test --bench '*'` (which `scripts/test.sh` runs, like criterion's test mode) passes no
/// such flag, and then every bench makes one short pass at small sizes, so a bench that no longer
/// runs fails the test suite instead of rotting unnoticed.
pub(crate) fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// Prints which pass this is, so a reader of a quick pass's figures knows they are no result.
pub(crate) fn announce(quick: bool) {
    if quick {
        println!("(short pass: `cargo bench` runs the full bench; these figures are no result)\n");
    }
}

/// A gateway config for benches: loopback on ports 0, and REST limits no single address reaches.
/// Every bench client connects from 127.0.0.1, so the per-address defaults (512 connections,
/// 200 requests/s) would throttle the load the bench means to measure with `429`s.
pub(crate) fn bench_config() -> GatewayConfig {
    let max_connections = 8192;
    GatewayConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        grpc_listen: ([127, 0, 0, 1], 0).into(),
        limits: LimitsConfig {
            max_connections,
            max_connections_per_client: max_connections,
            requests_per_second: 1e9,
            request_burst: u32::MAX,
            ..LimitsConfig::default()
        },
        ..GatewayConfig::default()
    }
}

/// Milliseconds.
pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile of sorted samples (zero with none).
pub(crate) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One HTTP/1.1 keep-alive connection to the gateway's REST API.
pub(crate) struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    _driver: tokio::task::JoinHandle<()>,
}

impl Conn {
    /// Connects.
    pub(crate) async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, _driver: driver })
    }

    /// One request; returns the status and the whole body.
    pub(crate) async fn send(&mut self, method: Method, path: &str, body: Option<&str>) -> Result<(StatusCode, Bytes)> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "bench")
            .header(hyper::header::CONTENT_TYPE, "application/yaml")
            .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// `clients` keep-alive connections each submitting `spec` in a loop for `run`; returns the count
/// and every latency. Any answer but `201` ends the run with an error.
pub(crate) async fn submit_load(
    rest: SocketAddr,
    clients: usize,
    run: Duration,
    spec: &'static str,
) -> Result<(usize, Vec<Duration>)> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(rest).await?;
            let mut latencies = Vec::new();
            let started = std::time::Instant::now();
            while started.elapsed() < run {
                let at = std::time::Instant::now();
                let (status, _) = conn.send(Method::POST, "/v1/jobs", Some(spec)).await?;
                if status != StatusCode::CREATED {
                    return Err::<_, Box<dyn std::error::Error + Send + Sync>>(
                        format!("submit answered {status}").into(),
                    );
                }
                latencies.push(at.elapsed());
            }
            Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok((all.len(), all))
}
