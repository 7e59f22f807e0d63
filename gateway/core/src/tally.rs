//! Counters of what happened, for the gateway's metrics: placement decisions by outcome,
//! clusters' rejection reasons, queueing delay and completion time, finished jobs, burst use and
//! data moved between regions.
//!
//! A [`ReadView`](crate::ReadView) shows the present (who is queued, what runs where); these
//! counters keep the history it cannot. The core updates them where rounds decide and where jobs
//! change (`ledger.rs`), and publishes them with every view as a cheap `Arc` copy, so a
//! scrape reads one consistent set and nothing is counted twice. Counters start at zero with
//! each gateway process (Prometheus' `rate` and `increase` handle the reset).
//!
//! Every label value here is bounded: tenants and clusters are few, priorities are grouped in
//! three bands, rejection reasons and outcomes are fixed names.

use std::collections::BTreeMap;

use meridian_placement::{Decision, Verdict};
use meridian_proto::inventory::Tier;
use meridian_proto::job::JobState;

use crate::decision::Decided;
use crate::record::JobRecord;
use crate::registry::Registry;

/// Upper bounds (seconds) of the queueing-delay buckets: GPU batch jobs wait from seconds (an
/// idle cluster) to days (a big gang behind a busy quota).
pub const QUEUEING_DELAY_BUCKETS_SECS: [f64; 16] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1_800.0, 3_600.0, 7_200.0, 14_400.0, 28_800.0, 86_400.0,
    172_800.0, 604_800.0,
];

/// Upper bounds (seconds) of the completion-time buckets (submit to finish): from a failed
/// start in seconds to training runs of two weeks.
pub const COMPLETION_TIME_BUCKETS_SECS: [f64; 16] = [
    10.0,
    60.0,
    300.0,
    900.0,
    1_800.0,
    3_600.0,
    7_200.0,
    14_400.0,
    28_800.0,
    57_600.0,
    86_400.0,
    172_800.0,
    345_600.0,
    604_800.0,
    1_209_600.0,
    2_419_200.0,
];

/// Bytes in a GiB (dataset sizes are given in GiB).
pub(crate) const GIB: f64 = 1_073_741_824.0;

/// A histogram with fixed bucket bounds: counts per bucket (not cumulative), their sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, then one for values above the last bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Counts one value (negative values count as 0: clocks of two machines may disagree a little).
    pub fn observe(&mut self, value: f64) {
        let value = if value.is_finite() { value.max(0.0) } else { f64::MAX };
        let bucket = self.bounds.iter().position(|bound| value <= *bound).unwrap_or(self.bounds.len());
        if let Some(count) = self.counts.get_mut(bucket) {
            *count += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// `(upper bound, count in that bucket)`, not cumulative, ending with `(f64::MAX, count
    /// above the last bound)` (what `prometheus-client` encodes as `+Inf`).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds.iter().copied().chain(std::iter::once(f64::MAX)).zip(self.counts.iter().copied()).collect()
    }

    /// Sum of the values counted.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// A job's priority (0..=100) grouped for labels: a label per priority value would multiply
/// every histogram by 101.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PriorityBand {
    /// 0..=29.
    Low,
    /// 30..=69 (the default, 50, is here).
    Normal,
    /// 70..=100.
    High,
}

impl PriorityBand {
    /// The band of `priority`.
    pub fn of(priority: u32) -> Self {
        match priority {
            0..=29 => Self::Low,
            30..=69 => Self::Normal,
            _ => Self::High,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
        }
    }
}

/// What a placement decision did with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Offered to a cluster where it starts now.
    Placed,
    /// Decided, but no cluster can start it now: it stays queued.
    Waiting,
    /// Held back by its tenant's quota (GPUs or queued jobs) before placement looked at it.
    HeldByQuota,
    /// Refused at submit: no cluster could ever run it.
    RefusedNeverFits,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 4] = [Outcome::Placed, Outcome::Waiting, Outcome::HeldByQuota, Outcome::RefusedNeverFits];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Placed => "placed",
            Self::Waiting => "waiting",
            Self::HeldByQuota => "held_by_quota",
            Self::RefusedNeverFits => "refused_never_fits",
        }
    }
}

/// Why a job that has not started yet is waiting, as a bounded class (the `reason` label of the
/// pending-jobs gauges and of the "pending too long" alert). The job's explanation has the
/// sentence with numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PendingReason {
    /// Queued, and no round has decided about it yet (or its decision is from before a restart).
    NotYetPlaced,
    /// Queued behind its tenant's quota.
    HeldByQuota,
    /// Queued: a cluster was chosen but cannot start it now (not enough free GPUs).
    WaitingForCapacity,
    /// Queued: every cluster rejects it now (disconnected, burst not yet allowed, over budget...).
    NoEligibleCluster,
    /// Offered to a cluster; its agent has not confirmed yet.
    Offered,
    /// Bound to a cluster, waiting in its local scheduler's queue.
    MemberQueue,
}

