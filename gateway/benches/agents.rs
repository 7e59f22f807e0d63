//! Scale: 1,000 member agents over real gRPC streams against one in-process gateway, with 10,000
//! jobs queued. Measures the gateway's CPU, placement-round durations, group commits, and
//! submit → offer latency. Aim: under one core, rounds under 200 ms, submit → offer p99 under
//! 100 ms.
//!
//! `cargo bench -p meridian-gateway --bench agents` (release). `MERIDIAN_BENCH_DIR` picks the
//! directory of the store (default: cargo's target tmpdir). `MERIDIAN_BENCH_AGENTS`,
//! `MERIDIAN_BENCH_QUEUED` and `MERIDIAN_BENCH_WINDOW_SECS` shrink the run for a quick check;
//! `cargo test --benches` makes a short pass (see `common::quick`).
//!
//! How it is built:
//! - The gateway (`server::serve`, a `RedbStore`, ports 0) runs on its own tokio runtime whose
//!   worker and blocking threads are all named `gw`; the load generator runs on another runtime
//!   (`load` threads). The gateway's CPU is the utime+stime of the `gw` threads in
//!   `/proc/self/task/*/stat`, read at the start and end of the window. The `gw` runtime keeps idle
//!   blocking threads for an hour, so none exits (taking its ticks with it) during the window.
//! - Each fake agent ([`FakeAgent`]) is one tonic `FederationClient` on its own HTTP/2
//!   connection (1,000 TCP connections), speaking the agent protocol through the domain types and
//!   their wire conversions in `meridian_proto::protocol`.
//! - 10,000 two-replica × 8-GPU gangs are submitted over REST before the window. Every cluster has
//!   two 8-GPU nodes, but the member's own work holds 4 GPUs of node 0 all the time, so a gang
//!   could run on any cluster in principle (it is not refused at submit) and fits on none now: the
//!   gangs stay queued, and every round places all of them again.
//! - During the window, 1-GPU jobs are submitted at a steady rate. Submit → offer latency runs from
//!   just before the client opens its connection and sends the `POST` to when the fake agent has
//!   decoded the `Offer` for that job id.
//! - After the gateway stops, a cheap profile times `meridian_placement` calls over a snapshot of
//!   the same 1,000 clusters, to show where a round's time goes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use meridian_gateway::runtime::Handle;
use meridian_gateway::server;
use meridian_placement::{ClusterSnapshot, FederationSnapshot, Holds, NetworkTable, PlacementConfig};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{
    BackendKind, ClusterInfo, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure, Tier,
};
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand, JobReport};
use meridian_proto::validate::parse_job_spec;
use meridian_store::{RedbStore, Store};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

#[allow(dead_code)]
mod common;
use common::{Conn, bench_config, ms, percentile};

/// A gang that fits every cluster's node shapes but no cluster's free nodes (see the module doc).
const GANG_SPEC: &str = "name: wide\ntenant: batch\ngang: {replicas: 2, resources: {gpus: 8, gpuTypes: [h100]}}\n\
                         runtime: {estimate: 4h}\npayload: {image: registry.local/train:1, command: [python, train.py]}\n";
/// A job that fits on any cluster now.
const SMALL_SPEC: &str = "name: probe\ntenant: interactive\ngang: {replicas: 1, resources: {gpus: 1}}\n\
                          runtime: {estimate: 10m}\npayload: {image: registry.local/eval:1, command: [python, eval.py]}\n";
const REGIONS: [&str; 5] = ["us-east", "us-west", "eu-west", "eu-central", "ap-northeast"];
/// Thread name of the gateway's runtime; `comm` in `/proc` (at most 15 bytes).
const GATEWAY_THREAD: &str = "gw";
/// How often each agent sends a heartbeat, its inventory and its queue pressure.
const REPORT_EVERY: Duration = Duration::from_secs(2);
/// How long a fake agent runs a job it accepted before it reports `Succeeded`.
const JOB_RUNS: Duration = Duration::from_secs(8);
/// Small-job submits per second during the window.
const SUBMIT_RATE: u32 = 20;
/// REST clients preloading the queue. Many: each placement round re-places the whole queue, so
/// with few clients (one batch of at most that many submits per round) the preload is quadratic;
/// 32 clients did not finish 10,000 submits in 8 minutes.
const PRELOAD_CLIENTS: usize = 1000;
/// GPUs per node, and how many of node 0's the member's own work holds.
const NODE_GPUS: u32 = 8;
const LOCAL_GPUS: u32 = 4;
const NODE_CPU: u32 = 112;
const NODE_MEMORY_GIB: u32 = 2048;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

