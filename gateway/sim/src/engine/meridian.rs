//! The `meridian` policy: the gateway's own core ([`meridian_core::Core`]) driven in virtual
//! time, with one simulated agent per member cluster speaking the agent protocol to it.
//!
//! Nothing of the gateway is re-implemented here. Jobs are submitted to the core; the core runs
//! its placement rounds (fair-share queue, holds, late binding), offers jobs with fencing tokens,
//! and applies what the agents answer and report. What is simulated are the agents. Each one:
//! - says hello once (instance id = cluster name) and never loses its stream;
//! - reports its member's inventory when it changed and its queue pressure whenever time passed,
//!   both from the member's [`BuiltinScheduler`](meridian_scheduler::BuiltinScheduler), as
//!   an agent's reports carry them;
//! - answers an offer as a real agent does ([`meridian_scheduler::offer`], shared with the live
//!   agent), submitting through the scheduler's `start_now`, the gateway's offer path: accepted
//!   when the whole gang starts now (or, for staged data, is reserved now), else declined with
//!   the scheduler's reason;
//! - reports `Running` when a job starts and `Succeeded` when it ends, and forgets a result when
//!   the core acknowledges it;
//! - stops a binding the core cancels, as a real agent does (the replay then fails its books:
//!   nothing cancels in a replay unless something is wrong).
//!
//! **Data staging.** A job offered to a cluster outside its dataset's region is accepted at once
//! and reported `Bound` ("staging data") while its dataset is copied. Its GPUs are reserved on the
//! member for the copy: the agent starts it on the scheduler at offer time with a run time of copy
//! plus job, so the member's inventory and release profile show the GPUs taken until it ends. It
//! counts as started (and reports `Running`) when the data lands; its GPU-seconds, cost and
//! queueing delay count from then.
//!
//! Not simulated: heartbeats, leases, broken streams and the store. Streams never break, so the
//! core's cluster and lost-job timeouts are set past any replay; the records the core asks to
//! persist are only counted.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use meridian_core::{ConnId, Core, CoreConfig, Effects, Input, Loaded, Reply, ReplyTo};
use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, JobReport};
use meridian_proto::spec::{
    BurstPolicy, DEFAULT_PRIORITY, DataRef, GangSpec, JobSpec, Payload, PlacementRules, Resources, RuntimeSpec,
};
use meridian_scheduler::Started;
use meridian_scheduler::offer::{self, Holdings};
use serde::Serialize;

mod agent;
mod copies;

use super::{Replay, SimConfig, invariant};
use crate::topology::Topology;
use crate::{SimError, SimJob};

/// Unix ms of virtual time 0: fixed, so job ids and every record repeat from run to run.
const EPOCH_MS: i64 = 1_500_000_000_000;

/// The core's `id_salt`: fixed for the same reason.
const ID_SALT: u16 = 0x5153;

/// Longer than any replay: simulated streams never break, so no cluster goes silent and no job
/// is lost with its cluster.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What crossed the agent protocol in one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayCounts {
    /// Offers the core sent.
    pub offers: u64,
    /// Offers the agents declined (the gang no longer fit, or would overtake a local queue).
    pub declined: u64,
    /// Accepted offers whose data had to be copied first.
    pub staged: u64,
    /// Cancels the core sent.
    pub cancels: u64,
    /// Records the core asked to persist.
    pub records: u64,
    /// Placement rounds run.
    pub rounds: u64,
    /// Start quotes the core asked of the agents.
    pub quotes: u64,
    /// Offers accepted to start by preempting lower-priority jobs on the member.
    pub preempting: u64,
    /// Sibling copies the core queued on members.
    pub copies: u64,
    /// Copies whose member was ready to start them and asked for the start lock.
    pub copies_ready: u64,
    /// Copies granted the start lock (each started its job).
    pub granted: u64,
}

/// The core and the simulated agents.
pub(super) struct Federation {
    core: Core,
    /// Core job id of each workload job, once submitted.
    ids: Vec<Option<String>>,
    /// Workload job of each core job id.
    jobs: HashMap<String, u32>,
    /// One agent per member cluster, in topology order; its stream is `index + 1`.
    agents: Vec<Agent>,
    next_reply: ReplyTo,
    pub(super) counts: GatewayCounts,
}

