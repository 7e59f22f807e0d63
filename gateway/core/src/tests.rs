//! The core's behaviour, driven through `step` exactly as the runtime and the simulator drive it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, ClusterInfo, Inventory, NodeFree, NodeShape, Tier};
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand, JobReport};
use meridian_proto::spec::JobSpec;
use meridian_proto::validate::parse_job_spec;

use super::*;

pub(crate) const JOB: &str = "name: j\ntenant: t\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n";

pub(crate) fn spec(text: &str) -> JobSpec {
    parse_job_spec(text, &GpuCatalog::default()).unwrap()
}

/// A builtin, owned cluster in us-east pricing H100s at US$2 (also used by other modules' tests).
pub(crate) fn info(name: &str) -> ClusterInfo {
    ClusterInfo {
        name: name.into(),
        region: "us-east".into(),
        tier: Tier::Owned,
        backend: BackendKind::Builtin,
        prices: BTreeMap::from([("h100".to_string(), 2.0)]),
        supports_containers: true,
        supports_bare_commands: true,
        labels: Default::default(),
    }
}

/// One 8-H100 node per entry of `free_gpus`, with that many GPUs free.
pub(crate) fn inventory(free_gpus: &[u32]) -> AgentEvent {
    AgentEvent::Inventory(Inventory {
        shapes: vec![NodeShape {
            name: "dgx".into(),
            gpu_type: "h100".into(),
            gpu_memory_gib: 80,
            gpus_per_node: 8,
            cpu_per_node: 96,
            memory_gib_per_node: 1024,
            free: free_gpus.iter().map(|&gpus| NodeFree { gpus, cpu: 96, memory_gib: 1024 }).collect(),
            labels: Default::default(),
        }],
    })
}

pub(crate) fn report(job: &str, token: u64, state: JobState) -> JobReport {
    JobReport {
        job_id: job.into(),
        fencing_token: token,
        state,
        message: String::new(),
        nodes: vec!["dgx-0".into()],
        requeue: false,
        preempted: false,
        usage: None,
    }
}

/// Drives a core the way the runtime does, keeping what was committed.
pub(crate) struct Harness {
    pub(crate) core: Core,
    pub(crate) now_ms: i64,
    next_reply: u64,
    pub(crate) next_conn: u64,
    pub(crate) durable: BTreeMap<String, Record>,
}

impl Harness {
    pub(crate) fn new(config: CoreConfig) -> Self {
        Self::from_loaded(config, Loaded::default())
    }

    fn from_loaded(config: CoreConfig, loaded: Loaded) -> Self {
        let now_ms = 1_800_000_000_000;
        Self {
            core: Core::new(config, loaded, now_ms, 7),
            now_ms,
            next_reply: 1,
            next_conn: 1,
            durable: BTreeMap::new(),
        }
    }

    /// A new core built from what this one committed, as after a gateway restart.
    fn restarted(&self, config: CoreConfig) -> Self {
        let entries: Vec<(String, Vec<u8>)> =
            self.durable.values().map(|r| r.encode().unwrap()).filter_map(|e| e.value.map(|v| (e.key, v))).collect();
        Self::from_loaded(config, Loaded::decode(entries).unwrap())
    }

    pub(crate) fn step(&mut self, input: Input) -> Effects {
        let mut fx = Effects::default();
        self.core.step(input, self.now_ms, &mut fx);
        for record in &fx.persist {
            self.durable.insert(record.key(), record.clone());
        }
        fx
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now_ms += i64::try_from(by.as_millis()).unwrap();
    }

    fn submit(&mut self, text: &str) -> String {
        let reply = self.next_reply;
        self.next_reply += 1;
        let fx = self.step(Input::Submit { spec: spec(text), reply });
        match &fx.replies[..] {
            [(r, Ok(Reply::Submitted { job, created: true }))] if *r == reply => job.id.clone(),
            other => panic!("expected a created job, got {other:?}"),
        }
    }

    fn connect(&mut self, cluster: &str, instance: &str) -> (ConnId, Effects) {
        let conn = self.next_conn;
        self.next_conn += 1;
        let hello = AgentHello { info: info(cluster), instance_id: instance.into(), agent_version: "test".into() };
        let fx = self.step(Input::AgentHello { conn, hello, reply: 0 });
        (conn, fx)
    }

    fn event(&mut self, conn: ConnId, event: AgentEvent) -> Effects {
        self.step(Input::Agent { conn, event })
    }

    fn state(&self, id: &str) -> JobState {
        self.core.job(id).unwrap().state
    }

    fn job(&self, id: &str) -> JobRecord {
        JobRecord::clone(self.core.job(id).unwrap())
    }

