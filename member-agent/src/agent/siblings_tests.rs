//! Sibling copies through the event loop, in paused tokio time: an agent over the real builtin
//! backend (simulated runner, one 8-GPU node) against the in-memory gateway of `tests.rs`, and
//! one over the scripted backend, which has no start gate.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::inventory::ClusterInfo;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, Assignment, GatewayCommand};
use meridian_proto::spec::JobSpec;
use meridian_proto::testing::cluster_info;
use meridian_scheduler::testkit::node;
use meridian_scheduler::{BuiltinScheduler, QueueSpec};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::tests::{Call, DialRequest, Harness, INTERVAL, MemoryDialer, PATIENCE, Stream, accept_dial};
use super::{Agent, Settings};
use crate::backend::{BuiltinBackend, InventorySource};
use crate::metrics::AgentMetrics;
use crate::test_jobs::{self, job_spec};

/// An agent over the builtin backend, and the gateway's end of its dials.
struct Member {
    dials: mpsc::UnboundedReceiver<DialRequest>,
    backend: Arc<BuiltinBackend>,
    metrics: AgentMetrics,
    stop: oneshot::Sender<()>,
    agent: JoinHandle<()>,
}

impl Member {
    fn start() -> Self {
        let scheduler = BuiltinScheduler::new(vec![node("n-0", 8)], vec![QueueSpec::new("default", 1.0)]).unwrap();
        let (events, events_rx) = mpsc::unbounded_channel();
        let backend = Arc::new(BuiltinBackend::new(scheduler, 1.0, events).unwrap());
        let (dials_tx, dials) = mpsc::unbounded_channel();
        let settings = Settings {
            info: ClusterInfo { prices: BTreeMap::new(), ..cluster_info("east") },
            gateways: vec!["memory".into()],
            tls: None,
            report_interval: INTERVAL,
        };
        let dialer = Box::new(MemoryDialer { dials: dials_tx });
        let agent = Agent::with_dialer(settings, dialer, backend.clone(), backend.clone(), events_rx);
        let metrics = agent.metrics().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let agent = tokio::spawn(agent.run(async move {
            let _ = stopped.await;
        }));
        Self { dials, backend, metrics, stop, agent }
    }

    /// Accepts the next dial and welcomes it, listing `bound`.
    async fn welcome(&mut self, bound: Vec<Assignment>) -> Stream {
        let stream = accept_dial(&mut self.dials).await;
        stream.send(GatewayCommand::Welcome { bound, lease: None }).await;
        stream
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(PATIENCE, self.agent).await.expect("the agent did not stop").unwrap();
    }

    /// Whether the agent's metrics show `count` copies with `outcome`.
    fn counted(&self, outcome: &str, count: u32) -> bool {
        let text = self.metrics.render();
        text.contains(&format!("meridian_agent_sibling_copies_total{{outcome=\"{outcome}\"}} {count}\n"))
    }
}

/// Binding `fencing_token` of `job_id`, a whole 8-GPU node for `estimate_secs`.
fn whole_node(job_id: &str, fencing_token: u64, estimate_secs: u64) -> Assignment {
    let spec = JobSpec { name: job_id.into(), ..job_spec("team", 1, 8, estimate_secs) };
    test_jobs::assignment(job_id, fencing_token, spec)
}

fn copy(copy_token: u64, assignment: Assignment) -> GatewayCommand {
    GatewayCommand::Copy { copy_token, assignment }
}

/// Offers `assignment` and waits until the agent accepted it.
async fn offer(stream: &mut Stream, assignment: Assignment) {
    let (job, token) = (assignment.job_id.clone(), assignment.fencing_token);
    stream.send(GatewayCommand::Offer(assignment)).await;
    let (job_id, fencing_token, accepted, reason) = stream.reply().await;
    assert_eq!((job_id, fencing_token, accepted), (job, token, true), "{reason}");
}

/// The next copy message: `Ok((job, copy))` for a CopyReady, `Err((job, copy, reason,
/// unsupported))` for a CopyDropped.
type CopyMessage = Result<(String, u64), (String, u64, String, bool)>;

