//! The agent's one event loop. It owns all state (ledger, lease, link, tasks, sibling copies) and
//! reacts to six sources: the gateway link, finished backend tasks, backend job events, backend
//! copy events, the heartbeat timer and the lease deadline. Timers and backend events run whether or not a stream is up, and no
//! backend call is awaited here: each runs as a task and its answer comes back as a message.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand};
use meridian_scheduler::offer;
use tokio::sync::mpsc::error::TrySendError;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};

use super::epoch::EpochGate;
use super::lease::{Lease, Renewal};
use super::ledger::{self, CancelPlan, Doom, EventOutcome, Ledger, OfferPlan, Stop};
use super::link::{BACKOFF_MIN, Dial, FromGateway, Inbound, Link, LinkError, LinkEvent, jittered};
use super::siblings::{self, Copies};
use super::tasks::{self, Report, Start, TaskLabel, TaskOutput};
use crate::backend::{
    Admission, BackendError, CopyEventReceiver, InventorySource, JobEvent, JobEventReceiver, LocalBackend,
};
use crate::metrics::AgentMetrics;
use crate::usage::window::RunningJob;
use crate::usage::{GpuSample, Sampling, UsageError, UsageWindow};

/// The reason given for offers refused while the lease is expired.
/// Heartbeats a gateway that grants leases may leave unanswered before the agent gives up its
/// stream and looks for the leader again.
const SILENT_HEARTBEATS: u32 = 3;

pub(super) const LEASE_EXPIRED: &str =
    "this agent's lease expired; it takes no jobs until the gateway welcomes it again";

/// Everything the loop owns.
pub(super) struct EventLoop {
    pub(super) cluster: String,
    pub(super) hello: AgentHello,
    pub(super) report_interval: Duration,
    pub(super) dialer: Box<dyn Dial>,
    pub(super) backend: Arc<dyn LocalBackend>,
    pub(super) inventory: Arc<dyn InventorySource>,
    pub(super) events: JobEventReceiver,
    pub(super) events_open: bool,
    pub(super) link: Link,
    /// The next reconnect delay (before jitter).
    pub(super) backoff: Duration,
    /// The longest reconnect delay.
    pub(super) backoff_max: Duration,
    /// The newest leader epoch seen, on any stream; older messages are refused.
    pub(super) epochs: EpochGate,
    /// When the gateway of the open stream last sent anything, while it answers heartbeats
    /// (its welcome granted a lease): a paused or cut-off leader keeps the TCP connection open,
    /// so silence, not a broken stream, is what shows it is gone.
    pub(super) last_heard: Option<Instant>,
    /// Streams opened so far; numbers the next one.
    pub(super) sessions: u64,
    pub(super) ledger: Ledger,
    pub(super) lease: Lease,
    /// The last heartbeat's sequence number.
    pub(super) heartbeat_seq: u64,
    pub(super) tasks: JoinSet<TaskOutput>,
    pub(super) labels: HashMap<tokio::task::Id, TaskLabel>,
    /// An inventory/pressure report task is running.
    pub(super) report_in_flight: bool,
    /// Something changed (or the heartbeat came): report inventory and pressure when possible.
    pub(super) report_wanted: bool,
    pub(super) metrics: AgentMetrics,
    /// Where GPU utilisation comes from, if anywhere.
    pub(super) sampling: Option<Sampling>,
    /// Each running job's recent utilisation.
    pub(super) usage: UsageWindow,
    /// A utilisation sample task is running.
    pub(super) sample_in_flight: bool,
    /// Start quote tasks running.
    pub(super) quotes_in_flight: usize,
    /// The sibling copies kept for the open stream's gateway.
    pub(super) copies: Copies,
    /// The backend's copy events, once taken from it (None: it gives none).
    pub(super) copy_events: Option<CopyEventReceiver>,
}

