//! Sibling copies: a queued job that cannot start now waits as copies on its best members; the
//! first member ready to start one is granted it under a new binding, in the job's fair-share
//! turn, and every other copy is dropped; a copy of a job no longer queued is only ever dropped.

use super::*;

const GANG: &str = "name: gang\ntenant: t\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n";

/// A core that keeps `k` copies per waiting job, with `east` and `west` busy.
fn fleet(k: u32) -> (Harness, ConnId, ConnId) {
    let mut config = CoreConfig::default();
    config.placement.sibling_copies = k;
    let mut h = Harness::new(config);
    let (east, _) = h.connect("east", "east");
    h.event(east, inventory_event(&[0, 0]));
    let (west, _) = h.connect("west", "west");
    h.event(west, inventory_event(&[0, 0]));
    (h, east, west)
}

/// The copies sent in `fx`: (stream, copy token, job).
fn copies(fx: &Effects) -> Vec<(ConnId, u64, String)> {
    fx.sends
        .iter()
        .filter_map(|(c, m)| match m {
            GatewayCommand::Copy { copy_token, assignment } => Some((*c, *copy_token, assignment.job_id.clone())),
            _ => None,
        })
        .collect()
}

/// The copy drops sent in `fx`: (stream, copy token).
fn drops(fx: &Effects) -> Vec<(ConnId, u64)> {
    fx.sends
        .iter()
        .filter_map(|(c, m)| match m {
            GatewayCommand::DropCopy { copy_token, .. } => Some((*c, *copy_token)),
            _ => None,
        })
        .collect()
}

fn ready(id: &str, copy_token: u64) -> AgentEvent {
    AgentEvent::CopyReady { job_id: id.to_string(), copy_token }
}

#[test]
fn a_waiting_job_gets_copies_and_the_first_ready_one_is_granted_under_a_new_binding() {
    let (mut h, east, west) = fleet(2);
    let gang = h.submit(GANG);
    let fx = h.step(Input::Round);
    let sent = copies(&fx);
    assert_eq!(sent.len(), 2, "{:?}", fx.sends);
    assert_eq!(h.core.copies.len(), 2);
    assert_eq!(h.state(&gang), JobState::Queued);
    let message = h.job(&gang).message;
    assert!(message.contains("waiting as sibling copies on east, west"), "{message}");
    // A later round sends no more while the copies wait.
    assert!(copies(&h.step(Input::Round)).is_empty());

    let (_, west_copy, _) = *sent.iter().find(|(c, _, _)| *c == west).expect("a copy on west");
    let (_, east_copy, _) = *sent.iter().find(|(c, _, _)| *c == east).expect("a copy on east");
    // `explain` lists where it waits, and which copy asked for the lock.
    let listed = |h: &mut Harness| -> Vec<(String, bool)> {
        let explanation = h.core.view().explain(&gang).expect("explained");
        explanation.sibling_copies.into_iter().map(|c| (c.cluster, c.ready)).collect()
    };
    let mut waiting = listed(&mut h);
    waiting.sort();
    assert_eq!(waiting, [("east".to_string(), false), ("west".to_string(), false)]);
    let fx = h.event(west, ready(&gang, west_copy));
    assert!(fx.sends.is_empty() && h.core.wants_round(), "the grant waits for the job's turn in a round");
    assert!(listed(&mut h).contains(&("west".to_string(), true)));
    let token_before = h.job(&gang).fencing_token;
    let fx = h.step(Input::Round);
    // East's copy is dropped, then west's is granted.
    assert_eq!(drops(&fx), [(east, east_copy)]);
    let grant = sends_to(&fx, west)
        .into_iter()
        .find_map(|m| match m {
            GatewayCommand::Grant { copy_token, assignment } => Some((*copy_token, assignment.fencing_token)),
            _ => None,
        })
        .expect("a grant to west");
    assert_eq!(grant, (west_copy, token_before + 1));
    let job = h.job(&gang);
    assert_eq!((job.state, job.cluster.as_deref()), (JobState::Offered, Some("west")));
    assert!(persisted_job(&fx, &gang).is_some(), "the grant is durable with its step");
    assert!(job.message.contains("sibling copy on west"), "{}", job.message);
    assert_eq!(h.core.copies.len(), 0);
    assert!(listed(&mut h).is_empty(), "a granted job waits as no copy");

    // East says its (dropped) copy is ready too: it is only dropped again.
    let fx = h.event(east, ready(&gang, east_copy));
    assert_eq!(drops(&fx), [(east, east_copy)]);
    let fx = h.event(west, accept(&gang, token_before + 1));
    assert!(fx.sends.is_empty(), "{:?}", fx.sends);
    assert_eq!(h.state(&gang), JobState::Bound);
}