    /// A connected one-node cluster with a job offered to it.
    fn offered(&mut self) -> (String, ConnId) {
        let (conn, _) = self.connect("east", "a1");
        self.event(conn, inventory(&[8]));
        let id = self.submit(JOB);
        let fx = self.step(Input::Round);
        assert!(
            fx.sends
                .iter()
                .any(|(c, m)| *c == conn
                    && matches!(m, GatewayCommand::Offer(a) if a.job_id == id && a.fencing_token == 1)),
            "{:?}",
            fx.sends
        );
        (id, conn)
    }

    fn running(&mut self) -> (String, ConnId) {
        let (id, conn) = self.offered();
        self.event(
            conn,
            AgentEvent::OfferReply {
                job_id: id.clone(),
                fencing_token: 1,
                accepted: true,
                reason: String::new(),
                permanent: false,
            },
        );
        self.event(conn, AgentEvent::Status(report(&id, 1, JobState::Running)));
        assert_eq!(self.state(&id), JobState::Running);
        (id, conn)
    }
}

fn sends_to(fx: &Effects, conn: ConnId) -> Vec<&GatewayCommand> {
    fx.sends.iter().filter(|(c, _)| *c == conn).map(|(_, m)| m).collect()
}

pub(crate) fn persisted_job<'a>(fx: &'a Effects, id: &str) -> Option<&'a JobRecord> {
    fx.persist.iter().rev().find_map(|r| match r {
        Record::Job(job) if job.id == id => Some(job),
        _ => None,
    })
}

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
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8]));
    let id = h.submit(JOB);
    let fx = h.step(Input::Round);
    let offered = persisted_job(&fx, &id).unwrap();
    assert_eq!(
        (offered.state, offered.fencing_token, offered.gpu_type.as_deref()),
        (JobState::Offered, 1, Some("h100"))
    );
    assert!(fx.persist.iter().any(|r| matches!(r, Record::Decision(j, d) if *j == id && !d.candidates.is_empty())));
    match sends_to(&fx, conn)[..] {
        [GatewayCommand::Offer(a)] => assert_eq!(a.spec.gang.resources.gpu_types, vec!["h100".to_string()]),
        ref other => panic!("{other:?}"),
    }
}

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
    h.event(
        conn,
        AgentEvent::OfferReply {
            job_id: id.clone(),
            fencing_token: 1,
            accepted: false,
            reason: "node dgx-0 is draining".into(),
            permanent: false,
        },
    );
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
    h.event(
        conn,
        AgentEvent::OfferReply {
            job_id: id.clone(),
            fencing_token: 1,
            accepted: false,
            reason: slurm_said.into(),
            permanent: true,
        },
    );
    let job = h.job(&id);
    assert_eq!(job.state, JobState::Failed);
    assert!(job.finished_at_ms.is_some());
    assert!(job.message.contains(slurm_said), "{}", job.message);
}

#[test]
fn a_report_with_a_stale_token_is_cancelled_not_applied() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    h.event(
        conn,
        AgentEvent::OfferReply {
            job_id: id.clone(),
            fencing_token: 1,
            accepted: true,
            reason: String::new(),
            permanent: false,
        },
    );
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
fn a_late_acceptance_of_a_cancelled_job_is_stopped() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.offered();
    h.step(Input::Cancel { job_id: id.clone(), reply: 3 });
    let fx = h.event(
        conn,
        AgentEvent::OfferReply {
            job_id: id.clone(),
            fencing_token: 1,
            accepted: true,
            reason: String::new(),
            permanent: false,
        },
    );
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Cancel { .. }]));
    assert_eq!(h.state(&id), JobState::Cancelled);
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
    h.event(conn, inventory(&[8]));
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
    h.event(conn, inventory(&[8]));
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

fn accept(id: &str, token: u64) -> AgentEvent {
    AgentEvent::OfferReply {
        job_id: id.to_string(),
        fencing_token: token,
        accepted: true,
        reason: String::new(),
        permanent: false,
    }
}

