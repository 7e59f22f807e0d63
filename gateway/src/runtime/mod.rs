//! The runtime: one task owns the [`Core`], fed through a bounded channel; it commits what each
//! batch of inputs asks to persist as one group commit, publishes a read view, and only then
//! delivers the batch's sends and replies.
//!
//! Callers hold a [`Handle`]: writes go through the channel (and wait for their durable answer),
//! reads use the latest published [`ReadView`] without waiting on anything.

mod driver;
pub mod events;
mod logs;
mod shared;
pub mod stats;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meridian_core::{ConnId, Core, JobRecord, ReadView, Reply};
use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand, LogChunk};
use meridian_proto::spec::JobSpec;
use meridian_store::Store;
use shared::Shared;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use driver::now_ms;

/// How many commands one batch takes at most (one group commit).
pub const MAX_BATCH: usize = 4096;

/// Tuning of the driver loop. `Default` reads as the defaults.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Commands waiting for the core at most; senders wait beyond it (back-pressure).
    pub channel_capacity: usize,
    /// How often timers (offer and cluster timeouts, retention) are checked.
    pub tick_interval: Duration,
    /// A requested placement round waits at most this long for more changes to coalesce.
    pub round_coalesce: Duration,
    /// The queue is placed again at least this often (waits grow, burst gates open).
    pub placement_interval: Duration,
    /// Messages waiting for one agent stream at most; beyond it messages are dropped and
    /// counted, never the stream (see the driver).
    pub agent_buffer: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            channel_capacity: 8192,
            tick_interval: Duration::from_millis(500),
            round_coalesce: Duration::from_millis(20),
            placement_interval: Duration::from_secs(2),
            agent_buffer: 1024,
        }
    }
}

/// Why a call through the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The core refused it.
    #[error(transparent)]
    Core(#[from] meridian_core::Error),
    /// The runtime has stopped (shutting down).
    #[error("the gateway is shutting down")]
    Stopped,
    /// This gateway is a standby (or lost its leadership while the call waited): only the
    /// leader takes changes and agents. Nothing was changed; retry at the leader.
    #[error("{}", not_leader_text(leader.as_ref()))]
    NotLeader {
        /// The leader, when one is known.
        leader: Option<LeaderAddrs>,
    },
}

fn not_leader_text(leader: Option<&LeaderAddrs>) -> String {
    match leader {
        Some(leader) => format!(
            "this gateway is a standby; the leader is `{}` at {} (gRPC {}); nothing was changed, send it there",
            leader.name, leader.rest, leader.grpc
        ),
        None => "this gateway is a standby and no leader is elected right now; nothing was changed, retry shortly"
            .to_string(),
    }
}

/// Where the leader can be reached: what it advertises when it wins the election.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaderAddrs {
    /// The gateway's name (`ha.name`).
    pub name: String,
    /// Its REST base URL, e.g. `https://gw-1.example:8080`.
    pub rest: String,
    /// Its gRPC URL, e.g. `https://gw-1.example:50051`.
    pub grpc: String,
}

/// What this gateway process is right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// It steps the core, commits and talks to agents; `epoch` travels with every message to
    /// agents (0 for a gateway without election).
    Leader {
        /// The term's epoch.
        epoch: u64,
    },
    /// It answers reads from a view it follows from the store; writes and agents are refused
    /// with the leader's address.
    Standby {
        /// The leader, when one is known.
        leader: Option<LeaderAddrs>,
        /// Whether its view has been loaded from the store at least once.
        warm: bool,
    },
    /// Shutting down.
    Stopped,
}

/// Decides whether this gateway may still speak for its term. Checked before every message to
/// an agent: a leader whose lease may have run out sends nothing.
#[derive(Clone)]
pub struct Fence {
    epoch: u64,
    valid: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// Flips to true when the term's leadership is lost (None: never).
    lapse: Option<watch::Receiver<bool>>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence").field("epoch", &self.epoch).field("valid", &self.is_valid()).finish()
    }
}

impl Fence {
    /// The fence of a gateway without election: epoch 0, always valid.
    pub fn unelected() -> Fence {
        Fence { epoch: 0, valid: None, lapse: None }
    }

    /// The fence of an elected term: `valid` says whether the leadership still holds (it must
    /// turn false before another gateway can be elected); `lapse` flips to true when it is lost,
    /// so that streams end at that moment even when nothing is being sent.
    pub fn elected(epoch: u64, valid: Arc<dyn Fn() -> bool + Send + Sync>, lapse: watch::Receiver<bool>) -> Fence {
        Fence { epoch, valid: Some(valid), lapse: Some(lapse) }
    }

