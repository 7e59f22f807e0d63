//! Agent streams: hellos, heartbeats and leases, a second agent for one cluster, and clusters
//! that go away and come back.

use super::*;

#[test]
fn heartbeats_renew_the_lease_with_their_sequence_number() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let fx = h.event(conn, AgentEvent::Heartbeat { seq: 41, jobs: vec![report(&id, 1, JobState::Running)] });
    assert!(fx.persist.is_empty(), "an unchanged heartbeat stores nothing: {:?}", fx.persist);
    let lease = CoreConfig::default().agent_lease().unwrap();
    assert_eq!(sends_to(&fx, conn), vec![&GatewayCommand::Lease { heartbeat_seq: 41, lease }]);
}

#[test]
fn a_heartbeat_that_omits_a_bound_job_places_it_again() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    h.event(conn, AgentEvent::Heartbeat { seq: 2, jobs: Vec::new() });
    let job = h.job(&id);
    assert_eq!((job.state, job.cluster.clone()), (JobState::Queued, None));
    assert!(job.message.contains("no longer holds"), "{}", job.message);
}

#[test]
fn a_second_agent_for_a_connected_cluster_is_refused_and_the_first_keeps_its_jobs() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let (rogue, fx) = h.connect("east", "intruder");
    assert!(
        matches!(&fx.replies[..], [(_, Err(Error::DuplicateAgent { instance, .. }))] if instance == "a1"),
        "{fx:?}"
    );
    assert!(fx.sends.is_empty(), "the refused stream gets no welcome");
    let fx = h.event(rogue, AgentEvent::Heartbeat { seq: 1, jobs: Vec::new() });
    assert!(fx.is_empty(), "a refused stream is not heard");
    assert_eq!(h.state(&id), JobState::Running);
    h.event(conn, AgentEvent::Heartbeat { seq: 3, jobs: vec![report(&id, 1, JobState::Running)] });
    assert_eq!(h.state(&id), JobState::Running);
}

#[test]
fn the_same_agent_instance_replaces_its_own_stream() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    let (again, fx) = h.connect("east", "a1");
    assert_eq!(fx.close, vec![conn]);
    assert!(matches!(&fx.replies[..], [(_, Ok(Reply::Attached))]));
    h.step(Input::AgentGone { conn });
    assert_eq!(h.state(&id), JobState::Running, "the old stream's end is not the cluster's");
    h.event(again, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    assert_eq!(h.state(&id), JobState::Succeeded);
}

#[test]
fn a_job_that_finished_while_its_cluster_was_away_ends_succeeded() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    h.step(Input::AgentGone { conn });
    assert_eq!(h.state(&id), JobState::Unknown);
    let (again, fx) = h.connect("east", "a1");
    match sends_to(&fx, again)[..] {
        [GatewayCommand::Welcome { bound, lease }] => {
            assert_eq!(
                bound.iter().map(|a| (a.job_id.clone(), a.fencing_token)).collect::<Vec<_>>(),
                vec![(id.clone(), 1)]
            );
            assert_eq!(*lease, CoreConfig::default().agent_lease());
        }
        ref other => panic!("{other:?}"),
    }
    let fx = h.event(again, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Succeeded)] });
    assert_eq!(h.state(&id), JobState::Succeeded);
    assert!(sends_to(&fx, again).iter().any(|m| matches!(m, GatewayCommand::Ack { .. })));
    // Messages still arriving on the old stream are ignored.
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Failed)));
    assert_eq!(h.state(&id), JobState::Succeeded);
}

/// Clusters silent for 10 s are lost; their jobs are placed again a minute after last contact
/// (agents hold a 55 s lease).
fn lost_after_a_minute() -> CoreConfig {
    CoreConfig {
        lost_job_timeout: Duration::from_secs(60),
        cluster_timeout: Duration::from_secs(10),
        lease_margin: Duration::from_secs(5),
        ..Default::default()
    }
}

#[test]
fn an_offer_in_flight_when_the_stream_drops_stays_reserved_until_the_lease_rule_places_it_again() {
    let mut h = Harness::new(lost_after_a_minute());
    let (id, east) = h.offered();
    let (west, _) = h.connect("west", "b1");
    h.event(west, inventory_event(&[8]));
    h.step(Input::AgentGone { conn: east });
    assert_eq!(h.state(&id), JobState::Unknown, "the agent may have accepted and started it");
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, west).is_empty(), "never offered elsewhere while east may run it");
    h.advance(Duration::from_secs(59));
    h.event(west, inventory_event(&[8]));
    h.step(Input::Tick);
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, west).is_empty(), "not before the lost-job timeout");
    h.advance(Duration::from_secs(1));
    h.event(west, inventory_event(&[8]));
    h.step(Input::Tick);
    let fx = h.step(Input::Round);
    assert!(matches!(sends_to(&fx, west)[..], [GatewayCommand::Offer(a)] if a.job_id == id && a.fencing_token == 2));
}

