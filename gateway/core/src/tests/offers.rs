//! Offers and their bindings: answers, fencing tokens, members that stop or preempt a job, and
//! offers withdrawn after the offer timeout.

use super::*;

#[test]
fn an_accepted_offer_binds_and_a_running_report_runs() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, _) = h.running();
    let job = h.job(&id);
    assert_eq!(job.nodes, vec!["dgx-0".to_string()]);
    assert!(job.placement.is_some_and(|p| p.contains("east")));
}

#[test]
fn a_declined_offer_returns_the_job_to_the_queue_with_the_reason() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    h.event(conn, answer(&id, 1, false, "node dgx-0 is draining", false));
    let job = h.job(&id);
    assert_eq!((job.state, job.cluster.clone()), (JobState::Queued, None));
    assert!(job.message.contains("draining"), "{}", job.message);
}

#[test]
fn an_offer_refused_for_good_fails_the_job_with_the_members_words() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    let slurm_said =
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified";
    h.event(conn, answer(&id, 1, false, slurm_said, true));
    let job = h.job(&id);
    assert_eq!(job.state, JobState::Failed);
    assert!(job.finished_at_ms.is_some());
    assert!(job.message.contains(slurm_said), "{}", job.message);
}

#[test]
fn a_report_with_a_stale_token_is_cancelled_not_applied() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    h.event(conn, accept(&id, 1));
    let fx = h.event(conn, AgentEvent::Status(report(&id, 0, JobState::Succeeded)));
    assert_eq!(h.state(&id), JobState::Bound, "a stale result changes nothing");
    assert!(
        matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { fencing_token: 0, .. }]),
        "a stale result is dropped"
    );
    let fx = h.event(conn, AgentEvent::Status(report(&id, 0, JobState::Running)));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { fencing_token: 0, .. }]));
}

#[test]
fn a_late_acceptance_of_a_cancelled_job_is_stopped() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    h.step(Input::Cancel { job_id: id.clone(), reply: 3 });
    let fx = h.event(conn, accept(&id, 1));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { .. }]));
    assert_eq!(h.state(&id), JobState::Cancelled);
}

#[test]
fn a_job_stopped_by_its_member_through_no_fault_of_its_own_is_placed_again() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let mut stopped = report(&id, 1, JobState::Failed);
    stopped.requeue = true;
    stopped.message = "stopped by east: lease expired".into();
    let fx = h.event(conn, AgentEvent::Status(stopped));
    assert_eq!(h.state(&id), JobState::Queued);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { .. }]));
    // Placed again with a newer token.
    h.event(conn, inventory_event(&[8]));
    let fx = h.step(Input::Round);
    assert!(fx.sends.iter().any(|(_, m)| matches!(m, GatewayCommand::Offer(a) if a.fencing_token == 2)));
}

#[test]
fn a_preempted_job_is_queued_again_with_its_submit_time_and_the_next_offer_says_when() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let submitted = h.job(&id).submitted_at_ms;
    h.advance(Duration::from_secs(120));
    let preempted_at = h.now_ms;
    let mut stopped = report(&id, 1, JobState::Failed);
    stopped.requeue = true;
    stopped.preempted = true;
    stopped.message = "preempted for higher-priority work after 90.0s".into();
    let fx = h.event(conn, AgentEvent::Status(stopped));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { .. }]));
    let job = h.job(&id);
    assert_eq!((job.state, job.cluster.clone(), job.started_at_ms), (JobState::Queued, None, None));
    assert_eq!(job.submitted_at_ms, submitted, "its waited time keeps counting");
    assert_eq!((job.preemptions, job.last_preempted_at_ms), (1, Some(preempted_at)));
    assert!(job.message.starts_with("preempted on east"), "{}", job.message);
    let json = serde_json::to_value(&job).unwrap();
    assert_eq!((json["preemptions"].as_u64(), json["lastPreemptedAtMs"].as_i64()), (Some(1), Some(preempted_at)));
    h.event(conn, inventory_event(&[8]));
    let fx = h.step(Input::Round);
    let offer = fx.sends.iter().find_map(|(_, m)| match m {
        GatewayCommand::Offer(a) => Some(a.clone()),
        _ => None,
    });
    let offer = offer.expect("placed again");
    assert_eq!((offer.fencing_token, offer.last_preempted_at_ms), (2, Some(preempted_at)));
}

