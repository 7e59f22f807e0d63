//! `meridian demo`: a gateway and three member clusters in one process, on loopback gRPC, with a
//! realistic mixed workload, over mTLS like a real federation. No servers to install; the only
//! files written are its certificates, in a temporary directory removed at the end.
//!
//! The clusters are the ones in `deploy/examples/local/` (the same files, compiled in). Jobs run
//! on the builtin scheduler with shrunk run times (by default one hour of job time per second),
//! so the whole demo ends well under a minute. All times printed are job time.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use meridian_agent::config::AgentConfig;
use meridian_proto::inventory::Tier;
use meridian_proto::job::JobState;
use tokio::sync::{oneshot, watch};

use meridian_core::{ClusterSummary, Explanation, JobFilter, JobRecord};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::validate::parse_job_spec;

use meridian_gateway::api::ApiError;
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::runtime::{Handle, now_ms};
use meridian_gateway::server;
use meridian_placement::NetworkTable;
use meridian_store::MemoryStore;

const GATEWAY_CONFIG: &str = include_str!("../../../deploy/examples/local/gateway.yaml");
const AGENT_CONFIGS: [(&str, &str); 3] = [
    ("onprem-east.yaml", include_str!("../../../deploy/examples/local/onprem-east.yaml")),
    ("onprem-west.yaml", include_str!("../../../deploy/examples/local/onprem-west.yaml")),
    ("cloud-burst.yaml", include_str!("../../../deploy/examples/local/cloud-burst.yaml")),
];
const GIB_TO_GB: f64 = 1.073_741_824;

/// Demo options.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Real seconds per hour of job time.
    #[arg(long, default_value_t = 1.0)]
    seconds_per_hour: f64,
    /// Give up (and fail) after this many real seconds.
    #[arg(long, default_value_t = 55)]
    deadline_secs: u64,
}

/// One job of the demo workload.
struct DemoJob {
    spec: String,
    /// What kind of job it is, printed with the result.
    story: &'static str,
}

fn workload() -> Vec<DemoJob> {
    let mut jobs = vec![
        DemoJob {
            story: "2x8 gang, H100 or A100, 2 TiB of data in us-east",
            spec: "name: llama-ft-7b\ntenant: nlp\npriority: 60\nlabels: {project: llm, type: finetune}\n\
                   gang: {replicas: 2, resources: {gpus: 8, gpuTypes: [h100, a100-80g], gpuMemoryGiB: 80, cpu: 32, memoryGiB: 256}}\n\
                   runtime: {estimate: 6h, limit: 12h}\ndata: [{uri: s3://corpus/pile, sizeGiB: 2000, region: us-east}]\n\
                   placement: {regions: [us-east, eu-west], burst: {after: 30m, maxUsdPerHour: 80}}\n\
                   payload: {image: ghcr.io/acme/train:1.4, command: [torchrun, train.py]}\n"
                .into(),
        },
        DemoJob {
            story: "3x8 A100 gang, 500 GiB of data in eu-west",
            spec: "name: vit-l-pretrain\ntenant: vision\nlabels: {project: vit, type: pretrain}\n\
                   gang: {replicas: 3, resources: {gpus: 8, gpuTypes: [a100-80g], cpu: 64, memoryGiB: 512}}\n\
                   runtime: {estimate: 4h}\ndata: [{uri: s3://eu-images/laion-subset, sizeGiB: 500, region: eu-west}]\n\
                   payload: {image: ghcr.io/acme/vision:2.0}\n"
                .into(),
        },
        DemoJob {
            story: "4x8 H100 gang, may burst after 30m within $300/h",
            spec: "name: mixtral-pretrain\ntenant: nlp\npriority: 40\nlabels: {project: llm, type: pretrain}\n\
                   gang: {replicas: 4, resources: {gpus: 8, gpuTypes: [h100], cpu: 96, memoryGiB: 1024}}\n\
                   runtime: {estimate: 5h}\ndata: [{uri: s3://corpus/redpajama, sizeGiB: 300, region: us-east}]\n\
                   placement: {burst: {after: 30m, maxUsdPerHour: 300}}\n\
                   payload: {image: ghcr.io/acme/train:1.4, command: [torchrun, pretrain.py]}\n"
                .into(),
        },
        DemoJob {
            story: "1x8 H100, `burst: never`",
            spec: "name: speech-asr\ntenant: vision\nlabels: {project: asr}\n\
                   gang: {resources: {gpus: 8, gpuTypes: [h100], cpu: 64, memoryGiB: 512}}\n\
                   runtime: {estimate: 2h}\ndata: [{uri: s3://audio/librilight, sizeGiB: 120, region: us-east}]\n\
                   placement: {burst: never}\npayload: {image: ghcr.io/acme/asr:0.9}\n"
                .into(),
        },
        DemoJob {
            story: "2x4 gang, any GPU, no data",
            spec: "name: rl-agent\ntenant: research\nlabels: {project: rl}\n\
                   gang: {replicas: 2, resources: {gpus: 4, cpu: 32, memoryGiB: 128}}\n\
                   runtime: {estimate: 3h}\npayload: {image: ghcr.io/acme/rl:1.0}\n"
                .into(),
        },
    ];
    for i in 0..8 {
        let (region, size) = if i % 2 == 0 { ("us-east", 10) } else { ("eu-west", 25) };
        jobs.push(DemoJob {
            story: "1 GPU with 40+ GiB, small dataset",
            spec: format!(
                "name: bert-sweep-{i}\ntenant: research\nlabels: {{project: bert, type: sweep}}\n\
                 gang: {{resources: {{gpus: 1, gpuMemoryGiB: 40, cpu: 8, memoryGiB: 32}}}}\nruntime: {{estimate: {}m}}\n\
                 data: [{{uri: s3://bench/glue-{i}, sizeGiB: {size}, region: {region}}}]\n\
                 payload: {{image: ghcr.io/acme/bert:3.1, command: [python, sweep.py, --trial, '{i}']}}\n",
                20 + 10 * i
            ),
        });
    }
    for i in 0..4 {
        jobs.push(DemoJob {
            story: "1 L4 evaluation",
            spec: format!(
                "name: llm-eval-{i}\ntenant: nlp\nlabels: {{project: llm, type: eval}}\n\
                 gang: {{resources: {{gpus: 1, gpuTypes: [l4], cpu: 8, memoryGiB: 48}}}}\nruntime: {{estimate: 30m}}\n\
                 data: [{{uri: s3://corpus/evals, sizeGiB: 5, region: us-east}}]\n\
                 payload: {{command: [python, eval.py]}}\n"
            ),
        });
    }
    jobs
}

