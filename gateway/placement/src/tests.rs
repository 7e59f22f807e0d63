//! Placement behaviour end to end: one test per rule, plus properties over random federations.

use std::collections::BTreeMap;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::{
    BackendKind, ClusterInfo, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure, Tier,
};
use meridian_proto::spec::{
    BurstPolicy, ClusterRules, DataRef, GangSpec, JobSpec, Payload, PlacementRules, Resources, RuntimeSpec,
};
use proptest::prelude::*;

use super::*;

fn shape(gpu_type: &str, gpus_per_node: u32, free_gpus: &[u32]) -> NodeShape {
    NodeShape {
        name: format!("{gpu_type}-x{gpus_per_node}"),
        gpu_type: gpu_type.to_owned(),
        gpu_memory_gib: match gpu_type {
            "h100" | "a100-80g" => 80,
            "l4" => 24,
            _ => 40,
        },
        gpus_per_node,
        cpu_per_node: 16 * gpus_per_node,
        memory_gib_per_node: 128 * gpus_per_node,
        free: free_gpus.iter().map(|&g| NodeFree { gpus: g, cpu: 16 * g, memory_gib: 128 * g }).collect(),
        labels: Default::default(),
    }
}

fn info(name: &str, region: &str, tier: Tier) -> ClusterInfo {
    let prices = [("h100", 4.0), ("a100-80g", 2.0), ("l4", 0.8)];
    ClusterInfo {
        name: name.to_owned(),
        region: region.to_owned(),
        tier,
        backend: BackendKind::Builtin,
        prices: prices.iter().map(|(t, p)| ((*t).to_owned(), if tier == Tier::Cloud { *p } else { 0.0 })).collect(),
        supports_containers: true,
        supports_bare_commands: true,
        labels: Default::default(),
    }
}

fn cluster(name: &str, region: &str, tier: Tier, shapes: Vec<NodeShape>) -> ClusterSnapshot {
    ClusterSnapshot::new(info(name, region, tier), Inventory { shapes }, QueuePressure::default(), true)
}

fn busy(name: &str, region: &str, tier: Tier, shapes: Vec<NodeShape>, wait_secs: u64) -> ClusterSnapshot {
    let total: u32 = shapes.iter().map(NodeShape::gpus_total).sum();
    let pressure = QueuePressure {
        queues: vec![QueueLoad {
            queue: "default".into(),
            weight: 1.0,
            pending_jobs: 1,
            pending_gpus: 0,
            running_gpus: total,
        }],
        releases: vec![GpuRelease { after_secs: wait_secs, gpus: total }],
        estimated_wait_secs: wait_secs,
    };
    ClusterSnapshot::new(info(name, region, tier), Inventory { shapes }, pressure, true)
}

/// `c` with `gpu_type` at `usd_per_gpu_hour` (a snapshot's report is read-only once built).
fn priced(c: ClusterSnapshot, gpu_type: &str, usd_per_gpu_hour: f64) -> ClusterSnapshot {
    let mut info = c.info().clone();
    info.prices.insert(gpu_type.to_owned(), usd_per_gpu_hour);
    ClusterSnapshot::new(info, c.inventory().clone(), (*c.pressure).clone(), c.connected)
}

fn job(replicas: u32, gpus: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        tenant: "research".into(),
        priority: 50,
        preemptible: false,
        labels: BTreeMap::new(),
        idempotency_key: None,
        gang: GangSpec {
            replicas,
            resources: Resources { gpus, gpu_types: vec![], gpu_memory_gib: 0, cpu: 4 * gpus, memory_gib: 32 * gpus },
        },
        runtime: RuntimeSpec { estimate: HumanDuration::from_secs(3600), limit: None, deadline: None },
        data: vec![],
        placement: PlacementRules::default(),
        payload: Payload {
            image: Some("registry/train:1".into()),
            command: vec![],
            env: BTreeMap::new(),
            secret_env: Default::default(),
        },
    }
}

fn federation(clusters: Vec<ClusterSnapshot>) -> FederationSnapshot {
    FederationSnapshot::new(clusters, NetworkTable::default_seeded())
}

fn rejections(decision: &Decision, cluster: &str) -> Vec<Rejection> {
    decision.candidates.iter().find(|c| c.cluster == cluster).map(|c| c.reasons().to_vec()).unwrap_or_default()
}

fn chosen(decision: &Decision) -> Option<&str> {
    decision.chosen.as_ref().map(|c| c.cluster.as_str())
}

#[test]
fn gpu_type_and_memory_are_filtered() {
    let fed = federation(vec![cluster("l4s", "us-east", Tier::Owned, vec![shape("l4", 4, &[4])])]);
    let mut spec = job(1, 1);
    spec.gang.resources.gpu_types = vec!["h100".into()];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert!(matches!(&rejections(&d, "l4s")[..], [Rejection::GpuTypeUnavailable { .. }]));
    assert_eq!(
        rejections(&d, "l4s")[0].to_string(),
        "the cluster only has GPU types l4, none of which the job's gpuTypes accepts"
    );

    spec.gang.resources.gpu_types.clear();
    spec.gang.resources.gpu_memory_gib = 80;
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(rejections(&d, "l4s"), vec![Rejection::GpuMemoryTooSmall { wanted_gib: 80, largest_gib: 24 }]);
    assert!(d.chosen.is_none());
}

#[test]
fn gang_capacity_is_counted_per_node_not_summed() {
    // 16 nodes × 4 GPUs = 64 GPUs, yet no node can hold one 8-GPU replica.
    let fed = federation(vec![cluster("small-nodes", "us-east", Tier::Owned, vec![shape("h100", 4, &[4; 16])])]);
    let d = place(&job(1, 8), &fed, &PlacementConfig::default());
    let reasons = rejections(&d, "small-nodes");
    assert_eq!(
        reasons,
        vec![Rejection::GangNeverFits { replicas: 1, gpus_per_replica: 8, max_replicas: 0, largest_node_gpus: 4 }]
    );
    assert!(reasons[0].to_string().contains("at most 0 (largest node: 4 GPUs)"), "{}", reasons[0]);
}