#[test]
fn an_unanswered_offer_is_withdrawn_and_placed_again_only_once_the_member_confirms_it_stopped() {
    let mut h = Harness::new(CoreConfig { offer_timeout: Duration::from_secs(5), ..Default::default() });
    let (id, conn) = h.offered();
    h.advance(Duration::from_secs(6));
    h.event(conn, inventory(&[8]));
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
    let decline = AgentEvent::OfferReply {
        job_id: id.clone(),
        fencing_token: 1,
        accepted: false,
        reason: "full".into(),
        permanent: false,
    };
    h.event(conn, decline);
    assert_eq!(h.state(&id), JobState::Queued);
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
    h.event(west, inventory(&[8]));
    h.step(Input::AgentGone { conn: east });
    assert_eq!(h.state(&id), JobState::Unknown, "the agent may have accepted and started it");
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, west).is_empty(), "never offered elsewhere while east may run it");
    h.advance(Duration::from_secs(59));
    h.event(west, inventory(&[8]));
    h.step(Input::Tick);
    let fx = h.step(Input::Round);
    assert!(sends_to(&fx, west).is_empty(), "not before the lost-job timeout");
    h.advance(Duration::from_secs(1));
    h.event(west, inventory(&[8]));
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
fn an_offer_in_flight_at_a_restart_is_adopted_when_its_member_runs_it() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, _) = h.offered();
    let mut restarted = h.restarted(CoreConfig::default());
    assert_eq!(restarted.state(&id), JobState::Unknown, "an offer in flight may have started");
    let (conn, fx) = restarted.connect("east", "a1");
    assert!(
        matches!(sends_to(&fx, conn)[..], [GatewayCommand::Welcome { bound, .. }] if bound.len() == 1 && bound[0].job_id == id)
    );
    restarted.event(conn, inventory(&[0]));
    let fx = restarted.step(Input::Round);
    assert!(sends_to(&fx, conn).is_empty(), "not offered again");
    restarted.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Running)] });
    assert_eq!(restarted.state(&id), JobState::Running);
    assert_eq!(restarted.job(&id).fencing_token, 1, "the same binding: adopted, not re-run");
}

#[test]
fn a_binding_being_stopped_is_neither_missing_nor_changed() {
    let mut h = Harness::new(CoreConfig::default());
    let (id, conn) = h.running();
    h.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&id, 1, JobState::Unknown)] });
    assert_eq!(h.state(&id), JobState::Running, "listed: the member still holds it");
}

#[test]
fn a_job_lost_with_its_cluster_is_placed_again_only_after_the_timeout_counted_from_last_contact() {
    let mut h = Harness::new(lost_after_a_minute());
    let (id, east) = h.running();
    let (west, _) = h.connect("west", "b1");
    h.advance(Duration::from_secs(11));
    h.event(west, inventory(&[8]));
    let fx = h.step(Input::Tick);
    assert_eq!(fx.close, vec![east], "a silent cluster's stream is dropped");
    assert_eq!(h.state(&id), JobState::Unknown);
    // 60 s after east was last heard (t = 0), not after it was noticed silent (t = 11).
    h.advance(Duration::from_secs(48));
    h.event(west, inventory(&[8]));
    h.step(Input::Tick);
    assert_eq!(h.state(&id), JobState::Unknown, "not before the timeout");
    h.advance(Duration::from_secs(1));
    h.event(west, inventory(&[8]));
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
fn one_round_never_offers_the_same_free_gpus_twice() {
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8]));
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
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 0]));
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
    assert!(explained.candidates.iter().flat_map(|c| &c.reasons).any(|r| r.contains("held for an older gang")));
    let short = h.submit(&job("short", 1));
    h.step(Input::Round);
    assert_eq!(h.state(&short), JobState::Offered, "backfill ends before the gang");
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
fn lists_are_paged_oldest_first_with_a_continue_token() {
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8]));
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(h.submit(&JOB.replace("name: j", &format!("name: j{i}"))));
        h.advance(Duration::from_millis(1));
    }
    let view = h.core.view();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = view.list(&JobFilter::default(), 3, after.as_deref());
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[test]
fn a_list_limited_to_a_tenant_set_pages_through_only_those_tenants() {
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8]));
    let mut mine = Vec::new();
    for (i, tenant) in ["a", "b", "c", "a", "b", "a", "c", "a"].iter().enumerate() {
        let id = h
            .submit(&JOB.replace("name: j", &format!("name: j{i}")).replace("tenant: t", &format!("tenant: {tenant}")));
        if *tenant != "b" {
            mine.push(id);
        }
        h.advance(Duration::from_millis(1));
    }
    let view = h.core.view();
    let filter = JobFilter { tenants: Some(["a".to_string(), "c".to_string()].into()), ..JobFilter::default() };
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = view.list(&filter, 2, after.as_deref());
        assert!(page.jobs.iter().all(|j| j.spec.tenant != "b"));
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, mine);
}

#[test]
fn jobs_that_fit_nowhere_are_explained_once_then_skipped_until_their_explanation_is_old() {
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 0]));
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
    h.event(conn, inventory(&[8, 8]));
    let fx = h.step(Input::Round);
    assert!(matches!(sends_to(&fx, conn)[..], [GatewayCommand::Offer(a)] if a.job_id == ids[0]), "{:?}", fx.sends);
}

