//! Hand-checked scenarios for each policy, and conservation over every policy.

use std::path::Path;
use std::sync::atomic::AtomicU64;

use super::*;
use crate::{Dataset, Tenant};

/// Two owned clusters and one cloud cluster:
/// - `a` (us-east, owned): one 8-GPU V100 node at $1/GPU-h.
/// - `b` (eu-west, owned): two 8-GPU A100 nodes at $2/GPU-h.
/// - `c` (us-east, cloud): two 8-GPU A100 nodes at $4/GPU-h.
const FLEET: &str = r#"
name: test-fleet
description: three small clusters
clusters:
  - name: a
    region: us-east
    tier: owned
    prices: {v100: 1.0}
    nodes:
      - {shape: v, gpuType: v100, count: 1, gpusPerNode: 8, cpuPerNode: 64, memoryGiBPerNode: 512}
  - name: b
    region: eu-west
    tier: owned
    prices: {a100-80g: 2.0}
    nodes:
      - {shape: x, gpuType: a100-80g, count: 2, gpusPerNode: 8, cpuPerNode: 64, memoryGiBPerNode: 512}
  - name: c
    region: us-east
    tier: cloud
    prices: {a100-80g: 4.0}
    nodes:
      - {shape: x, gpuType: a100-80g, count: 2, gpusPerNode: 8, cpuPerNode: 64, memoryGiBPerNode: 512}
network:
  - {from: us-east, to: eu-west, gbps: 4.0, usdPerGb: 0.02}
"#;

fn fleet() -> Topology {
    Topology::parse(FLEET, Path::new("test-fleet.yaml")).unwrap()
}

struct JobDef {
    submit: u64,
    duration: u64,
    replicas: u32,
    gpus: u32,
    tenant: u32,
    gpu_type: Option<&'static str>,
    data: Option<(f64, &'static str)>,
}

fn job(submit: u64, duration: u64, gpus: u32) -> JobDef {
    JobDef { submit, duration, replicas: 1, gpus, tenant: 0, gpu_type: None, data: None }
}

/// Tenants `t0` (home `a`) and `t1` (home `b`).
fn workload(defs: Vec<JobDef>) -> Workload {
    let jobs = defs
        .into_iter()
        .enumerate()
        .map(|(i, d)| SimJob {
            id: u32::try_from(i).unwrap(),
            submit_secs: d.submit,
            duration_secs: d.duration,
            estimate_secs: d.duration,
            replicas: d.replicas,
            gpus_per_replica: d.gpus,
            tenant: d.tenant,
            gpu_type: d.gpu_type.map(str::to_owned),
            dataset: d.data.map(|(size_gib, region)| Dataset { size_gib, region: region.to_owned() }),
        })
        .collect();
    Workload {
        source: "hand-made".into(),
        tenants: vec![Tenant { name: "t0".into(), home: 0 }, Tenant { name: "t1".into(), home: 1 }],
        jobs,
    }
}

fn replay(policy: Policy, topology: &Topology, workload: &Workload) -> RunResult {
    let config = SimConfig { check_invariants: true, ..SimConfig::new(policy) };
    run(topology, workload, &config, &AtomicU64::new(0)).unwrap()
}

/// Cluster name per job, in job order.
fn placed(run: &RunResult, topology: &Topology) -> Vec<String> {
    run.outcomes.iter().map(|o| topology.clusters[o.cluster as usize].info.name.clone()).collect()
}

#[test]
fn home_only_runs_every_job_at_its_tenants_home_even_when_it_must_wait() {
    let topology = fleet();
    let mut defs = vec![job(0, 100, 8), job(0, 100, 8), job(0, 100, 8)];
    defs[2].tenant = 1;
    let run = replay(Policy::HomeOnly, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "a", "b"]);
    // The second job waits for the first: `a` has one 8-GPU node.
    assert_eq!(run.outcomes[1].start_secs, 100);
}

#[test]
fn round_robin_cycles_through_clusters_that_can_run_the_job() {
    let topology = fleet();
    let mut defs: Vec<JobDef> = (0..4).map(|i| job(i, 10, 1)).collect();
    defs[1].gpu_type = Some("a100-80g"); // skips nothing: `b` is next anyway
    defs[2].gpu_type = Some("v100"); // `c` has no V100: wraps to `a`
    let run = replay(Policy::RoundRobin, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "b", "a", "b"]);
}