/// One simulated agent.
#[derive(Debug, Default)]
struct Agent {
    /// Bindings the member holds (staging or running): workload job → fencing token.
    held: BTreeMap<u32, u64>,
    /// Jobs whose data is being copied here, reserved on the scheduler since their offer.
    staging: HashMap<u32, Started>,
    /// Terminal results sent and not yet acknowledged: (workload job, token).
    outbox: BTreeSet<(u32, u64)>,
    /// When the agent last reported (virtual seconds).
    reported_at: Option<u64>,
    /// Start quotes worked out and not yet delivered: (asked at, the answer). Each reaches the
    /// gateway a second after it was asked (events are whole seconds apart; a real answer takes
    /// a round trip of milliseconds to a few seconds on Slurm), with a round of its own.
    quotes: Vec<(u64, AgentEvent)>,
    /// Sibling copies queued on the member: workload job → copy token.
    copies: HashMap<u32, u64>,
    /// Copies the member is ready to start (their nodes taken), awaiting the gateway's answer.
    ready: HashMap<u32, Started>,
}

impl Agent {
    /// What this agent holds of `job` for an offer or cancel of binding `fencing_token`. The
    /// lab's agents submit and stop at once: nothing is ever under way.
    fn holdings(&self, job: u32, fencing_token: u64) -> Holdings {
        Holdings {
            held: self.held.get(&job).map(|&token| (token, ())),
            finished: self.outbox.contains(&(job, fencing_token)).then_some(()),
            ..Holdings::default()
        }
    }
}

impl Federation {
    pub(super) fn new(topology: &Topology, config: &SimConfig, jobs: usize) -> Self {
        let mut placement = config.placement.clone();
        // The gateway knows the fleet's GPU speeds as an operator would configure them (the
        // `cheapest` baseline reads the same table), unless `--placement` gave its own.
        if placement.gpu_speed.is_empty() {
            placement.gpu_speed = topology.gpu_speed.clone();
        }
        let core_config = CoreConfig {
            placement,
            network: topology.network.clone(),
            cluster_timeout: NEVER,
            lost_job_timeout: NEVER,
            // With invariant checks (tests), finished jobs stay so they can be looked at;
            // otherwise they go after the production retention, bounding memory on long traces.
            retention: if config.check_invariants { NEVER } else { CoreConfig::default().retention },
            ..CoreConfig::default()
        };
        Self {
            core: Core::new(core_config, Loaded::default(), EPOCH_MS, ID_SALT),
            ids: vec![None; jobs],
            jobs: HashMap::new(),
            agents: topology.clusters.iter().map(|_| Agent::default()).collect(),
            next_reply: 1,
            counts: GatewayCounts::default(),
        }
    }

    /// Every agent's books are empty: each result was acknowledged, nothing is held.
    pub(super) fn check_settled(&self, topology: &Topology) -> Result<(), SimError> {
        for (agent, cluster) in self.agents.iter().zip(&topology.clusters) {
            if let Some(job) = agent.copies.keys().next() {
                return Err(invariant(format!(
                    "the agent of `{}` still holds a copy of job {job} at the end",
                    cluster.info.name
                )));
            }
            if let Some(job) = agent.held.keys().next().or_else(|| agent.outbox.first().map(|(j, _)| j)) {
                return Err(invariant(format!(
                    "the agent of `{}` still holds job {job} at the end ({} held, {} unacknowledged)",
                    cluster.info.name,
                    agent.held.len(),
                    agent.outbox.len()
                )));
            }
        }
        Ok(())
    }

    /// The core's record of workload job `job`: what the gateway knows of it.
    #[cfg(test)]
    pub(super) fn record_of(&self, job: u32) -> Option<&meridian_core::JobRecord> {
        let id = self.ids.get(job as usize)?.as_ref()?;
        self.core.job(id).map(|record| &**record)
    }

    /// Jobs the core remembers.
    #[cfg(test)]
    pub(super) fn core_job_count(&self) -> usize {
        self.core.job_count()
    }

    /// What the core last said about workload job `job`.
    pub(super) fn message_of(&self, job: u32) -> Option<String> {
        let id = self.ids.get(job as usize)?.as_ref()?;
        self.core.job(id).map(|record| format!("{} ({})", record.message, record.state))
    }
}