mod properties {
    //! Random input sequences against a model of truthful agents.

    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Submit,
        Connect(usize),
        Gone(usize),
        Inventory(usize, u32),
        /// The agent answers its oldest unanswered offer.
        Answer(usize, bool),
        /// A held job finishes on its member.
        Finish(usize, bool),
        Heartbeat(usize),
        Cancel(usize),
        Advance(u64),
        Tick,
        Round,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => Just(Op::Submit),
            1 => (0..2usize).prop_map(Op::Connect),
            1 => (0..2usize).prop_map(Op::Gone),
            2 => (0..2usize, 0..3u32).prop_map(|(c, n)| Op::Inventory(c, n * 4)),
            3 => (0..2usize, any::<bool>()).prop_map(|(c, a)| Op::Answer(c, a)),
            2 => (0..2usize, any::<bool>()).prop_map(|(c, ok)| Op::Finish(c, ok)),
            2 => (0..2usize).prop_map(Op::Heartbeat),
            1 => (0..8usize).prop_map(Op::Cancel),
            2 => (1..400u64).prop_map(Op::Advance),
            2 => Just(Op::Tick),
            3 => Just(Op::Round),
        ]
    }

    /// What one member's agent holds: (job, token) → state, plus offers it has not answered.
    #[derive(Default)]
    struct Agent {
        conn: Option<ConnId>,
        held: BTreeMap<String, (u64, JobState)>,
        offers: Vec<(String, u64)>,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn no_job_runs_twice_tokens_grow_and_sends_follow_their_records(ops in proptest::collection::vec(op(), 1..120)) {
            let config = CoreConfig {
                offer_timeout: Duration::from_secs(30),
                cluster_timeout: Duration::from_secs(60),
                lost_job_timeout: Duration::from_secs(300),
                lease_margin: Duration::from_secs(30),
                ..Default::default()
            };
            let mut h = Harness::new(config);
            let names = ["east", "west"];
            let mut agents: Vec<Agent> = vec![Agent::default(), Agent::default()];
            let mut submitted: Vec<String> = Vec::new();
            let mut tokens: HashMap<String, u64> = HashMap::new();
            let mut offered: HashMap<String, u64> = HashMap::new();
            let mut seq = 0;
            for op in ops {
                let input = match op {
                    Op::Submit => Input::Submit { spec: spec(JOB), reply: 1 },
                    Op::Connect(c) => {
                        if let Some(old) = agents[c].conn.take() {
                            h.step(Input::AgentGone { conn: old });
                        }
                        let conn = h.next_conn;
                        h.next_conn += 1;
                        agents[c].conn = Some(conn);
                        let hello = AgentHello { info: info(names[c]), instance_id: format!("i{c}"), agent_version: String::new() };
                        Input::AgentHello { conn, hello, reply: 2 }
                    }
                    Op::Gone(c) => match agents[c].conn.take() {
                        Some(conn) => Input::AgentGone { conn },
                        None => continue,
                    },
                    Op::Inventory(c, free) => match agents[c].conn {
                        Some(conn) => Input::Agent { conn, event: inventory(&[free]) },
                        None => continue,
                    },
                    Op::Answer(c, accept) => {
                        let Some(conn) = agents[c].conn else { continue };
                        if agents[c].offers.is_empty() { continue; }
                        let (job, token) = agents[c].offers.remove(0);
                        if accept {
                            agents[c].held.insert(job.clone(), (token, JobState::Running));
                        }
                        Input::Agent { conn, event: AgentEvent::OfferReply { job_id: job, fencing_token: token, accepted: accept, reason: String::new(), permanent: false } }
                    }
                    Op::Finish(c, ok) => {
                        let Some(conn) = agents[c].conn else { continue };
                        let Some((job, (token, _))) = agents[c].held.iter().find(|(_, (_, s))| *s == JobState::Running).map(|(j, t)| (j.clone(), *t)) else { continue };
                        let state = if ok { JobState::Succeeded } else { JobState::Failed };
                        agents[c].held.insert(job.clone(), (token, state));
                        Input::Agent { conn, event: AgentEvent::Status(report(&job, token, state)) }
                    }
                    Op::Heartbeat(c) => {
                        let Some(conn) = agents[c].conn else { continue };
                        seq += 1;
                        let jobs = agents[c].held.iter().map(|(j, (t, s))| report(j, *t, *s)).collect();
                        Input::Agent { conn, event: AgentEvent::Heartbeat { seq, jobs } }
                    }
                    Op::Cancel(i) => match submitted.get(i) {
                        Some(id) => Input::Cancel { job_id: id.clone(), reply: 3 },
                        None => continue,
                    },
                    Op::Advance(secs) => { h.advance(Duration::from_secs(secs)); continue; }
                    Op::Tick => Input::Tick,
                    Op::Round => Input::Round,
                };
                let durable_before = h.durable.clone();
                let fx = h.step(input);
                // Every send is justified by state durable no later than this step.
                for (conn, command) in &fx.sends {
                    match command {
                        GatewayCommand::Offer(a) => {
                            let record = persisted_job(&fx, &a.job_id);
                            prop_assert!(record.is_some_and(|j| j.state == JobState::Offered && j.fencing_token == a.fencing_token), "offer without its record: {a:?}");
                            let previous = offered.insert(a.job_id.clone(), a.fencing_token);
                            prop_assert!(previous.is_none_or(|p| a.fencing_token > p), "offer tokens must strictly increase: {previous:?} then {}", a.fencing_token);
                        }
                        GatewayCommand::Ack { job_id, fencing_token } => {
                            let now = persisted_job(&fx, job_id).cloned().or_else(|| match durable_before.get(&format!("jobs/{job_id}")) {
                                Some(Record::Job(j)) => Some(j.clone()),
                                _ => None,
                            });
                            let stale = now.as_ref().is_none_or(|j| j.fencing_token != *fencing_token || j.state == JobState::Queued);
                            prop_assert!(stale || now.is_some_and(|j| j.state.is_terminal()), "ack before the result is durable");
                        }
                        _ => {}
                    }
                    // Deliver to the model agent.
                    let Some(agent) = agents.iter_mut().find(|a| a.conn == Some(*conn)) else { continue };
                    match command {
                        GatewayCommand::Offer(a) => agent.offers.push((a.job_id.clone(), a.fencing_token)),
                        GatewayCommand::Cancel { job_id, fencing_token } => {
                            if agent.held.get(job_id).is_some_and(|(t, _)| t <= fencing_token) {
                                agent.held.remove(job_id);
                            }
                            agent.offers.retain(|(j, t)| !(j == job_id && t <= fencing_token));
                        }
                        GatewayCommand::Ack { job_id, fencing_token } => {
                            if agent.held.get(job_id).is_some_and(|(t, s)| t == fencing_token && s.is_terminal()) {
                                agent.held.remove(job_id);
                            }
                        }
                        GatewayCommand::Welcome { bound, .. } => {
                            let keep: BTreeSet<(String, u64)> = bound.iter().map(|a| (a.job_id.clone(), a.fencing_token)).collect();
                            agent.held.retain(|j, (t, s)| s.is_terminal() || keep.contains(&(j.clone(), *t)));
                            agent.offers.clear();
                        }
                        GatewayCommand::Lease { .. } | GatewayCommand::Logs { .. } => {}
                    }
                }
                for conn in &fx.close {
                    for agent in agents.iter_mut().filter(|a| a.conn == Some(*conn)) {
                        agent.conn = None;
                    }
                }
                for (_, reply) in &fx.replies {
                    if let Ok(Reply::Submitted { job, created: true }) = reply {
                        prop_assert!(persisted_job(&fx, &job.id).is_some(), "a 201 for a record not persisted in its step");
                        submitted.push(job.id.clone());
                    }
                }
                h.core.check_indexes();
                // Tokens never go back.
                for record in &fx.persist {
                    if let Record::Job(job) = record {
                        let seen = tokens.entry(job.id.clone()).or_insert(0);
                        prop_assert!(job.fencing_token >= *seen, "token went back for {}", job.id);
                        *seen = job.fencing_token;
                    }
                }
                // No job is held running under its current token by two members.
                for id in &submitted {
                    let Some(job) = h.core.job(id) else { continue };
                    let current = agents
                        .iter()
                        .filter(|a| a.held.get(id).is_some_and(|(t, s)| *t == job.fencing_token && *s == JobState::Running))
                        .count();
                    prop_assert!(current <= 1, "job {id} runs on {current} members under token {}", job.fencing_token);
                    if job.state.is_terminal() && job.state != JobState::Cancelled {
                        prop_assert!(current == 0, "job {id} finished at the gateway but still runs");
                    }
                }
            }
        }
    }
}