fn main() -> Result<()> {
    if std::env::args().any(|a| a == "--list") {
        // `cargo bench` passes `--bench`; `--list` asks for tests, of which there are none.
        return Ok(());
    }
    let quick = common::quick();
    common::announce(quick);
    let scale = Scale::from_env(quick)?;
    let gateway_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(GATEWAY_THREAD)
        .thread_keep_alive(Duration::from_secs(3600))
        .enable_all()
        .build()?;
    let load_runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("load").enable_all().build()?;
    let measured = load_runtime.block_on(run(&scale, gateway_runtime.handle().clone()))?;
    drop(load_runtime);
    drop(gateway_runtime);
    let profile = profile(&scale)?;
    report(&scale, &measured, &profile);
    Ok(())
}

/// The sizes of one run.
struct Scale {
    agents: usize,
    queued: usize,
    window: Duration,
}

impl Scale {
    /// The sizes from `MERIDIAN_BENCH_*`, defaulting to the full run, or to a short pass of 20
    /// agents, 200 gangs and 3 s under `cargo test --benches`.
    fn from_env(quick: bool) -> Result<Self> {
        let (agents, queued, window) = if quick { (20, 200, 3) } else { (1_000, 10_000, 30) };
        let read = |name: &str, default: u64| -> Result<u64> {
            std::env::var(name).map_or(Ok(default), |v| v.parse().map_err(|e| format!("{name}: {e}").into()))
        };
        Ok(Self {
            agents: usize::try_from(read("MERIDIAN_BENCH_AGENTS", agents)?)?,
            queued: usize::try_from(read("MERIDIAN_BENCH_QUEUED", queued)?)?,
            window: Duration::from_secs(read("MERIDIAN_BENCH_WINDOW_SECS", window)?),
        })
    }
}

/// What the run measured.
struct Measured {
    preload: Duration,
    cpu_gateway_cores: f64,
    cpu_process_cores: f64,
    rounds_in_window: u64,
    stats: meridian_gateway::runtime::stats::Stats,
    submitted: usize,
    offered: usize,
    submit_to_offer: Vec<Duration>,
    post: Vec<Duration>,
    gang_offers: u64,
    leases_in_window: u64,
    quotes: u64,
    rss_mib: u64,
}

