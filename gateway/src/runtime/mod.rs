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
    tx: mpsc::Sender<Command>,
    view: Shared<Arc<ReadView>>,
    stats: Shared<stats::Stats>,
    next_conn: Arc<AtomicU64>,
    agent_buffer: usize,
    logs: Arc<logs::Waiting>,
    events: Arc<events::Hub>,
    events_wake: watch::Receiver<u64>,
}

/// The running driver: await [`Runtime::join`] after shutdown.
pub struct Runtime {
    task: JoinHandle<()>,
}

impl Runtime {
    /// Starts the driver task over `core` and `store`; it runs until `shutdown` flips to true
    /// (or every handle is dropped).
    pub fn start(
        mut core: Core,
        store: Arc<dyn Store>,
        config: RuntimeConfig,
        shutdown: watch::Receiver<bool>,
    ) -> (Runtime, Handle) {
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        // Published before any reader can get a handle: a reader never sees an empty gateway
        // that has jobs.
        let view = Shared::new(Arc::new(core.view()));
        let stats = Shared::new(stats::Stats::default());
        let epoch = u64::try_from(now_ms()).unwrap_or(0);
        let (hub, publisher, events_wake) = events::Hub::new(epoch, events::RETAINED);
        let handle = Handle {
            tx,
            view: view.clone(),
            stats: stats.clone(),
            next_conn: Arc::new(AtomicU64::new(1)),
            agent_buffer: config.agent_buffer,
            logs: Arc::new(logs::Waiting::default()),
            events: hub,
            events_wake,
        };
        let driver = driver::Driver::new(core, store, rx, view, stats, publisher, config);
        let task = tokio::spawn(driver.run(shutdown));
        (Runtime { task }, handle)
    }

    /// Waits for the driver to finish.
    pub async fn join(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the runtime task ended abnormally");
        }
    }
}

impl Handle {
    async fn call(&self, request: Request) -> Result<Reply, CallError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Command { request, reply: Some(reply) }).await.map_err(|_| CallError::Stopped)?;
        Ok(answer.await.map_err(|_| CallError::Stopped)??)
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
        let (outbox, receiver) = mpsc::channel(self.agent_buffer.max(1));
        self.call(Request::Attach { conn, hello, outbox }).await?;
        Ok(receiver)
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
        self.tx
            .send(Command { request: Request::Agent { conn, event }, reply: None })
            .await
            .map_err(|_| CallError::Stopped)
    }

    /// Says an agent stream ended.
    pub async fn agent_gone(&self, conn: ConnId) {
        let _ = self.tx.send(Command { request: Request::Gone { conn }, reply: None }).await;
    }
}
