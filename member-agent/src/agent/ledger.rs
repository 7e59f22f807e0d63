//! What the agent holds for the gateway: live bindings, offers being submitted, bindings being
//! stopped, and the outbox of terminal results waiting for the gateway's acknowledgement.
//!
//! Pure bookkeeping, no I/O: each method says what changed and the event loop does the sending
//! and the backend calls. A job is identified by (job id, fencing token) everywhere.
//!
//! A binding is in exactly one place, and every place is listed in each heartbeat, so the
//! gateway never takes a binding this member may still run for one it does not: held (`Bound`
//! or `Running`), being submitted (`Offered`), being stopped (`Unknown`), or finished (its result
//! in the outbox). A stop's result (cancelled, or failed for requeue) enters the outbox only once
//! the backend has confirmed the stop: the gateway may place the job elsewhere on that result.

use std::collections::{BTreeMap, BTreeSet};

use meridian_proto::job::JobState;
use meridian_proto::protocol::{Assignment, JobReport};
use meridian_scheduler::offer::{self, Holdings};

use crate::backend::{HeldJob, JobEvent, JobPhase};

/// The agent's record of every binding.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// Bindings the member holds, by job id: `Bound` while queued locally (message: why), or
    /// `Running` (with nodes).
    held: BTreeMap<String, JobReport>,
    /// Offers whose submit is under way, by job id.
    submitting: BTreeMap<String, Submitting>,
    /// Bindings being stopped in the backend (or whose stop failed and waits for a retry), by
    /// job id.
    stopping: BTreeMap<String, Stopping>,
    /// Terminal results not yet acknowledged, by (job id, token).
    outbox: BTreeMap<(String, u64), JobReport>,
}

/// An offer whose submit is under way.
#[derive(Debug)]
pub(crate) struct Submitting {
    /// The offer's binding.
    pub(crate) fencing_token: u64,
    /// The gateway session the offer came on; the answer goes only to that session.
    pub(crate) session: u64,
    /// Set when the job must be stopped as soon as the submit returns.
    pub(crate) doomed: Option<Doom>,
    /// Backend events for this binding that arrived before the submit's answer.
    pub(crate) early_events: Vec<JobPhase>,
}

/// A binding whose stop is under way in the backend.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stopping {
    /// The binding.
    pub(crate) fencing_token: u64,
    /// The result to publish once the backend confirms the stop; None for a binding nobody
    /// expects a result of (the gateway no longer lists it).
    pub(crate) result: Option<JobReport>,
    /// A backend cancel is running; false after one failed (it is retried).
    pub(crate) in_progress: bool,
}

/// A stop for the event loop to run in the backend.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stop {
    /// The job.
    pub(crate) job_id: String,
    /// The binding.
    pub(crate) fencing_token: u64,
    /// The result to publish once it is stopped (see [`Stopping::result`]).
    pub(crate) result: Option<JobReport>,
}

/// Why an offer being submitted must be stopped once the submit returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doom {
    /// The gateway cancelled it.
    Cancelled,
    /// A welcome on a later session did not list it.
    NotInWelcome,
    /// The lease ran out.
    LeaseExpired,
}

/// How to answer an offer ([`offer::plan_offer`]), with the held binding or its result.
pub(crate) type OfferPlan = offer::OfferPlan<JobReport>;

/// What a cancel from the gateway does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CancelPlan {
    /// A newer binding is held (or being submitted), or this one is being stopped already.
    Ignore,
    /// Stop it in the backend; its cancelled result follows once the stop is confirmed.
    Stop(Stop),
    /// Its submit is under way: it is stopped when the submit returns, and reported then.
    Deferred,
    /// Nothing of it runs here (or it already finished); report `report`.
    Report(JobReport),
}