impl EventLoop {
    /// Runs until `shutdown` resolves; then stops every task it owns.
    pub(super) async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        // Adopt what the member still holds before talking to the gateway, so the welcome's
        // reconcile sees every job.
        self.spawn(TaskLabel::Adopt, tasks::adopt(Arc::clone(&self.backend)));
        self.copy_events = self.backend.copy_events();
        let mut heartbeat = tokio::time::interval(self.report_interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sample_timer = self.sampling.as_ref().map(|s| {
            let mut timer = tokio::time::interval(s.interval);
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
            timer
        });
        loop {
            let lease_deadline = self.lease.deadline();
            tokio::select! {
                () = &mut shutdown => break,
                event = self.link.next() => self.on_link(event),
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => self.on_task(done),
                event = self.events.recv(), if self.events_open => match event {
                    Some(event) => self.on_job_event(event),
                    None => {
                        self.events_open = false;
                        tracing::error!(cluster = %self.cluster, "the backend stopped reporting job events; job results will not be seen");
                    }
                },
                event = siblings::next_copy_event(self.copy_events.as_mut()), if self.copy_events.is_some() => match event {
                    Some(event) => self.on_copy_event(event),
                    None => self.copy_events = None,
                },
                _ = heartbeat.tick() => self.on_heartbeat_tick(),
                () = meridian_process::sleep_until_opt(lease_deadline) => self.on_lease_expired(),
                () = tick_opt(sample_timer.as_mut()) => self.on_sample_tick(),
            }
            self.maybe_report();
            self.metrics.set_connected(self.link.welcomed_session().is_some());
        }
        self.tasks.shutdown().await;
        tracing::info!(cluster = %self.cluster, "agent stopped");
    }

    // ------------------------------------------------------------ the link

    fn on_link(&mut self, event: LinkEvent) {
        match event {
            LinkEvent::Retry => self.dial(),
            LinkEvent::Dialed(Ok(connection)) => {
                let hello_sent = connection.hello_sent;
                self.sessions += 1;
                tracing::debug!(cluster = %self.cluster, gateway = %connection.gateway, session = self.sessions, "stream open; waiting for the welcome");
                self.link = Link::Up { connection, session: self.sessions, hello_sent, welcomed: false };
            }
            LinkEvent::Dialed(Err(error)) | LinkEvent::Received(Err(error)) => self.link_lost(error),
            LinkEvent::Received(Ok(inbound)) => self.on_inbound(inbound),
        }
    }

    fn dial(&mut self) {
        let attempt = self.dialer.dial(self.hello.clone());
        self.link = Link::Dialing { attempt };
    }

    /// Gives up the stream, if one is open (the next dial tries the other gateways first), and
    /// dials again at `retry_at`.
    fn redial_at(&mut self, retry_at: Instant) {
        if let Some(gateway) = self.link.gateway() {
            self.dialer.lost(gateway);
        }
        // Nobody else can grant this stream's copies; a new leader knows nothing of them.
        self.drop_all_copies();
        self.link = Link::BackingOff { retry_at };
    }

    fn link_lost(&mut self, error: LinkError) {
        let retry_in = jittered(self.backoff);
        match &error {
            LinkError::Refused(message) => tracing::error!(
                cluster = %self.cluster,
                gateway_said = %message,
                retry_in = ?retry_in,
                "the gateway refused this agent: another live agent holds cluster `{}` (perhaps an old process still shutting down); retrying",
                self.cluster
            ),
            _ => tracing::warn!(cluster = %self.cluster, error = %error, retry_in = ?retry_in, "no gateway stream"),
        }
        self.redial_at(Instant::now() + retry_in);
        self.backoff = (self.backoff * 2).min(self.backoff_max);
    }