/// Runs the demo, writing its report to `out`.
pub async fn run(args: DemoArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if !(args.seconds_per_hour.is_finite() && args.seconds_per_hour > 0.0) {
        bail!("--seconds-per-hour must be a positive number");
    }
    let time_scale = args.seconds_per_hour / 3600.0;
    let mut config = GatewayConfig::parse(GATEWAY_CONFIG, Path::new("deploy/examples/local/gateway.yaml"))?;
    // The demo's federation speaks mTLS like the example: a CA and certificates made now, in a
    // directory removed at the end.
    let certs = tempfile::tempdir().context("a temporary directory for the demo's certificates")?;
    let dir = certs.path();
    crate::certs::init(dir, &[], 1, false)?;
    config.tls = Some(meridian_gateway::tls::TlsConfig {
        cert: dir.join("gateway.pem"),
        key: dir.join("gateway.key"),
        client_ca: dir.join("ca.pem"),
        ..config.tls.clone().context("the example gateway.yaml has a tls section")?
    });
    config.listen = "127.0.0.1:0".parse()?;
    config.grpc_listen = "127.0.0.1:0".parse()?;
    config.placement_interval = meridian_proto::duration::HumanDuration(Duration::from_millis(200));
    let catalog = config.gpu_catalog();
    let network = config.network_table();

    let (stop_tx, stop_rx) = watch::channel(false);
    let (bound_tx, bound_rx) = oneshot::channel();
    let server_task = tokio::spawn(server::serve(
        config,
        Arc::new(MemoryStore::new()),
        wait_stop(stop_rx.clone()),
        move |addrs, handle| {
            let _ = bound_tx.send((addrs, handle));
        },
    ));
    let (addrs, handle) = bound_rx.await.context("gateway did not start")?;
    let gateway = InProcess { handle, catalog, network };

    let mut agents = Vec::new();
    let mut cluster_configs = BTreeMap::new();
    for (file, text) in AGENT_CONFIGS {
        let mut agent_config = AgentConfig::parse(text, Path::new(file))?;
        crate::certs::issue(dir, &agent_config.cluster, 1, false)?;
        agent_config.gateway = format!("https://{}", addrs.grpc);
        agent_config.tls = Some(meridian_agent::config::TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("cluster-{}.pem", agent_config.cluster)),
            key: dir.join(format!("cluster-{}.key", agent_config.cluster)),
        });
        agent_config.time_scale = time_scale;
        agent_config.report_interval = meridian_proto::duration::HumanDuration(Duration::from_millis(500));
        let agent = meridian_agent::agent_from_config(&agent_config)?;
        cluster_configs.insert(agent_config.cluster.clone(), agent_config);
        agents.push(tokio::spawn(agent.run(wait_stop(stop_rx.clone()))));
    }

    let result = drive(&gateway, &cluster_configs, time_scale, args.deadline_secs, out).await;
    let _ = stop_tx.send(true);
    for agent in agents {
        let _ = agent.await;
    }
    server_task.await??;
    result
}

