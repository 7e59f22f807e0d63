//! Preemption in the replay (`--preemption`): each job's priority class, members picking and
//! stopping victims for their blocked high-priority jobs, and where a stopped victim goes next.

use std::time::Duration;

use super::{Replay, invariant};
use crate::preemption::JobClass;
use crate::{SimError, SimJob};

impl Replay<'_> {
    /// The priority class of job `id` (see `preemption.rs`).
    pub(super) fn class_of(&self, id: u32) -> JobClass {
        self.config.preemption.map_or(JobClass::DEFAULT, |mix| mix.class_of(self.config.seed, id))
    }

    /// Every member picks victims for its blocked high-priority heads; they are stopped when
    /// their grace ends (`stop_victims`).
    pub(super) fn preempt(&mut self, now: u64) {
        let at = Duration::from_secs(now);
        for member in &mut self.members {
            member.scheduler.preempt(at);
        }
    }

    /// Stops the victims whose grace has ended and starts the jobs they made room for.
    pub(super) fn stop_victims(&mut self, now: u64) -> Result<(), SimError> {
        let at = Duration::from_secs(now);
        for cluster in 0..self.members.len() {
            let Some(member) = self.members.get_mut(cluster) else { continue };
            if member.scheduler.next_preemption_stop().is_none_or(|t| t > at) {
                continue;
            }
            let stops = member.scheduler.stop_preempted(at);
            self.requeue_local(cluster);
            for victim in stops.stopped {
                let job = self.job(&victim)?;
                self.victim_stopped(cluster, job, now)?;
            }
            for started in stops.started {
                let (id, nodes) = (started.job_id.clone(), started.nodes.clone());
                self.started(cluster, started, now)?;
                if self.federation.is_some() {
                    self.agent_job_started(cluster, self.job(&id)?.id, nodes, now)?;
                }
            }
        }
        Ok(())
    }

    /// A victim was stopped on `cluster` at `now`: the work it did is lost, its copies stay
    /// paid, and it goes back to be placed again (Meridian: to the federation queue; the
    /// baselines: to the same member's queue, as Slurm requeues a preempted job).
    fn victim_stopped(&mut self, cluster: usize, job: &SimJob, now: u64) -> Result<(), SimError> {
        // Meridian: a job whose GPUs were reserved while its data was copied has not started; it
        // is preempted all the same, and placed again.
        if self.federation.is_some() && self.staging_on(cluster, job.id) {
            self.preemption.preemptions += 1;
            return self.agent_job_preempted(cluster, job.id, now);
        }
        let Some(outcome) = self.outcomes.get_mut(job.id as usize).and_then(Option::take) else {
            return Err(invariant(format!("job {} was preempted but never started", job.id)));
        };
        let ran = now.saturating_sub(outcome.start_secs);
        let unrun = outcome.end_secs.saturating_sub(now);
        if let Some(member) = self.members.get_mut(cluster) {
            member.busy_gpu_secs = member.busy_gpu_secs.saturating_sub(job.gpus() * unrun);
        }
        self.preemption.preemptions += 1;
        self.preemption.lost_gpu_secs += job.gpus() * ran;
        // Its copies were made and paid; they are booked again when it starts next.
        let entry = self.copied.entry(job.id).or_default();
        entry.0 += outcome.moved_gb;
        entry.1 += outcome.egress_usd;
        if self.federation.is_some() {
            return self.agent_job_preempted(cluster, job.id, now);
        }
        let mut local = self.local_job(job, cluster)?;
        local.last_preempted_at = Some(Duration::from_secs(now));
        let Some(member) = self.members.get_mut(cluster) else { return Ok(()) };
        member
            .scheduler
            .submit(local, Duration::from_secs(now))
            .map_err(|e| invariant(format!("cluster refused preempted job {}: {e}", job.id)))?;
        Ok(())
    }
}