#[test]
fn random_picks_only_feasible_clusters_spreads_and_repeats_for_a_seed() {
    let topology = fleet();
    let defs = |pin| (0..60).map(|i| JobDef { gpu_type: pin, ..job(i, 10, 1) }).collect::<Vec<_>>();
    let run = replay(Policy::Random, &topology, &workload(defs(None)));
    let clusters: std::collections::BTreeSet<String> = placed(&run, &topology).into_iter().collect();
    assert_eq!(clusters.len(), 3, "60 draws should reach all three clusters: {clusters:?}");
    assert_eq!(run, replay(Policy::Random, &topology, &workload(defs(None))));
    let pinned = replay(Policy::Random, &topology, &workload(defs(Some("a100-80g"))));
    assert!(placed(&pinned, &topology).iter().all(|c| c != "a"));
}

#[test]
fn least_loaded_sends_each_job_to_the_cluster_with_most_free_gpus() {
    let topology = fleet();
    // b and c both have 16 free: the tie goes to the first (b); then c has more free than b; then
    // all three have 8 (tie: a), then b and c have 8 and a has 4.
    let defs = vec![job(0, 1000, 8), job(1, 1000, 8), job(2, 1000, 4), job(3, 1000, 4)];
    let run = replay(Policy::LeastLoaded, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["b", "c", "a", "b"]);
}

#[test]
fn first_admit_runs_the_copy_that_starts_first_and_withdraws_the_others() {
    let topology = fleet();
    // Job 0 fills `a` (V100 only); job 1 (V100 only) must queue on `a`; job 2 may run anywhere
    // and starts at once on `a`? No: `a` is full, so the first cluster to admit it is `b`.
    let mut defs = vec![job(0, 100, 8), job(0, 100, 8), job(0, 50, 8)];
    defs[0].gpu_type = Some("v100");
    defs[1].gpu_type = Some("v100");
    let run = replay(Policy::FirstAdmit, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "a", "b"]);
    assert_eq!(run.outcomes[1].start_secs, 100);
    assert_eq!(run.outcomes[2].start_secs, 0);
    assert_eq!(run.clusters.iter().map(|c| c.busy_gpu_secs).sum::<u64>(), 8 * (100 + 100 + 50));
}

#[test]
fn cheapest_picks_the_lowest_price_including_egress_even_if_it_must_wait() {
    let topology = fleet();
    // Both jobs cost least on `a` ($1/GPU-h); the second waits there although `b` and `c` are idle.
    // The third is pinned to A100: `b` ($2) beats `c` ($4) despite 100 GiB of egress ($2.15).
    let mut defs = vec![job(0, 3600, 8), job(0, 3600, 8), job(0, 3600, 8)];
    defs[2].gpu_type = Some("a100-80g");
    defs[2].data = Some((100.0, "us-east"));
    let run = replay(Policy::Cheapest, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "a", "b"]);
    assert_eq!(run.outcomes[1].start_secs, 3600);
    assert!((run.outcomes[2].egress_usd - 100.0 * 1.073_741_824 * 0.02).abs() < 1e-9);
}

#[test]
fn locality_first_runs_jobs_in_their_datas_region() {
    let topology = fleet();
    let mut defs = vec![job(0, 100, 8), job(0, 100, 8), job(0, 100, 8)];
    defs[0].data = Some((10.0, "eu-west"));
    defs[1].data = Some((10.0, "us-east")); // a and c: c has more free GPUs
    defs[2].data = Some((10.0, "ap-northeast")); // no cluster there: most free anywhere (a: 8, b: 8, c: 8 → a)
    let run = replay(Policy::LocalityFirst, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["b", "c", "a"]);
    assert!(run.outcomes[..2].iter().all(|o| o.moved_gb == 0.0));
}

#[test]
fn meridian_binds_late_keeps_data_local_and_bursts_only_past_the_threshold() {
    let topology = fleet();
    // Job 0 (data in us-east) runs on `a`, local and cheapest. Job 1 (same data) could start on
    // `c` at once, but the owned wait (1000 s) is under the 30-minute burst threshold, and `b`
    // needs a copy of its 500 GiB (about 18 minutes): it waits for `a` or goes to `b`, never to `c`.
    let mut defs = vec![job(0, 1000, 8), job(0, 1000, 8)];
    defs[0].data = Some((500.0, "us-east"));
    defs[1].data = Some((500.0, "us-east"));
    let run = replay(Policy::Meridian, &topology, &workload(defs));
    let clusters = placed(&run, &topology);
    assert_eq!(clusters[0], "a");
    assert_ne!(clusters[1], "c", "bursting before the threshold: {clusters:?}");
    // A job that owned clusters would keep waiting for hours bursts to the cloud.
    let defs = vec![job(0, 100_000, 8), JobDef { replicas: 2, ..job(0, 100_000, 8) }, job(10, 100, 8)];
    let run = replay(Policy::Meridian, &topology, &workload(defs));
    let clusters = placed(&run, &topology);
    assert_eq!(clusters[2], "c", "{clusters:?}");
    assert_eq!(run.outcomes[2].start_secs, 10);
}

