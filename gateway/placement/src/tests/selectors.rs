//! Cluster and node selectors: labels, implicit `meridian.io/*` labels, and shapes a node selector
//! rules out.

use super::*;

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
