//! One HTTP/1.1 exchange over a fresh connection, answering the status and the headers that the
//! HA tests judge (`Retry-After`, `meridian-leader`), which the CLI's client does not return,
//! and telling a connection that was refused from one that broke after the request went out.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the gateway answered.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The headers, names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding removed).
    pub body: Vec<u8>,
}

impl Answer {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The API's error code (`not_leader`, `unavailable`...) of an error answer.
    pub fn code(&self) -> Option<String> {
        self.json()["error"]["code"].as_str().map(str::to_string)
    }
}

/// Why no answer came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No connection could be made (nothing listens: a killed or restarting gateway). Nothing
    /// was sent.
    Refused(String),
    /// The connection broke before a whole answer came; the request may have been acted on.
    Broken(String),
    /// No whole answer within the time limit; the request may have been acted on.
    Timeout,
}

impl Failure {
    /// A short name for counting: `refused`, `broken` or `timeout`.
    pub fn class(&self) -> &'static str {
        match self {
            Failure::Refused(_) => "refused",
            Failure::Broken(_) => "broken",
            Failure::Timeout => "timeout",
        }
    }
}

/// Sends `method path` with an optional `(content type, body)` to `addr` and reads the whole
/// answer, within `timeout`.
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
    timeout: Duration,
) -> Result<Answer, Failure> {
    match tokio::time::timeout(timeout, exchange_unbounded(addr, method, path, body)).await {
        Ok(result) => result,
        Err(_) => Err(Failure::Timeout),
    }
}

async fn exchange_unbounded(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
) -> Result<Answer, Failure> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| Failure::Refused(format!("connecting to {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n");
    let payload = match body {
        Some((content_type, bytes)) => {
            request.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n", bytes.len()));
            bytes
        }
        None => &[][..],
    };
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(payload);
    stream.write_all(&bytes).await.map_err(|e| Failure::Broken(format!("sending to {addr}: {e}")))?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.map_err(|e| Failure::Broken(format!("reading from {addr}: {e}")))?;
    parse(&raw).map_err(|reason| Failure::Broken(format!("answer from {addr}: {reason}")))
}

/// Reads an HTTP/1.1 answer that ends with the connection.
fn parse(raw: &[u8]) -> Result<Answer, String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no complete head")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|e| format!("head is not UTF-8: {e}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or("empty head")?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("bad status line `{status_line}`"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
    let body = if chunked { dechunk(rest)? } else { rest.to_vec() };
    if let Some(length) = headers.iter().find(|(name, _)| name == "content-length") {
        let expected: usize = length.1.parse().map_err(|e| format!("content-length `{}`: {e}", length.1))?;
        if body.len() < expected {
            return Err(format!("body cut short: {} of {expected} bytes", body.len()));
        }
    }
    Ok(Answer { status, headers, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").ok_or("chunk size line cut short")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or_default().trim(), 16)
            .map_err(|e| format!("chunk size `{size_text}`: {e}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size + 2 {
            return Err("chunk cut short".into());
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn an_answer_with_a_length_reads_with_its_headers() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nmeridian-leader: http://a:1\r\n\
                    content-length: 31\r\n\r\n{\"error\":{\"code\":\"not_leader\"}}";
        let answer = parse(raw).unwrap();
        assert_eq!(answer.status, 503);
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(answer.header("meridian-leader"), Some("http://a:1"));
        assert_eq!(answer.code().as_deref(), Some("not_leader"));
    }

    #[test]
    fn a_chunked_answer_is_joined_and_a_short_one_is_broken() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse(raw).unwrap().json()["a"], 1);
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}").unwrap_err().contains("cut short"));
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
    }
}