#[test]
fn two_by_eight_gang_goes_only_where_two_nodes_each_have_eight_free() {
    let spread = cluster("spread", "us-east", Tier::Owned, vec![shape("h100", 8, &[4, 4, 4, 4, 8])]);
    let whole = cluster("whole", "us-east", Tier::Owned, vec![shape("h100", 8, &[8, 0, 8])]);
    let fed = federation(vec![spread, whole]);
    let d = place(&job(2, 8), &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("whole"));
    assert!(d.chosen.as_ref().is_some_and(|c| c.starts_now));
    let spread_score = d.candidates[0].score().cloned();
    assert!(spread_score.is_some_and(|s| !s.fits_now), "spread can run it later, not now");
}

#[test]
fn a_gang_uses_one_gpu_type_possibly_across_shapes() {
    // One free 8-GPU node of each type: two 8-GPU replicas would need to mix H100 and A100.
    let mixed = cluster("mixed", "us-east", Tier::Owned, vec![shape("h100", 8, &[8]), shape("a100-80g", 8, &[8])]);
    let d = place(&job(2, 8), &federation(vec![mixed]), &PlacementConfig::default());
    assert!(matches!(&rejections(&d, "mixed")[..], [Rejection::GangNeverFits { max_replicas: 1, .. }]));

    // Two shapes of the same type together hold the gang.
    let mut pcie = shape("h100", 8, &[8]);
    pcie.name = "h100-pcie".into();
    let same = cluster("same", "us-east", Tier::Owned, vec![shape("h100", 8, &[8]), pcie]);
    let d = place(&job(2, 8), &federation(vec![same]), &PlacementConfig::default());
    assert!(d.chosen.as_ref().is_some_and(|c| c.starts_now && c.gpu_type == "h100"));
}

