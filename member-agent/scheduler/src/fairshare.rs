//! Weighted dominant resource fairness (DRF) between queues, and the order inside a queue.
//!
//! A queue's share is the largest fraction it holds of any cluster resource (GPUs, CPU cores,
//! host memory), divided by its weight. The scheduler offers free capacity to the queue with the
//! smallest share first, so over time each busy queue holds capacity in proportion to its weight,
//! measured on whatever resource it uses most.
//!
//! Whole GPUs rarely split exactly by weight (16 GPUs at 2:1 is 10⅔ : 5⅓), so current shares are
//! often tied. Ties go to the queue with less *accrued* weighted share (its weighted share
//! integrated over time), so the odd GPU alternates between the queues and long-run GPU time
//! follows the weights; a fixed tie-break would hand it to the same queue forever (11:5). Shares
//! are compared after rounding to 1e-9 so float noise does not hide a tie. Inside a queue, jobs wait in a fixed order:
//! priority (higher first), then submit time, then id, which is total and therefore deterministic.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Duration;

use super::{LocalJob, PendingJob, QueuePolicy};

/// Amounts of the three resources the scheduler shares, widened to u64 so sums never overflow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Usage {
    /// GPUs.
    pub(super) gpus: u64,
    /// CPU cores.
    pub(super) cpu: u64,
    /// Host memory in GiB.
    pub(super) memory_gib: u64,
}

/// Where a pending job sits in its queue; the derived order is the queue order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct PendingKey {
    /// Higher priority first.
    priority: Reverse<u32>,
    /// Then earlier submission.
    submitted_at: Duration,
    /// Then id, so equal priority and time still have one order.
    id: String,
}

/// One local queue: its weight, its waiting jobs in order, and what its running jobs hold.
#[derive(Debug, Clone)]
pub(super) struct QueueState {
    /// Queue name (shared with every pressure report that names it).
    pub(super) name: std::sync::Arc<str>,
    /// Fair-share weight (finite, > 0, checked at construction).
    pub(super) weight: f64,
    /// What a job that cannot start does to the jobs behind it.
    pub(super) policy: QueuePolicy,
    /// Waiting jobs in queue order; the first entry is the head.
    pub(super) pending: BTreeMap<PendingKey, PendingJob>,
    /// GPUs the waiting jobs need, kept as a running sum so reports need no rescan.
    pub(super) pending_gpus: u64,
    /// GPU-seconds the waiting jobs will run for, summed like `pending_gpus`; wait estimates use it.
    pub(super) pending_gpu_secs: u64,
    /// What the queue's running jobs hold.
    pub(super) used: Usage,
    /// Weighted share integrated over time (share-seconds) up to `accrued_until`; breaks ties.
    accrued: f64,
    /// Time `accrued` is brought up to.
    accrued_until: Duration,
}

impl Usage {
    /// What all replicas of `job` hold together.
    pub(super) fn of_job(job: &LocalJob) -> Self {
        let replicas = u64::from(job.replicas);
        Self {
            gpus: replicas * u64::from(job.gpus),
            cpu: replicas * u64::from(job.cpu),
            memory_gib: replicas * u64::from(job.memory_gib),
        }
    }

    /// Adds `other`.
    pub(super) fn add(&mut self, other: Usage) {
        self.gpus = self.gpus.saturating_add(other.gpus);
        self.cpu = self.cpu.saturating_add(other.cpu);
        self.memory_gib = self.memory_gib.saturating_add(other.memory_gib);
    }

    /// Removes `other`; saturates so an accounting slip cannot wrap around.
    pub(super) fn remove(&mut self, other: Usage) {
        self.gpus = self.gpus.saturating_sub(other.gpus);
        self.cpu = self.cpu.saturating_sub(other.cpu);
        self.memory_gib = self.memory_gib.saturating_sub(other.memory_gib);
    }

    /// The dominant share of `self` within `totals`: the largest used/total fraction. A resource
    /// the cluster has none of (e.g. no CPU declared) cannot be dominant and is skipped.
    pub(super) fn dominant_share(&self, totals: &Usage) -> f64 {
        let fraction = |used: u64, total: u64| if total == 0 { 0.0 } else { used as f64 / total as f64 };
        fraction(self.gpus, totals.gpus)
            .max(fraction(self.cpu, totals.cpu))
            .max(fraction(self.memory_gib, totals.memory_gib))
    }
}

impl PendingKey {
    /// The key of `job` submitted at `submitted_at`.
    pub(super) fn new(job: &LocalJob, submitted_at: Duration) -> Self {
        Self { priority: Reverse(job.priority), submitted_at, id: job.id.clone() }
    }
}

impl QueueState {
    /// An empty queue.
    pub(super) fn new(name: String, weight: f64, policy: QueuePolicy) -> Self {
        Self {
            name: name.into(),
            weight,
            policy,
            pending: BTreeMap::new(),
            pending_gpus: 0,
            pending_gpu_secs: 0,
            used: Usage::default(),
            accrued: 0.0,
            accrued_until: Duration::ZERO,
        }
    }

