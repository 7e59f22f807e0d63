//! The agent's connection to the gateway, as a state inside the event loop: waiting, backing
//! off, dialing, or up. Also the stream edge: wire messages are converted to and from the domain
//! protocol ([`AgentEvent`], [`GatewayCommand`]) here and nowhere else. How a dial finds the
//! leader among several gateways is in `dial.rs`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};

/// Reconnect backoff bounds: the delay starts at the minimum after each welcome and doubles
/// after each failed dial (one pass over every gateway address) up to the maximum.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The backoff cap with one gateway address.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The backoff cap with several gateway addresses: a leader fails over in seconds, and a pass
/// that found none should look again soon.
pub(crate) const BACKOFF_MAX_SEVERAL: Duration = Duration::from_secs(1);

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
    #[error("cannot connect to the gateway at {gateway}: {reason}")]
    Connect {
        /// The address dialled.
        gateway: String,
        /// Why, with the transport's causes.
        reason: String,
    },
    /// The gateway is a standby (or knows no leader) and refused the stream; it named the
    /// leader's address when it knows one.
    #[error(
        "{gateway} did not take the stream: {message} ({})",
        leader.as_deref().map_or_else(|| "it knows no leader".to_string(), |leader| format!("the leader is {leader}"))
    )]
    Standby {
        /// The address dialled.
        gateway: String,
        /// What it said.
        message: String,
        /// The leader's address, from the `meridian-leader` metadata.
        leader: Option<String>,
    },
    /// No gateway of several took the stream: each address and what became of it.
    #[error("no gateway took the stream: {}", attempts_text(attempts))]
    Unattached {
        /// Each address tried in the pass, in order, with its failure.
        attempts: Vec<(String, LinkError)>,
    },
    /// The gateway's welcome carried an older epoch than one this agent has seen: it is no
    /// longer the leader (it may not know yet).
    #[error(
        "the gateway at {gateway} speaks for epoch {epoch}, older than epoch {newest} seen before: it is no longer the leader"
    )]
    Deposed {
        /// The address of the stream.
        gateway: String,
        /// The welcome's epoch.
        epoch: u64,
        /// The newest epoch this agent has seen.
        newest: u64,
    },
    /// The gateway, which grants leases and so answers every heartbeat, sent nothing for
    /// several heartbeats: it is paused, cut off or hung, and another gateway may lead.
    #[error("{gateway} sent nothing for {silent_for:?} (it answers every heartbeat); looking for the leader")]
    Silent {
        /// The address of the stream.
        gateway: String,
        /// How long it was silent.
        silent_for: std::time::Duration,
    },
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

/// `address: failure; address: failure`.
fn attempts_text(attempts: &[(String, LinkError)]) -> String {
    let text: Vec<String> = attempts.iter().map(|(gateway, error)| format!("{gateway}: {error}")).collect();
    text.join("; ")
}

impl LinkError {
    pub(crate) fn from_status(status: tonic::Status) -> Self {
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

/// One gateway message with the epoch of the leader that sent it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FromGateway {
    /// The sender's epoch (0 from a gateway without election).
    pub(crate) epoch: u64,
    /// The message.
    pub(crate) message: Inbound,
}

/// The gateway's side of one open stream, in domain types.
pub(crate) type InboundStream = Pin<Box<dyn Stream<Item = Result<FromGateway, LinkError>> + Send>>;

/// One open stream to the gateway. The hello has been sent.
pub(crate) struct Connection {
    /// The address of the gateway that took the stream.
    pub(crate) gateway: String,
    /// When the hello was handed to this stream (no later than it left): the welcome's lease
    /// counts from here.
    pub(crate) hello_sent: Instant,
    /// Events for the gateway, in order.
    pub(crate) outbound: mpsc::Sender<AgentEvent>,
    /// Commands from the gateway; ends when the stream does.
    pub(crate) inbound: InboundStream,
}

/// A dial in progress.
pub(crate) type Dialing = Pin<Box<dyn Future<Output = Result<Connection, LinkError>> + Send>>;

/// Opens streams to the gateway: gRPC in production, in-memory channels in tests.
pub(crate) trait Dial: Send + Sync {
    /// Opens a stream whose first message is `hello`, to the leader if there are several
    /// gateways.
    fn dial(&self, hello: AgentHello) -> Dialing;