impl PendingReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotYetPlaced => "not_yet_placed",
            Self::HeldByQuota => "held_by_quota",
            Self::WaitingForCapacity => "waiting_for_capacity",
            Self::NoEligibleCluster => "no_eligible_cluster",
            Self::Offered => "offered",
            Self::MemberQueue => "member_queue",
        }
    }

    /// Why `job` waits, given its latest decision; None for a job that is not waiting (running,
    /// finished, or `Unknown`).
    pub fn of(job: &JobRecord, decided: Option<&Decided>) -> Option<Self> {
        match job.state {
            JobState::Offered => Some(Self::Offered),
            JobState::Bound => Some(Self::MemberQueue),
            JobState::Queued => Some(match decided {
                None | Some(Decided::Stored(_)) => Self::NotYetPlaced,
                Some(Decided::Quota { .. }) => Self::HeldByQuota,
                Some(Decided::Live { decision, .. }) => match decision.chosen {
                    Some(_) => Self::WaitingForCapacity,
                    None => Self::NoEligibleCluster,
                },
            }),
            JobState::Running | JobState::Unknown | JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
                None
            }
        }
    }
}

/// GPU time and cost on one cloud (burst) cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BurstUse {
    /// GPU-seconds of federation jobs that ran there (replicas × GPUs × seconds running).
    pub gpu_seconds: f64,
    /// What they cost at the cluster's price for the GPU type they ran on, US$.
    pub usd: f64,
}

/// The counters. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    decisions: BTreeMap<Outcome, u64>,
    rejections: BTreeMap<&'static str, u64>,
    queueing_delay: BTreeMap<(String, PriorityBand), Histogram>,
    completion_time: BTreeMap<(String, PriorityBand), Histogram>,
    finished: BTreeMap<(String, &'static str), u64>,
    burst: BTreeMap<String, BurstUse>,
    moved_bytes: BTreeMap<(String, String), f64>,
}

impl Tally {
    /// Placement decisions with `outcome`.
    pub fn decisions(&self, outcome: Outcome) -> u64 {
        self.decisions.get(&outcome).copied().unwrap_or(0)
    }

    /// Clusters rejected for each reason (one count per cluster and reason of each decision).
    pub fn rejections(&self) -> &BTreeMap<&'static str, u64> {
        &self.rejections
    }

    /// Seconds from submit to start, per (tenant, priority band); a job that starts again after
    /// a preemption or a lost cluster counts again, from its submit.
    pub fn queueing_delay(&self) -> &BTreeMap<(String, PriorityBand), Histogram> {
        &self.queueing_delay
    }

    /// Seconds from submit to a terminal state, per (tenant, priority band).
    pub fn completion_time(&self) -> &BTreeMap<(String, PriorityBand), Histogram> {
        &self.completion_time
    }

    /// Jobs that reached a terminal state, per (tenant, `succeeded`|`failed`|`cancelled`).
    pub fn finished(&self) -> &BTreeMap<(String, &'static str), u64> {
        &self.finished
    }

    /// GPU time and cost on cloud clusters, by cluster.
    pub fn burst(&self) -> &BTreeMap<String, BurstUse> {
        &self.burst
    }

    /// Bytes of job data to copy between regions, by (from region, to region), estimated when
    /// a job is placed away from its data.
    pub fn moved_bytes(&self) -> &BTreeMap<(String, String), f64> {
        &self.moved_bytes
    }

    fn decided(&mut self, outcome: Outcome) {
        *self.decisions.entry(outcome).or_default() += 1;
    }

    fn rejected(&mut self, decision: &Decision) {
        for candidate in &decision.candidates {
            if let Verdict::Rejected { reasons } = &candidate.verdict {
                for reason in reasons.iter() {
                    *self.rejections.entry(reason.kind()).or_default() += 1;
                }
            }
        }
    }
}

/// The label value of a terminal state.
fn terminal_label(state: JobState) -> Option<&'static str> {
    match state {
        JobState::Succeeded => Some("succeeded"),
        JobState::Failed => Some("failed"),
        JobState::Cancelled => Some("cancelled"),
        JobState::Queued | JobState::Offered | JobState::Bound | JobState::Running | JobState::Unknown => None,
    }
}

/// Seconds between two Unix-ms times, never negative.
fn secs_between(from_ms: i64, to_ms: i64) -> f64 {
    (to_ms.saturating_sub(from_ms)).max(0) as f64 / 1000.0
}

/// What one change of a job adds to the counters: a start (queueing delay), an end (completion
/// time, finished jobs), GPU time on a cloud cluster that stopped (ended, requeued or moved).
#[derive(Debug)]
pub(crate) struct JobChange<'a> {
    job: &'a JobRecord,
    started_at_ms: Option<i64>,
    /// The finish time, when the job just reached a terminal state.
    ended_at_ms: Option<i64>,
    /// (cloud cluster, GPU-seconds, US$) of a run that stopped.
    burst: Option<(String, f64, f64)>,
}