    /// The queue's weighted dominant share: dominant share divided by weight.
    pub(super) fn weighted_share(&self, totals: &Usage) -> f64 {
        self.used.dominant_share(totals) / self.weight
    }

    /// Brings the accrued share up to `now`. Call before `used` changes, so each interval is
    /// charged at the share that held during it. Earlier times are ignored (time never runs back).
    pub(super) fn accrue(&mut self, totals: &Usage, now: Duration) {
        if now > self.accrued_until {
            self.accrued += self.weighted_share(totals) * (now - self.accrued_until).as_secs_f64();
            self.accrued_until = now;
        }
    }

    /// The job at the head of the queue, if any.
    pub(super) fn head(&self) -> Option<(&PendingKey, &PendingJob)> {
        self.pending.first_key_value()
    }

    /// Adds a waiting job.
    pub(super) fn push(&mut self, key: PendingKey, pending: PendingJob) {
        self.pending_gpus = self.pending_gpus.saturating_add(pending.job.total_gpus());
        self.pending_gpu_secs = self.pending_gpu_secs.saturating_add(gpu_secs(&pending.job));
        self.pending.insert(key, pending);
    }

    /// Removes a waiting job.
    pub(super) fn remove(&mut self, key: &PendingKey) -> Option<PendingJob> {
        let pending = self.pending.remove(key)?;
        self.pending_gpus = self.pending_gpus.saturating_sub(pending.job.total_gpus());
        self.pending_gpu_secs = self.pending_gpu_secs.saturating_sub(gpu_secs(&pending.job));
        Some(pending)
    }
}

/// GPU-seconds `job` will use once started (whole seconds, rounded down).
fn gpu_secs(job: &LocalJob) -> u64 {
    job.total_gpus().saturating_mul(job.run_for.as_secs())
}

