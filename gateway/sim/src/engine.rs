//! The event loop: replays a workload over the fleet in virtual time under one policy.
//!
//! Every member cluster is a [`BuiltinScheduler`], the production local scheduler, driven with the
//! same `LocalJob`s an agent submits. Time jumps from one event to the next: a job arrives, a
//! job's data arrives at the cluster it was sent to, a job completes. Nothing sleeps.
//!
//! Data moves before a job can start: a job sent to a cluster outside its data's region starts
//! only after its dataset has been copied (size over the region pair's bandwidth). Its queueing
//! delay therefore includes the copy. Baselines' jobs reach the cluster's queue when the copy
//! lands; a Meridian job is accepted at once and its GPUs are reserved on the member during the
//! copy. Either way only the run counts as GPU time, so GPU-seconds used equal GPU-seconds
//! demanded.
//!
//! The `meridian` policy drives the gateway's own core ([`meridian_core::Core`]) in virtual
//! time: jobs are submitted to it, it runs a placement round after every event, and one simulated
//! agent per member answers its offers and reports from the member's scheduler (see
//! `engine/meridian.rs`). Offers, refusals, fencing tokens and holds run as in production.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::atomic::AtomicU64;

use meridian_scheduler::{BuiltinScheduler, PreemptionPolicy, QueueSpec};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::policy::Policy;
use super::preemption::{PreemptionCounts, PreemptionMix};
use super::topology::Topology;
use super::{ClusterUsage, Outcome, RunResult, SimError, SimJob, Workload};
use meridian_placement::PlacementConfig;

use feasibility::Feasibility;
use links::Links;
use meridian::Federation;
pub use meridian::{GatewayCounts, spec_of};

mod data;
mod feasibility;
mod links;
mod members;
mod meridian;
mod preempt;
mod routing;

/// How one replay runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The placement policy.
    pub policy: Policy,
    /// Seed of the policy's own randomness (`random`); the workload has its own.
    pub seed: u64,
    /// Meridian's placement weights.
    pub placement: PlacementConfig,
    /// `placement.burst.after` of every simulated job, in seconds: how long an owned cluster may
    /// be expected to keep a job waiting before Meridian may burst it to the cloud.
    pub burst_after_secs: u64,
    /// After every event, check that no node holds more GPUs than it has and that every
    /// scheduler's free count matches its running jobs (tests; costs time).
    pub check_invariants: bool,
    /// `--preemption`: which jobs are high priority or preemptible (None: every job has the
    /// default priority and none is preemptible; see `preemption.rs`).
    pub preemption: Option<PreemptionMix>,
    /// Whether members preempt (`--no-member-preemption` turns it off); only matters with
    /// `preemption`.
    pub member_preemption: bool,
}

impl SimConfig {
    /// Defaults for `policy`: production placement weights, bursting after 30 minutes.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            seed: 0,
            placement: PlacementConfig::default(),
            burst_after_secs: 1_800,
            check_invariants: false,
            preemption: None,
            member_preemption: true,
        }
    }
}

/// Replays `workload` over `topology` under `config.policy`. `progress` counts finished jobs as
/// the replay goes (for a progress bar); it is only written.
///
/// Errors when a job fits no cluster of the topology, or (with `check_invariants`) when a
/// scheduler's books do not balance.
pub fn run(
    topology: &Topology,
    workload: &Workload,
    config: &SimConfig,
    progress: &AtomicU64,
) -> Result<RunResult, SimError> {
    Replay::new(topology, workload, config, progress)?.run()
}

/// One member cluster in the replay.
pub(super) struct Member {
    pub(super) scheduler: BuiltinScheduler,
    /// US$ per GPU-hour, GPUs and GPU type of each node, by node name.
    nodes: HashMap<String, (f64, u32, String)>,
    busy_gpu_secs: u64,
}