/// What a backend event did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum EventOutcome {
    /// A held binding changed state (queued to running, new nodes): send it now.
    Changed(JobReport),
    /// Only the words changed (a local queue position, a new pending reason): the next
    /// heartbeat carries them. Sending each at once floods the stream when a queue moves.
    Reworded(JobReport),
    /// Nothing changed.
    Unchanged,
    /// A held binding ended; its result is in the outbox.
    Finished(JobReport),
    /// The binding's submit has not returned yet; the event is applied when it does.
    Deferred,
    /// Not a binding the agent holds (stopped meanwhile, or stale).
    Unknown,
}

/// What a welcome's reconcile did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Reconciled {
    /// Held bindings the gateway does not expect here: stop them in the backend.
    pub(crate) stop: Vec<Stop>,
    /// Bindings the gateway expects that the member does not hold: reported lost (in the outbox).
    pub(crate) lost: Vec<JobReport>,
    /// Results dropped because the gateway no longer expects their binding.
    pub(crate) dropped_results: usize,
    /// Held bindings kept.
    pub(crate) kept: usize,
}

impl Ledger {
    /// Every binding to list in a heartbeat: held ones, offers being submitted (`Offered`),
    /// bindings being stopped (`Unknown`), then unacknowledged results.
    pub(crate) fn heartbeat(&self) -> Vec<JobReport> {
        let submitting = self.submitting.iter().map(|(job_id, s)| {
            offer::report(job_id, s.fencing_token, JobState::Offered, "being submitted to the local scheduler".into())
        });
        let stopping = self
            .stopping
            .iter()
            .map(|(job_id, s)| offer::report(job_id, s.fencing_token, JobState::Unknown, "being stopped".into()));
        self.held.values().cloned().chain(submitting).chain(stopping).chain(self.outbox.values().cloned()).collect()
    }

