//! The agent's one event loop. It owns all state (ledger, lease, link, tasks, sibling copies) and
//! reacts to six sources: the gateway link, finished backend tasks, backend job events, backend
//! copy events, the heartbeat timer and the lease deadline. Timers and backend events run whether
//! or not a stream is up, and no backend call is awaited here: each runs as a task and its answer
//! comes back as a message.
//!
//! This file holds the loop, the backend's answers and events, the timers and the lease; the
//! gateway stream's handling is in `stream.rs`, offers, cancels and the welcome in `offers.rs`,
//! sibling copies in `siblings.rs`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};

use super::epoch::EpochGate;
use super::lease::Lease;
use super::ledger::{EventOutcome, Ledger, Stop};
use super::link::{Dial, Link, LinkError};
use super::siblings::{self, Copies};
use super::tasks::{self, Report, TaskLabel, TaskOutput};
use crate::backend::{BackendError, CopyEventReceiver, InventorySource, JobEvent, JobEventReceiver, LocalBackend};
use crate::metrics::AgentMetrics;
use crate::usage::window::RunningJob;
use crate::usage::{GpuSample, Sampling, UsageError, UsageWindow};

/// Heartbeats a gateway that grants leases may leave unanswered before the agent gives up its
/// stream and looks for the leader again.
const SILENT_HEARTBEATS: u32 = 3;

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

    /// Applies a backend job event to the ledger and tells the gateway what changed.
    pub(super) fn on_job_event(&mut self, event: JobEvent) {
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

    pub(super) fn send_heartbeat(&mut self) {
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
    pub(super) fn stop(&mut self, stop: Stop) {
        self.ledger.stopping(&stop);
        let Stop { job_id, fencing_token, .. } = stop;
        let label = TaskLabel::Cancel { job_id: job_id.clone(), fencing_token };
        self.spawn(label, tasks::cancel(Arc::clone(&self.backend), job_id, fencing_token));
    }

    /// Runs the lease's expiry now if its deadline has passed (its timer may not have fired
    /// yet). Returns whether the stream was given up with it.
    pub(super) fn enforce_lease(&mut self) -> bool {
        if !self.lease.is_past(Instant::now()) {
            return false;
        }
        self.on_lease_expired();
        !matches!(self.link, Link::Up { .. })
    }

    /// Tells the backend when the gateway's jobs must be stopped, for enforcement outside this
    /// process (the process runner's watchdog keeps working while the agent is frozen).
    pub(super) fn lease_changed(&self) {
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

    pub(super) fn send_report_opt(&mut self, report: Option<Report>) {
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
