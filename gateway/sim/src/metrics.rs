//! What a run measured: queueing delay, completion time and slowdown (overall, per tenant and per
//! job size), cluster utilisation, money spent, data moved and fairness across tenants.
//!
//! Everything here is a pure function of a [`Workload`] and a [`RunResult`]. Percentiles are
//! nearest-rank: the p-th percentile of n values is the value at 1-based rank ⌈p/100 × n⌉ of the
//! sorted values. Empty sets give zeros, never NaN, so reports and JSON stay well-formed.

use std::collections::BTreeMap;

use meridian_proto::inventory::Tier;
use serde::Serialize;

use super::deadline::{self, DeadlineMetrics};
use super::{GatewayCounts, RunResult, SimJob, SizeBucket, Workload};

/// Seconds in an hour, for GPU-hours.
const SECS_PER_HOUR: f64 = 3_600.0;

/// Delay, completion-time and slowdown statistics over a set of jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Jobs in the set.
    pub jobs: u64,
    /// Mean queueing delay (start − submit), seconds.
    pub queue_mean_secs: f64,
    /// Median queueing delay, seconds.
    pub queue_p50_secs: f64,
    /// 99th-percentile queueing delay, seconds.
    pub queue_p99_secs: f64,
    /// Mean job completion time (end − submit), seconds.
    pub jct_mean_secs: f64,
    /// 99th-percentile job completion time, seconds.
    pub jct_p99_secs: f64,
    /// Mean slowdown (completion time ÷ run time; 1.0 = never waited).
    pub slowdown_mean: f64,
    /// 99th-percentile slowdown.
    pub slowdown_p99: f64,
}

/// One cluster's share of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMetrics {
    /// Cluster name.
    pub name: String,
    /// Owned or cloud.
    pub tier: Tier,
    /// GPUs the cluster has.
    pub gpus: u64,
    /// Busy GPU-seconds ÷ (GPUs × makespan), 0..1; 0 when the cluster has no GPUs or the run no
    /// makespan.
    pub utilisation: f64,
    /// GPU-hours jobs held on it.
    pub gpu_hours: f64,
}

/// Everything one policy's run measured; one row of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Policy name as given on the command line.
    pub policy: String,
    /// Statistics over every job.
    pub overall: Stats,
    /// Statistics per tenant name (tenants with at least one job).
    pub per_tenant: BTreeMap<String, Stats>,
    /// Statistics per job-size bucket (buckets with at least one job), keyed in JSON by the
    /// bucket's name: `"1"`, `"2-8"`, `"9-64"`, `"65+"`.
    pub per_size: BTreeMap<SizeBucket, Stats>,
    /// Last completion − first submission, seconds.
    pub makespan_secs: f64,
    /// Per cluster, in topology order.
    pub clusters: Vec<ClusterMetrics>,
    /// GPU-hours jobs held, all clusters.
    pub gpu_hours: f64,
    /// GPU-hours jobs held on cloud-tier clusters.
    pub cloud_gpu_hours: f64,
    /// US$ for GPUs.
    pub compute_usd: f64,
    /// US$ for copying data between regions.
    pub egress_usd: f64,
    /// Compute plus egress, US$.
    pub total_usd: f64,
    /// GB (10^9 bytes) of data copied between regions.
    pub moved_gb: f64,
    /// Share of jobs that ran on a cloud-tier cluster, 0..1.
    pub burst_fraction: f64,
    /// Jain's fairness index over tenants of 1 ÷ (the tenant's mean slowdown): 1.0 when every
    /// tenant is slowed equally, down towards 1/n when one tenant gets all the good service.
    pub jain_fairness: f64,
    /// Scheduling events the engine processed.
    pub events: u64,
    /// `meridian`: what crossed the agent protocol.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayCounts>,
    /// With `--deadlines`: misses and cloud dollars of the jobs that had a deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadlines: Option<DeadlineMetrics>,
}

/// One finished job as the statistics see it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    tenant: u32,
    bucket: SizeBucket,
    queue_secs: f64,
    jct_secs: f64,
    slowdown: f64,
}

