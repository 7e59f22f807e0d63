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

#[derive(Clone)]
struct JobDef {
    submit: u64,
    duration: u64,
    replicas: u32,
    gpus: u32,
    tenant: u32,
    gpu_type: Option<&'static str>,
    data: Option<(f64, &'static str)>,
    gpu_memory: u32,
}

fn job(submit: u64, duration: u64, gpus: u32) -> JobDef {
    JobDef { submit, duration, replicas: 1, gpus, tenant: 0, gpu_type: None, data: None, gpu_memory: 0 }
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
            gpu_memory_gib: d.gpu_memory,
            dataset: d.data.map(|(size_gib, region)| Dataset { size_gib, region: region.to_owned() }),
            deadline_secs: None,
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
fn cheapest_picks_the_lowest_price_including_egress_and_fails_over_past_its_wait_budget() {
    let topology = fleet();
    // Both jobs cost least on `a` ($1/GPU-h); the second queues there, and when it has waited its
    // budget (burst.after, 30 min) it fails over to the next cheapest, `b` ($2), and starts.
    // The third is pinned to A100: `b` ($2) beats `c` ($4) despite 100 GiB of egress ($2.15).
    let mut defs = vec![job(0, 3600, 8), job(0, 3600, 8), job(0, 3600, 8)];
    defs[2].gpu_type = Some("a100-80g");
    defs[2].data = Some((100.0, "us-east"));
    let run = replay(Policy::Cheapest, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "b", "b"]);
    assert_eq!(run.outcomes[1].start_secs, 1800);
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

/// 200 jobs of every size and GPU pin, most with data in one region or the other.
fn mixed_jobs() -> Vec<JobDef> {
    (0..200u32)
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
        .collect()
}

#[test]
fn every_policy_conserves_jobs_and_gpu_seconds() {
    let topology = fleet();
    let workload = workload(mixed_jobs());
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
        // Copy accounting conserves bytes: what crossed the links is what the jobs were charged.
        let booked: f64 = run.outcomes.iter().map(|o| o.moved_gb).sum();
        assert!((booked - run.link_gb).abs() < 1e-6 * run.link_gb.max(1.0), "{policy}: {booked} != {}", run.link_gb);
    }
}

#[test]
fn least_loaded_ranks_by_replicas_of_this_job_that_fit_not_free_gpus() {
    let topology = fleet();
    // Job 0 takes half of `a` (4 V100 free, one node). Jobs 1-4 (5 A100 GPUs each) leave 3 free
    // on every node of `b` and `c`: 6 free GPUs each, but no node with 4. Job 5 (4 GPUs) has the
    // most free GPUs on `b`, yet fits only on `a`: Karmada's estimator sends it there.
    let mut defs = vec![JobDef { gpu_type: Some("v100"), ..job(0, 1000, 4) }];
    defs.extend((0..4).map(|_| JobDef { gpu_type: Some("a100-80g"), ..job(0, 1000, 5) }));
    defs.push(job(0, 1000, 4));
    let run = replay(Policy::LeastLoaded, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["a", "b", "c", "b", "c", "a"]);
    assert_eq!(run.outcomes[5].start_secs, 0);
}

#[test]
fn first_admit_pays_for_the_bytes_its_withdrawn_copy_moved() {
    let topology = fleet();
    // Job 0 (2 × 8 A100) takes `b` until 100 s. Job 1 (A100, 100 GiB in eu-west) queues on `b`,
    // where its data is, and copies to `c` at 4 Gbit/s (0.5 GB/s). At 100 s it starts on `b`;
    // the copy to `c` is withdrawn after moving 50 GB, which it pays ($0.02/GB) and counts.
    let defs = vec![
        JobDef { replicas: 2, gpu_type: Some("a100-80g"), ..job(0, 100, 8) },
        JobDef { gpu_type: Some("a100-80g"), data: Some((100.0, "eu-west")), ..job(0, 100, 8) },
    ];
    let run = replay(Policy::FirstAdmit, &topology, &workload(defs));
    assert_eq!(placed(&run, &topology), ["b", "b"]);
    assert_eq!(run.outcomes[1].start_secs, 100);
    assert!((run.outcomes[1].moved_gb - 50.0).abs() < 1e-6, "{:?}", run.outcomes[1]);
    assert!((run.outcomes[1].egress_usd - 1.0).abs() < 1e-6, "{:?}", run.outcomes[1]);
    assert!((run.link_gb - 50.0).abs() < 1e-6);
}

#[test]
fn copies_on_one_link_share_it_two_equal_ones_each_take_twice_as_long() {
    let topology = fleet();
    // Tenant 1's home is `b` (eu-west); 100 GiB from us-east at 4 Gbit/s take 214.7 s alone.
    let alone = (100.0 * 1.073_741_824 * 8.0 / 4.0_f64).ceil() as u64;
    let with_data = |submit| JobDef { tenant: 1, data: Some((100.0, "us-east")), ..job(submit, 100, 8) };
    let run = replay(Policy::HomeOnly, &topology, &workload(vec![with_data(0)]));
    assert_eq!(run.outcomes[0].start_secs, alone);
    let run = replay(Policy::HomeOnly, &topology, &workload(vec![with_data(0), with_data(0)]));
    let shared = (2.0 * 100.0 * 1.073_741_824 * 8.0 / 4.0_f64).ceil() as u64;
    assert_eq!([run.outcomes[0].start_secs, run.outcomes[1].start_secs], [shared, shared]);
    assert!(shared >= 2 * alone - 1);
}

#[test]
fn run_time_and_cost_follow_the_speed_of_the_gpu_type_a_job_gets() {
    let text = format!("{FLEET}gpuSpeed: {{v100: 0.5, a100-80g: 2.0}}\n");
    let topology = Topology::parse(&text, Path::new("speed.yaml")).unwrap();
    // Tenant 0 runs on `a` (V100, $1): 1000 s on the reference take 2000 s; tenant 1 on `b`
    // (A100, $2): 500 s.
    let defs = vec![job(0, 1000, 8), JobDef { tenant: 1, ..job(0, 1000, 8) }];
    for policy in [Policy::HomeOnly, Policy::Meridian] {
        let run = replay(policy, &topology, &workload(defs.clone()));
        let secs: Vec<u64> = run.outcomes.iter().map(|o| o.end_secs - o.start_secs).collect();
        let on_v100 = placed(&run, &topology).iter().map(|c| c == "a").collect::<Vec<_>>();
        for ((secs, v100), outcome) in secs.iter().zip(on_v100).zip(&run.outcomes) {
            let (expected, price) =
                if v100 { (2000, 1.0) } else { (500, if outcome.cluster == 1 { 2.0 } else { 4.0 }) };
            assert_eq!(*secs, expected, "{policy}");
            assert!((outcome.compute_usd - 8.0 * price * expected as f64 / 3600.0).abs() < 1e-9, "{policy}");
        }
    }
    // A job needing 40 GiB of GPU memory never runs on `a`'s 32 GiB V100s.
    let defs: Vec<JobDef> = (0..6).map(|i| JobDef { gpu_memory: 40, ..job(i, 100, 8) }).collect();
    for policy in [Policy::RoundRobin, Policy::FirstAdmit, Policy::Meridian] {
        let run = replay(policy, &topology, &workload(defs.clone()));
        assert!(placed(&run, &topology).iter().all(|c| c != "a"), "{policy}");
    }
}

#[test]
fn meridian_bursts_a_job_early_to_meet_its_deadline_while_home_only_misses_it() {
    let topology = fleet();
    // Job 0 fills `a` (one V100 node) and job 1 fills `b` (two A100 nodes) until t = 1000. Job 2
    // (tenant 0, home `a`, 8 GPUs, 600 s) arrives at t = 10, due 1200 s later (t = 1210). Owned
    // clusters could start it at t = 1000 and finish at 1600: 390 s late. The expected owned wait
    // (990 s) is under the 30-minute burst threshold, so only the deadline sends it to `c` now.
    let mut defs = vec![job(0, 1000, 8), JobDef { replicas: 2, tenant: 1, ..job(0, 1000, 8) }, job(10, 600, 8)];
    defs[0].gpu_type = Some("v100");
    let mut due = workload(defs);
    due.jobs[2].deadline_secs = Some(1200);
    let missed = |run: &RunResult| crate::deadline::compute(&due, run).map(|d| (d.jobs, d.misses, d.cloud_jobs));

    let meridian = replay(Policy::Meridian, &topology, &due);
    assert_eq!(placed(&meridian, &topology)[2], "c");
    assert_eq!((meridian.outcomes[2].start_secs, meridian.outcomes[2].end_secs), (10, 610));
    assert_eq!(missed(&meridian), Some((1, 0, 1)));
    // 8 A100s at $4/GPU-h for 600 s: the dollars spent to meet the deadline.
    let spent = crate::deadline::compute(&due, &meridian).map(|d| d.cloud_usd);
    assert!(spent.is_some_and(|usd| (usd - 8.0 * 4.0 * 600.0 / 3600.0).abs() < 1e-9), "{spent:?}");

    let home = replay(Policy::HomeOnly, &topology, &due);
    assert_eq!(placed(&home, &topology)[2], "a");
    assert_eq!(home.outcomes[2].end_secs, 1600);
    assert_eq!(missed(&home), Some((1, 1, 0)));

    // Without the deadline, Meridian waits for an owned cluster as before.
    let mut relaxed = due.clone();
    relaxed.jobs[2].deadline_secs = None;
    let waited = replay(Policy::Meridian, &topology, &relaxed);
    assert_ne!(placed(&waited, &topology)[2], "c");
    assert_eq!(waited.outcomes[2].start_secs, 1000);
}

#[test]
fn meridian_with_sibling_copies_starts_each_job_once_and_leaves_no_copy_behind() {
    let topology = fleet();
    let workload = workload(mixed_jobs());
    let mut config = SimConfig { check_invariants: true, ..SimConfig::new(Policy::Meridian) };
    config.placement.sibling_copies = 2;
    // The replay fails if a job starts twice, a copy runs before its grant (its end is never
    // set), or an agent still holds a copy at the end.
    let run = run(&topology, &workload, &config, &AtomicU64::new(0)).unwrap();
    assert_eq!(run.outcomes.len(), workload.jobs.len());
    let used: u64 = run.clusters.iter().map(|c| c.busy_gpu_secs).sum();
    assert_eq!(used, workload.gpu_secs(), "GPU-seconds used != demanded");
    let counts = run.gateway.unwrap();
    assert!(counts.copies > 0 && counts.granted > 0, "{counts:?}");
    assert_eq!(counts.granted, counts.copies_ready, "every ready copy was granted: {counts:?}");
    assert_eq!(counts.declined, 0, "the inventory shows the members' reservations: {counts:?}");
}
