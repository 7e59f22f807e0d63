//! The gateway core: jobs, their life cycle, the placement loop, and the agent streams.
//!
//! All mutable state sits in one `State` behind a mutex that is never held across an `.await`;
//! every API (REST, gRPC) and every agent stream calls the same [`Gateway`] methods, so a job
//! looks the same whichever way it is touched.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::ClusterInfo;
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::selector::Selector;
use meridian_proto::spec::JobSpec;
use meridian_proto::validate::{SpecError, parse_job_spec};
use serde::Serialize;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::config::GatewayConfig;
use crate::dispatch;
use crate::placement::{self, Decision, Holds};
use crate::queue::{FairQueue, QueuedJob};
use crate::registry::{AgentLink, ClusterSummary, Registry};
use crate::store::{self, JobRecord, Store};

/// Why an API call failed. [`crate::api::respond`] maps each variant to one HTTP status and one
/// gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The spec is malformed or invalid; names every field at fault.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// No known cluster could ever run the job, whatever it waits for.
    #[error("no cluster could ever run this job: {}", .reasons.iter().map(|(c, r)| format!("{c}: {r}")).collect::<Vec<_>>().join("; "))]
    NeverFits {
        /// Per cluster, why not.
        reasons: Vec<(String, String)>,
    },
    /// The idempotency key was used before for a different spec.
    #[error("idempotencyKey `{key}` was already used by job {existing} with a different spec")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The job that holds it.
        existing: String,
    },
    /// No job with that id.
    #[error("no job `{0}`")]
    NotFound(String),
    /// A request parameter is wrong.
    #[error("{field}: {reason}")]
    BadRequest {
        /// The parameter.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The gateway could not make the change durable.
    #[error("the gateway could not save the change: {0}")]
    Storage(#[from] store::Error),
    /// Internal invariant broken (e.g. a poisoned lock).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Module result type.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

/// Filters of `GET /v1/jobs`.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only this tenant's jobs.
    pub tenant: Option<String>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs whose labels match.
    pub selector: Option<Selector>,
}

/// Why a job is where it is, for `GET /v1/jobs/{id}/explain`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The job.
    pub job_id: String,
    /// Its state now.
    pub state: JobState,
    /// Its cluster, if any.
    pub cluster: Option<String>,
    /// When the decision shown was made (Unix ms), if one was made since the gateway started.
    pub decided_at_ms: Option<i64>,
    /// One sentence with numbers.
    pub summary: String,
    /// Every cluster considered, with its verdict.
    pub candidates: Vec<CandidateView>,
}

/// One cluster's verdict in an explanation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateView {
    /// Cluster name.
    pub cluster: String,
    /// Its region.
    pub region: String,
    /// `owned` or `cloud`.
    pub tier: meridian_proto::inventory::Tier,
    /// `chosen`, `feasible` or `rejected`.
    pub verdict: &'static str,
    /// Why not (rejected only), as sentences.
    pub reasons: Vec<String>,
    /// The score terms (feasible and chosen only).
    pub score: Option<placement::ScoreBreakdown>,
}

/// The latest placement decision of a job.
#[derive(Debug, Clone)]
pub(crate) struct Decided {
    pub(crate) at_ms: i64,
    pub(crate) decision: Decision,
}

/// Everything mutable, behind one lock.
pub(crate) struct State {
    pub(crate) jobs: BTreeMap<String, JobRecord>,
    pub(crate) idempotency: HashMap<(String, String), String>,
    pub(crate) decisions: HashMap<String, Decided>,
    pub(crate) registry: Registry,
    pub(crate) offered_at: HashMap<String, Instant>,
    /// Since when each `Unknown` job has been unknown.
    pub(crate) unknown_since: HashMap<String, Instant>,
}

pub(crate) struct Inner {
    pub(crate) config: GatewayConfig,
    pub(crate) catalog: GpuCatalog,
    /// Seeded defaults plus the configured overrides.
    pub(crate) network: crate::placement::NetworkTable,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) state: Mutex<State>,
    pub(crate) wake: Notify,
    next_connection: AtomicU64,
    id_sequence: AtomicU64,
}