    fn on_inbound(&mut self, received: FromGateway) {
        // A message read after the lease's deadline must not act first: `select!` may pick the
        // stream before the deadline's timer (after a pause, both are ready at once).
        if self.enforce_lease() {
            return;
        }
        let FromGateway { epoch, message } = received;
        if self.last_heard.is_some() {
            self.last_heard = Some(Instant::now());
        }
        let newest = self.epochs.newest();
        if !self.epochs.admit(epoch) {
            return self.refuse_stale(epoch, newest, &message);
        }
        self.metrics.epoch(self.epochs.newest());
        let command = match message {
            Inbound::Command(command) => *command,
            Inbound::InvalidOffer { job_id, fencing_token, reason } => {
                tracing::warn!(cluster = %self.cluster, job = %job_id, %reason, "invalid offer refused");
                self.send(offer::refused_for_good(&job_id, fencing_token, format!("invalid offer: {reason}")));
                return;
            }
            Inbound::Invalid(reason) => {
                tracing::warn!(cluster = %self.cluster, %reason, "invalid gateway message ignored");
                return;
            }
        };
        match command {
            GatewayCommand::Welcome { bound, lease } => self.on_welcome(&bound, lease),
            _ if self.link.welcomed_session().is_none() => {
                tracing::warn!(cluster = %self.cluster, "gateway command before the welcome ignored");
            }
            GatewayCommand::Offer(assignment) => self.on_offer(assignment),
            GatewayCommand::Cancel { job_id, fencing_token } => self.on_cancel(&job_id, fencing_token),
            GatewayCommand::Ack { job_id, fencing_token } => {
                if self.ledger.ack(&job_id, fencing_token) {
                    tracing::debug!(cluster = %self.cluster, job = %job_id, fencing_token, "result acknowledged");
                }
            }
            GatewayCommand::Lease { heartbeat_seq, lease } => {
                let session = self.link.welcomed_session().unwrap_or_default();
                match self.lease.renew(heartbeat_seq, lease, session, Instant::now()) {
                    Renewal::Applied(_) => {
                        self.metrics.report_accepted();
                        self.lease_changed();
                    }
                    Renewal::Stale => {
                        tracing::warn!(cluster = %self.cluster, heartbeat_seq, "a lease renewal arrived after the lease it grants had run out; it counts for nothing");
                    }
                    other => {
                        tracing::debug!(cluster = %self.cluster, heartbeat_seq, ?other, "lease renewal not applied");
                    }
                }
            }
            GatewayCommand::Logs { request_id, job_id, fencing_token, from, max_bytes } => {
                let task = tasks::logs(Arc::clone(&self.backend), request_id, job_id, fencing_token, from, max_bytes);
                self.spawn(TaskLabel::Logs { request_id }, task);
            }
            GatewayCommand::Quote { request_id, job_id, spec } => self.on_quote(request_id, job_id, spec),
            GatewayCommand::Copy { copy_token, assignment } => self.on_copy(copy_token, assignment),
            GatewayCommand::Grant { copy_token, assignment } => self.on_grant(copy_token, assignment),
            GatewayCommand::DropCopy { job_id, copy_token } => self.on_drop_copy(job_id, copy_token),
        }
    }

    /// Works out a start quote as a task, unless [`tasks::MAX_QUOTES_IN_FLIGHT`] are under way:
    /// then it answers at once that the member is busy (the gateway keeps its own estimate and
    /// may ask again later).
    fn on_quote(&mut self, request_id: u64, job_id: String, spec: meridian_proto::spec::JobSpec) {
        if self.quotes_in_flight >= tasks::MAX_QUOTES_IN_FLIGHT {
            self.metrics.quote_answered(false);
            let busy = format!("busy: {} start quotes are being worked out here", self.quotes_in_flight);
            self.send(AgentEvent::Quote { request_id, result: Err(busy) });
            return;
        }
        self.quotes_in_flight += 1;
        let assignment = Assignment { job_id, fencing_token: 0, spec, last_preempted_at_ms: None };
        let task = tasks::quote(Arc::clone(&self.backend), request_id, assignment);
        self.spawn(TaskLabel::Quote { request_id }, task);
    }

    /// A message from an older epoch than `newest`: its sender is no longer the leader. Nothing
    /// of it is acted on. A stale welcome leaves the stream useless (nothing else may be acted on
    /// before a welcome), so the agent gives it up and tries the other gateways.
    fn refuse_stale(&mut self, epoch: u64, newest: u64, message: &Inbound) {
        self.metrics.stale_epoch_refused();
        let (kind, job_id) = describe(message);
        let gateway = self.link.gateway().unwrap_or_default().to_string();
        tracing::warn!(
            cluster = %self.cluster,
            %gateway,
            message = kind,
            job = job_id.unwrap_or("none"),
            epoch,
            newest_epoch = newest,
            "refused a gateway message from an older epoch than the newest seen: its sender is no longer the leader"
        );
        let welcome =
            matches!(message, Inbound::Command(command) if matches!(**command, GatewayCommand::Welcome { .. }));
        if welcome && matches!(self.link, Link::Up { welcomed: false, .. }) {
            self.link_lost(LinkError::Deposed { gateway, epoch, newest });
        }
    }

