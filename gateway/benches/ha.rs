//! The highly available gateway on a real etcd (feature `etcd`):
//! - durable submits/s and latency through an elected gateway at 1, 16 and 64 REST clients,
//!   against one client committing one etcd transaction per put (what group commit saves);
//! - a new leader's start-up with 100,000 jobs in etcd (campaign, load, reseal check) until
//!   `/readyz` says leader;
//! - a standby's read latency (`GET /v1/jobs/{id}`, `GET /v1/jobs?limit=100`) with those jobs.
//!
//! `cargo bench -p meridian-gateway --features etcd --bench ha` (release). It uses the etcd of
//! `MERIDIAN_ETCD_ENDPOINTS` (`scripts/etcd/up.sh DIR` starts one; its members run with
//! `--max-txn-ops 1024 --max-request-bytes 8388608`, the gateway's defaults), else it starts a
//! three-member etcd of its own. Every run works under a fresh key prefix. Under
//! `cargo test --benches` it makes one short pass at small sizes (see `common::quick`);
//! `MERIDIAN_SKIP_ETCD=1` skips it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use meridian_core::record::{JobRecord, Record};
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::config::store::{EtcdSection, StoreKind};
use meridian_gateway::server;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::validate::parse_job_spec;
use meridian_store::etcd::{EtcdConfig, EtcdStore};
use meridian_store::testing::etcd::{EtcdCluster, shared_endpoints, skip, unique_prefix};
use meridian_store::{KeyRing, SealedStore, Store, Write};
use tokio::sync::{oneshot, watch};

#[allow(dead_code)]
mod common;
use common::{Conn, Result, bench_config, ms, percentile};

const SPEC: &str = "name: bench\ntenant: t\nlabels: {project: bench}\ngang: {replicas: 2, resources: {gpus: 8}}\n\
                    runtime: {estimate: 2h}\npayload: {image: registry.local/train:1, command: [python, train.py]}\n";

/// The sizes of one run: the full bench, or the short pass.
#[derive(Clone, Copy)]
struct Scale {
    run: Duration,
    stored: usize,
    clients: &'static [usize],
    reads: usize,
}

impl Scale {
    fn new(quick: bool) -> Self {
        if quick {
            Self { run: Duration::from_millis(300), stored: 2_000, clients: &[1, 4], reads: 200 }
        } else {
            Self { run: Duration::from_secs(5), stored: 100_000, clients: &[1, 16, 64], reads: 5_000 }
        }
    }
}

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    if skip() {
        println!("ha bench: skipped (MERIDIAN_SKIP_ETCD=1)");
        return Ok(());
    }
    let quick = common::quick();
    common::announce(quick);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run(Scale::new(quick)))
}

async fn run(scale: Scale) -> Result<()> {
    let (_own, endpoints) = match shared_endpoints() {
        Some(endpoints) => (None, endpoints),
        None => {
            let cluster =
                EtcdCluster::start_with_flags(3, &["--max-txn-ops", "1024", "--max-request-bytes", "8388608"]).await;
            let endpoints = cluster.endpoints();
            (Some(cluster), endpoints)
        }
    };
    println!("etcd: {} ({} members)", endpoints.join(","), endpoints.len());
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("secrets.key");
    KeyRing::load_or_create(&key_file)?;

    // 1. Submits through an elected gateway, and one transaction per put.
    let prefix = unique_prefix("bench-submit");
    let leader = Elected::start(&endpoints, &prefix, &key_file, "bench-1").await?;
    leader.wait_role("leader").await?;
    let store = connect(&endpoints, &format!("{prefix}raw/")).await?;
    let single = single_put_rate(&store, scale.run).await?;
    println!("one client, one etcd transaction per put (600-byte values): {single:.0}/s\n");
    println!("| clients | submits/s | p50 ms | p99 ms | submits/s ÷ one-put transactions/s |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for &clients in scale.clients {
        let (count, mut latencies) = common::submit_load(leader.rest, clients, scale.run, SPEC).await?;
        latencies.sort();
        let rate = count as f64 / scale.run.as_secs_f64();
        println!(
            "| {clients} | {rate:.0} | {:.1} | {:.1} | {:.1} |",
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            rate / single
        );
    }
    leader.stop().await;

    // 2. A new leader's start-up with `stored` jobs in etcd.
    let prefix = unique_prefix("bench-startup");
    preload(&endpoints, &prefix, &key_file, scale.stored).await?;
    // Where a leader's start-up goes: reading etcd, opening the sealed values, decoding.
    let reader = connect(&endpoints, &prefix).await?;
    let at = Instant::now();
    let (raw, _) = reader.snapshot("").await?;
    let read = at.elapsed();
    let keys = KeyRing::load(&key_file)?;
    let at = Instant::now();
    let opened: Vec<(String, Vec<u8>)> =
        raw.into_iter().map(|(k, v)| keys.open(&k, &v).map(|v| (k, v))).collect::<std::result::Result<_, _>>()?;
    let open = at.elapsed();
    let at = Instant::now();
    let core = server::load_entries(&bench_config(), opened, "bench")?;
    let decode = at.elapsed();
    println!(
        "\nreading {} jobs: etcd {:.2} s, opening {:.2} s, decoding and indexing {:.2} s ({} jobs loaded)",
        scale.stored,
        read.as_secs_f64(),
        open.as_secs_f64(),
        decode.as_secs_f64(),
        core.job_count()
    );
    drop(core);
    let started = Instant::now();
    let leader = Elected::start(&endpoints, &prefix, &key_file, "bench-2").await?;
    leader.wait_role("leader").await?;
    let took = started.elapsed();
    println!("new leader with {} jobs in etcd: ready as leader after {:.2} s", scale.stored, took.as_secs_f64());

    // 3. A standby's reads.
    let standby = Elected::start(&endpoints, &prefix, &key_file, "bench-3").await?;
    standby.wait_role("standby").await?;
    let mut conn = Conn::open(standby.rest).await?;
    let (_, body) = conn.send(Method::GET, "/v1/jobs?limit=100", None).await?;
    let first: serde_json::Value = serde_json::from_slice(&body)?;
    let ids: Vec<String> = first["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().filter_map(|j| j["id"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    if ids.is_empty() {
        return Err(format!("the standby listed no jobs: {}", String::from_utf8_lossy(&body)).into());
    }
    for (label, path) in [("GET /v1/jobs/{id}", None), ("GET /v1/jobs?limit=100", Some("/v1/jobs?limit=100"))] {
        let mut latencies = Vec::with_capacity(scale.reads);
        for i in 0..scale.reads {
            let target = path.map_or_else(|| format!("/v1/jobs/{}", ids[i % ids.len()]), str::to_string);
            let at = Instant::now();
            let (status, _) = conn.send(Method::GET, &target, None).await?;
            latencies.push(at.elapsed());
            if status != StatusCode::OK {
                return Err(format!("{target} on the standby answered {status}").into());
            }
        }
        latencies.sort();
        println!(
            "standby {label} with {} jobs: {} reads, p50 {:.2} ms, p99 {:.2} ms",
            scale.stored,
            latencies.len(),
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99))
        );
    }
    standby.stop().await;
    leader.stop().await;
    Ok(())
}