async fn run(scale: &Scale, gateway_runtime: tokio::runtime::Handle) -> Result<Measured> {
    let base = std::env::var_os("MERIDIAN_BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    std::fs::create_dir_all(&base)?;
    let dir = tempfile::tempdir_in(&base)?;
    println!("store: {}", dir.path().display());

    let config = bench_config();
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path())?);
    let (stop_gateway, stop_rx) = watch::channel(false);
    let (bound_tx, bound_rx) = oneshot::channel();
    let gateway = gateway_runtime.spawn(server::serve(
        config,
        store,
        async move {
            let mut stop_rx = stop_rx;
            let _ = stop_rx.wait_for(|s| *s).await;
        },
        move |addrs, handle| {
            let _ = bound_tx.send((addrs, handle));
        },
    ));
    let (addrs, handle): (server::BoundAddrs, Handle) = bound_rx.await?;

    // Agents connect spread over one report interval, so their heartbeats are spread too.
    let shared = Arc::new(Shared::default());
    let (stop_agents, stop_agents_rx) = watch::channel(false);
    let mut agents = JoinSet::new();
    let started = Instant::now();
    for index in 0..scale.agents {
        let agent = FakeAgent::new(index, Arc::clone(&shared));
        let delay = REPORT_EVERY.mul_f64(index as f64 / scale.agents as f64);
        let stop = stop_agents_rx.clone();
        agents.spawn(async move {
            tokio::time::sleep(delay).await;
            agent.run(addrs.grpc, stop).await
        });
    }
    while shared.welcomed.load(Ordering::Relaxed) < scale.agents {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("only {} agents welcomed after 60 s", shared.welcomed.load(Ordering::Relaxed)).into());
        }
        if let Some(Ok(Err(e))) = agents.try_join_next() {
            return Err(format!("an agent failed while connecting: {e}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{} agents connected in {:.1} s", scale.agents, started.elapsed().as_secs_f64());

    let started = Instant::now();
    preload(addrs.rest, scale.queued).await?;
    let preload_took = started.elapsed();
    println!("{} gangs queued over REST in {:.1} s", scale.queued, preload_took.as_secs_f64());
    // Two rounds with the full queue before the window opens.
    let rounds = handle.stats().round_secs.count;
    let settle = Instant::now();
    while handle.stats().round_secs.count < rounds + 2 && settle.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The window.
    let rounds_before = handle.stats().round_secs.count;
    let leases_before = shared.leases.load(Ordering::Relaxed);
    let cpu_before = cpu_ticks()?;
    let window_started = Instant::now();
    let mut pending = submit_steadily(addrs.rest, scale.window).await;
    let window = window_started.elapsed();
    let cpu_after = cpu_ticks()?;
    let stats = handle.stats();
    let leases_in_window = shared.leases.load(Ordering::Relaxed) - leases_before;
    let rss_mib = rss_mib()?;
    let mut submits = Vec::new();
    while let Some(result) = pending.join_next().await {
        submits.push(result??);
    }

    // Offers for the window's last jobs may still be on their way; wait for them (not measured).
    let drain = Instant::now();
    loop {
        let offered = shared.offered_count(submits.iter().map(|s| s.id.as_str()));
        if offered == submits.len() || drain.elapsed() > Duration::from_secs(20) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut submit_to_offer = Vec::new();
    let mut post = Vec::new();
    {
        let offers = shared.offers.lock().map_err(|_| "offer log poisoned")?;
        for submit in &submits {
            post.push(submit.answered);
            if let Some(offered_at) = offers.get(&submit.id) {
                submit_to_offer.push(offered_at.saturating_duration_since(submit.sent));
            }
        }
    }
    submit_to_offer.sort();
    post.sort();

    let _ = stop_agents.send(true);
    while let Some(result) = agents.join_next().await {
        if let Ok(Err(e)) = result {
            println!("an agent ended with an error: {e}");
        }
    }
    let _ = stop_gateway.send(true);
    gateway.await??;

    let ticks_per_sec = 100.0; // CLK_TCK on Linux (`getconf CLK_TCK`).
    let secs = window.as_secs_f64();
    Ok(Measured {
        preload: preload_took,
        cpu_gateway_cores: (cpu_after.gateway - cpu_before.gateway) as f64 / ticks_per_sec / secs,
        cpu_process_cores: (cpu_after.process - cpu_before.process) as f64 / ticks_per_sec / secs,
        rounds_in_window: stats.round_secs.count - rounds_before,
        stats,
        submitted: submits.len(),
        offered: submit_to_offer.len(),
        submit_to_offer,
        post,
        gang_offers: shared.gang_offers.load(Ordering::Relaxed),
        leases_in_window,
        quotes: shared.quotes.load(Ordering::Relaxed),
        rss_mib,
    })
}

// ---------------------------------------------------------------- REST load

/// `count` gangs over `PRELOAD_CLIENTS` keep-alive connections.
async fn preload(rest: SocketAddr, count: usize) -> Result<()> {
    let mut clients = JoinSet::new();
    for client in 0..PRELOAD_CLIENTS {
        let share = count / PRELOAD_CLIENTS + usize::from(client < count % PRELOAD_CLIENTS);
        clients.spawn(async move {
            let mut conn = Conn::open(rest).await?;
            for _ in 0..share {
                let (status, body) = conn.send(Method::POST, "/v1/jobs", Some(GANG_SPEC)).await?;
                if status != StatusCode::CREATED {
                    return Err::<(), Error>(
                        format!("gang submit answered {status}: {}", String::from_utf8_lossy(&body)).into(),
                    );
                }
            }
            Ok(())
        });
    }
    while let Some(result) = clients.join_next().await {
        result??;
    }
    Ok(())
}

/// One small job submitted during the window.
struct Submitted {
    id: String,
    /// Just before the client connected and sent the `POST`.
    sent: Instant,
    /// `POST` → `201`.
    answered: Duration,
}

/// Submits `SMALL_SPEC` at `SUBMIT_RATE` per second for `window`, each on its own connection
/// and task, so a slow answer never delays the next submit. Returns the submits still under way.
async fn submit_steadily(rest: SocketAddr, window: Duration) -> JoinSet<Result<Submitted>> {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / SUBMIT_RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut submits = JoinSet::new();
    while started.elapsed() < window {
        tick.tick().await;
        submits.spawn(async move {
            let sent = Instant::now();
            let mut conn = Conn::open(rest).await?;
            let (status, body) = conn.send(Method::POST, "/v1/jobs", Some(SMALL_SPEC)).await?;
            let answered = sent.elapsed();
            if status != StatusCode::CREATED {
                return Err::<Submitted, Error>(
                    format!("small submit answered {status}: {}", String::from_utf8_lossy(&body)).into(),
                );
            }
            let job: serde_json::Value = serde_json::from_slice(&body)?;
            let id = job["id"].as_str().ok_or("a 201 without an id")?.to_string();
            Ok(Submitted { id, sent, answered })
        });
    }
    submits
}

// ---------------------------------------------------------------- the fake agent

/// What the fake agents tell the bench.
#[derive(Default)]
struct Shared {
    /// Agents that got their welcome.
    welcomed: AtomicUsize,
    /// When each job's first offer arrived at an agent.
    offers: Mutex<HashMap<String, Instant>>,
    /// Offers of multi-replica jobs (the queued gangs): should stay 0.
    gang_offers: AtomicU64,
    /// Lease renewals received.
    leases: AtomicU64,
    /// Start quote requests received.
    quotes: AtomicU64,
}

impl Shared {
    fn offered_count<'a>(&self, ids: impl Iterator<Item = &'a str>) -> usize {
        self.offers.lock().map_or(0, |offers| ids.filter(|id| offers.contains_key(*id)).count())
    }
}

/// A job the fake agent holds.
struct Held {
    token: u64,
    state: JobState,
    gpus_per_replica: u32,
    /// Node index of each replica.
    nodes: Vec<usize>,
    /// When a running job finishes.
    ends_at: Option<tokio::time::Instant>,
}

/// A member agent reduced to its protocol: one cluster of two 8×H100 nodes, of which the member's
/// own work holds 4 GPUs of node 0. It accepts an offer when the gang fits its free GPUs (best
/// fit per replica), reports the new inventory, the acceptance and `Running`; finishes each job
/// after `JOB_RUNS` (`Succeeded`, kept and repeated in heartbeats until `Ack`); stops a binding on
/// `Cancel`; and every `REPORT_EVERY` sends a heartbeat listing every job it holds, its inventory
/// and its queue pressure. It never reconnects: a dropped stream ends the agent with an error.
struct FakeAgent {
    hello: AgentHello,
    shared: Arc<Shared>,
    free: [u32; 2],
    held: HashMap<String, Held>,
    seq: u64,
}

impl FakeAgent {
    fn new(index: usize, shared: Arc<Shared>) -> Self {
        let info = ClusterInfo {
            name: format!("member-{index:04}"),
            region: REGIONS[index % REGIONS.len()].to_string(),
            tier: Tier::Owned,
            backend: BackendKind::Builtin,
            prices: [("h100".to_string(), 2.0)].into_iter().collect(),
            supports_containers: true,
            supports_bare_commands: true,
            labels: Default::default(),
        };
        let hello =
            AgentHello { info, instance_id: format!("bench-{index:04}"), agent_version: "bench-fake".to_string() };
        Self { hello, shared, free: [NODE_GPUS - LOCAL_GPUS, NODE_GPUS], held: HashMap::new(), seq: 0 }
    }

    async fn run(mut self, grpc: SocketAddr, mut stop: watch::Receiver<bool>) -> Result<()> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))?
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await?;
        let mut client = pb::federation_client::FederationClient::new(channel);
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(1024);
        // The gateway answers the call only after the hello, so it is queued first.
        tx.send(pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(&self.hello))) }).await?;
        let mut inbound = client.attach(ReceiverStream::new(rx)).await?.into_inner();
        let mut out = Outbound(tx);
        out.send(AgentEvent::Inventory(self.inventory())).await?;
        out.send(AgentEvent::Pressure(self.pressure())).await?;
        let mut report = tokio::time::interval(REPORT_EVERY);
        report.tick().await;
        loop {
            let next_end = self.held.values().filter_map(|h| h.ends_at).min();
            tokio::select! {
                message = inbound.next() => {
                    let Some(message) = message else { return Err("the gateway closed the stream".into()) };
                    let command = GatewayCommand::try_from(message?)?;
                    self.on_command(command, &mut out).await?;
                }
                _ = report.tick() => self.report(&mut out).await?,
                () = sleep_until(next_end) => self.finish_due(&mut out).await?,
                // The guard `wait_for` returns is dropped inside, so the task stays `Send`.
                () = async { let _ = stop.wait_for(|s| *s).await; } => return Ok(()),
            }
        }
    }

    async fn on_command(&mut self, command: GatewayCommand, out: &mut Outbound) -> Result<()> {
        match command {
            GatewayCommand::Welcome { .. } => {
                // A fresh agent holds nothing, so there is nothing to reconcile.
                self.shared.welcomed.fetch_add(1, Ordering::Relaxed);
            }
            GatewayCommand::Offer(assignment) => {
                if let Ok(mut offers) = self.shared.offers.lock() {
                    offers.entry(assignment.job_id.clone()).or_insert_with(Instant::now);
                }
                if assignment.spec.gang.replicas > 1 {
                    self.shared.gang_offers.fetch_add(1, Ordering::Relaxed);
                }
                self.on_offer(assignment, out).await?;
            }
            GatewayCommand::Cancel { job_id, fencing_token } => {
                if let Some(held) = self.held.get_mut(&job_id).filter(|h| h.token == fencing_token)
                    && !held.state.is_terminal()
                {
                    held.state = JobState::Cancelled;
                    held.ends_at = None;
                    let (gpus, nodes) = (held.gpus_per_replica, std::mem::take(&mut held.nodes));
                    self.release(gpus, &nodes);
                    out.send(AgentEvent::Inventory(self.inventory())).await?;
                    if let Some(held) = self.held.get(&job_id) {
                        out.send(AgentEvent::Status(report_of(&job_id, held))).await?;
                    }
                }
            }
            GatewayCommand::Ack { job_id, fencing_token } => {
                if self.held.get(&job_id).is_some_and(|h| h.token == fencing_token && h.state.is_terminal()) {
                    self.held.remove(&job_id);
                }
            }
            GatewayCommand::Lease { .. } => {
                self.shared.leases.fetch_add(1, Ordering::Relaxed);
            }
            // The bench never asks for output.
            GatewayCommand::Logs { .. } => {}
            // A bench agent has no plan to quote from; its answer still makes the round trip, and
            // the gateway falls back to its own estimate as with any backend that gives none.
            GatewayCommand::Quote { request_id, .. } => {
                self.shared.quotes.fetch_add(1, Ordering::Relaxed);
                out.send(AgentEvent::Quote { request_id, result: Err("a bench agent gives no start quotes".into()) })
                    .await?;
            }
            // The bench runs with sibling copies off; a bench agent has no start gate.
            GatewayCommand::Copy { copy_token, assignment } => {
                let reason = "a bench agent holds no sibling copies".to_string();
                let job_id = assignment.job_id;
                out.send(AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported: true }).await?;
            }
            GatewayCommand::Grant { assignment, .. } => self.on_offer(assignment, out).await?,
            GatewayCommand::DropCopy { .. } => {}
        }
        Ok(())
    }

    async fn on_offer(&mut self, assignment: Assignment, out: &mut Outbound) -> Result<()> {
        let Assignment { job_id, fencing_token, spec, .. } = assignment;
        if let Some(held) = self.held.get(&job_id) {
            // The same binding again: accept again. An older one: this fake never sees that.
            let accepted = held.token == fencing_token;
            let reason = if accepted { String::new() } else { "another binding is held".to_string() };
            return out
                .send(AgentEvent::OfferReply { job_id, fencing_token, accepted, reason, permanent: false })
                .await;
        }
        let gpus = spec.gang.resources.gpus;
        let Some(nodes) = self.fit(spec.gang.replicas, gpus) else {
            let reason = format!("{} × {gpus} GPUs do not fit the free GPUs {:?}", spec.gang.replicas, self.free);
            return out
                .send(AgentEvent::OfferReply { job_id, fencing_token, accepted: false, reason, permanent: false })
                .await;
        };
        let ends_at = Some(tokio::time::Instant::now() + JOB_RUNS);
        let held = Held { token: fencing_token, state: JobState::Running, gpus_per_replica: gpus, nodes, ends_at };
        let running = report_of(&job_id, &held);
        self.held.insert(job_id.clone(), held);
        // Inventory first, so the gateway never sees the acceptance without the GPUs taken.
        out.send(AgentEvent::Inventory(self.inventory())).await?;
        out.send(AgentEvent::OfferReply {
            job_id,
            fencing_token,
            accepted: true,
            reason: String::new(),
            permanent: false,
        })
        .await?;
        out.send(AgentEvent::Status(running)).await
    }

    /// Takes GPUs for `replicas` × `gpus`, each replica on the fullest node it fits; None (and
    /// nothing taken) when the gang does not fit now.
    fn fit(&mut self, replicas: u32, gpus: u32) -> Option<Vec<usize>> {
        let mut free = self.free;
        let mut nodes = Vec::new();
        for _ in 0..replicas {
            let node = (0..free.len()).filter(|&n| free[n] >= gpus).min_by_key(|&n| free[n])?;
            free[node] -= gpus;
            nodes.push(node);
        }
        self.free = free;
        Some(nodes)
    }

    fn release(&mut self, gpus: u32, nodes: &[usize]) {
        for &node in nodes {
            if let Some(free) = self.free.get_mut(node) {
                *free = (*free + gpus).min(NODE_GPUS);
            }
        }
    }

    async fn finish_due(&mut self, out: &mut Outbound) -> Result<()> {
        let now = tokio::time::Instant::now();
        let due: Vec<String> =
            self.held.iter().filter(|(_, h)| h.ends_at.is_some_and(|t| t <= now)).map(|(id, _)| id.clone()).collect();
        for id in &due {
            let Some(held) = self.held.get_mut(id) else { continue };
            held.state = JobState::Succeeded;
            held.ends_at = None;
            let (gpus, nodes) = (held.gpus_per_replica, held.nodes.clone());
            self.release(gpus, &nodes);
        }
        out.send(AgentEvent::Inventory(self.inventory())).await?;
        for id in &due {
            if let Some(held) = self.held.get(id) {
                out.send(AgentEvent::Status(report_of(id, held))).await?;
            }
        }
        Ok(())
    }

    async fn report(&mut self, out: &mut Outbound) -> Result<()> {
        self.seq += 1;
        let jobs = self.held.iter().map(|(id, held)| report_of(id, held)).collect();
        out.send(AgentEvent::Heartbeat { seq: self.seq, jobs }).await?;
        out.send(AgentEvent::Inventory(self.inventory())).await?;
        out.send(AgentEvent::Pressure(self.pressure())).await
    }

    fn inventory(&self) -> Inventory {
        let node = |gpus: u32| NodeFree {
            gpus,
            cpu: NODE_CPU * gpus / NODE_GPUS,
            memory_gib: NODE_MEMORY_GIB * gpus / NODE_GPUS,
        };
        Inventory {
            shapes: vec![NodeShape {
                name: "dgx-h100".to_string(),
                gpu_type: "h100".to_string(),
                gpu_memory_gib: 80,
                gpus_per_node: NODE_GPUS,
                cpu_per_node: NODE_CPU,
                memory_gib_per_node: NODE_MEMORY_GIB,
                free: self.free.iter().map(|&gpus| node(gpus)).collect(),
                labels: Default::default(),
            }],
        }
    }

    fn pressure(&self) -> QueuePressure {
        let total = NODE_GPUS * 2;
        let free: u32 = self.free.iter().sum();
        QueuePressure {
            queues: vec![QueueLoad {
                queue: "default".into(),
                weight: 1.0,
                pending_jobs: 0,
                pending_gpus: 0,
                running_gpus: total - free,
            }],
            // The member's own job gives its 4 GPUs back in an hour.
            releases: vec![GpuRelease { after_secs: 3600, gpus: LOCAL_GPUS }],
            estimated_wait_secs: 0,
            preemptible: Vec::new(),
        }
    }
}