#[test]
fn residency_include_exclude_and_payload_are_enforced() {
    let mut slurm = info("slurm-eu", "eu-west", Tier::Owned);
    slurm.backend = BackendKind::Slurm;
    slurm.supports_containers = false;
    let eu =
        ClusterSnapshot::new(slurm, Inventory { shapes: vec![shape("h100", 8, &[8])] }, QueuePressure::default(), true);
    let us = cluster("us", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let fed = federation(vec![eu, us]);
    let mut spec = job(1, 1);
    spec.placement.regions = vec!["us-east".into()];
    spec.placement.clusters = ClusterRules { include: vec!["us".into()], exclude: vec!["us".into()] };
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(
        rejections(&d, "slurm-eu"),
        vec![
            Rejection::RegionNotAllowed { region: "eu-west".into(), allowed: ["us-east"].into() },
            Rejection::ClusterNotIncluded,
            Rejection::PayloadUnsupported { needs: PayloadKind::ContainerImage, backend: BackendKind::Slurm },
        ]
    );
    assert_eq!(rejections(&d, "us"), vec![Rejection::ClusterExcluded]);
    assert!(d.summary().starts_with("No cluster can take job 'train'"), "{}", d.summary());

    // A command without an image needs bare-command support.
    let mut bare = job(1, 1);
    bare.payload =
        Payload { image: None, command: vec!["python".into()], env: BTreeMap::new(), secret_env: Default::default() };
    let mut k8s = info("k8s", "us-east", Tier::Owned);
    k8s.supports_bare_commands = false;
    let fed = federation(vec![ClusterSnapshot::new(
        k8s,
        Inventory { shapes: vec![shape("h100", 8, &[8])] },
        QueuePressure::default(),
        true,
    )]);
    let d = place(&bare, &fed, &PlacementConfig::default());
    assert!(matches!(
        &rejections(&d, "k8s")[..],
        [Rejection::PayloadUnsupported { needs: PayloadKind::BareCommand, .. }]
    ));
}

#[test]
fn disconnected_clusters_are_never_chosen() {
    let mut gone = cluster("gone", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    gone.connected = false;
    let d = place(&job(1, 1), &federation(vec![gone]), &PlacementConfig::default());
    assert_eq!(rejections(&d, "gone"), vec![Rejection::Disconnected]);
    assert!(d.chosen.is_none());
}

#[test]
fn data_locality_picks_the_data_region() {
    let east = cluster("east", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let west = cluster("west", "us-west", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let fed = federation(vec![east, west]);
    let mut spec = job(1, 8);
    spec.data = vec![DataRef { uri: "s3://corpus".into(), size_gib: 2048.0, region: "us-west".into() }];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("west"));
    let east_score = d.candidates[0].score().cloned().unwrap();
    // 2 TiB at 4.35 Gbit/s and US$0.02/GB.
    assert!((east_score.transfer_secs - 2048.0 * 1.073_741_824 * 8.0 / 4.35).abs() < 1e-6);
    assert!((east_score.egress_usd - 2048.0 * 1.073_741_824 * 0.02).abs() < 1e-9);
}

#[test]
fn burst_only_after_owned_wait_exceeds_after() {
    let cloud = cluster("cloud", "us-east", Tier::Cloud, vec![shape("h100", 8, &[8, 8])]);
    let mut spec = job(1, 8);
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(1800), max_usd_per_hour: None };

    // Owned cluster full for 10 minutes: wait it out.
    let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 600);
    let d = place(&spec, &federation(vec![owned, cloud.clone()]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"));
    assert!(d.chosen.as_ref().is_some_and(|c| !c.starts_now));
    let reasons = rejections(&d, "cloud");
    assert_eq!(reasons, vec![Rejection::BurstNotYet { owned_wait_secs: 600.0, waited_secs: 0.0, after_secs: 1800 }]);
    assert!(
        reasons[0].to_string().contains(
            "more than 30m in all; it has waited 0s and the best owned cluster is expected to start it in 10m"
        ),
        "{}",
        reasons[0]
    );

    // The same 10 minutes ahead, after 25 minutes already waited in the federation queue: burst.
    let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 600);
    let d = place_waited(&spec, &federation(vec![owned.clone(), cloud.clone()]), &PlacementConfig::default(), 1500.0);
    assert_eq!(chosen(&d), Some("cloud"));
    let d = place_waited(&spec, &federation(vec![owned, cloud.clone()]), &PlacementConfig::default(), 1000.0);
    assert_eq!(chosen(&d), Some("owned"));

    // Full for 3 hours: burst.
    let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 3 * 3600);
    let d = place(&spec, &federation(vec![owned, cloud.clone()]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("cloud"));
    assert!(d.summary().contains("cloud"), "{}", d.summary());

    // No owned cluster at all: burst right away.
    let d = place(&spec, &federation(vec![cloud.clone()]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("cloud"));

    spec.placement.burst = BurstPolicy::Never;
    let d = place(&spec, &federation(vec![cloud]), &PlacementConfig::default());
    assert_eq!(rejections(&d, "cloud"), vec![Rejection::BurstNever]);
}

#[test]
fn burst_respects_the_hourly_budget() {
    let cloud = cluster("cloud", "us-east", Tier::Cloud, vec![shape("h100", 8, &[8])]);
    let mut spec = job(1, 8);
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(0), max_usd_per_hour: Some(20.0) };
    let d = place(&spec, &federation(vec![cloud.clone()]), &PlacementConfig::default());
    let reasons = rejections(&d, "cloud");
    assert_eq!(reasons, vec![Rejection::OverBudget { usd_per_hour: 32.0, max_usd_per_hour: 20.0 }]);
    assert_eq!(reasons[0].to_string(), "the gang would cost $32.00/h here, over the job's burst budget of $20.00/h");

    // Accepting a cheaper GPU type brings it within budget.
    let mixed = cluster("mixed", "us-east", Tier::Cloud, vec![shape("h100", 8, &[8]), shape("a100-80g", 8, &[8])]);
    let d = place(&spec, &federation(vec![mixed]), &PlacementConfig::default());
    assert_eq!(d.chosen.as_ref().map(|c| c.gpu_type.as_str()), Some("a100-80g"));
}

#[test]
fn ties_break_by_cluster_name_whatever_the_order() {
    let a = cluster("alpha", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let b = cluster("bravo", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let config = PlacementConfig::default();
    assert_eq!(chosen(&place(&job(1, 1), &federation(vec![a.clone(), b.clone()]), &config)), Some("alpha"));
    assert_eq!(chosen(&place(&job(1, 1), &federation(vec![b, a]), &config)), Some("alpha"));
}

#[test]
fn best_fit_prefers_the_partly_used_node() {
    let fresh = cluster("fresh", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let partial = cluster("partial", "us-east", Tier::Owned, vec![shape("h100", 8, &[8, 1])]);
    let d = place(&job(1, 1), &federation(vec![fresh, partial]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("partial"));
    assert_eq!(d.candidates[1].score().map(|s| s.fragmentation), Some(0.0));
    assert_eq!(d.candidates[0].score().map(|s| s.fragmentation), Some(7.0 / 8.0));
}

#[test]
fn reserve_subtracts_from_the_nodes_placement_assumed() {
    let mut c = cluster("c", "us-east", Tier::Owned, vec![shape("h100", 8, &[8, 4, 8])]);
    assert!(c.reserve(&job(1, 4)));
    // Best fit: the node with 4 free.
    let free: Vec<u32> = c.inventory().shapes[0].free.iter().map(|n| n.gpus).collect();
    assert_eq!(free, vec![8, 0, 8]);
    assert_eq!(c.inventory().shapes[0].free[1].cpu, 48);
    assert!(c.reserve(&job(2, 8)));
    assert!(!c.reserve(&job(1, 1)), "nothing is left");
    let mut fed = federation(vec![c]);
    let d = place(&job(1, 1), &fed, &PlacementConfig::default());
    assert!(d.chosen.as_ref().is_some_and(|c| !c.starts_now));
    assert!(fed.cluster_mut("c").is_some_and(|c| !c.reserve(&job(1, 8))));
}

#[test]
fn never_fits_explains_every_cluster_or_returns_none() {
    let small = cluster("small", "us-east", Tier::Owned, vec![shape("l4", 4, &[0, 0])]);
    let big = cluster("big", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])]);
    assert_eq!(never_fits(&job(2, 8), &federation(vec![small.clone(), big])), None, "busy is not never");
    let reasons = never_fits(&job(2, 8), &federation(vec![small])).unwrap();
    assert_eq!(reasons.len(), 1);
    assert_eq!(reasons[0].0, "small");
    assert_eq!(never_fits(&job(2, 8), &federation(vec![])), None);
}

#[test]
fn decisions_serialize_as_camel_case_explain_json() {
    let fed = federation(vec![
        cluster("ok", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]),
        cluster("tiny", "us-east", Tier::Owned, vec![shape("l4", 1, &[1])]),
    ]);
    let d = place(&job(1, 8), &fed, &PlacementConfig::default());
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["chosen"]["startsNow"], true);
    assert_eq!(json["candidates"][0]["verdict"]["kind"], "scored");
    assert_eq!(json["candidates"][0]["verdict"]["expectedWaitSecs"], 0.0);
    assert_eq!(json["candidates"][1]["verdict"]["reasons"][0]["reason"], "gangNeverFits");
    assert_eq!(json["candidates"][1]["verdict"]["reasons"][0]["gpusPerReplica"], 8);
    let back: Decision = serde_json::from_value(json).unwrap();
    assert_eq!(back, d);
    assert!(
        d.summary().starts_with("Chose ok (owned, us-east) for job 'train' (1×8 h100): starts now"),
        "{}",
        d.summary()
    );
}

/// Owned cluster `q` with two full 8-GPU H100 nodes and the given pressure.
fn full_h100_pair(pressure: QueuePressure) -> ClusterSnapshot {
    ClusterSnapshot::new(
        info("q", "us-east", Tier::Owned),
        Inventory { shapes: vec![shape("h100", 8, &[0, 0])] },
        pressure,
        true,
    )
}

#[test]
fn wait_estimate_follows_pending_gpus_and_releases() {
    let pressure = QueuePressure {
        queues: vec![QueueLoad { queue: "q".into(), weight: 1.0, pending_jobs: 2, pending_gpus: 8, running_gpus: 16 }],
        releases: vec![GpuRelease { after_secs: 900, gpus: 8 }, GpuRelease { after_secs: 300, gpus: 8 }],
        estimated_wait_secs: 0,
    };
    let fed = federation(vec![full_h100_pair(pressure)]);
    // 8 pending + 8 wanted: 16 GPUs free after both releases (sorted: 300 s, then 900 s).
    let d = place(&job(1, 8), &fed, &PlacementConfig::default());
    assert_eq!(d.chosen.as_ref().map(|c| c.expected_start_secs), Some(900.0));
    // Never enough within the profile and no agent estimate: the configured unknown wait.
    let d = place(&job(4, 8), &fed, &PlacementConfig::default());
    assert!(matches!(d.candidates[0].verdict, Verdict::Rejected { .. }), "4×8 never fits on 2 nodes");
    let d = place(&job(3, 4), &fed, &PlacementConfig { unknown_wait_secs: 7200.0, ..Default::default() });
    assert_eq!(d.chosen.as_ref().map(|c| c.expected_start_secs), Some(7200.0));
}

#[test]
fn jobs_deciding_to_wait_earlier_in_a_round_lengthen_the_expected_wait() {
    let pressure = QueuePressure {
        queues: vec![],
        releases: vec![GpuRelease { after_secs: 300, gpus: 8 }, GpuRelease { after_secs: 900, gpus: 8 }],
        estimated_wait_secs: 0,
    };
    let mut fed = federation(vec![full_h100_pair(pressure)]);
    let wait = |fed: &FederationSnapshot| place(&job(1, 8), fed, &PlacementConfig::default()).chosen.unwrap();
    assert_eq!(wait(&fed).expected_start_secs, 300.0);
    // An 8-GPU job ahead in this round takes the first release: this one waits for the second.
    fed.clusters[0].expect_waiting(8);
    assert_eq!(wait(&fed).expected_start_secs, 900.0);
    fed.clusters[0].clear_waiting();
    assert_eq!(wait(&fed).expected_start_secs, 300.0);
}

#[test]
fn held_clusters_take_only_jobs_that_end_before_the_holder_starts() {
    let a = cluster("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let b = cluster("b", "us-east", Tier::Owned, vec![shape("h100", 8, &[4])]);
    let mut fed = federation(vec![a, b]);
    let mut holds: Holds<&str> = Holds::new(2);
    assert!(holds.is_empty());
    // The old gang holds `a` from t=1000 s to its expected start at t=1600 s.
    assert!(holds.hold(0, "old-gang", 1600.0));
    assert!(!holds.hold(0, "other", 1700.0), "one hold per cluster");
    assert!(!holds.hold(1, "old-gang", 1700.0), "one cluster per holder");

    // A 1-hour job may not use `a` (it would still run at 1600 s): it goes to `b`.
    let masked = holds.mask(&mut fed, &"long", 1000.0, 3600.0);
    let mut d = place(&job(1, 4), &fed, &PlacementConfig::default());
    holds.restore(&mut fed, &masked, Some(&mut d));
    assert_eq!(chosen(&d), Some("b"));
    assert_eq!(rejections(&d, "a"), vec![Rejection::HeldForOlderGang { in_secs: 600.0 }]);
    assert!(rejections(&d, "a")[0].to_string().contains("held for an older gang expected to start in 10m"));
    assert!(fed.clusters.iter().all(|c| c.connected), "restore puts every cluster back");

    // A 5-minute job ends before 1600 s: it may backfill `a` (the best fit for a whole node).
    let masked = holds.mask(&mut fed, &"short", 1000.0, 300.0);
    assert!(masked.is_empty());
    assert_eq!(chosen(&place(&job(1, 8), &fed, &PlacementConfig::default())), Some("a"));

    // The holder itself is never kept out, and releasing its hold frees the cluster for all.
    assert!(holds.mask(&mut fed, &"old-gang", 1000.0, 99_999.0).is_empty());
    holds.release(&"old-gang");
    assert!(holds.is_empty());
    assert!(holds.mask(&mut fed, &"long", 1000.0, 3600.0).is_empty());
}

// --- labels and selectors --------------------------------------------------------------------

fn labelled(mut info: ClusterInfo, labels: &[(&str, &str)]) -> ClusterInfo {
    info.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    info
}

fn with_labels(mut shape: NodeShape, name: &str, labels: &[(&str, &str)]) -> NodeShape {
    shape.name = name.to_owned();
    shape.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    shape
}

fn snapshot(info: ClusterInfo, shapes: Vec<NodeShape>) -> ClusterSnapshot {
    ClusterSnapshot::new(info, Inventory { shapes }, QueuePressure::default(), true)
}

#[test]
fn a_cluster_whose_labels_do_not_match_the_cluster_selector_is_filtered_with_the_reason() {
    let ib =
        snapshot(labelled(info("ib", "us-east", Tier::Owned), &[("gpu-fabric", "ib")]), vec![shape("h100", 8, &[8])]);
    let eth = snapshot(
        labelled(info("eth", "us-east", Tier::Owned), &[("gpu-fabric", "roce")]),
        vec![shape("h100", 8, &[8])],
    );
    let mut spec = job(1, 8);
    spec.placement.cluster_selector = "gpu-fabric=ib".parse().unwrap();
    let d = place(&spec, &federation(vec![eth, ib]), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("ib"));
    let reasons = rejections(&d, "eth");
    assert_eq!(reasons.len(), 1);
    assert_eq!(
        reasons[0].to_string(),
        "clusterSelector gpu-fabric=ib does not match the cluster's labels (gpu-fabric=roce, \
         meridian.io/backend=builtin, meridian.io/cluster=eth, meridian.io/region=us-east, meridian.io/tier=owned)"
    );
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["candidates"][0]["verdict"]["reasons"][0]["reason"], "clusterSelectorUnmatched");
    assert_eq!(json["candidates"][0]["verdict"]["reasons"][0]["selector"], "gpu-fabric=ib");
    assert_eq!(serde_json::from_value::<Decision>(json).unwrap(), d);
}

#[test]
fn implicit_cluster_labels_can_be_selected_without_configuring_anything() {
    let fed = federation(vec![
        cluster("east", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]),
        cluster("west", "us-west", Tier::Owned, vec![shape("h100", 8, &[8])]),
        cluster("burst", "us-west", Tier::Cloud, vec![shape("h100", 8, &[8])]),
    ]);
    let mut spec = job(1, 8);
    spec.placement.cluster_selector = "meridian.io/region=us-west,meridian.io/tier!=cloud".parse().unwrap();
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("west"));
    assert!(matches!(&rejections(&d, "east")[..], [Rejection::ClusterSelectorUnmatched { .. }]));
    assert!(matches!(&rejections(&d, "burst")[..], [Rejection::ClusterSelectorUnmatched { .. }]));

    spec.placement.cluster_selector = "meridian.io/cluster=east,meridian.io/backend=builtin".parse().unwrap();
    assert_eq!(chosen(&place(&spec, &fed, &PlacementConfig::default())), Some("east"));
}

