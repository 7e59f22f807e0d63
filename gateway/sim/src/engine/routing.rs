//! Where an arriving job goes. The baselines bind it to clusters at once, each by its own rule,
//! and hand it to their queues once its data is there (`cheapest` fails it over when a queue
//! keeps it waiting past its budget); Meridian's jobs go to the gateway's core (`meridian.rs`).

use std::cmp::Reverse;
use std::time::Duration;

use rand::Rng;

use super::members::local_job;
use super::{Member, Replay, invariant};
use crate::policy::Policy;
use crate::{SimError, SimJob};

impl Replay<'_> {
    /// A job arrives at the federation: bound to clusters now (baselines) or queued (Meridian).
    pub(super) fn arrive(&mut self, id: u32, now: u64) -> Result<(), SimError> {
        let job = self.job_at(id)?;
        let feasible = self.feasible.of(id);
        // Karmada's estimator: how many replicas of THIS job fit on the cluster's free nodes now.
        let pick_most_free = |members: &[Member], among: &mut dyn Iterator<Item = usize>| {
            among.max_by_key(|&c| (members.get(c).map_or((0, 0), |m| replicas_fit(m, job)), Reverse(c)))
        };
        let targets: Vec<usize> = match self.config.policy {
            Policy::Meridian => return self.submit(job, now),
            Policy::HomeOnly => {
                let home = self.workload.tenants.get(job.tenant as usize).map(|t| t.home);
                match home.filter(|h| feasible.contains(h)) {
                    Some(home) => vec![home],
                    None => {
                        return Err(SimError::Invalid(format!(
                            "job {id} cannot run on its tenant's home cluster `{}`",
                            home.map_or("?", |h| self.cluster_name(h))
                        )));
                    }
                }
            }
            Policy::RoundRobin => {
                let start = self.next_round_robin;
                let n = self.members.len().max(1);
                let chosen = (0..n).map(|i| (start + i) % n).find(|c| feasible.contains(c));
                if let Some(c) = chosen {
                    self.next_round_robin = c + 1;
                }
                chosen.into_iter().collect()
            }
            Policy::Random => {
                if feasible.is_empty() {
                    Vec::new()
                } else {
                    let i = self.rng.random_range(0..feasible.len());
                    feasible.get(i).copied().into_iter().collect()
                }
            }
            Policy::LeastLoaded => pick_most_free(&self.members, &mut feasible.iter().copied()).into_iter().collect(),
            Policy::FirstAdmit => feasible.to_vec(),
            Policy::Cheapest => {
                let cost = |c: usize| self.cheapest_usd(job, c);
                let mut ranked = feasible.to_vec();
                ranked.sort_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)));
                // The rest, dearest first, so the next to try pops off the end.
                let first = ranked.first().copied();
                ranked.reverse();
                ranked.pop();
                if !ranked.is_empty() {
                    self.failover_to.insert(id, ranked);
                }
                first.into_iter().collect()
            }
            Policy::LocalityFirst => {
                let region = job.dataset.as_ref().map(|d| d.region.as_str());
                let clusters = &self.topology.clusters;
                let mut local =
                    feasible.iter().copied().filter(|&c| clusters.get(c).map(|k| k.info.region.as_str()) == region);
                pick_most_free(&self.members, &mut local)
                    .or_else(|| pick_most_free(&self.members, &mut feasible.iter().copied()))
                    .into_iter()
                    .collect()
            }
        };
        if targets.is_empty() {
            return Err(SimError::Invalid(format!("job {id} fits no cluster of the topology")));
        }
        if self.config.policy == Policy::FirstAdmit {
            self.copies.insert(id, targets.clone());
        }
        for cluster in targets {
            self.send(job, cluster, now)?;
        }
        Ok(())
    }

    /// Sends `job` to `cluster`: at once when its data is there, else when the copy lands.
    fn send(&mut self, job: &SimJob, cluster: usize, now: u64) -> Result<(), SimError> {
        if self.start_copy(job, cluster, now) { Ok(()) } else { self.hand_over(job.id, cluster, now) }
    }

    /// Withdraws `job`'s copy on `cluster`: out of its queue, and its data copy stopped (the bytes
    /// it already moved are booked and paid).
    pub(super) fn withdraw(&mut self, job: &SimJob, cluster: usize, now: u64) {
        if let Some(member) = self.members.get_mut(cluster)
            && member.scheduler.cancel(&job.id.to_string()) != meridian_scheduler::Cancelled::NotFound
        {
            // The withdrawn copy may have been a queue's blocked head.
            self.requeue_local(cluster);
        }
        let (_, size_gb, usd) = self.transfer(job, cluster);
        if let Some(gb) = self.links.abort(job.id, cluster, now, size_gb) {
            let per_gb = if size_gb > 0.0 { usd / size_gb } else { 0.0 };
            self.book_copy(job.id, gb, gb * per_gb);
        }
    }

    /// `cheapest`: the job queued on `cluster` waited its budget; if it has not started, it is
    /// withdrawn there and sent to the next cheapest cluster that could run it.
    pub(super) fn fail_over(&mut self, id: u32, cluster: usize, now: u64) -> Result<(), SimError> {
        if self.outcomes.get(id as usize).is_some_and(Option::is_some) {
            return Ok(());
        }
        let Some(next) = self.failover_to.get_mut(&id).and_then(Vec::pop) else { return Ok(()) };
        if self.failover_to.get(&id).is_some_and(Vec::is_empty) {
            self.failover_to.remove(&id);
        }
        let job = self.job_at(id)?;
        self.withdraw(job, cluster, now);
        self.send(job, next, now)
    }

    /// The job (its data now local) reaches the cluster's scheduler and queues there.
    pub(super) fn hand_over(&mut self, id: u32, cluster: usize, now: u64) -> Result<(), SimError> {
        if self.outcomes.get(id as usize).is_some_and(Option::is_some) {
            return Ok(()); // first-admit: another copy already started
        }
        let job = self.job_at(id)?;
        let local = self.local_job(job, cluster)?;
        let at = Duration::from_secs(now);
        let Some(member) = self.members.get_mut(cluster) else {
            return Err(invariant(format!("job {id} sent to unknown cluster {cluster}")));
        };
        member
            .scheduler
            .submit(local, at)
            .map_err(|e| invariant(format!("cluster `{}` refused job {id}: {e}", self.cluster_name(cluster))))?;
        self.requeue_local(cluster);
        if self.config.policy == Policy::Cheapest && self.failover_to.contains_key(&id) {
            self.failover_at.push(Reverse((now.saturating_add(self.config.burst_after_secs), id, cluster)));
        }
        Ok(())
    }

    /// US$ to run `job` on `cluster` at its cheapest acceptable GPU type (price × GPUs × its run
    /// time on that type), plus egress.
    fn cheapest_usd(&self, job: &SimJob, cluster: usize) -> f64 {
        let Some(info) = self.topology.clusters.get(cluster) else { return f64::INFINITY };
        let price = info
            .gpu_types()
            .into_iter()
            .filter(|(name, gpus, per_node)| {
                job.gpu_type.as_deref().is_none_or(|t| t == name)
                    && *gpus >= job.gpus()
                    && *per_node >= job.gpus_per_replica
                    && info.nodes.iter().any(|n| n.gpu_type == *name && n.gpu_memory_gib >= job.gpu_memory_gib)
            })
            // A forecast: by the job's estimate (all a real policy knows), on that type's speed.
            .map(|(name, _, _)| info.price(&name) * self.topology.run_secs(job.estimate_secs, &name) as f64)
            .fold(f64::INFINITY, f64::min);
        let (_, _, egress) = self.transfer(job, cluster);
        price * job.gpus() as f64 / 3600.0 + egress
    }
}

/// Karmada's general estimator for `job` on `member`: (replicas of the job that fit on the free
/// nodes now, summed per node over nodes of an acceptable GPU type and memory, each node giving
/// min over GPUs, CPU and memory of free / per replica; free GPUs of acceptable types).
fn replicas_fit(member: &Member, job: &SimJob) -> (u64, u64) {
    let probe = local_job(job, String::new(), String::new());
    let mut replicas = 0;
    let mut gpus = 0;
    for shape in member.scheduler.inventory().shapes {
        if !probe.accepts_gpu(&shape.gpu_type, shape.gpu_memory_gib) {
            continue;
        }
        for free in &shape.free {
            let mut fit = free.gpus / probe.gpus.max(1);
            // A request of 0 limits nothing.
            fit = fit.min(free.cpu.checked_div(probe.cpu).unwrap_or(u32::MAX));
            fit = fit.min(free.memory_gib.checked_div(probe.memory_gib).unwrap_or(u32::MAX));
            replicas += u64::from(fit);
            gpus += u64::from(free.gpus);
        }
    }
    (replicas, gpus)
}