fn report_of(job_id: &str, held: &Held) -> JobReport {
    JobReport {
        job_id: job_id.to_string(),
        fencing_token: held.token,
        state: held.state,
        message: String::new(),
        nodes: held.nodes.iter().map(|n| format!("node-{n}")).collect(),
        requeue: false,
        preempted: false,
        usage: None,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The agent's half of the stream, in domain types.
struct Outbound(mpsc::Sender<pb::AgentMessage>);

impl Outbound {
    async fn send(&mut self, event: AgentEvent) -> Result<()> {
        self.0.send(pb::AgentMessage::from(&event)).await.map_err(|_| "the agent stream closed".into())
    }
}

// ---------------------------------------------------------------- measuring

/// CPU ticks (utime + stime) of the gateway's threads and of the whole process.
struct Ticks {
    gateway: u64,
    process: u64,
}

fn cpu_ticks() -> Result<Ticks> {
    let mut ticks = Ticks { gateway: 0, process: 0 };
    for entry in std::fs::read_dir("/proc/self/task")? {
        // A thread may exit between listing and reading; it is then not counted.
        let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else { continue };
        let Some((comm, used)) = parse_stat(&stat) else { continue };
        ticks.process += used;
        if comm == GATEWAY_THREAD {
            ticks.gateway += used;
        }
    }
    Ok(ticks)
}

/// `comm` and utime + stime from a `/proc/<pid>/task/<tid>/stat` line.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    // After the comm: state (field 3), ..., utime (field 14), stime (field 15).
    let mut fields = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

fn rss_mib() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).ok_or("statm")?.parse()?;
    Ok(pages * 4096 / (1024 * 1024))
}