    /// Keeps exactly the bindings the gateway lists, reports the rest, and starts heartbeating.
    fn on_welcome(&mut self, bound: &[Assignment], lease: Option<Duration>) {
        let Link::Up { session, hello_sent, welcomed: false, .. } = &self.link else {
            tracing::warn!(cluster = %self.cluster, "a second welcome on one stream ignored");
            return;
        };
        let (session, hello_sent) = (*session, *hello_sent);
        if !self.lease.welcome(lease, hello_sent, Instant::now()) {
            // The welcome took longer to arrive than the lease it grants: what it lists may have
            // been placed elsewhere since. It grants nothing; a new stream brings a fresh one.
            tracing::warn!(
                cluster = %self.cluster,
                session,
                waited = ?hello_sent.elapsed(),
                "the gateway's welcome arrived after the lease it grants had run out; ignoring it and reconnecting"
            );
            self.enforce_lease();
            self.redial_at(Instant::now());
            return;
        }
        if let Link::Up { welcomed, .. } = &mut self.link {
            *welcomed = true;
        }
        // A gateway that grants a lease answers every heartbeat; from now on its silence counts.
        self.last_heard = lease.map(|_| Instant::now());
        self.backoff = BACKOFF_MIN;
        self.lease_changed();
        self.metrics.welcomed(session);
        self.drop_all_copies();
        let done = self.ledger.reconcile(bound, session, &self.cluster);
        for stop in done.stop.iter().cloned() {
            tracing::warn!(cluster = %self.cluster, job = %stop.job_id, fencing_token = stop.fencing_token, "the gateway no longer expects this binding here; stopping it");
            self.stop(stop);
        }
        for lost in &done.lost {
            tracing::warn!(cluster = %self.cluster, job = %lost.job_id, fencing_token = lost.fencing_token, "the gateway expects a job this member does not hold; reporting it lost");
        }
        let results = self.ledger.results();
        tracing::info!(
            cluster = %self.cluster,
            gateway = %self.link.gateway().unwrap_or_default(),
            epoch = self.epochs.newest(),
            kept = done.kept,
            stopped = done.stop.len(),
            results = results.len(),
            stale_results_dropped = done.dropped_results,
            lease = %lease.map_or_else(|| "none".to_string(), |l| HumanDuration(l).to_string()),
            "welcomed by the gateway"
        );
        for result in results {
            self.send(AgentEvent::Status(result));
        }
        self.send_heartbeat();
        self.report_wanted = true;
    }

    /// An offer: a copy of the job held here is dropped first (see `siblings.rs`).
    pub(super) fn on_offer(&mut self, assignment: Assignment) {
        let drop_copy = self.take_copy(&assignment.job_id);
        self.handle_offer(assignment, Start::Submit { drop_copy });
    }

    /// Answers an offer (or a grant, which is answered the same way), starting it as `start`
    /// says when the ledger plans a submit.
    pub(super) fn handle_offer(&mut self, assignment: Assignment, start: Start) {
        let (job_id, token) = (assignment.job_id.clone(), assignment.fencing_token);
        let Some(session) = self.link.welcomed_session() else { return self.abandon_start(&job_id, start) };
        if self.lease.is_expired() {
            self.abandon_start(&job_id, start);
            return self.send(offer::declined(&job_id, token, LEASE_EXPIRED.into()));
        }
        let plan = self.ledger.plan_offer(&assignment);
        if !matches!(plan, OfferPlan::Submit { .. }) {
            self.abandon_start(&job_id, start);
        }
        match plan {
            OfferPlan::AcceptAgain(held) => self.send(offer::accepted(&job_id, token, held.message)),
            OfferPlan::RefuseNewerHeld(newer) => {
                self.send(offer::declined(&job_id, token, offer::newer_binding_held(newer)))
            }
            OfferPlan::AlreadySubmitting { same_binding: true } => {}
            OfferPlan::AlreadySubmitting { same_binding: false } => {
                self.send(offer::declined(&job_id, token, offer::ANOTHER_BINDING_SUBMITTING.into()));
            }
            OfferPlan::AlreadyFinished(result) => {
                self.send(offer::declined(&job_id, token, offer::already_ended(result.state)));
                self.send(AgentEvent::Status(result));
            }
            OfferPlan::Submit { replace } => {
                self.ledger.start_submit(&assignment, session);
                let label = TaskLabel::Submit { job_id, fencing_token: token };
                let backend = Arc::clone(&self.backend);
                let task = tasks::submit(backend, Arc::clone(&self.inventory), assignment, replace, start);
                self.spawn(label, task);
            }
        }
    }