    /// The stream to `gateway` was lost or proved useless (a deposed leader, no renewals): the
    /// next dial should try the other gateways first.
    fn lost(&self, gateway: &str) {
        let _ = gateway;
    }
}

/// Converts one gateway message; an invalid offer keeps its id and token so it can be refused.
pub(crate) fn inbound_from_wire(message: pb::GatewayMessage) -> FromGateway {
    FromGateway { epoch: message.epoch, message: message_from_wire(message) }
}

fn message_from_wire(message: pb::GatewayMessage) -> Inbound {
    match message.body {
        Some(pb::gateway_message::Body::Offer(offer)) => {
            let (job_id, fencing_token) = (offer.job_id.clone(), offer.fencing_token);
            match Assignment::try_from(offer) {
                Ok(assignment) => Inbound::Command(Box::new(GatewayCommand::Offer(assignment))),
                Err(e) => Inbound::InvalidOffer { job_id, fencing_token, reason: e.to_string() },
            }
        }
        body => match GatewayCommand::try_from(pb::GatewayMessage { body, epoch: message.epoch }) {
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
    Received(Result<FromGateway, LinkError>),
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
            Link::Dialing { attempt } => LinkEvent::Dialed(attempt.as_mut().await),
            Link::Up { connection, .. } => {
                LinkEvent::Received(connection.inbound.next().await.unwrap_or(Err(LinkError::Closed)))
            }
        }
    }

    /// The gateway of the open stream, if one is open.
    pub(crate) fn gateway(&self) -> Option<&str> {
        match self {
            Link::Up { connection, .. } => Some(&connection.gateway),
            _ => None,
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
        let message = pb::GatewayMessage { body: Some(pb::gateway_message::Body::Offer(offer)), epoch: 0 };
        let received = inbound_from_wire(message);
        assert_eq!(received.epoch, 0);
        match received.message {
            Inbound::InvalidOffer { job_id, fencing_token, reason } => {
                assert_eq!((job_id.as_str(), fencing_token), ("j", 4));
                assert!(reason.contains("offer.spec"), "{reason}");
            }
            other => panic!("expected an invalid offer, got {other:?}"),
        }
        let empty = inbound_from_wire(pb::GatewayMessage { body: None, epoch: 3 });
        assert!(matches!(empty, FromGateway { epoch: 3, message: Inbound::Invalid(_) }), "{empty:?}");
    }

    #[test]
    fn every_message_keeps_its_epoch() {
        let ack = GatewayCommand::Ack { job_id: "j".into(), fencing_token: 2 };
        let message = pb::GatewayMessage { epoch: 41, ..pb::GatewayMessage::from(&ack) };
        assert_eq!(inbound_from_wire(message), FromGateway { epoch: 41, message: Inbound::Command(Box::new(ack)) });
    }

    #[test]
    fn already_exists_means_refused() {
        let refused = LinkError::from_status(tonic::Status::already_exists("cluster east is held by agent 1a2b"));
        assert!(matches!(&refused, LinkError::Refused(m) if m.contains("1a2b")), "{refused}");
        assert!(matches!(LinkError::from_status(tonic::Status::unavailable("x")), LinkError::Stream(_)));
        let denied = LinkError::from_status(tonic::Status::permission_denied("names a, not cluster `b`"));
        assert!(matches!(&denied, LinkError::Denied(m) if m.contains("not cluster")), "{denied}");
    }

    #[test]
    fn instance_ids_differ_between_calls() {
        assert_ne!(new_instance_id(), new_instance_id());
        assert_eq!(new_instance_id().len(), 32);
    }
}