async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdStore> {
    Ok(EtcdStore::connect(EtcdConfig {
        endpoints: endpoints.to_vec(),
        prefix: prefix.to_string(),
        max_txn_ops: 1024,
        max_request_bytes: 8 * 1024 * 1024,
        ..EtcdConfig::default()
    })
    .await?)
}

/// One client committing one put per transaction, back to back, for `run`.
async fn single_put_rate(store: &EtcdStore, run: Duration) -> Result<f64> {
    let value = vec![b'x'; 600];
    let started = Instant::now();
    let mut count = 0u64;
    while started.elapsed() < run {
        store.commit(vec![Write::put(format!("p/{count:08}"), value.clone())]).await?;
        count += 1;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// Writes `count` queued job records under `prefix`, sealed as a gateway would.
async fn preload(endpoints: &[String], prefix: &str, key_file: &std::path::Path, count: usize) -> Result<()> {
    let store = SealedStore::new(connect(endpoints, prefix).await?, Arc::new(KeyRing::load(key_file)?));
    let limits = store.limits();
    let spec = parse_job_spec(SPEC, &GpuCatalog::default())?;
    let now = meridian_gateway::runtime::now_ms();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for i in 0..count {
        let at = now - (count - i) as i64;
        let job = JobRecord::queued(format!("j-{at:011x}0000{i:06x}"), spec.clone(), "preloaded", at);
        let encoded = Record::Job(job.into()).encode()?;
        let write = Write::Put { key: encoded.key, value: encoded.value.unwrap_or_default() };
        if !limits.fits(batch.len() + 1, bytes + write.size()) {
            store.commit(std::mem::take(&mut batch)).await?;
            bytes = 0;
        }
        bytes += write.size();
        batch.push(write);
    }
    store.commit(batch).await?;
    Ok(())
}

/// An in-process gateway on etcd (leader or standby, as the election decides).
struct Elected {
    rest: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::result::Result<(), server::ServeError>>,
}

impl Elected {
    async fn start(endpoints: &[String], prefix: &str, key_file: &std::path::Path, name: &str) -> Result<Self> {
        let mut config: GatewayConfig = bench_config();
        config.store.kind = StoreKind::Etcd;
        config.store.etcd =
            Some(EtcdSection { endpoints: endpoints.to_vec(), prefix: prefix.to_string(), ..EtcdSection::default() });
        config.secrets.key_file = Some(key_file.to_path_buf());
        config.ha.name = Some(name.to_string());
        config.insecure = true;
        let store = EtcdStore::connect(config.store.etcd.as_ref().ok_or("no etcd section")?.to_store_config()).await?;
        let keys = Arc::new(KeyRing::load(key_file)?);
        let elected = meridian_gateway::ha::Elected { store, keys };
        let (stop, stop_rx) = watch::channel(false);
        let (bound_tx, bound_rx) = oneshot::channel();
        let task = tokio::spawn(meridian_gateway::ha::serve_elected(
            config,
            elected,
            async move {
                let mut stop_rx = stop_rx;
                let _ = stop_rx.wait_for(|s| *s).await;
            },
            move |addrs, _| {
                let _ = bound_tx.send(addrs.rest);
            },
        ));
        let rest = bound_rx.await?;
        Ok(Self { rest, stop, task })
    }

    /// Polls `/readyz` until it answers 200 with this role (at most a minute).
    async fn wait_role(&self, role: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut conn = Conn::open(self.rest).await?;
        loop {
            let (status, body) = conn.send(Method::GET, "/readyz", None).await?;
            let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if status == StatusCode::OK && answer["role"] == role {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("/readyz still answers {status} {answer} after 60 s; wanted {role}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