    fn on_cancel(&mut self, job_id: &str, fencing_token: u64) {
        // A cancelled job keeps no copy here either.
        self.drop_copy_of(job_id);
        match self.ledger.cancel(job_id, fencing_token) {
            CancelPlan::Ignore => {
                tracing::debug!(cluster = %self.cluster, job = %job_id, fencing_token, "stale or repeated cancel ignored");
            }
            CancelPlan::Stop(stop) => {
                // The cancelled result goes out once the backend confirms the stop: the gateway
                // may place the job elsewhere on it.
                tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token = stop.fencing_token, "job cancelled by the gateway; stopping it");
                self.stop(stop);
            }
            CancelPlan::Deferred => {
                tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, "cancelled while its submit runs; stopped when the submit returns");
            }
            CancelPlan::Report(report) => self.send(AgentEvent::Status(report)),
        }
    }

    // ------------------------------------------------------------ backend answers and events

    fn on_task(&mut self, done: Result<(tokio::task::Id, TaskOutput), JoinError>) {
        match done {
            Ok((id, output)) => {
                self.labels.remove(&id);
                self.on_task_output(output);
            }
            Err(error) => {
                let label = self.labels.remove(&error.id());
                self.on_task_failed(label, &error);
            }
        }
    }

    fn on_task_output(&mut self, output: TaskOutput) {
        match output {
            TaskOutput::Adopted(result) => {
                match result {
                    Ok(jobs) => {
                        if !jobs.is_empty() {
                            tracing::info!(cluster = %self.cluster, jobs = jobs.len(), "adopted the jobs the member still holds");
                        }
                        self.ledger.adopt(jobs);
                    }
                    Err(error) => tracing::error!(
                        cluster = %self.cluster,
                        %error,
                        "cannot list the jobs the member holds; starting without them (jobs it still runs are not reconciled)"
                    ),
                }
                if matches!(self.link, Link::Waiting) {
                    self.dial();
                }
            }
            TaskOutput::Submitted { job_id, fencing_token, result, report } => {
                self.on_submitted(job_id, fencing_token, result, report);
            }
            TaskOutput::Cancelled { job_id, fencing_token, result } => match result {
                Ok(()) => {
                    tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, "job stopped");
                    if let Some(result) = self.ledger.stopped(&job_id, fencing_token) {
                        self.send(AgentEvent::Status(result));
                    }
                    self.report_wanted = true;
                }
                Err(error) => {
                    tracing::error!(
                        cluster = %self.cluster,
                        job = %job_id,
                        fencing_token,
                        %error,
                        "could not stop a job in the backend; it may still run on this member (listed as being stopped; tried again at the next heartbeat)"
                    );
                    self.ledger.stop_failed(&job_id, fencing_token);
                }
            },
            TaskOutput::Reported(report) => {
                self.report_in_flight = false;
                self.send_report(report);
            }
            TaskOutput::Logs { request_id, result } => self.send(AgentEvent::Logs { request_id, result }),
            TaskOutput::Quoted { request_id, result } => {
                self.quotes_in_flight = self.quotes_in_flight.saturating_sub(1);
                self.metrics.quote_answered(result.is_ok());
                self.send(AgentEvent::Quote { request_id, result });
            }
            TaskOutput::Sampled(result) => self.on_sampled(result),
            TaskOutput::Copied { job_id, copy_token, result } => self.on_copied(job_id, copy_token, result),
            TaskOutput::CopyDropped { job_id, copy_token, result } => {
                self.on_copy_dropped(&job_id, copy_token, result);
            }
        }
    }

    fn on_task_failed(&mut self, label: Option<TaskLabel>, error: &JoinError) {
        tracing::error!(cluster = %self.cluster, task = ?label, %error, "backend task failed");
        match label {
            Some(TaskLabel::Adopt) => self.on_task_output(TaskOutput::Adopted(Err(BackendError::permanent(format!(
                "the backend's list failed: {error}"
            ))))),
            Some(TaskLabel::Submit { job_id, fencing_token }) => self.on_submitted(
                job_id,
                fencing_token,
                Err(BackendError::permanent(format!("the backend's submit failed: {error}"))),
                None,
            ),
            Some(TaskLabel::Cancel { job_id, fencing_token }) => self.ledger.stop_failed(&job_id, fencing_token),
            Some(TaskLabel::Report) => self.report_in_flight = false,
            Some(TaskLabel::Sample) => self.sample_in_flight = false,
            Some(TaskLabel::Logs { request_id }) => self.send(AgentEvent::Logs {
                request_id,
                result: Err(format!("the member's backend failed while reading the output: {error}")),
            }),
            Some(TaskLabel::Quote { request_id }) => {
                self.quotes_in_flight = self.quotes_in_flight.saturating_sub(1);
                self.send(AgentEvent::Quote {
                    request_id,
                    result: Err(format!("the member's backend failed while working out a start quote: {error}")),
                });
            }
            Some(TaskLabel::Copy { job_id, copy_token }) => self.on_copied(
                job_id,
                copy_token,
                Err(BackendError::permanent(format!("the backend's copy failed: {error}"))),
            ),
            Some(TaskLabel::DropCopy { job_id, copy_token }) => self.on_copy_dropped(
                &job_id,
                copy_token,
                Err(BackendError::permanent(format!("the backend's drop failed: {error}"))),
            ),
            None => {}
        }
    }

    fn on_submitted(
        &mut self,
        job_id: String,
        fencing_token: u64,
        result: Result<Admission, BackendError>,
        report: Option<Report>,
    ) {
        let taken = matches!(result, Ok(Admission::Started { .. } | Admission::Queued { .. }));
        let Some(submitting) = self.ledger.finish_submit(&job_id, fencing_token) else {
            if taken {
                self.stop(Stop { job_id, fencing_token, result: None });
            }
            return;
        };
        // Only the stream the offer came on may hear the answer; after a reconnect the welcome
        // decides (a binding it lists had its session moved to the new stream).
        let live = self.link.welcomed_session() == Some(submitting.session);
        if let Some(doom) = submitting.doomed {
            // What the gateway learns once nothing of the binding runs here: cancelled (the
            // gateway's cancel or withdrawal), failed for requeue (the lease), or nothing (a
            // binding it no longer lists).
            let result = match doom {
                Doom::Cancelled => Some(offer::cancelled(&job_id, fencing_token)),
                Doom::LeaseExpired => {
                    Some(ledger::result(&job_id, fencing_token, JobState::Failed, LEASE_EXPIRED.into(), true))
                }
                Doom::NotInWelcome => None,
            };
            if taken {
                tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, ?doom, "stopping a job whose offer was withdrawn while it was submitted");
                self.stop(Stop { job_id: job_id.clone(), fencing_token, result });
            } else if let Some(result) = result {
                self.ledger.record(result.clone());
                self.send(AgentEvent::Status(result));
            }
            return;
        }
        match result {
            Ok(admission) => {
                match &admission {
                    Admission::Started { nodes } => {
                        tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, ?nodes, "gang started");
                    }
                    Admission::Queued { reason } => {
                        tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, %reason, "job queued locally");
                    }
                    Admission::Refused { reason, permanent } => {
                        tracing::info!(cluster = %self.cluster, job = %job_id, fencing_token, %reason, permanent, "offer refused by the local scheduler");
                    }
                }
                let answer = offer::answer(&job_id, fencing_token, admission);
                let status = answer.status();
                // Held before the acceptance, so every heartbeat after it lists the job; inventory
                // before the acceptance, so the gateway never places into these GPUs twice.
                if let Some(held) = answer.held {
                    self.ledger.hold(held);
                }
                if live {
                    if taken {
                        self.send_report_opt(report);
                    }
                    self.send(answer.reply);
                    if let Some(status) = status {
                        self.send(AgentEvent::Status(status));
                    }
                }
            }
            Err(error) => {
                // A failed submit may still have left something behind (an `sbatch` that timed
                // out after queueing the job, a pod created before the error): it is stopped
                // first, and the gateway hears of the failure only once it is — failed for
                // requeue when the error was transient, failed for good otherwise — so the job
                // cannot start elsewhere while a copy could run here.
                tracing::warn!(cluster = %self.cluster, job = %job_id, fencing_token, %error, "submit failed; stopping whatever it may have started before answering");
                let message = format!("the local scheduler on {} failed: {error}", self.cluster);
                let result = ledger::result(&job_id, fencing_token, JobState::Failed, message, error.is_transient());
                self.stop(Stop { job_id: job_id.clone(), fencing_token, result: Some(result) });
            }
        }
        for phase in submitting.early_events {
            self.on_job_event(JobEvent { job_id: job_id.clone(), fencing_token, phase });
        }
        self.report_wanted = true;
    }

    fn on_job_event(&mut self, event: JobEvent) {
        match self.ledger.apply(event) {
            EventOutcome::Changed(report) => {
                tracing::info!(cluster = %self.cluster, job = %report.job_id, state = %report.state, message = %report.message, nodes = ?report.nodes, "job changed");
                self.send(AgentEvent::Status(report));
                self.report_wanted = true;
            }
            EventOutcome::Reworded(report) => {
                // A queue that moves rewords every job in it: the heartbeat carries the words,
                // and pressure the queue's length.
                tracing::debug!(cluster = %self.cluster, job = %report.job_id, message = %report.message, "job reworded");
                self.report_wanted = true;
            }
            EventOutcome::Unchanged => {}
            EventOutcome::Finished(result) => {
                tracing::info!(cluster = %self.cluster, job = %result.job_id, state = %result.state, message = %result.message, "job finished");
                self.send(AgentEvent::Status(result));
                self.report_wanted = true;
            }
            EventOutcome::Deferred => {}
            EventOutcome::Unknown => tracing::debug!(cluster = %self.cluster, "event for a binding not held ignored"),
        }
    }

    // ------------------------------------------------------------ timers

    fn on_heartbeat_tick(&mut self) {
        if let Some(heard) = self.last_heard
            && self.link.welcomed_session().is_some()
            && heard.elapsed() > self.report_interval * SILENT_HEARTBEATS
        {
            // Three heartbeats unanswered: the gateway is paused, cut off or hung. Another may
            // lead by now; the next dial tries the others first.
            let silent_for = heard.elapsed();
            let gateway = self.link.gateway().unwrap_or_default().to_string();
            self.last_heard = None;
            self.link_lost(LinkError::Silent { gateway, silent_for });
        }
        for stop in self.ledger.stops_to_retry() {
            tracing::info!(cluster = %self.cluster, job = %stop.job_id, fencing_token = stop.fencing_token, "trying again to stop a job");
            self.stop(stop);
        }
        if self.link.welcomed_session().is_some() {
            self.send_heartbeat();
            self.report_wanted = true;
        }
    }

    fn send_heartbeat(&mut self) {
        self.heartbeat_seq += 1;
        let seq = self.heartbeat_seq;
        // Recorded before the send: the real send is no earlier, so the lease errs short.
        let now = Instant::now();
        let session = self.link.welcomed_session().unwrap_or_default();
        self.lease.heartbeat_sent(seq, now, session);
        let mut jobs = self.ledger.heartbeat();
        for report in jobs.iter_mut().filter(|r| r.state == JobState::Running) {
            report.usage = self.usage.usage(&report.job_id, report.fencing_token, now);
        }
        let unacknowledged = jobs.iter().filter(|r| r.state.is_terminal()).count();
        self.metrics.jobs(jobs.iter().filter(|r| !r.state.is_terminal()).map(|r| r.state), unacknowledged);
        self.send(AgentEvent::Heartbeat { seq, jobs });
    }

    // ------------------------------------------------------------ GPU utilisation

    fn on_sample_tick(&mut self) {
        let Some(sampling) = &self.sampling else { return };
        if !self.sample_in_flight {
            self.sample_in_flight = true;
            let task = tasks::sample(Arc::clone(&sampling.source));
            self.spawn(TaskLabel::Sample, task);
        }
    }

    fn on_sampled(&mut self, result: Result<Vec<GpuSample>, UsageError>) {
        self.sample_in_flight = false;
        let samples = match result {
            Ok(samples) => samples,
            Err(error) => {
                tracing::warn!(cluster = %self.cluster, %error, "GPU utilisation not sampled");
                self.metrics.utilization_failed();
                return;
            }
        };
        self.metrics.gpu_samples(&samples);
        let devices = self.backend.devices();
        let running = self.ledger.running().map(|report| RunningJob {
            job_id: &report.job_id,
            fencing_token: report.fencing_token,
            nodes: &report.nodes,
            devices: devices.get(&report.job_id).map(Vec::as_slice),
        });
        self.usage.record(Instant::now(), &samples, running);
    }

    /// The lease ran out: stop everything the gateway placed here and report it for requeue.
    fn on_lease_expired(&mut self) {
        let Some(length) = self.lease.expire() else { return };
        let message = format!(
            "stopped by {}: no lease renewal from the gateway for {}; the gateway places it again",
            self.cluster,
            HumanDuration(length)
        );
        let stops = self.ledger.expire(&message);
        tracing::warn!(
            cluster = %self.cluster,
            jobs = stops.len(),
            lease = %HumanDuration(length),
            "lease expired without renewal from the gateway: stopping every job it placed here; offers are refused until the gateway welcomes this agent again"
        );
        self.lease_changed();
        for stop in stops {
            self.stop(stop);
        }
        // A stream that carries no renewals is of no use; a new one brings a new welcome (the
        // gateway lets the same instance replace its own stream). The results go out after it.
        if self.link.welcomed_session().is_some() {
            tracing::info!(cluster = %self.cluster, "reconnecting to the gateway for a new welcome");
            self.redial_at(Instant::now());
        }
    }

    // ------------------------------------------------------------ helpers

    pub(super) fn spawn<F>(&mut self, label: TaskLabel, task: F)
    where
        F: Future<Output = TaskOutput> + Send + 'static,
    {
        let handle = self.tasks.spawn(task);
        self.labels.insert(handle.id(), label);
    }

    /// Stops a binding in the backend (as a task); its result, if any, is published when the
    /// backend confirms.
    fn stop(&mut self, stop: Stop) {
        self.ledger.stopping(&stop);
        let Stop { job_id, fencing_token, .. } = stop;
        let label = TaskLabel::Cancel { job_id: job_id.clone(), fencing_token };
        self.spawn(label, tasks::cancel(Arc::clone(&self.backend), job_id, fencing_token));
    }

    /// Runs the lease's expiry now if its deadline has passed (its timer may not have fired
    /// yet). Returns whether the stream was given up with it.
    fn enforce_lease(&mut self) -> bool {
        if !self.lease.is_past(Instant::now()) {
            return false;
        }
        self.on_lease_expired();
        !matches!(self.link, Link::Up { .. })
    }

    /// Tells the backend when the gateway's jobs must be stopped, for enforcement outside this
    /// process (the process runner's watchdog keeps working while the agent is frozen).
    fn lease_changed(&self) {
        let deadline = if self.lease.is_expired() {
            Some(std::time::SystemTime::now())
        } else {
            self.lease.deadline().map(|deadline| {
                let now = Instant::now();
                let wall = std::time::SystemTime::now();
                if deadline >= now { wall + (deadline - now) } else { wall - (now - deadline) }
            })
        };
        self.backend.lease_changed(deadline);
    }

    fn maybe_report(&mut self) {
        if self.report_wanted && !self.report_in_flight && self.link.welcomed_session().is_some() {
            self.report_wanted = false;
            self.report_in_flight = true;
            self.spawn(TaskLabel::Report, tasks::report(Arc::clone(&self.inventory)));
        }
    }

    fn send_report_opt(&mut self, report: Option<Report>) {
        if let Some(report) = report {
            self.send_report(report);
        }
    }

    fn send_report(&mut self, report: Report) {
        match report.inventory {
            Ok(inventory) => {
                self.metrics.inventory(&inventory);
                self.send(AgentEvent::Inventory(inventory));
            }
            Err(error) => tracing::warn!(cluster = %self.cluster, %error, "inventory unavailable"),
        }
        match report.pressure {
            Ok(pressure) => self.send(AgentEvent::Pressure(pressure)),
            Err(error) => tracing::warn!(cluster = %self.cluster, %error, "queue pressure unavailable"),
        }
    }

    /// Queues `event` on the welcomed stream; without one it is dropped (the outbox and the next
    /// heartbeat carry everything that matters).
    pub(super) fn send(&mut self, event: AgentEvent) {
        let Link::Up { connection, welcomed: true, .. } = &self.link else { return };
        match connection.outbound.try_send(event) {
            Ok(()) => {}
            // The gateway reads slower than this agent writes: dropping the stream would cost
            // a reconnect and a reconcile. The message is dropped instead; the next heartbeat
            // lists every binding's state and result, and the lease bounds a gateway that has
            // stopped reading altogether.
            Err(TrySendError::Full(_)) => {
                tracing::debug!(cluster = %self.cluster, "the gateway stream's outbound queue is full; message dropped");
                self.metrics.message_dropped();
            }
            Err(TrySendError::Closed(_)) => self.link_lost(LinkError::Closed),
        }
    }
}