/// Runs `text` on `conn`'s cluster: submitted, offered by a round, accepted and reported running.
fn run_on(h: &mut Harness, conn: ConnId, text: &str) -> String {
    let id = h.submit(text);
    let fx = h.step(Input::Round);
    let token = fx
        .sends
        .iter()
        .find_map(|(c, m)| match m {
            GatewayCommand::Offer(a) if *c == conn && a.job_id == id => Some(a.fencing_token),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{id} was not offered: {:?}", fx.sends));
    h.event(
        conn,
        AgentEvent::OfferReply {
            job_id: id.clone(),
            fencing_token: token,
            accepted: true,
            reason: String::new(),
            permanent: false,
        },
    );
    h.event(conn, AgentEvent::Status(report(&id, token, JobState::Running)));
    assert_eq!(h.state(&id), JobState::Running);
    id
}

#[test]
fn the_federation_queue_charges_a_tenant_for_its_dominant_resource() {
    // Two 8-GPU nodes of 96 cores: 16 GPUs and 192 cores in all.
    let mut h = Harness::new(CoreConfig::default());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8]));
    // `cores` holds 1 GPU (6 %) but 72 cores (37.5 %); `gpus` holds 4 GPUs (25 %) and no cores.
    let cores = "name: c\ntenant: cores\ngang: {replicas: 1, resources: {gpus: 1, cpu: 72}}\npayload: {command: [x]}\n";
    run_on(&mut h, conn, cores);
    h.event(conn, inventory(&[7, 8]));
    let gpus = "name: g\ntenant: gpus\ngang: {replicas: 1, resources: {gpus: 4}}\npayload: {command: [x]}\n";
    run_on(&mut h, conn, gpus);
    // One GPU left. Counting GPUs, `cores` (1) would go before `gpus` (4); by dominant share
    // `gpus` (25 %) goes before `cores` (72 of 192 cores: 37.5 %).
    h.event(conn, inventory(&[0, 1]));
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

