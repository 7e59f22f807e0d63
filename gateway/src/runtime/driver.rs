//! The driver loop: batch, step, group-commit, publish, deliver.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meridian_core::{ConnId, Core, Effects, Error, Input, ReadView, Reply, ReplyTo};
use meridian_proto::protocol::GatewayCommand;
use meridian_store::{Store, Write};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::events::Publisher;
use super::shared::Shared;
use super::stats::Stats;
use super::{Command, Fence, MAX_BATCH, Request, Role, RuntimeConfig, TermEnd, TermState};

/// Current Unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The core's clock: wall time at start plus tokio's monotonic time since, so it never goes
/// back and tests can drive it with a paused tokio clock.
struct Clock {
    wall_at_start: i64,
    start: Instant,
}

impl Clock {
    fn new() -> Self {
        Self { wall_at_start: now_ms(), start: Instant::now() }
    }

    fn now_ms(&self) -> i64 {
        self.wall_at_start.saturating_add(i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX))
    }
}

/// What a driver is built from (one leader term).
pub(super) struct Parts {
    pub(super) core: Core,
    pub(super) store: Arc<dyn Store>,
    pub(super) rx: mpsc::Receiver<Command>,
    pub(super) view: Shared<Arc<ReadView>>,
    pub(super) stats: Shared<Stats>,
    pub(super) events: Shared<Option<Arc<Publisher>>>,
    pub(super) config: RuntimeConfig,
    pub(super) term: Shared<Arc<TermState>>,
    pub(super) fence: Fence,
    pub(super) end_on_failure: bool,
}

pub(super) struct Driver {
    core: Core,
    store: Arc<dyn Store>,
    rx: mpsc::Receiver<Command>,
    view: Shared<Arc<ReadView>>,
    stats: Shared<Stats>,
    /// Taken at shutdown: subscriptions end once they have read what was published.
    events: Shared<Option<Arc<Publisher>>>,
    config: RuntimeConfig,
    term: Shared<Arc<TermState>>,
    fence: Fence,
    end_on_failure: bool,
    /// Set when the term must end after this batch.
    ending: Option<TermEnd>,
    /// This batch's records, encoded as they are produced.
    pending: Pending,
    clock: Clock,
    streams: HashMap<ConnId, mpsc::Sender<GatewayCommand>>,
    waiting: HashMap<ReplyTo, oneshot::Sender<Result<Reply, Error>>>,
    next_reply: ReplyTo,
    /// Inputs the driver gives itself (streams it found dead) for the next batch.
    follow_ups: VecDeque<Input>,
}

enum Wake {
    Command(Command),
    Tick,
    Round,
    Stop,
}

