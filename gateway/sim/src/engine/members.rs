//! The member clusters' own schedulers in the replay: running them when their queues change,
//! booking each job they start at its true run time, and completing jobs when they end.

use std::sync::atomic::Ordering;
use std::time::Duration;

use meridian_proto::spec::DEFAULT_PRIORITY;
use meridian_scheduler::{LocalJob, Started};

use super::{Replay, invariant};
use crate::{Outcome, SimError, SimJob};

impl Replay<'_> {
    /// Completes every job due at `now`.
    pub(super) fn complete(&mut self, now: u64) -> Result<(), SimError> {
        for cluster in 0..self.members.len() {
            let Some(member) = self.members.get_mut(cluster) else { continue };
            if member.scheduler.next_completion().is_none_or(|t| t.as_secs() > now) {
                continue;
            }
            for id in member.scheduler.complete_due(Duration::from_secs(now)) {
                let job = self.job(&id)?;
                if self.federation.is_some() && self.links.in_flight(job.id, cluster) {
                    // Staged GPUs stay reserved until the data lands (their true end is set
                    // then), however busy the link gets.
                    return Err(invariant(format!(
                        "job {} ended on `{}` before its data landed",
                        job.id,
                        self.cluster_name(cluster)
                    )));
                }
                let ended = self.outcomes.get(job.id as usize).and_then(|o| o.as_ref()).map(|o| o.end_secs);
                if ended != Some(now) {
                    return Err(invariant(format!("job {} completed at {now}s, expected at {ended:?}", job.id)));
                }
                if self.federation.is_some() {
                    self.agent_job_ended(cluster, job.id, now)?;
                }
                self.finished += 1;
            }
            self.progress.store(self.finished, Ordering::Relaxed);
            self.requeue_local(cluster);
        }
        Ok(())
    }

    /// Runs the local schedulers of changed clusters until none starts anything more.
    pub(super) fn schedule(&mut self, now: u64) -> Result<(), SimError> {
        let at = Duration::from_secs(now);
        while let Some(cluster) = self.changed.iter().position(|&c| c) {
            if let Some(flag) = self.changed.get_mut(cluster) {
                *flag = false;
            }
            let Some(member) = self.members.get_mut(cluster) else { continue };
            let started = member.scheduler.schedule(at);
            // Its reservation may have moved too, and the inventory shows it.
            self.mark(cluster);
            for job in started {
                // Meridian's sibling copy: its nodes are held, and it asks for the start lock.
                if self.federation.is_some() && self.copy_ready(cluster, &job, now)? {
                    continue;
                }
                let (id, nodes) = (job.job_id.clone(), job.nodes.clone());
                self.started(cluster, job, now)?;
                // Meridian's jobs wait in a member's queue only for a preemption; one that
                // starts there is reported by its agent.
                if self.federation.is_some() {
                    self.agent_job_started(cluster, self.job(&id)?.id, nodes, now)?;
                }
            }
        }
        Ok(())
    }

    /// Books a job that just took GPUs on `cluster`. Its true run time follows the GPU types it
    /// got, at the pace of the slowest
    /// ([`Topology::gang_run_secs`](crate::topology::Topology::gang_run_secs)); when the member was
    /// told another run time (a type of other speed, or a staged reservation whose copy landed
    /// early or late), the job is restarted at once on the same type with the true one, as the
    /// same GPUs taken from the same instant.
    pub(super) fn started(&mut self, cluster: usize, started: Started, now: u64) -> Result<(), SimError> {
        let job = self.job(&started.job_id)?;
        if self.outcomes.get(job.id as usize).is_none_or(Option::is_some) {
            return Err(invariant(format!("job {} started twice", job.id)));
        }
        let started = self.at_true_run_time(cluster, job, started, now)?;
        let Some(member) = self.members.get_mut(cluster) else {
            return Err(invariant(format!("job {} started on unknown cluster {cluster}", job.id)));
        };
        let types = started.nodes.iter().filter_map(|n| member.nodes.get(n)).map(|(_, _, t)| t.as_str());
        let run_secs = self.topology.gang_run_secs(job.duration_secs, types);
        let hours = run_secs as f64 / 3600.0;
        let compute_usd: f64 = started
            .nodes
            .iter()
            .map(|node| member.nodes.get(node).map_or(0.0, |(price, _, _)| *price) * f64::from(job.gpus_per_replica))
            .sum::<f64>()
            * hours;
        member.busy_gpu_secs += job.gpus() * run_secs;
        let end_secs = now + run_secs;
        if started.completes_at != Duration::from_secs(end_secs) {
            return Err(invariant(format!("job {} ends at {:?}, expected {end_secs}s", job.id, started.completes_at)));
        }
        // first-admit: every other copy is withdrawn; the bytes each moved are paid for.
        if let Some(copies) = self.copies.remove(&job.id) {
            for other in copies.into_iter().filter(|&c| c != cluster) {
                self.withdraw(job, other, now);
            }
        }
        let (moved_gb, egress_usd) = self.copied.remove(&job.id).unwrap_or_default();
        if let Some(slot) = self.outcomes.get_mut(job.id as usize) {
            *slot = Some(Outcome {
                job: job.id,
                cluster: u32::try_from(cluster).unwrap_or(u32::MAX),
                start_secs: now,
                end_secs,
                moved_gb,
                egress_usd,
                compute_usd,
            });
        }
        Ok(())
    }

    /// `started` with its true end: the job's true run time follows the GPU types it got
    /// ([`Topology::gang_run_secs`](crate::topology::Topology::gang_run_secs)), which the member learns
    /// only now; its estimate (what the member reports and decides by) stays as it was.
    fn at_true_run_time(
        &mut self,
        cluster: usize,
        job: &SimJob,
        started: Started,
        now: u64,
    ) -> Result<Started, SimError> {
        let name = self.cluster_name(cluster).to_owned();
        let member = self.members.get_mut(cluster).ok_or_else(|| invariant(format!("no cluster {cluster}")))?;
        let nodes = match member.scheduler.running().find(|r| r.job.id == started.job_id) {
            Some(r) => r.nodes.clone(),
            None => return Err(invariant(format!("job {} started on `{name}` but does not run there", job.id))),
        };
        let types = nodes.iter().filter_map(|n| member.nodes.get(n)).map(|(_, _, t)| t.as_str());
        let run_secs = self.topology.gang_run_secs(job.duration_secs, types);
        let completes_at = Duration::from_secs(now + run_secs);
        if !member.scheduler.set_true_end(&started.job_id, completes_at) {
            return Err(invariant(format!("job {} vanished from `{name}`", job.id)));
        }
        Ok(Started { nodes, completes_at, ..started })
    }

    pub(super) fn local_job(&self, job: &SimJob, cluster: usize) -> Result<LocalJob, SimError> {
        let tenant = self.workload.tenants.get(job.tenant as usize).map_or("default", |t| t.name.as_str());
        let member = self.members.get(cluster).ok_or_else(|| invariant(format!("no cluster {cluster}")))?;
        let class = self.class_of(job.id);
        Ok(LocalJob {
            priority: class.priority,
            preemptible: class.preemptible,
            ..local_job(job, job.id.to_string(), member.scheduler.queue_for(tenant).to_owned())
        })
    }

    /// The cluster's local queues changed: run its scheduler, and report it to the gateway again.
    pub(super) fn requeue_local(&mut self, cluster: usize) {
        if let Some(changed) = self.changed.get_mut(cluster) {
            *changed = true;
        }
        self.mark(cluster);
    }

    /// The cluster's scheduler changed: the gateway's snapshot of it is stale.
    pub(super) fn mark(&mut self, cluster: usize) {
        if let Some(dirty) = self.dirty.get_mut(cluster) {
            *dirty = true;
        }
    }
}

/// What an agent hands its scheduler for `job`: GPUs only (simulated nodes are sized by GPUs),
/// the job's GPU-type pin and GPU memory, its runtime estimate on the reference GPU (all the
/// member knows) and, hidden from every decision, its true run time (set once the job starts and
/// its GPU type, and so its speed, is known; see `Replay::started`).
pub(super) fn local_job(job: &SimJob, id: String, queue: String) -> LocalJob {
    LocalJob {
        id,
        queue,
        priority: DEFAULT_PRIORITY,
        replicas: job.replicas,
        gpus: job.gpus_per_replica,
        cpu: 0,
        memory_gib: 0,
        gpu_types: job.gpu_type.iter().cloned().collect(),
        gpu_memory_gib: job.gpu_memory_gib,
        node_selector: Default::default(),
        run_for: Duration::from_secs(job.estimate_secs),
        actual: Some(Duration::from_secs(job.duration_secs)),
        preemptible: false,
        last_preempted_at: None,
    }
}
