//! The core's behaviour, driven through `step` exactly as the runtime and the simulator drive it.
//!
//! [`Harness`] drives a core and keeps what it committed; the files below test one concept
//! each. Records the tests need (a cluster's hello, an inventory, a job report, a job spec) are
//! the shared fixtures of `meridian_proto::testing`.

mod agents;
mod copies;
mod durability;
mod offers;
mod properties;
mod quota;
mod quotes;
mod rounds;
mod tally;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand, JobReport};
use meridian_proto::testing::{JOB, cluster_info, hello, inventory, inventory_event, report, spec};

use crate::record::{self, JobRecord, Loaded, Record};
use crate::{ConnId, Core, CoreConfig, Effects, Error, Input, JobFilter, Reply, TenantQuota};

/// Drives a core the way the runtime does, keeping what was committed.
pub(crate) struct Harness {
    pub(crate) core: Core,
    pub(crate) now_ms: i64,
    next_reply: u64,
    next_conn: u64,
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

    /// The next stream id, for a stream the test opens itself.
    pub(crate) fn new_conn(&mut self) -> ConnId {
        let conn = self.next_conn;
        self.next_conn += 1;
        conn
    }

    /// Opens a stream and says `hello` on it.
    fn attach(&mut self, hello: AgentHello) -> (ConnId, Effects) {
        let conn = self.new_conn();
        let fx = self.step(Input::AgentHello { conn, hello, reply: 0 });
        (conn, fx)
    }

    /// Agent `instance` of `cluster` (the fixture cluster) connects.
    fn connect(&mut self, cluster: &str, instance: &str) -> (ConnId, Effects) {
        self.attach(hello(cluster, instance))
    }

    /// Cluster `east` connects (agent `a1`) with one 8-GPU node per entry of `free_gpus`, that
    /// many GPUs free.
    fn east(&mut self, free_gpus: &[u32]) -> ConnId {
        let (conn, _) = self.connect("east", "a1");
        self.event(conn, inventory_event(free_gpus));
        conn
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
        let conn = self.east(&[8]);
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
        self.event(conn, accept(&id, 1));
        self.event(conn, AgentEvent::Status(report(&id, 1, JobState::Running)));
        assert_eq!(self.state(&id), JobState::Running);
        (id, conn)
    }

    /// Runs `text` on `conn`'s cluster: submitted, offered by a round, accepted and reported
    /// running.
    fn run_on(&mut self, conn: ConnId, text: &str) -> String {
        let id = self.submit(text);
        let fx = self.step(Input::Round);
        let token = fx
            .sends
            .iter()
            .find_map(|(c, m)| match m {
                GatewayCommand::Offer(a) if *c == conn && a.job_id == id => Some(a.fencing_token),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{id} was not offered: {:?}", fx.sends));
        self.event(conn, accept(&id, token));
        self.event(conn, AgentEvent::Status(report(&id, token, JobState::Running)));
        assert_eq!(self.state(&id), JobState::Running);
        id
    }

    /// The summary of job `id`'s explanation.
    fn summary(&mut self, id: &str) -> String {
        self.core.view().explain(id).unwrap().summary
    }
}

/// An agent's acceptance of the offer of job `id` under `token`.
fn accept(id: &str, token: u64) -> AgentEvent {
    answer(id, token, true, "", false)
}

/// An agent's answer to the offer of job `id` under `token`: accepted, or declined for `reason`
/// (for good with `permanent`).
fn answer(id: &str, token: u64, accepted: bool, reason: &str, permanent: bool) -> AgentEvent {
    AgentEvent::OfferReply { job_id: id.to_string(), fencing_token: token, accepted, reason: reason.into(), permanent }
}

fn sends_to(fx: &Effects, conn: ConnId) -> Vec<&GatewayCommand> {
    fx.sends.iter().filter(|(c, _)| *c == conn).map(|(_, m)| m).collect()
}

/// The jobs a step offered, in order.
fn offers(fx: &Effects) -> Vec<String> {
    fx.sends
        .iter()
        .filter_map(|(_, m)| match m {
            GatewayCommand::Offer(a) => Some(a.job_id.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn persisted_job<'a>(fx: &'a Effects, id: &str) -> Option<&'a JobRecord> {
    fx.persist.iter().rev().find_map(|r| match r {
        Record::Job(job) if job.id == id => Some(job.as_ref()),
        _ => None,
    })
}

/// The timeouts of the property tests: offers time out after 30 s, silent clusters after 60 s,
/// lost jobs are placed again after 300 s, and agents hold a 270 s lease.
pub(crate) fn property_config() -> CoreConfig {
    CoreConfig {
        offer_timeout: Duration::from_secs(30),
        cluster_timeout: Duration::from_secs(60),
        lost_job_timeout: Duration::from_secs(300),
        lease_margin: Duration::from_secs(30),
        ..Default::default()
    }
}

/// A job of `tenant` taking `gpus` GPUs on one node.
fn job_of(tenant: &str, gpus: u32) -> String {
    format!(
        "name: j\ntenant: {tenant}\ngang: {{replicas: 1, resources: {{gpus: {gpus}}}}}\npayload: {{command: [x]}}\n"
    )
}
