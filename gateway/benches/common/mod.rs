//! What the bench binaries share: a keep-alive HTTP/1.1 connection and latency quantiles.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

/// Errors of the bench binaries.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile of sorted samples (zero with none).
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One HTTP/1.1 keep-alive connection to the gateway's REST API.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    _driver: tokio::task::JoinHandle<()>,
}

impl Conn {
    /// Connects.
    pub async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, _driver: driver })
    }

    /// One request; returns the status and the whole body.
    pub async fn send(&mut self, method: Method, path: &str, body: Option<&str>) -> Result<(StatusCode, Bytes)> {
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