    /// The bindings running now (with their nodes).
    pub(crate) fn running(&self) -> impl Iterator<Item = &JobReport> + '_ {
        self.held.values().filter(|r| r.state == JobState::Running)
    }

    /// Unacknowledged results, to send after a welcome.
    pub(crate) fn results(&self) -> Vec<JobReport> {
        self.outbox.values().cloned().collect()
    }

    /// Adopts what a restarted agent's backend still holds: live bindings are held, finished
    /// ones go to the outbox.
    pub(crate) fn adopt(&mut self, jobs: Vec<HeldJob>) {
        for job in jobs {
            let report = report(&job.job_id, job.fencing_token, job.phase);
            if report.state.is_terminal() {
                self.outbox.insert((job.job_id, job.fencing_token), report);
            } else {
                self.held.insert(job.job_id, report);
            }
        }
    }

    /// Whether the member holds a binding of `job_id` (held, being submitted or being stopped).
    pub(crate) fn holds(&self, job_id: &str) -> bool {
        self.held.contains_key(job_id) || self.submitting.contains_key(job_id) || self.stopping.contains_key(job_id)
    }

    /// How to answer an offer of `assignment`.
    pub(crate) fn plan_offer(&self, assignment: &Assignment) -> OfferPlan {
        let holdings = self.holdings(&assignment.job_id, assignment.fencing_token);
        offer::plan_offer(assignment.fencing_token, holdings).map(JobReport::clone)
    }

    /// What this ledger holds of `job_id`, for an offer or cancel of binding `fencing_token`.
    fn holdings(&self, job_id: &str, fencing_token: u64) -> Holdings<&JobReport> {
        Holdings {
            held: self.held.get(job_id).map(|held| (held.fencing_token, held)),
            submitting: self.submitting.get(job_id).map(|s| s.fencing_token),
            stopping: self
                .stopping
                .get(job_id)
                .map(|s| offer::Stopping { fencing_token: s.fencing_token, in_progress: s.in_progress }),
            finished: self.outbox.get(&(job_id.to_string(), fencing_token)),
        }
    }

    /// Records that `assignment` is being submitted on `session` (after [`OfferPlan::Submit`]);
    /// an older held binding it replaces stops being held.
    pub(crate) fn start_submit(&mut self, assignment: &Assignment, session: u64) {
        if self.held.get(&assignment.job_id).is_some_and(|h| h.fencing_token < assignment.fencing_token) {
            self.held.remove(&assignment.job_id);
        }
        self.submitting.insert(
            assignment.job_id.clone(),
            Submitting { fencing_token: assignment.fencing_token, session, doomed: None, early_events: Vec::new() },
        );
    }

    /// The submit of (`job_id`, `fencing_token`) returned; forgets it and says how it was.
    pub(crate) fn finish_submit(&mut self, job_id: &str, fencing_token: u64) -> Option<Submitting> {
        match self.submitting.get(job_id) {
            Some(s) if s.fencing_token == fencing_token => self.submitting.remove(job_id),
            _ => None,
        }
    }

    /// Holds a binding whose submit was accepted (queued locally or running).
    pub(crate) fn hold(&mut self, report: JobReport) {
        self.held.insert(report.job_id.clone(), report);
    }

    /// A cancel of (`job_id`, `fencing_token`) from the gateway ([`offer::plan_cancel`]).
    pub(crate) fn cancel(&mut self, job_id: &str, fencing_token: u64) -> CancelPlan {
        match offer::plan_cancel(fencing_token, self.holdings(job_id, fencing_token)) {
            offer::CancelPlan::Ignore => CancelPlan::Ignore,
            offer::CancelPlan::StopHeld { fencing_token: held } => {
                self.held.remove(job_id);
                let result = Some(offer::cancelled(job_id, held));
                CancelPlan::Stop(Stop { job_id: job_id.to_string(), fencing_token: held, result })
            }
            offer::CancelPlan::RetryStop => {
                let kept = self.stopping.get(job_id).and_then(|s| s.result.clone());
                let result = kept.or_else(|| Some(offer::cancelled(job_id, fencing_token)));
                CancelPlan::Stop(Stop { job_id: job_id.to_string(), fencing_token, result })
            }
            offer::CancelPlan::Deferred => {
                if let Some(submitting) = self.submitting.get_mut(job_id) {
                    submitting.doomed = Some(Doom::Cancelled);
                }
                CancelPlan::Deferred
            }
            offer::CancelPlan::ReportAgain(result) => CancelPlan::Report(result.clone()),
            // Say so, so the gateway can close the binding.
            offer::CancelPlan::ReportNotHeld => CancelPlan::Report(self.finish(
                job_id,
                fencing_token,
                JobState::Cancelled,
                offer::NOT_HELD.into(),
                false,
            )),
        }
    }

    /// A backend event.
    pub(crate) fn apply(&mut self, event: JobEvent) -> EventOutcome {
        if let Some(submitting) = self.submitting.get_mut(&event.job_id)
            && submitting.fencing_token == event.fencing_token
        {
            submitting.early_events.push(event.phase);
            return EventOutcome::Deferred;
        }
        let Some(held) = self.held.get_mut(&event.job_id) else { return EventOutcome::Unknown };
        if held.fencing_token != event.fencing_token {
            return EventOutcome::Unknown;
        }
        let update = report(&event.job_id, event.fencing_token, event.phase);
        if update.state.is_terminal() {
            self.held.remove(&event.job_id);
            self.outbox.insert((event.job_id, event.fencing_token), update.clone());
            EventOutcome::Finished(update)
        } else if held.state != update.state || held.nodes != update.nodes {
            *held = update.clone();
            EventOutcome::Changed(update)
        } else if held.message != update.message {
            *held = update.clone();
            EventOutcome::Reworded(update)
        } else {
            EventOutcome::Unchanged
        }
    }

    /// Records a terminal result in the outbox (replacing any earlier one for the binding).
    pub(crate) fn finish(
        &mut self,
        job_id: &str,
        fencing_token: u64,
        state: JobState,
        message: String,
        requeue: bool,
    ) -> JobReport {
        let report = result(job_id, fencing_token, state, message, requeue);
        self.record(report.clone());
        report
    }

    /// Puts a terminal result in the outbox.
    pub(crate) fn record(&mut self, result: JobReport) {
        self.outbox.insert((result.job_id.clone(), result.fencing_token), result);
    }

    /// The gateway recorded the result of (`job_id`, `fencing_token`): forget it. Returns
    /// whether it was in the outbox.
    pub(crate) fn ack(&mut self, job_id: &str, fencing_token: u64) -> bool {
        self.outbox.remove(&(job_id.to_string(), fencing_token)).is_some()
    }

    /// A stop of `stop` is under way in the backend. A stop of the same binding already
    /// recorded keeps its result unless this one brings one.
    pub(crate) fn stopping(&mut self, stop: &Stop) {
        let result = match self.stopping.get(&stop.job_id) {
            Some(existing) if existing.fencing_token == stop.fencing_token && stop.result.is_none() => {
                existing.result.clone()
            }
            _ => stop.result.clone(),
        };
        if self.held.get(&stop.job_id).is_some_and(|held| held.fencing_token <= stop.fencing_token) {
            self.held.remove(&stop.job_id);
        }
        self.stopping
            .insert(stop.job_id.clone(), Stopping { fencing_token: stop.fencing_token, result, in_progress: true });
    }

    /// The backend confirmed the stop of (`job_id`, `fencing_token`): the binding is gone, and
    /// its result (if one is expected) enters the outbox. Returns that result, to send.
    pub(crate) fn stopped(&mut self, job_id: &str, fencing_token: u64) -> Option<JobReport> {
        if self.stopping.get(job_id).is_none_or(|s| s.fencing_token != fencing_token) {
            return None;
        }
        let result = self.stopping.remove(job_id)?.result?;
        self.record(result.clone());
        Some(result)
    }

    /// The stop of (`job_id`, `fencing_token`) failed: the binding may still run. It stays
    /// listed (as being stopped) and is tried again.
    pub(crate) fn stop_failed(&mut self, job_id: &str, fencing_token: u64) {
        if let Some(stopping) = self.stopping.get_mut(job_id)
            && stopping.fencing_token == fencing_token
        {
            stopping.in_progress = false;
        }
    }

    /// Stops that failed, to try again.
    pub(crate) fn stops_to_retry(&self) -> Vec<Stop> {
        self.stopping
            .iter()
            .filter(|(_, s)| !s.in_progress)
            .map(|(job_id, s)| Stop {
                job_id: job_id.clone(),
                fencing_token: s.fencing_token,
                result: s.result.clone(),
            })
            .collect()
    }

    /// A welcome listing `bound` on `session`: keep exactly those bindings.
    pub(crate) fn reconcile(&mut self, bound: &[Assignment], session: u64, cluster: &str) -> Reconciled {
        let expected: BTreeMap<&str, u64> = bound.iter().map(|a| (a.job_id.as_str(), a.fencing_token)).collect();
        let mut done = Reconciled::default();
        let held = std::mem::take(&mut self.held);
        for (job_id, report) in held {
            if expected.get(job_id.as_str()) == Some(&report.fencing_token) {
                self.held.insert(job_id, report);
                done.kept += 1;
            } else {
                done.stop.push(Stop { job_id, fencing_token: report.fencing_token, result: None });
            }
        }
        for (job_id, stopping) in &mut self.stopping {
            if expected.get(job_id.as_str()) != Some(&stopping.fencing_token) {
                // Still stopped, but nobody waits for its result any more.
                stopping.result = None;
            }
        }
        for (job_id, submitting) in &mut self.submitting {
            if expected.get(job_id.as_str()) == Some(&submitting.fencing_token) {
                // The gateway knows this binding: the answer now belongs to this session.
                submitting.session = session;
            } else if submitting.session != session {
                submitting.doomed.get_or_insert(Doom::NotInWelcome);
            }
        }
        let before = self.outbox.len();
        self.outbox.retain(|(job_id, token), _| expected.get(job_id.as_str()) == Some(token));
        done.dropped_results = before - self.outbox.len();
        let present: BTreeSet<(&str, u64)> = self
            .held
            .iter()
            .map(|(id, r)| (id.as_str(), r.fencing_token))
            .chain(self.submitting.iter().map(|(id, s)| (id.as_str(), s.fencing_token)))
            .chain(self.stopping.iter().map(|(id, s)| (id.as_str(), s.fencing_token)))
            .chain(self.outbox.keys().map(|(id, token)| (id.as_str(), *token)))
            .collect();
        let lost: Vec<(String, u64)> = expected
            .iter()
            .filter(|(id, token)| !present.contains(&(**id, **token)))
            .map(|(id, token)| ((*id).to_string(), *token))
            .collect();
        for (job_id, token) in lost {
            let message = format!(
                "{cluster} does not hold this job (the agent restarted or its scheduler lost it); the gateway places it again"
            );
            done.lost.push(self.finish(&job_id, token, JobState::Failed, message, true));
        }
        done
    }

    /// The lease ran out: every held binding is stopped and, once stopped, reported `Failed`
    /// for requeue; every submit under way is stopped when it returns; every failed stop is
    /// tried again. Returns the stops to run.
    pub(crate) fn expire(&mut self, message: &str) -> Vec<Stop> {
        let held = std::mem::take(&mut self.held);
        let mut stops = self.stops_to_retry();
        for (job_id, report) in held {
            let result = result(&job_id, report.fencing_token, JobState::Failed, message.to_string(), true);
            stops.push(Stop { job_id, fencing_token: report.fencing_token, result: Some(result) });
        }
        for submitting in self.submitting.values_mut() {
            submitting.doomed.get_or_insert(Doom::LeaseExpired);
        }
        stops
    }
}

