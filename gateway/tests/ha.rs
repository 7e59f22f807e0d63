//! Two gateways on a real etcd, in one process: one leads, the other answers reads from the view
//! it follows and refuses writes with the leader's address; the leader's resignation hands over
//! before its lease could run out with nothing lost; stored secrets are sealed in etcd.
//!
//! Uses the etcd of `MERIDIAN_ETCD_ENDPOINTS` (the test command starts one) or starts its own;
//! `MERIDIAN_SKIP_ETCD=1` skips.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::config::store::{EtcdSection, StoreKind};
use meridian_gateway::server;
use meridian_store::etcd::{EtcdConfig, EtcdStore};
use meridian_store::testing::etcd::{EtcdCluster, shared_endpoints, skip, unique_prefix};
use meridian_store::{KeyRing, Store};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

#[allow(dead_code, unreachable_pub)]
#[path = "../benches/common/mod.rs"]
mod common;
use common::Conn;

const SECRET: &str = "s3cr3t-hunter2-value";

/// The leaders' lease in these tests.
const LEASE: Duration = Duration::from_secs(60);

fn spec(name: &str) -> String {
    format!(
        "name: {name}\ntenant: t\ngang: {{replicas: 1, resources: {{gpus: 1}}}}\nruntime: {{estimate: 1h}}\n\
         payload: {{command: [sleep, '1'], env: {{TOKEN: {SECRET}}}, secretEnv: [TOKEN]}}\n"
    )
}

struct Gateway {
    rest: SocketAddr,
    grpc: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), server::ServeError>>,
}

impl Gateway {
    async fn start(endpoints: &[String], prefix: &str, key_file: &std::path::Path, name: &str) -> Gateway {
        let mut config = GatewayConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            grpc_listen: ([127, 0, 0, 1], 0).into(),
            insecure: true,
            ..GatewayConfig::default()
        };
        config.store.kind = StoreKind::Etcd;
        config.store.etcd =
            Some(EtcdSection { endpoints: endpoints.to_vec(), prefix: prefix.to_string(), ..EtcdSection::default() });
        config.secrets.key_file = Some(key_file.to_path_buf());
        config.ha.name = Some(name.to_string());
        // A lease far longer than any wait here: a standby that takes over before it could
        // expire took over because the leader resigned.
        config.ha.lease_ttl = meridian_proto::duration::HumanDuration(LEASE);
        config.ha.step_down_margin = meridian_proto::duration::HumanDuration(Duration::from_secs(5));
        config.check(std::path::Path::new("<test>")).unwrap();
        let store = EtcdStore::connect(config.store.etcd.as_ref().unwrap().to_store_config()).await.unwrap();
        let keys = Arc::new(KeyRing::load(key_file).unwrap());
        let (stop, mut stop_rx) = watch::channel(false);
        let (bound_tx, bound_rx) = oneshot::channel();
        let task = tokio::spawn(meridian_gateway::ha::serve_elected(
            config,
            meridian_gateway::ha::Elected { store, keys },
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            },
            move |addrs, _| {
                let _ = bound_tx.send(addrs);
            },
        ));
        let addrs = bound_rx.await.unwrap();
        Gateway { rest: addrs.rest, grpc: addrs.grpc, stop, task }
    }

    async fn ready(&self) -> (StatusCode, Value) {
        let mut conn = Conn::open(self.rest).await.unwrap();
        let (status, body) = conn.send(Method::GET, "/readyz", None).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().unwrap();
    }
}

