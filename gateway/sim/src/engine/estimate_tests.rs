//! With `--estimate-error`, the gateway and the members know run times only by estimate, and the
//! truth only decides when jobs end.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::members::local_job;
use super::*;
use crate::command::tests::{HYBRID, args};
use crate::command::{SimArgs, build_workload};
use crate::workload::EstimateError;

fn noisy_workload(topology: &Topology, sigma: f64, seed: u64) -> Workload {
    let args = SimArgs { estimate_error: Some(EstimateError { sigma, bias: 0.0 }), ..args("llm", 1.0, 150, seed) };
    build_workload(&args, topology).unwrap()
}

#[test]
fn the_gateway_holds_only_estimates_never_a_true_duration() {
    let topology = Topology::load(Path::new(HYBRID)).unwrap();
    let workload = noisy_workload(&topology, 0.5, 3);
    let differ = workload.jobs.iter().filter(|j| j.estimate_secs != j.duration_secs).count();
    assert!(differ > workload.jobs.len() * 9 / 10, "σ = 0.5 should change most estimates: {differ}");

    let config = SimConfig { check_invariants: true, seed: 3, ..SimConfig::new(Policy::Meridian) };
    let progress = AtomicU64::new(0);
    let mut replay = Replay::new(&topology, &workload, &config, &progress).unwrap();
    replay.replay().unwrap();
    let federation = replay.federation.as_ref().unwrap();
    assert_eq!(federation.core_job_count(), workload.jobs.len(), "the core holds every job of the workload");
    for job in &workload.jobs {
        let record = federation.record_of(job.id).unwrap();
        let runtime = &record.spec.runtime;
        assert_eq!(runtime.estimate.as_secs(), job.estimate_secs, "job {}: the core holds its estimate", job.id);
        if job.estimate_secs != job.duration_secs {
            assert_ne!(runtime.estimate.as_secs(), job.duration_secs, "job {}: the core saw its true duration", job.id);
        }
        assert_eq!(runtime.limit, None, "job {}: no limit that could leak the truth", job.id);
    }
    // Every job still ran for exactly its true run time on the GPU type it got.
    let run = replay.finish().unwrap();
    for (outcome, job) in run.outcomes.iter().zip(&workload.jobs) {
        assert_true_run_time(&topology, outcome, job, "meridian");
    }
}

#[test]
fn with_estimate_error_every_policy_ends_jobs_at_their_true_duration() {
    let topology = Topology::load(Path::new(HYBRID)).unwrap();
    let workload = noisy_workload(&topology, 1.0, 5);
    for policy in Policy::ALL {
        let config = SimConfig { check_invariants: true, ..SimConfig::new(policy) };
        let run = run(&topology, &workload, &config, &AtomicU64::new(0)).unwrap();
        assert_eq!(run.outcomes.len(), workload.jobs.len(), "{policy}");
        for (outcome, job) in run.outcomes.iter().zip(&workload.jobs) {
            assert_true_run_time(&topology, outcome, job, policy.name());
        }
        let used: u64 = run.clusters.iter().map(|c| c.busy_gpu_secs).sum();
        let ran: u64 =
            run.outcomes.iter().zip(&workload.jobs).map(|(o, j)| j.gpus() * (o.end_secs - o.start_secs)).sum();
        assert_eq!(used, ran, "{policy}: GPU-seconds counted != GPU-seconds run");
    }
}

#[test]
fn members_are_handed_the_estimate_and_keep_the_truth_for_completion_only() {
    let topology = Topology::load(Path::new(HYBRID)).unwrap();
    let workload = noisy_workload(&topology, 0.5, 3);
    let job = workload.jobs.iter().find(|j| j.estimate_secs != j.duration_secs).unwrap();
    let local = local_job(job, job.id.to_string(), "default".into());
    assert_eq!(local.run_for, Duration::from_secs(job.estimate_secs));
    assert_eq!(local.true_run_time(), Duration::from_secs(job.duration_secs));
}

/// A job ran for its true duration at the speed of one of its cluster's GPU types.
fn assert_true_run_time(topology: &Topology, outcome: &crate::Outcome, job: &SimJob, policy: &str) {
    let ran = outcome.end_secs - outcome.start_secs;
    let cluster = &topology.clusters[outcome.cluster as usize];
    let possible: Vec<u64> = cluster.nodes.iter().map(|n| topology.run_secs(job.duration_secs, &n.gpu_type)).collect();
    assert!(possible.contains(&ran), "{policy}: job {} ran {ran}s; its true run times there are {possible:?}", job.id);
}
