//! The member's answer to an offer: what an agent does when the gateway offers it a binding or
//! cancels one, given what it already holds of the job, and what it tells the gateway once its
//! local scheduler answered the submit.
//!
//! Pure decisions, no I/O and no clock: the live agent (`meridian-agent`'s event loop and ledger)
//! and the simulator's agents both call them, so the lab's agents answer the way real ones do.
//! Both keep their own books (the agent a ledger with submits and stops under way, the simulator
//! a map of held tokens) and describe them here as [`Holdings`].

use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, JobReport};

/// Why a binding is declined while another binding of the same job is being submitted.
pub const ANOTHER_BINDING_SUBMITTING: &str =
    "another binding of this job is still being submitted here; offer it again later";

/// The message of a binding stopped because the gateway cancelled it.
pub const STOPPED_BY_THE_GATEWAY: &str = "stopped by the gateway";

/// The message of a cancel for a binding of which nothing runs here.
pub const NOT_HELD: &str = "not held here; nothing to stop";

/// What the member holds of one job when an offer or a cancel of one of its bindings arrives.
///
/// Each place names the fencing token of the binding in it; `R` is whatever record the caller
/// keeps of a binding (the agent's [`JobReport`], nothing in the simulator), handed back in the
/// plan so the caller need not look it up again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holdings<R = ()> {
    /// The binding held (queued locally or running), with its record.
    pub held: Option<(u64, R)>,
    /// The binding whose submit is under way.
    pub submitting: Option<u64>,
    /// The binding being stopped in the backend.
    pub stopping: Option<Stopping>,
    /// The result of the very binding offered or cancelled, if it already ended here and the
    /// gateway has not acknowledged it yet.
    pub finished: Option<R>,
}

/// A binding whose stop is under way (or failed and waits for a retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopping {
    /// The binding.
    pub fencing_token: u64,
    /// A backend cancel is running; false after one failed.
    pub in_progress: bool,
}

/// How to answer an offer, before anything is submitted.
#[derive(Debug, Clone, PartialEq)]
pub enum OfferPlan<R = ()> {
    /// This binding is already held: accept again (with the held record's words).
    AcceptAgain(R),
    /// A newer binding of the job is held here: decline.
    RefuseNewerHeld(u64),
    /// A submit of this job is already under way. The same binding: say nothing, its answer
    /// comes when the submit returns; another one: decline ([`ANOTHER_BINDING_SUBMITTING`]).
    AlreadySubmitting {
        /// Whether it is this very binding.
        same_binding: bool,
    },
    /// This binding already finished here: decline, and send its result again.
    AlreadyFinished(R),
    /// Submit it, first cancelling the older binding `replace` if set.
    Submit {
        /// An older binding of the job that the member still holds (or is still stopping).
        replace: Option<u64>,
    },
}

/// What a cancel from the gateway does.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelPlan<R = ()> {
    /// A newer binding is held (or being submitted), or this one is being stopped already.
    Ignore,
    /// Stop the held binding `fencing_token` (the cancelled one or an older one); report it
    /// cancelled once the backend confirms.
    StopHeld {
        /// The held binding to stop.
        fencing_token: u64,
    },
    /// The binding's last stop failed: try again, and report it once the stop works.
    RetryStop,
    /// Its submit is under way: stop it when the submit returns, and report it then.
    Deferred,
    /// It already finished here: report this result again.
    ReportAgain(R),
    /// Nothing of it runs here: report it cancelled ([`NOT_HELD`]) so the gateway can close it.
    ReportNotHeld,
}

/// The local scheduler's answer to the submit of an offered binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The whole gang runs now.
    Started {
        /// Node of each replica.
        nodes: Vec<String>,
    },
    /// The job waits (in a local queue, or for its data); the member reports it running when it
    /// starts.
    Queued {
        /// Why it waits, for people (`waiting in local queue `team` …`).
        reason: String,
    },
    /// The scheduler will not take the job.
    Refused {
        /// Why, for people.
        reason: String,
        /// The job can never run here (it does not fit the nodes even when all are free, or it
        /// is invalid for this scheduler); offering it again is pointless.
        permanent: bool,
    },
}

/// What the member holds and says once its scheduler answered the submit of an offer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The binding as the member now holds it (`Bound` with why it waits, or `Running` with its
    /// nodes); None when refused: nothing is held.
    pub held: Option<JobReport>,
    /// The reply to the offer.
    pub reply: AgentEvent,
}

impl Answer {
    /// The status to send after the reply when the binding runs: what is held, once it is
    /// `Running` (a binding waiting `Bound` says so in the reply alone).
    pub fn status(&self) -> Option<JobReport> {
        self.held.as_ref().filter(|held| held.state == JobState::Running).cloned()
    }
}

