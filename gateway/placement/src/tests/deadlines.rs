//! `runtime.deadline`: bursting early when owned clusters would finish late, the miss penalty,
//! the burst budget, and what the summary says.

use super::*;

const HOUR: u64 = 3_600;

/// A one-node 8×H100 job of `estimate_h` hours due `deadline_secs` after submission, which may
/// burst after `after_h` hours within `budget` US$/h.
fn due(estimate_h: u64, deadline_secs: u64, after_h: u64, budget: Option<f64>) -> JobSpec {
    let mut spec = job(1, 8);
    spec.runtime.estimate = HumanDuration::from_secs(estimate_h * HOUR);
    spec.runtime.deadline = Some(HumanDuration::from_secs(deadline_secs));
    spec.placement.burst =
        BurstPolicy::After { after: HumanDuration::from_secs(after_h * HOUR), max_usd_per_hour: budget };
    spec
}

/// An owned H100 cluster that is full for `wait_secs`, and an empty cloud one ($4/GPU-h).
fn fleet(wait_secs: u64) -> FederationSnapshot {
    let owned = busy("owned", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], wait_secs);
    let cloud = cluster("cloud", "us-east", Tier::Cloud, vec![shape("h100", 8, &[8, 8])]);
    federation(vec![owned, cloud])
}

fn penalty(decision: &Decision, cluster: &str) -> Option<f64> {
    let candidate = decision.candidates.iter().find(|c| c.cluster == cluster)?;
    candidate.score().map(|s| s.deadline_penalty_secs)
}

