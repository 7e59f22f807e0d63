//! What one scrape of `GET /metrics` costs with a large memory: 100,000 jobs remembered (90,000
//! finished, 9,000 queued, 1,000 holding GPUs) in 20 tenants, on 20 clusters. Renders the
//! exposition through the same registry the endpoint uses and reports the time per scrape and
//! its size.
//!
//! `cargo bench -p meridian-gateway --bench metrics` (release).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use meridian_core::record::{JobRecord, KnownCluster};
use meridian_core::{Core, CoreConfig, Loaded};
use meridian_gateway::auth::Authenticator;
use meridian_gateway::metrics::{Metrics, MetricsAccess, MetricsConfig, ScrapeAccess};
use meridian_gateway::runtime::{Runtime, RuntimeConfig, now_ms};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{ClusterInfo, Inventory, NodeFree, NodeShape, Tier};
use meridian_proto::job::JobState;
use meridian_proto::testing;
use meridian_proto::validate::parse_job_spec;

#[allow(dead_code)]
mod common;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const TENANTS: usize = 20;
const CLUSTERS: usize = 20;

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let quick = common::quick();
    common::announce(quick);
    // (jobs stored, scrapes timed): the full run, or the short pass of `cargo test --benches`.
    let (jobs, scrapes) = if quick { (2_000, 2) } else { (100_000, 20) };
    runtime.block_on(run(jobs, scrapes))
}

fn loaded(jobs: usize) -> Result<Loaded> {
    let now = now_ms();
    let mut loaded = Loaded::default();
    for c in 0..CLUSTERS {
        let info = ClusterInfo {
            region: format!("region-{}", c % 4),
            tier: if c % 5 == 0 { Tier::Cloud } else { Tier::Owned },
            prices: BTreeMap::from([("h100".to_string(), 2.5)]),
            ..testing::cluster_info(&format!("cluster-{c:02}"))
        };
        let shape =
            NodeShape { free: vec![NodeFree { gpus: 4, cpu: 48, memory_gib: 512 }; 64], ..testing::dgx_shape(&[]) };
        loaded.clusters.push(KnownCluster { info, inventory: Inventory { shapes: vec![shape] } });
    }
    for i in 0..jobs {
        let text = format!(
            "name: j{i}\ntenant: tenant-{:02}\npriority: {}\ngang: {{replicas: 1, resources: {{gpus: 8}}}}\n\
             payload: {{command: [x]}}\n",
            i % TENANTS,
            i % 101
        );
        let spec = parse_job_spec(&text, &GpuCatalog::default())?;
        let mut job = JobRecord::queued(format!("j-{i:011x}"), spec, "waiting", now - 3_600_000);
        match i % 100 {
            0..90 => {
                job.state = JobState::Succeeded;
                job.finished_at_ms = Some(now - 60_000);
            }
            90..99 => {}
            _ => {
                job.state = JobState::Running;
                job.cluster = Some(format!("cluster-{:02}", i % CLUSTERS));
                job.started_at_ms = Some(now - 1_800_000);
            }
        }
        loaded.jobs.push(job);
    }
    Ok(loaded)
}

async fn run(jobs: usize, scrapes: usize) -> Result<()> {
    let core = Core::new(CoreConfig::default(), loaded(jobs)?, now_ms(), 1);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (runtime, handle) =
        Runtime::start(core, Arc::new(meridian_store::MemoryStore::new()), RuntimeConfig::default(), stop_rx);
    let config = MetricsConfig { access: Some(MetricsAccess::Open), token_file: None };
    let metrics = Metrics::new(handle, ScrapeAccess::load(&config, Arc::new(Authenticator::off()))?);
    let mut times = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let started = Instant::now();
        let text = metrics.render()?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        bytes = text.len();
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{jobs} jobs, {TENANTS} tenants, {CLUSTERS} clusters: one scrape renders {bytes} bytes in {:.1} ms median, \
         {:.1} ms max ({scrapes} scrapes)",
        times[scrapes / 2],
        times[scrapes - 1]
    );
    let _ = stop.send(true);
    runtime.join().await;
    Ok(())
}
