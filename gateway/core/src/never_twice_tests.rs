//! "Never two copies", as a property: random faults against agents modelled on the real one.
//!
//! The model agents hold copies of jobs and enforce their lease in virtual time; the network
//! between them and the core delivers the gateway's messages late (a one-way cut), loses the
//! ones in flight (a dropped stream or a full buffer), and keeps delivering what was sent
//! before a stream the gateway closed. The property: at no step do two members run a copy of
//! one job, whatever its tokens. Two mutation runs show the checker is not vacuous: with the
//! core's rule 1 (an offer in flight is a possibly running job) or the agents' rule 2 (leases
//! only from fresh words) removed, an adversarial sequence that passes with both rules runs a
//! job twice. (A blind random search of 4,096 sequences did not reach those sequences: they
//! need a dozen steps in order, so they are spelled out.)
//!
//! The core also keeps jobs waiting as sibling copies on both members (`siblingCopies: 2`). A
//! model agent queues a copy, says at random that it is ready, and starts it only on the
//! gateway's grant; the second property is that no copy ever starts without a grant, and no
//! job is granted twice under one binding.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, GatewayCommand, JobReport};
use meridian_proto::testing::{JOB, hello, inventory_event, report, spec};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::tests::{Harness, property_config};
use crate::{ConnId, Input, Reply};

/// What the model agent does differently from the real one.
#[derive(Debug, Clone, Copy, Default)]
struct AgentRules {
    /// Rule 2 removed: welcomes and renewals grant a lease counted from when they arrive,
    /// however late.
    naive_leases: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Submit,
    Connect(usize),
    /// The stream breaks: what was in flight to the agent is lost, and both ends notice.
    Break(usize),
    /// The oldest message in flight to the agent arrives (all of them: `true`).
    Deliver(usize, bool),
    /// The oldest message in flight to the agent is lost (the gateway's buffer was full).
    Lose(usize),
    /// The agent's submit of its oldest offer returns: started (true) or declined; with
    /// `lost`, the answer is lost on the way.
    Answer {
        agent: usize,
        accept: bool,
        lost: bool,
    },
    Finish(usize, bool),
    /// The agent's scheduler is ready to start its oldest waiting copy and asks for the lock.
    CopyReady(usize),
    Heartbeat(usize),
    Inventory(usize, u32),
    Cancel(usize),
    Advance(u64),
    Tick,
    Round,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Submit),
        2 => (0..2usize).prop_map(Op::Connect),
        1 => (0..2usize).prop_map(Op::Break),
        3 => (0..2usize).prop_map(|c| Op::Deliver(c, false)),
        6 => (0..2usize).prop_map(|c| Op::Deliver(c, true)),
        1 => (0..2usize).prop_map(Op::Lose),
        3 => (0..2usize, any::<bool>(), any::<bool>()).prop_map(|(agent, accept, lost)| Op::Answer { agent, accept, lost }),
        1 => (0..2usize, any::<bool>()).prop_map(|(c, ok)| Op::Finish(c, ok)),
        3 => (0..2usize).prop_map(Op::CopyReady),
        3 => (0..2usize).prop_map(Op::Heartbeat),
        2 => (0..2usize, 1..3u32).prop_map(|(c, n)| Op::Inventory(c, n * 4)),
        1 => (0..8usize).prop_map(Op::Cancel),
        3 => (1..200u64).prop_map(Op::Advance),
        2 => Just(Op::Tick),
        3 => Just(Op::Round),
    ]
}

/// A copy of a job on a member: running, or its result waiting for the gateway's ack.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Held {
    Running,
    Result { state: JobState, requeue: bool },
}