/// Computes every metric of `run` over `workload`.
///
/// Outcomes are matched to jobs by [`super::Outcome::job`]. An outcome naming no job of the
/// workload is ignored, and a job without an outcome (the engine should never leave one) is left
/// out of every statistic rather than failing: the metrics then describe the jobs that did run,
/// and [`Stats::jobs`] says how many those were. Cluster indices outside the run's cluster list
/// count as owned.
pub fn compute(workload: &Workload, run: &RunResult) -> Metrics {
    let samples = samples(workload, run);

    let mut by_tenant: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    let mut by_size: BTreeMap<SizeBucket, Vec<Sample>> = BTreeMap::new();
    for sample in &samples {
        by_tenant.entry(sample.tenant).or_default().push(*sample);
        by_size.entry(sample.bucket).or_default().push(*sample);
    }

    // Two indices could carry the same name only in a malformed workload; merging them keeps
    // every job counted once.
    let mut tenant_samples: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for (index, group) in by_tenant {
        let name = workload
            .tenants
            .get(index as usize)
            .map(|tenant| tenant.name.clone())
            .unwrap_or_else(|| format!("tenant-{index}"));
        tenant_samples.entry(name).or_default().extend(group);
    }
    let per_tenant: BTreeMap<String, Stats> =
        tenant_samples.iter().map(|(name, group)| (name.clone(), stats(group))).collect();
    let per_size = by_size.iter().map(|(bucket, group)| (*bucket, stats(group))).collect();

    let makespan_secs = makespan(workload, run);
    let clusters: Vec<ClusterMetrics> = run
        .clusters
        .iter()
        .map(|usage| {
            let capacity = usage.gpus as f64 * makespan_secs;
            ClusterMetrics {
                name: usage.name.clone(),
                tier: usage.tier,
                gpus: usage.gpus,
                utilisation: ratio(usage.busy_gpu_secs as f64, capacity),
                gpu_hours: usage.busy_gpu_secs as f64 / SECS_PER_HOUR,
            }
        })
        .collect();
    let gpu_hours = clusters.iter().map(|cluster| cluster.gpu_hours).sum();
    let cloud_gpu_hours =
        clusters.iter().filter(|cluster| cluster.tier == Tier::Cloud).map(|cluster| cluster.gpu_hours).sum();

    let outcomes = matched_outcomes(workload, run);
    let compute_usd: f64 = outcomes.clone().map(|outcome| outcome.compute_usd).sum();
    let egress_usd: f64 = outcomes.clone().map(|outcome| outcome.egress_usd).sum();
    let moved_gb = outcomes.clone().map(|outcome| outcome.moved_gb).sum();
    let burst_jobs = outcomes
        .filter(|outcome| run.clusters.get(outcome.cluster as usize).is_some_and(|cluster| cluster.tier == Tier::Cloud))
        .count();

    let tenant_service: Vec<f64> = per_tenant
        .values()
        .map(|stats| if stats.slowdown_mean > 0.0 { 1.0 / stats.slowdown_mean } else { 0.0 })
        .collect();

    Metrics {
        policy: run.policy.clone(),
        overall: stats(&samples),
        per_tenant,
        per_size,
        makespan_secs,
        clusters,
        gpu_hours,
        cloud_gpu_hours,
        compute_usd,
        egress_usd,
        total_usd: compute_usd + egress_usd,
        moved_gb,
        burst_fraction: ratio(burst_jobs as f64, samples.len() as f64),
        jain_fairness: jain_index(&tenant_service),
        events: run.events,
        gateway: run.gateway,
        deadlines: deadline::compute(workload, run),
    }
}

/// Queueing delays of every job, ascending (for CDFs), in seconds. Jobs are matched to outcomes
/// as in [`compute`].
pub fn sorted_delays(workload: &Workload, run: &RunResult) -> Vec<f64> {
    let mut delays: Vec<f64> = samples(workload, run).iter().map(|sample| sample.queue_secs).collect();
    delays.sort_by(f64::total_cmp);
    delays
}

/// Jain's fairness index of `values`: (Σx)² ÷ (n · Σx²). It is 1.0 for one value, for no values
/// and when every value is zero (nobody is favoured), so it is never NaN.
fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let sum_of_squares: f64 = values.iter().map(|value| value * value).sum();
    if values.len() <= 1 || sum_of_squares <= 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * sum_of_squares)
}

