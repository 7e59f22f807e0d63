//! The client against several small loopback HTTP servers playing gateways: down, standby (with
//! and without the leader's address), electing, leader, and one that breaks off mid-answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::*;
use crate::OutputFormat;
use crate::watch::{self, Watched};

/// What a test gateway writes back for one request.
#[derive(Clone)]
enum Reply {
    /// A JSON answer: status line (`200 OK`), extra header lines, body.
    Json(&'static str, Vec<String>, String),
    /// The head and half of the body it announces, then the connection closes.
    BreakOff,
    /// A server-sent event stream: these events, then the connection closes.
    Events(&'static str),
}

fn ok(body: &str) -> Reply {
    Reply::Json("200 OK", Vec::new(), body.to_owned())
}

/// `503 not_leader` naming `leader`, or `503 no_leader` when there is none.
fn standby(leader: Option<&str>) -> Reply {
    let mut headers = vec!["retry-after: 1".to_owned()];
    let body = match leader {
        Some(leader) => {
            headers.push(format!("meridian-leader: {leader}"));
            r#"{"error":{"code":"not_leader","message":"this gateway is a standby"}}"#
        }
        None => r#"{"error":{"code":"no_leader","message":"no leader is elected yet"}}"#,
    };
    Reply::Json("503 Service Unavailable", headers, body.to_owned())
}

/// A scripted gateway: answers each request with `answer(n, request)` (`n` counts its requests
/// from 0) and keeps every request it read.
struct TestGateway {
    address: String,
    requests: Arc<Mutex<Vec<String>>>,
    server: JoinHandle<()>,
}

impl TestGateway {
    async fn start(answer: impl Fn(usize, &str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let request = read_request(&mut socket).await;
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(request.clone());
                    seen.len() - 1
                };
                write_reply(&mut socket, answer(n, &request)).await;
            }
        });
        Self { address, requests, server }
    }

    /// Always the same answer.
    async fn always(reply: Reply) -> Self {
        Self::start(move |_, _| reply.clone()).await
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// The request lines (`POST /v1/jobs HTTP/1.1`) it received.
    fn request_lines(&self) -> Vec<String> {
        self.requests().iter().map(|r| r.lines().next().unwrap_or_default().to_owned()).collect()
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Reads one request: the head and the body its `content-length` announces.
async fn read_request(socket: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = socket.read(&mut buf).await.unwrap_or(0);
        received.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&received).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if received.len() >= end + 4 + length {
                return text;
            }
        }
        if n == 0 {
            return text;
        }
    }
}

async fn write_reply(socket: &mut TcpStream, reply: Reply) {
    let bytes = match reply {
        Reply::Json(status, headers, body) => {
            let headers: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n{body}",
                body.len()
            )
        }
        Reply::BreakOff => {
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":".into()
        }
        Reply::Events(events) => {
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{events}")
        }
    };
    let _ = socket.write_all(bytes.as_bytes()).await;
    let _ = socket.shutdown().await;
}

/// An address nothing listens on.
async fn down() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    address
}

fn client(addresses: &[&str]) -> Client {
    Client::new(&addresses.join(",")).unwrap().with_timeout(Duration::from_secs(5))
}

const CLUSTERS: &str = r#"{"clusters":[]}"#;
const JOB: &str = r#"{"id":"j-1","state":"Queued"}"#;

#[tokio::test]
async fn a_refused_connection_moves_on_to_the_next_gateway_and_stays_there() {
    let down = down().await;
    let leader = TestGateway::always(ok(JOB)).await;
    let client = client(&[&down, &leader.address]);
    assert_eq!(client.authority(), down, "the first address is tried first");
    let (job, _) = client.submit("name: x\n").await.unwrap();
    assert_eq!(job["id"], "j-1", "a write is safe to send on: it never left");
    assert_eq!(client.authority(), leader.address, "the gateway that answered is asked first next time");
    client.get("j-1").await.unwrap();
    assert_eq!(leader.request_lines(), ["POST /v1/jobs HTTP/1.1", "GET /v1/jobs/j-1 HTTP/1.1"]);
}

#[tokio::test]
async fn a_standby_naming_the_leader_sends_the_request_there_even_outside_the_list() {
    let leader = TestGateway::always(Reply::Json("201 Created", Vec::new(), JOB.into())).await;
    let standby = TestGateway::always(standby(Some(&format!("http://{}", leader.address)))).await;
    let other = TestGateway::always(ok(JOB)).await;
    let client = client(&[&standby.address, &other.address]);
    let (job, created) = client.submit("name: x\n").await.unwrap();
    assert!(created);
    assert_eq!(job["id"], "j-1");
    assert_eq!(standby.request_lines(), ["POST /v1/jobs HTTP/1.1"]);
    assert_eq!(leader.request_lines(), ["POST /v1/jobs HTTP/1.1"]);
    assert!(leader.requests()[0].ends_with("name: x\n"), "the body went along: {:?}", leader.requests());
    assert!(other.requests().is_empty(), "the leader came before the rest of the list");
    client.cancel("j-1").await.unwrap();
    assert_eq!(standby.requests().len(), 1, "later requests go to the leader first");
}

