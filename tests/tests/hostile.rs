//! Hostile REST clients against the real gateway binary, with small caps and timeouts in its
//! config: slow clients are cut off while others are served, the connection caps keep `/healthz`
//! answering, the rate limit answers 429, every error answer is the JSON error body, and a request
//! head over 64 KiB gets hyper's 431.
//! Raw TCP, so that a test can send exactly the bytes (and the silences) a hostile client would.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use meridian_e2e::{GATEWAY_CONFIG, Gateway, poll};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

const GOOD: &str = "name: ok\ntenant: t\ngang: {replicas: 1, resources: {gpus: 4, cpu: 4, memoryGiB: 16}}\n\
                    payload: {command: [python, train.py]}\n";

/// Longest any single exchange may take before the test fails (far above every timeout set).
const DEADLINE: Duration = Duration::from_secs(45);

/// One HTTP answer read off a raw connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Asserts the documented JSON error body with `status` and `code`; returns the body.
    fn json_error(&self, status: u16, code: &str, what: &str) -> Value {
        assert_eq!(self.status, status, "{what}: {self:?}");
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(content_type.starts_with("application/json"), "{what}: content-type {content_type:?}");
        let body: Value = serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{what}: {e}: {:?}", self.body));
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
        assert!(body["error"]["fields"].is_array(), "{what}: {body}");
        body
    }

    fn fields(body: &Value) -> Vec<String> {
        body["error"]["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap().to_string()).collect()
    }
}

/// A connection to `to` from the loopback address `from` (127.0.0.0/8 all reach loopback, so
/// tests can play several clients).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::from(from), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

async fn connect(to: SocketAddr) -> TcpStream {
    connect_from([127, 0, 0, 1], to).await
}

/// A request with `Connection: close`, so the answer ends with the connection.
fn request(method: &str, target: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut text = format!("{method} {target} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        text.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    text.push_str("\r\n");
    text.push_str(body);
    text
}

/// Reads until the server closes the connection (or `DEADLINE`); returns what arrived.
async fn read_to_close(stream: &mut TcpStream) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await {
            Err(_) => {
                bail!("the connection was not closed within {DEADLINE:?}; got {}", String::from_utf8_lossy(&bytes))
            }
            Ok(Ok(0)) => return Ok(bytes),
            Ok(Ok(n)) => bytes.extend_from_slice(&buf[..n]),
            // A reset after the answer is still the server closing.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(bytes),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

fn parse(bytes: &[u8]) -> Result<Answer> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("no HTTP answer in {text:?}"))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).context(status_line.to_string())?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Answer { status, headers, body: body.to_string() })
}

/// Sends `raw` on `stream` and reads the answer up to the close.
async fn exchange(stream: &mut TcpStream, raw: &str) -> Result<Answer> {
    stream.write_all(raw.as_bytes()).await?;
    parse(&read_to_close(stream).await?)
}

/// One request on a fresh connection from `from`.
async fn send_from(from: [u8; 4], to: SocketAddr, raw: &str) -> Result<Answer> {
    exchange(&mut connect_from(from, to).await, raw).await
}

async fn send(to: SocketAddr, raw: &str) -> Result<Answer> {
    send_from([127, 0, 0, 1], to, raw).await
}