/// A member agent as the real one behaves (see `member-agent/src/agent/`).
#[derive(Debug, Default)]
struct Agent {
    /// The stream the agent uses, if any.
    conn: Option<ConnId>,
    /// What the gateway sent on it that has not arrived yet.
    in_flight: VecDeque<GatewayCommand>,
    /// The gateway closed the stream: once `in_flight` is drained, the agent sees the end.
    closed: bool,
    welcomed: bool,
    hello_sent: i64,
    /// Heartbeats sent on the current stream: sequence → when.
    sent: BTreeMap<u64, i64>,
    /// job → (token, copy).
    held: BTreeMap<String, (u64, Held)>,
    /// Offers whose submit runs: job → token, oldest first by arrival.
    submitting: Vec<(String, u64)>,
    deadline: Option<i64>,
    expired: bool,
    /// Sibling copies queued here: job → (copy token, ready).
    copies: BTreeMap<String, (u64, bool)>,
    /// Copies started on a grant: (job, binding token).
    granted: Vec<(String, u64)>,
}

impl Agent {
    fn running(&self, job: &str) -> bool {
        self.held.get(job).is_some_and(|(_, copy)| *copy == Held::Running)
    }

    fn heartbeat_jobs(&self) -> Vec<JobReport> {
        let mut jobs: Vec<JobReport> = self
            .held
            .iter()
            .map(|(job, (token, copy))| match copy {
                Held::Running => report(job, *token, JobState::Running),
                Held::Result { state, requeue } => {
                    let mut result = report(job, *token, *state);
                    result.requeue = *requeue;
                    result
                }
            })
            .collect();
        jobs.extend(self.submitting.iter().map(|(job, token)| report(job, *token, JobState::Offered)));
        jobs
    }

    /// The lease ran out: every copy is stopped and reported failed for requeue, every submit
    /// too; no offer is taken until a new welcome.
    fn expire_if_due(&mut self, now: i64) -> bool {
        if self.expired || self.deadline.is_none_or(|deadline| deadline > now) {
            return false;
        }
        for (_, copy) in self.held.values_mut() {
            if *copy == Held::Running {
                *copy = Held::Result { state: JobState::Failed, requeue: true };
            }
        }
        for (job, token) in std::mem::take(&mut self.submitting) {
            self.held.insert(job, (token, Held::Result { state: JobState::Failed, requeue: true }));
        }
        self.expired = true;
        self.deadline = None;
        true
    }
}