    /// Resolves when the term's leadership is lost (never for a gateway without election).
    pub async fn lapsed(&self) {
        match self.lapse.clone() {
            Some(mut lapse) => {
                if lapse.wait_for(|lost| *lost).await.is_err() {
                    // The leadership is gone with its watch: the term is over.
                }
            }
            None => std::future::pending().await,
        }
    }

    /// The term's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the term may still send.
    pub fn is_valid(&self) -> bool {
        self.valid.as_ref().is_none_or(|valid| valid())
    }
}

/// The current term as handles see it: where commands go (None between terms) and the role.
struct TermState {
    tx: Option<mpsc::Sender<Command>>,
    role: Role,
    fence: Fence,
}

/// Why a term ended (what [`Runtime::join`] answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermEnd {
    /// Shutdown was asked for (or every handle was dropped).
    Shutdown,
    /// The fence turned invalid: the leadership may have run out.
    LostLeadership,
    /// A commit failed; the term stopped rather than run on with memory ahead of the store.
    StoreFailed(String),
}

/// How long a logs request waits for the member's answer.
const LOGS_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a logs request failed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// The core refused it (unknown job, not placed yet, cluster not connected) or the gateway
    /// is stopping.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The member answered with an error (its own words).
    #[error("the member could not read the output: {0}")]
    Member(String),
    /// The member did not answer in time.
    #[error("the member holding job `{0}` did not send its output within 15s")]
    Timeout(String),
}

/// A request to the core, with where to send its answer.
pub(crate) enum Request {
    // Boxed: the channel holds thousands of requests and most are small.
    Submit(Box<JobSpec>),
    Cancel(String),
    Attach { conn: ConnId, hello: AgentHello, outbox: mpsc::Sender<GatewayCommand> },
    Agent { conn: ConnId, event: AgentEvent },
    Gone { conn: ConnId },
    Logs { job_id: String, request_id: u64, from: Option<u64>, max_bytes: u32 },
}

pub(crate) struct Command {
    request: Request,
    reply: Option<oneshot::Sender<Result<Reply, meridian_core::Error>>>,
}

/// Shared by every API adapter and agent stream; cheap to clone.
#[derive(Clone)]
pub struct Handle {
    term: Shared<Arc<TermState>>,
    view: Shared<Arc<ReadView>>,
    stats: Shared<stats::Stats>,
    next_conn: Arc<AtomicU64>,
    agent_buffer: usize,
    logs: Arc<logs::Waiting>,
    events: Arc<events::Hub>,
    events_wake: watch::Receiver<u64>,
    /// Taken (set to None) at shutdown: once the running term's driver has dropped its copy
    /// too, every event subscription ends, which is how watchers learn the gateway stopped.
    publisher: Shared<Option<Arc<events::Publisher>>>,
    config: RuntimeConfig,
}

/// The running driver: await [`Runtime::join`] after shutdown.
pub struct Runtime {
    task: JoinHandle<TermEnd>,
}

impl Runtime {
    /// Starts the driver task over `core` and `store` for a gateway without election (epoch 0,
    /// always the leader); it runs until `shutdown` flips to true (or every handle is dropped).
    pub fn start(
        mut core: Core,
        store: Arc<dyn Store>,
        config: RuntimeConfig,
        shutdown: watch::Receiver<bool>,
    ) -> (Runtime, Handle) {
        // Published before any reader can get a handle: a reader never sees an empty gateway
        // that has jobs.
        let handle = Handle::new(config, core.view());
        let runtime = Runtime::start_term(core, store, &handle, Fence::unelected(), false, shutdown);
        (runtime, handle)
    }

    /// Starts one leader term on `handle`: the driver steps `core`, commits to `store`, and
    /// stamps `fence`'s epoch on what it sends. With `end_on_failure` a failed commit ends the
    /// term (an elected leader steps down and reloads) instead of refusing changes until a
    /// restart. The term also ends when `fence` turns invalid.
    pub fn start_term(
        mut core: Core,
        store: Arc<dyn Store>,
        handle: &Handle,
        fence: Fence,
        end_on_failure: bool,
        shutdown: watch::Receiver<bool>,
    ) -> Runtime {
        let (tx, rx) = mpsc::channel(handle.config.channel_capacity.max(1));
        handle.view.set(Arc::new(core.view()));
        let driver = driver::Driver::new(driver::Parts {
            core,
            store,
            rx,
            view: handle.view.clone(),
            stats: handle.stats.clone(),
            events: handle.publisher.clone(),
            config: handle.config.clone(),
            term: handle.term.clone(),
            fence: fence.clone(),
            end_on_failure,
        });
        handle.term.set(Arc::new(TermState { tx: Some(tx), role: Role::Leader { epoch: fence.epoch() }, fence }));
        let task = tokio::spawn(driver.run(shutdown));
        Runtime { task }
    }