impl<R> OfferPlan<R> {
    /// The same plan with its record turned into another (a reference into a clone, say).
    pub fn map<S>(self, record: impl FnOnce(R) -> S) -> OfferPlan<S> {
        match self {
            OfferPlan::AcceptAgain(held) => OfferPlan::AcceptAgain(record(held)),
            OfferPlan::RefuseNewerHeld(newer) => OfferPlan::RefuseNewerHeld(newer),
            OfferPlan::AlreadySubmitting { same_binding } => OfferPlan::AlreadySubmitting { same_binding },
            OfferPlan::AlreadyFinished(result) => OfferPlan::AlreadyFinished(record(result)),
            OfferPlan::Submit { replace } => OfferPlan::Submit { replace },
        }
    }
}

/// How to answer the offer of binding `offered` of a job of which the member holds `holdings`.
///
/// A submit under way comes first (its answer is not known yet), then a finished result of this
/// very binding, then the held binding by token: the same one is accepted again, a newer one
/// wins, an older one is replaced. Nothing held: submit, repeating a stop still under way (it is
/// harmless to repeat before the new submit).
pub fn plan_offer<R>(offered: u64, holdings: Holdings<R>) -> OfferPlan<R> {
    if let Some(submitting) = holdings.submitting {
        return OfferPlan::AlreadySubmitting { same_binding: submitting == offered };
    }
    if let Some(result) = holdings.finished {
        return OfferPlan::AlreadyFinished(result);
    }
    match holdings.held {
        Some((held, record)) if held == offered => OfferPlan::AcceptAgain(record),
        Some((held, _)) if held > offered => OfferPlan::RefuseNewerHeld(held),
        Some((held, _)) => OfferPlan::Submit { replace: Some(held) },
        None => OfferPlan::Submit { replace: holdings.stopping.map(|s| s.fencing_token) },
    }
}

/// What the cancel of binding `cancelled` does to a job of which the member holds `holdings`.
///
/// A cancel never touches a newer binding than the one it names; it stops an older held one
/// (the gateway has moved on from it too).
pub fn plan_cancel<R>(cancelled: u64, holdings: Holdings<R>) -> CancelPlan<R> {
    if let Some((held, _)) = holdings.held {
        return if held > cancelled { CancelPlan::Ignore } else { CancelPlan::StopHeld { fencing_token: held } };
    }
    if let Some(submitting) = holdings.submitting {
        return if submitting > cancelled { CancelPlan::Ignore } else { CancelPlan::Deferred };
    }
    if let Some(stopping) = holdings.stopping
        && stopping.fencing_token >= cancelled
    {
        return if stopping.in_progress || stopping.fencing_token > cancelled {
            CancelPlan::Ignore
        } else {
            CancelPlan::RetryStop
        };
    }
    match holdings.finished {
        Some(result) => CancelPlan::ReportAgain(result),
        None => CancelPlan::ReportNotHeld,
    }
}

/// What the member holds and says once its scheduler gave `admission` for the offered binding
/// (`job_id`, `fencing_token`): started, it holds the binding running and says so after
/// accepting; queued, it holds it bound and accepts with the reason; refused, it holds nothing
/// and declines (for good when the scheduler says the job can never run here).
pub fn answer(job_id: &str, fencing_token: u64, admission: Admission) -> Answer {
    match admission {
        Admission::Started { nodes } => {
            let running = JobReport { nodes, ..report(job_id, fencing_token, JobState::Running, String::new()) };
            Answer { held: Some(running), reply: accepted(job_id, fencing_token, String::new()) }
        }
        Admission::Queued { reason } => Answer {
            held: Some(report(job_id, fencing_token, JobState::Bound, reason.clone())),
            reply: accepted(job_id, fencing_token, reason),
        },
        Admission::Refused { reason, permanent } => Answer {
            held: None,
            reply: if permanent {
                refused_for_good(job_id, fencing_token, reason)
            } else {
                declined(job_id, fencing_token, reason)
            },
        },
    }
}

/// The member takes the binding (started or waiting, `reason` says where).
pub fn accepted(job_id: &str, fencing_token: u64, reason: String) -> AgentEvent {
    offer_reply(job_id, fencing_token, true, reason, false)
}

/// The member does not take the binding now; it may later.
pub fn declined(job_id: &str, fencing_token: u64, reason: String) -> AgentEvent {
    offer_reply(job_id, fencing_token, false, reason, false)
}

/// The member's scheduler can never run the job as specified: offering it again is pointless.
pub fn refused_for_good(job_id: &str, fencing_token: u64, reason: String) -> AgentEvent {
    offer_reply(job_id, fencing_token, false, reason, true)
}

/// Why an offer is declined when binding `newer` of the job runs here.
pub fn newer_binding_held(newer: u64) -> String {
    format!("binding {newer} of this job, newer than this offer, runs here")
}

/// Why an offer is declined when the binding already ended here as `state`.
pub fn already_ended(state: JobState) -> String {
    format!("this binding already ended here ({state})")
}

/// A report of binding (`job_id`, `fencing_token`) in `state`, on no nodes, not for requeue.
pub fn report(job_id: &str, fencing_token: u64, state: JobState, message: String) -> JobReport {
    JobReport {
        job_id: job_id.to_string(),
        fencing_token,
        state,
        message,
        nodes: Vec::new(),
        requeue: false,
        preempted: false,
        usage: None,
    }
}