#[test]
fn a_returning_cluster_is_welcomed_with_its_offer_in_flight_and_keeps_the_copy_it_started() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, east) = h.offered();
    h.step(Input::AgentGone { conn: east });
    let (again, fx) = h.connect("east", "a2");
    assert!(
        matches!(sends_to(&fx, again)[..], [GatewayCommand::Welcome { bound, .. }] if bound.len() == 1 && bound[0].job_id == id && bound[0].fencing_token == 1),
        "the welcome lists the offer in flight"
    );
    // Still being submitted there: the offer is in flight again.
    h.event(again, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Offered)] });
    assert_eq!(h.state(&id), JobState::Offered);
    h.event(again, accept(&id, 1));
    h.event(again, AgentEvent::Heartbeat { seq: 2, jobs: vec![report(&id, 1, JobState::Running)] });
    assert_eq!(h.state(&id), JobState::Running, "adopted under its token, not run again");
    assert_eq!(h.job(&id).fencing_token, 1);
}

#[test]
fn a_returning_cluster_that_never_saw_the_offer_reports_it_lost_and_the_job_is_placed_again() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, east) = h.offered();
    h.step(Input::AgentGone { conn: east });
    let (again, _) = h.connect("east", "a2");
    let mut lost = report(&id, 1, JobState::Failed);
    lost.requeue = true;
    h.event(again, AgentEvent::Heartbeat { seq: 1, jobs: vec![lost] });
    assert_eq!(h.state(&id), JobState::Queued);
}

#[test]
fn a_job_lost_with_its_cluster_is_placed_again_only_after_the_timeout_counted_from_last_contact() {
    let mut h = Harness::new(lost_after_a_minute());
    let (id, east) = h.running();
    let (west, _) = h.connect("west", "b1");
    h.advance(Duration::from_secs(11));
    h.event(west, inventory_event(&[8]));
    let fx = h.step(Input::Tick);
    assert_eq!(fx.close, vec![east], "a silent cluster's stream is dropped");
    assert_eq!(h.state(&id), JobState::Unknown);
    // 60 s after east was last heard (t = 0), not after it was noticed silent (t = 11).
    h.advance(Duration::from_secs(48));
    h.event(west, inventory_event(&[8]));
    h.step(Input::Tick);
    assert_eq!(h.state(&id), JobState::Unknown, "not before the timeout");
    h.advance(Duration::from_secs(1));
    h.event(west, inventory_event(&[8]));
    h.step(Input::Tick);
    let fx = h.step(Input::Round);
    assert!(matches!(sends_to(&fx, west)[..], [GatewayCommand::Offer(a)] if a.job_id == id && a.fencing_token == 2));
    // East comes back: its welcome leaves the job out, and its stale report is cancelled.
    let (east_again, fx) = h.connect("east", "a1");
    assert!(matches!(sends_to(&fx, east_again)[..], [GatewayCommand::Welcome { bound, .. }] if bound.is_empty()));
    let fx = h.event(east_again, AgentEvent::Status(report(&id, 1, JobState::Running)));
    assert!(matches!(sends_to(&fx, east_again)[..], [GatewayCommand::Cancel { fencing_token: 1, .. }]));
    assert_eq!(h.job(&id).cluster.as_deref(), Some("west"));
}

#[test]
fn the_agent_lease_ends_before_the_gateway_places_lost_jobs_again() {
    let config = CoreConfig::default();
    let lease = config.agent_lease().unwrap();
    assert!(lease + config.lease_margin <= config.lost_job_timeout);
    let none = CoreConfig { lease_margin: Duration::from_secs(600), ..Default::default() };
    assert_eq!(none.agent_lease(), None);
}

#[test]
fn the_registry_snapshot_follows_new_inventories_prices_and_pressure() {
    use crate::registry::{Link, Registry};
    use meridian_proto::inventory::QueuePressure;
    let network = Arc::new(meridian_placement::NetworkTable::default());
    let speeds = BTreeMap::new();
    let free_of = |registry: &Registry| {
        let snapshot = registry.snapshot(&network, &speeds, 0);
        snapshot.clusters[0].inventory().gpus_free()
    };
    let mut registry = Registry::default();
    registry.connect(cluster_info("a"), Link { conn: 1, instance: "i".into() }, 0);
    let (busy, idle) = (inventory(&[0, 8]), inventory(&[8, 8]));
    registry.entry_of_mut(1).unwrap().set_inventory(busy);
    assert_eq!(free_of(&registry), 8);
    // A round's reservation changes only that round's copy.
    let mut round = registry.snapshot(&network, &speeds, 0);
    assert!(round.clusters[0].reserve(&spec(JOB)));
    assert_eq!(round.clusters[0].inventory().gpus_free(), 0);
    assert_eq!(free_of(&registry), 8);
    // A new report is seen by the next snapshot.
    registry.entry_of_mut(1).unwrap().set_inventory(idle);
    assert_eq!(free_of(&registry), 16);
    // So are new prices from a reconnecting agent, and new pressure.
    let mut dearer = cluster_info("a");
    dearer.prices.insert("h100".into(), 9.0);
    registry.connect(dearer, Link { conn: 2, instance: "i".into() }, 0);
    registry.entry_of_mut(2).unwrap().pressure =
        Arc::new(QueuePressure { estimated_wait_secs: 42, ..Default::default() });
    let snapshot = registry.snapshot(&network, &speeds, 0);
    assert_eq!(snapshot.clusters[0].info().prices["h100"], 9.0);
    assert_eq!(snapshot.clusters[0].pressure.estimated_wait_secs, 42);
    assert!(snapshot.clusters[0].connected);
}
