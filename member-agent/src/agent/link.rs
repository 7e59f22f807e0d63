//! The agent's connection to the gateway, as a state inside the event loop: waiting, backing
//! off, dialing, or up. Also the stream edge: wire messages are converted to and from the domain
//! protocol ([`AgentEvent`], [`GatewayCommand`]) here and nowhere else.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::config::TlsFiles;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};

/// Reconnect backoff bounds.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Messages the agent may queue for the gateway; beyond it messages are dropped (and counted),
/// the stream kept: the next heartbeat repeats every binding's state.
pub(crate) const OUTBOUND_CAPACITY: usize = 1024;

/// Why a connection to the gateway failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The gateway address is not a valid URI.
    #[error("gateway address `{address}` is invalid: {reason}")]
    BadAddress {
        /// The address configured.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Could not connect.
    #[error("cannot connect to the gateway: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The gateway refused the stream because another live agent holds this cluster's name.
    #[error("the gateway refused the stream: {0}")]
    Refused(String),
    /// The gateway did not accept this agent's certificate for the cluster it named.
    #[error("the gateway denied this agent's identity: {0}")]
    Denied(String),
    /// A TLS file could not be read.
    #[error("tls.{field}: cannot read {}: {source}", path.display())]
    TlsFile {
        /// The config field.
        field: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The stream failed.
    #[error("gateway stream: {0}")]
    Stream(#[source] tonic::Status),
    /// The gateway closed the stream.
    #[error("the gateway closed the stream")]
    Closed,
}

impl LinkError {
    fn from_status(status: tonic::Status) -> Self {
        match status.code() {
            tonic::Code::AlreadyExists => LinkError::Refused(status.message().to_string()),
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
                LinkError::Denied(status.message().to_string())
            }
            _ => LinkError::Stream(status),
        }
    }
}

/// One gateway message, converted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Inbound {
    /// A valid command (boxed: an offer carries a whole job spec).
    Command(Box<GatewayCommand>),
    /// An offer that did not convert (bad spec): refuse it with the reason.
    InvalidOffer {
        /// The job offered.
        job_id: String,
        /// The offer's token.
        fencing_token: u64,
        /// What was wrong, with the field path.
        reason: String,
    },
    /// Any other message that did not convert: logged and ignored.
    Invalid(String),
}

/// The gateway's side of one open stream, in domain types.
pub(crate) type InboundStream = Pin<Box<dyn Stream<Item = Result<Inbound, LinkError>> + Send>>;

/// One open stream to the gateway. The hello has been sent.
pub(crate) struct Connection {
    /// Events for the gateway, in order.
    pub(crate) outbound: mpsc::Sender<AgentEvent>,
    /// Commands from the gateway; ends when the stream does.
    pub(crate) inbound: InboundStream,
}

/// A dial in progress.
pub(crate) type Dialing = Pin<Box<dyn Future<Output = Result<Connection, LinkError>> + Send>>;

/// Opens streams to the gateway: gRPC in production, in-memory channels in tests.
pub(crate) trait Dial: Send + Sync {
    /// Opens a stream whose first message is `hello`.
    fn dial(&self, hello: AgentHello) -> Dialing;
}

/// Dials the gateway's `Federation.Attach` over gRPC.
pub(crate) struct GrpcDialer {
    /// The gateway's address, `https://host:port` (`http://` when insecure).
    pub(crate) gateway: String,
    /// Read at every dial, so rotated files are picked up by the next connection.
    pub(crate) tls: Option<TlsFiles>,
}

/// The client TLS settings from the files as they are now.
fn client_tls(files: &TlsFiles) -> Result<ClientTlsConfig, LinkError> {
    let read = |field: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|source| LinkError::TlsFile { field, path: path.to_path_buf(), source })
    };
    let ca = read("ca", &files.ca)?;
    let cert = read("cert", &files.cert)?;
    let key = read("key", &files.key)?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).identity(Identity::from_pem(cert, key)))
}

impl Dial for GrpcDialer {
    fn dial(&self, hello: AgentHello) -> Dialing {
        let gateway = self.gateway.clone();
        let tls = self.tls.as_ref().map(client_tls);
        Box::pin(async move {
            let bad_address =
                |e: tonic::transport::Error| LinkError::BadAddress { address: gateway.clone(), reason: e.to_string() };
            let mut endpoint = tonic::transport::Endpoint::from_shared(gateway.clone())
                .map_err(bad_address)?
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(20));
            if let Some(tls) = tls {
                endpoint = endpoint.tls_config(tls?).map_err(bad_address)?;
            }
            let channel = endpoint.connect().await.map_err(LinkError::Connect)?;
            let mut client = pb::federation_client::FederationClient::new(channel);
            let (tx, rx) = mpsc::channel::<AgentEvent>(OUTBOUND_CAPACITY);
            let hello = pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(&hello))) };
            let outbound =
                tokio_stream::once(hello).chain(ReceiverStream::new(rx).map(|event| pb::AgentMessage::from(&event)));
            let inbound = client.attach(outbound).await.map_err(LinkError::from_status)?.into_inner();
            let inbound = inbound.map(|message| match message {
                Ok(message) => Ok(inbound_from_wire(message)),
                Err(status) => Err(LinkError::from_status(status)),
            });
            Ok(Connection { outbound: tx, inbound: Box::pin(inbound) })
        })
    }
}