/// The core's answer to a caller.
type Answer = (ReplyTo, Result<Reply, meridian_core::Error>);

fn now_ms(secs: u64) -> i64 {
    EPOCH_MS.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX / 2).saturating_mul(1000))
}

fn conn_of(cluster: usize) -> ConnId {
    cluster as ConnId + 1
}

impl Replay<'_> {
    /// Every agent says hello and reports its member.
    pub(super) fn connect_agents(&mut self, now: u64) -> Result<(), SimError> {
        for (cluster, sim) in self.topology.clusters.iter().enumerate() {
            let hello = AgentHello {
                info: sim.info.clone(),
                instance_id: sim.info.name.clone(),
                agent_version: concat!("sim-", env!("CARGO_PKG_VERSION")).to_owned(),
            };
            let reply = self.next_reply();
            let replies = self.gateway_step(Input::AgentHello { conn: conn_of(cluster), hello, reply }, now)?;
            match replies.into_iter().find(|(r, _)| *r == reply) {
                Some((_, Ok(Reply::Attached))) => {}
                Some((_, Err(e))) => {
                    return Err(invariant(format!("the gateway refused the agent of `{}`: {e}", sim.info.name)));
                }
                _ => return Err(invariant(format!("the gateway did not answer the agent of `{}`", sim.info.name))),
            }
        }
        self.report_members(now)
    }

    /// A job arrives: it is submitted to the gateway, as a user would.
    pub(super) fn submit(&mut self, job: &SimJob, now: u64) -> Result<(), SimError> {
        let tenant = self.workload.tenants.get(job.tenant as usize).map_or("default", |t| t.name.as_str());
        let class = self.class_of(job.id);
        let spec = JobSpec {
            priority: class.priority,
            preemptible: class.preemptible,
            ..spec_of(job, tenant, self.config.burst_after_secs)
        };
        let reply = self.next_reply();
        let replies = self.gateway_step(Input::Submit { spec, reply }, now)?;
        let record = match replies.into_iter().find(|(r, _)| *r == reply) {
            Some((_, Ok(Reply::Submitted { job: record, .. }))) => record,
            Some((_, Err(e))) => return Err(SimError::Invalid(format!("the gateway refused job {}: {e}", job.id))),
            _ => return Err(invariant(format!("the gateway did not answer the submit of job {}", job.id))),
        };
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        if let Some(slot) = federation.ids.get_mut(job.id as usize) {
            *slot = Some(record.id.clone());
        }
        federation.jobs.insert(record.id.clone(), job.id);
        Ok(())
    }

    /// The gateway's turn at `now`: agents report what changed, timers run, then a placement
    /// round, and the agents answer its offers.
    pub(super) fn gateway_round(&mut self, now: u64) -> Result<(), SimError> {
        self.report_members(now)?;
        self.gateway_step(Input::Tick, now)?;
        if let Some(federation) = self.federation.as_mut() {
            federation.counts.rounds += 1;
        }
        self.gateway_step(Input::Round, now)?;
        Ok(())
    }

    /// The gateway's turns at `now` and the members' passes after them, until no copy waits for
    /// the gateway's answer (a ready copy holds its nodes; the live gateway runs a round at once).
    pub(super) fn gateway_rounds(&mut self, now: u64) -> Result<(), SimError> {
        for _ in 0..4 {
            let declined = self.federation.as_ref().map_or(0, |f| f.counts.declined);
            self.gateway_round(now)?;
            self.schedule(now)?;
            // A declined job is placed again at once, as the live gateway's next round would.
            let declined_now = self.federation.as_ref().is_some_and(|f| f.counts.declined > declined);
            if !self.copies_awaiting_grant() && !declined_now {
                return Ok(());
            }
        }
        if self.copies_awaiting_grant() {
            return Err(invariant(format!("copies still wait for the gateway's answer after 4 rounds at {now}s")));
        }
        Ok(())
    }

    /// A job held on `cluster` ended (the scheduler completed it): its agent reports success.
    pub(super) fn agent_job_ended(&mut self, cluster: usize, job: u32, now: u64) -> Result<(), SimError> {
        self.report_job(cluster, job, JobState::Succeeded, Vec::new(), now)
    }

    /// A job held on `cluster` started on room its victims left: its agent reports it running.
    pub(super) fn agent_job_started(
        &mut self,
        cluster: usize,
        job: u32,
        nodes: Vec<String>,
        now: u64,
    ) -> Result<(), SimError> {
        self.report_job(cluster, job, JobState::Running, nodes, now)
    }

    /// When the next start quote reaches the gateway: a second after the oldest unanswered one
    /// was asked.
    pub(super) fn next_quote_answer(&self) -> Option<u64> {
        let agents = &self.federation.as_ref()?.agents;
        agents.iter().flat_map(|a| a.quotes.iter().map(|(asked, _)| asked.saturating_add(1))).min()
    }

    /// Whether `job`'s data is being copied to `cluster` (its GPUs reserved there, not started).
    pub(super) fn staging_on(&self, cluster: usize, job: u32) -> bool {
        self.federation.as_ref().and_then(|f| f.agents.get(cluster)).is_some_and(|a| a.staging.contains_key(&job))
    }

    /// A job held on `cluster` was preempted: its agent reports it for requeue.
    pub(super) fn agent_job_preempted(&mut self, cluster: usize, job: u32, now: u64) -> Result<(), SimError> {
        if let Some(agent) = self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)) {
            // Its data copy, if any, lands for nothing (`data_landed` then finds nothing staged).
            agent.staging.remove(&job);
        }
        self.report(cluster, job, JobState::Failed, Vec::new(), true, now)
    }

    /// A staged job's data landed: it runs from now on the GPUs reserved for it.
    pub(super) fn data_landed(&mut self, job: u32, cluster: usize, now: u64) -> Result<(), SimError> {
        let staged =
            self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)).and_then(|a| a.staging.remove(&job));
        // Nothing staged: the binding was cancelled while its data was copied.
        let Some(started) = staged else { return Ok(()) };
        let nodes = started.nodes.clone();
        self.started(cluster, started, now)?;
        self.report_job(cluster, job, JobState::Running, nodes, now)
    }

    /// Members that changed report their inventory, and every busy member its pressure (whose
    /// release times move with the clock), as an agent's periodic report would; start quotes
    /// asked before now arrive.
    fn report_members(&mut self, now: u64) -> Result<(), SimError> {
        let at = Duration::from_secs(now);
        for cluster in 0..self.members.len() {
            let due: Vec<AgentEvent> = match self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)) {
                Some(agent) if !agent.quotes.is_empty() => {
                    let (due, later): (Vec<_>, Vec<_>) =
                        agent.quotes.drain(..).partition(|(asked, _)| asked.saturating_add(1) <= now);
                    agent.quotes = later;
                    due.into_iter().map(|(_, event)| event).collect()
                }
                _ => Vec::new(),
            };
            for event in due {
                self.gateway_step(Input::Agent { conn: conn_of(cluster), event }, now)?;
            }
        }
        for cluster in 0..self.members.len() {
            let dirty = self.dirty.get(cluster).copied().unwrap_or(false);
            let reported_at = self.federation.as_ref().and_then(|f| f.agents.get(cluster)).and_then(|a| a.reported_at);
            let Some(member) = self.members.get(cluster) else { continue };
            let idle = member.scheduler.next_completion().is_none() && member.scheduler.pending().next().is_none();
            if !dirty && (reported_at == Some(now) || (idle && reported_at.is_some())) {
                continue;
            }
            let mut events = Vec::with_capacity(2);
            if dirty || reported_at.is_none() {
                events.push(AgentEvent::Inventory(member.scheduler.inventory_for_offers()));
            }
            events.push(AgentEvent::Pressure(member.scheduler.pressure(at)));
            if let Some(flag) = self.dirty.get_mut(cluster) {
                *flag = false;
            }
            if let Some(agent) = self.federation.as_mut().and_then(|f| f.agents.get_mut(cluster)) {
                agent.reported_at = Some(now);
            }
            for event in events {
                self.gateway_step(Input::Agent { conn: conn_of(cluster), event }, now)?;
            }
        }
        Ok(())
    }

    /// An agent reports a job it holds; a terminal state goes to its outbox until acknowledged.
    fn report_job(
        &mut self,
        cluster: usize,
        job: u32,
        state: JobState,
        nodes: Vec<String>,
        now: u64,
    ) -> Result<(), SimError> {
        self.report(cluster, job, state, nodes, false, now)
    }

    /// [`report_job`](Self::report_job), or with `preempted` a preemption for requeue.
    fn report(
        &mut self,
        cluster: usize,
        job: u32,
        state: JobState,
        nodes: Vec<String>,
        preempted: bool,
        now: u64,
    ) -> Result<(), SimError> {
        let name = self.cluster_name(cluster).to_owned();
        let Some(federation) = self.federation.as_mut() else { return Ok(()) };
        let id = federation.ids.get(job as usize).cloned().flatten();
        let agent = federation.agents.get_mut(cluster);
        let (Some(id), Some(agent)) = (id, agent) else {
            return Err(invariant(format!("job {job} reported on `{name}` is unknown")));
        };
        let Some(&token) = agent.held.get(&job) else {
            return Err(invariant(format!("the agent of `{name}` reports job {job}, which it does not hold")));
        };
        if state.is_terminal() {
            agent.held.remove(&job);
            agent.outbox.insert((job, token));
        }
        let report =
            JobReport { nodes, requeue: preempted, preempted, ..offer::report(&id, token, state, String::new()) };
        self.gateway_step(Input::Agent { conn: conn_of(cluster), event: AgentEvent::Status(report) }, now)?;
        Ok(())
    }

    fn next_reply(&mut self) -> ReplyTo {
        let Some(federation) = self.federation.as_mut() else { return 0 };
        federation.next_reply += 1;
        federation.next_reply
    }

    /// Steps the core with `input` at `now`, delivers what it sends to the agents and steps what
    /// they answer, until nothing is left. Returns the replies to callers.
    fn gateway_step(&mut self, input: Input, now: u64) -> Result<Vec<Answer>, SimError> {
        let mut inputs = VecDeque::from([input]);
        let mut replies = Vec::new();
        while let Some(input) = inputs.pop_front() {
            let Some(federation) = self.federation.as_mut() else { break };
            let mut effects = Effects::default();
            federation.core.step(input, now_ms(now), &mut effects);
            // No store: every record is "durable" at once, so sends may go out right away.
            federation.counts.records += effects.persist.len() as u64;
            if let Some(&conn) = effects.close.first() {
                let cluster = usize::try_from(conn.saturating_sub(1)).unwrap_or(usize::MAX);
                return Err(invariant(format!("the gateway closed the stream of `{}`", self.cluster_name(cluster))));
            }
            replies.extend(effects.replies);
            for (conn, command) in effects.sends {
                let cluster = usize::try_from(conn.saturating_sub(1)).unwrap_or(usize::MAX);
                self.agent_hears(cluster, command, now, &mut inputs)?;
            }
        }
        Ok(replies)
    }
}