/// Runs one random sequence; fails on two running copies of a job. Returns how many copies
/// were started on a grant.
fn run(ops: Vec<Op>, rules: AgentRules, mutate_core: bool) -> Result<usize, TestCaseError> {
    let mut config = property_config();
    config.placement.sibling_copies = 2;
    let lease_ms = i64::try_from(config.agent_lease().map_or(0, |l| l.as_millis())).unwrap_or(i64::MAX);
    let mut h = Harness::new(config);
    h.core.mutations.requeue_offers_on_loss = mutate_core;
    let names = ["east", "west"];
    let mut agents: Vec<Agent> = vec![Agent::default(), Agent::default()];
    let mut submitted: Vec<String> = Vec::new();
    let mut seq = 0u64;
    for op in ops {
        // Agents act on their own clock first: a lease ends at its deadline, not when the
        // agent next hears something.
        let mut inputs: Vec<Input> = Vec::new();
        match op {
            Op::Submit => inputs.push(Input::Submit { spec: spec(JOB), reply: 1 }),
            Op::Connect(c) => {
                let agent = &mut agents[c];
                if let Some(old) = agent.conn.take() {
                    inputs.push(Input::AgentGone { conn: old });
                }
                let conn = h.new_conn();
                agent.conn = Some(conn);
                agent.in_flight.clear();
                agent.closed = false;
                agent.welcomed = false;
                agent.sent.clear();
                // A new stream: copies of the old one are dropped.
                agent.copies.clear();
                agent.hello_sent = h.now_ms;
                inputs.push(Input::AgentHello { conn, hello: hello(names[c], &format!("i{c}")), reply: 2 });
            }
            Op::Break(c) => {
                let agent = &mut agents[c];
                if let Some(conn) = agent.conn.take() {
                    agent.in_flight.clear();
                    agent.welcomed = false;
                    agent.copies.clear();
                    inputs.push(Input::AgentGone { conn });
                }
            }
            Op::CopyReady(c) => {
                let agent = &mut agents[c];
                let (Some(conn), true) = (agent.conn, agent.welcomed) else { continue };
                let Some((job, (token, ready))) = agent.copies.iter_mut().find(|(_, (_, ready))| !*ready) else {
                    continue;
                };
                *ready = true;
                inputs.push(Input::Agent {
                    conn,
                    event: AgentEvent::CopyReady { job_id: job.clone(), copy_token: *token },
                });
            }
            Op::Deliver(c, all) => {
                let now = h.now_ms;
                let agent = &mut agents[c];
                while let Some(conn) = agent.conn {
                    if agent.expire_if_due(now) {
                        // The real agent gives up the stream with its lease and dials again.
                        agent.conn = None;
                        agent.in_flight.clear();
                        agent.welcomed = false;
                        inputs.push(Input::AgentGone { conn });
                    } else if let Some(command) = agent.in_flight.pop_front() {
                        inputs.extend(deliver(agent, conn, command, now, lease_ms, rules, &mut seq));
                    } else if agent.closed {
                        agent.conn = None;
                        agent.welcomed = false;
                    }
                    if !all || agent.in_flight.is_empty() {
                        break;
                    }
                }
            }
            Op::Lose(c) => {
                agents[c].in_flight.pop_front();
                continue;
            }
            Op::Answer { agent: c, accept, lost } => {
                let agent = &mut agents[c];
                if agent.submitting.is_empty() {
                    continue;
                }
                let (job, token) = agent.submitting.remove(0);
                if accept {
                    agent.held.insert(job.clone(), (token, Held::Running));
                }
                if let (Some(conn), true, false) = (agent.conn, agent.welcomed, lost) {
                    let event = AgentEvent::OfferReply {
                        job_id: job,
                        fencing_token: token,
                        accepted: accept,
                        reason: String::new(),
                        permanent: false,
                    };
                    inputs.push(Input::Agent { conn, event });
                }
            }
            Op::Finish(c, ok) => {
                let agent = &mut agents[c];
                let Some((job, token)) =
                    agent.held.iter().find(|(_, (_, copy))| *copy == Held::Running).map(|(j, (t, _))| (j.clone(), *t))
                else {
                    continue;
                };
                let state = if ok { JobState::Succeeded } else { JobState::Failed };
                agent.held.insert(job.clone(), (token, Held::Result { state, requeue: false }));
                if let (Some(conn), true) = (agent.conn, agent.welcomed) {
                    inputs.push(Input::Agent { conn, event: AgentEvent::Status(report(&job, token, state)) });
                }
            }
            Op::Heartbeat(c) => {
                let now = h.now_ms;
                let agent = &mut agents[c];
                let (Some(conn), true) = (agent.conn, agent.welcomed) else { continue };
                seq += 1;
                agent.sent.insert(seq, now);
                inputs.push(Input::Agent { conn, event: AgentEvent::Heartbeat { seq, jobs: agent.heartbeat_jobs() } });
            }
            Op::Inventory(c, free) => {
                let agent = &agents[c];
                let (Some(conn), true) = (agent.conn, agent.welcomed) else { continue };
                inputs.push(Input::Agent { conn, event: inventory_event(&[free]) });
            }
            Op::Cancel(i) => match submitted.get(i) {
                Some(id) => inputs.push(Input::Cancel { job_id: id.clone(), reply: 3 }),
                None => continue,
            },
            Op::Advance(secs) => {
                h.advance(Duration::from_secs(secs));
                let now = h.now_ms;
                for agent in &mut agents {
                    if agent.expire_if_due(now)
                        && let Some(conn) = agent.conn.take()
                    {
                        agent.in_flight.clear();
                        agent.welcomed = false;
                        inputs.push(Input::AgentGone { conn });
                    }
                }
            }
            Op::Tick => inputs.push(Input::Tick),
            Op::Round => inputs.push(Input::Round),
        }
        for input in inputs {
            let fx = h.step(input);
            for (_, reply) in &fx.replies {
                if let Ok(Reply::Submitted { job, created: true }) = reply {
                    submitted.push(job.id.clone());
                }
            }
            for (conn, command) in fx.sends {
                if let Some(agent) = agents.iter_mut().find(|a| a.conn == Some(conn) && !a.closed) {
                    agent.in_flight.push_back(command);
                }
            }
            for conn in fx.close {
                if let Some(agent) = agents.iter_mut().find(|a| a.conn == Some(conn)) {
                    // What was sent before the close still arrives, then the stream's end.
                    agent.closed = true;
                }
            }
            h.core.check_indexes();
        }
        for id in &submitted {
            let copies = agents.iter().filter(|a| a.running(id)).count();
            prop_assert!(copies <= 1, "job {id} runs on {copies} members at once");
            let grants: Vec<u64> =
                agents.iter().flat_map(|a| a.granted.iter().filter(|(j, _)| j == id).map(|(_, t)| *t)).collect();
            let mut distinct = grants.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert!(distinct.len() == grants.len(), "job {id} was granted twice under one binding: {grants:?}");
        }
    }
    Ok(agents.iter().map(|a| a.granted.len()).sum())
}