/// The demo talks to its gateway in-process, through the same handle the APIs use.
struct InProcess {
    handle: Handle,
    catalog: GpuCatalog,
    network: NetworkTable,
}

impl InProcess {
    fn clusters(&self) -> Vec<ClusterSummary> {
        self.handle.view().clusters(now_ms())
    }

    async fn submit(&self, text: &str) -> Result<(Arc<JobRecord>, bool), ApiError> {
        let spec = parse_job_spec(text, &self.catalog)?;
        Ok(self.handle.submit(spec).await?)
    }

    fn list(&self) -> Vec<JobRecord> {
        let page = self.handle.view().list(&JobFilter::default(), usize::MAX, None);
        page.jobs.iter().map(|j| JobRecord::clone(j)).collect()
    }

    fn explain(&self, id: &str) -> anyhow::Result<Explanation> {
        self.handle.view().explain(id).with_context(|| format!("job {id} vanished"))
    }

    fn network(&self) -> &NetworkTable {
        &self.network
    }
}

async fn wait_stop(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn drive(
    gateway: &InProcess,
    clusters: &BTreeMap<String, AgentConfig>,
    time_scale: f64,
    deadline_secs: u64,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(deadline_secs);
    writeln!(out, "Meridian demo: one gateway, three member clusters, {} jobs.", workload().len())?;
    writeln!(out, "(job time runs {:.0}x faster than real time; all times below are job time)\n", 1.0 / time_scale)?;
    while gateway.clusters().iter().filter(|c| c.connected && c.gpus_total > 0).count() < clusters.len() {
        if tokio::time::Instant::now() > deadline {
            bail!("member clusters did not connect in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for c in gateway.clusters() {
        let prices: Vec<String> = c.prices.iter().map(|(g, p)| format!("{g} ${p:.2}/GPU-h")).collect();
        writeln!(
            out,
            "  cluster {:<12} {:<8} {:<6} {:>3} GPUs  {}",
            c.name,
            c.region,
            tier_name(c.tier),
            c.gpus_total,
            prices.join(", ")
        )?;
    }
    writeln!(out)?;

    let mut stories = BTreeMap::new();
    for job in workload() {
        let (record, _) =
            gateway.submit(&job.spec).await.with_context(|| format!("demo job refused:\n{}", job.spec))?;
        stories.insert(record.id.clone(), job.story);
    }
    // A job no cluster could ever run is refused at submit, with the reason per cluster.
    let giant = include_str!("../../../deploy/examples/local/jobs/too-big.yaml");
    match gateway.submit(giant).await {
        Err(e) => writeln!(out, "refused at submit: giant-sweep (8x8 A100): {e}\n")?,
        Ok(_) => bail!("the never-fitting job was accepted"),
    }

    let mut last_state: BTreeMap<String, JobState> = BTreeMap::new();
    loop {
        let jobs = gateway.list();
        let hours = start.elapsed().as_secs_f64() / 3600.0 / time_scale;
        for job in &jobs {
            if last_state.get(&job.id) != Some(&job.state) {
                last_state.insert(job.id.clone(), job.state);
                let place = job.cluster.as_deref().map(|c| format!(" on {c}")).unwrap_or_default();
                writeln!(out, "[{hours:5.1}h] {:<16} {:<9}{place}", job.spec.name, job.state.as_str())?;
            }
        }
        if jobs.iter().all(|j| j.state.is_terminal()) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("jobs still running at the deadline");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let jobs = gateway.list();
    writeln!(out, "\nWhere each job went and why:")?;
    for job in &jobs {
        let explanation = gateway.explain(&job.id)?;
        writeln!(
            out,
            "  {:<16} -> {:<12} ({})\n  {:<16}    {}",
            job.spec.name,
            job.cluster.as_deref().unwrap_or("-"),
            stories.get(&job.id).copied().unwrap_or(""),
            "",
            explanation.summary
        )?;
    }
    write_summary(out, &jobs, clusters, gateway.network(), time_scale)?;
    if jobs.iter().any(|j| j.state != JobState::Succeeded) {
        bail!("some jobs did not succeed");
    }
    Ok(())
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Owned => "owned",
        Tier::Cloud => "cloud",
    }
}

/// Per-cluster totals of the finished workload.
#[derive(Default)]
struct ClusterTotals {
    jobs: u32,
    gpu_hours: f64,
    queue_hours: f64,
    compute_usd: f64,
    egress_usd: f64,
    moved_gib: f64,
}

fn write_summary(
    out: &mut impl Write,
    jobs: &[JobRecord],
    clusters: &BTreeMap<String, AgentConfig>,
    network: &NetworkTable,
    time_scale: f64,
) -> anyhow::Result<()> {
    let to_hours = |ms: i64| ms as f64 / 1000.0 / 3600.0 / time_scale;
    let first_start = jobs.iter().filter_map(|j| j.started_at_ms).min().unwrap_or(0);
    let last_end = jobs.iter().filter_map(|j| j.finished_at_ms).max().unwrap_or(first_start);
    let makespan_h = to_hours(last_end - first_start).max(1e-9);
    let mut totals: BTreeMap<String, ClusterTotals> =
        clusters.keys().map(|c| (c.clone(), Default::default())).collect();
    let mut regions_moved = BTreeSet::new();
    for job in jobs {
        let (Some(cluster), Some(started), Some(finished)) = (&job.cluster, job.started_at_ms, job.finished_at_ms)
        else {
            continue;
        };
        let Some(config) = clusters.get(cluster) else { continue };
        let t = totals.entry(cluster.clone()).or_default();
        let gpus = f64::from(job.spec.total_gpus());
        let hours = to_hours(finished - started);
        let price = job.gpu_type.as_deref().and_then(|g| config.prices.get(g)).copied().unwrap_or(0.0);
        t.jobs += 1;
        t.gpu_hours += gpus * hours;
        t.queue_hours += to_hours(started - job.submitted_at_ms);
        t.compute_usd += gpus * hours * price;
        for data in &job.spec.data {
            if data.region != config.region {
                t.moved_gib += data.size_gib;
                t.egress_usd += data.size_gib * GIB_TO_GB * network.usd_per_gb(&data.region, &config.region);
                regions_moved.insert((data.region.clone(), config.region.clone()));
            }
        }
    }
    writeln!(out, "\nSummary per cluster (makespan {makespan_h:.1}h of job time):")?;
    writeln!(
        out,
        "  {:<12} {:>5} {:>5} {:>7} {:>11} {:>10} {:>10} {:>10}",
        "CLUSTER", "TIER", "JOBS", "GPU-UTIL", "MEAN-QUEUE", "COMPUTE$", "EGRESS$", "MOVED-GiB"
    )?;
    let (mut all_usd, mut all_moved) = (0.0, 0.0);
    for (name, t) in &totals {
        let Some(config) = clusters.get(name) else { continue };
        let gpus: u32 = config.nodes.iter().map(|n| n.gpus * n.count).sum();
        let util = t.gpu_hours / (f64::from(gpus) * makespan_h);
        let mean_queue = if t.jobs > 0 { t.queue_hours / f64::from(t.jobs) } else { 0.0 };
        all_usd += t.compute_usd + t.egress_usd;
        all_moved += t.moved_gib;
        writeln!(
            out,
            "  {:<12} {:>5} {:>5} {:>7.0}% {:>10.2}h {:>10.0} {:>10.2} {:>10.0}",
            name,
            tier_name(config.tier),
            t.jobs,
            util * 100.0,
            mean_queue,
            t.compute_usd,
            t.egress_usd,
            t.moved_gib
        )?;
    }
    writeln!(
        out,
        "  total cost ${all_usd:.0}; data moved {all_moved:.0} GiB across {} region pairs",
        regions_moved.len()
    )?;
    Ok(())
}