/// The job spec a user would have submitted for `job`.
pub fn spec_of(job: &SimJob, tenant: &str, burst_after_secs: u64) -> JobSpec {
    JobSpec {
        name: format!("job-{}", job.id),
        tenant: tenant.to_owned(),
        priority: DEFAULT_PRIORITY,
        preemptible: false,
        labels: BTreeMap::new(),
        idempotency_key: None,
        gang: GangSpec {
            replicas: job.replicas,
            resources: Resources {
                gpus: job.gpus_per_replica,
                gpu_types: job.gpu_type.iter().cloned().collect(),
                gpu_memory_gib: job.gpu_memory_gib,
                cpu: 0,
                memory_gib: 0,
            },
        },
        // Only the estimate: the gateway never learns the true run time.
        runtime: RuntimeSpec {
            estimate: HumanDuration::from_secs(job.estimate_secs),
            limit: None,
            deadline: job.deadline_secs.map(HumanDuration::from_secs),
        },
        data: job
            .dataset
            .iter()
            .map(|d| DataRef {
                uri: format!("s3://sim/job-{}", job.id),
                size_gib: d.size_gib,
                region: d.region.clone(),
            })
            .collect(),
        placement: PlacementRules {
            burst: BurstPolicy::After { after: HumanDuration::from_secs(burst_after_secs), max_usd_per_hour: None },
            ..PlacementRules::default()
        },
        payload: Payload { image: Some("sim".to_owned()), ..Payload::default() },
    }
}
