//! The event loop against a scripted backend and an in-memory gateway, in paused tokio time: the
//! test plays the gateway (it answers dials, sends commands, reads events) and the clock only
//! moves when every task waits, so timings are exact and nothing sleeps for real.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meridian_proto::inventory::{BackendKind, ClusterInfo, Inventory, QueuePressure};
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand, JobReport};
use meridian_proto::spec::JobSpec;
use meridian_proto::testing::cluster_info;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::link::{Connection, Dial, Dialing, FromGateway, Inbound, LinkError};
use super::{Agent, Settings};
use crate::backend::{
    Admission, BackendFuture, HeldJob, InventorySource, JobEvent, JobEventSender, JobPhase, LocalBackend,
};
use crate::test_jobs::{self, job_spec};
use crate::usage::{GpuSample, Sampling, UtilizationSource};

/// Longest (virtual) wait for anything a test expects.
pub(super) const PATIENCE: Duration = Duration::from_secs(600);
pub(super) const INTERVAL: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------- a scripted backend

/// A backend call, as the test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    Submit(String, u64),
    Cancel(String, u64),
}

/// How the fake answers a submit of one job.
#[derive(Clone)]
enum Script {
    Start,
    Queue(&'static str),
    /// Waits until notified, then starts.
    Hang(Arc<Notify>),
}

pub(super) struct FakeBackend {
    calls: mpsc::UnboundedSender<Call>,
    scripts: Mutex<BTreeMap<String, Script>>,
    adopt: Mutex<Vec<HeldJob>>,
    /// When set, a cancel returns only once notified (a stop that takes its time).
    cancel_gate: Mutex<Option<Arc<Notify>>>,
}

impl FakeBackend {
    fn script(&self, job_id: &str, script: Script) {
        self.scripts.lock().unwrap().insert(job_id.into(), script);
    }
}

impl LocalBackend for FakeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Builtin
    }

    fn submit<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, Admission> {
        let _ = self.calls.send(Call::Submit(job.job_id.clone(), job.fencing_token));
        let script = self.scripts.lock().unwrap().get(&job.job_id).cloned().unwrap_or(Script::Start);
        Box::pin(async move {
            Ok(match script {
                Script::Start => Admission::Started { nodes: vec!["n-0".into()] },
                Script::Queue(reason) => Admission::Queued { reason: reason.into() },
                Script::Hang(release) => {
                    release.notified().await;
                    Admission::Started { nodes: vec!["n-0".into()] }
                }
            })
        })
    }

    fn cancel<'a>(&'a self, job_id: &'a str, fencing_token: u64) -> BackendFuture<'a, ()> {
        let _ = self.calls.send(Call::Cancel(job_id.into(), fencing_token));
        let gate = self.cancel_gate.lock().unwrap().clone();
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.notified().await;
            }
            Ok(())
        })
    }

    fn list(&self) -> BackendFuture<'_, Vec<HeldJob>> {
        Box::pin(std::future::ready(Ok(self.adopt.lock().unwrap().clone())))
    }
}

impl InventorySource for FakeBackend {
    fn inventory(&self) -> BackendFuture<'_, Inventory> {
        Box::pin(std::future::ready(Ok(Inventory::default())))
    }

    fn pressure(&self) -> BackendFuture<'_, QueuePressure> {
        Box::pin(std::future::ready(Ok(QueuePressure::default())))
    }
}

// ---------------------------------------------------------------- an in-memory gateway

pub(super) struct DialRequest {
    hello: AgentHello,
    answer: oneshot::Sender<Result<Connection, LinkError>>,
}

pub(super) struct MemoryDialer {
    pub(super) dials: mpsc::UnboundedSender<DialRequest>,
}

impl Dial for MemoryDialer {
    fn dial(&self, hello: AgentHello) -> Dialing {
        let (answer, answered) = oneshot::channel();
        let _ = self.dials.send(DialRequest { hello, answer });
        Box::pin(async move { answered.await.unwrap_or(Err(LinkError::Closed)) })
    }
}

