//! Tenant quotas: jobs held back for `maxGpus` and `maxQueuedJobs` wait, say why, and start once
//! their tenant is under its limits.

use super::*;

fn with_quota(tenant: &str, quota: TenantQuota) -> CoreConfig {
    CoreConfig { quotas: BTreeMap::from([(tenant.to_string(), quota)]), ..Default::default() }
}

/// Tenant `nlp` may hold `max_gpus` GPUs.
fn nlp_may_hold(max_gpus: u32) -> CoreConfig {
    with_quota("nlp", TenantQuota { max_gpus: Some(max_gpus), ..Default::default() })
}

#[test]
fn a_job_over_the_gpu_quota_waits_with_the_quota_explanation_and_starts_once_its_tenant_frees_gpus() {
    let mut h = Harness::new(nlp_may_hold(8));
    let conn = h.east(&[8, 8]);
    let first = h.run_on(conn, &job_of("nlp", 8));
    h.event(conn, inventory_event(&[0, 8]));
    let second = h.submit(&job_of("nlp", 2));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "8 GPUs are free, but the tenant holds its 8: {:?}", offers(&fx));
    assert_eq!(h.state(&second), JobState::Queued);
    assert_eq!(
        h.summary(&second),
        "waiting for quota: tenant nlp holds 8 of its 8 GPUs (tenants.nlp.quota.maxGpus); \
         this job needs 2 more, so 2 must be released first"
    );
    // Waiting is not failing: later rounds leave it queued with the same explanation.
    h.advance(Duration::from_secs(60));
    assert!(offers(&h.step(Input::Round)).is_empty());
    assert!(h.summary(&second).contains("maxGpus"));

    h.event(conn, AgentEvent::Status(report(&first, 1, JobState::Succeeded)));
    h.event(conn, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [second.as_str()]);
    assert_eq!(h.state(&second), JobState::Offered);
    h.core.check_indexes();
}

#[test]
fn the_gpu_quota_counts_offers_made_earlier_in_the_same_round() {
    let mut h = Harness::new(nlp_may_hold(8));
    h.east(&[8, 8, 8]);
    let a = h.submit(&job_of("nlp", 4));
    let b = h.submit(&job_of("nlp", 4));
    let c = h.submit(&job_of("nlp", 4));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [a, b]);
    assert!(h.summary(&c).contains("holds 8 of its 8 GPUs"), "{}", h.summary(&c));
}

#[test]
fn other_tenants_are_not_held_back_by_a_tenants_quota() {
    let mut h = Harness::new(nlp_may_hold(8));
    let conn = h.east(&[8, 8, 8]);
    h.run_on(conn, &job_of("nlp", 8));
    h.event(conn, inventory_event(&[0, 8, 8]));
    let over = h.submit(&job_of("nlp", 8));
    let vision = h.submit(&job_of("vision", 8));
    let more_vision = h.submit(&job_of("vision", 8));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [vision, more_vision], "vision has no quota");
    assert_eq!(h.state(&over), JobState::Queued);
}

#[test]
fn the_default_quota_applies_to_tenants_without_their_own() {
    let config = CoreConfig {
        quotas: BTreeMap::from([("big".to_string(), TenantQuota { max_gpus: Some(16), ..Default::default() })]),
        default_quota: TenantQuota { max_gpus: Some(4), ..Default::default() },
        ..Default::default()
    };
    let mut h = Harness::new(config);
    h.east(&[8, 8, 8]);
    let big = h.submit(&job_of("big", 8));
    let small = h.submit(&job_of("small", 4));
    let small_more = h.submit(&job_of("small", 1));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [big, small]);
    assert!(h.summary(&small_more).contains("(defaultQuota.maxGpus)"), "{}", h.summary(&small_more));
}

#[test]
fn a_gang_larger_than_the_whole_gpu_quota_is_refused_at_submit() {
    let mut h = Harness::new(nlp_may_hold(8));
    h.east(&[8, 8]);
    let gang = "name: j\ntenant: nlp\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n";
    let fx = h.step(Input::Submit { spec: spec(gang), reply: 4 });
    match &fx.replies[..] {
        [(4, Err(Error::ExceedsQuota { field, limit: 8, needs: 16, .. }))] => {
            assert_eq!(field, "tenants.nlp.quota.maxGpus");
        }
        other => panic!("expected a quota refusal, got {other:?}"),
    }
    assert!(fx.persist.is_empty(), "a refused submit stores nothing");
}

