//! What a run did for jobs with deadlines (`--deadlines`): how many missed them, and the dollars
//! spent on cloud clusters for them (what avoiding misses cost).
//!
//! A job misses its deadline when it ends after `submit + deadline`. Only `meridian` reads
//! deadlines; the baselines stand for systems that do not, and place those jobs as any other.

use meridian_proto::inventory::Tier;
use serde::Serialize;

use super::{RunResult, Workload};

/// Deadline outcomes of one run, over the jobs that had a deadline and ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadlineMetrics {
    /// Jobs with a deadline.
    pub jobs: u64,
    /// Of those, jobs that ended after their deadline.
    pub misses: u64,
    /// `misses ÷ jobs`, 0..1 (0 when no job had a deadline).
    pub miss_fraction: f64,
    /// Jobs with a deadline that ran on a cloud-tier cluster.
    pub cloud_jobs: u64,
    /// US$ (compute and egress) those cloud runs cost.
    pub cloud_usd: f64,
}

/// Deadline outcomes of `run`; None when no job of `workload` has a deadline (then reports stay
/// as they were without `--deadlines`).
pub fn compute(workload: &Workload, run: &RunResult) -> Option<DeadlineMetrics> {
    if workload.jobs.iter().all(|job| job.deadline_secs.is_none()) {
        return None;
    }
    let mut metrics = DeadlineMetrics { jobs: 0, misses: 0, miss_fraction: 0.0, cloud_jobs: 0, cloud_usd: 0.0 };
    for outcome in &run.outcomes {
        let Some(job) = workload.jobs.get(outcome.job as usize) else { continue };
        let Some(deadline) = job.deadline_secs else { continue };
        metrics.jobs += 1;
        if outcome.end_secs > job.submit_secs.saturating_add(deadline) {
            metrics.misses += 1;
        }
        if run.clusters.get(outcome.cluster as usize).is_some_and(|cluster| cluster.tier == Tier::Cloud) {
            metrics.cloud_jobs += 1;
            metrics.cloud_usd += outcome.compute_usd + outcome.egress_usd;
        }
    }
    if metrics.jobs > 0 {
        metrics.miss_fraction = metrics.misses as f64 / metrics.jobs as f64;
    }
    Some(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterUsage, Outcome, SimJob, Tenant};

    fn job(id: u32, submit: u64, deadline: Option<u64>) -> SimJob {
        SimJob { deadline_secs: deadline, ..SimJob::plain(id, 0, submit, 100, 1) }
    }

    fn ran(job: u32, cluster: u32, start: u64, compute_usd: f64) -> Outcome {
        Outcome { job, cluster, start_secs: start, end_secs: start + 100, moved_gb: 0.0, egress_usd: 1.0, compute_usd }
    }

    fn usage(name: &str, tier: Tier) -> ClusterUsage {
        ClusterUsage { name: name.into(), tier, gpus: 8, busy_gpu_secs: 0 }
    }

    #[test]
    fn misses_are_jobs_ending_after_submit_plus_deadline_and_cloud_dollars_count_only_due_jobs() {
        let jobs = vec![job(0, 0, Some(300)), job(1, 50, Some(300)), job(2, 0, None), job(3, 10, Some(200))];
        let workload =
            Workload { source: "t".into(), tenants: vec![Tenant { name: "t".into(), home: 0 }], jobs: jobs.clone() };
        let run = RunResult {
            policy: "p".into(),
            // Job 0 ends at 300 (on time, exactly), job 1 at 351 (late), job 2 has no deadline,
            // job 3 ends at 110 on the cloud (on time).
            outcomes: vec![ran(0, 0, 200, 0.0), ran(1, 0, 251, 0.0), ran(2, 1, 0, 50.0), ran(3, 1, 10, 7.0)],
            clusters: vec![usage("home", Tier::Owned), usage("cloud", Tier::Cloud)],
            events: 0,
            link_gb: 0.0,
            gateway: None,
            preemption: Default::default(),
        };
        let metrics = compute(&workload, &run).unwrap();
        assert_eq!(
            metrics,
            DeadlineMetrics { jobs: 3, misses: 1, miss_fraction: 1.0 / 3.0, cloud_jobs: 1, cloud_usd: 8.0 }
        );

        let none =
            Workload { jobs: jobs.into_iter().map(|j| SimJob { deadline_secs: None, ..j }).collect(), ..workload };
        assert_eq!(compute(&none, &run), None);
    }
}