/// Outcomes paired with the job they name; outcomes naming no job are dropped.
fn matched_outcomes<'a>(
    workload: &'a Workload,
    run: &'a RunResult,
) -> impl Iterator<Item = &'a super::Outcome> + Clone + 'a {
    run.outcomes.iter().filter(|outcome| workload.jobs.get(outcome.job as usize).is_some())
}

/// The per-job figures the statistics are built from, one per job that has an outcome.
fn samples(workload: &Workload, run: &RunResult) -> Vec<Sample> {
    run.outcomes
        .iter()
        .filter_map(|outcome| {
            let job: &SimJob = workload.jobs.get(outcome.job as usize)?;
            // The engine never starts a job before it is submitted nor ends it before it starts;
            // saturating keeps a broken run from producing negative delays.
            let queue_secs = outcome.start_secs.saturating_sub(job.submit_secs) as f64;
            let jct_secs = outcome.end_secs.saturating_sub(job.submit_secs) as f64;
            Some(Sample {
                tenant: job.tenant,
                bucket: SizeBucket::of(job.gpus()),
                queue_secs,
                jct_secs,
                slowdown: jct_secs / job.duration_secs.max(1) as f64,
            })
        })
        .collect()
}

/// Last completion − first submission over the jobs that ran; 0 when none did.
fn makespan(workload: &Workload, run: &RunResult) -> f64 {
    let mut first_submit: Option<u64> = None;
    let mut last_end: Option<u64> = None;
    for outcome in &run.outcomes {
        let Some(job) = workload.jobs.get(outcome.job as usize) else { continue };
        first_submit = Some(first_submit.map_or(job.submit_secs, |first| first.min(job.submit_secs)));
        last_end = Some(last_end.map_or(outcome.end_secs, |last| last.max(outcome.end_secs)));
    }
    match (first_submit, last_end) {
        (Some(first), Some(last)) => last.saturating_sub(first) as f64,
        _ => 0.0,
    }
}

/// Statistics of a set of samples: three sorts, one per percentile set.
fn stats(samples: &[Sample]) -> Stats {
    let mut queue: Vec<f64> = samples.iter().map(|sample| sample.queue_secs).collect();
    let mut jct: Vec<f64> = samples.iter().map(|sample| sample.jct_secs).collect();
    let mut slowdown: Vec<f64> = samples.iter().map(|sample| sample.slowdown).collect();
    queue.sort_by(f64::total_cmp);
    jct.sort_by(f64::total_cmp);
    slowdown.sort_by(f64::total_cmp);
    Stats {
        jobs: samples.len() as u64,
        queue_mean_secs: mean(&queue),
        queue_p50_secs: percentile(&queue, 50),
        queue_p99_secs: percentile(&queue, 99),
        jct_mean_secs: mean(&jct),
        jct_p99_secs: percentile(&jct, 99),
        slowdown_mean: mean(&slowdown),
        slowdown_p99: percentile(&slowdown, 99),
    }
}

/// Arithmetic mean; 0 for no values.
fn mean(values: &[f64]) -> f64 {
    ratio(values.iter().sum(), values.len() as f64)
}

/// Nearest-rank percentile of ascending `sorted` values: the value at 1-based rank
/// ⌈percent/100 × n⌉ (at least 1). Integer arithmetic keeps the rank exact; 0 for no values.
fn percentile(sorted: &[f64], percent: u64) -> f64 {
    let count = sorted.len() as u64;
    let rank = (percent * count).div_ceil(100).clamp(1, count.max(1));
    sorted.get((rank - 1) as usize).copied().unwrap_or(0.0)
}