impl Driver {
    pub(super) fn new(parts: Parts) -> Self {
        let Parts { core, store, rx, view, stats, events, config, term, fence, end_on_failure } = parts;
        Self {
            core,
            store,
            rx,
            view,
            stats,
            events,
            config,
            term,
            fence,
            end_on_failure,
            ending: None,
            pending: Pending::default(),
            clock: Clock::new(),
            streams: HashMap::new(),
            waiting: HashMap::new(),
            next_reply: 1,
            follow_ups: VecDeque::new(),
        }
    }

    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> TermEnd {
        let mut tick = tokio::time::interval(self.config.tick_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_round = Instant::now();
        let mut last_round_took = std::time::Duration::ZERO;
        loop {
            let round_due = last_round + self.round_gap(last_round_took);
            let wake = if self.follow_ups.is_empty() {
                tokio::select! {
                    command = self.rx.recv() => command.map_or(Wake::Stop, Wake::Command),
                    _ = tick.tick() => Wake::Tick,
                    _ = tokio::time::sleep_until(round_due) => Wake::Round,
                    _ = shutdown.wait_for(|stop| *stop) => Wake::Stop,
                }
            } else {
                Wake::Tick
            };
            let mut effects = Effects::default();
            let now = self.clock.now_ms();
            while let Some(input) = self.follow_ups.pop_front() {
                self.core.step(input, now, &mut effects);
            }
            match wake {
                Wake::Stop => {
                    self.ending = Some(TermEnd::Shutdown);
                    break;
                }
                Wake::Command(command) => {
                    self.apply(command, now, &mut effects);
                    let mut taken = 1;
                    // Half the store's limits go to commands; the round and timers that share
                    // the commit get the rest.
                    let limits = self.store.limits();
                    let budget =
                        meridian_store::Limits { max_writes: limits.max_writes / 2, max_bytes: limits.max_bytes / 2 };
                    while taken < MAX_BATCH && self.pending.absorb(&effects.persist).fits(budget) {
                        let Ok(command) = self.rx.try_recv() else { break };
                        self.apply(command, now, &mut effects);
                        taken += 1;
                    }
                    self.stats.with(|stats| stats.batch_commands.record(taken as f64));
                }
                Wake::Tick => self.core.step(Input::Tick, now, &mut effects),
                Wake::Round => {}
            }
            if Instant::now() >= last_round + self.round_gap(last_round_took) {
                let started = std::time::Instant::now();
                self.core.step(Input::Round, now, &mut effects);
                last_round_took = started.elapsed();
                self.stats.with(|stats| stats.round(last_round_took));
                last_round = Instant::now();
            }
            self.finish(effects).await;
            if self.ending.is_some() {
                break;
            }
        }
        let end = self.ending.take().unwrap_or(TermEnd::Shutdown);
        self.hand_back();
        // Callers still waiting learn that the term ended (their oneshot is dropped), and agent
        // streams end (their outbox is dropped), so agents look for the leader again.
        self.waiting.clear();
        self.streams.clear();
        if end == TermEnd::Shutdown {
            self.events.set(None);
        }
        match &end {
            TermEnd::Shutdown => {}
            TermEnd::LostLeadership => {
                tracing::warn!(epoch = self.fence.epoch(), "leadership may have lapsed; this term sent nothing more")
            }
            TermEnd::StoreFailed(reason) => {
                tracing::error!(epoch = self.fence.epoch(), %reason, "a commit failed; this term stepped down")
            }
        }
        end
    }

    /// How long after the end of the last round the next may start. Rounds run when something
    /// changed (at most every `round_coalesce`, so a storm of submits and reports shares rounds)
    /// and every `placement_interval` regardless. A slow round must not starve what it competes
    /// with (heartbeats and their lease renewals, submits): the gap is at least twice the last
    /// round, so rounds take at most about a third of the loop.
    fn round_gap(&self, last_round_took: std::time::Duration) -> std::time::Duration {
        let base = if self.core.wants_round() { self.config.round_coalesce } else { self.config.placement_interval };
        base.max(last_round_took * 2)
    }

    fn apply(&mut self, command: Command, now: i64, effects: &mut Effects) {
        let reply = self.next_reply;
        self.next_reply += 1;
        if let Some(sender) = command.reply {
            self.waiting.insert(reply, sender);
        }
        let input = match command.request {
            Request::Submit(spec) => {
                if self.core.failure().is_some()
                    && let Some(job) = self.durable_replay(&spec)
                {
                    effects.replies.push((reply, Ok(Reply::Submitted { job, created: false })));
                    return;
                }
                Input::Submit { spec: *spec, reply }
            }
            Request::Cancel(job_id) => Input::Cancel { job_id, reply },
            Request::Attach { conn, hello, outbox } => {
                // Registered first so the welcome can be delivered; removed again if refused.
                self.streams.insert(conn, outbox);
                Input::AgentHello { conn, hello, reply }
            }
            Request::Agent { conn, event } => Input::Agent { conn, event },
            Request::Logs { job_id, request_id, from, max_bytes } => {
                Input::Logs { job_id, request_id, from, max_bytes, reply }
            }
            Request::Gone { conn } => {
                self.stats.with(|stats| stats.agent_streams_ended += 1);
                self.streams.remove(&conn);
                Input::AgentGone { conn }
            }
        };
        let attaching = match &input {
            Input::AgentHello { conn, .. } => Some(*conn),
            _ => None,
        };
        let replies_before = effects.replies.len();
        self.core.step(input, now, effects);
        if let Some(conn) = attaching
            && effects.replies[replies_before..].iter().any(|(r, answer)| *r == reply && answer.is_err())
        {
            self.streams.remove(&conn);
        }
    }

    /// While the store has failed, a submit that repeats an acknowledged one (same tenant,
    /// idempotency key and spec) is answered from the last durable view: its caller was told
    /// the job exists, and it still does. Anything else is refused by the core.
    fn durable_replay(&self, spec: &meridian_proto::spec::JobSpec) -> Option<Arc<meridian_core::JobRecord>> {
        let key = spec.idempotency_key.as_ref()?;
        let view = self.view.get();
        view.jobs()
            .find(|job| job.spec.idempotency_key.as_ref() == Some(key) && job.spec.tenant == spec.tenant)
            .filter(|job| job.spec == *spec)
            .cloned()
    }

    /// Ends the term for handles: calls from now on are answered at once (a standby that knows
    /// no leader yet; the ha supervisor fills in the leader, and shutdown marks it stopping)
    /// instead of waiting on a channel nobody reads.
    fn hand_back(&self) {
        self.term.with(|term| {
            if term.tx.is_some() {
                *term = Arc::new(TermState {
                    tx: None,
                    role: Role::Standby { leader: None, warm: true },
                    fence: Fence::unelected(),
                });
            }
        });
    }

    /// Commits the batch's records, publishes the view, then delivers sends and replies.
    async fn finish(&mut self, mut effects: Effects) {
        let committed = if effects.persist.is_empty() { Ok(()) } else { self.commit(&effects).await };
        if let Err(reason) = committed {
            if self.end_on_failure {
                // An elected leader does not run on with memory ahead of the store: it answers
                // the batch as unavailable (clients retry) and steps down; the next leader
                // reloads from the store.
                effects.fail_all(&Error::Unavailable(
                    "the gateway's store did not confirm the change, so it may or may not have been saved; this \
                     gateway is stepping down. Check before repeating it, or repeat it with the same idempotencyKey"
                        .to_string(),
                ));
                effects.sends.clear();
                self.ending = Some(TermEnd::StoreFailed(reason));
                // Before the replies go out, so their callers find this gateway a standby.
                self.hand_back();
            } else {
                tracing::error!(error = %reason, "commit failed; the gateway refuses changes until it is restarted");
                let public =
                    "the gateway could not save a change and refuses changes until it is restarted".to_string();
                self.core.fail(public.clone());
                effects.fail_all(&Error::Unavailable(public.clone()));
                // Readers keep the last durable view, marked failed; the core's memory is now
                // ahead of the disk and is never published again.
                let frozen = self.view.get().with_failure(public);
                self.view.set(Arc::new(frozen));
            }
        }
        if self.core.failure().is_none() && self.ending.is_none() {
            let before = self.view.get();
            self.publish();
            if let Some(events) = self.events.get() {
                super::events::publish_changes(
                    &events,
                    &before,
                    &self.view.get(),
                    job_ids(&effects.persist),
                    self.clock.now_ms(),
                );
            }
        }
        // The fence is read after the commit and right before sending: a leader whose lease may
        // have run out (a pause, a cut from etcd) sends nothing, and its term ends.
        if !effects.sends.is_empty() && !self.fence.is_valid() {
            effects.sends.clear();
            self.ending.get_or_insert(TermEnd::LostLeadership);
            self.hand_back();
        }
        for (conn, command) in effects.sends {
            let Some(stream) = self.streams.get(&conn) else { continue };
            match stream.try_send(command) {
                Ok(()) => {}
                // The agent reads slower than the gateway writes. Dropping the stream would turn
                // a slow reader into a lost cluster (and, before offers counted as running, into
                // a second copy); every message here is repeated when it matters instead: a lost
                // renewal by the next heartbeat's, an ack or a cancel by the next report of the
                // binding, a withdrawn offer by its timer, a logs request by its caller's retry.
                Err(mpsc::error::TrySendError::Full(command)) => {
                    tracing::debug!(conn, kind = command.kind(), "agent stream full; message dropped");
                    self.stats.with(|stats| stats.agent_messages_dropped += 1);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    // The stream's task has ended: the agent is gone.
                    tracing::warn!(conn, "agent stream closed; dropping it");
                    self.stats.with(|stats| stats.agent_streams_dropped += 1);
                    self.streams.remove(&conn);
                    self.follow_ups.push_back(Input::AgentGone { conn });
                }
            }
        }
        for conn in effects.close {
            self.streams.remove(&conn);
        }
        for (reply, answer) in effects.replies {
            if let Some(waiting) = self.waiting.remove(&reply) {
                let _ = waiting.send(answer);
            }
        }
    }

    /// One group commit: the last write of each key, in one durable transaction when the batch
    /// fits the store's limits. Commands are only taken while the batch stays within half of
    /// them; a single step that changes more (a lost cluster with thousands of jobs, a large
    /// round) is committed as consecutive transactions that each fit, and nothing is answered or
    /// sent before all of them are durable.
    async fn commit(&mut self, effects: &Effects) -> Result<(), String> {
        self.pending.absorb(&effects.persist);
        let pending = std::mem::take(&mut self.pending);
        if let Some(error) = pending.error {
            return Err(error);
        }
        let writes = pending.writes;
        let records = writes.len();
        let started = std::time::Instant::now();
        let limits = self.store.limits();
        let mut result = Ok(());
        for chunk in split(writes.into_values(), limits) {
            result = self.store.commit(chunk).await.map_err(|e| e.to_string());
            if result.is_err() {
                break;
            }
        }
        self.stats.with(|stats| stats.commit(started.elapsed(), records));
        result
    }

    fn publish(&mut self) {
        self.view.set(Arc::new(self.core.view()));
    }
}

/// A batch's records encoded as they are produced, the last write of each key, so the driver
/// knows the batch's real size while it takes commands (and encodes each record once).
#[derive(Default)]
struct Pending {
    writes: BTreeMap<String, Write>,
    bytes: usize,
    /// How many records of the batch's `persist` are encoded.
    seen: usize,
    /// The first record that could not be encoded: the commit fails with it.
    error: Option<String>,
}

impl Pending {
    /// Encodes the records of `persist` not seen yet.
    fn absorb(&mut self, persist: &[meridian_core::Record]) -> &Self {
        for record in persist.iter().skip(self.seen) {
            match record.encode() {
                Ok(encoded) => {
                    let write = match encoded.value {
                        Some(value) => Write::Put { key: encoded.key.clone(), value },
                        None => Write::Delete { key: encoded.key.clone() },
                    };
                    self.bytes += write.size();
                    if let Some(old) = self.writes.insert(encoded.key, write) {
                        self.bytes -= old.size();
                    }
                }
                Err(e) => {
                    self.error.get_or_insert_with(|| format!("encoding {}: {e}", record.key()));
                }
            }
        }
        self.seen = persist.len();
        self
    }

    fn fits(&self, limits: meridian_store::Limits) -> bool {
        limits.fits(self.writes.len(), self.bytes)
    }
}

/// The ids of the job records in `persist`.
fn job_ids(persist: &[meridian_core::Record]) -> impl Iterator<Item = &str> {
    persist.iter().filter_map(|record| match record {
        meridian_core::Record::Job(job) => Some(job.id.as_str()),
        _ => None,
    })
}

/// `writes` in consecutive batches that each fit `limits` (one batch when all fit). A single
/// write larger than the limits goes alone, and the store refuses it.
pub(super) fn split(writes: impl Iterator<Item = Write>, limits: meridian_store::Limits) -> Vec<Vec<Write>> {
    let mut batches = vec![Vec::new()];
    let mut bytes = 0;
    for write in writes {
        let size = write.size();
        let current = batches.last().map_or(0, |batch| batch.len());
        if current > 0 && !limits.fits(current + 1, bytes + size) {
            batches.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(batch) = batches.last_mut() {
            batch.push(write);
        }
    }
    batches
}