/// A terminal result of a binding.
pub(crate) fn result(job_id: &str, fencing_token: u64, state: JobState, message: String, requeue: bool) -> JobReport {
    JobReport { requeue, ..offer::report(job_id, fencing_token, state, message) }
}

/// A job report for a backend phase.
pub(crate) fn report(job_id: &str, fencing_token: u64, phase: JobPhase) -> JobReport {
    let (state, message, nodes) = match phase {
        JobPhase::Pending { reason } => (JobState::Bound, reason, Vec::new()),
        JobPhase::Running { nodes } => (JobState::Running, String::new(), nodes),
        JobPhase::Succeeded { message } => (JobState::Succeeded, message, Vec::new()),
        JobPhase::Failed { message } => (JobState::Failed, message, Vec::new()),
        JobPhase::Preempted { message } => {
            // On the wire a preemption is a terminal report for requeue, flagged as such: a
            // gateway that does not know the flag still places the job again.
            let report = offer::report(job_id, fencing_token, JobState::Failed, message);
            return JobReport { requeue: true, preempted: true, ..report };
        }
    };
    JobReport { nodes, ..offer::report(job_id, fencing_token, state, message) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tests::assignment;

    fn running(job_id: &str, token: u64) -> JobReport {
        report(job_id, token, JobPhase::Running { nodes: vec!["n-0".into()] })
    }

    fn event(job_id: &str, token: u64, phase: JobPhase) -> JobEvent {
        JobEvent { job_id: job_id.into(), fencing_token: token, phase }
    }

    #[test]
    fn an_offer_for_a_held_binding_is_accepted_again_and_an_older_one_is_replaced() {
        let mut ledger = Ledger::default();
        ledger.hold(running("j", 3));
        assert_eq!(ledger.plan_offer(&assignment("j", 3)), OfferPlan::AcceptAgain(running("j", 3)));
        assert_eq!(ledger.plan_offer(&assignment("j", 2)), OfferPlan::RefuseNewerHeld(3));
        assert_eq!(ledger.plan_offer(&assignment("j", 4)), OfferPlan::Submit { replace: Some(3) });
        ledger.start_submit(&assignment("j", 4), 1);
        let listed: Vec<(String, u64, JobState)> =
            ledger.heartbeat().into_iter().map(|r| (r.job_id, r.fencing_token, r.state)).collect();
        assert_eq!(listed, [("j".to_string(), 4, JobState::Offered)], "the replaced binding is no longer held");
        assert_eq!(ledger.plan_offer(&assignment("j", 4)), OfferPlan::AlreadySubmitting { same_binding: true });
    }

    #[test]
    fn a_finished_binding_stays_in_the_outbox_until_acked() {
        let mut ledger = Ledger::default();
        ledger.hold(running("j", 1));
        let outcome = ledger.apply(event("j", 1, JobPhase::Succeeded { message: "ok".into() }));
        let EventOutcome::Finished(result) = outcome else { panic!("{outcome:?}") };
        assert_eq!(result.state, JobState::Succeeded);
        assert_eq!(ledger.heartbeat(), vec![result.clone()]);
        assert!(!ledger.ack("j", 2), "an ack for another binding changes nothing");
        assert_eq!(ledger.heartbeat(), vec![result]);
        assert!(ledger.ack("j", 1));
        assert!(ledger.heartbeat().is_empty());
    }

    #[test]
    fn events_for_other_bindings_are_ignored_and_early_ones_wait_for_the_submit() {
        let mut ledger = Ledger::default();
        ledger.hold(running("j", 2));
        assert_eq!(ledger.apply(event("j", 1, JobPhase::Failed { message: "x".into() })), EventOutcome::Unknown);
        assert_eq!(ledger.apply(event("other", 1, JobPhase::Failed { message: "x".into() })), EventOutcome::Unknown);
        ledger.start_submit(&assignment("k", 1), 1);
        assert_eq!(ledger.apply(event("k", 1, JobPhase::Running { nodes: vec![] })), EventOutcome::Deferred);
        let submitting = ledger.finish_submit("k", 1).unwrap();
        assert_eq!(submitting.early_events.len(), 1);
    }

    fn states(ledger: &Ledger) -> Vec<(String, u64, JobState)> {
        ledger.heartbeat().into_iter().map(|r| (r.job_id, r.fencing_token, r.state)).collect()
    }

    #[test]
    fn a_cancelled_binding_is_listed_as_being_stopped_until_the_backend_confirms() {
        let mut ledger = Ledger::default();
        ledger.hold(running("j", 5));
        assert_eq!(ledger.cancel("j", 4), CancelPlan::Ignore);
        let CancelPlan::Stop(stop) = ledger.cancel("j", 5) else { panic!() };
        assert_eq!((stop.fencing_token, stop.result.as_ref().map(|r| r.state)), (5, Some(JobState::Cancelled)));
        ledger.stopping(&stop);
        assert_eq!(states(&ledger), [("j".to_string(), 5, JobState::Unknown)], "no result before the stop is done");
        assert_eq!(ledger.cancel("j", 5), CancelPlan::Ignore, "a repeated cancel while it stops");
        let result = ledger.stopped("j", 5).unwrap();
        assert_eq!(result.state, JobState::Cancelled);
        assert_eq!(ledger.heartbeat(), vec![result]);
    }

    #[test]
    fn a_failed_stop_stays_listed_and_is_tried_again() {
        let mut ledger = Ledger::default();
        ledger.hold(running("j", 5));
        let CancelPlan::Stop(stop) = ledger.cancel("j", 5) else { panic!() };
        ledger.stopping(&stop);
        ledger.stop_failed("j", 5);
        assert_eq!(states(&ledger), [("j".to_string(), 5, JobState::Unknown)]);
        assert_eq!(ledger.stops_to_retry(), vec![stop.clone()]);
        assert!(matches!(ledger.cancel("j", 5), CancelPlan::Stop(again) if again == stop));
    }

    #[test]
    fn a_cancel_during_a_submit_dooms_it_and_reports_nothing_yet() {
        let mut ledger = Ledger::default();
        ledger.start_submit(&assignment("j", 1), 1);
        assert_eq!(states(&ledger), [("j".to_string(), 1, JobState::Offered)], "a submit under way is listed");
        assert_eq!(ledger.cancel("j", 1), CancelPlan::Deferred);
        assert_eq!(ledger.finish_submit("j", 1).unwrap().doomed, Some(Doom::Cancelled));
    }

    #[test]
    fn reconcile_keeps_listed_bindings_stops_the_rest_and_reports_the_lost() {
        let mut ledger = Ledger::default();
        ledger.hold(running("keep", 1));
        ledger.hold(running("other-token", 2));
        ledger.hold(running("unlisted", 3));
        ledger.finish("done", 4, JobState::Succeeded, "ok".into(), false);
        ledger.finish("stale-result", 5, JobState::Succeeded, "ok".into(), false);
        ledger.start_submit(&assignment("in-flight", 6), 1);
        ledger.start_submit(&assignment("in-flight-listed", 7), 1);
        let bound = [
            assignment("keep", 1),
            assignment("other-token", 9),
            assignment("done", 4),
            assignment("gone", 8),
            assignment("in-flight-listed", 7),
        ];
        let done = ledger.reconcile(&bound, 2, "east");
        assert_eq!(done.kept, 1);
        let stopped: Vec<(&str, u64, bool)> =
            done.stop.iter().map(|s| (s.job_id.as_str(), s.fencing_token, s.result.is_some())).collect();
        assert_eq!(stopped, [("other-token", 2, false), ("unlisted", 3, false)], "stale copies: stopped, no result");
        assert_eq!(done.dropped_results, 1);
        let lost: Vec<(&str, u64, bool)> =
            done.lost.iter().map(|r| (r.job_id.as_str(), r.fencing_token, r.requeue)).collect();
        assert_eq!(lost, [("gone", 8, true), ("other-token", 9, true)]);
        assert_eq!(ledger.finish_submit("in-flight", 6).unwrap().doomed, Some(Doom::NotInWelcome));
        let listed = ledger.finish_submit("in-flight-listed", 7).unwrap();
        assert_eq!((listed.doomed, listed.session), (None, 2));
        let heartbeat: Vec<(String, u64)> =
            ledger.heartbeat().into_iter().map(|r| (r.job_id, r.fencing_token)).collect();
        assert_eq!(heartbeat, [("keep".into(), 1), ("done".into(), 4), ("gone".into(), 8), ("other-token".into(), 9)]);
    }

    #[test]
    fn a_preempted_phase_is_reported_for_requeue_and_flagged_preempted() {
        let message = "preempted for higher-priority work after 12.0s".to_string();
        let sent = report("j", 4, JobPhase::Preempted { message: message.clone() });
        assert_eq!((sent.state, sent.requeue, sent.preempted), (JobState::Failed, true, true));
        assert_eq!(sent.message, message);
        let failed = report("j", 4, JobPhase::Failed { message: "exit 1".into() });
        assert!(!failed.requeue && !failed.preempted);
    }

    #[test]
    fn an_expired_lease_turns_every_held_binding_into_a_requeued_failure() {
        let mut ledger = Ledger::default();
        ledger.hold(running("a", 1));
        ledger.hold(report("b", 2, JobPhase::Pending { reason: "busy".into() }));
        ledger.start_submit(&assignment("c", 3), 1);
        let stops = ledger.expire("lease ran out");
        let planned: Vec<(&str, u64)> = stops.iter().map(|s| (s.job_id.as_str(), s.fencing_token)).collect();
        assert_eq!(planned, [("a", 1), ("b", 2)]);
        assert!(stops.iter().all(|s| s.result.as_ref().is_some_and(|r| r.state == JobState::Failed && r.requeue)));
        for stop in &stops {
            ledger.stopping(stop);
        }
        assert!(
            ledger.heartbeat().iter().all(|r| !r.state.is_terminal()),
            "the requeue results wait for the stops: the gateway must not place the jobs elsewhere before"
        );
        assert!(ledger.stopped("a", 1).is_some_and(|r| r.requeue));
        assert_eq!(ledger.finish_submit("c", 3).unwrap().doomed, Some(Doom::LeaseExpired));
    }
}
