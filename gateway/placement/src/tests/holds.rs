//! Reserving a gang where it starts, and holding a cluster for an old gang with backfill.

use super::*;

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
    assert!(rejections(&d, "a")[0].to_string().contains("held for a long-waiting gang expected to start in 10m"));
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

#[test]
fn holds_go_to_the_highest_priority_gang_that_waited_long_enough_then_the_oldest() {
    // Two full clusters that free their GPUs in 10 and 20 minutes: every 2 × 8 gang waits for `a`.
    let a = busy("a", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 600);
    let b = busy("b", "us-east", Tier::Owned, vec![shape("h100", 8, &[0, 0])], 1200);
    let fed = federation(vec![a, b]);
    let config = PlacementConfig { hold_after_secs: 1800.0, ..PlacementConfig::default() };
    let gang = |priority: u32| JobSpec { priority, ..job(2, 8) };
    let (old, urgent, new) = (gang(50), gang(90), gang(100));
    // Oldest first, as the caller lists them: `new` has not waited long enough to hold anything.
    let queue = [("old", &old, 7200.0), ("urgent", &urgent, 1900.0), ("new", &new, 60.0)];
    let holds = Holds::for_round(queue, &fed, &config, 0.0);
    assert_eq!(holds.holder_of(&"urgent"), Some(0), "the higher priority holds the best cluster");
    assert_eq!(holds.holder_of(&"old"), None, "its best cluster is held already");
    assert_eq!(holds.holder_of(&"new"), None);
    // Equal priorities: the oldest first.
    let peer = gang(50);
    let queue = [("old", &old, 7200.0), ("peer", &peer, 1900.0)];
    let holds = Holds::for_round(queue, &fed, &config, 0.0);
    assert_eq!(holds.holder_of(&"old"), Some(0));
    // Past the first HOLD_SCAN jobs by age, a higher priority is still looked at first.
    let names: Vec<String> = (0..=HOLD_SCAN).map(|i| format!("old-{i}")).collect();
    let mut queue: Vec<(&str, &JobSpec, f64)> = names.iter().map(|n| (n.as_str(), &old, 7200.0)).collect();
    queue.push(("urgent", &urgent, 1900.0));
    let holds = Holds::for_round(queue, &fed, &config, 0.0);
    assert_eq!(holds.holder_of(&"urgent"), Some(0));
    assert_eq!(holds.holder_of(&"old-0"), None);
}
