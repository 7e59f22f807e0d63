//! The real agent (built from its config, with the builtin backend) against a small in-process
//! gateway: a real tonic `Federation` server on `127.0.0.1:0` that the test scripts message by
//! message, speaking the protocol through the domain types.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use meridian_agent::config::AgentConfig;
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::pb::federation_server::{Federation, FederationServer};
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand, JobReport};
use meridian_proto::spec::JobSpec;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// Longest wait for anything the agent should do promptly.
const PATIENCE: Duration = Duration::from_secs(20);

/// A stream the fake gateway took, handed to the test.
struct Attached {
    hello: AgentHello,
    to_agent: mpsc::Sender<Result<pb::GatewayMessage, Status>>,
    from_agent: Streaming<pb::AgentMessage>,
}

impl Attached {
    async fn send(&self, command: GatewayCommand) {
        self.send_at(0, command).await;
    }

    /// Sends `command` as a leader of `epoch` would.
    async fn send_at(&self, epoch: u64, command: GatewayCommand) {
        self.to_agent.send(Ok(pb::GatewayMessage { epoch, ..pb::GatewayMessage::from(&command) })).await.unwrap();
    }

    async fn next(&mut self) -> AgentEvent {
        let message = timeout(PATIENCE, self.from_agent.message()).await.expect("the agent said nothing");
        let message = message.expect("stream error").expect("the agent closed the stream");
        Option::<AgentEvent>::try_from(message).expect("a valid agent message").expect("not a second hello")
    }

    async fn next_of<T>(&mut self, mut pick: impl FnMut(AgentEvent) -> Option<T>) -> T {
        loop {
            if let Some(found) = pick(self.next().await) {
                return found;
            }
        }
    }

    async fn heartbeat(&mut self) -> Vec<JobReport> {
        self.next_of(|e| match e {
            AgentEvent::Heartbeat { jobs, .. } => Some(jobs),
            _ => None,
        })
        .await
    }
}

/// The gateway's `Federation` service: refuses streams while `refusing` is set (as a gateway does
/// while another live agent holds the cluster), otherwise hands each stream to the test.
struct FakeFederation {
    refusing: Arc<AtomicBool>,
    refused: mpsc::UnboundedSender<AgentHello>,
    attached: mpsc::UnboundedSender<Attached>,
}

#[tonic::async_trait]
impl Federation for FakeFederation {
    type AttachStream = ReceiverStream<Result<pb::GatewayMessage, Status>>;

    async fn attach(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let mut from_agent = request.into_inner();
        let first = from_agent.message().await?.and_then(|m| m.body);
        let Some(pb::agent_message::Body::Hello(hello)) = first else {
            return Err(Status::invalid_argument("the first message must be `hello`"));
        };
        let hello = AgentHello::try_from(hello).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if self.refusing.load(Ordering::SeqCst) {
            let message = format!("cluster `{}` is held by another live agent", hello.info.name);
            let _ = self.refused.send(hello);
            return Err(Status::already_exists(message));
        }
        let (to_agent, stream) = mpsc::channel(64);
        let _ = self.attached.send(Attached { hello, to_agent, from_agent });
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// A fake gateway and one agent dialing it.
struct World {
    refusing: Arc<AtomicBool>,
    refused: mpsc::UnboundedReceiver<AgentHello>,
    attached: mpsc::UnboundedReceiver<Attached>,
    stop_gateway: oneshot::Sender<()>,
    gateway: JoinHandle<Result<(), tonic::transport::Error>>,
    stop_agent: oneshot::Sender<()>,
    agent: JoinHandle<()>,
}

impl World {
    /// `time_scale`: the builtin backend runs a job for `estimate × time_scale`.
    async fn start(refusing: bool, time_scale: f64) -> World {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        World::start_on(listener, refusing, time_scale, &address).await
    }

    /// The fake gateway serves on `listener`; the agent's config says `gateway: {addresses}`.
    async fn start_on(listener: tokio::net::TcpListener, refusing: bool, time_scale: f64, addresses: &str) -> World {
        let refusing = Arc::new(AtomicBool::new(refusing));
        let (refused_tx, refused) = mpsc::unbounded_channel();
        let (attached_tx, attached) = mpsc::unbounded_channel();
        let service = FakeFederation { refusing: Arc::clone(&refusing), refused: refused_tx, attached: attached_tx };
        let (stop_gateway, gateway_stopped) = oneshot::channel::<()>();
        let gateway = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(FederationServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                    let _ = gateway_stopped.await;
                }),
        );

        let yaml = format!(
            "cluster: east\nregion: us-east\ngateway: {addresses}\ninsecure: true\nrunner: simulated\ntimeScale: {time_scale}\nreportInterval: 100ms\n\
             nodes:\n  - {{shape: dgx, count: 1, gpuType: h100, gpus: 8, cpu: 64, memoryGiB: 512}}\n"
        );
        let config = AgentConfig::parse(&yaml, Path::new("east.yaml")).unwrap();
        let agent = meridian_agent::agent_from_config(&config).unwrap();
        let (stop_agent, agent_stopped) = oneshot::channel::<()>();
        let agent = tokio::spawn(agent.run(async move {
            let _ = agent_stopped.await;
        }));
        World { refusing, refused, attached, stop_gateway, gateway, stop_agent, agent }
    }

    async fn attached(&mut self) -> Attached {
        timeout(PATIENCE, self.attached.recv()).await.expect("the agent did not attach").unwrap()
    }

    async fn refused(&mut self) -> AgentHello {
        timeout(PATIENCE, self.refused.recv()).await.expect("the agent did not retry").unwrap()
    }

