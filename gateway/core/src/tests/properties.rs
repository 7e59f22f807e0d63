//! Random input sequences against a model of truthful agents: no job runs twice, fencing
//! tokens only grow, and every send and reply follows the record that justifies it.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::*;

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Op {
    Submit,
    /// Something the agent of cluster 0 or 1 does.
    Agent(usize, AgentOp),
    Cancel(usize),
    Advance(u64),
    Tick,
    Round,
}

/// What a model agent does.
#[derive(Debug, Clone)]
enum AgentOp {
    Connect,
    Gone,
    /// Reports this many GPUs free on its one node.
    Inventory(u32),
    /// Answers its oldest unanswered offer: accepts it or declines it.
    Answer(bool),
    /// A held job finishes: succeeded or failed.
    Finish(bool),
    Heartbeat,
}

fn op() -> impl Strategy<Value = Op> {
    let agent_op = prop_oneof![
        1 => Just(AgentOp::Connect),
        1 => Just(AgentOp::Gone),
        2 => (0..3u32).prop_map(|n| AgentOp::Inventory(n * 4)),
        3 => any::<bool>().prop_map(AgentOp::Answer),
        2 => any::<bool>().prop_map(AgentOp::Finish),
        2 => Just(AgentOp::Heartbeat),
    ];
    // Weights as one list: an agent's operation is as likely as it is in `agent_op` (11 of 21).
    prop_oneof![
        2 => Just(Op::Submit),
        11 => (0..2usize, agent_op).prop_map(|(c, op)| Op::Agent(c, op)),
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

/// The truthful agents of clusters `east` and `west`, and what the test saw of the core.
#[derive(Default)]
struct Model {
    agents: [Agent; 2],
    submitted: Vec<String>,
    /// The highest fencing token persisted per job.
    tokens: HashMap<String, u64>,
    /// The token of each job's latest offer.
    offered: HashMap<String, u64>,
    seq: u64,
}

impl Model {
    /// The input `op` gives the core, if any (an agent without a stream does nothing).
    fn input(&mut self, h: &mut Harness, op: Op) -> Option<Input> {
        let (c, op) = match op {
            Op::Submit => return Some(Input::Submit { spec: spec(JOB), reply: 1 }),
            Op::Cancel(i) => return self.submitted.get(i).map(|id| Input::Cancel { job_id: id.clone(), reply: 3 }),
            Op::Advance(secs) => {
                h.advance(Duration::from_secs(secs));
                return None;
            }
            Op::Tick => return Some(Input::Tick),
            Op::Round => return Some(Input::Round),
            Op::Agent(c, op) => (c, op),
        };
        let agent = &mut self.agents[c];
        if let AgentOp::Connect = op {
            if let Some(old) = agent.conn.take() {
                h.step(Input::AgentGone { conn: old });
            }
            let conn = h.new_conn();
            agent.conn = Some(conn);
            let name = ["east", "west"][c];
            return Some(Input::AgentHello { conn, hello: hello(name, &format!("i{c}")), reply: 2 });
        }
        if let AgentOp::Gone = op {
            return agent.conn.take().map(|conn| Input::AgentGone { conn });
        }
        let conn = agent.conn?;
        let event = match op {
            AgentOp::Connect | AgentOp::Gone => return None,
            AgentOp::Inventory(free) => inventory_event(&[free]),
            AgentOp::Answer(accepted) => {
                if agent.offers.is_empty() {
                    return None;
                }
                let (job, token) = agent.offers.remove(0);
                if accepted {
                    agent.held.insert(job.clone(), (token, JobState::Running));
                }
                answer(&job, token, accepted, "", false)
            }
            AgentOp::Finish(ok) => {
                let (job, token) =
                    agent.held.iter().find(|(_, (_, s))| *s == JobState::Running).map(|(j, (t, _))| (j.clone(), *t))?;
                let state = if ok { JobState::Succeeded } else { JobState::Failed };
                agent.held.insert(job.clone(), (token, state));
                AgentEvent::Status(report(&job, token, state))
            }
            AgentOp::Heartbeat => {
                self.seq += 1;
                let jobs = agent.held.iter().map(|(j, (t, s))| report(j, *t, *s)).collect();
                AgentEvent::Heartbeat { seq: self.seq, jobs }
            }
        };
        Some(Input::Agent { conn, event })
    }

    /// Checks that every send of a step is justified by state durable no later than the step
    /// (`durable_before`: what was durable before it), and delivers the sends to the agents.
    fn deliver(&mut self, fx: &Effects, durable_before: &BTreeMap<String, Record>) -> Result<(), TestCaseError> {
        for (conn, command) in &fx.sends {
            match command {
                GatewayCommand::Offer(a) => {
                    let record = persisted_job(fx, &a.job_id);
                    prop_assert!(
                        record.is_some_and(|j| j.state == JobState::Offered && j.fencing_token == a.fencing_token),
                        "offer without its record: {a:?}"
                    );
                    let previous = self.offered.insert(a.job_id.clone(), a.fencing_token);
                    prop_assert!(
                        previous.is_none_or(|p| a.fencing_token > p),
                        "offer tokens must strictly increase: {previous:?} then {}",
                        a.fencing_token
                    );
                }
                GatewayCommand::Ack { job_id, fencing_token } => {
                    let now = persisted_job(fx, job_id).cloned().or_else(|| {
                        match durable_before.get(&format!("jobs/{job_id}")) {
                            Some(Record::Job(j)) => Some(JobRecord::clone(j)),
                            _ => None,
                        }
                    });
                    let stale =
                        now.as_ref().is_none_or(|j| j.fencing_token != *fencing_token || j.state == JobState::Queued);
                    prop_assert!(
                        stale || now.is_some_and(|j| j.state.is_terminal()),
                        "ack before the result is durable"
                    );
                }
                _ => {}
            }
            let Some(agent) = self.agents.iter_mut().find(|a| a.conn == Some(*conn)) else { continue };
            match command {
                GatewayCommand::Offer(a) | GatewayCommand::Grant { assignment: a, .. } => {
                    agent.offers.push((a.job_id.clone(), a.fencing_token))
                }
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
                    let keep: BTreeSet<(String, u64)> =
                        bound.iter().map(|a| (a.job_id.clone(), a.fencing_token)).collect();
                    agent.held.retain(|j, (t, s)| s.is_terminal() || keep.contains(&(j.clone(), *t)));
                    agent.offers.clear();
                }
                GatewayCommand::Lease { .. }
                | GatewayCommand::Logs { .. }
                | GatewayCommand::Quote { .. }
                | GatewayCommand::Copy { .. }
                | GatewayCommand::DropCopy { .. } => {}
            }
        }
        for conn in &fx.close {
            for agent in self.agents.iter_mut().filter(|a| a.conn == Some(*conn)) {
                agent.conn = None;
            }
        }
        for (_, reply) in &fx.replies {
            if let Ok(Reply::Submitted { job, created: true }) = reply {
                prop_assert!(persisted_job(fx, &job.id).is_some(), "a 201 for a record not persisted in its step");
                self.submitted.push(job.id.clone());
            }
        }
        Ok(())
    }

    /// Checks that tokens never go back, and that no job is held running under its current
    /// token by two members (nor by one once it finished at the gateway).
    fn check(&mut self, core: &Core, fx: &Effects) -> Result<(), TestCaseError> {
        for record in &fx.persist {
            if let Record::Job(job) = record {
                let seen = self.tokens.entry(job.id.clone()).or_insert(0);
                prop_assert!(job.fencing_token >= *seen, "token went back for {}", job.id);
                *seen = job.fencing_token;
            }
        }
        for id in &self.submitted {
            let Some(job) = core.job(id) else { continue };
            let current = self
                .agents
                .iter()
                .filter(|a| a.held.get(id).is_some_and(|(t, s)| *t == job.fencing_token && *s == JobState::Running))
                .count();
            prop_assert!(current <= 1, "job {id} runs on {current} members under token {}", job.fencing_token);
            if job.state.is_terminal() && job.state != JobState::Cancelled {
                prop_assert!(current == 0, "job {id} finished at the gateway but still runs");
            }
        }
        Ok(())
    }
}

/// Runs one sequence; fails on the first broken property.
fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut h = Harness::new(property_config());
    let mut model = Model::default();
    for op in ops {
        let Some(input) = model.input(&mut h, op) else { continue };
        let durable_before = h.durable.clone();
        let fx = h.step(input);
        model.deliver(&fx, &durable_before)?;
        h.core.check_indexes();
        model.check(&h.core, &fx)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn no_job_runs_twice_tokens_grow_and_sends_follow_their_records(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

/// A sequence the random search once failed on (kept from its regression file when the
/// strategy changed shape): west connects with free GPUs, declines the offer of the one job,
/// and a second round places the job again.
#[test]
fn the_properties_hold_when_a_declined_offer_is_placed_again() {
    let west = |op| Op::Agent(1, op);
    let ops = vec![
        west(AgentOp::Connect),
        west(AgentOp::Inventory(8)),
        Op::Submit,
        Op::Round,
        west(AgentOp::Answer(false)),
        Op::Round,
    ];
    let result = run(ops);
    assert!(result.is_ok(), "{result:?}");
}