#[test]
fn node_shapes_the_node_selector_rules_out_are_not_counted() {
    // Plenty of free roce nodes, one ib node: a 2-node ib gang can never fit, a 1-node one can.
    let shapes = vec![
        with_labels(shape("h100", 8, &[8, 8, 8]), "roce", &[("gpu-fabric", "roce")]),
        with_labels(shape("h100", 8, &[8]), "ib", &[("gpu-fabric", "ib")]),
    ];
    let fed = federation(vec![cluster("mixed", "us-east", Tier::Owned, shapes)]);
    let mut spec = job(2, 8);
    spec.placement.node_selector = "gpu-fabric=ib".parse().unwrap();
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert!(matches!(&rejections(&d, "mixed")[..], [Rejection::GangNeverFits { max_replicas: 1, .. }]), "{d:?}");

    spec.gang.replicas = 1;
    let mut fed = fed;
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert!(d.chosen.as_ref().is_some_and(|c| c.starts_now));
    let c = fed.cluster_mut("mixed").unwrap();
    assert!(c.reserve(&spec));
    let free: Vec<Vec<u32>> = c.inventory().shapes.iter().map(|s| s.free.iter().map(|n| n.gpus).collect()).collect();
    assert_eq!(free, vec![vec![8, 8, 8], vec![0]], "only the ib node is taken");
    assert!(!c.fits_now(&spec), "the free roce nodes do not count for the ib job");
}