#[test]
fn max_queued_jobs_places_only_the_first_jobs_in_queue_order_and_explains_the_rest() {
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_queued_jobs: Some(2), ..Default::default() }));
    h.east(&[8, 8, 8, 8]);
    let oldest = h.submit(&job_of("nlp", 8));
    let second = h.submit(&job_of("nlp", 8));
    let third = h.submit(&job_of("nlp", 8));
    let urgent = h.submit(
        "name: u\ntenant: nlp\npriority: 90\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n",
    );
    let other = h.submit(&job_of("vision", 8));
    let fx = h.step(Input::Round);
    let mut offered = offers(&fx);
    offered.sort();
    let mut expected = vec![oldest, urgent, other];
    expected.sort();
    assert_eq!(offered, expected, "the first two of nlp in queue order (priority, then age), and vision");
    for waiting in [&second, &third] {
        assert_eq!(h.state(waiting), JobState::Queued);
        assert_eq!(
            h.summary(waiting),
            "waiting for quota: only the first 2 queued jobs of tenant nlp are considered for placement \
             (tenants.nlp.quota.maxQueuedJobs); this job is behind them"
        );
    }
    // The offered jobs left the queue: the next round considers the rest.
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [second]);
    h.core.check_indexes();
}

#[test]
fn unknown_jobs_count_against_the_gpu_quota() {
    let mut h = Harness::new(nlp_may_hold(8));
    let (east, _) = h.connect("east", "a1");
    h.event(east, inventory_event(&[8]));
    let lost = h.run_on(east, &job_of("nlp", 8));
    h.step(Input::AgentGone { conn: east });
    assert_eq!(h.state(&lost), JobState::Unknown);
    let (west, _) = h.connect("west", "b1");
    h.event(west, inventory_event(&[8]));
    let next = h.submit(&job_of("nlp", 8));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "the Unknown job may still hold its 8 GPUs");
    assert!(h.summary(&next).contains("holds 8 of its 8 GPUs"), "{}", h.summary(&next));
}

#[test]
fn a_restarted_core_counts_the_gpus_its_tenants_held() {
    let config = nlp_may_hold(8);
    let mut h = Harness::new(config.clone());
    let conn = h.east(&[8, 8]);
    let running = h.run_on(conn, &job_of("nlp", 8));
    let waiting = h.submit(&job_of("nlp", 8));
    h.step(Input::Round);
    let mut restarted = h.restarted(config);
    let (conn, _) = restarted.connect("east", "a2");
    restarted.event(conn, inventory_event(&[0, 8]));
    let fx = restarted.step(Input::Round);
    assert!(offers(&fx).is_empty(), "the running job still holds the tenant's 8 GPUs");
    assert_eq!(restarted.state(&waiting), JobState::Queued);
    assert!(restarted.summary(&waiting).contains("maxGpus"));
    // Its cluster reports it finished: the waiting job goes.
    restarted.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&running, 1, JobState::Succeeded)] });
    restarted.event(conn, inventory_event(&[8, 8]));
    assert_eq!(restarted.state(&running), JobState::Succeeded);
    assert_eq!(offers(&restarted.step(Input::Round)), [waiting]);
}

#[test]
fn a_gang_over_its_gpu_quota_does_not_hold_a_cluster_against_other_tenants() {
    let mut config = nlp_may_hold(16);
    config.placement.hold_after_secs = 0.0;
    let mut h = Harness::new(config);
    let conn = h.east(&[8, 8, 8]);
    h.run_on(conn, &job_of("nlp", 8));
    h.event(conn, inventory_event(&[0, 8, 0]));
    // Over quota (8 held + 16 > 16), and it does not fit now either: without the quota it would
    // hold east, and a 10-hour job of another tenant could not take the free node.
    let gang =
        h.submit("name: gang\ntenant: nlp\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n");
    h.step(Input::Round);
    assert!(h.summary(&gang).contains("maxGpus"), "{}", h.summary(&gang));
    let long = h.submit(
        "name: long\ntenant: vision\ngang: {replicas: 1, resources: {gpus: 8}}\nruntime: {estimate: 10h}\n\
         payload: {command: [x]}\n",
    );
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [long.as_str()]);
}
