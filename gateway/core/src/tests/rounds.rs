//! Placement rounds: one offer per free GPU, holds for long-waiting gangs, jobs that fit nowhere,
//! and the fair queue's dominant shares.

use super::*;

#[test]
fn one_round_never_offers_the_same_free_gpus_twice() {
    let mut h = Harness::new(CoreConfig::default());
    h.east(&[8]);
    let first = h.submit(JOB);
    let second = h.submit(&JOB.replace("name: j", "name: k"));
    h.step(Input::Round);
    h.step(Input::Round);
    let states = [h.state(&first), h.state(&second)];
    assert_eq!(states.iter().filter(|s| **s == JobState::Offered).count(), 1, "{states:?}");
}

#[test]
fn a_long_waiting_gang_holds_its_cluster_and_only_shorter_jobs_backfill() {
    let mut config = CoreConfig::default();
    config.placement.hold_after_secs = 0.0;
    let mut h = Harness::new(config);
    h.east(&[8, 0]);
    let gang = h.submit("name: gang\ntenant: t\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n");
    h.step(Input::Round);
    assert_eq!(h.state(&gang), JobState::Queued);
    let job = |name: &str, hours: u32| {
        format!(
            "name: {name}\ntenant: u\ngang: {{replicas: 1, resources: {{gpus: 8}}}}\nruntime: {{estimate: {hours}h}}\npayload: {{command: [x]}}\n"
        )
    };
    let long = h.submit(&job("long", 10));
    h.step(Input::Round);
    assert_eq!(h.state(&long), JobState::Queued);
    let explained = h.core.view().explain(&long).unwrap();
    assert!(explained.candidates.iter().flat_map(|c| &c.reasons).any(|r| r.contains("held for a long-waiting gang")));
    let short = h.submit(&job("short", 1));
    h.step(Input::Round);
    assert_eq!(h.state(&short), JobState::Offered, "backfill ends before the gang");
}

#[test]
fn jobs_that_fit_nowhere_are_explained_once_then_skipped_until_their_explanation_is_old() {
    let mut h = Harness::new(CoreConfig::default());
    let conn = h.east(&[8, 0]);
    let gang = "name: gang\ntenant: t\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n";
    let ids: Vec<String> = (0..3).map(|i| h.submit(&gang.replace("name: gang", &format!("name: g{i}")))).collect();
    h.step(Input::Round);
    let decided_at = |h: &mut Harness, id: &str| h.core.view().explain(id).and_then(|e| e.decided_at_ms);
    let first: Vec<_> = ids.iter().map(|id| decided_at(&mut h, id)).collect();
    assert!(first.iter().all(Option::is_some), "every waiting job is explained at once: {first:?}");
    h.advance(Duration::from_secs(10));
    h.step(Input::Round);
    let again: Vec<_> = ids.iter().map(|id| decided_at(&mut h, id)).collect();
    assert_eq!(again, first, "a gang that fits nowhere is not placed again within 30 s");
    h.advance(Duration::from_secs(25));
    h.step(Input::Round);
    let refreshed: Vec<_> = ids.iter().map(|id| decided_at(&mut h, id)).collect();
    assert!(refreshed.iter().zip(&first).all(|(r, f)| r > f), "old explanations are refreshed: {refreshed:?}");
    // Capacity frees up: the oldest gang is offered in the next round.
    h.event(conn, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Offer(a)] if a.job_id == ids[0]), "{:?}", fx.sends);
}

#[test]
fn the_federation_queue_charges_a_tenant_for_its_dominant_resource() {
    // Two 8-GPU nodes of 96 cores: 16 GPUs and 192 cores in all.
    let mut h = Harness::new(CoreConfig::default());
    let conn = h.east(&[8, 8]);
    // `cores` holds 1 GPU (6 %) but 72 cores (37.5 %); `gpus` holds 4 GPUs (25 %) and no cores.
    let cores = "name: c\ntenant: cores\ngang: {replicas: 1, resources: {gpus: 1, cpu: 72}}\npayload: {command: [x]}\n";
    h.run_on(conn, cores);
    h.event(conn, inventory_event(&[7, 8]));
    let gpus = "name: g\ntenant: gpus\ngang: {replicas: 1, resources: {gpus: 4}}\npayload: {command: [x]}\n";
    h.run_on(conn, gpus);
    // One GPU left. Counting GPUs, `cores` (1) would go before `gpus` (4); by dominant share
    // `gpus` (25 %) goes before `cores` (72 of 192 cores: 37.5 %).
    h.event(conn, inventory_event(&[0, 1]));
    let waiting_cores =
        h.submit("name: c3\ntenant: cores\ngang: {replicas: 1, resources: {gpus: 1}}\npayload: {command: [x]}\n");
    let waiting_gpus =
        h.submit("name: g2\ntenant: gpus\ngang: {replicas: 1, resources: {gpus: 1}}\npayload: {command: [x]}\n");
    let fx = h.step(Input::Round);
    let offered: Vec<&str> = sends_to(&fx, conn)
        .into_iter()
        .filter_map(|m| match m {
            GatewayCommand::Offer(a) => Some(a.job_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(offered, [waiting_gpus.as_str()]);
    assert_eq!(h.state(&waiting_cores), JobState::Queued);
}