#[test]
fn a_busy_matching_shape_waits_but_no_matching_shape_is_rejected() {
    let busy_ib = vec![
        with_labels(shape("h100", 8, &[8, 8]), "roce", &[("gpu-fabric", "roce")]),
        with_labels(shape("h100", 8, &[0]), "ib", &[("gpu-fabric", "ib")]),
    ];
    let no_ib = vec![with_labels(shape("h100", 8, &[8, 8]), "roce", &[("gpu-fabric", "roce")])];
    let fed = federation(vec![
        busy("busy-ib", "us-east", Tier::Owned, busy_ib, 600),
        cluster("no-ib", "us-east", Tier::Owned, no_ib),
    ]);
    let mut spec = job(1, 8);
    spec.placement.node_selector = "gpu-fabric=ib".parse().unwrap();
    let d = place(&spec, &fed, &PlacementConfig::default());
    let choice = d.chosen.as_ref().unwrap();
    assert_eq!((choice.cluster.as_str(), choice.starts_now), ("busy-ib", false), "{}", d.summary());
    let reasons = rejections(&d, "no-ib");
    assert_eq!(reasons.len(), 1);
    assert_eq!(
        reasons[0].to_string(),
        "no node with an acceptable GPU type matches nodeSelector gpu-fabric=ib (node labels here: roce: gpu-fabric=roce)"
    );
    // At submit: the busy cluster could run it some day, so it is not refused...
    assert_eq!(never_fits(&spec, &fed), None);
    // ...but with only the cluster that has no ib node, it is, naming the selector.
    let only = federation(vec![fed.cluster("no-ib").unwrap().clone()]);
    let all = never_fits(&spec, &only).unwrap();
    assert!(matches!(&all[..], [(name, Rejection::NodeSelectorUnmatched { .. })] if name == "no-ib"), "{all:?}");
}