#[test]
fn the_registry_snapshot_follows_new_inventories_prices_and_pressure() {
    use crate::registry::{Link, Registry};
    use meridian_proto::inventory::QueuePressure;
    let network = Arc::new(meridian_placement::NetworkTable::default());
    let speeds = BTreeMap::new();
    let free_of = |registry: &Registry| {
        let snapshot = registry.snapshot(&network, &speeds);
        snapshot.clusters[0].inventory().gpus_free()
    };
    let mut registry = Registry::default();
    registry.connect(info("a"), Link { conn: 1, instance: "i".into() }, 0);
    let AgentEvent::Inventory(busy) = inventory(&[0, 8]) else { unreachable!() };
    let AgentEvent::Inventory(idle) = inventory(&[8, 8]) else { unreachable!() };
    registry.entry_of_mut(1).unwrap().set_inventory(busy);
    assert_eq!(free_of(&registry), 8);
    // A round's reservation changes only that round's copy.
    let mut round = registry.snapshot(&network, &speeds);
    assert!(round.clusters[0].reserve(&spec(JOB)));
    assert_eq!(round.clusters[0].inventory().gpus_free(), 0);
    assert_eq!(free_of(&registry), 8);
    // A new report is seen by the next snapshot.
    registry.entry_of_mut(1).unwrap().set_inventory(idle);
    assert_eq!(free_of(&registry), 16);
    // So are new prices from a reconnecting agent, and new pressure.
    let mut dearer = info("a");
    dearer.prices.insert("h100".into(), 9.0);
    registry.connect(dearer, Link { conn: 2, instance: "i".into() }, 0);
    registry.entry_of_mut(2).unwrap().pressure =
        Arc::new(QueuePressure { estimated_wait_secs: 42, ..Default::default() });
    let snapshot = registry.snapshot(&network, &speeds);
    assert_eq!(snapshot.clusters[0].info().prices["h100"], 9.0);
    assert_eq!(snapshot.clusters[0].pressure.estimated_wait_secs, 42);
    assert!(snapshot.clusters[0].connected);
}

/// A job of `tenant` taking `gpus` GPUs on one node.
fn job_of(tenant: &str, gpus: u32) -> String {
    format!(
        "name: j\ntenant: {tenant}\ngang: {{replicas: 1, resources: {{gpus: {gpus}}}}}\npayload: {{command: [x]}}\n"
    )
}

fn with_quota(tenant: &str, quota: TenantQuota) -> CoreConfig {
    CoreConfig { quotas: BTreeMap::from([(tenant.to_string(), quota)]), ..Default::default() }
}

/// The jobs a round offered, in order.
fn offers(fx: &Effects) -> Vec<String> {
    fx.sends
        .iter()
        .filter_map(|(_, m)| match m {
            GatewayCommand::Offer(a) => Some(a.job_id.clone()),
            _ => None,
        })
        .collect()
}

fn summary(h: &mut Harness, id: &str) -> String {
    h.core.view().explain(id).unwrap().summary
}