struct Replay<'a> {
    topology: &'a Topology,
    workload: &'a Workload,
    config: &'a SimConfig,
    progress: &'a AtomicU64,
    members: Vec<Member>,
    feasible: Feasibility<'a>,
    /// Region-pair links and the copies in flight on them (jobs whose data is being copied).
    links: Links,
    /// Per job not yet started: GB and US$ of the copies made for it that landed or were
    /// withdrawn so far; moved into its outcome when it starts.
    copied: HashMap<u32, (f64, f64)>,
    /// `cheapest`: (when, job, cluster) at which a job queued on `cluster` since its hand-over
    /// has waited its budget and fails over, if it has not started.
    failover_at: BinaryHeap<Reverse<(u64, u32, usize)>>,
    /// `cheapest`: clusters still to fail over to, per job, next first.
    failover_to: HashMap<u32, Vec<usize>>,
    outcomes: Vec<Option<Outcome>>,
    /// `first-admit`: the clusters holding a copy of each job not yet started.
    copies: HashMap<u32, Vec<usize>>,
    /// Clusters whose local queues changed since their last `schedule`.
    changed: Vec<bool>,
    /// Clusters whose scheduler changed since their agent last reported them.
    dirty: Vec<bool>,
    /// `meridian`: the gateway's core and the simulated agents.
    federation: Option<Federation>,
    rng: StdRng,
    next_round_robin: usize,
    events: u64,
    finished: u64,
    /// Preemptions and the GPU time they lost.
    preemption: PreemptionCounts,
}

impl<'a> Replay<'a> {
    fn new(
        topology: &'a Topology,
        workload: &'a Workload,
        config: &'a SimConfig,
        progress: &'a AtomicU64,
    ) -> Result<Self, SimError> {
        let mut queues: Vec<QueueSpec> = workload.tenants.iter().map(|t| QueueSpec::new(t.name.clone(), 1.0)).collect();
        if !workload.tenants.iter().any(|t| t.name == "default") {
            queues.push(QueueSpec::new("default", 1.0));
        }
        let mut members = Vec::with_capacity(topology.clusters.len());
        for cluster in &topology.clusters {
            let policy = cluster.member_policy;
            let member_queues = queues.iter().map(|q| QueueSpec { policy, ..q.clone() }).collect();
            let mut scheduler = BuiltinScheduler::new(cluster.nodes.clone(), member_queues)
                .map_err(|e| SimError::Invalid(format!("cluster `{}`: {e}", cluster.info.name)))?;
            if !config.member_preemption {
                scheduler.set_preemption(PreemptionPolicy::disabled());
            }
            let nodes = cluster
                .nodes
                .iter()
                .map(|n| (n.name.clone(), (cluster.price(&n.gpu_type), n.gpus, n.gpu_type.clone())))
                .collect();
            members.push(Member { scheduler, nodes, busy_gpu_secs: 0 });
        }
        let feasible = Feasibility::new(workload, &members)?;
        let n = topology.clusters.len();
        let federation =
            (config.policy == Policy::Meridian).then(|| Federation::new(topology, config, workload.jobs.len()));
        Ok(Self {
            topology,
            workload,
            config,
            progress,
            members,
            feasible,
            links: Links::default(),
            copied: HashMap::new(),
            failover_at: BinaryHeap::new(),
            failover_to: HashMap::new(),
            outcomes: vec![None; workload.jobs.len()],
            copies: HashMap::new(),
            changed: vec![false; n],
            dirty: vec![true; n],
            federation,
            rng: StdRng::seed_from_u64(config.seed),
            next_round_robin: 0,
            events: 0,
            finished: 0,
            preemption: PreemptionCounts::default(),
        })
    }

    fn run(mut self) -> Result<RunResult, SimError> {
        self.replay()?;
        self.finish()
    }

    /// Processes every event until none is left.
    fn replay(&mut self) -> Result<(), SimError> {
        let jobs = &self.workload.jobs;
        let mut next = 0;
        let mut arrived = Vec::new();
        if self.federation.is_some() {
            self.connect_agents(jobs.first().map_or(0, |j| j.submit_secs))?;
        }
        loop {
            let arrival = jobs.get(next).map(|j| j.submit_secs);
            let handoff = self.links.next_landing();
            let failover = self.failover_at.peek().map(|Reverse((t, _, _))| *t);
            let completion =
                self.members.iter().filter_map(|m| m.scheduler.next_completion()).min().map(|d| d.as_secs());
            // A victim's grace ends: only victims of `--preemption` runs (never otherwise).
            let preemption_stop = self
                .members
                .iter()
                .filter_map(|m| m.scheduler.next_preemption_stop())
                .min()
                .map(|d| d.as_secs_f64().ceil() as u64);
            // Start quotes the gateway asked for arrive a second later (a round trip), and the
            // gateway's next round reads them.
            let quote_answer = self.next_quote_answer();
            let Some(now) =
                [arrival, handoff, failover, completion, preemption_stop, quote_answer].into_iter().flatten().min()
            else {
                break;
            };
            self.events += 1;

            self.complete(now)?;
            self.stop_victims(now)?;
            for (job, cluster) in self.links.land_due(now) {
                let (_, gb, usd) = self.transfer(self.job_at(job)?, cluster);
                self.book_copy(job, gb, usd);
                if self.federation.is_some() {
                    self.data_landed(job, cluster, now)?;
                } else {
                    self.hand_over(job, cluster, now)?;
                }
            }
            while let Some(&Reverse((at, job, cluster))) = self.failover_at.peek() {
                if at > now {
                    break;
                }
                self.failover_at.pop();
                self.fail_over(job, cluster, now)?;
            }
            arrived.clear();
            while let Some(job) = jobs.get(next).filter(|j| j.submit_secs <= now) {
                arrived.push(job.id);
                next += 1;
            }
            self.schedule(now)?;
            for &job in &arrived {
                self.arrive(job, now)?;
                // The next arrival sees what this one took, as a live cluster would show it.
                self.schedule(now)?;
            }
            if self.federation.is_some() {
                self.gateway_rounds(now)?;
            }
            if self.config.preemption.is_some() {
                self.preempt(now);
            }
            if self.config.check_invariants {
                self.check(now)?;
            }
        }
        Ok(())
    }