// ---------------------------------------------------------------- profile

/// Where a round's time goes, timed directly on `meridian_placement` over a snapshot of the same
/// clusters the fake agents report.
struct Profile {
    snapshot_build: Duration,
    gang_place: Vec<Duration>,
    small_place: Vec<Duration>,
    round_jobs: usize,
    round: Duration,
    candidate_bytes: usize,
    /// Candidates a queued gang's kept (compacted) decision lists.
    kept_candidates: usize,
}

fn profile(scale: &Scale) -> Result<Profile> {
    let fresh: Vec<FakeAgent> = (0..scale.agents).map(|i| FakeAgent::new(i, Arc::new(Shared::default()))).collect();
    let build = || {
        let clusters = fresh
            .iter()
            .map(|a| ClusterSnapshot::new(a.hello.info.clone(), a.inventory(), a.pressure(), true))
            .collect();
        FederationSnapshot::new(clusters, NetworkTable::default_seeded())
    };
    let mut builds = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        std::hint::black_box(build());
        builds.push(started.elapsed());
    }
    builds.sort();
    let snapshot = build();
    let config = PlacementConfig::default();
    let catalog = GpuCatalog::default();
    let gang = parse_job_spec(GANG_SPEC, &catalog)?;
    let small = parse_job_spec(SMALL_SPEC, &catalog)?;
    let time_place = |job: &meridian_proto::spec::JobSpec| {
        let mut took: Vec<Duration> = (0..200)
            .map(|_| {
                let started = Instant::now();
                drop(std::hint::black_box(meridian_placement::place(job, &snapshot, &config)));
                started.elapsed()
            })
            .collect();
        took.sort();
        took
    };
    let gang_place = time_place(&gang);
    let small_place = time_place(&small);

    // One round as the core runs it (holds, then `Holds::place` per queued gang in order, the
    // previous round's decision replaced and freed), for a tenth of the queue, timed on a
    // second pass so it frees the first pass's decisions as the core does.
    let round_jobs = (scale.queued / 10).max(1);
    let ids: Vec<String> = (0..round_jobs).map(|i| format!("j-{i:06}")).collect();
    let mut decisions: Vec<Option<meridian_placement::Decision>> = vec![None; round_jobs];
    let mut round = Duration::ZERO;
    for _ in 0..2 {
        let mut snapshot = snapshot.clone();
        let started = Instant::now();
        let holds = Holds::for_round(ids.iter().map(|id| (id.clone(), &gang, 0.0)), &snapshot, &config, 0.0);
        for (id, slot) in ids.iter().zip(decisions.iter_mut()) {
            // Kept as the core keeps a queued job's decision: compacted.
            *slot = Some(
                holds.place(&mut snapshot, id, &gang, 0.0, &config, 0.0).compact(meridian_placement::KEPT_FEASIBLE),
            );
        }
        round = started.elapsed();
    }
    Ok(Profile {
        snapshot_build: percentile(&builds, 0.5),
        gang_place,
        small_place,
        round_jobs,
        round,
        candidate_bytes: std::mem::size_of::<meridian_placement::Candidate>(),
        kept_candidates: decisions.iter().flatten().map(|d| d.candidates.len()).max().unwrap_or(0),
    })
}