/// One stream, seen from the gateway.
pub(super) struct Stream {
    hello: AgentHello,
    /// The epoch `send` stamps on messages (0, as from a gateway without election, unless set).
    pub(super) epoch: u64,
    pub(super) to_agent: mpsc::Sender<Result<FromGateway, LinkError>>,
    pub(super) from_agent: mpsc::Receiver<AgentEvent>,
}

impl Stream {
    pub(super) async fn send(&self, command: GatewayCommand) {
        self.send_raw(Inbound::Command(Box::new(command))).await;
    }

    /// Sends any converted message at the stream's epoch.
    pub(super) async fn send_raw(&self, message: Inbound) {
        self.to_agent.send(Ok(FromGateway { epoch: self.epoch, message })).await.unwrap();
    }

    pub(super) async fn next(&mut self) -> AgentEvent {
        tokio::time::timeout(PATIENCE, self.from_agent.recv())
            .await
            .expect("the agent said nothing")
            .expect("the agent closed the stream")
    }

    /// The next event `pick` accepts, skipping others.
    pub(super) async fn next_of<T>(&mut self, mut pick: impl FnMut(AgentEvent) -> Option<T>) -> T {
        loop {
            if let Some(found) = pick(self.next().await) {
                return found;
            }
        }
    }

    pub(super) async fn heartbeat(&mut self) -> (u64, Vec<JobReport>) {
        self.next_of(|e| match e {
            AgentEvent::Heartbeat { seq, jobs } => Some((seq, jobs)),
            _ => None,
        })
        .await
    }

    pub(super) async fn status(&mut self) -> JobReport {
        self.next_of(|e| match e {
            AgentEvent::Status(report) => Some(report),
            _ => None,
        })
        .await
    }

    /// The next terminal status.
    pub(super) async fn result(&mut self) -> JobReport {
        self.next_of(|e| match e {
            AgentEvent::Status(report) if report.state.is_terminal() => Some(report),
            _ => None,
        })
        .await
    }

    /// The next offer reply: (job, token, accepted, reason).
    pub(super) async fn reply(&mut self) -> (String, u64, bool, String) {
        self.next_of(|e| match e {
            AgentEvent::OfferReply { job_id, fencing_token, accepted, reason, .. } => {
                Some((job_id, fencing_token, accepted, reason))
            }
            _ => None,
        })
        .await
    }
}

/// The agent under test, its fake backend, and the gateway's end of everything.
pub(super) struct Harness {
    pub(super) dials: mpsc::UnboundedReceiver<DialRequest>,
    pub(super) calls: mpsc::UnboundedReceiver<Call>,
    backend: Arc<FakeBackend>,
    events: JobEventSender,
    stop: Option<oneshot::Sender<()>>,
    agent: Option<JoinHandle<()>>,
    pub(super) metrics: crate::metrics::AgentMetrics,
}

impl Harness {
    pub(super) fn start() -> Self {
        Self::start_adopting(Vec::new())
    }

    /// Starts an agent whose backend still holds `adopt`.
    fn start_adopting(adopt: Vec<HeldJob>) -> Self {
        Self::start_with(adopt, None)
    }

    /// Starts an agent that samples GPU utilisation as `sampling` says.
    fn start_sampling(sampling: Sampling) -> Self {
        Self::start_with(Vec::new(), Some(sampling))
    }

    fn start_with(adopt: Vec<HeldJob>, sampling: Option<Sampling>) -> Self {
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (dials_tx, dials) = mpsc::unbounded_channel();
        let (events, events_rx) = mpsc::unbounded_channel();
        let backend = Arc::new(FakeBackend {
            calls: calls_tx,
            scripts: Mutex::new(BTreeMap::new()),
            adopt: Mutex::new(adopt),
            cancel_gate: Mutex::new(None),
        });
        let settings = Settings {
            info: ClusterInfo { prices: BTreeMap::new(), ..cluster_info("east") },
            gateways: vec!["memory".into()],
            tls: None,
            report_interval: INTERVAL,
        };
        let agent = Agent::with_dialer(
            settings,
            Box::new(MemoryDialer { dials: dials_tx }),
            backend.clone(),
            backend.clone(),
            events_rx,
        );
        let agent = match sampling {
            Some(sampling) => agent.with_sampling(sampling),
            None => agent,
        };
        let metrics = agent.metrics().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let agent = tokio::spawn(agent.run(async move {
            let _ = stopped.await;
        }));
        Self { dials, calls, backend, events, stop: Some(stop), agent: Some(agent), metrics }
    }