/// What a gateway message is, for logs: its kind and the job it is about, if any.
fn describe(message: &Inbound) -> (&'static str, Option<&str>) {
    match message {
        Inbound::Command(command) => match command.as_ref() {
            GatewayCommand::Welcome { .. } => ("welcome", None),
            GatewayCommand::Offer(assignment) => ("offer", Some(&assignment.job_id)),
            GatewayCommand::Cancel { job_id, .. } => ("cancel", Some(job_id)),
            GatewayCommand::Ack { job_id, .. } => ("ack", Some(job_id)),
            GatewayCommand::Lease { .. } => ("lease", None),
            GatewayCommand::Logs { job_id, .. } => ("logs", Some(job_id)),
            GatewayCommand::Quote { job_id, .. } => ("quote", Some(job_id)),
            GatewayCommand::Copy { assignment, .. } => ("copy", Some(&assignment.job_id)),
            GatewayCommand::Grant { assignment, .. } => ("grant", Some(&assignment.job_id)),
            GatewayCommand::DropCopy { job_id, .. } => ("drop copy", Some(job_id)),
        },
        Inbound::InvalidOffer { job_id, .. } => ("offer", Some(job_id)),
        Inbound::Invalid(_) => ("invalid", None),
    }
}

/// Waits for the next tick of `timer`, or forever when there is none.
async fn tick_opt(timer: Option<&mut tokio::time::Interval>) {
    match timer {
        Some(timer) => {
            timer.tick().await;
        }
        None => std::future::pending().await,
    }
}