/// Polls until one of `gateways` says it leads and another that it is a warm standby naming it.
async fn roles(gateways: &[&Gateway]) -> (usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut leader = None;
        let mut standby = None;
        for (i, gateway) in gateways.iter().enumerate() {
            let (status, body) = gateway.ready().await;
            if status == StatusCode::OK && body["role"] == "leader" {
                leader = Some(i);
            } else if status == StatusCode::OK && body["role"] == "standby" && body["leader"]["rest"].is_string() {
                standby = Some(i);
            }
        }
        if let (Some(leader), Some(standby)) = (leader, standby) {
            return (leader, standby);
        }
        assert!(Instant::now() < deadline, "no leader and warm standby within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_reads_refuses_writes_with_the_leaders_address_and_takes_over_on_resignation() {
    if skip() {
        eprintln!("skipped: MERIDIAN_SKIP_ETCD=1");
        return;
    }
    let (_own, endpoints) = match shared_endpoints() {
        Some(endpoints) => (None, endpoints),
        None => {
            let cluster = EtcdCluster::start(3).await;
            let endpoints = cluster.endpoints();
            (Some(cluster), endpoints)
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("secrets.key");
    KeyRing::load_or_create(&key_file).unwrap();
    let prefix = unique_prefix("gateway-ha");
    let first = Gateway::start(&endpoints, &prefix, &key_file, "gw-a").await;
    let second = Gateway::start(&endpoints, &prefix, &key_file, "gw-b").await;
    let (leader_at, standby_at) = roles(&[&first, &second]).await;
    let (mut gateways, leader_index) = (vec![Some(first), Some(second)], leader_at);
    let leader = gateways[leader_index].as_ref().unwrap();
    let standby = gateways[standby_at].as_ref().unwrap();
    let (_, ready) = standby.ready().await;
    assert_eq!(ready["leader"]["rest"], format!("http://{}", leader.rest), "{ready}");
    assert_eq!(ready["leader"]["grpc"], format!("http://{}", leader.grpc), "{ready}");
    let (_, ready) = leader.ready().await;
    let epoch = ready["epoch"].as_u64().expect("a leader says its epoch");
    assert!(epoch > 0, "{ready}");

    // A write to the leader is durable; the standby's view shows it soon after.
    let mut to_leader = Conn::open(leader.rest).await.unwrap();
    let (status, body) = to_leader.send(Method::POST, "/v1/jobs", Some(&spec("one"))).await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
    let job: Value = serde_json::from_slice(&body).unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let mut to_standby = Conn::open(standby.rest).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = to_standby.send(Method::GET, &format!("/v1/jobs/{id}"), None).await.unwrap();
        if status == StatusCode::OK {
            let seen: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(seen["spec"]["name"], "one");
            assert_ne!(seen["spec"]["payload"]["env"]["TOKEN"], SECRET, "a standby hides secrets too");
            break;
        }
        assert!(Instant::now() < deadline, "the standby never showed job {id}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A write to the standby changes nothing and names the leader.
    let (status, body) = to_standby.send(Method::POST, "/v1/jobs", Some(&spec("two"))).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", String::from_utf8_lossy(&body));
    let refusal: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal["error"]["code"], "not_leader", "{refusal}");
    let text = refusal["error"]["message"].as_str().unwrap();
    assert!(text.contains(&leader.rest.to_string()), "{text}");
    let (headers_status, headers) = head(standby.rest, &spec("two")).await;
    assert_eq!(headers_status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    assert_eq!(
        headers.get("meridian-leader").map(|v| v.to_str().unwrap().to_string()),
        Some(format!("http://{}", leader.rest))
    );
    let (_, body) = to_leader.send(Method::GET, "/v1/jobs?limit=100", None).await.unwrap();
    let listed: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 1, "the refused write created nothing: {listed}");

    // No stored value holds the secret: etcd has sealed bytes only.
    let raw = EtcdStore::connect(EtcdConfig {
        endpoints: endpoints.clone(),
        prefix: prefix.clone(),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let entries = raw.scan("").await.unwrap();
    assert!(entries.iter().any(|(key, _)| key == &format!("jobs/{id}")), "the job is stored: {entries:?}");
    for (key, value) in &entries {
        assert!(!value.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "{key} holds the secret in etcd");
    }

    // The leader resigns on shutdown: the standby leads at once, with the job, at a newer epoch.
    let stopped_at = Instant::now();
    gateways[leader_index].take().unwrap().stop().await;
    let survivor = gateways[standby_at].take().unwrap();
    // Waiting at most half the lease: a takeover within it cannot be the lease running out.
    let deadline = Instant::now() + LEASE / 2;
    let new_epoch = loop {
        let (status, body) = survivor.ready().await;
        if status == StatusCode::OK && body["role"] == "leader" {
            break body["epoch"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "the standby did not take over before the lease could expire: {body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = stopped_at.elapsed();
    assert!(new_epoch > epoch, "epochs grow: {epoch} then {new_epoch}");
    let mut conn = Conn::open(survivor.rest).await.unwrap();
    let (status, _) = conn.send(Method::GET, &format!("/v1/jobs/{id}"), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let (status, body) = conn.send(Method::POST, "/v1/jobs", Some(&spec("three"))).await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&body));
    eprintln!("handover after resignation: {} ms (epoch {epoch} -> {new_epoch})", took.as_millis());
    survivor.stop().await;
}

/// POSTs `body` and returns the status and headers.
async fn head(addr: SocketAddr, body: &str) -> (StatusCode, hyper::HeaderMap) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(Method::POST)
        .uri("/v1/jobs")
        .header(hyper::header::HOST, "t")
        .header(hyper::header::CONTENT_TYPE, "application/yaml")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    (response.status(), response.headers().clone())
}