#[test]
fn copies_go_where_the_job_waits_and_never_to_a_member_without_a_start_gate() {
    let (mut h, east, west) = fleet(2);
    let gang = h.submit(GANG);
    let sent = copies(&h.step(Input::Round));
    let (_, west_copy, _) = *sent.iter().find(|(c, _, _)| *c == west).expect("a copy on west");
    // West's backend has no start gate: its copy is gone, and it gets no more.
    h.event(
        west,
        AgentEvent::CopyDropped {
            job_id: gang.clone(),
            copy_token: west_copy,
            reason: "kubernetes has no start gate".into(),
            unsupported: true,
        },
    );
    assert_eq!(h.core.copies.of(&gang).iter().map(|c| c.cluster.as_str()).collect::<Vec<_>>(), ["east"]);
    let other = h.submit(&GANG.replace("name: gang", "name: other"));
    let sent = copies(&h.step(Input::Round));
    assert_eq!(sent.iter().map(|(c, _, j)| (*c, j.as_str())).collect::<Vec<_>>(), [(east, other.as_str())]);
    // A member whose stream ends has dropped its copies.
    h.step(Input::AgentGone { conn: east });
    assert!(!h.core.copies.has_copies(&gang) && !h.core.copies.has_copies(&other));
}

#[test]
fn stale_ready_copies_and_copies_of_jobs_no_longer_queued_are_dropped_before_any_offer() {
    let (mut h, east, west) = fleet(1);
    let gang = h.submit(GANG);
    let sent = copies(&h.step(Input::Round));
    assert_eq!(sent.len(), 1);
    let (conn, copy, _) = sent[0].clone();
    // A ready message for a copy the gateway never made: dropped.
    let fx = h.event(conn, ready(&gang, copy + 100));
    assert_eq!(drops(&fx), [(conn, copy + 100)], "an unknown copy is dropped");
    // The job is cancelled: its copy is dropped by the next round.
    h.step(Input::Cancel { job_id: gang.clone(), reply: 9 });
    let fx = h.step(Input::Round);
    assert_eq!(drops(&fx), [(conn, copy)]);

    // A job placed by an offer drops its copies before the offer goes out.
    let next = h.submit(&GANG.replace("name: gang", "name: next"));
    let sent = copies(&h.step(Input::Round));
    let (copy_conn, next_copy, _) = sent[0].clone();
    let free = if copy_conn == east { west } else { east };
    h.event(free, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    let order: Vec<&str> = fx
        .sends
        .iter()
        .filter_map(|(_, m)| match m {
            GatewayCommand::DropCopy { copy_token, .. } if *copy_token == next_copy => Some("drop"),
            GatewayCommand::Offer(a) if a.job_id == next => Some("offer"),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["drop", "offer"]);
}

#[test]
fn a_ready_copy_of_a_job_over_its_tenants_quota_is_dropped_not_granted() {
    let mut config = CoreConfig::default();
    config.placement.sibling_copies = 1;
    config.quotas.insert("t".into(), TenantQuota { max_gpus: Some(20), ..Default::default() });
    let mut h = Harness::new(config);
    let (east, _) = h.connect("east", "east");
    h.event(east, inventory_event(&[0, 0]));
    let gang = h.submit(GANG);
    let sent = copies(&h.step(Input::Round));
    let (conn, copy, _) = sent[0].clone();
    // The tenant's 8-GPU job starts where the gang does not fit, before the copy is ready:
    // 8 + 16 GPUs would pass the tenant's 20.
    let (west, _) = h.connect("west", "west");
    h.event(west, inventory_event(&[8, 0]));
    let other = h.submit(&GANG.replace("name: gang", "name: other").replace("replicas: 2", "replicas: 1"));
    h.step(Input::Round);
    assert_eq!(h.job(&other).cluster.as_deref(), Some("west"));
    h.event(conn, ready(&gang, copy));
    let fx = h.step(Input::Round);
    assert_eq!(drops(&fx), [(conn, copy)], "the member must not hold its nodes for a job that cannot start");
    assert!(!fx.sends.iter().any(|(_, m)| matches!(m, GatewayCommand::Grant { .. })));
    assert_eq!(h.state(&gang), JobState::Queued);
}

/// A job with copies on `east` and `west` whose GPUs then free up on `west` before west's
/// scheduler has started its copy; returns west's copy token.
fn west_frees_before_its_copy_starts(h: &mut Harness, gang: &str, west: ConnId) -> u64 {
    let sent = copies(&h.step(Input::Round));
    let (_, west_copy, _) = *sent.iter().find(|(c, _, _)| *c == west).expect("a copy on west");
    h.event(west, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    let offers = fx.sends.iter().filter(|(_, m)| matches!(m, GatewayCommand::Offer(_) | GatewayCommand::Grant { .. }));
    assert_eq!(offers.count(), 0, "no offer while west's copy may still start: {:?}", fx.sends);
    assert!(drops(&fx).is_empty(), "{:?}", fx.sends);
    assert_eq!(h.state(gang), JobState::Queued);
    let message = h.job(gang).message;
    assert!(message.contains("west can start it now and holds its sibling copy"), "{message}");
    west_copy
}

#[test]
fn a_job_that_could_start_where_it_holds_a_copy_waits_for_that_copy_to_ask_for_the_lock() {
    let (mut h, east, west) = fleet(2);
    let gang = h.submit(GANG);
    let west_copy = west_frees_before_its_copy_starts(&mut h, &gang, west);
    // A job behind it that would fit west now does not take the GPUs kept for the copy.
    let other = h.submit(&GANG.replace("name: gang", "name: other"));
    h.advance(Duration::from_millis(7_500));
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, west).iter().all(|m| !matches!(m, GatewayCommand::Offer(_))), "{:?}", fx.sends);
    assert_eq!((h.state(&gang), h.state(&other)), (JobState::Queued, JobState::Queued));

    // West's scheduler started the copy: it asks for the lock and is granted it.
    h.event(west, ready(&gang, west_copy));
    let fx = h.step(Input::Round);
    let east_copy = drops(&fx);
    assert_eq!(east_copy.len(), 1, "east's copy is dropped: {:?}", fx.sends);
    assert_eq!(east_copy[0].0, east);
    assert!(
        sends_to(&fx, west)
            .iter()
            .any(|m| matches!(m, GatewayCommand::Grant { copy_token, .. } if *copy_token == west_copy)),
        "{:?}",
        fx.sends
    );
    assert_eq!(h.state(&gang), JobState::Offered);
}

#[test]
fn past_the_grace_the_job_is_offered_where_it_can_start_and_its_copies_are_dropped_first() {
    let (mut h, east, west) = fleet(2);
    let gang = h.submit(GANG);
    let west_copy = west_frees_before_its_copy_starts(&mut h, &gang, west);
    h.advance(Duration::from_secs(15));
    h.event(west, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    let dropped: Vec<ConnId> = drops(&fx).into_iter().map(|(c, _)| c).collect();
    assert_eq!(dropped.len(), 2, "both copies go: {:?}", fx.sends);
    assert!(dropped.contains(&east) && dropped.contains(&west));
    let drop_at = fx.sends.iter().position(|(c, m)| {
        *c == west && matches!(m, GatewayCommand::DropCopy { copy_token, .. } if *copy_token == west_copy)
    });
    let offer_at =
        fx.sends.iter().position(|(c, m)| *c == west && matches!(m, GatewayCommand::Offer(a) if a.job_id == gang));
    assert!(drop_at.is_some() && drop_at < offer_at, "the drop goes before the offer: {:?}", fx.sends);
    assert_eq!(h.state(&gang), JobState::Offered);
}

#[test]
fn with_no_grace_the_job_is_offered_at_once_where_it_can_start_and_a_bad_grace_is_named() {
    let mut config = CoreConfig::default();
    config.placement.sibling_copies = 2;
    config.placement.copy_start_grace_secs = 0.0;
    let mut h = Harness::new(config);
    let (east, _) = h.connect("east", "east");
    h.event(east, inventory_event(&[0, 0]));
    let (west, _) = h.connect("west", "west");
    h.event(west, inventory_event(&[0, 0]));
    let gang = h.submit(GANG);
    assert_eq!(copies(&h.step(Input::Round)).len(), 2);
    h.event(west, inventory_event(&[8, 8]));
    let fx = h.step(Input::Round);
    assert_eq!(drops(&fx).len(), 2, "{:?}", fx.sends);
    assert!(sends_to(&fx, west).iter().any(|m| matches!(m, GatewayCommand::Offer(a) if a.job_id == gang)));
    let _ = east;

    let bad = meridian_placement::PlacementConfig { copy_start_grace_secs: f64::NAN, ..Default::default() };
    assert_eq!(bad.problems("placement."), ["placement.copyStartGraceSecs: NaN must be a finite number >= 0"]);
}
