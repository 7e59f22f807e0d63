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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use meridian_proto::spec::DEFAULT_PRIORITY;
use meridian_scheduler::{BuiltinScheduler, LocalJob, PreemptionPolicy, QueueSpec, Started};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::policy::Policy;
use super::preemption::{JobClass, PreemptionCounts, PreemptionMix};
use super::topology::Topology;
use super::{ClusterUsage, Outcome, RunResult, SimError, SimJob, Workload};
use meridian_placement::PlacementConfig;

use links::Links;
use meridian::Federation;
pub use meridian::{GatewayCounts, spec_of};

mod links;
mod meridian;

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

/// Which clusters could ever run a job, shared by every job with the same GPU type, GPU memory
/// and gang.
struct Feasibility<'a> {
    by_shape: HashMap<(Option<&'a str>, u32, u32, u32), usize>,
    lists: Vec<Vec<usize>>,
    of_job: Vec<usize>,
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

    /// Completes every job due at `now`.
    fn complete(&mut self, now: u64) -> Result<(), SimError> {
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

    /// A job arrives at the federation: bound to clusters now (baselines) or queued (Meridian).
    fn arrive(&mut self, id: u32, now: u64) -> Result<(), SimError> {
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

    /// Starts copying `job`'s data to `cluster`'s region over the shared link; false (and nothing
    /// to copy) when the data is already there. The copy lands as an event of its own.
    pub(super) fn start_copy(&mut self, job: &SimJob, cluster: usize, now: u64) -> bool {
        let (Some(data), Some(target)) = (&job.dataset, self.topology.clusters.get(cluster)) else { return false };
        if data.region == target.info.region {
            return false;
        }
        let network = &self.topology.network;
        let copy = network.copy(&data.region, &target.info.region, data.size_gib);
        let gbps = network.gbps(&data.region, &target.info.region);
        self.links.start(job.id, cluster, (&data.region, &target.info.region), copy.gb, gbps, now);
        true
    }

    /// Books a copy made for `job` that landed or was withdrawn: into its outcome when it has
    /// started, else kept until it does.
    fn book_copy(&mut self, job: u32, gb: f64, usd: f64) {
        if let Some(Some(outcome)) = self.outcomes.get_mut(job as usize) {
            outcome.moved_gb += gb;
            outcome.egress_usd += usd;
            return;
        }
        let entry = self.copied.entry(job).or_default();
        entry.0 += gb;
        entry.1 += usd;
    }

    /// Withdraws `job`'s copy on `cluster`: out of its queue, and its data copy stopped (the bytes
    /// it already moved are booked and paid).
    fn withdraw(&mut self, job: &SimJob, cluster: usize, now: u64) {
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
    fn fail_over(&mut self, id: u32, cluster: usize, now: u64) -> Result<(), SimError> {
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
    fn hand_over(&mut self, id: u32, cluster: usize, now: u64) -> Result<(), SimError> {
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

    /// Runs the local schedulers of changed clusters until none starts anything more.
    fn schedule(&mut self, now: u64) -> Result<(), SimError> {
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

    /// Books a job that just took GPUs on `cluster`. Its true run time follows the GPU type it
    /// got ([`Topology::run_secs`]); when the member was told another run time (a type of other
    /// speed, or a staged reservation whose copy landed early or late), the job is restarted at
    /// once on the same type with the true one, as the same GPUs taken from the same instant.
    fn started(&mut self, cluster: usize, started: Started, now: u64) -> Result<(), SimError> {
        let job = self.job(&started.job_id)?;
        if self.outcomes.get(job.id as usize).is_none_or(Option::is_some) {
            return Err(invariant(format!("job {} started twice", job.id)));
        }
        let started = self.at_true_run_time(cluster, job, started, now)?;
        let Some(member) = self.members.get_mut(cluster) else {
            return Err(invariant(format!("job {} started on unknown cluster {cluster}", job.id)));
        };
        let gpu_type = started.nodes.first().and_then(|n| member.nodes.get(n)).map_or("", |(_, _, t)| t.as_str());
        let run_secs = self.topology.run_secs(job.duration_secs, gpu_type);
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

    /// `started` with its true end: the job's true run time follows the GPU type it got
    /// ([`Topology::run_secs`]), which the member learns only now; its estimate (what the member
    /// reports and decides by) stays as it was.
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
        let gpu_type = nodes.first().and_then(|n| member.nodes.get(n)).map_or(String::new(), |(_, _, t)| t.clone());
        let run_secs = self.topology.run_secs(job.duration_secs, &gpu_type);
        let completes_at = Duration::from_secs(now + run_secs);
        if !member.scheduler.set_true_end(&started.job_id, completes_at) {
            return Err(invariant(format!("job {} vanished from `{name}`", job.id)));
        }
        Ok(Started { nodes, completes_at, ..started })
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

    /// (seconds, GB, US$) to copy the job's data to the cluster's region: the seconds are a
    /// prediction (a fair share of the link as loaded now, plus this copy), the GB and US$ those
    /// of the whole copy. Nothing when the data is already there.
    fn transfer(&self, job: &SimJob, cluster: usize) -> (u64, f64, f64) {
        let (Some(data), Some(target)) = (&job.dataset, self.topology.clusters.get(cluster)) else {
            return (0, 0.0, 0.0);
        };
        if data.region == target.info.region {
            return (0, 0.0, 0.0);
        }
        let network = &self.topology.network;
        let copy = network.copy(&data.region, &target.info.region, data.size_gib);
        let gbps = network.gbps(&data.region, &target.info.region);
        let secs = self.links.predict_secs((&data.region, &target.info.region), copy.gb, gbps);
        (secs, copy.gb, copy.usd)
    }

    fn local_job(&self, job: &SimJob, cluster: usize) -> Result<LocalJob, SimError> {
        let tenant = self.workload.tenants.get(job.tenant as usize).map_or("default", |t| t.name.as_str());
        let member = self.members.get(cluster).ok_or_else(|| invariant(format!("no cluster {cluster}")))?;
        let class = self.class_of(job.id);
        Ok(LocalJob {
            priority: class.priority,
            preemptible: class.preemptible,
            ..local_job(job, job.id.to_string(), member.scheduler.queue_for(tenant).to_owned())
        })
    }

    /// The priority class of job `id` (see `preemption.rs`).
    pub(super) fn class_of(&self, id: u32) -> JobClass {
        self.config.preemption.map_or(JobClass::DEFAULT, |mix| mix.class_of(self.config.seed, id))
    }

    /// Every member picks victims for its blocked high-priority heads; they are stopped when
    /// their grace ends (`stop_victims`).
    fn preempt(&mut self, now: u64) {
        let at = Duration::from_secs(now);
        for member in &mut self.members {
            member.scheduler.preempt(at);
        }
    }

    /// Stops the victims whose grace has ended and starts the jobs they made room for.
    fn stop_victims(&mut self, now: u64) -> Result<(), SimError> {
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

    /// The cluster's local queues changed: run its scheduler, and report it to the gateway again.
    fn requeue_local(&mut self, cluster: usize) {
        if let Some(changed) = self.changed.get_mut(cluster) {
            *changed = true;
        }
        self.mark(cluster);
    }

    /// The cluster's scheduler changed: the gateway's snapshot of it is stale.
    fn mark(&mut self, cluster: usize) {
        if let Some(dirty) = self.dirty.get_mut(cluster) {
            *dirty = true;
        }
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

impl<'a> Feasibility<'a> {
    fn new(workload: &'a Workload, members: &[Member]) -> Result<Self, SimError> {
        let mut feasibility = Self { by_shape: HashMap::new(), lists: Vec::new(), of_job: Vec::new() };
        for job in &workload.jobs {
            let key = (job.gpu_type.as_deref(), job.replicas, job.gpus_per_replica, job.gpu_memory_gib);
            let index = match feasibility.by_shape.get(&key) {
                Some(&index) => index,
                None => {
                    let probe = local_job(job, String::new(), String::new());
                    let list: Vec<usize> = members
                        .iter()
                        .enumerate()
                        .filter(|(_, m)| m.scheduler.can_ever_fit(&probe))
                        .map(|(c, _)| c)
                        .collect();
                    if list.is_empty() {
                        return Err(SimError::Invalid(format!(
                            "job {} ({}×{} GPUs{}) fits no cluster of the topology",
                            job.id,
                            job.replicas,
                            job.gpus_per_replica,
                            job.gpu_type.as_deref().map(|t| format!(" of type {t}")).unwrap_or_default()
                        )));
                    }
                    feasibility.lists.push(list);
                    let index = feasibility.lists.len() - 1;
                    feasibility.by_shape.insert(key, index);
                    index
                }
            };
            feasibility.of_job.push(index);
        }
        Ok(feasibility)
    }

    /// Clusters that could ever run job `id`, ascending.
    fn of(&self, id: u32) -> &[usize] {
        self.of_job.get(id as usize).and_then(|&i| self.lists.get(i)).map_or(&[], Vec::as_slice)
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

/// What an agent hands its scheduler for `job`: GPUs only (simulated nodes are sized by GPUs),
/// the job's GPU-type pin and GPU memory, its runtime estimate on the reference GPU (all the
/// member knows) and, hidden from every decision, its true run time (set once the job starts and
/// its GPU type, and so its speed, is known; see `Replay::started`).
fn local_job(job: &SimJob, id: String, queue: String) -> LocalJob {
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

fn invariant(message: String) -> SimError {
    SimError::Invalid(format!("simulation invariant broken: {message}"))
}

#[cfg(test)]
mod estimate_tests;
#[cfg(test)]
mod preemption_tests;
#[cfg(test)]
mod tests;
