//! The simulated agents' answers to the gateway's commands: offers (submitted to the member's
//! scheduler, started now, reserved while data is copied, or queued for a preemption), cancels,
//! acknowledgements and start quotes, as a live agent answers them
//! ([`meridian_scheduler::offer`] is shared with it).

use std::collections::VecDeque;
use std::time::Duration;

use meridian_core::Input;
use meridian_proto::duration::HumanDuration;
use meridian_proto::protocol::{AgentEvent, Assignment, GatewayCommand};
use meridian_scheduler::offer::{self, Admission, CancelPlan, OfferPlan};
use meridian_scheduler::{Cancelled, LocalJob, Started};

use super::{EPOCH_MS, conn_of};
use crate::SimError;
use crate::engine::{Replay, invariant};

impl Replay<'_> {
    /// An agent handles a command; its answers go to `answers`.
    pub(super) fn agent_hears(
        &mut self,
        cluster: usize,
        command: GatewayCommand,
        now: u64,
        answers: &mut VecDeque<Input>,
    ) -> Result<(), SimError> {
        match command {
            // A fresh gateway expects nothing, and the lease cannot run out: streams never break.
            // Nobody reads output in the lab.
            GatewayCommand::Welcome { .. } | GatewayCommand::Lease { .. } | GatewayCommand::Logs { .. } => Ok(()),
            GatewayCommand::Ack { job_id, fencing_token } => {
                let Some(federation) = self.federation.as_mut() else { return Ok(()) };
                // A preempted binding's result is acknowledged too, but its job is queued again.
                let ended = federation.core.job(&job_id).is_none_or(|record| record.state.is_terminal());
                let job = if ended { federation.jobs.remove(&job_id) } else { federation.jobs.get(&job_id).copied() };
                if let Some(job) = job
                    && let Some(agent) = federation.agents.get_mut(cluster)
                {
                    agent.outbox.remove(&(job, fencing_token));
                }
                Ok(())
            }
            GatewayCommand::Offer(assignment) => {
                // A copy of the job here is dropped before the offer is handled.
                if let Some(&job) = self.federation.as_ref().and_then(|f| f.jobs.get(&assignment.job_id)) {
                    self.agent_drop_copy(cluster, job, None);
                }
                self.agent_offered(cluster, assignment, now, answers)
            }
            GatewayCommand::Copy { copy_token, assignment } => {
                self.agent_copy(cluster, copy_token, assignment, now, answers)
            }
            GatewayCommand::Grant { copy_token, assignment } => {
                self.agent_grant(cluster, copy_token, assignment, now, answers)
            }
            GatewayCommand::DropCopy { job_id, copy_token } => {
                if let Some(&job) = self.federation.as_ref().and_then(|f| f.jobs.get(&job_id)) {
                    self.agent_drop_copy(cluster, job, Some(copy_token));
                }
                Ok(())
            }
            GatewayCommand::Quote { request_id, job_id, spec } => {
                // The member's plan now; the answer arrives with the next round (a round trip).
                let Some(member) = self.members.get(cluster) else { return Ok(()) };
                let queue = member.scheduler.queue_for(&spec.tenant).to_owned();
                let run_for = Duration::from_secs(spec.runtime.estimate.as_secs());
                let local = LocalJob::from_spec(job_id, &spec, queue, run_for);
                let quote = member.scheduler.quote(&local, Duration::from_secs(now));
                let Some(federation) = self.federation.as_mut() else { return Ok(()) };
                federation.counts.quotes += 1;
                if let Some(agent) = federation.agents.get_mut(cluster) {
                    agent.quotes.push((now, AgentEvent::Quote { request_id, result: Ok(quote) }));
                }
                Ok(())
            }
            GatewayCommand::Cancel { job_id, fencing_token } => {
                let Some(federation) = self.federation.as_mut() else { return Ok(()) };
                federation.counts.cancels += 1;
                let Some(&job) = federation.jobs.get(&job_id) else { return Ok(()) };
                let holdings =
                    federation.agents.get(cluster).map(|a| a.holdings(job, fencing_token)).unwrap_or_default();
                match offer::plan_cancel(fencing_token, holdings) {
                    CancelPlan::StopHeld { .. } => self.agent_stop(cluster, job, answers),
                    // Nothing is ever being submitted or stopped here (see `Agent::holdings`).
                    CancelPlan::Ignore | CancelPlan::RetryStop | CancelPlan::Deferred => Ok(()),
                    // A live agent reports the binding again (or cancelled, not held). A lab
                    // agent stays silent: it never loses a binding, and in this synchronous loop
                    // its answer would only draw the same cancel again.
                    CancelPlan::ReportAgain(()) | CancelPlan::ReportNotHeld => Ok(()),
                }
            }
        }
    }

    /// An offer: answered as [`offer::plan_offer`] says; submitted, the member starts the gang
    /// now (or reserves it while its data is copied), or the agent declines with the scheduler's
    /// reason.
    pub(super) fn agent_offered(
        &mut self,
        cluster: usize,
        assignment: Assignment,
        now: u64,
        answers: &mut VecDeque<Input>,
    ) -> Result<(), SimError> {
        let conn = conn_of(cluster);
        let (job_id, token) = (assignment.job_id.as_str(), assignment.fencing_token);
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        federation.counts.offers += 1;
        let Some(&job) = federation.jobs.get(job_id) else {
            return Err(invariant(format!("the gateway offered unknown job `{job_id}`")));
        };
        let holdings = federation.agents.get(cluster).map(|a| a.holdings(job, token)).unwrap_or_default();
        match offer::plan_offer(token, holdings) {
            OfferPlan::AcceptAgain(()) => {
                answers.push_back(Input::Agent { conn, event: offer::accepted(job_id, token, String::new()) });
                return Ok(());
            }
            OfferPlan::RefuseNewerHeld(newer) => {
                federation.counts.declined += 1;
                let event = offer::declined(job_id, token, offer::newer_binding_held(newer));
                answers.push_back(Input::Agent { conn, event });
                return Ok(());
            }
            // The live agent declines these and sends the result again, because there a reply
            // can be lost. Here no message is lost, so an offer of a binding its agent already
            // answered is a bug in the core: the replay fails rather than hide it.
            OfferPlan::AlreadySubmitting { .. } | OfferPlan::AlreadyFinished(()) => {
                return Err(invariant(format!(
                    "the gateway offered binding {token} of job `{job_id}` to `{}` again after its agent answered it",
                    self.cluster_name(cluster)
                )));
            }
            // An older binding: it stops being held and is stopped first, as the agent does.
            OfferPlan::Submit { replace: Some(_) } => {
                self.agent_release(cluster, job);
            }
            OfferPlan::Submit { replace: None } => {}
        }
        let sim_job = self.job_at(job)?;
        let (transfer_secs, _, _) = self.transfer(sim_job, cluster);
        let Some(member) = self.members.get_mut(cluster) else {
            return Err(invariant(format!("offer to unknown cluster {cluster}")));
        };
        let queue = member.scheduler.queue_for(&assignment.spec.tenant).to_owned();
        // Staged data: the GPUs are reserved from now, for the copy and then the job. The member
        // knows the job's run time only by the spec's estimate; the truth decides when it ends.
        let run_for = Duration::from_secs(transfer_secs.saturating_add(assignment.spec.runtime.estimate.as_secs()));
        let mut local = LocalJob::from_spec(job.to_string(), &assignment.spec, queue, run_for);
        local.last_preempted_at =
            assignment.last_preempted_at_ms.map(|ms| Duration::from_millis(u64::try_from(ms - EPOCH_MS).unwrap_or(0)));
        // The agent keeps staged GPUs reserved until the data lands, however long the shared
        // link takes; the job's true end is set then (`Replay::started`).
        local.actual = Some(if transfer_secs > 0 { Duration::MAX } else { Duration::from_secs(sim_job.duration_secs) });
        let at = Duration::from_secs(now);
        // Offered on a quote that needs a preemption: the member queues the job and preempts for
        // it, as the builtin backend does with any job it cannot start at once.
        let by_preemption =
            (transfer_secs == 0 && member.scheduler.start_by_preemption(&local, at).is_some()).then(|| local.clone());
        let admission = match member.scheduler.start_now(local, at) {
            Ok(started) => self.agent_holds(cluster, job, token, started, transfer_secs, now)?,
            Err(_) if let Some(queued) = by_preemption => {
                member
                    .scheduler
                    .submit(queued, at)
                    .map_err(|e| invariant(format!("the member refused job {job} it would preempt for: {e}")))?;
                self.requeue_local(cluster);
                let Some(federation) = self.federation.as_mut() else { return Ok(()) };
                federation.counts.preempting += 1;
                if let Some(agent) = federation.agents.get_mut(cluster) {
                    agent.held.insert(job, token);
                }
                Admission::Queued { reason: "waiting for lower-priority jobs to be preempted".to_owned() }
            }
            Err(e) => {
                if let Some(federation) = self.federation.as_mut() {
                    federation.counts.declined += 1;
                }
                Admission::Refused { reason: e.to_string(), permanent: false }
            }
        };
        let answer = offer::answer(job_id, token, admission);
        let status = answer.status();
        answers.push_back(Input::Agent { conn, event: answer.reply });
        if let Some(status) = status {
            answers.push_back(Input::Agent { conn, event: AgentEvent::Status(status) });
        }
        Ok(())
    }

    /// The member took binding `token` of `job` (`started` on its scheduler): the agent holds it,
    /// and it runs now, or waits for its data when `transfer_secs` is not zero.
    pub(super) fn agent_holds(
        &mut self,
        cluster: usize,
        job: u32,
        token: u64,
        started: Started,
        transfer_secs: u64,
        now: u64,
    ) -> Result<Admission, SimError> {
        self.mark(cluster);
        let sim_job = self.job_at(job)?;
        let agent = self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster).map(|a| (a, &mut f.counts)));
        let Some((agent, counts)) = agent else {
            return Err(invariant(format!("offer to cluster {cluster}, which has no agent")));
        };
        agent.held.insert(job, token);
        if transfer_secs > 0 {
            counts.staged += 1;
            agent.staging.insert(job, started);
            self.start_copy(sim_job, cluster, now);
            let reason = match &sim_job.dataset {
                Some(data) => format!(
                    "staging data: {:.0} GiB from {}, about {}",
                    data.size_gib,
                    data.region,
                    HumanDuration::from_secs(transfer_secs)
                ),
                None => "staging data".to_owned(),
            };
            return Ok(Admission::Queued { reason });
        }
        let nodes = started.nodes.clone();
        self.started(cluster, started, now)?;
        Ok(Admission::Started { nodes })
    }

    /// Stops the binding of `job` held on `cluster` and reports it cancelled.
    fn agent_stop(&mut self, cluster: usize, job: u32, answers: &mut VecDeque<Input>) -> Result<(), SimError> {
        let Some(token) = self.agent_release(cluster, job) else { return Ok(()) };
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        let id = federation.ids.get(job as usize).cloned().flatten();
        if let Some(agent) = federation.agents.get_mut(cluster) {
            agent.outbox.insert((job, token));
        }
        if let Some(job_id) = id {
            let event = AgentEvent::Status(offer::cancelled(&job_id, token));
            answers.push_back(Input::Agent { conn: conn_of(cluster), event });
        }
        Ok(())
    }

    /// The agent of `cluster` stops holding `job` and stops it on the member's scheduler.
    /// Returns the binding it held.
    fn agent_release(&mut self, cluster: usize, job: u32) -> Option<u64> {
        let agent = self.federation.as_mut()?.agents.get_mut(cluster)?;
        let token = agent.held.remove(&job)?;
        agent.staging.remove(&job);
        if let Some(member) = self.members.get_mut(cluster)
            && member.scheduler.cancel(&job.to_string()) != Cancelled::NotFound
        {
            self.requeue_local(cluster);
        }
        Some(token)
    }
}