    async fn stop(self) {
        let _ = self.stop_agent.send(());
        timeout(PATIENCE, self.agent).await.expect("the agent did not stop").unwrap();
        let _ = self.stop_gateway.send(());
        timeout(PATIENCE, self.gateway).await.expect("the gateway did not stop").unwrap().unwrap();
    }
}

/// A gateway that is not the leader: it refuses every stream, naming the leader.
struct Standby {
    leader: String,
}

#[tonic::async_trait]
impl Federation for Standby {
    type AttachStream = ReceiverStream<Result<pb::GatewayMessage, Status>>;

    async fn attach(&self, _: Request<Streaming<pb::AgentMessage>>) -> Result<Response<Self::AttachStream>, Status> {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert("meridian-leader", self.leader.parse().unwrap());
        Err(Status::with_metadata(tonic::Code::Unavailable, "this gateway is a standby", metadata))
    }
}

/// Serves a standby naming `leader` on loopback; returns its address and its task.
async fn start_standby(leader: &str) -> (String, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(FederationServer::new(Standby { leader: leader.to_string() }))
        .serve_with_incoming(TcpListenerStream::new(listener));
    (address, tokio::spawn(async move { server.await.unwrap() }))
}

/// A one-hour, 2-GPU job, as the gateway's offer would carry it.
fn job(job_id: &str, fencing_token: u64) -> Assignment {
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "train",
        "tenant": "default",
        "gang": {"replicas": 1, "resources": {"gpus": 2}},
        "runtime": {"estimate": "1h"},
        "payload": {"image": "trainer"}
    }))
    .unwrap();
    Assignment { job_id: job_id.into(), fencing_token, spec, last_preempted_at_ms: None }
}

#[tokio::test]
async fn a_refused_stream_is_retried_until_the_gateway_takes_it() {
    let mut world = World::start(true, 1.0).await;
    let first = world.refused().await;
    let second = world.refused().await;
    assert_eq!(first.instance_id, second.instance_id, "the same process retries with the same instance id");
    world.refusing.store(false, Ordering::SeqCst);
    let mut stream = world.attached().await;
    assert_eq!(stream.hello.instance_id, first.instance_id);
    stream.send(GatewayCommand::Welcome { bound: Vec::new(), lease: None }).await;
    assert!(stream.heartbeat().await.is_empty());
    world.stop().await;
}

#[tokio::test]
async fn a_job_that_finishes_while_the_stream_is_down_is_reported_succeeded_after_reconnect() {
    // A one-hour job runs for half a second.
    let run_time = Duration::from_millis(500);
    let mut world = World::start(false, run_time.as_secs_f64() / 3600.0).await;
    let mut stream = world.attached().await;
    stream.send(GatewayCommand::Welcome { bound: Vec::new(), lease: None }).await;
    stream.send(GatewayCommand::Offer(job("j-1", 7))).await;
    let started = Instant::now();
    let accepted = stream
        .next_of(|e| match e {
            AgentEvent::OfferReply { accepted, .. } => Some(accepted),
            _ => None,
        })
        .await;
    assert!(accepted);

    // The gateway goes away (and refuses the agent's reconnects) until the job has surely ended.
    world.refusing.store(true, Ordering::SeqCst);
    drop(stream);
    while started.elapsed() < run_time * 2 {
        world.refused().await;
    }
    world.refusing.store(false, Ordering::SeqCst);

    let mut stream = world.attached().await;
    stream.send(GatewayCommand::Welcome { bound: vec![job("j-1", 7)], lease: None }).await;
    let first = stream.next().await;
    let AgentEvent::Status(result) = first else { panic!("the result comes first after the welcome: {first:?}") };
    assert_eq!((result.job_id.as_str(), result.fencing_token, result.state), ("j-1", 7, JobState::Succeeded));
    let jobs = stream.heartbeat().await;
    assert_eq!(jobs, vec![result.clone()], "the result stays in every heartbeat until acknowledged");

    stream.send(GatewayCommand::Ack { job_id: "j-1".into(), fencing_token: 7 }).await;
    // A heartbeat already under way may still carry it; after that, never again.
    while !stream.heartbeat().await.is_empty() {}
    for _ in 0..3 {
        assert!(stream.heartbeat().await.is_empty());
    }
    world.stop().await;
}

#[tokio::test]
async fn an_agent_given_several_gateways_finds_the_leader_and_refuses_an_older_epoch() {
    let leader = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let leader_address = format!("http://{}", leader.local_addr().unwrap());
    let (standby, standby_server) = start_standby(&leader_address).await;
    let nothing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let down = format!("http://{}", nothing.local_addr().unwrap());
    drop(nothing);
    // The leader is not in the list: the standby names it.
    let mut world = World::start_on(leader, false, 1.0, &format!("[{down}, {standby}]")).await;
    let mut stream = world.attached().await;
    stream.send_at(9, GatewayCommand::Welcome { bound: Vec::new(), lease: None }).await;
    assert!(stream.heartbeat().await.is_empty());
    // A deposed leader's offer (epoch 8) is not acted on; the current leader's is.
    stream.send_at(8, GatewayCommand::Offer(job("stale", 1))).await;
    stream.send_at(9, GatewayCommand::Offer(job("current", 1))).await;
    let replied = stream
        .next_of(|e| match e {
            AgentEvent::OfferReply { job_id, accepted, .. } => Some((job_id, accepted)),
            _ => None,
        })
        .await;
    assert_eq!(replied, ("current".to_string(), true), "the stale offer got no answer");
    let jobs = stream.heartbeat().await;
    assert_eq!(jobs.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>(), ["current"]);
    world.stop().await;
    standby_server.abort();
}
