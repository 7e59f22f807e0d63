//! The burst gate: cloud clusters only past `burst.after`, within the hourly budget, and dollars
//! weighing less the longer owned clusters would keep the job waiting.

use super::*;

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

#[test]
fn an_owned_cluster_that_starts_now_but_must_copy_the_data_for_an_hour_does_not_close_the_cloud() {
    // 2 TiB next to the cloud cluster (us-west); the owned cluster in us-east is empty.
    let owned = cluster("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[8])]);
    let cloud = cluster("cloud", "us-west", Tier::Cloud, vec![shape("h100", 8, &[8])]);
    let mut spec = job(1, 8);
    spec.data = vec![DataRef { uri: "s3://corpus/x".into(), size_gib: 2048.0, region: "us-west".into() }];
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(1800), max_usd_per_hour: None };
    let fed = federation(vec![owned, cloud]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    let owned_score = d.candidates.iter().find(|c| c.cluster == "owned").and_then(|c| c.score()).cloned();
    let owned_score = owned_score.expect("the owned cluster is scored");
    assert_eq!(owned_score.expected_wait_secs, 0.0, "the owned cluster has the GPUs now");
    assert!(owned_score.transfer_secs > 1800.0, "but copying 2 TiB takes {} s", owned_score.transfer_secs);
    // Compute could start there only after the copy, past `burst.after`: the cloud competes, and
    // its start now outweighs its price.
    assert_eq!(chosen(&d), Some("cloud"), "{}", d.summary());

    // With the data next to the owned cluster, the gate stays shut as before.
    spec.data[0].region = "us-east".into();
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"));
    let reasons = rejections(&d, "cloud");
    assert!(matches!(reasons.as_slice(), [Rejection::BurstNotYet { .. }]), "{reasons:?}");
    assert!(reasons[0].to_string().contains("(queue wait or data copy)"), "{}", reasons[0]);
}
