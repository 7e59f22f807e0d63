//! The score: data locality, fragmentation, the wait estimate, GPU speed, ties, and the decision
//! as `meridian explain` shows it.

use super::*;

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

#[test]
fn wait_estimate_follows_pending_gpus_and_releases() {
    let pressure = QueuePressure {
        queues: vec![QueueLoad { queue: "q".into(), weight: 1.0, pending_jobs: 2, pending_gpus: 8, running_gpus: 16 }],
        releases: vec![GpuRelease { after_secs: 900, gpus: 8 }, GpuRelease { after_secs: 300, gpus: 8 }],
        estimated_wait_secs: 0,
        preemptible: Vec::new(),
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
        preemptible: Vec::new(),
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
