//! Preemption in the replay: a high-priority job stops a preemptible one on its member, the
//! victim restarts from scratch, and every policy still conserves jobs and GPUs.

use std::path::Path;
use std::sync::atomic::AtomicU64;

use super::*;
use crate::Tenant;
use crate::preemption::HIGH_PRIORITY;

const ONE_NODE: &str = r#"
name: one-node
clusters:
  - name: a
    region: us-east
    tier: owned
    prices: {h100: 2.0}
    nodes:
      - {shape: h, gpuType: h100, count: 1, gpusPerNode: 8, cpuPerNode: 64, memoryGiBPerNode: 512}
  - name: b
    region: us-east
    tier: owned
    prices: {h100: 2.0}
    nodes:
      - {shape: h, gpuType: h100, count: 2, gpusPerNode: 8, cpuPerNode: 64, memoryGiBPerNode: 512}
"#;

fn sim_job(id: u32, submit_secs: u64, duration_secs: u64, gpus: u32, tenant: u32) -> SimJob {
    SimJob::plain(id, tenant, submit_secs, duration_secs, gpus)
}

fn workload(jobs: Vec<SimJob>) -> Workload {
    Workload {
        source: "hand-made".into(),
        tenants: vec![Tenant { name: "t0".into(), home: 0 }, Tenant { name: "t1".into(), home: 1 }],
        jobs,
    }
}

/// A seed under which job 0 is preemptible and job 1 high priority, with half the jobs high
/// and every other one preemptible.
fn seed_for_victim_then_preemptor(mix: &PreemptionMix) -> u64 {
    (0..10_000)
        .find(|&seed| mix.class_of(seed, 0).preemptible && mix.class_of(seed, 1).priority == HIGH_PRIORITY)
        .unwrap()
}

fn replay(policy: Policy, workload: &Workload, mix: PreemptionMix, seed: u64, members: bool) -> RunResult {
    let topology = Topology::parse(ONE_NODE, Path::new("one-node.yaml")).unwrap();
    let config = SimConfig {
        check_invariants: true,
        seed,
        preemption: Some(mix),
        member_preemption: members,
        ..SimConfig::new(policy)
    };
    run(&topology, workload, &config, &AtomicU64::new(0)).unwrap()
}

#[test]
fn a_high_priority_job_preempts_a_preemptible_one_which_restarts_from_scratch() {
    let mix = PreemptionMix { share_high: 0.5, share_preemptible: 1.0 };
    let seed = seed_for_victim_then_preemptor(&mix);
    let jobs = workload(vec![sim_job(0, 0, 1000, 8, 0), sim_job(1, 10, 100, 8, 0)]);

    let with = replay(Policy::HomeOnly, &jobs, mix, seed, true);
    // The urgent job waits out the victim's 30 s grace; the victim starts over when it ends.
    assert_eq!((with.outcomes[1].start_secs, with.outcomes[1].end_secs), (40, 140));
    assert_eq!((with.outcomes[0].start_secs, with.outcomes[0].end_secs), (140, 1140));
    assert_eq!(with.preemption, PreemptionCounts { preemptions: 1, lost_gpu_secs: 8 * 40 });
    assert_eq!(with.clusters[0].busy_gpu_secs, 8 * (40 + 100 + 1000), "lost work counts as busy GPU time");

    let without = replay(Policy::HomeOnly, &jobs, mix, seed, false);
    assert_eq!(without.outcomes[1].start_secs, 1000);
    assert_eq!(without.preemption, PreemptionCounts::default());
}

#[test]
fn every_policy_replays_preemption_deterministically_and_conserves_jobs() {
    let mix = PreemptionMix { share_high: 0.2, share_preemptible: 0.6 };
    let jobs: Vec<SimJob> = (0..80u32)
        .map(|i| sim_job(i, u64::from(i) * 37, 200 + u64::from(i * 53 % 900), 1 + i * 7 % 8, i % 2))
        .collect();
    let jobs = workload(jobs);
    let mut preempted_somewhere = false;
    for policy in Policy::ALL {
        let first = replay(policy, &jobs, mix, 5, true);
        let again = replay(policy, &jobs, mix, 5, true);
        assert_eq!(first.outcomes, again.outcomes, "{policy}: same seed, same replay");
        assert_eq!(first.preemption, again.preemption);
        assert_eq!(first.outcomes.len(), 80);
        preempted_somewhere |= first.preemption.preemptions > 0;
        let off = replay(policy, &jobs, mix, 5, false);
        assert_eq!(off.preemption, PreemptionCounts::default(), "{policy}");
    }
    assert!(preempted_somewhere, "the workload is busy enough for members to preempt");
}

#[test]
fn meridian_offers_a_high_priority_job_where_its_member_preempts_for_it() {
    // Cluster `a`'s one node runs a preemptible 8-GPU job for 1,000 s; `b`'s two nodes run
    // non-preemptible jobs for 2,000 s (the b jobs come from tenant t1, home `b`). The urgent
    // job, arriving at 10 s, can start soonest on `a` by preemption: the member's quote says
    // so, the gateway offers it there, and `a` stops the victim after its 30 s grace.
    let mix = PreemptionMix { share_high: 0.5, share_preemptible: 0.5 };
    let seed = (0..10_000)
        .find(|&seed| {
            let class = |id| mix.class_of(seed, id);
            class(0).preemptible
                && class(0).priority != HIGH_PRIORITY
                && !class(1).preemptible
                && !class(2).preemptible
                && class(1).priority != HIGH_PRIORITY
                && class(2).priority != HIGH_PRIORITY
                && class(3).priority == HIGH_PRIORITY
        })
        .unwrap();
    let jobs = workload(vec![
        sim_job(0, 0, 1000, 8, 0),
        sim_job(1, 0, 2000, 8, 1),
        sim_job(2, 0, 2000, 8, 1),
        sim_job(3, 10, 100, 8, 0),
    ]);
    let with = replay(Policy::Meridian, &jobs, mix, seed, true);
    let urgent = &with.outcomes[3];
    assert_eq!(urgent.cluster, 0, "offered where preemption frees room");
    assert!(urgent.start_secs <= 10 + 30 + 2, "the grace and a round trip: {urgent:?}");
    assert_eq!(with.preemption.preemptions, 1);
    assert!(with.outcomes[0].start_secs > 10, "the victim ran again from scratch: {:?}", with.outcomes[0]);

    // Without member preemption, the urgent job waits for the first end.
    let without = replay(Policy::Meridian, &jobs, mix, seed, false);
    assert!(without.outcomes[3].start_secs >= 1000, "{:?}", without.outcomes[3]);
    assert_eq!(without.preemption, PreemptionCounts::default());
}