/// The agent's answer to one gateway message, as the real event loop gives it.
fn deliver(
    agent: &mut Agent,
    conn: ConnId,
    command: GatewayCommand,
    now: i64,
    lease_ms: i64,
    rules: AgentRules,
    seq: &mut u64,
) -> Vec<Input> {
    let mut out = Vec::new();
    let status = |job: &str, token: u64, state: JobState| Input::Agent {
        conn,
        event: AgentEvent::Status(report(job, token, state)),
    };
    match command {
        GatewayCommand::Welcome { bound, .. } => {
            let deadline = if rules.naive_leases { now + lease_ms } else { agent.hello_sent + lease_ms };
            if deadline <= now {
                // Stale: it grants nothing; the agent dials again.
                agent.conn = None;
                agent.in_flight.clear();
                out.push(Input::AgentGone { conn });
                return out;
            }
            agent.welcomed = true;
            agent.copies.clear();
            agent.deadline = Some(deadline);
            agent.expired = false;
            let listed: BTreeMap<String, u64> = bound.iter().map(|a| (a.job_id.clone(), a.fencing_token)).collect();
            agent.held.retain(|job, (token, _)| listed.get(job) == Some(token));
            agent.submitting.retain(|(job, token)| listed.get(job) == Some(token));
            for (job, token) in &listed {
                let present = agent.held.get(job).is_some_and(|(t, _)| t == token)
                    || agent.submitting.iter().any(|(j, t)| j == job && t == token);
                if !present {
                    agent.held.insert(job.clone(), (*token, Held::Result { state: JobState::Failed, requeue: true }));
                }
            }
            *seq += 1;
            agent.sent.insert(*seq, now);
            out.push(Input::Agent { conn, event: AgentEvent::Heartbeat { seq: *seq, jobs: agent.heartbeat_jobs() } });
        }
        _ if !agent.welcomed => {}
        GatewayCommand::Copy { copy_token, assignment } => {
            let job = assignment.job_id;
            if agent.held.contains_key(&job) || agent.submitting.iter().any(|(j, _)| *j == job) {
                out.push(Input::Agent {
                    conn,
                    event: AgentEvent::CopyDropped {
                        job_id: job,
                        copy_token,
                        reason: "binding held".into(),
                        unsupported: false,
                    },
                });
            } else {
                agent.copies.insert(job, (copy_token, false));
            }
        }
        GatewayCommand::DropCopy { job_id, copy_token } => {
            if agent.copies.get(&job_id).is_some_and(|(t, _)| *t == copy_token) {
                agent.copies.remove(&job_id);
            }
        }
        GatewayCommand::Grant { copy_token, assignment } => {
            let (job, token) = (assignment.job_id.clone(), assignment.fencing_token);
            if agent.copies.get(&job) == Some(&(copy_token, true)) && !agent.expired {
                // The copy starts on the nodes it holds.
                agent.copies.remove(&job);
                agent.held.insert(job.clone(), (token, Held::Running));
                agent.granted.push((job.clone(), token));
                out.push(Input::Agent {
                    conn,
                    event: AgentEvent::OfferReply {
                        job_id: job,
                        fencing_token: token,
                        accepted: true,
                        reason: String::new(),
                        permanent: false,
                    },
                });
            } else {
                // Not held ready here: the grant is an offer.
                out.extend(deliver(agent, conn, GatewayCommand::Offer(assignment), now, lease_ms, rules, seq));
            }
        }
        GatewayCommand::Offer(offer) => {
            let (job, token) = (offer.job_id.clone(), offer.fencing_token);
            agent.copies.remove(&job);
            let decline = |reason: &str| Input::Agent {
                conn,
                event: AgentEvent::OfferReply {
                    job_id: job.clone(),
                    fencing_token: token,
                    accepted: false,
                    reason: reason.into(),
                    permanent: false,
                },
            };
            match agent.held.get(&job) {
                _ if agent.expired => out.push(decline("lease expired")),
                Some((held, _)) if *held > token => out.push(decline("newer binding held")),
                Some((held, Held::Running)) if *held == token => out.push(Input::Agent {
                    conn,
                    event: AgentEvent::OfferReply {
                        job_id: job.clone(),
                        fencing_token: token,
                        accepted: true,
                        reason: String::new(),
                        permanent: false,
                    },
                }),
                _ if agent.submitting.iter().any(|(j, _)| *j == job) => {}
                _ => {
                    // An older copy is replaced: stopped before the new submit.
                    agent.held.remove(&job);
                    agent.submitting.push((job, token));
                }
            }
        }
        GatewayCommand::Cancel { job_id, fencing_token } => {
            if let Some(position) = agent.submitting.iter().position(|(j, t)| *j == job_id && *t <= fencing_token) {
                let (_, token) = agent.submitting.remove(position);
                agent.held.insert(job_id.clone(), (token, Held::Result { state: JobState::Cancelled, requeue: false }));
                out.push(status(&job_id, token, JobState::Cancelled));
            } else if let Some((token, copy)) = agent.held.get(&job_id).copied()
                && token <= fencing_token
            {
                match copy {
                    Held::Running => {
                        agent.held.insert(
                            job_id.clone(),
                            (token, Held::Result { state: JobState::Cancelled, requeue: false }),
                        );
                        out.push(status(&job_id, token, JobState::Cancelled));
                    }
                    Held::Result { state, .. } => out.push(status(&job_id, token, state)),
                }
            } else if !agent.held.contains_key(&job_id) {
                out.push(status(&job_id, fencing_token, JobState::Cancelled));
            }
        }
        GatewayCommand::Ack { job_id, fencing_token } => {
            if agent.held.get(&job_id).is_some_and(|(t, copy)| *t == fencing_token && *copy != Held::Running) {
                agent.held.remove(&job_id);
            }
        }
        GatewayCommand::Lease { heartbeat_seq, lease } => {
            let length = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            if !agent.expired {
                if rules.naive_leases {
                    agent.deadline = Some(now + length);
                } else if let Some(sent) = agent.sent.get(&heartbeat_seq)
                    && sent + length > now
                {
                    agent.deadline = Some(agent.deadline.map_or(sent + length, |d| d.max(sent + length)));
                }
            }
        }
        GatewayCommand::Logs { .. } | GatewayCommand::Quote { .. } => {}
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn no_two_members_ever_run_one_job_under_dropped_streams_late_messages_and_pauses(
        ops in proptest::collection::vec(op(), 1..150)
    ) {
        run(ops, AgentRules::default(), false)?;
    }
}

/// Both members hold a copy of a job neither can start now; both become ready at once.
fn both_copies_ready() -> Vec<Op> {
    vec![
        Op::Connect(0),
        Op::Connect(1),
        Op::Deliver(0, true),
        Op::Deliver(1, true),
        Op::Inventory(0, 4),
        Op::Inventory(1, 4),
        Op::Submit,
        Op::Round,
        Op::Deliver(0, true),
        Op::Deliver(1, true),
        Op::CopyReady(0),
        Op::CopyReady(1),
        Op::Round,
        Op::Deliver(0, true),
        Op::Deliver(1, true),
        Op::Round,
        Op::Deliver(0, true),
        Op::Deliver(1, true),
    ]
}

#[test]
fn two_ready_copies_start_the_job_once() {
    assert_eq!(run(both_copies_ready(), AgentRules::default(), false).ok(), Some(1), "exactly one copy is granted");
    // The grant's stream breaks before it arrives: the job is lost with east (Unknown), and no
    // copy is granted again until the lease rules place it elsewhere.
    let mut ops = both_copies_ready();
    ops.truncate(13);
    ops.extend([Op::Break(0), Op::Break(1), Op::Connect(1), Op::Deliver(1, true), Op::CopyReady(1), Op::Round]);
    ops.extend([Op::Deliver(1, true), Op::Deliver(0, true)]);
    assert_eq!(run(ops, AgentRules::default(), false).ok(), Some(0), "a copy of a lost grant never starts");
}

/// East runs a job whose acceptance was lost with east's stream; west is then free to take it.
fn offer_lost_with_its_stream() -> Vec<Op> {
    let mut ops = east_starts_a_job(true);
    ops.extend([
        Op::Break(0),
        Op::Connect(1),
        Op::Deliver(1, true),
        Op::Inventory(1, 8),
        Op::Round,
        Op::Deliver(1, true),
        Op::Answer { agent: 1, accept: true, lost: false },
    ]);
    ops
}

/// East connects, is welcomed with free GPUs, and starts the one job submitted; its acceptance
/// is lost on the way with `lost`.
fn east_starts_a_job(lost: bool) -> Vec<Op> {
    vec![
        Op::Connect(0),
        Op::Deliver(0, true),
        Op::Inventory(0, 8),
        Op::Submit,
        Op::Round,
        Op::Deliver(0, true),
        Op::Answer { agent: 0, accept: true, lost },
    ]
}

/// East runs a job; the gateway's renewal of east's lease is held in the network while the
/// gateway, hearing nothing more, closes east's stream; the renewal arrives 200 s late, then
/// the gateway places the job on west once its lost-job timeout has passed.
fn renewal_held_in_the_network() -> Vec<Op> {
    let mut ops = east_starts_a_job(false);
    ops.extend([
        Op::Heartbeat(0),
        Op::Advance(200),
        Op::Tick,
        Op::Deliver(0, true),
        Op::Connect(1),
        Op::Deliver(1, true),
        Op::Inventory(1, 8),
        Op::Advance(100),
        Op::Heartbeat(1),
        Op::Tick,
        Op::Round,
        Op::Deliver(1, true),
        Op::Answer { agent: 1, accept: true, lost: false },
    ]);
    ops
}

#[test]
fn with_both_rules_the_adversarial_sequences_keep_one_copy() {
    for ops in [offer_lost_with_its_stream(), renewal_held_in_the_network()] {
        let result = run(ops, AgentRules::default(), false);
        assert!(result.is_ok(), "{result:?}");
    }
}

#[test]
fn without_rule_1_an_offer_lost_with_its_stream_runs_twice() {
    let result = run(offer_lost_with_its_stream(), AgentRules::default(), true);
    assert!(matches!(&result, Err(e) if e.to_string().contains("members at once")), "{result:?}");
}

#[test]
fn without_rule_2_a_late_renewal_runs_a_job_twice() {
    let result = run(renewal_held_in_the_network(), AgentRules { naive_leases: true }, false);
    assert!(matches!(&result, Err(e) if e.to_string().contains("members at once")), "{result:?}");
}
