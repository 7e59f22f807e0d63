//! Durable submits through the real gateway (REST, runtime, group commit, redb on this disk):
//! submits/s and latency at 1, 16 and 64 concurrent clients, against the raw fsync rate of the
//! same disk; `GET /v1/jobs?limit=100` latency with 100,000 jobs stored, during submit load; and
//! the gateway's memory with 100,000 finished jobs before and after retention removes them.
//!
//! `cargo bench -p meridian-gateway --bench submit` (release). `MERIDIAN_BENCH_DIR` picks the
//! directory (default: cargo's target tmpdir, on the same disk as the build). Under
//! `cargo test --benches` it makes one short pass at small sizes (see `common::quick`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use meridian_core::record::{JobRecord, Record};
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::server;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::job::JobState;
use meridian_proto::validate::parse_job_spec;
use meridian_store::{RedbStore, Store, Write};
use tokio::sync::{oneshot, watch};

#[allow(dead_code)]
mod common;
use common::{Conn, Result, bench_config, ms, percentile};

const SPEC: &str = "name: bench\ntenant: t\nlabels: {project: bench}\ngang: {replicas: 2, resources: {gpus: 8}}\n\
                    runtime: {estimate: 2h}\npayload: {image: registry.local/train:1, command: [python, train.py]}\n";
/// The sizes of one run: the full bench, or the short pass.
#[derive(Clone, Copy)]
struct Scale {
    /// How long each load runs.
    run: Duration,
    /// Jobs stored for the list and memory measurements.
    stored: usize,
    /// The concurrent clients of the submit table.
    clients: &'static [usize],
}

impl Scale {
    fn new(quick: bool) -> Self {
        if quick {
            Self { run: Duration::from_millis(300), stored: 2_000, clients: &[1, 4] }
        } else {
            Self { run: Duration::from_secs(5), stored: 100_000, clients: &[1, 16, 64] }
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    if let Some(i) = args.iter().position(|a| a == "--memory-phase") {
        let dir = PathBuf::from(&args[i + 1]);
        let retention = args[i + 2].parse::<u64>()?;
        return runtime.block_on(memory_phase(&dir, Duration::from_secs(retention)));
    }
    if args.iter().any(|a| a == "--list") {
        // `cargo bench` passes `--bench`; nothing to list.
        return Ok(());
    }
    let quick = common::quick();
    common::announce(quick);
    runtime.block_on(run(Scale::new(quick)))
}

fn base_dir() -> PathBuf {
    std::env::var_os("MERIDIAN_BENCH_DIR").map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
}

async fn run(scale: Scale) -> Result<()> {
    let Scale { run: run_for, stored: job_count, .. } = scale;
    let base = base_dir();
    std::fs::create_dir_all(&base)?;
    let dir = tempfile::tempdir_in(&base)?;
    println!("directory: {}", dir.path().display());
    let fsyncs = fsync_rate(dir.path(), run_for.min(Duration::from_secs(2)))?;
    println!("raw fdatasync rate (600-byte appends): {fsyncs:.0}/s\n");

    let gateway = Gateway::start(&dir.path().join("submit"), bench_config()).await?;
    println!("| clients | submits/s | p50 ms | p99 ms | submits/s ÷ fsyncs/s |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for &clients in scale.clients {
        let (count, mut latencies) = common::submit_load(gateway.rest, clients, run_for, SPEC).await?;
        latencies.sort();
        let rate = count as f64 / run_for.as_secs_f64();
        println!(
            "| {clients} | {rate:.0} | {:.1} | {:.1} | {:.2} |",
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
            rate / fsyncs
        );
    }
    gateway.stop().await;

    // 100,000 stored jobs, then lists during a 16-client submit load.
    let stored = dir.path().join("stored");
    preload(&stored, job_count, false).await?;
    let gateway = Gateway::start(&stored, bench_config()).await?;
    // The submitters run for the same window as the lists (both stop after `run_for`).
    let submitters = tokio::spawn({
        let rest = gateway.rest;
        async move { common::submit_load(rest, 16, run_for, SPEC).await.map(|(n, _)| n) }
    });
    let mut client = Conn::open(gateway.rest).await?;
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < run_for {
        let at = Instant::now();
        let (status, body) = client.send(Method::GET, "/v1/jobs?limit=100", None).await?;
        latencies.push(at.elapsed());
        if status != StatusCode::OK || body.len() < 100 {
            return Err(format!("list answered {status}: {}", String::from_utf8_lossy(&body)).into());
        }
    }
    let submitted = submitters.await??;
    latencies.sort();
    println!(
        "\nGET /v1/jobs?limit=100 with {job_count} jobs stored, during 16-client submit load ({submitted} submits): \
         {} lists, p50 {:.2} ms, p99 {:.2} ms",
        latencies.len(),
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99))
    );
    gateway.stop().await;

