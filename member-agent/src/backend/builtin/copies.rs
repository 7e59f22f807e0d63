//! The builtin backend's sibling copies (see [`crate::backend::copies`]).
//!
//! A copy is queued with [`BuiltinScheduler::submit_copy`]: it waits, holds the backfill
//! reservation and starts like any pending job, except that the member never preempts for it.
//! When a scheduling pass starts it, the scheduler has taken its nodes; the backend launches
//! nothing, keeps the nodes, and tells the agent [`CopyEvent::Ready`]. On the gateway's grant
//! the copy becomes a binding on those nodes (its processes start under the grant's fencing
//! token); on a drop it is cancelled in the scheduler, which frees whatever it holds.
//!
//! While it waits for its grant a ready copy must not end by itself: under the simulated
//! runner its true end is pushed out of reach until the grant, which sets it from then. A
//! ready copy that a preemption picks as a victim is dropped at once (it runs nothing, so it
//! needs no grace) and the agent is told.

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_proto::protocol::Assignment;
use meridian_proto::spec::GangSpec;
use meridian_scheduler::Started;

use super::{Binding, BuiltinBackend, RunnerState, State, run_time};
use crate::backend::process::ProcessRunner;
use crate::backend::{Admission, CopyAdmission, CopyEvent, CopyEventSender};

/// The copies the backend holds, by job id (at most one per job), and where their events go.
pub(super) struct Copies {
    held: BTreeMap<String, HeldCopy>,
    events: CopyEventSender,
}

/// One copy in the scheduler.
struct HeldCopy {
    copy_token: u64,
    /// The gang it was queued for; a grant of another shape does not fit its nodes.
    gang: GangSpec,
    /// The nodes the scheduler took for it (one per replica); None while it waits.
    ready_on: Option<Vec<String>>,
}

impl Copies {
    /// No copies; events go to `events`.
    pub(super) fn new(events: CopyEventSender) -> Self {
        Self { held: BTreeMap::new(), events }
    }

    fn emit(&self, event: CopyEvent) {
        // The agent dropping its receiver means it is shutting down; nobody needs the event.
        let _ = self.events.send(event);
    }
}

impl BuiltinBackend {
    /// Queues a copy of `job` in the scheduler; a pass of the driver may start it.
    pub(super) fn copy_now(&self, copy_token: u64, job: &Assignment) -> CopyAdmission {
        let refused = |reason: String| CopyAdmission::Refused { reason, unsupported: false };
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if let Some(binding) = state.bindings.get(&job.job_id) {
            return refused(format!(
                "binding {} of job `{}` is held here; a member never holds a copy of a job it holds",
                binding.fencing_token, job.job_id
            ));
        }
        match state.copies.held.get(&job.job_id) {
            Some(held) if held.copy_token == copy_token => return CopyAdmission::Queued,
            // A newer copy of the same job replaces the one held.
            Some(_) => state.drop_copy_of(&job.job_id),
            None => {}
        }
        if matches!(state.runner, RunnerState::Process(_))
            && let Some(reason) = ProcessRunner::refuse(&job.spec)
        {
            return refused(format!("job `{}`: {reason}", job.job_id));
        }
        let now = self.shared.now();
        let (mut local, _) = state.local_job(job);
        local.last_preempted_at = crate::preemption::last_preempted_on_clock(job.last_preempted_at_ms, now);
        if let Err(error) = state.scheduler.submit_copy(local, now) {
            return refused(error.to_string());
        }
        let copy = HeldCopy { copy_token, gang: job.spec.gang.clone(), ready_on: None };
        state.copies.held.insert(job.job_id.clone(), copy);
        drop(guard);
        // The driver's pass decides whether it starts now, in fair-share order with the rest.
        self.shared.wake.notify_one();
        CopyAdmission::Queued
    }

    /// Drops copy `copy_token` of `job_id` if it is held, freeing its nodes.
    pub(super) fn drop_copy_now(&self, job_id: &str, copy_token: u64) {
        let mut state = self.shared.lock();
        if state.copies.held.get(job_id).is_none_or(|held| held.copy_token != copy_token) {
            return;
        }
        state.drop_copy_of(job_id);
        drop(state);
        // Freed nodes may let a waiting job start.
        self.shared.wake.notify_one();
    }

    /// Starts `job` on the nodes of its ready copy `copy_token`; anything else is a submit.
    pub(super) fn grant_now(&self, copy_token: u64, job: &Assignment) -> Admission {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let ready = state.copies.held.get(&job.job_id).and_then(|held| {
            let fits = held.copy_token == copy_token && held.gang == job.spec.gang;
            held.ready_on.clone().filter(|_| fits)
        });
        let Some(nodes) = ready else {
            drop(guard);
            return self.submit_now(job);
        };
        state.copies.held.remove(&job.job_id);
        let now = self.shared.now();
        let (run_for, at_limit) = run_time(&job.spec, state.time_scale());
        let simulated = matches!(state.runner, RunnerState::Simulated { .. });
        if simulated {
            // It runs from now; its end was out of reach while it waited for the grant.
            state.scheduler.set_true_end(&job.job_id, now.saturating_add(run_for));
        }
        let binding = Binding {
            fencing_token: job.fencing_token,
            spec: job.spec.clone(),
            started_at: None,
            stopped_at_limit: (at_limit && simulated).then_some(run_for),
            run_id: None,
            reason: String::new(),
        };
        state.bindings.insert(job.job_id.clone(), binding);
        let ends_at = now.saturating_add(run_for);
        let started = Started { job_id: job.job_id.clone(), nodes: nodes.clone(), ends_at, completes_at: ends_at };
        state.start(&started, now);
        drop(guard);
        // Its end is due now (simulated runner).
        self.shared.wake.notify_one();
        Admission::Started { nodes }
    }
}

impl State {
    /// The scheduler started `started`, which has no binding: if it is a copy, it is ready
    /// now. It keeps its nodes, launches nothing, and the agent is told once.
    pub(super) fn copy_started(&mut self, started: &Started) {
        let Some(held) = self.copies.held.get_mut(&started.job_id) else { return };
        if held.ready_on.is_some() {
            return;
        }
        held.ready_on = Some(started.nodes.clone());
        let copy_token = held.copy_token;
        // Out of reach until the grant (see the module docs).
        self.scheduler.set_true_end(&started.job_id, Duration::MAX);
        tracing::info!(job = %started.job_id, copy_token, nodes = ?started.nodes, "sibling copy ready; asking the gateway for its start lock");
        self.copies.emit(CopyEvent::Ready { job_id: started.job_id.clone(), copy_token });
    }

    /// A preemption picked `victim`: when it is a ready copy, drops it now and tells the
    /// agent. Returns whether it was one (its nodes are free at once).
    pub(super) fn copy_preempted(&mut self, victim: &str, for_job: &str) -> bool {
        let Some(copy_token) = self.copies.held.get(victim).map(|held| held.copy_token) else { return false };
        self.drop_copy_of(victim);
        let reason = format!("its nodes were taken for higher-priority job `{for_job}`");
        self.copies.emit(CopyEvent::Dropped { job_id: victim.to_string(), copy_token, reason });
        true
    }

    /// Drops the copy of `job_id` held here, if any, freeing what it holds in the scheduler.
    pub(super) fn drop_copy_of(&mut self, job_id: &str) {
        if self.copies.held.remove(job_id).is_some() {
            self.scheduler.cancel(job_id);
        }
    }
}
