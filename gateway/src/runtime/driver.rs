//! The driver loop: batch, step, group-commit, publish, deliver.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meridian_core::{ConnId, Core, Effects, Error, Input, ReadView, Reply, ReplyTo};
use meridian_proto::protocol::GatewayCommand;
use meridian_store::{Store, Write};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::events::{EventKind, Publisher};
use super::shared::Shared;
use super::stats::Stats;
use super::{Command, MAX_BATCH, Request, RuntimeConfig};

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

pub(super) struct Driver {
    core: Core,
    store: Arc<dyn Store>,
    rx: mpsc::Receiver<Command>,
    view: Shared<Arc<ReadView>>,
    stats: Shared<Stats>,
    events: Publisher,
    config: RuntimeConfig,
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
    pub(super) fn new(
        core: Core,
        store: Arc<dyn Store>,
        rx: mpsc::Receiver<Command>,
        view: Shared<Arc<ReadView>>,
        stats: Shared<Stats>,
        events: Publisher,
        config: RuntimeConfig,
    ) -> Self {
        Self {
            core,
            store,
            rx,
            view,
            stats,
            events,
            config,
            clock: Clock::new(),
            streams: HashMap::new(),
            waiting: HashMap::new(),
            next_reply: 1,
            follow_ups: VecDeque::new(),
        }
    }

    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
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
                Wake::Stop => break,
                Wake::Command(command) => {
                    self.apply(command, now, &mut effects);
                    let mut taken = 1;
                    while taken < MAX_BATCH {
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
        }
        // Callers still waiting learn that the gateway stopped (their oneshot is dropped).
        self.waiting.clear();
        self.streams.clear();
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

    /// Commits the batch's records, publishes the view, then delivers sends and replies.
    async fn finish(&mut self, mut effects: Effects) {
        if !effects.persist.is_empty()
            && let Err(reason) = self.commit(&effects).await
        {
            tracing::error!(error = %reason, "commit failed; the gateway refuses changes until it is restarted");
            let public = "the gateway could not save a change and refuses changes until it is restarted".to_string();
            self.core.fail(public.clone());
            effects.fail_all(&Error::Unavailable(public.clone()));
            // Readers keep the last durable view, marked failed; the core's memory is now ahead
            // of the disk and is never published again.
            let frozen = self.view.get().with_failure(public);
            self.view.set(Arc::new(frozen));
        }
        if self.core.failure().is_none() {
            let before = self.view.get();
            self.publish();
            self.publish_events(&before, &effects.persist);
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

    /// One group commit: the last write of each key, in one durable transaction.
    async fn commit(&self, effects: &Effects) -> Result<(), String> {
        let mut writes: BTreeMap<String, Write> = BTreeMap::new();
        for record in &effects.persist {
            let encoded = record.encode().map_err(|e| format!("encoding {}: {e}", record.key()))?;
            let write = match encoded.value {
                Some(value) => Write::Put { key: encoded.key.clone(), value },
                None => Write::Delete { key: encoded.key.clone() },
            };
            writes.insert(encoded.key, write);
        }
        let records = writes.len();
        let started = std::time::Instant::now();
        let result = self.store.commit(writes.into_values().collect()).await.map_err(|e| e.to_string());
        self.stats.with(|stats| stats.commit(started.elapsed(), records));
        result
    }

    fn publish(&mut self) {
        self.view.set(Arc::new(self.core.view()));
    }

    /// Tells watchers what this batch changed: each job record it wrote (once, as the view now
    /// holds it) and each cluster whose summary changed (the time it last reported aside).
    fn publish_events(&self, before: &ReadView, persisted: &[meridian_core::Record]) {
        let after = self.view.get();
        let mut changes = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for record in persisted {
            let meridian_core::Record::Job(job) = record else { continue };
            if !seen.insert(job.id.as_str()) {
                continue;
            }
            if let Some(current) = after.job(&job.id) {
                changes.push(EventKind::Job { previous: before.job(&job.id).map(|j| j.state), job: current });
            }
        }
        if !after.same_clusters(before) {
            let old: HashMap<&str, &meridian_core::ClusterSummary> =
                before.cluster_summaries().iter().map(|c| (c.name.as_str(), c)).collect();
            for cluster in after.cluster_summaries().iter() {
                let changed = old.get(cluster.name.as_str()).is_none_or(|previous| {
                    let mut previous = (*previous).clone();
                    previous.last_seen_ms = cluster.last_seen_ms;
                    previous != *cluster
                });
                if changed {
                    changes.push(EventKind::Cluster(cluster.clone()));
                }
            }
        }
        if !changes.is_empty() {
            self.events.publish(self.clock.now_ms(), changes);
        }
    }
}