#[test]
fn a_gpu_slice_matches_only_jobs_that_name_it() {
    let mut slice = shape("a100-80g.1g.10gb", 56, &[56]);
    slice.gpu_memory_gib = 10;
    let fed = federation(vec![
        cluster("mig", "us-east", Tier::Owned, vec![slice]),
        cluster("whole", "us-east", Tier::Owned, vec![shape("a100-80g", 8, &[8])]),
    ]);
    let mut spec = job(1, 1);
    spec.gang.resources.gpu_types = vec!["a100-80g.1g.10gb".into()];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("mig"));
    assert!(matches!(&rejections(&d, "whole")[..], [Rejection::GpuTypeUnavailable { .. }]));

    spec.gang.resources.gpu_types = vec!["a100-80g".into()];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("whole"));
    assert!(matches!(&rejections(&d, "mig")[..], [Rejection::GpuTypeUnavailable { .. }]));

    // No type named: whole GPUs only.
    spec.gang.resources.gpu_types.clear();
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("whole"));
    assert!(matches!(&rejections(&d, "mig")[..], [Rejection::GpuTypeUnavailable { .. }]));
}

// --- properties --------------------------------------------------------------------------------

const TYPES: [&str; 3] = ["h100", "a100-80g", "l4"];

/// Node labels a random shape may carry, and node selectors a random job may have.
const FABRICS: [Option<&str>; 3] = [None, Some("ib"), Some("roce")];
const NODE_SELECTORS: [&str; 5] = ["", "", "fabric=ib", "fabric!=ib", "fabric"];

fn arb_shape() -> impl Strategy<Value = NodeShape> {
    (0..TYPES.len(), prop::sample::select(vec![1u32, 2, 4, 8]), 0usize..6, 0..FABRICS.len()).prop_flat_map(
        |(t, per_node, nodes, fabric)| {
            // Free CPUs vary independently of free GPUs, so some nodes have GPUs but not the CPUs.
            prop::collection::vec((0..=per_node, 0..=16 * per_node), nodes).prop_map(move |free| {
                let mut s = shape(TYPES[t], per_node, &[]);
                s.free = free.into_iter().map(|(g, cpu)| NodeFree { gpus: g, cpu, memory_gib: 128 * g }).collect();
                s.labels = FABRICS[fabric].map(|f| ("fabric".to_owned(), f.to_owned())).into_iter().collect();
                s
            })
        },
    )
}

fn arb_cluster(index: usize) -> impl Strategy<Value = ClusterSnapshot> {
    (prop::collection::vec(arb_shape(), 0..3), any::<bool>(), 0u64..7200, 0u32..16).prop_map(
        move |(shapes, cloud, release_after, pending)| {
            let tier = if cloud { Tier::Cloud } else { Tier::Owned };
            let pressure = QueuePressure {
                queues: vec![QueueLoad {
                    queue: "q".into(),
                    weight: 1.0,
                    pending_jobs: 1,
                    pending_gpus: pending,
                    running_gpus: 0,
                }],
                releases: vec![GpuRelease { after_secs: release_after, gpus: 8 }],
                estimated_wait_secs: release_after,
            };
            ClusterSnapshot::new(info(&format!("c{index:02}"), "us-east", tier), Inventory { shapes }, pressure, true)
        },
    )
}

fn arb_federation() -> impl Strategy<Value = FederationSnapshot> {
    (1usize..6).prop_flat_map(|n| (0..n).map(arb_cluster).collect::<Vec<_>>().prop_map(federation))
}

fn arb_job() -> impl Strategy<Value = JobSpec> {
    (1u32..5, 1u32..9, prop::collection::vec(0..TYPES.len(), 0..2), any::<bool>(), 0..NODE_SELECTORS.len()).prop_map(
        |(replicas, gpus, types, burst_never, selector)| {
            let mut spec = job(replicas, gpus);
            spec.gang.resources.gpu_types = types.into_iter().map(|t| TYPES[t].to_owned()).collect();
            if burst_never {
                spec.placement.burst = BurstPolicy::Never;
            }
            spec.placement.node_selector = NODE_SELECTORS[selector].parse().unwrap();
            spec
        },
    )
}

fn acceptable<'a>(spec: &'a JobSpec, cluster: &'a ClusterSnapshot) -> impl Iterator<Item = &'a NodeShape> + 'a {
    let r = &spec.gang.resources;
    cluster.inventory().shapes.iter().filter(move |s| {
        (r.gpu_types.is_empty() || r.gpu_types.contains(&s.gpu_type))
            && s.gpu_memory_gib >= r.gpu_memory_gib
            && spec.placement.node_selector.matches(&s.labels)
    })
}

/// Independent per-node count: replicas of `spec` that fit on `nodes` (each replica on one node).
fn replicas_on(spec: &JobSpec, nodes: impl Iterator<Item = NodeFree>) -> u64 {
    let r = &spec.gang.resources;
    nodes.map(|n| u64::from(n.replicas_fitting(r.gpus, r.cpu, r.memory_gib))).sum()
}

/// Reference best fit, the slow obvious way: sort nodes by free GPUs (then shape, node) and fill.
fn reference_reserve(cluster: &ClusterSnapshot, spec: &JobSpec, gpu_type: &str) -> Inventory {
    let r = &spec.gang.resources;
    let mut inventory = cluster.inventory().clone();
    let mut nodes: Vec<(u32, usize, usize)> = Vec::new();
    for (si, s) in inventory.shapes.iter().enumerate() {
        if s.gpu_type == gpu_type
            && s.gpu_memory_gib >= r.gpu_memory_gib
            && spec.placement.node_selector.matches(&s.labels)
        {
            nodes.extend(s.free.iter().enumerate().map(|(ni, n)| (n.gpus, si, ni)));
        }
    }
    nodes.sort();
    let mut remaining = spec.gang.replicas;
    for (_, si, ni) in nodes {
        let node = &mut inventory.shapes[si].free[ni];
        let used = node.replicas_fitting(r.gpus, r.cpu, r.memory_gib).min(remaining);
        node.gpus -= used * r.gpus;
        node.cpu -= used * r.cpu;
        node.memory_gib -= used * r.memory_gib;
        remaining -= used;
    }
    inventory
}