/// Whether the server still holds `stream` open with nothing sent on it.
fn still_open(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(stream.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

async fn gateway_with(dir: &std::path::Path, limits: &str) -> Gateway {
    Gateway::start(dir, &format!("{GATEWAY_CONFIG}limits: {limits}\n")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_header_slow_body_and_idle_clients_are_cut_off_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that the requests served meanwhile finish first even on a loaded machine.
    let timeout = Duration::from_secs(5);
    let gateway = gateway_with(dir.path(), "{headerReadTimeout: 5s, bodyReadTimeout: 5s}").await;

    let started = Instant::now();
    let mut slow_header = connect(gateway.rest).await;
    slow_header.write_all(b"GET /v1/jobs HTTP/1.1\r\nHost: gateway\r\nX-Slow: ").await.unwrap();
    let mut slow_body = connect(gateway.rest).await;
    let head =
        "POST /v1/jobs HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/yaml\r\nContent-Length: 4096\r\n\r\n";
    slow_body.write_all(format!("{head}name: half").as_bytes()).await.unwrap();
    // A kept-alive connection that goes quiet after one answer.
    let mut idle = connect(gateway.rest).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n").await.unwrap();
    let mut first = [0u8; 512];
    let n = tokio::time::timeout(DEADLINE, idle.read(&mut first)).await.unwrap().unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));

    // Meanwhile others are served, by REST and the CLI's client.
    for _ in 0..3 {
        let answer = send(gateway.rest, &request("GET", "/v1/jobs", &[], "")).await.unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    gateway.client().list(None, None, None).await.unwrap();
    assert!(
        still_open(&slow_header) && still_open(&slow_body) && still_open(&idle),
        "the slow clients were cut off before the others were served ({:?} in)",
        started.elapsed()
    );

    // The slow body gets the JSON 408, then the close; the slow head and the idle connection are
    // closed without an answer.
    let answer = parse(&read_to_close(&mut slow_body).await.unwrap()).unwrap();
    let body_held = started.elapsed();
    answer.json_error(408, "request_timeout", "slow body");
    let header_bytes = read_to_close(&mut slow_header).await.unwrap();
    let header_held = started.elapsed();
    assert!(header_bytes.is_empty(), "{}", String::from_utf8_lossy(&header_bytes));
    let idle_bytes = read_to_close(&mut idle).await.unwrap();
    assert!(idle_bytes.is_empty(), "{}", String::from_utf8_lossy(&idle_bytes));
    // Not before the timeout.
    assert!(body_held >= timeout && header_held >= timeout, "body {body_held:?}, header {header_held:?}");
    eprintln!("slow body held {body_held:?}, slow header held {header_held:?} (timeouts {timeout:?})");

    // And the gateway serves as before.
    let answer = send(gateway.rest, &request("GET", "/healthz", &[], "")).await.unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_total_cap_healthz_answers_a_submit_gets_503_and_is_served_once_a_slot_frees() {
    let dir = tempfile::tempdir().unwrap();
    let limits = "{maxConnections: 4, maxConnectionsPerClient: 4, reserveConnections: 16, headerReadTimeout: 60s}";
    let gateway = gateway_with(dir.path(), limits).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(gateway.rest).await);
    }
    // The held connections are accepted in order; once they are, a fifth is refused.
    let submit = request("POST", "/v1/jobs", &[("Content-Type", "application/yaml")], GOOD);
    let full = poll(DEADLINE, || async {
        let answer = send(gateway.rest, &submit).await.ok()?;
        (answer.status == 503).then_some(answer)
    })
    .await
    .unwrap();
    let body = full.json_error(503, "unavailable", "submit at the cap");
    assert!(body["error"]["message"].as_str().unwrap().contains("maxConnections"), "{body}");
    assert_eq!(full.header("connection"), Some("close"));

    for _ in 0..3 {
        let answer = send(gateway.rest, &request("GET", "/healthz", &[], "")).await.unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (200, "ok"), "{answer:?}");
    }
    let list = send(gateway.rest, &request("GET", "/v1/jobs", &[], "")).await.unwrap();
    list.json_error(503, "unavailable", "list at the cap");

    // One held connection goes away: its slot serves the submit.
    drop(held.pop());
    let served = poll(DEADLINE, || async {
        let answer = send(gateway.rest, &submit).await.ok()?;
        (answer.status != 503).then_some(answer)
    })
    .await
    .unwrap();
    assert!(served.status == 201 || served.status == 422, "{served:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_over_its_own_cap_gets_429_and_is_closed_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let gateway =
        gateway_with(dir.path(), "{maxConnections: 100, maxConnectionsPerClient: 2, headerReadTimeout: 60s}").await;
    let _held = [connect(gateway.rest).await, connect(gateway.rest).await];
    let list = request("GET", "/v1/jobs", &[], "");
    let refused = poll(DEADLINE, || async {
        let answer = send(gateway.rest, &list).await.ok()?;
        (answer.status == 429).then_some(answer)
    })
    .await
    .unwrap();
    let body = refused.json_error(429, "rate_limited", "over the client cap");
    assert!(body["error"]["message"].as_str().unwrap().contains("maxConnectionsPerClient"), "{body}");
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(refused.header("retry-after").is_some(), "{refused:?}");

    // Another address is served.
    let other = send_from([127, 0, 0, 2], gateway.rest, &list).await.unwrap();
    assert_eq!(other.status, 200, "{other:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rate_limit_answers_429_with_retry_after_and_spares_healthz_and_others() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = gateway_with(dir.path(), "{requestsPerSecond: 0.2, requestBurst: 3}").await;
    let list = request("GET", "/v1/jobs", &[], "");
    for i in 0..3 {
        let answer = send(gateway.rest, &list).await.unwrap();
        assert_eq!(answer.status, 200, "request {i} of the burst: {answer:?}");
    }
    let limited = send(gateway.rest, &list).await.unwrap();
    limited.json_error(429, "rate_limited", "over the rate");
    let retry_after: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry_after), "Retry-After {retry_after}");

    let health = send(gateway.rest, &request("GET", "/healthz", &[], "")).await.unwrap();
    assert_eq!(health.status, 200, "{health:?}");
    let other = send_from([127, 0, 0, 3], gateway.rest, &list).await.unwrap();
    assert_eq!(other.status, 200, "{other:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_answer_is_the_json_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let long_query = format!("/v1/jobs?selector={}", "x".repeat(9 * 1024));
    let yaml = [("Content-Type", "application/yaml")];
    let cases: Vec<(&str, String, u16, &str, Option<&str>)> = vec![
        ("PATCH /v1/jobs", request("PATCH", "/v1/jobs", &[], ""), 405, "method_not_allowed", None),
        ("DELETE /v1/clusters", request("DELETE", "/v1/clusters", &[], ""), 405, "method_not_allowed", None),
        ("a 9 KiB query", request("GET", &long_query, &[], ""), 414, "uri_too_long", Some("uri")),
        (
            "a text/plain spec",
            request("POST", "/v1/jobs", &[("Content-Type", "text/plain")], GOOD),
            415,
            "unsupported_media_type",
            Some("Content-Type"),
        ),
        (
            "a form-encoded spec (curl -d)",
            request("POST", "/v1/jobs", &[("Content-Type", "application/x-www-form-urlencoded")], GOOD),
            415,
            "unsupported_media_type",
            Some("Content-Type"),
        ),
        (
            "JSON with a charset",
            request("POST", "/v1/jobs", &[("Content-Type", "application/json; charset=utf-8")], "{"),
            422,
            "invalid_spec",
            Some("spec"),
        ),
        ("%ff in the path", request("GET", "/v1/jobs/%ff", &[], ""), 400, "bad_request", Some("path")),
        ("%ff in the query", request("GET", "/v1/jobs?tenant=%ff", &[], ""), 400, "bad_request", Some("tenant")),
        (
            "%zz in a logs query",
            request("GET", "/v1/jobs/j-1/logs?from=%zz", &[], ""),
            400,
            "bad_request",
            Some("from"),
        ),
        (
            "a repeated parameter",
            request("GET", "/v1/jobs?state=Queued&state=Running", &[], ""),
            400,
            "bad_request",
            Some("state"),
        ),
        (
            "a body over the limit (declared)",
            request("POST", "/v1/jobs", &[("Content-Type", "application/yaml"), ("Content-Length", "100000000")], "")
                .replacen("Content-Length: 0\r\n", "", 1),
            413,
            "too_large",
            Some("body"),
        ),
        (
            "a spec over the limit",
            request("POST", "/v1/jobs", &yaml, &format!("{GOOD}# {}\n", "x".repeat(300 * 1024))),
            413,
            "too_large",
            Some("spec"),
        ),
        ("an unknown route", request("GET", "/nope", &[], ""), 404, "not_found", None),
        ("an unknown job", request("GET", "/v1/jobs/j-missing", &[], ""), 404, "not_found", None),
    ];
    for (what, raw, status, code, field) in cases {
        let answer = send(gateway.rest, &raw).await.unwrap_or_else(|e| panic!("{what}: {e}"));
        let body = answer.json_error(status, code, what);
        if let Some(field) = field {
            assert!(Answer::fields(&body).iter().any(|f| f == field), "{what}: no field {field} in {body}");
        }
        if status == 405 {
            assert!(answer.header("allow").is_some_and(|allow| allow.contains("GET")), "{what}: {answer:?}");
        }
    }

    // A spec sent without a Content-Type is still sniffed; YAML types with parameters pass.
    for headers in [vec![], vec![("Content-Type", "text/yaml; charset=utf-8")]] {
        let answer = send(gateway.rest, &request("POST", "/v1/jobs", &headers, GOOD)).await.unwrap();
        assert_ne!(answer.status, 415, "{headers:?}: {answer:?}");
        assert!(answer.status < 500, "{headers:?}: {answer:?}");
    }
    let answer = send(gateway.rest, &request("GET", "/healthz", &[], "")).await.unwrap();
    assert_eq!(answer.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_of_64_kib_is_served_and_a_larger_one_gets_431() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    // A head of exactly `size` bytes: `/healthz` with one padding header.
    let head = |size: usize| {
        let start = "GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\nX-Pad: ";
        format!("{start}{}\r\n\r\n", "p".repeat(size - start.len() - 4))
    };
    let answer = send(gateway.rest, &head(64 * 1024)).await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    // 112 KiB sent at once used to be served: hyper's read buffer is not the head limit.
    for size in [64 * 1024 + 1, 112 * 1024] {
        let mut stream = connect(gateway.rest).await;
        // The gateway may close before it has read everything; its answer is what counts.
        let _ = stream.write_all(head(size).as_bytes()).await;
        let answer = parse(&read_to_close(&mut stream).await.unwrap()).unwrap();
        assert_eq!(answer.status, 431, "{size} bytes: {answer:?}");
    }
    assert_eq!(send(gateway.rest, &request("GET", "/healthz", &[], "")).await.unwrap().status, 200);
}

/// Figures for `docs/security.md` (Hostile clients on the REST port), at the default limits:
/// `cargo test -p meridian-e2e --test hostile -- --ignored --nocapture measure`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: opens thousands of connections and waits out the default timeouts"]
async fn measure_connections_held_slow_client_time_and_healthz_latency_at_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let defaults = meridian_gateway::api::limits::LimitsConfig::default();
    let attempts = defaults.max_connections + defaults.reserve_connections + 500;

    // Idle connections (nothing sent), from several addresses so the per-client cap is not
    // what stops them.
    let opened_at = Instant::now();
    let mut idle = Vec::with_capacity(attempts);
    for i in 0..attempts {
        let from = [127, 0, 1, (i / defaults.max_connections_per_client) as u8 + 1];
        idle.push(connect_from(from, gateway.rest).await);
    }
    // Wait until the gateway has decided on every one of them: held ones stay open, refused ones
    // are closed at once.
    let mut closed = 0;
    poll(DEADLINE, || {
        closed = idle.iter().filter(|s| !still_open(s)).count();
        async move { (closed >= attempts - defaults.max_connections - defaults.reserve_connections).then_some(()) }
    })
    .await
    .unwrap();
    let held = attempts - closed;
    eprintln!(
        "opened {attempts} idle connections in {:?}: {held} held (maxConnections {} + reserve {}), {closed} closed",
        opened_at.elapsed(),
        defaults.max_connections,
        defaults.reserve_connections
    );

    // Healthz latency at the cap, once the reserve is free again (reserve connections live at
    // most reserveTimeout).
    let health = request("GET", "/healthz", &[], "");
    poll(DEADLINE, || async {
        send_from([127, 0, 2, 1], gateway.rest, &health).await.ok().filter(|a| a.status == 200)
    })
    .await
    .unwrap();
    let mut latencies = Vec::new();
    for i in 0..200u8 {
        let asked = Instant::now();
        let answer = send_from([127, 0, 2, i / 8 + 1], gateway.rest, &health).await.unwrap();
        latencies.push(asked.elapsed());
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    latencies.sort();
    eprintln!(
        "/healthz at the cap, 200 sequential requests, each on a new connection: p50 {:?}, p99 {:?}, max {:?}",
        latencies[100], latencies[198], latencies[199]
    );
    let submit = request("POST", "/v1/jobs", &[("Content-Type", "application/yaml")], GOOD);
    let answer = send_from([127, 0, 2, 9], gateway.rest, &submit).await.unwrap();
    eprintln!("a submit at the cap: {}", answer.status);

    // How long a held idle connection (the first one opened) is kept: until the header timeout.
    let mut first = idle.swap_remove(0);
    assert!(still_open(&first), "the first connection was not held");
    let bytes = read_to_close(&mut first).await.unwrap();
    eprintln!(
        "the first idle connection was closed {:?} after it was opened ({} bytes sent); headerReadTimeout {}",
        opened_at.elapsed(),
        bytes.len(),
        defaults.header_read_timeout
    );

    // A slow-body client at the default timeout, once the idle ones are gone.
    drop(idle);
    let mut slow = connect(gateway.rest).await;
    let started = Instant::now();
    let head =
        "POST /v1/jobs HTTP/1.1\r\nHost: g\r\nContent-Type: application/yaml\r\nContent-Length: 4096\r\n\r\nname: x";
    let answer = exchange(&mut slow, head).await.unwrap();
    eprintln!(
        "a slow-body client was answered {} and closed after {:?}; bodyReadTimeout {}",
        answer.status,
        started.elapsed(),
        defaults.body_read_timeout
    );
}