/// Indices of the queues that have waiting jobs and are not `blocked`, smallest weighted share
/// first; ties go to the queue with less accrued share, then to the queue declared first, so the
/// order is deterministic. Callers accrue every queue to the current time first.
pub(super) fn queues_by_share(queues: &[QueueState], totals: &Usage, blocked: &[bool]) -> Vec<usize> {
    // Rounded to a fixed grid so shares equal but for float noise compare equal; an integer key
    // keeps the sort a total order (a tolerance-based comparison would not be transitive).
    let rounded = |share: f64| (share * 1e9).round() as i64;
    let mut order: Vec<(i64, f64, usize)> = queues
        .iter()
        .enumerate()
        .filter(|(i, q)| !q.pending.is_empty() && !blocked.get(*i).copied().unwrap_or(false))
        .map(|(i, q)| (rounded(q.weighted_share(totals)), q.accrued, i))
        .collect();
    order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
    order.into_iter().map(|(_, _, i)| i).collect()
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::{BuiltinScheduler, NodeSpec, QueueSpec};
    use super::*;

    fn local_job(id: &str, queue: &str, priority: u32, run_for: Duration) -> LocalJob {
        LocalJob {
            id: id.into(),
            queue: queue.into(),
            priority,
            replicas: 1,
            gpus: 1,
            cpu: 2,
            memory_gib: 8,
            gpu_types: Vec::new(),
            gpu_memory_gib: 0,
            node_selector: Default::default(),
            run_for,
            actual: None,
            preemptible: false,
            last_preempted_at: None,
        }
    }

    #[test]
    fn dominant_share_is_the_largest_fraction_of_any_resource() {
        let totals = Usage { gpus: 16, cpu: 128, memory_gib: 1024 };
        let used = Usage { gpus: 2, cpu: 64, memory_gib: 128 };
        assert!((used.dominant_share(&totals) - 0.5).abs() < 1e-12);
        let no_cpu = Usage { gpus: 16, cpu: 0, memory_gib: 1024 };
        assert!((used.dominant_share(&no_cpu) - 0.125).abs() < 1e-12);
    }

    #[test]
    fn weight_divides_the_share_and_ties_go_to_the_first_queue() {
        let totals = Usage { gpus: 10, cpu: 0, memory_gib: 0 };
        let mut heavy = QueueState::new("heavy".into(), 2.0, QueuePolicy::default());
        let mut light = QueueState::new("light".into(), 1.0, QueuePolicy::default());
        heavy.used.gpus = 4;
        light.used.gpus = 2;
        assert!((heavy.weighted_share(&totals) - light.weighted_share(&totals)).abs() < 1e-12);
        let job = local_job("a", "heavy", 50, Duration::ZERO);
        heavy
            .push(PendingKey::new(&job, Duration::ZERO), PendingJob { job: job.clone(), submitted_at: Duration::ZERO });
        light.push(PendingKey::new(&job, Duration::ZERO), PendingJob { job, submitted_at: Duration::ZERO });
        let queues = vec![heavy, light];
        assert_eq!(queues_by_share(&queues, &totals, &[false, false]), vec![0, 1]);
        assert_eq!(queues_by_share(&queues, &totals, &[true, false]), vec![1]);
    }

    #[test]
    fn tied_shares_go_to_the_queue_with_less_accrued_share() {
        let totals = Usage { gpus: 16, cpu: 0, memory_gib: 0 };
        let mut heavy = QueueState::new("heavy".into(), 2.0, QueuePolicy::default());
        let mut light = QueueState::new("light".into(), 1.0, QueuePolicy::default());
        // Heavy held more than its share for the first 10 s, so it has accrued more.
        heavy.used.gpus = 12;
        light.used.gpus = 5;
        heavy.accrue(&totals, Duration::from_secs(10));
        light.accrue(&totals, Duration::from_secs(10));
        heavy.used.gpus = 10;
        let job = local_job("a", "q", 50, Duration::ZERO);
        for q in [&mut heavy, &mut light] {
            q.push(
                PendingKey::new(&job, Duration::ZERO),
                PendingJob { job: job.clone(), submitted_at: Duration::ZERO },
            );
        }
        assert_eq!(queues_by_share(&[heavy, light], &totals, &[false, false]), vec![1, 0]);
    }

    #[test]
    fn queue_order_is_priority_then_submit_time_then_id() {
        let mut queue = QueueState::new("q".into(), 1.0, QueuePolicy::default());
        for (id, priority, at) in [("late-high", 90, 5), ("b-early", 50, 1), ("a-early", 50, 1), ("first", 10, 0)] {
            let job = local_job(id, "q", priority, Duration::ZERO);
            let at = Duration::from_secs(at);
            queue.push(PendingKey::new(&job, at), PendingJob { job, submitted_at: at });
        }
        let order: Vec<&str> = queue.pending.values().map(|p| p.job.id.as_str()).collect();
        assert_eq!(order, ["late-high", "a-early", "b-early", "first"]);
        assert_eq!(queue.pending_gpus, 4);
    }

    /// Runs two queues (weights 2:1) with endless backlogs of identical 1-GPU jobs on 16 GPUs in
    /// virtual time and returns the GPU-seconds each received up to `horizon`.
    fn run_backlog(run_for: impl Fn(u64) -> Duration, horizon: Duration) -> (f64, f64) {
        let nodes = (0..2)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                shape: "dgx".into(),
                gpu_type: "h100".into(),
                gpu_memory_gib: 80,
                gpus: 8,
                cpu: 64,
                memory_gib: 1024,
                labels: Default::default(),
            })
            .collect();
        let queues = vec![QueueSpec::new("heavy", 2.0), QueueSpec::new("light", 1.0)];
        let mut scheduler = BuiltinScheduler::new(nodes, queues).unwrap();
        let mut next_id = 0u64;
        let mut gpu_secs = BTreeMap::<String, f64>::new();
        let mut now = Duration::ZERO;
        while now < horizon {
            // Endless backlog: keep plenty waiting in both queues.
            for queue in ["heavy", "light"] {
                while scheduler.pending().filter(|p| p.job.queue == queue).count() < 20 {
                    let job = local_job(&format!("{queue}-{next_id:08}"), queue, 50, run_for(next_id));
                    next_id += 1;
                    scheduler.submit(job, now).unwrap();
                }
            }
            for started in scheduler.schedule(now) {
                let running = scheduler.running().find(|r| r.job.id == started.job_id).unwrap();
                // Count only the part of the run inside the horizon.
                let counted = started.ends_at.min(horizon).saturating_sub(now);
                *gpu_secs.entry(running.job.queue.clone()).or_default() += counted.as_secs_f64();
            }
            now = scheduler.next_completion().unwrap();
            scheduler.complete_due(now);
        }
        (gpu_secs["heavy"], gpu_secs["light"])
    }

    #[test]
    fn backlogged_queues_get_gpu_time_in_proportion_to_their_weights() {
        for secs in [1, 7, 60, 600, 3_600] {
            let (heavy, light) = run_backlog(|_| Duration::from_secs(secs), Duration::from_secs(secs * 200));
            let ratio = heavy / light;
            assert!((ratio - 2.0).abs() < 0.2, "job length {secs}s: GPU-seconds ratio {ratio:.3}, want 2 ± 0.2");
        }
    }

    #[test]
    fn fair_share_holds_with_mixed_job_lengths() {
        // Lengths vary by job (1..=97 s, deterministic pseudo-random), so completions interleave.
        let (heavy, light) =
            run_backlog(|id| Duration::from_secs(1 + (id * 7_919 + 13) % 97), Duration::from_secs(20_000));
        let ratio = heavy / light;
        assert!((ratio - 2.0).abs() < 0.2, "GPU-seconds ratio {ratio:.3}, want 2 ± 0.2");
    }
}