/// The gateway: cheap to clone, shared by every API adapter and agent stream.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) inner: Arc<Inner>,
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Gateway {
    /// Loads jobs and known clusters from `store` and builds the gateway.
    pub fn new(config: GatewayConfig, store: Arc<dyn Store>) -> Result<Self, store::Error> {
        let jobs = store::load_jobs(store.as_ref())?;
        let known = store::load_clusters(store.as_ref())?;
        let mut idempotency = HashMap::new();
        for job in &jobs {
            if let Some(key) = &job.spec.idempotency_key {
                idempotency.insert((job.spec.tenant.clone(), key.clone()), job.id.clone());
            }
        }
        let now = Instant::now();
        let mut jobs: BTreeMap<String, JobRecord> = jobs.into_iter().map(|j| (j.id.clone(), j)).collect();
        // After a restart no agent is connected yet: offers in flight are void (the agent will
        // not find them in its welcome and drops them), running jobs are unknown until reported.
        for job in jobs.values_mut() {
            match job.state {
                JobState::Offered => {
                    job.state = JobState::Queued;
                    job.cluster = None;
                    job.gpu_type = None;
                    job.message = "offer voided by a gateway restart".into();
                }
                JobState::Bound | JobState::Running => job.state = JobState::Unknown,
                _ => {}
            }
        }
        let unknown_since =
            jobs.values().filter(|j| j.state == JobState::Unknown).map(|j| (j.id.clone(), now)).collect();
        let state = State {
            jobs,
            idempotency,
            decisions: HashMap::new(),
            registry: Registry::from_known(known, now),
            offered_at: HashMap::new(),
            unknown_since,
        };
        let catalog = config.gpu_catalog();
        let network = config.network_table();
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                catalog,
                network,
                store,
                state: Mutex::new(state),
                wake: Notify::new(),
                next_connection: AtomicU64::new(1),
                id_sequence: AtomicU64::new(0),
            }),
        })
    }

    /// The configuration the gateway runs with.
    pub fn config(&self) -> &GatewayConfig {
        &self.inner.config
    }

    /// The region-pair network placement uses.
    pub fn network(&self) -> &crate::placement::NetworkTable {
        &self.inner.network
    }

    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.inner.state.lock().map_err(|_| ApiError::Internal("gateway state lock poisoned".into()))
    }

    fn new_job_id(&self) -> String {
        let seq = self.inner.id_sequence.fetch_add(1, Ordering::Relaxed);
        // RandomState is seeded randomly per process: enough to keep ids of two gateways apart.
        let salt = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), seq) as u16;
        format!("j-{:x}{:04x}{:02x}", now_ms(), salt, seq % 256)
    }

    /// Validates and stores a job. Returns the job and whether it was created (false: an earlier
    /// job with the same tenant and idempotency key).
    pub fn submit(&self, text: &str) -> Result<(JobRecord, bool)> {
        let spec = parse_job_spec(text, &self.inner.catalog)?;
        self.submit_spec(spec)
    }

    /// Stores an already validated spec (the gRPC path converts first, then lands here).
    pub fn submit_spec(&self, spec: JobSpec) -> Result<(JobRecord, bool)> {
        let mut state = self.lock()?;
        if let Some(key) = &spec.idempotency_key
            && let Some(existing) = state.idempotency.get(&(spec.tenant.clone(), key.clone()))
        {
            let job = state.jobs.get(existing).ok_or_else(|| ApiError::Internal("dangling idempotency key".into()))?;
            if job.spec != spec {
                return Err(ApiError::IdempotencyConflict { key: key.clone(), existing: existing.clone() });
            }
            return Ok((job.clone(), false));
        }
        let snapshot = state.registry.snapshot(&self.inner.network);
        if let Some(reasons) = placement::never_fits(&spec, &snapshot) {
            return Err(ApiError::NeverFits {
                reasons: reasons.into_iter().map(|(cluster, why)| (cluster, why.to_string())).collect(),
            });
        }
        let job = JobRecord {
            id: self.new_job_id(),
            spec,
            state: JobState::Queued,
            cluster: None,
            fencing_token: 0,
            message: "waiting for placement".into(),
            placement: None,
            submitted_at_ms: now_ms(),
            started_at_ms: None,
            finished_at_ms: None,
            gpu_type: None,
            nodes: Vec::new(),
        };
        // Durable before anyone hears of it.
        store::save_job(self.inner.store.as_ref(), &job)?;
        if let Some(key) = &job.spec.idempotency_key {
            state.idempotency.insert((job.spec.tenant.clone(), key.clone()), job.id.clone());
        }
        state.jobs.insert(job.id.clone(), job.clone());
        drop(state);
        self.inner.wake.notify_one();
        tracing::info!(job = %job.id, name = %job.spec.name, tenant = %job.spec.tenant, "job accepted");
        Ok((job, true))
    }

    /// Jobs matching `filter`, oldest first.
    pub fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>> {
        let state = self.lock()?;
        let mut jobs: Vec<JobRecord> = state
            .jobs
            .values()
            .filter(|j| filter.tenant.as_ref().is_none_or(|t| *t == j.spec.tenant))
            .filter(|j| filter.state.is_none_or(|s| s == j.state))
            .filter(|j| filter.selector.as_ref().is_none_or(|s| s.matches(&j.spec.labels)))
            .cloned()
            .collect();
        jobs.sort_by(|a, b| a.submitted_at_ms.cmp(&b.submitted_at_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(jobs)
    }

    /// One job.
    pub fn get(&self, id: &str) -> Result<JobRecord> {
        self.lock()?.jobs.get(id).cloned().ok_or_else(|| ApiError::NotFound(id.to_string()))
    }

    /// Cancels a job: a queued job stops at once; a placed one is stopped on its member.
    pub fn cancel(&self, id: &str) -> Result<JobRecord> {
        let mut state = self.lock()?;
        let state = &mut *state;
        let job = state.jobs.get_mut(id).ok_or_else(|| ApiError::NotFound(id.to_string()))?;
        if job.state.is_terminal() {
            return Ok(job.clone());
        }
        let mut updated = job.clone();
        updated.state = JobState::Cancelled;
        updated.finished_at_ms = Some(now_ms());
        updated.message = match &job.cluster {
            Some(cluster) if job.state != JobState::Queued => {
                let sent = state.registry.get(cluster).and_then(|c| c.link.as_ref()).is_some_and(|link| {
                    link.tx.try_send(Ok(dispatch::cancel_message(&job.id, job.fencing_token))).is_ok()
                });
                if sent {
                    format!("cancelled by user; stop sent to {cluster}")
                } else {
                    format!("cancelled by user; {cluster} is unreachable and will drop the job when it reconnects")
                }
            }
            _ => "cancelled by user before placement".into(),
        };
        store::save_job(self.inner.store.as_ref(), &updated)?;
        *job = updated.clone();
        state.offered_at.remove(id);
        state.unknown_since.remove(id);
        Ok(updated)
    }

    /// Why a job is where it is.
    pub fn explain(&self, id: &str) -> Result<Explanation> {
        let state = self.lock()?;
        let job = state.jobs.get(id).ok_or_else(|| ApiError::NotFound(id.to_string()))?;
        let decided = state.decisions.get(id);
        let candidates = decided.map(|d| candidate_views(&d.decision)).unwrap_or_default();
        let summary = match (job.state, decided, &job.placement) {
            (JobState::Queued, Some(d), _) => d.decision.summary.clone(),
            (JobState::Queued, None, _) => job.message.clone(),
            (_, _, Some(placement)) => placement.clone(),
            (_, _, None) => job.message.clone(),
        };
        Ok(Explanation {
            job_id: job.id.clone(),
            state: job.state,
            cluster: job.cluster.clone(),
            decided_at_ms: decided.map(|d| d.at_ms),
            summary,
            candidates,
        })
    }

    /// Member clusters with their last reports.
    pub fn clusters(&self) -> Result<Vec<ClusterSummary>> {
        let state = self.lock()?;
        let mut federated: BTreeMap<String, u32> = BTreeMap::new();
        for job in state.jobs.values() {
            if let (Some(cluster), true) = (&job.cluster, holds_gpus(job.state)) {
                *federated.entry(cluster.clone()).or_default() += 1;
            }
        }
        Ok(state.registry.summaries(Instant::now(), &federated))
    }

    /// Registers an agent stream after its hello. Returns the connection id and the welcome.
    pub(crate) fn connect_agent(
        &self,
        info: ClusterInfo,
        tx: mpsc::Sender<Result<pb::GatewayMessage, tonic::Status>>,
    ) -> Result<u64> {
        let connection = self.inner.next_connection.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock()?;
        let name = info.name.clone();
        let welcome = dispatch::welcome_message(state.jobs.values().filter(|j| {
            j.cluster.as_deref() == Some(name.as_str())
                && matches!(j.state, JobState::Bound | JobState::Running | JobState::Unknown)
        }));
        // A welcome that cannot be queued means the stream is already gone; the agent retries.
        let _ = tx.try_send(Ok(welcome));
        state.registry.connect(info, AgentLink { connection, tx }, Instant::now());
        tracing::info!(cluster = %name, connection, "agent connected");
        drop(state);
        self.inner.wake.notify_one();
        Ok(connection)
    }

    /// Handles one message from an agent.
    pub(crate) fn agent_message(&self, cluster: &str, connection: u64, message: pb::AgentMessage) -> Result<()> {
        let mut state = self.lock()?;
        let changed = dispatch::handle_agent_message(&self.inner, &mut state, cluster, connection, message)?;
        drop(state);
        if changed {
            self.inner.wake.notify_one();
        }
        Ok(())
    }

    /// Marks an agent stream closed: its offers go back to the queue and its jobs become Unknown.
    pub(crate) fn disconnect_agent(&self, cluster: &str, connection: u64) {
        if let Ok(mut state) = self.lock()
            && state.registry.disconnect(cluster, connection)
        {
            tracing::warn!(cluster, "agent disconnected");
            dispatch::cluster_lost(&self.inner, &mut state, cluster);
        }
        self.inner.wake.notify_one();
    }

    /// One round: expire offers and silent clusters, then place the queue.
    pub fn placement_round(&self) -> Result<()> {
        let mut state = self.lock()?;
        let now = Instant::now();
        dispatch::expire(&self.inner, &mut state, now);
        place_queue(&self.inner, &mut state);
        Ok(())
    }

    /// Runs placement rounds whenever something changes, and at least every
    /// `placement_interval`, until `shutdown` fires.
    pub async fn run_placement(self, mut shutdown: watch::Receiver<bool>) {
        let interval: Duration = self.inner.config.placement_interval.0;
        loop {
            if let Err(e) = self.placement_round() {
                tracing::error!(error = %e, "placement round failed");
            }
            tokio::select! {
                _ = self.inner.wake.notified() => {
                    // Coalesce bursts of wake-ups (a submit storm, many agent reports).
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// States in which a job holds (or is about to hold) GPUs on its cluster.
pub(crate) fn holds_gpus(state: JobState) -> bool {
    matches!(state, JobState::Offered | JobState::Bound | JobState::Running | JobState::Unknown)
}

fn candidate_views(decision: &Decision) -> Vec<CandidateView> {
    let chosen = decision.chosen.as_ref().map(|c| c.cluster.as_str());
    decision
        .candidates
        .iter()
        .map(|c| match &c.verdict {
            placement::Verdict::Rejected { reasons } => CandidateView {
                cluster: c.cluster.to_string(),
                region: c.region.to_string(),
                tier: c.tier,
                verdict: "rejected",
                reasons: reasons.iter().map(ToString::to_string).collect(),
                score: None,
            },
            placement::Verdict::Scored(score) => CandidateView {
                cluster: c.cluster.to_string(),
                region: c.region.to_string(),
                tier: c.tier,
                verdict: if chosen == Some(c.cluster.as_str()) { "chosen" } else { "feasible" },
                reasons: Vec::new(),
                score: Some(score.clone()),
            },
        })
        .collect()
}

/// Places queued jobs in fair-share order, offering each to its best cluster when it can start
/// there now (late binding: otherwise it stays queued and its decision explains why).
fn place_queue(inner: &Inner, state: &mut State) {
    let mut snapshot = state.registry.snapshot(&inner.network);
    let mut usage: BTreeMap<String, u32> = BTreeMap::new();
    let mut queued = Vec::new();
    for job in state.jobs.values() {
        if job.state == JobState::Offered {
            // The member's inventory does not show an offer until the agent accepts it.
            if let Some(cluster) =
                snapshot.clusters.iter_mut().find(|c| Some(c.info().name.as_str()) == job.cluster.as_deref())
            {
                cluster.reserve(&job.spec);
            }
        }
        if holds_gpus(job.state) {
            *usage.entry(job.spec.tenant.clone()).or_default() += job.spec.total_gpus();
        }
        if job.state == JobState::Queued {
            queued.push(QueuedJob {
                id: job.id.clone(),
                tenant: job.spec.tenant.clone(),
                priority: job.spec.priority,
                submitted_at_ms: job.submitted_at_ms,
                gpus: job.spec.total_gpus(),
            });
        }
    }
    if queued.is_empty() {
        return;
    }
    let at_ms = now_ms();
    let now_secs = at_ms as f64 / 1000.0;
    let config = &inner.config.placement;
    let waited = |submitted_at_ms: i64| (at_ms.saturating_sub(submitted_at_ms) as f64 / 1000.0).max(0.0);
    let mut oldest: Vec<&QueuedJob> = queued.iter().collect();
    oldest.sort_by(|a, b| a.submitted_at_ms.cmp(&b.submitted_at_ms).then_with(|| a.id.cmp(&b.id)));
    let oldest_first = oldest.into_iter().filter_map(|next| {
        let job = state.jobs.get(&next.id)?;
        Some((next.id.clone(), &job.spec, waited(next.submitted_at_ms)))
    });
    let holds = Holds::for_round(oldest_first, &snapshot, config, now_secs);
    let mut queue = FairQueue::new(queued, &usage, |t| inner.config.tenant_weight(t));
    while let Some(next) = queue.pop_next() {
        let Some(job) = state.jobs.get(&next.id) else { continue };
        let decision = holds.place(&mut snapshot, &next.id, &job.spec, waited(next.submitted_at_ms), config, now_secs);
        if let Some(choice) = decision.chosen.as_ref().filter(|c| c.starts_now) {
            let (cluster, gpu_type) = (choice.cluster.clone(), choice.gpu_type.clone());
            if let Some(target) = snapshot.clusters.iter_mut().find(|c| *c.name() == cluster) {
                target.reserve(&job.spec);
            }
            queue.placed(&next);
            dispatch::offer(inner, state, &next.id, &cluster, &gpu_type, &decision.summary);
        }
        state.decisions.insert(next.id.clone(), Decided { at_ms, decision });
    }
}

/// Addresses the gateway listens on (after binding port 0, the real ports).
#[derive(Debug, Clone, Copy)]
pub struct BoundAddrs {
    /// REST/JSON API.
    pub rest: SocketAddr,
    /// gRPC (agents and the Jobs service).
    pub grpc: SocketAddr,
}

/// Binds both listeners, then serves REST, gRPC and the placement loop until `shutdown`
/// resolves. `on_bound` hears the real addresses before serving starts.
pub async fn serve(
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(BoundAddrs),
) -> std::io::Result<()> {
    let config = gateway.config().clone();
    let rest_listener = tokio::net::TcpListener::bind(config.listen).await?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_listen).await?;
    let addrs = BoundAddrs { rest: rest_listener.local_addr()?, grpc: grpc_listener.local_addr()? };
    on_bound(addrs);
    tracing::info!(rest = %addrs.rest, grpc = %addrs.grpc, "gateway listening");

    let (stop_tx, stop_rx) = watch::channel(false);
    let placement = tokio::spawn(gateway.clone().run_placement(stop_rx.clone()));
    let rest = tokio::spawn(crate::api::serve_rest(gateway.clone(), rest_listener, stop_rx.clone()));
    let grpc = tokio::spawn(crate::api::serve_grpc(gateway.clone(), grpc_listener, stop_rx.clone()));
    shutdown.await;
    tracing::info!("gateway shutting down");
    let _ = stop_tx.send(true);
    let (placement, rest, grpc) = tokio::join!(placement, rest, grpc);
    placement.map_err(std::io::Error::other)?;
    rest.map_err(std::io::Error::other)??;
    grpc.map_err(std::io::Error::other)??;
    Ok(())
}