proptest! {
    #[test]
    fn never_picks_a_cluster_whose_shapes_cannot_hold_the_gang(fed in arb_federation(), spec in arb_job()) {
        let d = place(&spec, &fed, &PlacementConfig::default());
        if let Some(choice) = &d.chosen {
            let c = fed.cluster(&choice.cluster).unwrap();
            let empty = acceptable(&spec, c).flat_map(|s| {
                let node = NodeFree { gpus: s.gpus_per_node, cpu: s.cpu_per_node, memory_gib: s.memory_gib_per_node };
                std::iter::repeat_n(node, s.free.len())
            });
            prop_assert!(replicas_on(&spec, empty) >= u64::from(spec.gang.replicas));
            prop_assert!(spec.placement.burst != BurstPolicy::Never || c.info().tier == Tier::Owned);
        }
    }

    #[test]
    fn a_starts_now_choice_really_has_free_nodes_and_reserve_takes_exactly_the_gang(
        fed in arb_federation(), spec in arb_job()
    ) {
        let d = place(&spec, &fed, &PlacementConfig::default());
        let Some(choice) = d.chosen.clone() else { return Ok(()) };
        let c = fed.cluster(&choice.cluster).unwrap();
        let same_type = |s: &&NodeShape| s.gpu_type == choice.gpu_type;
        let now = replicas_on(&spec, acceptable(&spec, c).filter(same_type).flat_map(|s| s.free.iter().copied()));
        prop_assert_eq!(choice.starts_now, now >= u64::from(spec.gang.replicas));

        let mut reserved = c.clone();
        prop_assert_eq!(reserved.reserve(&spec), choice.starts_now);
        if choice.starts_now {
            prop_assert_eq!(reserved.inventory(), &reference_reserve(c, &spec, &choice.gpu_type));
            let before = c.inventory().gpus_free();
            prop_assert_eq!(before - reserved.inventory().gpus_free(), spec.total_gpus());
            for (s0, s1) in c.inventory().shapes.iter().zip(&reserved.inventory().shapes) {
                for (n0, n1) in s0.free.iter().zip(&s1.free) {
                    prop_assert!(n1.gpus <= n0.gpus && n1.cpu <= n0.cpu && n1.memory_gib <= n0.memory_gib);
                }
            }
        }
    }

    #[test]
    fn the_choice_does_not_depend_on_cluster_order(fed in arb_federation(), spec in arb_job()) {
        let config = PlacementConfig::default();
        let mut reversed = fed.clone();
        reversed.clusters.reverse();
        let a = place(&spec, &fed, &config).chosen;
        let b = place(&spec, &reversed, &config).chosen;
        prop_assert_eq!(a, b);
    }
}

#[test]
fn past_the_burst_threshold_hours_of_waiting_outweigh_the_cloud_price() {
    let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0, 0, 0])], 6 * 3600);
    let owned = priced(owned, "h100", 2.1);
    let cloud = cluster("cloud", "us-west", Tier::Cloud, vec![shape("h100", 8, &[8, 8, 8, 8])]);
    let cloud = priced(cloud, "h100", 6.98);
    let mut spec = job(4, 8);
    spec.runtime.estimate = HumanDuration::from_secs(5 * 3600);
    spec.data = vec![DataRef { uri: "s3://corpus/x".into(), size_gib: 300.0, region: "us-east".into() }];
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(1800), max_usd_per_hour: Some(300.0) };
    let fed = federation(vec![owned, cloud]);

    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("cloud"), "{}", d.summary());
    // 60 s per $ × 0.1 past the threshold, divided by 12: the owned wait (6 h) is 12 × `after`.
    let weight = d.chosen_candidate().and_then(|c| c.score()).map(|s| s.usd_weight_secs);
    assert_eq!(weight, Some(0.5));

    // Counting every dollar at twelve times full weight, the same cluster would wait six hours to
    // save $800.
    let full_price = PlacementConfig { usd_to_seconds: 720.0, burst_usd_weight: 1.0, ..PlacementConfig::default() };
    assert_eq!(chosen(&place(&spec, &fed, &full_price)), Some("owned"));
}

#[test]
fn the_longer_owned_clusters_would_keep_a_job_waiting_the_less_a_dollar_weighs() {
    let cloud = priced(cluster("cloud", "us-west", Tier::Cloud, vec![shape("h100", 8, &[8])]), "h100", 6.98);
    let mut spec = job(1, 8);
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(1800), max_usd_per_hour: None };
    let weight_at = |owned_wait_secs: u64| {
        let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0])], owned_wait_secs);
        let d = place(&spec, &federation(vec![owned, cloud.clone()]), &PlacementConfig::default());
        d.candidates.iter().find(|c| c.cluster == "cloud").and_then(|c| c.score()).map(|s| s.usd_weight_secs)
    };
    assert_eq!(weight_at(3600), Some(3.0), "twice `after`: half of 6 s per $");
    assert_eq!(weight_at(4 * 3600), Some(0.75), "8 × `after`: an eighth");
    // Below the threshold the cloud is not a candidate at all.
    assert_eq!(weight_at(600), None);
}

// --- the free-GPU index against a scan of every node --------------------------------------------