// ---------------------------------------------------------------- report

fn report(scale: &Scale, m: &Measured, p: &Profile) {
    let window = scale.window.as_secs_f64();
    let rounds = &m.stats.round_secs;
    let commits = &m.stats.commit_secs;
    let records = &m.stats.commit_records;
    println!();
    println!(
        "{} agents (one HTTP/2 connection each), {} gangs queued (preload {:.1} s), {} s window, {SUBMIT_RATE} small submits/s",
        scale.agents,
        scale.queued,
        m.preload.as_secs_f64(),
        scale.window.as_secs()
    );
    println!();
    println!("| measure | value | aim |");
    println!("| --- | ---: | --- |");
    println!("| gateway CPU (`gw` threads), cores | {:.2} | < 1 |", m.cpu_gateway_cores);
    println!("| whole process CPU (gateway + load generator), cores | {:.2} | |", m.cpu_process_cores);
    println!(
        "| placement rounds in window (per s) | {} ({:.2}/s) | |",
        m.rounds_in_window,
        m.rounds_in_window as f64 / window
    );
    println!(
        "| round p50 / p99 / max, ms (last {} of {} rounds) | {:.0} / {:.0} / {:.0} | < 200 |",
        rounds.count.min(4096),
        rounds.count,
        rounds.quantile(0.5) * 1e3,
        rounds.quantile(0.99) * 1e3,
        rounds.max() * 1e3
    );
    println!(
        "| group commit p50 / p99, ms ({} commits) | {:.1} / {:.1} | |",
        commits.count,
        commits.quantile(0.5) * 1e3,
        commits.quantile(0.99) * 1e3
    );
    println!(
        "| records per commit p50 / p99 / max | {:.0} / {:.0} / {:.0} | |",
        records.quantile(0.5),
        records.quantile(0.99),
        records.max()
    );
    println!(
        "| commands per batch p50 / p99 / max | {:.0} / {:.0} / {:.0} | |",
        m.stats.batch_commands.quantile(0.5),
        m.stats.batch_commands.quantile(0.99),
        m.stats.batch_commands.max()
    );
    println!(
        "| submit → offer p50 / p99, ms ({} of {} offered) | {:.0} / {:.0} | p99 < 100 |",
        m.offered,
        m.submitted,
        ms(percentile(&m.submit_to_offer, 0.5)),
        ms(percentile(&m.submit_to_offer, 0.99))
    );
    println!(
        "| POST → 201 p50 / p99, ms | {:.0} / {:.0} | |",
        ms(percentile(&m.post, 0.5)),
        ms(percentile(&m.post, 0.99))
    );
    println!(
        "| lease renewals in window (expected ≈ {:.0}) | {} | |",
        scale.agents as f64 * window / 2.0,
        m.leases_in_window
    );
    println!("| offers of queued gangs (should be 0) | {} | |", m.gang_offers);
    println!("| start quotes asked of the agents (whole run) | {} | |", m.quotes);
    println!("| resident memory at window end, MiB | {} | |", m.rss_mib);
    println!();
    println!("Profile: `meridian_placement` alone over the same {} clusters", scale.agents);
    println!();
    println!("| call | p50 | p99 |");
    println!("| --- | ---: | ---: |");
    println!("| build the snapshot (`ClusterSnapshot::new` × {}) | {:.2} ms | |", scale.agents, ms(p.snapshot_build));
    println!(
        "| `place` one queued gang (incl. freeing the decision) | {:.0} µs | {:.0} µs |",
        ms(percentile(&p.gang_place, 0.5)) * 1e3,
        ms(percentile(&p.gang_place, 0.99)) * 1e3
    );
    println!(
        "| `place` one 1-GPU job | {:.0} µs | {:.0} µs |",
        ms(percentile(&p.small_place, 0.5)) * 1e3,
        ms(percentile(&p.small_place, 0.99)) * 1e3
    );
    println!(
        "| a round's placement of {} gangs (`Holds::place`, old decisions freed) | {:.0} ms | → {:.0} ms for {} |",
        p.round_jobs,
        ms(p.round),
        ms(p.round) * scale.queued as f64 / p.round_jobs as f64,
        scale.queued
    );
    println!(
        "\nA decision lists one `Candidate` ({} bytes) per cluster; a queued job keeps it compacted to {} of the {} \
         (`Decision::compact`): {} queued decisions hold about {:.1} MiB of candidates (uncompacted: {:.0} MiB).",
        p.candidate_bytes,
        p.kept_candidates,
        scale.agents,
        scale.queued,
        (p.candidate_bytes * p.kept_candidates * scale.queued) as f64 / (1024.0 * 1024.0),
        (p.candidate_bytes * scale.agents * scale.queued) as f64 / (1024.0 * 1024.0)
    );
}
