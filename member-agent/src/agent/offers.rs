//! Offers, cancels and the welcome's reconcile, as the event loop handles them: the welcome that
//! keeps exactly the bindings the gateway lists, an offer (or grant) answered from the ledger's
//! plan and started as a submit task, that task's answer, a cancel, and start quotes.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, Assignment};
use meridian_scheduler::offer;
use tokio::time::Instant;

use super::event_loop::EventLoop;
use super::ledger::{self, CancelPlan, Doom, OfferPlan, Stop};
use super::link::{BACKOFF_MIN, Link};
use super::tasks::{self, Report, Start, TaskLabel};
use crate::backend::{Admission, BackendError, JobEvent};

/// The reason given for offers refused while the lease is expired.
pub(super) const LEASE_EXPIRED: &str =
    "this agent's lease expired; it takes no jobs until the gateway welcomes it again";

impl EventLoop {
    /// Keeps exactly the bindings the gateway lists, reports the rest, and starts heartbeating.
    pub(super) fn on_welcome(&mut self, bound: &[Assignment], lease: Option<Duration>) {
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

    /// A cancel: stops the binding it names (at once, or when its submit returns; the cancelled
    /// result goes out once the backend confirms the stop), or reports it when nothing of it runs
    /// here. A copy of the job is dropped too.
    pub(super) fn on_cancel(&mut self, job_id: &str, fencing_token: u64) {
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

    /// A submit task's answer: tells the gateway on the stream the offer came on, or stops what
    /// was started when the binding was withdrawn meanwhile or the submit failed.
    pub(super) fn on_submitted(
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

    /// Works out a start quote as a task, unless [`tasks::MAX_QUOTES_IN_FLIGHT`] are under way:
    /// then it answers at once that the member is busy (the gateway keeps its own estimate and
    /// may ask again later).
    pub(super) fn on_quote(&mut self, request_id: u64, job_id: String, spec: meridian_proto::spec::JobSpec) {
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
}