#[test]
fn a_job_over_the_gpu_quota_waits_with_the_quota_explanation_and_starts_once_its_tenant_frees_gpus() {
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() }));
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8]));
    let first = run_on(&mut h, conn, &job_of("nlp", 8));
    h.event(conn, inventory(&[0, 8]));
    let second = h.submit(&job_of("nlp", 2));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "8 GPUs are free, but the tenant holds its 8: {:?}", offers(&fx));
    assert_eq!(h.state(&second), JobState::Queued);
    assert_eq!(
        summary(&mut h, &second),
        "waiting for quota: tenant nlp holds 8 of its 8 GPUs (tenants.nlp.quota.maxGpus); \
         this job needs 2 more, so 2 must be released first"
    );
    // Waiting is not failing: later rounds leave it queued with the same explanation.
    h.advance(Duration::from_secs(60));
    assert!(offers(&h.step(Input::Round)).is_empty());
    assert!(summary(&mut h, &second).contains("maxGpus"));

    h.event(conn, AgentEvent::Status(report(&first, 1, JobState::Succeeded)));
    h.event(conn, inventory(&[8, 8]));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [second.as_str()]);
    assert_eq!(h.state(&second), JobState::Offered);
    h.core.check_indexes();
}

#[test]
fn the_gpu_quota_counts_offers_made_earlier_in_the_same_round() {
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() }));
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8, 8]));
    let a = h.submit(&job_of("nlp", 4));
    let b = h.submit(&job_of("nlp", 4));
    let c = h.submit(&job_of("nlp", 4));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [a, b]);
    assert!(summary(&mut h, &c).contains("holds 8 of its 8 GPUs"), "{}", summary(&mut h, &c));
}

#[test]
fn other_tenants_are_not_held_back_by_a_tenants_quota() {
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() }));
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8, 8]));
    run_on(&mut h, conn, &job_of("nlp", 8));
    h.event(conn, inventory(&[0, 8, 8]));
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
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8, 8]));
    let big = h.submit(&job_of("big", 8));
    let small = h.submit(&job_of("small", 4));
    let small_more = h.submit(&job_of("small", 1));
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [big, small]);
    assert!(summary(&mut h, &small_more).contains("(defaultQuota.maxGpus)"), "{}", summary(&mut h, &small_more));
}

#[test]
fn a_gang_larger_than_the_whole_gpu_quota_is_refused_at_submit() {
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() }));
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8]));
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
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8, 8, 8]));
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
            summary(&mut h, waiting),
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
    let mut h = Harness::new(with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() }));
    let (east, _) = h.connect("east", "a1");
    h.event(east, inventory(&[8]));
    let lost = run_on(&mut h, east, &job_of("nlp", 8));
    h.step(Input::AgentGone { conn: east });
    assert_eq!(h.state(&lost), JobState::Unknown);
    let (west, _) = h.connect("west", "b1");
    h.event(west, inventory(&[8]));
    let next = h.submit(&job_of("nlp", 8));
    let fx = h.step(Input::Round);
    assert!(offers(&fx).is_empty(), "the Unknown job may still hold its 8 GPUs");
    assert!(summary(&mut h, &next).contains("holds 8 of its 8 GPUs"), "{}", summary(&mut h, &next));
}

#[test]
fn a_restarted_core_counts_the_gpus_its_tenants_held() {
    let config = with_quota("nlp", TenantQuota { max_gpus: Some(8), ..Default::default() });
    let mut h = Harness::new(config.clone());
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8]));
    let running = run_on(&mut h, conn, &job_of("nlp", 8));
    let waiting = h.submit(&job_of("nlp", 8));
    h.step(Input::Round);
    let mut restarted = h.restarted(config);
    let (conn, _) = restarted.connect("east", "a2");
    restarted.event(conn, inventory(&[0, 8]));
    let fx = restarted.step(Input::Round);
    assert!(offers(&fx).is_empty(), "the running job still holds the tenant's 8 GPUs");
    assert_eq!(restarted.state(&waiting), JobState::Queued);
    assert!(summary(&mut restarted, &waiting).contains("maxGpus"));
    // Its cluster reports it finished: the waiting job goes.
    restarted.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![report(&running, 1, JobState::Succeeded)] });
    restarted.event(conn, inventory(&[8, 8]));
    assert_eq!(restarted.state(&running), JobState::Succeeded);
    assert_eq!(offers(&restarted.step(Input::Round)), [waiting]);
}

