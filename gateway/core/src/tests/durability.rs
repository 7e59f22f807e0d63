//! What a step makes durable before it answers or sends, what a failed commit stops, and what
//! a restart reads back.

use super::*;

#[test]
fn a_submitted_job_is_persisted_in_the_step_that_answers_it() {
    let mut h = Harness::new(CoreConfig::default());
    let fx = h.step(Input::Submit { spec: spec(JOB), reply: 9 });
    let Some((9, Ok(Reply::Submitted { job, created: true }))) = fx.replies.first() else { panic!("{fx:?}") };
    assert_eq!(persisted_job(&fx, &job.id).map(|j| j.state), Some(JobState::Queued));
}

#[test]
fn an_offer_is_sent_with_its_durable_record_and_decision() {
    let mut h = Harness::new(CoreConfig::default());
    let conn = h.east(&[8]);
    let id = h.submit(JOB);
    let fx = h.step(Input::Round);
    let offered = persisted_job(&fx, &id).unwrap();
    assert_eq!(
        (offered.state, offered.fencing_token, offered.gpu_type.as_deref()),
        (JobState::Offered, 1, Some("h100"))
    );
    assert!(
        fx.persist.iter().any(|r| matches!(r, Record::Decision(j, d) if *j == id && !d.stored().candidates.is_empty()))
    );
    match sends_to(&fx, conn)[..] {
        [GatewayCommand::Offer(a)] => assert_eq!(a.spec.gang.resources.gpu_types, vec!["h100".to_string()]),
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn a_cancel_is_durable_in_the_step_that_tells_the_agent() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let fx = h.step(Input::Cancel { job_id: id.clone(), reply: 3 });
    assert_eq!(persisted_job(&fx, &id).map(|j| j.state), Some(JobState::Cancelled));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { fencing_token: 1, .. }]));
    // The agent's confirmation updates the note and is acknowledged.
    let mut stopped = report(&id, 1, JobState::Cancelled);
    stopped.message = "stopped".into();
    let fx = h.event(conn, AgentEvent::Status(stopped));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { .. }]));
    assert!(h.job(&id).message.contains("stopped on east"));
}

#[test]
fn a_result_is_acknowledged_only_with_its_record() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let fx = h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    assert_eq!(persisted_job(&fx, &id).map(|j| j.state), Some(JobState::Succeeded));
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Ack { fencing_token: 1, .. }]));
    // The agent re-sends it in a heartbeat (the ack crossed it): acknowledged again, nothing new stored.
    let fx = h.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Succeeded)] });
    assert!(fx.persist.is_empty(), "{:?}", fx.persist);
    assert!(sends_to(&fx, conn).iter().any(|m| matches!(m, GatewayCommand::Ack { .. })));
}

#[test]
fn a_failed_commit_makes_the_core_refuse_every_change() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    h.core.fail("the store failed");
    let fx = h.step(Input::Submit { spec: spec(JOB), reply: 5 });
    assert!(matches!(&fx.replies[..], [(5, Err(Error::Unavailable(_)))]));
    assert!(fx.persist.is_empty());
    let fx = h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    assert!(fx.is_empty(), "no result is acknowledged: the agent keeps it");
    assert_eq!(h.core.view().failure(), Some("the store failed"));
}

#[test]
fn finished_jobs_are_forgotten_after_retention_with_their_decisions_and_keys() {
    let mut h = Harness::new(CoreConfig { retention: Duration::from_secs(3600), ..Default::default() });
    let (id, conn) = h.offered();
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    let keyed = h.submit(&format!("{JOB}idempotencyKey: k1\n"));
    h.step(Input::Cancel { job_id: keyed.clone(), reply: 1 });
    h.advance(Duration::from_secs(3599));
    assert!(h.step(Input::Tick).persist.is_empty());
    h.advance(Duration::from_secs(2));
    let fx = h.step(Input::Tick);
    assert!(fx.persist.contains(&Record::DeleteJob(id.clone())));
    assert!(fx.persist.contains(&Record::DeleteDecision(id.clone())));
    assert!(fx.persist.contains(&Record::DeleteJob(keyed.clone())));
    assert_eq!(h.core.job_count(), 0);
    // The key is free again.
    let again = h.submit(&format!("{JOB}idempotencyKey: k1\n"));
    assert_ne!(again, keyed);
}

#[test]
fn explain_works_after_a_restart_from_what_was_stored() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, _) = h.running();
    let mut restarted = h.restarted(CoreConfig::default());
    assert_eq!(restarted.state(&id), JobState::Unknown, "running until its cluster says otherwise");
    let explained = restarted.core.view().explain(&id).unwrap();
    assert_eq!(explained.candidates.len(), 1);
    assert_eq!(explained.candidates[0].verdict, record::VerdictKind::Chosen);
}

#[test]
fn an_offer_in_flight_at_a_restart_is_adopted_when_its_member_runs_it() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, _) = h.offered();
    let mut restarted = h.restarted(CoreConfig::default());
    assert_eq!(restarted.state(&id), JobState::Unknown, "an offer in flight may have started");
    let (conn, fx) = restarted.connect("east", "a1");
    assert!(
        matches!(sends_to(&fx, conn)[..], [GatewayCommand::Welcome { bound, .. }] if bound.len() == 1 && bound[0].job_id == id)
    );
    restarted.event(conn, inventory_event(&[0]));
    let fx = restarted.step(Input::Round);
    assert!(sends_to(&fx, conn).is_empty(), "not offered again");
    restarted.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Running)] });
    assert_eq!(restarted.state(&id), JobState::Running);
    assert_eq!(restarted.job(&id).fencing_token, 1, "the same binding: adopted, not re-run");
}
