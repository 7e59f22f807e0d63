//! The filter: GPU type and memory, gang capacity per node, one GPU type per gang, residency,
//! include/exclude, payload kind, connection, and the submit-time "never fits".

use meridian_proto::inventory::BackendKind;
use meridian_proto::spec::{ClusterRules, Payload};

use super::*;

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
    bare.payload = Payload { image: None, command: vec!["python".into()], ..Payload::default() };
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