#[test]
fn a_gang_over_its_gpu_quota_does_not_hold_a_cluster_against_other_tenants() {
    let mut config = with_quota("nlp", TenantQuota { max_gpus: Some(16), ..Default::default() });
    config.placement.hold_after_secs = 0.0;
    let mut h = Harness::new(config);
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8, 8, 8]));
    run_on(&mut h, conn, &job_of("nlp", 8));
    h.event(conn, inventory(&[0, 8, 0]));
    // Over quota (8 held + 16 > 16), and it does not fit now either: without the quota it would
    // hold east, and a 10-hour job of another tenant could not take the free node.
    let gang =
        h.submit("name: gang\ntenant: nlp\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n");
    h.step(Input::Round);
    assert!(summary(&mut h, &gang).contains("maxGpus"), "{}", summary(&mut h, &gang));
    let long = h.submit(
        "name: long\ntenant: vision\ngang: {replicas: 1, resources: {gpus: 8}}\nruntime: {estimate: 10h}\n\
         payload: {command: [x]}\n",
    );
    let fx = h.step(Input::Round);
    assert_eq!(offers(&fx), [long.as_str()]);
}

fn used(job: &str, gpu_utilization: f64) -> JobReport {
    let usage = meridian_proto::protocol::GpuUsage { gpu_utilization, window: Duration::from_secs(60), samples: 6 };
    JobReport { usage: Some(usage), ..report(job, 1, JobState::Running) }
}

#[test]
fn a_running_job_whose_gpus_stay_under_the_threshold_becomes_idle_and_a_busy_sample_clears_it() {
    let idle_gpu = crate::IdleGpuConfig { threshold: 0.05, after: Duration::from_secs(120) };
    let mut h = Harness::new(CoreConfig { idle_gpu, ..Default::default() });
    let (id, conn) = h.running();
    let job = h.job(&id);
    assert_eq!(h.core.view().usage(&job, h.now_ms), None, "unknown before a sample");
    h.event(conn, AgentEvent::Heartbeat { seq: 1, jobs: vec![used(&id, 0.02)] });
    let first_low = h.now_ms;
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert_eq!((seen.gpu_utilization, seen.idle), (0.02, false));
    h.advance(Duration::from_secs(60));
    // A heartbeat without a sample keeps the streak; one more low sample does not restart it.
    h.event(conn, AgentEvent::Heartbeat { seq: 2, jobs: vec![report(&id, 1, JobState::Running)] });
    h.event(conn, AgentEvent::Heartbeat { seq: 3, jobs: vec![used(&id, 0.01)] });
    h.advance(Duration::from_secs(60));
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert!(seen.idle, "{seen:?}");
    assert_eq!(seen.idle_since_ms, Some(first_low));
    assert_eq!(h.core.view().usages(h.now_ms).count(), 1);
    h.event(conn, AgentEvent::Heartbeat { seq: 4, jobs: vec![used(&id, 0.9)] });
    let seen = h.core.view().usage(&job, h.now_ms).unwrap();
    assert_eq!((seen.gpu_utilization, seen.idle, seen.idle_since_ms), (0.9, false, None));
    // Once the job ends its usage is gone.
    h.event(conn, AgentEvent::Status(report(&id, 1, JobState::Succeeded)));
    assert_eq!(h.core.view().usage(&h.job(&id), h.now_ms), None);
    assert_eq!(h.core.view().usages(h.now_ms).count(), 0);
}

#[test]
fn tenants_show_what_they_hold_and_wait_for_against_their_configured_weight_and_quota() {
    let mut config = CoreConfig::default();
    config.tenant_weights.insert("nlp".into(), 3.0);
    config.quotas.insert("vision".into(), crate::TenantQuota { max_gpus: Some(16), max_queued_jobs: None });
    let mut h = Harness::new(config);
    let (conn, _) = h.connect("east", "a1");
    h.event(conn, inventory(&[8]));
    let first = h.submit(JOB);
    let second = h.submit(&JOB.replace("name: j", "name: k"));
    h.step(Input::Round);
    assert_eq!((h.state(&first), h.state(&second)), (JobState::Offered, JobState::Queued));
    let tenants = h.core.view().tenants();
    let by_name =
        |name: &str| tenants.iter().find(|t| t.tenant == name).unwrap_or_else(|| panic!("{name}: {tenants:?}"));
    // Configured tenants are listed without jobs, with their weight and quota.
    let nlp = by_name("nlp");
    assert_eq!((nlp.weight, nlp.fair_share, nlp.running_jobs, nlp.queued_jobs), (3.0, 0.0, 0, 0));
    assert_eq!(by_name("vision").max_gpus, Some(16));
    // The only tenant with work gets the whole fair share and holds every GPU held.
    let t = by_name("t");
    assert_eq!((t.weight, t.fair_share, t.gpu_share), (1.0, 1.0, 1.0));
    assert_eq!((t.running_jobs, t.running_gpus, t.queued_jobs, t.queued_gpus), (1, 8, 1, 8));
    assert_eq!(t.max_gpus, None);
}