#[test]
fn a_job_that_was_never_preempted_shows_no_preemption_fields() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, _) = h.running();
    let json = serde_json::to_value(h.job(&id)).unwrap();
    assert!(json.get("preemptions").is_none() && json.get("lastPreemptedAtMs").is_none(), "{json}");
}

#[test]
fn an_unanswered_offer_is_withdrawn_and_placed_again_only_once_the_member_confirms_it_stopped() {
    let mut h = Harness::new(CoreConfig { offer_timeout: Duration::from_secs(5), ..Default::default() });
    let (id, conn) = h.offered();
    h.advance(Duration::from_secs(6));
    h.event(conn, inventory_event(&[8]));
    let fx = h.step(Input::Tick);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { fencing_token: 1, .. }]));
    assert_eq!(h.state(&id), JobState::Offered, "still reserved: the member may run it");
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, conn).is_empty(), "not offered again before the member confirms");
    // The acceptance was already on its way: it binds nothing, the stop follows it.
    h.event(conn, accept(&id, 1));
    assert_eq!(h.state(&id), JobState::Offered);
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Running)));
    assert_eq!(h.state(&id), JobState::Offered, "a withdrawn offer's reports change nothing until it stops");
    // Unanswered again: the stop is repeated.
    h.advance(Duration::from_secs(6));
    let fx = h.step(Input::Tick);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { fencing_token: 1, .. }]));
    let fx = h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Cancelled)));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { fencing_token: 1, .. }]));
    assert_eq!(h.state(&id), JobState::Queued, "the member stopped it: it may run elsewhere");
    let fx = h.step(Input::Round);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Offer(a)] if a.job_id == id && a.fencing_token == 2));
}

#[test]
fn a_declined_withdrawal_places_the_job_again_at_once() {
    let mut h = Harness::new(CoreConfig { offer_timeout: Duration::from_secs(5), ..Default::default() });
    let (id, conn) = h.offered();
    h.advance(Duration::from_secs(6));
    h.step(Input::Tick);
    h.event(conn, answer(&id, 1, false, "full", false));
    assert_eq!(h.state(&id), JobState::Queued);
}

#[test]
fn a_binding_being_stopped_is_neither_missing_nor_changed() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    h.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Unknown)] });
    assert_eq!(h.state(&id), JobState::Running, "listed: the member still holds it");
}

#[test]
fn a_gang_offered_over_a_span_is_pinned_to_the_span_s_types() {
    use meridian_proto::inventory::{Inventory, NodeShape};
    use meridian_proto::testing::dgx_shape;

    let mut config = CoreConfig::default();
    config.placement.gpu_speed = BTreeMap::from([("a100-40g".to_string(), 1.0), ("a100-80g".to_string(), 1.0)]);
    let mut h = Harness::new(config);
    let (conn, _) = h.connect("east", "a1");
    // Two free 8-GPU nodes of each A100: a 3 × 8 gang fits only over both.
    let a100 = |gpu_type: &str, memory| NodeShape {
        name: gpu_type.into(),
        gpu_type: gpu_type.into(),
        gpu_memory_gib: memory,
        ..dgx_shape(&[8, 8])
    };
    let shapes = vec![a100("a100-40g", 40), a100("a100-80g", 80)];
    h.event(conn, AgentEvent::Inventory(Inventory { shapes }));
    let id = h.submit("name: big\ntenant: t\ngang: {replicas: 3, resources: {gpus: 8}}\npayload: {command: [x]}\n");
    let fx = h.step(Input::Round);
    assert_eq!(h.job(&id).gpu_type.as_deref(), Some("a100-40g+a100-80g"));
    match sends_to(&fx, conn)[..] {
        [GatewayCommand::Offer(a)] => {
            assert_eq!(a.spec.gang.resources.gpu_types, vec!["a100-40g".to_string(), "a100-80g".to_string()]);
        }
        ref other => panic!("{other:?}"),
    }
}