    /// Waits for the driver to finish and says why it did.
    pub async fn join(self) -> TermEnd {
        match self.task.await {
            Ok(end) => end,
            Err(e) => {
                tracing::error!(error = %e, "the runtime task ended abnormally");
                TermEnd::StoreFailed(format!("the runtime task ended abnormally: {e}"))
            }
        }
    }
}

impl Handle {
    /// A handle with no term yet: a standby that knows no leader, showing `view`. Start a term
    /// on it with [`Runtime::start_term`]; between terms reads answer from the view and writes
    /// with [`CallError::NotLeader`].
    pub fn new(config: RuntimeConfig, view: ReadView) -> Handle {
        let epoch = u64::try_from(now_ms()).unwrap_or(0);
        let (hub, publisher, events_wake) = events::Hub::new(epoch, events::RETAINED);
        Handle {
            term: Shared::new(Arc::new(TermState {
                tx: None,
                role: Role::Standby { leader: None, warm: false },
                fence: Fence::unelected(),
            })),
            view: Shared::new(Arc::new(view)),
            stats: Shared::new(stats::Stats::default()),
            next_conn: Arc::new(AtomicU64::new(1)),
            agent_buffer: config.agent_buffer,
            logs: Arc::new(logs::Waiting::default()),
            events: hub,
            events_wake,
            publisher: Shared::new(Some(Arc::new(publisher))),
            config,
        }
    }

    /// What this gateway is now.
    pub fn role(&self) -> Role {
        self.term.get().role.clone()
    }

    /// Between terms: records the leader this standby knows of (None: none). Does nothing while
    /// a term runs or after shutdown.
    pub fn set_standby_leader(&self, leader: Option<LeaderAddrs>) {
        self.update_standby(|known, _| *known = leader);
    }

    /// Between terms: records whether this standby's view is loaded from the store.
    pub fn set_standby_warm(&self, warm: bool) {
        self.update_standby(|_, is_warm| *is_warm = warm);
    }

    fn update_standby(&self, change: impl FnOnce(&mut Option<LeaderAddrs>, &mut bool)) {
        self.term.with(|term| {
            if let (None, Role::Standby { leader, warm }) = (&term.tx, &term.role) {
                let (mut leader, mut warm) = (leader.clone(), *warm);
                change(&mut leader, &mut warm);
                *term =
                    Arc::new(TermState { tx: None, role: Role::Standby { leader, warm }, fence: Fence::unelected() });
            }
        });
    }

    /// Between terms: shows `view` to readers and tells watchers what changed (`changed_jobs`:
    /// the ids of job records that changed since the previous view). Used by a standby that
    /// follows the store.
    pub fn publish_standby_view(&self, view: ReadView, changed_jobs: &[String]) {
        let before = self.view.get();
        let after = Arc::new(view);
        self.view.set(Arc::clone(&after));
        if let Some(publisher) = self.publisher.get() {
            events::publish_changes(&publisher, &before, &after, changed_jobs.iter().map(String::as_str), now_ms());
        }
    }

    /// Marks the gateway as stopping: calls are refused, and event subscriptions end once the
    /// running term (if any) has stopped.
    pub fn close(&self) {
        self.term.set(Arc::new(TermState { tx: None, role: Role::Stopped, fence: Fence::unelected() }));
        self.publisher.set(None);
    }

    /// The channel of the current term, or why there is none.
    fn current(&self) -> Result<(mpsc::Sender<Command>, Fence), CallError> {
        let term = self.term.get();
        match (&term.tx, &term.role) {
            (Some(tx), _) => Ok((tx.clone(), term.fence.clone())),
            (None, Role::Standby { leader, .. }) => Err(CallError::NotLeader { leader: leader.clone() }),
            (None, _) => Err(CallError::Stopped),
        }
    }

    /// Why a call into a term that ended meanwhile got no answer.
    fn term_ended(&self) -> CallError {
        match self.role() {
            Role::Standby { leader, .. } => CallError::NotLeader { leader },
            _ => CallError::Stopped,
        }
    }

    async fn call(&self, request: Request) -> Result<Reply, CallError> {
        self.call_in_term(request).await.map(|(reply, _)| reply)
    }

    /// A call, with the fence of the term that answered it.
    async fn call_in_term(&self, request: Request) -> Result<(Reply, Fence), CallError> {
        let (tx, fence) = self.current()?;
        let (reply, answer) = oneshot::channel();
        tx.send(Command { request, reply: Some(reply) }).await.map_err(|_| self.term_ended())?;
        // A term that could not save a change answers it `Unavailable` (the outcome is unknown:
        // etcd may still apply it), not "not the leader", which promises nothing was done.
        let reply = answer.await.map_err(|_| self.term_ended())??;
        Ok((reply, fence))
    }