#[tokio::test]
async fn a_leader_of_another_scheme_is_not_followed() {
    let standby = TestGateway::always(standby(Some("https://127.0.0.1:1"))).await;
    let leader = TestGateway::always(ok(JOB)).await;
    let client = client(&[&standby.address, &leader.address]);
    client.cancel("j-1").await.unwrap();
    assert_eq!(leader.request_lines(), ["DELETE /v1/jobs/j-1 HTTP/1.1"]);
}

#[tokio::test]
async fn a_standby_without_the_leader_header_moves_on_to_the_next_gateway() {
    let standby = TestGateway::always(standby(None)).await;
    let leader = TestGateway::always(ok(JOB)).await;
    let client = client(&[&standby.address, &leader.address]);
    client.cancel("j-1").await.unwrap();
    assert_eq!(standby.request_lines(), ["DELETE /v1/jobs/j-1 HTTP/1.1"]);
    assert_eq!(leader.request_lines(), ["DELETE /v1/jobs/j-1 HTTP/1.1"]);
}

#[tokio::test]
async fn a_write_is_not_sent_again_after_the_answer_broke_off_but_a_read_is() {
    let breaks = TestGateway::always(Reply::BreakOff).await;
    let leader = TestGateway::always(ok(CLUSTERS)).await;
    let client = client(&[&breaks.address, &leader.address]);
    let error = client.submit("name: x\n").await.unwrap_err();
    assert!(matches!(error, ClientError::MaybeApplied { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.starts_with(&format!("POST /v1/jobs failed after it was sent to the gateway at {}", breaks.address)));
    assert!(text.contains("may or may not have been made") && text.contains("idempotencyKey"), "{text}");
    assert!(leader.requests().is_empty(), "the write was not repeated elsewhere");

    client.clusters().await.unwrap();
    assert_eq!(breaks.request_lines().len(), 2);
    assert_eq!(leader.request_lines(), ["GET /v1/clusters HTTP/1.1"], "the read went on to the next gateway");
}

#[tokio::test]
async fn when_the_retry_budget_runs_out_the_error_says_what_each_gateway_answered() {
    let down = down().await;
    let electing = TestGateway::always(standby(None)).await;
    let client = client(&[&down, &electing.address]).with_retry_budget(Duration::from_millis(1500));
    let started = std::time::Instant::now();
    let error = client.submit("name: x\n").await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was waited once");
    assert_eq!(electing.requests().len(), 2, "two passes fit in the budget");
    let ClientError::NoGateway { attempts, .. } = &error else { panic!("{error:?}") };
    assert_eq!(attempts.iter().map(|a| a.gateway.as_str()).collect::<Vec<_>>(), [down.as_str(), &electing.address]);
    let text = error.to_string();
    assert!(text.starts_with("every gateway was tried and none served the request (retried for "), "{text}");
    assert!(text.contains(&format!("\n  {down}: cannot connect: ")), "{text}");
    assert!(text.contains(&format!("\n  {}: 503 no_leader: no leader is elected yet", electing.address)), "{text}");
    assert_eq!((error.status(), error.code()), (Some(503), Some("no_leader")));
}

#[tokio::test]
async fn every_gateway_down_fails_at_once_and_one_gateway_down_reads_as_before() {
    let (first, second) = (down().await, down().await);
    let error = client(&[&first, &second]).clusters().await.unwrap_err();
    let ClientError::NoGateway { attempts, retried_for, .. } = &error else { panic!("{error:?}") };
    assert_eq!(attempts.len(), 2);
    assert!(*retried_for < Duration::from_secs(1), "nothing runs to elect a leader: no second pass");
    assert!(error.is_unreachable());
    let error = client(&[&first]).clusters().await.unwrap_err();
    assert!(matches!(error, ClientError::Connect { .. }), "{error:?}");
}

#[tokio::test]
async fn retry_after_is_waited_out_until_a_leader_is_elected() {
    let gateway = TestGateway::start(|n, _| if n == 0 { standby(None) } else { ok(CLUSTERS) }).await;
    let started = std::time::Instant::now();
    client(&[&gateway.address]).clusters().await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "waited the Retry-After");
    assert_eq!(gateway.requests().len(), 2);
}

#[tokio::test]
async fn a_broken_event_stream_resumes_at_the_next_gateway_after_the_last_event() {
    let first = TestGateway::start(|_, request| {
        if request.starts_with("GET /v1/events") {
            Reply::Events(concat!(
                "event: ready\ndata: {\"cursor\":\"1.4\"}\n\n",
                "id: 1.5\nevent: job\ndata: {\"job\":{\"id\":\"j-1\",\"state\":\"Running\"}}\n\n"
            ))
        } else {
            ok(r#"{"id":"j-1","state":"Queued"}"#)
        }
    })
    .await;
    let second = TestGateway::always(Reply::Events(
        "id: 1.6\nevent: job\ndata: {\"job\":{\"id\":\"j-1\",\"state\":\"Succeeded\"}}\n\n",
    ))
    .await;
    let client = client(&[&first.address, &second.address]);
    let mut out = Vec::new();
    watch::run(&client, Watched::Job("j-1".into()), OutputFormat::Json, &mut out).await.unwrap();
    let printed = String::from_utf8(out).unwrap();
    assert!(printed.contains("Running") && printed.contains("Succeeded"), "{printed}");
    let resumed = second.requests();
    assert_eq!(resumed.len(), 1);
    assert!(resumed[0].to_ascii_lowercase().contains("\r\nlast-event-id: 1.5\r\n"), "{}", resumed[0]);
}