/// `numerator ÷ denominator`, or 0 when the denominator is not positive.
fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 { numerator / denominator } else { 0.0 }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{ClusterUsage, Outcome, Tenant};

    const EPSILON: f64 = 1e-9;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() < EPSILON
    }

    fn job(id: u32, submit: u64, duration: u64, replicas: u32, gpus_per_replica: u32, tenant: u32) -> SimJob {
        SimJob { replicas, ..SimJob::plain(id, tenant, submit, duration, gpus_per_replica) }
    }

    fn outcome(job: u32, cluster: u32, start: u64, end: u64, moved_gb: f64, egress: f64, compute: f64) -> Outcome {
        Outcome { job, cluster, start_secs: start, end_secs: end, moved_gb, egress_usd: egress, compute_usd: compute }
    }

    /// Four jobs, tenants `alpha` and `beta`, an 8-GPU owned cluster and a 16-GPU cloud one.
    ///
    /// | job | tenant | GPUs   | submit | start | end | run | queue | JCT | slowdown |
    /// |-----|--------|--------|--------|-------|-----|-----|-------|-----|----------|
    /// | 0   | alpha  | 1      | 0      | 100   | 200 | 100 | 100   | 200 | 2        |
    /// | 1   | alpha  | 1×4    | 10     | 60    | 110 | 50  | 50    | 100 | 2        |
    /// | 2   | beta   | 2×8    | 20     | 420   | 620 | 200 | 400   | 600 | 3 (cloud)|
    /// | 3   | beta   | 1×2    | 30     | 270   | 330 | 60  | 240   | 300 | 5        |
    fn fixture() -> (Workload, RunResult) {
        let workload = Workload {
            source: "hand-built".to_owned(),
            tenants: vec![Tenant { name: "alpha".to_owned(), home: 0 }, Tenant { name: "beta".to_owned(), home: 0 }],
            jobs: vec![
                job(0, 0, 100, 1, 1, 0),
                job(1, 10, 50, 1, 4, 0),
                job(2, 20, 200, 2, 8, 1),
                job(3, 30, 60, 1, 2, 1),
            ],
        };
        let run = RunResult {
            policy: "meridian".to_owned(),
            outcomes: vec![
                outcome(0, 0, 100, 200, 0.0, 0.0, 0.0),
                outcome(1, 0, 60, 110, 10.0, 1.0, 0.0),
                outcome(2, 1, 420, 620, 100.0, 9.0, 16.0),
                outcome(3, 0, 270, 330, 0.0, 0.0, 0.0),
            ],
            clusters: vec![
                // 1×100 + 4×50 + 2×60 GPU-seconds.
                ClusterUsage { name: "onprem".to_owned(), tier: Tier::Owned, gpus: 8, busy_gpu_secs: 420 },
                // 16×200 GPU-seconds.
                ClusterUsage { name: "cloud".to_owned(), tier: Tier::Cloud, gpus: 16, busy_gpu_secs: 3_200 },
            ],
            events: 12,
            link_gb: 110.0,
            gateway: None,
            preemption: Default::default(),
        };
        (workload, run)
    }

    #[test]
    fn overall_stats_use_means_and_nearest_rank_percentiles() {
        let (workload, run) = fixture();
        let metrics = compute(&workload, &run);
        // Delays 100, 50, 400, 240 sort to 50, 100, 240, 400: p50 is rank ⌈2⌉ = 100, p99 is
        // rank ⌈3.96⌉ = 4 = 400; mean 790 / 4.
        assert_eq!(
            metrics.overall,
            Stats {
                jobs: 4,
                queue_mean_secs: 197.5,
                queue_p50_secs: 100.0,
                queue_p99_secs: 400.0,
                jct_mean_secs: 300.0,
                jct_p99_secs: 600.0,
                slowdown_mean: 3.0,
                slowdown_p99: 5.0,
            }
        );
        assert_eq!(metrics.policy, "meridian");
        assert_eq!(metrics.events, 12);
    }

    #[test]
    fn stats_are_split_by_tenant_and_size_bucket() {
        let (workload, run) = fixture();
        let metrics = compute(&workload, &run);
        assert_eq!(metrics.per_tenant.keys().collect::<Vec<_>>(), ["alpha", "beta"]);
        let beta = &metrics.per_tenant["beta"];
        assert_eq!((beta.jobs, beta.queue_mean_secs, beta.queue_p50_secs), (2, 320.0, 240.0));
        assert_eq!(beta.slowdown_mean, 4.0);

        assert_eq!(
            metrics.per_size.keys().copied().collect::<Vec<_>>(),
            [SizeBucket::One, SizeBucket::Node, SizeBucket::Multi]
        );
        let node = &metrics.per_size[&SizeBucket::Node];
        assert_eq!(
            (node.jobs, node.queue_mean_secs, node.queue_p50_secs, node.queue_p99_secs),
            (2, 145.0, 50.0, 240.0)
        );
        assert_eq!(metrics.per_size[&SizeBucket::Multi].jct_p99_secs, 600.0);
    }

    #[test]
    fn usage_money_and_fairness_follow_the_outcomes() {
        let (workload, run) = fixture();
        let metrics = compute(&workload, &run);
        assert_eq!(metrics.makespan_secs, 620.0);
        assert!(close(metrics.clusters[0].utilisation, 420.0 / (8.0 * 620.0)));
        assert!(close(metrics.clusters[1].utilisation, 3_200.0 / (16.0 * 620.0)));
        assert!(close(metrics.clusters[1].gpu_hours, 3_200.0 / 3_600.0));
        assert!(close(metrics.gpu_hours, 3_620.0 / 3_600.0));
        assert!(close(metrics.cloud_gpu_hours, 3_200.0 / 3_600.0));
        assert_eq!(metrics.burst_fraction, 0.25);
        assert_eq!(metrics.moved_gb, 110.0);
        assert_eq!((metrics.compute_usd, metrics.egress_usd, metrics.total_usd), (16.0, 10.0, 26.0));
        // Mean slowdowns: alpha 2, beta 4, so x = 0.5 and 0.25:
        // (0.5 + 0.25)² / (2 × (0.25 + 0.0625)) = 0.5625 / 0.625 = 0.9.
        assert!(close(metrics.jain_fairness, 0.9));
    }

    #[test]
    fn sorted_delays_are_ascending() {
        let (workload, run) = fixture();
        assert_eq!(sorted_delays(&workload, &run), [50.0, 100.0, 240.0, 400.0]);
    }

    #[test]
    fn an_empty_workload_gives_zeros_not_nan() {
        let workload = Workload { source: "empty".to_owned(), tenants: Vec::new(), jobs: Vec::new() };
        let run = RunResult {
            policy: "meridian".to_owned(),
            outcomes: Vec::new(),
            clusters: vec![ClusterUsage { name: "a".to_owned(), tier: Tier::Owned, gpus: 8, busy_gpu_secs: 0 }],
            events: 0,
            link_gb: 0.0,
            gateway: None,
            preemption: Default::default(),
        };
        let metrics = compute(&workload, &run);
        assert_eq!(metrics.overall.jobs, 0);
        assert_eq!(metrics.overall.queue_p99_secs, 0.0);
        assert_eq!(metrics.makespan_secs, 0.0);
        assert_eq!(metrics.clusters[0].utilisation, 0.0);
        assert_eq!(metrics.burst_fraction, 0.0);
        assert_eq!(metrics.jain_fairness, 1.0);
        assert!(metrics.per_tenant.is_empty() && metrics.per_size.is_empty());
        // serde_json writes NaN and infinities as null.
        let json = serde_json::to_string(&metrics).unwrap();
        assert!(!json.contains("null"), "{json}");
        assert!(sorted_delays(&workload, &run).is_empty());
    }

    #[test]
    fn missing_or_stray_outcomes_are_skipped_without_panicking() {
        let (workload, mut run) = fixture();
        run.outcomes.truncate(2);
        run.outcomes.push(outcome(99, 7, 0, 10, 0.0, 0.0, 0.0));
        let metrics = compute(&workload, &run);
        assert_eq!(metrics.overall.jobs, 2);
        assert_eq!(metrics.makespan_secs, 200.0);
        assert_eq!(metrics.burst_fraction, 0.0);
        assert_eq!(metrics.per_tenant.len(), 1);
    }

    #[test]
    fn size_buckets_serialize_as_json_object_keys() {
        let (workload, run) = fixture();
        let value = serde_json::to_value(compute(&workload, &run)).unwrap();
        let keys: Vec<&String> = value["perSize"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["1", "2-8", "9-64"]);
        assert_eq!(value["clusters"][1]["tier"], "cloud");
        assert_eq!(value["overall"]["queueMeanSecs"], 197.5);
    }

    #[test]
    fn nearest_rank_percentiles_match_the_definition() {
        let values: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&values, 50), 100.0);
        assert_eq!(percentile(&values, 99), 198.0);
        assert_eq!(percentile(&[7.0], 99), 7.0);
        assert_eq!(percentile(&[], 50), 0.0);
        assert_eq!(jain_index(&[0.0, 0.0]), 1.0);
        assert_eq!(jain_index(&[1.0, 0.0]), 0.5);
    }
}