    // Memory with 100,000 finished jobs, before and after retention (separate processes, so the
    // second does not inherit the first one's heap).
    let finished = dir.path().join("finished");
    preload(&finished, job_count, true).await?;
    let exe = std::env::current_exe()?;
    for (label, retention) in [("kept (retention 7d)", 7 * 24 * 3600u64), ("after retention (1h)", 3600)] {
        let output = std::process::Command::new(&exe)
            .arg("--memory-phase")
            .arg(&finished)
            .arg(retention.to_string())
            .output()?;
        if !output.status.success() {
            return Err(format!(
                "the memory phase ({label}) failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into());
        }
        let text = String::from_utf8_lossy(&output.stdout);
        println!("memory with {job_count} finished jobs, {label}: {}", text.trim());
    }
    Ok(())
}

/// Loads the gateway on `dir` with the given retention, waits for the first tick, prints RSS.
async fn memory_phase(dir: &Path, retention: Duration) -> Result<()> {
    let config = GatewayConfig { retention: meridian_proto::duration::HumanDuration(retention), ..bench_config() };
    let gateway = Gateway::start(dir, config).await?;
    // Retention runs on the tick (every 500 ms) and commits the deletions.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut conn = Conn::open(gateway.rest).await?;
    let (_, body) = conn.send(Method::GET, "/v1/jobs?limit=5000", None).await?;
    let listed = serde_json::from_slice::<serde_json::Value>(&body)?["jobs"].as_array().map_or(0, Vec::len);
    println!("{} MiB resident, first page lists {listed} jobs", rss_mib()?);
    std::io::stdout().flush()?;
    gateway.stop().await;
    Ok(())
}

fn rss_mib() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).ok_or("statm")?.parse()?;
    Ok(pages * 4096 / (1024 * 1024))
}

/// Writes `count` job records straight into a store in `dir` (finished two hours ago, or queued).
async fn preload(dir: &Path, count: usize, finished: bool) -> Result<()> {
    let store = RedbStore::open(dir)?;
    let spec = parse_job_spec(SPEC, &GpuCatalog::default())?;
    let now = meridian_gateway::runtime::now_ms();
    let mut batch = Vec::new();
    for i in 0..count {
        let at = now - 2 * 3600 * 1000 - (count - i) as i64;
        let mut job = JobRecord::queued(format!("j-{at:011x}0000{i:06x}"), spec.clone(), "preloaded", at);
        if finished {
            job.state = JobState::Succeeded;
            job.finished_at_ms = Some(at + 1);
        }
        let encoded = Record::Job(job.into()).encode()?;
        batch.push(Write::Put { key: encoded.key, value: encoded.value.unwrap_or_default() });
        if batch.len() == 10_000 {
            store.commit(std::mem::take(&mut batch)).await?;
        }
    }
    store.commit(batch).await?;
    Ok(())
}

fn fsync_rate(dir: &Path, run: Duration) -> Result<f64> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("fsync.probe"))?;
    let line = [b'x'; 600];
    let started = Instant::now();
    let mut count = 0u64;
    while started.elapsed() < run {
        file.write_all(&line)?;
        file.sync_data()?;
        count += 1;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// An in-process gateway on loopback over a redb store in `dir`.
struct Gateway {
    rest: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::result::Result<(), server::ServeError>>,
}

impl Gateway {
    async fn start(dir: &Path, config: GatewayConfig) -> Result<Self> {
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir)?);
        let (stop, stop_rx) = watch::channel(false);
        let (bound_tx, bound_rx) = oneshot::channel();
        let task = tokio::spawn(server::serve(
            config,
            store,
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

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
