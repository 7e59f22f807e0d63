//! The epoch gate in the event loop: messages from a leader older than the newest the agent has
//! seen are not acted on, on any stream, and change nothing. Uses the in-memory gateway and
//! scripted backend of `tests.rs`, in paused time.

use std::time::Duration;

use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;
use proptest::prelude::*;

use super::link::Inbound;
use super::tests::{Call, Harness, Stream, assignment, offer_and_accept, succeeded};

/// The refusals counted in the agent's metrics.
fn refused(h: &Harness) -> u64 {
    let text = h.metrics.render();
    text.lines()
        .find_map(|line| line.strip_prefix("meridian_agent_stale_epoch_messages_total "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no stale epoch counter in\n{text}"))
}

#[tokio::test(start_paused = true)]
async fn an_offer_from_an_older_epoch_is_not_started_and_is_counted() {
    let mut h = Harness::start();
    let mut stream = h.welcome_at(5, Vec::new(), None).await;
    stream.heartbeat().await;
    stream.epoch = 4;
    stream.send(GatewayCommand::Offer(assignment("old", 1))).await;
    // The same offer from the current leader is taken: the stale one left nothing behind.
    stream.epoch = 5;
    offer_and_accept(&mut stream, "new", 1).await;
    assert_eq!(h.call().await, Call::Submit("new".into(), 1), "only the current leader's offer was submitted");
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(jobs.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>(), ["new"]);
    assert_eq!(refused(&h), 1);
    assert!(h.metrics.render().contains("meridian_agent_gateway_epoch 5"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_newer_epoch_raises_the_bar_for_the_rest_of_the_stream() {
    let mut h = Harness::start();
    let mut stream = h.welcome_at(5, Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    // A lease renewal from epoch 6 is taken, after which epoch 5's cancel is stale.
    stream.epoch = 6;
    let (seq, _) = stream.heartbeat().await;
    stream.send(GatewayCommand::Lease { heartbeat_seq: seq, lease: Duration::ZERO }).await;
    stream.epoch = 5;
    stream.send(GatewayCommand::Cancel { job_id: "j".into(), fencing_token: 1 }).await;
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(jobs[0].state, JobState::Running, "the stale cancel stopped nothing");
    assert!(h.calls.try_recv().is_err());
    assert_eq!(refused(&h), 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_newest_epoch_survives_a_reconnect_and_an_older_leaders_welcome_is_refused() {
    let mut h = Harness::start();
    let mut stream = h.welcome_at(5, Vec::new(), None).await;
    offer_and_accept(&mut stream, "keep", 1).await;
    assert_eq!(h.call().await, Call::Submit("keep".into(), 1));
    drop(stream);
    // A deposed leader (epoch 4) takes the new stream; its welcome lists nothing, which would
    // stop the job if it were obeyed.
    let mut deposed = h.welcome_at(4, Vec::new(), None).await;
    // The agent gives that stream up and dials again; the current leader welcomes it.
    let mut stream = h.welcome_at(5, vec![assignment("keep", 1)], None).await;
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(jobs.iter().map(|r| (r.job_id.as_str(), r.state)).collect::<Vec<_>>(), [("keep", JobState::Running)]);
    assert!(h.calls.try_recv().is_err(), "the stale welcome stopped nothing");
    assert!(deposed.from_agent.recv().await.is_none(), "the deposed leader's stream was closed unanswered");
    assert_eq!(refused(&h), 1);
    h.stop().await;
}

// ---------------------------------------------------------------- property

const JOBS: [&str; 3] = ["a", "b", "c"];
/// The welcome's lease; renewals grant one of `RENEWALS`. Odd seconds, so no deadline falls on
/// a heartbeat tick (every 2 s) and the order of events is the same in every run.
const LEASE: Duration = Duration::from_secs(25);
const RENEWALS: [u64; 3] = [0, 5, 41];

/// One thing that happens to the agent.
#[derive(Debug, Clone)]
enum Step {
    Offer(usize, u64),
    Cancel(usize, u64),
    Ack(usize, u64),
    /// Renews the lease (answering the welcome's heartbeat) for `RENEWALS[i]` seconds.
    Renew(usize),
    Logs(usize, u64),
    InvalidOffer(usize, u64),
    /// The backend reports the job finished: not a gateway message, never refused.
    Finish(usize, u64),
}

fn step() -> impl Strategy<Value = Step> {
    let job = 0..JOBS.len();
    let token = 1u64..4;
    prop_oneof![
        4 => (job.clone(), token.clone()).prop_map(|(j, t)| Step::Offer(j, t)),
        2 => (job.clone(), token.clone()).prop_map(|(j, t)| Step::Cancel(j, t)),
        2 => (job.clone(), token.clone()).prop_map(|(j, t)| Step::Ack(j, t)),
        2 => (0..RENEWALS.len()).prop_map(Step::Renew),
        1 => (job.clone(), token.clone()).prop_map(|(j, t)| Step::Logs(j, t)),
        1 => (job.clone(), token.clone()).prop_map(|(j, t)| Step::InvalidOffer(j, t)),
        2 => (job, token).prop_map(|(j, t)| Step::Finish(j, t)),
    ]
}

/// Everything the agent did, in order: backend calls and messages to the gateway, each with the
/// step after which it was seen; and the refusals it counted.
#[derive(Debug, PartialEq)]
struct Observed {
    log: Vec<String>,
    refused: u64,
}

/// Lets every task finish what the last step started (paused time only moves when all wait),
/// then records what the agent did.
async fn settle(h: &mut Harness, stream: &mut Stream, at: &str, log: &mut Vec<String>) {
    tokio::time::sleep(Duration::from_millis(1)).await;
    while let Ok(call) = h.calls.try_recv() {
        log.push(format!("{at}: backend {call:?}"));
    }
    while let Ok(event) = stream.from_agent.try_recv() {
        log.push(format!("{at}: gateway {event:?}"));
    }
}

/// Runs one agent through `steps` (a gateway message is delivered only where `deliver` says),
/// then lets 45 s pass so that the lease the messages left behind runs out or not.
fn run(welcome_epoch: u64, steps: &[(u64, Step)], deliver: &[bool]) -> Observed {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
    runtime.block_on(async {
        let mut h = Harness::start();
        let mut stream = h.welcome_at(welcome_epoch, Vec::new(), Some(LEASE)).await;
        let mut log = Vec::new();
        settle(&mut h, &mut stream, "welcome", &mut log).await;
        for (i, ((epoch, step), deliver)) in steps.iter().zip(deliver).enumerate() {
            stream.epoch = *epoch;
            let job = |j: &usize| JOBS[*j].to_string();
            match step {
                Step::Finish(j, token) => h.emit(&job(j), *token, succeeded()),
                _ if !deliver => {}
                Step::Offer(j, token) => stream.send(GatewayCommand::Offer(assignment(&job(j), *token))).await,
                Step::Cancel(j, token) => {
                    stream.send(GatewayCommand::Cancel { job_id: job(j), fencing_token: *token }).await
                }
                Step::Ack(j, token) => stream.send(GatewayCommand::Ack { job_id: job(j), fencing_token: *token }).await,
                Step::Renew(r) => {
                    let lease = Duration::from_secs(RENEWALS[*r]);
                    stream.send(GatewayCommand::Lease { heartbeat_seq: 1, lease }).await
                }
                Step::Logs(j, token) => {
                    let request_id = i as u64;
                    let (from, max_bytes) = (None, 64);
                    let logs =
                        GatewayCommand::Logs { request_id, job_id: job(j), fencing_token: *token, from, max_bytes };
                    stream.send(logs).await
                }
                Step::InvalidOffer(j, token) => {
                    let reason = "offer.spec: missing".to_string();
                    stream.send_raw(Inbound::InvalidOffer { job_id: job(j), fencing_token: *token, reason }).await
                }
            }
            settle(&mut h, &mut stream, &format!("step {i}"), &mut log).await;
        }
        for second in 0..45 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            settle(&mut h, &mut stream, &format!("second {second}"), &mut log).await;
        }
        let refused = refused(&h);
        h.stop().await;
        Observed { log, refused }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// An agent sent every message behaves exactly like one sent only the messages the gate
    /// admits: the same backend calls and the same words to the gateway, at the same moments,
    /// lease expiry included. So a refused message changed nothing.
    #[test]
    fn messages_from_an_epoch_older_than_the_newest_seen_change_nothing(
        welcome_epoch in 0u64..4,
        steps in prop::collection::vec((0u64..6, step()), 1..24),
    ) {
        let mut newest = welcome_epoch;
        let admitted: Vec<bool> = steps
            .iter()
            .map(|(epoch, step)| {
                if matches!(step, Step::Finish(..)) {
                    return true;
                }
                let admit = *epoch >= newest;
                newest = newest.max(*epoch);
                admit
            })
            .collect();
        let gateway_refusals = steps
            .iter()
            .zip(&admitted)
            .filter(|((_, step), admit)| !**admit && !matches!(step, Step::Finish(..)))
            .count() as u64;
        let everything = run(welcome_epoch, &steps, &vec![true; steps.len()]);
        let only_admitted = run(welcome_epoch, &steps, &admitted);
        prop_assert_eq!(&everything.log, &only_admitted.log);
        prop_assert_eq!(everything.refused, gateway_refusals);
        prop_assert_eq!(only_admitted.refused, 0);
        // The runs did something worth comparing.
        prop_assert!(everything.log.iter().any(|line| line.contains("Heartbeat")));
    }
}

/// The property's runs are deterministic: the same steps give the same log twice (else the
/// property would compare noise).
#[test]
fn the_property_runs_are_deterministic() {
    let steps = vec![
        (1, Step::Offer(0, 1)),
        (1, Step::Renew(1)),
        (0, Step::Cancel(0, 1)),
        (2, Step::Offer(1, 2)),
        (1, Step::Renew(2)),
        (2, Step::Finish(1, 2)),
        (2, Step::Ack(1, 2)),
    ];
    let first = run(1, &steps, &[true; 7]);
    assert_eq!(first, run(1, &steps, &[true; 7]));
    assert_eq!(first.refused, 2);
    let stopped = first.log.iter().filter(|line| line.contains("backend Cancel(\"a\", 1)")).count();
    assert_eq!(stopped, 1, "the 5 s renewal ran out and stopped job a, once: {:#?}", first.log);
}

// ---------------------------------------------------------------- a silent leader

#[tokio::test(start_paused = true)]
async fn a_leasing_gateway_silent_for_three_heartbeats_is_given_up_and_jobs_keep_running() {
    let mut h = Harness::start();
    let lease = Some(Duration::from_secs(60));
    let mut stream = h.welcome_at(3, Vec::new(), lease).await;
    offer_and_accept(&mut stream, "j", 1).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    // Answered heartbeats keep the stream: two rounds of heartbeat and renewal.
    for _ in 0..2 {
        let (seq, _) = stream.heartbeat().await;
        stream.send(GatewayCommand::Lease { heartbeat_seq: seq, lease: Duration::from_secs(60) }).await;
    }
    // Then the gateway falls silent (paused, or cut off with its connection open): after three
    // unanswered heartbeats the agent dials again, and the next gateway finds the job running.
    let mut next = h.welcome_at(4, vec![assignment("j", 1)], lease).await;
    let (_, jobs) = next.heartbeat().await;
    assert_eq!(jobs.iter().map(|r| (r.job_id.as_str(), r.state)).collect::<Vec<_>>(), [("j", JobState::Running)]);
    assert!(h.calls.try_recv().is_err(), "nothing was stopped or started again");
    drop(stream);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_gateway_without_leases_may_stay_silent() {
    let mut h = Harness::start();
    let mut stream = h.welcome_at(0, Vec::new(), None).await;
    for _ in 0..5 {
        stream.heartbeat().await;
    }
    assert!(h.dials.try_recv().is_err(), "the agent gave up a stream whose gateway never promised answers");
    h.stop().await;
}