    /// Stores a validated job; returns it and whether it was created (false: an earlier job with
    /// the same tenant and idempotency key). Answers only once the job is durable.
    pub async fn submit(&self, spec: JobSpec) -> Result<(Arc<JobRecord>, bool), CallError> {
        match self.call(Request::Submit(Box::new(spec))).await? {
            Reply::Submitted { job, created } => Ok((job, created)),
            _ => Err(CallError::Stopped),
        }
    }

    /// Cancels a job; answers once the cancellation is durable (the member is told after).
    pub async fn cancel(&self, id: &str) -> Result<Arc<JobRecord>, CallError> {
        match self.call(Request::Cancel(id.to_string())).await? {
            Reply::Cancelled(job) => Ok(job),
            _ => Err(CallError::Stopped),
        }
    }

    /// The latest published view (never waits on writes).
    pub fn view(&self) -> Arc<ReadView> {
        self.view.get()
    }

    /// A copy of the driver's measurements (round and commit durations, batch sizes).
    pub fn stats(&self) -> stats::Stats {
        self.stats.get()
    }

    /// Follows the event stream from after `after` (None: only new events). An id this process
    /// cannot resume from yields a [`events::Gap`] first; see [`events`].
    pub fn subscribe(&self, after: Option<events::EventId>) -> events::Subscription {
        self.events.subscribe(after, self.events_wake.clone())
    }

    /// A fresh id for an agent stream.
    pub fn next_conn(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Offers a new agent stream to the core. On success the returned receiver yields what the
    /// gateway sends to the agent (the welcome first); it ends when the core drops the stream.
    pub async fn attach(&self, conn: ConnId, hello: AgentHello) -> Result<mpsc::Receiver<GatewayCommand>, CallError> {
        self.attach_fenced(conn, hello).await.map(|(receiver, _)| receiver)
    }

    /// As [`Handle::attach`], with the fence of the term that took the stream: its epoch goes on
    /// every message, and nothing is sent once it turns invalid.
    pub async fn attach_fenced(
        &self,
        conn: ConnId,
        hello: AgentHello,
    ) -> Result<(mpsc::Receiver<GatewayCommand>, Fence), CallError> {
        let (outbox, receiver) = mpsc::channel(self.agent_buffer.max(1));
        let (_, fence) = self.call_in_term(Request::Attach { conn, hello, outbox }).await?;
        Ok((receiver, fence))
    }

    /// Part of a job's output, from the member that holds its current binding: at most
    /// `max_bytes` from byte `from`, or the last `max_bytes` when `from` is None.
    pub async fn logs(&self, job_id: &str, from: Option<u64>, max_bytes: u32) -> Result<LogChunk, LogsError> {
        let (request_id, answer) = self.logs.register();
        let asked = self
            .call(Request::Logs { job_id: job_id.to_string(), request_id, from, max_bytes })
            .await
            .map_err(|e| {
                self.logs.forget(request_id);
                LogsError::Call(e)
            })?;
        let Reply::LogsAsked { conn } = asked else {
            self.logs.forget(request_id);
            return Err(LogsError::Call(CallError::Stopped));
        };
        self.logs.asked(request_id, conn);
        let answer = tokio::time::timeout(LOGS_TIMEOUT, answer).await;
        self.logs.forget(request_id);
        match answer {
            Ok(Ok(Ok(chunk))) => Ok(chunk),
            Ok(Ok(Err(message))) => Err(LogsError::Member(message)),
            Ok(Err(_)) => Err(LogsError::Call(CallError::Stopped)),
            Err(_) => Err(LogsError::Timeout(job_id.to_string())),
        }
    }

    /// Passes on what an agent said; waits while the core's channel is full (back-pressure on
    /// the agent's stream, never on other callers). Output answers go straight to whoever asked.
    pub async fn agent_event(&self, conn: ConnId, event: AgentEvent) -> Result<(), CallError> {
        let event = match event {
            AgentEvent::Logs { request_id, result } => {
                self.logs.answer(conn, request_id, result);
                return Ok(());
            }
            event => event,
        };
        let (tx, _) = self.current()?;
        tx.send(Command { request: Request::Agent { conn, event }, reply: None }).await.map_err(|_| self.term_ended())
    }

    /// Says an agent stream ended.
    pub async fn agent_gone(&self, conn: ConnId) {
        if let Ok((tx, _)) = self.current() {
            let _ = tx.send(Command { request: Request::Gone { conn }, reply: None }).await;
        }
    }
}