#[test]
fn a_job_bursts_before_its_threshold_when_owned_clusters_would_miss_its_deadline() {
    // Owned starts it in 1 h and finishes in 3 h; due in 2h30m; burst.after is 4 h.
    let spec = due(2, 2 * HOUR + 1_800, 4, None);
    let d = place(&spec, &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("cloud"), "{}", d.summary());
    assert!(d.chosen.as_ref().is_some_and(|c| c.starts_now));
    assert!(
        d.summary().ends_with(
            "Deadline in 2h30m: owned clusters expected to finish in 3h, bursting early: cloud is expected to \
             finish in 2h."
        ),
        "{}",
        d.summary()
    );
    assert_eq!(penalty(&d, "owned"), Some(21_600.0));
    assert_eq!(penalty(&d, "cloud"), Some(0.0));
    // Past the threshold, dollars count at the burst weight, as for a job past `burst.after`.
    let weight = d.chosen_candidate().and_then(|c| c.score()).map(|s| s.usd_weight_secs);
    assert_eq!(weight, Some(6.0));

    // Without the deadline, the same job waits for the owned cluster.
    let mut relaxed = spec.clone();
    relaxed.runtime.deadline = None;
    let d = place(&relaxed, &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"), "{}", d.summary());
    assert!(!d.summary().contains("Deadline"), "{}", d.summary());
}

#[test]
fn a_job_whose_owned_cluster_meets_the_deadline_does_not_burst() {
    let spec = due(2, 4 * HOUR, 4, None);
    let d = place(&spec, &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"), "{}", d.summary());
    assert_eq!(
        rejections(&d, "cloud"),
        vec![Rejection::BurstNotYet { owned_wait_secs: 3_600.0, waited_secs: 0.0, after_secs: 4 * HOUR }]
    );
    assert_eq!(penalty(&d, "owned"), Some(0.0));
    assert!(
        d.summary().ends_with("Deadline in 4h: owned clusters expected to finish in 3h, in time."),
        "{}",
        d.summary()
    );
}

#[test]
fn time_already_waited_counts_against_the_deadline() {
    let spec = due(2, 4 * HOUR, 4, None);
    // Exactly on time after an hour in the queue: still owned.
    let d = place_waited(&spec, &fleet(HOUR), &PlacementConfig::default(), HOUR as f64);
    assert_eq!(chosen(&d), Some("owned"), "{}", d.summary());
    // Ninety minutes in the queue: owned would finish 30 minutes late.
    let d = place_waited(&spec, &fleet(HOUR), &PlacementConfig::default(), 5_400.0);
    assert_eq!(chosen(&d), Some("cloud"), "{}", d.summary());
    assert!(d.summary().contains("Deadline in 2h30m: owned clusters expected to finish in 3h"), "{}", d.summary());
}

#[test]
fn bursting_for_a_deadline_stays_within_the_burst_budget() {
    // 8 H100s on the cloud cost $32/h, over a $20/h budget: the job waits and says why.
    let spec = due(2, 2 * HOUR + 1_800, 4, Some(20.0));
    let d = place(&spec, &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"), "{}", d.summary());
    assert_eq!(rejections(&d, "cloud"), vec![Rejection::OverBudget { usd_per_hour: 32.0, max_usd_per_hour: 20.0 }]);
    assert!(d.summary().ends_with("cloud clusters were allowed early but owned still scored best."), "{}", d.summary());

    // Within a $40/h budget it bursts.
    let d = place(&due(2, 2 * HOUR + 1_800, 4, Some(40.0)), &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("cloud"), "{}", d.summary());

    // `burst: never` keeps it home, late, and the summary says so.
    let mut never = spec;
    never.placement.burst = BurstPolicy::Never;
    let d = place(&never, &fleet(HOUR), &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("owned"));
    assert!(d.summary().ends_with("the job may not burst (burst: never), so it will be late."), "{}", d.summary());
}

#[test]
fn a_deadline_that_can_no_longer_be_met_changes_nothing() {
    let spec = due(2, 2 * HOUR + 1_800, 4, None);
    // After an hour in the queue only 1h30m is left for a 2 h job: no cluster can make it.
    let d = place_waited(&spec, &fleet(HOUR), &PlacementConfig::default(), HOUR as f64);
    assert_eq!(chosen(&d), Some("owned"), "{}", d.summary());
    assert!(matches!(rejections(&d, "cloud")[..], [Rejection::BurstNotYet { .. }]));
    assert_eq!(penalty(&d, "owned"), Some(0.0));
    assert!(
        d.summary().ends_with(
            "Deadline in 1h30m: it can no longer be met (the estimate is 2h), so it does not change the choice."
        ),
        "{}",
        d.summary()
    );
}

#[test]
fn the_miss_penalty_ranks_an_owned_cluster_that_meets_the_deadline_first() {
    // Both owned and busy. `whole-nodes` frees an 8-GPU node in 11m40s; `big-nodes` frees a
    // 16-GPU node in 10 minutes, but the job would leave half of it idle (fragmentation 0.5 is
    // worth 150 s). Without a deadline the whole node wins; due in 2h10m50s, only `big-nodes`
    // finishes the 2 h job in time.
    let mut spec = due(2, 2 * HOUR + 650, 0, None);
    spec.placement.burst = BurstPolicy::Never;
    let whole = busy("whole-nodes", "us-east", Tier::Owned, vec![shape("h100", 8, &[0])], 700);
    let big = busy("big-nodes", "us-east", Tier::Owned, vec![shape("h100", 16, &[0])], 600);
    let fed = federation(vec![whole, big]);
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&d), Some("big-nodes"), "{}", d.summary());
    assert_eq!(penalty(&d, "whole-nodes"), Some(21_600.0));
    assert_eq!(penalty(&d, "big-nodes"), Some(0.0));

    let mut undue = spec.clone();
    undue.runtime.deadline = None;
    let without = place(&undue, &fed, &PlacementConfig::default());
    assert_eq!(chosen(&without), Some("whole-nodes"), "{}", without.summary());
    // With no penalty the deadline changes nothing here.
    let free = PlacementConfig { deadline_miss_penalty_secs: 0.0, ..PlacementConfig::default() };
    assert_eq!(chosen(&place(&spec, &fed, &free)), Some("whole-nodes"));
}

#[test]
fn the_penalty_appears_in_explain_json_only_when_counted_and_bad_weights_are_named() {
    let d = place(&due(2, 2 * HOUR + 1_800, 4, None), &fleet(HOUR), &PlacementConfig::default());
    let json = serde_json::to_string(&d).unwrap();
    assert_eq!(json.matches("\"deadlinePenaltySecs\":21600").count(), 1, "{json}");
    let back: Decision = serde_json::from_str(&json).unwrap();
    assert_eq!(back, d);

    let config = PlacementConfig { deadline_miss_penalty_secs: -1.0, ..PlacementConfig::default() };
    assert_eq!(
        config.problems("placement."),
        vec!["placement.deadlineMissPenaltySecs: -1 must be a finite number >= 0"]
    );
}