    pub(super) async fn dial(&mut self) -> DialRequest {
        tokio::time::timeout(PATIENCE, self.dials.recv()).await.expect("the agent did not dial").unwrap()
    }

    /// Accepts the next dial.
    pub(super) async fn accept(&mut self) -> Stream {
        accept_dial(&mut self.dials).await
    }

    /// Accepts the next dial and welcomes it.
    pub(super) async fn welcome(&mut self, bound: Vec<Assignment>, lease: Option<Duration>) -> Stream {
        self.welcome_at(0, bound, lease).await
    }

    /// Accepts the next dial and welcomes it from a leader of `epoch`; the stream's later
    /// messages carry the same epoch.
    pub(super) async fn welcome_at(&mut self, epoch: u64, bound: Vec<Assignment>, lease: Option<Duration>) -> Stream {
        let mut stream = self.accept().await;
        stream.epoch = epoch;
        stream.send(GatewayCommand::Welcome { bound, lease }).await;
        stream
    }

    pub(super) async fn call(&mut self) -> Call {
        tokio::time::timeout(PATIENCE, self.calls.recv()).await.expect("no backend call").unwrap()
    }

    pub(super) fn emit(&self, job_id: &str, fencing_token: u64, phase: JobPhase) {
        self.events.send(JobEvent { job_id: job_id.into(), fencing_token, phase }).unwrap();
    }

    /// Stops the agent and checks it stops.
    pub(super) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(agent) = self.agent.take() {
            tokio::time::timeout(PATIENCE, agent).await.expect("the agent did not stop").unwrap();
        }
    }
}

/// Accepts the next dial on `dials` (shared with the sibling copies' tests, whose agents run
/// the builtin backend).
pub(super) async fn accept_dial(dials: &mut mpsc::UnboundedReceiver<DialRequest>) -> Stream {
    let request = tokio::time::timeout(PATIENCE, dials.recv()).await.expect("the agent did not dial").unwrap();
    let (to_agent, inbound) = mpsc::channel(1024);
    let (outbound, from_agent) = mpsc::channel(1024);
    let connection = Connection {
        gateway: "memory".into(),
        hello_sent: Instant::now(),
        outbound,
        inbound: Box::pin(ReceiverStream::new(inbound)),
    };
    assert!(request.answer.send(Ok(connection)).is_ok());
    Stream { hello: request.hello, epoch: 0, to_agent, from_agent }
}

/// An offer of a one-GPU job (shared with the ledger's tests).
pub(super) fn assignment(job_id: &str, fencing_token: u64) -> Assignment {
    let spec = JobSpec { name: job_id.into(), ..job_spec("team", 1, 1, 60) };
    test_jobs::assignment(job_id, fencing_token, spec)
}

pub(super) fn succeeded() -> JobPhase {
    JobPhase::Succeeded { message: "completed".into() }
}

/// (job, token, state) of each report.
fn summary(jobs: &[JobReport]) -> Vec<(&str, u64, JobState)> {
    jobs.iter().map(|r| (r.job_id.as_str(), r.fencing_token, r.state)).collect()
}

/// Offers `job` (token 1) and waits for its acceptance.
pub(super) async fn offer_and_accept(stream: &mut Stream, job: &str, token: u64) {
    stream.send(GatewayCommand::Offer(assignment(job, token))).await;
    let (job_id, fencing_token, accepted, reason) = stream.reply().await;
    assert_eq!((job_id.as_str(), fencing_token, accepted), (job, token, true), "{reason}");
}

// ---------------------------------------------------------------- tests