/// The result of a binding stopped because the gateway cancelled it.
pub fn cancelled(job_id: &str, fencing_token: u64) -> JobReport {
    report(job_id, fencing_token, JobState::Cancelled, STOPPED_BY_THE_GATEWAY.into())
}

fn offer_reply(job_id: &str, fencing_token: u64, accepted: bool, reason: String, permanent: bool) -> AgentEvent {
    AgentEvent::OfferReply { job_id: job_id.to_string(), fencing_token, accepted, reason, permanent }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(token: u64) -> Holdings<&'static str> {
        Holdings { held: Some((token, "held")), submitting: None, stopping: None, finished: None }
    }

    fn nothing() -> Holdings<&'static str> {
        Holdings { held: None, submitting: None, stopping: None, finished: None }
    }

    #[test]
    fn an_offer_of_the_held_binding_is_accepted_again_a_newer_one_wins_and_an_older_one_is_replaced() {
        assert_eq!(plan_offer(3, held(3)), OfferPlan::AcceptAgain("held"));
        assert_eq!(plan_offer(2, held(3)), OfferPlan::RefuseNewerHeld(3));
        assert_eq!(plan_offer(4, held(3)), OfferPlan::Submit { replace: Some(3) });
        assert_eq!(plan_offer(1, nothing()), OfferPlan::Submit { replace: None });
    }

    #[test]
    fn a_submit_under_way_answers_before_anything_else_and_a_stop_under_way_is_repeated() {
        let submitting = Holdings { submitting: Some(4), finished: Some("done"), ..held(3) };
        assert_eq!(plan_offer(4, submitting.clone()), OfferPlan::AlreadySubmitting { same_binding: true });
        assert_eq!(plan_offer(5, submitting), OfferPlan::AlreadySubmitting { same_binding: false });
        let finished = Holdings { finished: Some("done"), ..held(3) };
        assert_eq!(plan_offer(3, finished), OfferPlan::AlreadyFinished("done"));
        let stopping = Holdings { stopping: Some(Stopping { fencing_token: 2, in_progress: true }), ..nothing() };
        assert_eq!(plan_offer(3, stopping), OfferPlan::Submit { replace: Some(2) });
    }

    #[test]
    fn a_cancel_never_touches_a_newer_binding() {
        assert_eq!(plan_cancel(2, held(3)), CancelPlan::Ignore);
        assert_eq!(plan_cancel(3, held(3)), CancelPlan::StopHeld { fencing_token: 3 });
        assert_eq!(plan_cancel(4, held(3)), CancelPlan::StopHeld { fencing_token: 3 });
        let submitting = Holdings { submitting: Some(3), ..nothing() };
        assert_eq!(plan_cancel(2, submitting.clone()), CancelPlan::Ignore);
        assert_eq!(plan_cancel(3, submitting), CancelPlan::Deferred);
    }

    #[test]
    fn a_cancel_of_a_binding_being_stopped_retries_only_a_failed_stop() {
        let stopping =
            |in_progress| Holdings { stopping: Some(Stopping { fencing_token: 3, in_progress }), ..nothing() };
        assert_eq!(plan_cancel(3, stopping(true)), CancelPlan::Ignore);
        assert_eq!(plan_cancel(3, stopping(false)), CancelPlan::RetryStop);
        assert_eq!(plan_cancel(2, stopping(false)), CancelPlan::Ignore);
        assert_eq!(plan_cancel(4, stopping(false)), CancelPlan::ReportNotHeld, "an older stop says nothing of it");
        assert_eq!(plan_cancel(3, Holdings { finished: Some("done"), ..nothing() }), CancelPlan::ReportAgain("done"));
    }

    #[test]
    fn a_started_gang_is_accepted_then_reported_running_and_a_queued_one_accepted_with_its_reason() {
        let started = answer("j", 2, Admission::Started { nodes: vec!["n-0".into()] });
        let running = started.held.clone().unwrap();
        assert_eq!((running.state, running.nodes.clone()), (JobState::Running, vec!["n-0".to_string()]));
        assert_eq!(started.reply, accepted("j", 2, String::new()));
        assert_eq!(started.status(), Some(running));
        let queued = answer("j", 2, Admission::Queued { reason: "waiting".into() });
        let bound = queued.held.clone().unwrap();
        assert_eq!((bound.state, bound.message.as_str()), (JobState::Bound, "waiting"));
        assert_eq!(queued.reply, accepted("j", 2, "waiting".into()));
        assert_eq!(queued.status(), None);
    }

    #[test]
    fn a_refusal_holds_nothing_and_says_whether_it_is_for_good() {
        for permanent in [false, true] {
            let refused = answer("j", 2, Admission::Refused { reason: "full".into(), permanent });
            assert_eq!(refused.held, None);
            let expected = AgentEvent::OfferReply {
                job_id: "j".into(),
                fencing_token: 2,
                accepted: false,
                reason: "full".into(),
                permanent,
            };
            assert_eq!(refused.reply, expected);
            assert_eq!(refused.status(), None);
        }
    }
}