/// Converts one gateway message; an invalid offer keeps its id and token so it can be refused.
fn inbound_from_wire(message: pb::GatewayMessage) -> Inbound {
    match message.body {
        Some(pb::gateway_message::Body::Offer(offer)) => {
            let (job_id, fencing_token) = (offer.job_id.clone(), offer.fencing_token);
            match Assignment::try_from(offer) {
                Ok(assignment) => Inbound::Command(Box::new(GatewayCommand::Offer(assignment))),
                Err(e) => Inbound::InvalidOffer { job_id, fencing_token, reason: e.to_string() },
            }
        }
        body => match GatewayCommand::try_from(pb::GatewayMessage { body }) {
            Ok(command) => Inbound::Command(Box::new(command)),
            Err(e) => Inbound::Invalid(e.to_string()),
        },
    }
}

/// The connection as a state of the event loop.
pub(crate) enum Link {
    /// Not dialing yet: the agent is still adopting the jobs its backend holds.
    Waiting,
    /// Dial again at `retry_at`.
    BackingOff {
        /// When to dial.
        retry_at: Instant,
    },
    /// A dial is under way.
    Dialing {
        /// The dial.
        attempt: Dialing,
        /// When the hello was handed to the stream; the welcome's lease counts from here.
        hello_sent: Instant,
    },
    /// The stream is open.
    Up {
        /// The stream.
        connection: Connection,
        /// Numbers the streams of this process, so late answers find their stream.
        session: u64,
        /// When the hello was handed to the stream.
        hello_sent: Instant,
        /// Whether the welcome has come: until then the agent sends nothing but its hello.
        welcomed: bool,
    },
}

/// What happened on the link.
pub(crate) enum LinkEvent {
    /// Time to dial.
    Retry,
    /// A dial finished.
    Dialed(Result<Connection, LinkError>),
    /// A message from the gateway, or the stream's end.
    Received(Result<Inbound, LinkError>),
}

impl Link {
    /// Waits for the next thing to happen on the link. Cancel safe: a dial in progress and an
    /// open stream live in `self`, so dropping this future loses nothing.
    pub(crate) async fn next(&mut self) -> LinkEvent {
        match self {
            Link::Waiting => std::future::pending().await,
            Link::BackingOff { retry_at } => {
                tokio::time::sleep_until(*retry_at).await;
                LinkEvent::Retry
            }
            Link::Dialing { attempt, .. } => LinkEvent::Dialed(attempt.as_mut().await),
            Link::Up { connection, .. } => {
                LinkEvent::Received(connection.inbound.next().await.unwrap_or(Err(LinkError::Closed)))
            }
        }
    }

    /// The session, if the stream is up and welcomed.
    pub(crate) fn welcomed_session(&self) -> Option<u64> {
        match self {
            Link::Up { session, welcomed: true, .. } => Some(*session),
            _ => None,
        }
    }
}

/// Backoff with ±25 % jitter so many agents do not reconnect in lockstep.
pub(crate) fn jittered(base: Duration) -> Duration {
    // RandomState is randomly seeded per instance: a cheap source of jitter without a RNG crate.
    let noise = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), base);
    let factor = 0.75 + (noise % 1000) as f64 / 2000.0;
    base.mul_f64(factor)
}

/// A random id for this agent process (128 bits, hex).
pub(crate) fn new_instance_id() -> String {
    use std::hash::BuildHasher;
    let seed = (
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default(),
        std::process::id(),
    );
    let state = std::collections::hash_map::RandomState::new;
    format!("{:016x}{:016x}", state().hash_one(seed), state().hash_one(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_with_a_bad_spec_keeps_its_id_so_it_can_be_refused() {
        let offer = pb::Offer { job_id: "j".into(), fencing_token: 4, spec: None, last_preempted_at_ms: None };
        let message = pb::GatewayMessage { body: Some(pb::gateway_message::Body::Offer(offer)) };
        match inbound_from_wire(message) {
            Inbound::InvalidOffer { job_id, fencing_token, reason } => {
                assert_eq!((job_id.as_str(), fencing_token), ("j", 4));
                assert!(reason.contains("offer.spec"), "{reason}");
            }
            other => panic!("expected an invalid offer, got {other:?}"),
        }
        assert!(matches!(inbound_from_wire(pb::GatewayMessage { body: None }), Inbound::Invalid(_)));
    }

    #[test]
    fn already_exists_means_refused() {
        let refused = LinkError::from_status(tonic::Status::already_exists("cluster east is held by agent 1a2b"));
        assert!(matches!(&refused, LinkError::Refused(m) if m.contains("1a2b")), "{refused}");
        assert!(matches!(LinkError::from_status(tonic::Status::unavailable("x")), LinkError::Stream(_)));
        let denied = LinkError::from_status(tonic::Status::permission_denied("names a, not cluster `b`"));
        assert!(matches!(&denied, LinkError::Denied(m) if m.contains("not cluster")), "{denied}");
    }

    #[tokio::test]
    async fn a_missing_tls_file_is_named_at_dial() {
        let files = TlsFiles { ca: "/nonexistent/ca.pem".into(), cert: "c.pem".into(), key: "c.key".into() };
        let dialer = GrpcDialer { gateway: "https://127.0.0.1:1".into(), tls: Some(files) };
        let hello = AgentHello {
            info: meridian_proto::inventory::ClusterInfo {
                name: "east".into(),
                region: "r".into(),
                tier: meridian_proto::inventory::Tier::Owned,
                backend: meridian_proto::inventory::BackendKind::Builtin,
                prices: Default::default(),
                supports_containers: true,
                supports_bare_commands: true,
                labels: Default::default(),
            },
            instance_id: "i".into(),
            agent_version: "0".into(),
        };
        let err = dialer.dial(hello).await.err().unwrap().to_string();
        assert!(err.starts_with("tls.ca: cannot read /nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn instance_ids_differ_between_calls() {
        assert_ne!(new_instance_id(), new_instance_id());
        assert_eq!(new_instance_id().len(), 32);
    }
}