async fn copy_message(stream: &mut Stream) -> CopyMessage {
    stream
        .next_of(|event| match event {
            AgentEvent::CopyReady { job_id, copy_token } => Some(Ok((job_id, copy_token))),
            AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported } => {
                Some(Err((job_id, copy_token, reason, unsupported)))
            }
            _ => None,
        })
        .await
}

/// Reads the stream for `heartbeats` heartbeats; panics on any copy message meanwhile.
async fn no_copy_message_for(stream: &mut Stream, heartbeats: usize) {
    for _ in 0..heartbeats {
        let event = stream
            .next_of(|event| match event {
                AgentEvent::Heartbeat { .. } | AgentEvent::CopyReady { .. } | AgentEvent::CopyDropped { .. } => {
                    Some(event)
                }
                _ => None,
            })
            .await;
        assert!(matches!(event, AgentEvent::Heartbeat { .. }), "no copy message expected: {event:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_copy_asks_for_the_start_lock_when_its_member_would_start_it_and_runs_only_once_granted() {
    let mut m = Member::start();
    let mut stream = m.welcome(Vec::new()).await;
    offer(&mut stream, whole_node("blocker", 1, 60)).await;
    let t0 = Instant::now();
    stream.send(copy(11, whole_node("j", 5, 60))).await;

    // Nothing of the copy before the blocker ends; then it asks for the lock, once. The
    // blocker's result and the copy's readiness leave the agent on separate paths, in
    // either order: what counts is when the copy became ready.
    let (mut blocker_ended, mut ready_after) = (false, None);
    while !blocker_ended || ready_after.is_none() {
        let event = stream
            .next_of(|event| match event {
                AgentEvent::CopyReady { .. } | AgentEvent::CopyDropped { .. } => Some(event),
                AgentEvent::Status(ref report) if report.state.is_terminal() => Some(event),
                _ => None,
            })
            .await;
        match event {
            AgentEvent::Status(report) => {
                assert_eq!(report.job_id, "blocker");
                blocker_ended = true;
            }
            AgentEvent::CopyReady { job_id, copy_token } if ready_after.is_none() => {
                assert_eq!((job_id.as_str(), copy_token), ("j", 11));
                ready_after = Some(t0.elapsed());
            }
            other => panic!("one CopyReady expected: {other:?}"),
        }
    }
    assert_eq!(ready_after, Some(Duration::from_secs(60)), "ready as soon as the node is free, not before");
    let (_, jobs) = stream.heartbeat().await;
    assert!(jobs.iter().all(|r| r.job_id != "j"), "a copy is no binding: {jobs:?}");
    no_copy_message_for(&mut stream, 3).await;
    assert!(m.counted("queued", 1) && m.counted("ready", 1), "{}", m.metrics.render());
    assert_eq!(m.backend.inventory().await.unwrap().gpus_free(), 0, "the ready copy holds the node");

    // The grant starts it under the grant's token, answered as an offer.
    stream.send(GatewayCommand::Grant { copy_token: 11, assignment: whole_node("j", 9, 60) }).await;
    assert_eq!(stream.reply().await, ("j".into(), 9, true, String::new()));
    let running = stream.status().await;
    assert_eq!((running.job_id.as_str(), running.fencing_token, running.state), ("j", 9, JobState::Running));
    assert_eq!(running.nodes, ["n-0"]);
    let (_, jobs) = stream.heartbeat().await;
    assert!(jobs.iter().any(|r| r.job_id == "j" && r.fencing_token == 9 && r.state == JobState::Running), "{jobs:?}");
    let granted_at = Instant::now();
    let result = stream.result().await;
    assert_eq!((result.job_id.as_str(), result.fencing_token, result.state), ("j", 9, JobState::Succeeded));
    assert!(granted_at.elapsed() <= Duration::from_secs(60), "it ran its estimate from the grant");
    assert!(m.counted("granted", 1), "{}", m.metrics.render());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_copy_frees_its_nodes_for_another_job() {
    let mut m = Member::start();
    let mut stream = m.welcome(Vec::new()).await;
    offer(&mut stream, whole_node("blocker", 1, 60)).await;
    stream.send(copy(11, whole_node("j", 5, 60))).await;
    assert_eq!(copy_message(&mut stream).await, Ok(("j".to_string(), 11)));
    stream.send(GatewayCommand::DropCopy { job_id: "j".into(), copy_token: 12 }).await;
    stream.send(GatewayCommand::DropCopy { job_id: "j".into(), copy_token: 11 }).await;
    offer(&mut stream, whole_node("other", 2, 60)).await;
    let running = stream.status().await;
    assert_eq!((running.job_id.as_str(), running.state), ("other", JobState::Running), "the node was free");
    assert!(m.counted("dropped", 1), "an unknown copy's drop is ignored: {}", m.metrics.render());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_end_of_the_stream_drops_every_copy() {
    let mut m = Member::start();
    let mut stream = m.welcome(Vec::new()).await;
    offer(&mut stream, whole_node("blocker", 1, 60)).await;
    stream.send(copy(11, whole_node("j", 5, 60))).await;
    stream.send(copy(12, whole_node("k", 6, 60))).await;
    while !m.counted("queued", 2) {
        stream.heartbeat().await;
    }
    drop(stream);
    let mut stream = m.welcome(vec![whole_node("blocker", 1, 60)]).await;
    let result = stream.result().await;
    assert_eq!(result.job_id, "blocker");
    no_copy_message_for(&mut stream, 3).await;
    assert_eq!(m.backend.inventory().await.unwrap().gpus_free(), 8, "no copy took the free node");
    assert_eq!(m.backend.pressure().await.unwrap().pending_jobs(), 0, "no copy waits any more");
    assert!(m.counted("dropped", 2), "{}", m.metrics.render());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_offer_of_a_job_with_a_copy_here_drops_the_copy_first() {
    let mut m = Member::start();
    let mut stream = m.welcome(Vec::new()).await;
    offer(&mut stream, whole_node("blocker", 1, 60)).await;
    stream.send(copy(11, whole_node("j", 5, 60))).await;
    offer(&mut stream, whole_node("j", 5, 60)).await;
    let started = stream
        .next_of(|event| match event {
            AgentEvent::CopyReady { .. } | AgentEvent::CopyDropped { .. } => Some(format!("{event:?}")),
            AgentEvent::Status(report) if report.state == JobState::Running => {
                Some(format!("{} {}", report.job_id, report.fencing_token))
            }
            _ => None,
        })
        .await;
    assert_eq!(started, "j 5", "the binding starts when the node frees, and no copy asks for it");
    assert_eq!(m.backend.pressure().await.unwrap().pending_jobs(), 0);
    assert!(m.counted("dropped", 1), "{}", m.metrics.render());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_copy_of_a_job_held_here_is_answered_dropped() {
    let mut m = Member::start();
    let mut stream = m.welcome(Vec::new()).await;
    offer(&mut stream, whole_node("j", 1, 60)).await;
    stream.send(copy(12, whole_node("j", 1, 60))).await;
    let Err((job_id, copy_token, reason, unsupported)) = copy_message(&mut stream).await else {
        panic!("a copy of a held job is refused");
    };
    assert_eq!((job_id.as_str(), copy_token, unsupported), ("j", 12, false));
    assert!(reason.contains("holds a binding"), "{reason}");
    assert!(m.counted("refused", 1), "{}", m.metrics.render());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_backend_without_a_start_gate_answers_unsupported_and_a_grant_is_an_offer() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    stream.send(copy(11, whole_node("j", 5, 60))).await;
    let Err((job_id, copy_token, reason, unsupported)) = copy_message(&mut stream).await else {
        panic!("a backend without a start gate refuses copies");
    };
    assert_eq!((job_id.as_str(), copy_token, unsupported), ("j", 11, true));
    assert!(reason.contains("has no start gate for sibling copies yet"), "{reason}");
    stream.send(GatewayCommand::Grant { copy_token: 11, assignment: whole_node("j", 9, 60) }).await;
    assert_eq!(stream.reply().await, ("j".into(), 9, true, String::new()));
    assert_eq!(h.call().await, Call::Submit("j".into(), 9), "submitted as an offer");
    let text = h.metrics.render();
    assert!(text.contains("meridian_agent_sibling_copies_total{outcome=\"unsupported\"} 1"), "{text}");
    h.stop().await;
}