impl<'a> JobChange<'a> {
    /// What the change of `job` from `previous` counts, or None when it counts nothing. Clusters'
    /// tiers and prices come from `registry`; a change without its own time counts at `now_ms`.
    pub(crate) fn of(
        previous: Option<&JobRecord>,
        job: &'a JobRecord,
        registry: &Registry,
        now_ms: i64,
    ) -> Option<Self> {
        let started_at_ms = job.started_at_ms.filter(|_| previous.is_none_or(|p| p.started_at_ms.is_none()));
        let ended = job.state.is_terminal() && previous.is_none_or(|p| !p.state.is_terminal());
        let stopped_run = previous.and_then(|p| {
            let start = p.started_at_ms?;
            let still_running = job.started_at_ms == Some(start) && job.cluster == p.cluster && !ended;
            (!still_running).then_some((p, start))
        });
        let burst = stopped_run.and_then(|(p, start)| {
            let cluster = p.cluster.as_deref()?;
            let entry = registry.get(cluster)?;
            if entry.info.tier != Tier::Cloud {
                return None;
            }
            let end = job.finished_at_ms.unwrap_or(now_ms);
            let gpu_seconds = f64::from(p.spec.total_gpus()) * secs_between(start, end);
            // A span is billed at its dearest type: the member may give the gang any of them.
            let price = p.gpu_type.as_deref().map_or(0.0, |t| {
                meridian_proto::gpu::span_types(t).filter_map(|t| entry.info.prices.get(t)).copied().fold(0.0, f64::max)
            });
            Some((cluster.to_string(), gpu_seconds, gpu_seconds / 3600.0 * price))
        });
        if started_at_ms.is_none() && !ended && burst.is_none() {
            return None;
        }
        let ended_at_ms = ended.then(|| job.finished_at_ms.unwrap_or(now_ms));
        Some(Self { job, started_at_ms, ended_at_ms, burst })
    }
}

impl Tally {
    /// Counts a placement decision of a round: its outcome and every cluster's rejections.
    pub(crate) fn count_decision(&mut self, outcome: Outcome, decision: Option<&Decision>) {
        self.decided(outcome);
        if let Some(decision) = decision {
            self.rejected(decision);
        }
    }

    /// Counts the data a placed job will copy to `cluster_region`: each dataset homed elsewhere.
    pub(crate) fn count_data_moved(&mut self, job: &JobRecord, cluster_region: &str) {
        for data in job.spec.data.iter().filter(|d| d.region != cluster_region) {
            *self.moved_bytes.entry((data.region.clone(), cluster_region.to_string())).or_default() +=
                data.size_gib.max(0.0) * GIB;
        }
    }

    /// Counts what a change of a job means (see [`JobChange`]).
    pub(crate) fn count_job_change(&mut self, change: JobChange<'_>) {
        let job = change.job;
        let key = || (job.spec.tenant.clone(), PriorityBand::of(job.spec.priority));
        if let Some(started_at) = change.started_at_ms {
            self.queueing_delay
                .entry(key())
                .or_insert_with(|| Histogram::new(&QUEUEING_DELAY_BUCKETS_SECS))
                .observe(secs_between(job.submitted_at_ms, started_at));
        }
        if let Some(finished_at) = change.ended_at_ms {
            self.completion_time
                .entry(key())
                .or_insert_with(|| Histogram::new(&COMPLETION_TIME_BUCKETS_SECS))
                .observe(secs_between(job.submitted_at_ms, finished_at));
            if let Some(state) = terminal_label(job.state) {
                *self.finished.entry((job.spec.tenant.clone(), state)).or_default() += 1;
            }
        }
        if let Some((cluster, gpu_seconds, usd)) = change.burst {
            let used = self.burst.entry(cluster).or_default();
            used.gpu_seconds += gpu_seconds;
            used.usd += usd;
        }
    }
}

#[cfg(test)]
mod tests {
    use meridian_placement::Rejection;

    use super::*;

    #[test]
    fn a_histogram_counts_each_value_in_the_first_bucket_that_holds_it() {
        let mut histogram = Histogram::new(&[1.0, 10.0]);
        for value in [0.5, 1.0, 3.0, 10.0, 11.0, -2.0, f64::NAN] {
            histogram.observe(value);
        }
        assert_eq!(histogram.buckets(), vec![(1.0, 3), (10.0, 2), (f64::MAX, 2)]);
        assert_eq!(histogram.count(), 7);
    }

    #[test]
    fn priorities_fall_into_three_bands_with_the_default_in_normal() {
        assert_eq!(PriorityBand::of(0), PriorityBand::Low);
        assert_eq!(PriorityBand::of(29), PriorityBand::Low);
        assert_eq!(PriorityBand::of(meridian_proto::spec::DEFAULT_PRIORITY), PriorityBand::Normal);
        assert_eq!(PriorityBand::of(70), PriorityBand::High);
        assert_eq!(PriorityBand::of(100), PriorityBand::High);
    }

    #[test]
    fn rejection_names_are_snake_case_words() {
        let samples = [
            Rejection::Disconnected,
            Rejection::BurstNever,
            Rejection::ClusterExcluded,
            Rejection::BurstNotYet { owned_wait_secs: 1.0, waited_secs: 2.0, after_secs: 3 },
        ];
        for rejection in &samples {
            let name = rejection.kind();
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
        }
    }
}