    fn job_at(&self, id: u32) -> Result<&'a SimJob, SimError> {
        self.workload.jobs.get(id as usize).ok_or_else(|| invariant(format!("no job {id}")))
    }

    fn job(&self, id: &str) -> Result<&'a SimJob, SimError> {
        let index: u32 = id.parse().map_err(|_| invariant(format!("unknown job id `{id}`")))?;
        self.job_at(index)
    }

    fn cluster_name(&self, cluster: usize) -> &str {
        self.topology.clusters.get(cluster).map_or("?", |c| c.info.name.as_str())
    }

    /// Every scheduler's books balance and no node holds more GPUs than it has.
    fn check(&self, now: u64) -> Result<(), SimError> {
        for (cluster, member) in self.members.iter().enumerate() {
            let mut held: BTreeMap<&str, u64> = BTreeMap::new();
            let mut running = 0;
            for job in member.scheduler.running() {
                for node in &job.nodes {
                    *held.entry(node.as_str()).or_default() += u64::from(job.job.gpus);
                }
                running += job.job.total_gpus();
            }
            for (node, gpus) in held {
                let capacity = member.nodes.get(node).map_or(0, |(_, g, _)| u64::from(*g));
                if gpus > capacity {
                    return Err(invariant(format!(
                        "at {now}s node `{node}` of `{}` holds {gpus} GPUs but has {capacity}",
                        self.cluster_name(cluster)
                    )));
                }
            }
            if running + member.scheduler.free_gpus() != member.scheduler.total_gpus() {
                return Err(invariant(format!(
                    "at {now}s `{}`: {running} GPUs running + {} free != {} total",
                    self.cluster_name(cluster),
                    member.scheduler.free_gpus(),
                    member.scheduler.total_gpus()
                )));
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<RunResult, SimError> {
        let total = self.outcomes.len();
        // Name one job that never started, with the gateway's own words on why.
        let stuck = self.federation.as_ref().and_then(|f| {
            let job = u32::try_from(self.outcomes.iter().position(Option::is_none)?).ok()?;
            Some(format!("; e.g. job {job}: {}", f.message_of(job)?))
        });
        let outcomes: Vec<Outcome> = self.outcomes.into_iter().flatten().collect();
        if outcomes.len() != total || self.finished != total as u64 {
            return Err(invariant(format!(
                "{} of {total} jobs never started and {} never finished{}",
                total - outcomes.len(),
                total as u64 - self.finished.min(total as u64),
                stuck.unwrap_or_default()
            )));
        }
        if let Some(federation) = &self.federation {
            federation.check_settled(self.topology)?;
        }
        let clusters = self
            .topology
            .clusters
            .iter()
            .zip(&self.members)
            .map(|(cluster, member)| ClusterUsage {
                name: cluster.info.name.clone(),
                tier: cluster.info.tier,
                gpus: cluster.gpus(),
                busy_gpu_secs: member.busy_gpu_secs,
            })
            .collect();
        Ok(RunResult {
            policy: self.config.policy.name().to_owned(),
            outcomes,
            clusters,
            events: self.events,
            link_gb: self.links.moved_gb,
            gateway: self.federation.map(|f| f.counts),
            preemption: self.preemption,
        })
    }
}

fn invariant(message: String) -> SimError {
    SimError::Invalid(format!("simulation invariant broken: {message}"))
}

#[cfg(test)]
mod estimate_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod tests;