/// Shapes with up to 150 nodes (several 64-node words) and, rarely, nodes past the level cap;
/// agents may report more free than a node has, which placement must clamp.
fn arb_indexed_shape() -> impl Strategy<Value = NodeShape> {
    let per_node = prop::sample::select(vec![1u32, 2, 4, 8, 8, 8, 300]);
    (0..TYPES.len(), per_node, 0usize..150).prop_flat_map(|(t, per_node, nodes)| {
        let node = (0..=per_node + 1, 0..=16 * per_node + 4, 0..=128 * per_node + 8);
        prop::collection::vec(node, nodes).prop_map(move |free| {
            let mut s = shape(TYPES[t], per_node, &[]);
            s.free = free.into_iter().map(|(gpus, cpu, memory_gib)| NodeFree { gpus, cpu, memory_gib }).collect();
            s
        })
    })
}

fn arb_demand() -> impl Strategy<Value = fit::Demand> {
    let gpus = prop_oneof![8 => 0u32..=9, 1 => 250u32..=301];
    (0u32..=6, gpus, 0u32..=80, 0u32..=600, prop::sample::select(vec![0u32, 24, 80])).prop_map(
        |(replicas, gpus, cpu, memory_gib, min_gpu_memory_gib)| fit::Demand {
            replicas,
            gpus,
            cpu,
            memory_gib,
            min_gpu_memory_gib,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn indexed_best_fit_equals_a_scan_of_every_node(
        shapes in prop::collection::vec(arb_indexed_shape(), 1..4),
        reservations in prop::collection::vec(arb_job(), 0..4),
        demand in arb_demand(),
    ) {
        let mut c = cluster("c", "us-east", Tier::Owned, shapes);
        // Reservations move nodes between levels and loosen the bounds; the index must keep up.
        for spec in &reservations {
            c.reserve(spec);
        }
        prop_assert!(c.index().agrees_with(&index::FreeIndex::new(&c.inventory().shapes)));

        let shapes = &c.inventory().shapes;
        for s in shapes {
            let empty = NodeFree { gpus: s.gpus_per_node, cpu: s.cpu_per_node, memory_gib: s.memory_gib_per_node };
            let expected = empty.replicas_fitting(demand.gpus, demand.cpu, demand.memory_gib);
            prop_assert_eq!(demand.per_empty_node(s), expected);
        }
        for (type_id, first) in shapes.iter().enumerate().filter(|(i, _)| c.index().type_id(*i) == *i) {
            let indexed = fit::survey(c.nodes(), type_id, &demand);
            let scanned = fit::scan::Fitter::default().survey(shapes, &first.gpu_type, &demand);
            prop_assert_eq!(indexed, scanned);
            if let fit::Survey::Fits(plan) = indexed {
                let by_index = plan.fragmentation(c.nodes(), type_id, &demand);
                let by_scan = fit::scan::fragmentation(&plan, shapes, &first.gpu_type, &demand);
                prop_assert_eq!(by_index.to_bits(), by_scan.to_bits());
                let (mut taken_by_index, mut taken_by_scan) = (Vec::new(), Vec::new());
                plan.for_each_node(c.nodes(), type_id, &demand, |s, n, r| taken_by_index.push((s, n, r)));
                fit::scan::for_each_node(&plan, shapes, &first.gpu_type, &demand, |s, n, r| {
                    taken_by_scan.push((s, n, r));
                });
                taken_by_index.sort_unstable();
                taken_by_scan.sort_unstable();
                prop_assert_eq!(taken_by_index, taken_by_scan);
            }
        }
    }
}

#[test]
fn gpu_speed_makes_the_faster_type_cheaper_per_unit_of_work() {
    // $0.70 per V100-hour is cheaper by the hour than $1.20 per A100-hour, but a V100 does 0.4 of
    // an A100's work: per unit of work it costs $1.75.
    let mixed = cluster("mixed", "us-east", Tier::Owned, vec![shape("v100", 8, &[8]), shape("a100", 8, &[8])]);
    let mixed = priced(priced(mixed, "v100", 0.7), "a100", 1.2);
    let mut spec = job(1, 1);
    spec.runtime.estimate = HumanDuration::from_secs(10 * 3600);
    let blind = place(&spec, &federation(vec![mixed.clone()]), &PlacementConfig::default());
    let blind = blind.chosen_candidate().and_then(|c| c.score()).cloned().unwrap();
    assert_eq!(blind.gpu_type, "v100");
    assert!((blind.compute_usd - 7.0).abs() < 1e-9, "{}", blind.compute_usd);

    let speeds = PlacementConfig {
        gpu_speed: [("v100".to_owned(), 0.4), ("a100".to_owned(), 1.0)].into_iter().collect(),
        ..PlacementConfig::default()
    };
    let mut fed = federation(vec![mixed]);
    fed.set_gpu_speed(&speeds.gpu_speed);
    let aware = place(&spec, &fed, &speeds);
    let aware = aware.chosen_candidate().and_then(|c| c.score()).cloned().unwrap();
    assert_eq!(aware.gpu_type, "a100");
    assert!((aware.compute_usd - 12.0).abs() < 1e-9, "{}", aware.compute_usd);
}

#[test]
fn a_gpu_speed_must_be_a_positive_number() {
    let config = PlacementConfig {
        gpu_speed: [("v100".to_owned(), 0.0), ("h100".to_owned(), f64::NAN), ("a100".to_owned(), 1.0)]
            .into_iter()
            .collect(),
        ..PlacementConfig::default()
    };
    let problems = config.problems("placement.");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("placement.gpuSpeed.v100: 0")), "{problems:?}");
    assert!(problems.iter().any(|p| p.starts_with("placement.gpuSpeed.h100: NaN")), "{problems:?}");
}

mod deadlines;