#[tokio::test(start_paused = true)]
async fn a_refused_stream_is_retried_with_the_same_hello() {
    let mut h = Harness::start();
    let first = h.dial().await;
    let refused_at = Instant::now();
    let hello = first.hello.clone();
    assert!(first.answer.send(Err(LinkError::Refused("cluster `east` is held by agent 1f2e".into()))).is_ok());
    let mut stream = h.welcome(Vec::new(), None).await;
    assert!(refused_at.elapsed() >= Duration::from_millis(75), "the retry waits for the backoff");
    assert_eq!(stream.hello, hello, "same process, same instance id");
    assert_eq!(hello.instance_id.len(), 32);
    assert_eq!(hello.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(hello.info.name, "east");
    stream.heartbeat().await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_list_held_jobs_with_their_tokens_and_states() {
    let mut h = Harness::start();
    h.backend.script("waits", Script::Queue("waiting in local queue `team` (1 of 1)"));
    let mut stream = h.welcome(Vec::new(), None).await;
    let (first_seq, jobs) = stream.heartbeat().await;
    assert!(jobs.is_empty());

    stream.send(GatewayCommand::Offer(assignment("runs", 4))).await;
    // Inventory before the acceptance, then the acceptance, then Running with the nodes.
    assert!(matches!(stream.next().await, AgentEvent::Inventory(_)));
    assert!(matches!(stream.next().await, AgentEvent::Pressure(_)));
    assert_eq!(stream.reply().await, ("runs".into(), 4, true, String::new()));
    let running = stream.status().await;
    assert_eq!((running.state, running.nodes.clone()), (JobState::Running, vec!["n-0".to_string()]));

    stream.send(GatewayCommand::Offer(assignment("waits", 7))).await;
    let (_, _, accepted, reason) = stream.reply().await;
    assert!(accepted);
    assert!(reason.contains("local queue"), "{reason}");

    let (seq, jobs) = stream.heartbeat().await;
    assert!(seq > first_seq);
    assert_eq!(summary(&jobs), [("runs", 4, JobState::Running), ("waits", 7, JobState::Bound)]);
    assert!(jobs[1].message.contains("local queue"), "a job queued locally says why: {jobs:?}");
    let (next_seq, _) = stream.heartbeat().await;
    assert_eq!(next_seq, seq + 1, "sequence numbers grow by one");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_terminal_result_is_resent_until_acked_then_disappears_from_heartbeats() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    h.emit("j", 1, succeeded());
    let result = stream.result().await;
    assert_eq!((result.state, result.fencing_token), (JobState::Succeeded, 1));
    for _ in 0..2 {
        let (_, jobs) = stream.heartbeat().await;
        assert_eq!(summary(&jobs), [("j", 1, JobState::Succeeded)], "still unacknowledged");
    }

    // The stream drops; the result goes out again after the next welcome.
    drop(stream);
    let mut stream = h.welcome(vec![assignment("j", 1)], None).await;
    assert_eq!(stream.status().await, result);
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("j", 1, JobState::Succeeded)]);

    stream.send(GatewayCommand::Ack { job_id: "j".into(), fencing_token: 1 }).await;
    let (_, jobs) = stream.heartbeat().await;
    assert!(jobs.is_empty(), "an acknowledged result is forgotten: {jobs:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_job_that_finishes_while_the_stream_is_down_is_reported_succeeded_after_the_welcome() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 3).await;
    drop(stream);
    // While the agent is away from the gateway, the job completes.
    let redial = h.dial().await;
    h.emit("j", 3, succeeded());
    drop(redial); // this dial fails; the next one succeeds
    let mut stream = h.welcome(vec![assignment("j", 3)], None).await;
    let first = stream.next().await;
    let AgentEvent::Status(result) = first else { panic!("the result comes first after the welcome: {first:?}") };
    assert_eq!((result.job_id.as_str(), result.fencing_token, result.state), ("j", 3, JobState::Succeeded));
    assert!(!result.requeue);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn results_of_bindings_the_welcome_no_longer_lists_are_dropped() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    h.emit("j", 1, succeeded());
    assert_eq!(stream.result().await.state, JobState::Succeeded);
    drop(stream);
    let mut stream = h.welcome(Vec::new(), None).await;
    let first = stream.next().await;
    assert!(matches!(&first, AgentEvent::Heartbeat { jobs, .. } if jobs.is_empty()), "{first:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_submit_does_not_stop_heartbeats() {
    let mut h = Harness::start();
    let release = Arc::new(Notify::new());
    h.backend.script("slow", Script::Hang(release.clone()));
    let mut stream = h.welcome(Vec::new(), None).await;
    stream.send(GatewayCommand::Offer(assignment("slow", 1))).await;
    assert_eq!(h.call().await, Call::Submit("slow".into(), 1));
    let (mut last, _) = stream.heartbeat().await;
    for _ in 0..5 {
        let (seq, jobs) = stream.heartbeat().await;
        assert_eq!(seq, last + 1);
        assert_eq!(
            summary(&jobs),
            [("slow", 1, JobState::Offered)],
            "listed as being submitted (not held) until the backend answers"
        );
        last = seq;
    }
    release.notify_one();
    assert_eq!(stream.reply().await, ("slow".into(), 1, true, String::new()));
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("slow", 1, JobState::Running)]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_stops_the_jobs_and_reports_them_failed_for_requeue() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), Some(Duration::from_secs(10))).await;
    let welcomed_at = Instant::now();
    offer_and_accept(&mut stream, "j", 2).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 2));
    // No renewal comes.
    assert_eq!(h.call().await, Call::Cancel("j".into(), 2));
    assert_eq!(welcomed_at.elapsed(), Duration::from_secs(10), "stopped exactly when the lease ran out");
    // The agent gives up the stream that brought no renewal and reports after the next welcome.
    let mut stream = h.welcome(vec![assignment("j", 2)], Some(Duration::from_secs(10))).await;
    let result = stream.result().await;
    assert_eq!((result.job_id.as_str(), result.state, result.requeue), ("j", JobState::Failed, true));
    assert_eq!(
        result.message,
        "stopped by east: no lease renewal from the gateway for 10s; the gateway places it again"
    );
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("j", 2, JobState::Failed)]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_renewed_lease_keeps_the_jobs_running() {
    let mut h = Harness::start();
    let lease = Duration::from_secs(5);
    let mut stream = h.welcome(Vec::new(), Some(lease)).await;
    offer_and_accept(&mut stream, "j", 1).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let (seq, jobs) = stream.heartbeat().await;
        assert_eq!(summary(&jobs), [("j", 1, JobState::Running)]);
        stream.send(GatewayCommand::Lease { heartbeat_seq: seq, lease }).await;
    }
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    assert!(h.calls.try_recv().is_err(), "nothing was cancelled");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_lease_counts_from_the_sending_of_the_heartbeat_it_answers() {
    let mut h = Harness::start();
    let lease = Duration::from_secs(10);
    let mut stream = h.welcome(Vec::new(), Some(lease)).await;
    offer_and_accept(&mut stream, "j", 1).await;
    let mut sent_at = BTreeMap::new();
    for _ in 0..3 {
        let (seq, _) = stream.heartbeat().await;
        sent_at.insert(seq, Instant::now());
    }
    // A late renewal answering the oldest of those heartbeats: the deadline is neither the
    // welcome's nor one counted from now.
    let (&answered, &answered_at) = sent_at.first_key_value().unwrap();
    stream.send(GatewayCommand::Lease { heartbeat_seq: answered, lease }).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    assert_eq!(h.call().await, Call::Cancel("j".into(), 1));
    assert_eq!(Instant::now(), answered_at + lease, "counted from the heartbeat's sending, not the renewal's arrival");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn welcome_reconcile_cancels_jobs_not_listed_or_listed_with_another_token() {
    let held = |job_id: &str, fencing_token: u64| HeldJob {
        job_id: job_id.into(),
        fencing_token,
        phase: JobPhase::Running { nodes: vec!["n-0".into()] },
    };
    let mut h = Harness::start_adopting(vec![held("keep", 1), held("old-token", 2), held("unlisted", 3)]);
    let mut stream = h.welcome(vec![assignment("keep", 1), assignment("old-token", 5)], None).await;
    let mut cancels = vec![h.call().await, h.call().await];
    cancels.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(cancels, [Call::Cancel("old-token".into(), 2), Call::Cancel("unlisted".into(), 3)]);
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(
        summary(&jobs),
        [
            ("keep", 1, JobState::Running),
            ("old-token", 2, JobState::Unknown),
            ("unlisted", 3, JobState::Unknown),
            ("old-token", 5, JobState::Failed)
        ],
        "stale copies are listed as being stopped until the backend confirms"
    );
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("keep", 1, JobState::Running), ("old-token", 5, JobState::Failed)]);
    assert!(jobs[1].requeue, "a binding the member lost is placed again: {jobs:?}");
    assert!(h.calls.try_recv().is_err(), "the listed binding is kept");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_the_job_and_reports_cancelled_while_a_stale_cancel_is_ignored() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 5).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 5));
    stream.send(GatewayCommand::Cancel { job_id: "j".into(), fencing_token: 4 }).await;
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("j", 5, JobState::Running)], "a cancel of an older binding changes nothing");
    stream.send(GatewayCommand::Cancel { job_id: "j".into(), fencing_token: 5 }).await;
    assert_eq!(h.call().await, Call::Cancel("j".into(), 5));
    let result = stream.result().await;
    assert_eq!((result.state, result.fencing_token), (JobState::Cancelled, 5));
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("j", 5, JobState::Cancelled)]);
    stream.send(GatewayCommand::Ack { job_id: "j".into(), fencing_token: 5 }).await;
    let (_, jobs) = stream.heartbeat().await;
    assert!(jobs.is_empty());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_offer_with_a_newer_token_replaces_the_older_copy_and_a_repeat_is_accepted_again() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    offer_and_accept(&mut stream, "j", 1).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    offer_and_accept(&mut stream, "j", 2).await;
    assert_eq!(h.call().await, Call::Cancel("j".into(), 1), "the old copy stops before the new one starts");
    assert_eq!(h.call().await, Call::Submit("j".into(), 2));
    let (_, jobs) = stream.heartbeat().await;
    assert_eq!(summary(&jobs), [("j", 2, JobState::Running)]);
    stream.send(GatewayCommand::Offer(assignment("j", 1))).await;
    let (_, _, accepted, reason) = stream.reply().await;
    assert!(!accepted && reason.contains("newer"), "{reason}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_offer_with_an_invalid_spec_is_refused_with_the_reason() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    let bad = Inbound::InvalidOffer { job_id: "j".into(), fencing_token: 1, reason: "offer.spec: missing".into() };
    stream.send_raw(bad).await;
    let (job_id, _, accepted, reason) = stream.reply().await;
    assert_eq!((job_id.as_str(), accepted), ("j", false));
    assert!(reason.contains("offer.spec"), "{reason}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_logs_request_is_answered_with_the_backends_words() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    let request =
        GatewayCommand::Logs { request_id: 42, job_id: "j".into(), fencing_token: 1, from: None, max_bytes: 100 };
    stream.send(request).await;
    let (request_id, result) = stream
        .next_of(|event| match event {
            AgentEvent::Logs { request_id, result } => Some((request_id, result)),
            _ => None,
        })
        .await;
    assert_eq!(request_id, 42);
    let message = result.unwrap_err();
    assert!(message.contains("job `j`") && message.contains("keeps no job output"), "{message}");
    h.stop().await;
}

/// A utilisation source whose one GPU (`n-0`, device 0) reads what the test sets.
struct SettableGpu(Mutex<f64>);

impl UtilizationSource for SettableGpu {
    fn sample(&self) -> crate::usage::Result<Vec<GpuSample>> {
        Ok(vec![GpuSample { node: "n-0".into(), gpu: "0".into(), utilization: *self.0.lock().unwrap() }])
    }
}

#[tokio::test(start_paused = true)]
async fn heartbeats_carry_each_running_jobs_mean_utilisation_over_the_window() {
    let gpu = Arc::new(SettableGpu(Mutex::new(0.02)));
    let sampling =
        Sampling { source: gpu.clone(), interval: Duration::from_millis(500), window: Duration::from_secs(3) };
    let mut h = Harness::start_sampling(sampling);
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j-1", 1).await;
    let usage = loop {
        let (_, jobs) = stream.heartbeat().await;
        if let Some(usage) = jobs.iter().find(|r| r.job_id == "j-1").and_then(|r| r.usage) {
            break usage;
        }
    };
    assert!((usage.gpu_utilization - 0.02).abs() < 1e-9, "{usage:?}");
    assert!(usage.samples >= 1 && usage.window <= Duration::from_secs(3), "{usage:?}");
    let text = h.metrics.render();
    for line in [
        "meridian_agent_stream_connected 1",
        "meridian_agent_jobs{state=\"Running\"} 1",
        "meridian_agent_gpu_utilization_ratio{node=\"n-0\",gpu=\"0\"} 0.02",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
    // Busy samples push the low ones out of the window.
    *gpu.0.lock().unwrap() = 0.9;
    let changed_at = Instant::now();
    let mut last = usage.gpu_utilization;
    while (last - 0.9).abs() > 1e-9 {
        let (_, jobs) = stream.heartbeat().await;
        let usage = jobs.iter().find(|r| r.job_id == "j-1").and_then(|r| r.usage).unwrap();
        assert!(usage.gpu_utilization + 1e-9 >= last, "the mean only rises: {usage:?} after {last}");
        last = usage.gpu_utilization;
    }
    assert!(changed_at.elapsed() <= Duration::from_secs(6), "within a window and a heartbeat");
    // A finished job's result carries none.
    h.emit("j-1", 1, succeeded());
    assert_eq!(stream.result().await.usage, None);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_jobs_result_is_sent_only_once_the_backend_has_stopped_it() {
    let mut h = Harness::start();
    let mut stream = h.welcome(Vec::new(), None).await;
    offer_and_accept(&mut stream, "j", 1).await;
    assert_eq!(h.call().await, Call::Submit("j".into(), 1));
    let gate = Arc::new(Notify::new());
    *h.backend.cancel_gate.lock().unwrap() = Some(gate.clone());
    stream.send(GatewayCommand::Cancel { job_id: "j".into(), fencing_token: 1 }).await;
    assert_eq!(h.call().await, Call::Cancel("j".into(), 1));
    for _ in 0..3 {
        let (_, jobs) = stream.heartbeat().await;
        assert_eq!(summary(&jobs), [("j", 1, JobState::Unknown)], "being stopped: listed, no result yet");
    }
    gate.notify_one();
    let result = stream.result().await;
    assert_eq!((result.job_id.as_str(), result.fencing_token, result.state), ("j", 1, JobState::Cancelled));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_welcome_that_arrives_after_the_lease_it_grants_would_end_is_ignored_and_the_agent_dials_again() {
    let mut h = Harness::start();
    let stream = h.accept().await;
    // Held in the network longer than the lease it grants, counted from the hello.
    tokio::time::advance(Duration::from_secs(30)).await;
    stream
        .send(GatewayCommand::Welcome { bound: vec![assignment("j", 1)], lease: Some(Duration::from_secs(20)) })
        .await;
    let mut fresh = h.welcome(Vec::new(), Some(Duration::from_secs(20))).await;
    let (_, jobs) = fresh.heartbeat().await;
    assert!(jobs.is_empty(), "the stale welcome reconciled nothing: {jobs:?}");
    assert!(h.calls.try_recv().is_err(), "and started or stopped nothing");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_pending_reason_rides_the_heartbeat_instead_of_a_status_message() {
    let mut h = Harness::start();
    h.backend.script("q", Script::Queue("waiting in local queue `default` (2 of 2)"));
    let mut stream = h.welcome(Vec::new(), None).await;
    stream.send(GatewayCommand::Offer(assignment("q", 1))).await;
    assert!(stream.reply().await.2, "the queued job is accepted");
    h.emit("q", 1, JobPhase::Pending { reason: "waiting in local queue `default` (1 of 2)".into() });
    h.emit("q", 1, JobPhase::Running { nodes: vec!["n-0".into()] });
    let status = stream.status().await;
    assert_eq!(status.state, JobState::Running, "the reworded wait was not sent on its own: {status:?}");
    h.emit("q", 1, JobPhase::Pending { reason: "requeued locally (1 of 1)".into() });
    let (_, jobs) = stream
        .next_of(|e| match e {
            AgentEvent::Heartbeat { seq, jobs } if jobs.iter().any(|r| r.state == JobState::Bound) => Some((seq, jobs)),
            AgentEvent::Status(report) if report.state == JobState::Bound => Some((0, vec![report])),
            _ => None,
        })
        .await;
    assert_eq!(jobs[0].message, "requeued locally (1 of 1)", "a change of state is sent with its words");
    h.stop().await;
}