#[test]
fn meridian_runs_the_gateway_core_one_offer_per_job_and_no_cancels() {
    let topology = fleet();
    let defs: Vec<JobDef> = (0..40).map(|i| job(i * 20, 100 + (i * 37) % 400, [1, 2, 4, 8][i as usize % 4])).collect();
    let run = replay(Policy::Meridian, &topology, &workload(defs));
    let counts = run.gateway.expect("meridian reports what crossed the protocol");
    // Each job was offered once, accepted, and its record written at least on submit, offer,
    // bind, start and finish.
    assert_eq!((counts.offers, counts.declined, counts.cancels), (40, 0, 0), "{counts:?}");
    assert!(counts.records >= 5 * 40, "{counts:?}");
    assert_eq!(counts.rounds, run.events, "{counts:?}");
    assert!(replay(Policy::FirstAdmit, &topology, &workload(vec![job(0, 1, 1)])).gateway.is_none());
}

#[test]
fn meridian_holds_the_gpus_of_a_job_whose_data_is_being_copied() {
    let topology = fleet();
    // Job 0 needs both A100 nodes of `b` (eu-west) but its 500 GiB live in us-east: `b` accepts
    // it and holds both nodes while the data is copied (about 18 minutes). Job 1 arrives during
    // the copy; `b` shows no free GPU, so after the owned wait passes the burst threshold it
    // bursts to `c` at once instead of starting in the GPUs job 0 waits for.
    let defs = vec![
        JobDef { replicas: 2, gpu_type: Some("a100-80g"), data: Some((500.0, "us-east")), ..job(0, 100_000, 8) },
        JobDef { gpu_type: Some("a100-80g"), ..job(10, 100, 8) },
    ];
    let run = replay(Policy::Meridian, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["b", "c"]);
    let copy_secs = (500.0 * 1.073_741_824 * 8.0 / 4.0_f64).ceil() as u64;
    assert_eq!(run.outcomes[0].start_secs, copy_secs);
    assert_eq!(run.outcomes[1].start_secs, 10);
    let counts = run.gateway.unwrap();
    assert_eq!((counts.offers, counts.staged), (2, 1), "{counts:?}");
    // The copy is not charged as GPU time: GPU-seconds used equal those demanded.
    assert_eq!(run.clusters.iter().map(|c| c.busy_gpu_secs).sum::<u64>(), 16 * 100_000 + 8 * 100);
}

#[test]
fn every_policy_conserves_jobs_and_gpu_seconds() {
    let topology = fleet();
    let defs: Vec<JobDef> = (0..200u32)
        .map(|i| {
            // Every job fits its tenant's home (home-only must run it): t0's home `a` has one
            // V100 node, t1's home `b` two A100 nodes.
            let gpus = [1, 2, 4, 8][i as usize % 4];
            let tenant = i % 2;
            JobDef {
                replicas: if tenant == 1 && i % 7 == 0 { 2 } else { 1 },
                tenant,
                gpu_type: match (i % 5, tenant) {
                    (0, 0) => Some("v100"),
                    (0, 1) => Some("a100-80g"),
                    _ => None,
                },
                data: (i % 3 != 0)
                    .then_some((f64::from(i % 50) * 10.0, if i % 2 == 0 { "us-east" } else { "eu-west" })),
                ..job(u64::from(i) * 37, 50 + u64::from(i * 7919 % 3000), gpus)
            }
        })
        .collect();
    let workload = workload(defs);
    for policy in Policy::ALL {
        let run = replay(policy, &topology, &workload);
        assert_eq!(run.outcomes.len(), workload.jobs.len(), "{policy}");
        for (outcome, job) in run.outcomes.iter().zip(&workload.jobs) {
            assert_eq!(outcome.job, job.id, "{policy}");
            assert!(outcome.start_secs >= job.submit_secs, "{policy}: job {} starts before submit", job.id);
            assert_eq!(outcome.end_secs - outcome.start_secs, job.duration_secs, "{policy}");
        }
        let used: u64 = run.clusters.iter().map(|c| c.busy_gpu_secs).sum();
        assert_eq!(used, workload.gpu_secs(), "{policy}: GPU-seconds used != demanded");
    }
}
