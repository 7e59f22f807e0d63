//! The simulated agents' sibling copies: queued on the member's scheduler with
//! [`submit_copy`](meridian_scheduler::BuiltinScheduler::submit_copy), ready when the scheduler
//! would start them (the nodes are taken, nothing runs: the job's true end stays unknown), started
//! on the gateway's grant, and cancelled on its drop, as the live builtin agent does.

use std::collections::VecDeque;
use std::time::Duration;

use meridian_core::Input;
use meridian_proto::protocol::{AgentEvent, Assignment};
use meridian_scheduler::offer;
use meridian_scheduler::{Cancelled, LocalJob, Started};

use super::conn_of;
use crate::SimError;
use crate::engine::{Replay, invariant};

impl Replay<'_> {
    /// The gateway asks the agent of `cluster` to queue copy `copy_token` of a job.
    pub(super) fn agent_copy(
        &mut self,
        cluster: usize,
        copy_token: u64,
        assignment: Assignment,
        now: u64,
        answers: &mut VecDeque<Input>,
    ) -> Result<(), SimError> {
        let conn = conn_of(cluster);
        let job_id = assignment.job_id.clone();
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        federation.counts.copies += 1;
        let Some(&job) = federation.jobs.get(&job_id) else {
            return Err(invariant(format!("the gateway sent a copy of unknown job `{job_id}`")));
        };
        let Some(agent) = federation.agents.get_mut(cluster) else { return Ok(()) };
        if agent.held.contains_key(&job) {
            let reason = "the member holds a binding of the job".to_owned();
            answers.push_back(Input::Agent {
                conn,
                event: AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported: false },
            });
            return Ok(());
        }
        // A newer copy replaces an older one.
        if agent.copies.contains_key(&job) {
            self.agent_drop_copy(cluster, job, None);
        }
        let Some(member) = self.members.get_mut(cluster) else { return Ok(()) };
        let queue = member.scheduler.queue_for(&assignment.spec.tenant).to_owned();
        let run_for = Duration::from_secs(assignment.spec.runtime.estimate.as_secs());
        let mut local = LocalJob::from_spec(job.to_string(), &assignment.spec, queue, run_for);
        // Nothing runs before the grant; the true end is set when it starts (`Replay::started`).
        local.actual = Some(Duration::MAX);
        if let Err(e) = member.scheduler.submit_copy(local, Duration::from_secs(now)) {
            answers.push_back(Input::Agent {
                conn,
                event: AgentEvent::CopyDropped { job_id, copy_token, reason: e.to_string(), unsupported: false },
            });
            return Ok(());
        }
        self.requeue_local(cluster);
        if let Some(agent) = self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)) {
            agent.copies.insert(job, copy_token);
        }
        Ok(())
    }

    /// The member's scheduler started `started` on `cluster`: if it is a copy, its nodes are
    /// held and the agent asks for the start lock (true); otherwise false (a job to book).
    pub(in crate::engine) fn copy_ready(
        &mut self,
        cluster: usize,
        started: &Started,
        now: u64,
    ) -> Result<bool, SimError> {
        let job = self.job(&started.job_id)?.id;
        let Some(federation) = self.federation.as_mut() else { return Ok(false) };
        let Some(agent) = federation.agents.get_mut(cluster) else { return Ok(false) };
        let Some(&copy_token) = agent.copies.get(&job) else { return Ok(false) };
        agent.ready.insert(job, started.clone());
        federation.counts.copies_ready += 1;
        let Some(job_id) = federation.ids.get(job as usize).cloned().flatten() else { return Ok(true) };
        self.gateway_step(
            Input::Agent { conn: conn_of(cluster), event: AgentEvent::CopyReady { job_id, copy_token } },
            now,
        )?;
        Ok(true)
    }

    /// Whether a copy asked for its lock and the gateway has not answered yet.
    pub(in crate::engine) fn copies_awaiting_grant(&self) -> bool {
        self.federation.as_ref().is_some_and(|f| f.agents.iter().any(|a| !a.ready.is_empty()))
    }

    /// The gateway grants copy `copy_token` the start lock under `assignment`'s binding: the
    /// copy starts on the nodes it holds (or, staged data, reserves them for the copy). Without
    /// that ready copy the grant is an offer.
    pub(super) fn agent_grant(
        &mut self,
        cluster: usize,
        copy_token: u64,
        assignment: Assignment,
        now: u64,
        answers: &mut VecDeque<Input>,
    ) -> Result<(), SimError> {
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        let Some(&job) = federation.jobs.get(&assignment.job_id) else {
            return Err(invariant(format!("the gateway granted unknown job `{}`", assignment.job_id)));
        };
        let Some(agent) = federation.agents.get_mut(cluster) else { return Ok(()) };
        let ready = match agent.copies.get(&job) {
            Some(&token) if token == copy_token => agent.ready.remove(&job),
            _ => None,
        };
        let Some(started) = ready else {
            self.agent_drop_copy(cluster, job, None);
            return self.agent_offered(cluster, assignment, now, answers);
        };
        agent.copies.remove(&job);
        federation.counts.granted += 1;
        // Staged data: the held nodes stay reserved until the copy lands (the copy's true end
        // is still unknown to its scheduler, so it never ends before).
        let (transfer_secs, _, _) = self.transfer(self.job_at(job)?, cluster);
        let admission = self.agent_holds(cluster, job, assignment.fencing_token, started, transfer_secs, now)?;
        let answer = offer::answer(&assignment.job_id, assignment.fencing_token, admission);
        let status = answer.status();
        answers.push_back(Input::Agent { conn: conn_of(cluster), event: answer.reply });
        if let Some(status) = status {
            answers.push_back(Input::Agent { conn: conn_of(cluster), event: AgentEvent::Status(status) });
        }
        Ok(())
    }

    /// Drops `job`'s copy on `cluster` (only copy `copy_token`, when given): out of the member's
    /// queue, or its held nodes freed.
    pub(super) fn agent_drop_copy(&mut self, cluster: usize, job: u32, copy_token: Option<u64>) {
        let Some(agent) = self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)) else { return };
        match agent.copies.get(&job) {
            Some(&token) if copy_token.is_none_or(|t| t == token) => {}
            _ => return,
        }
        agent.copies.remove(&job);
        agent.ready.remove(&job);
        if let Some(member) = self.members.get_mut(cluster)
            && member.scheduler.cancel(&job.to_string()) != Cancelled::NotFound
        {
            self.requeue_local(cluster);
        }
    }
}
