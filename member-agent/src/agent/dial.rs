//! Dialing the gateway's `Federation.Attach` over gRPC, and finding the leader when several
//! gateways are configured.
//!
//! One dial is one pass over the addresses, in order, starting after the gateway whose stream was
//! last lost (so a deposed leader that still takes streams is not tried first again). A gateway
//! that cannot be reached is passed over. A standby refuses the stream with `Unavailable` and
//! names the leader in the `meridian-leader` metadata: the agent dials that address next (even
//! one it was not configured with, if it has the configured scheme), else the next one. A gateway
//! that refuses the agent itself (another live agent holds the cluster; the certificate names
//! another cluster) ends the pass: it is the leader, and another gateway would say the same. The
//! event loop backs off between passes.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::link::{Connection, Dial, Dialing, LinkError, OUTBOUND_CAPACITY, inbound_from_wire};
use crate::config::TlsFiles;

/// The gRPC metadata in which a standby names the leader's address (`http://10.0.0.7:7071`).
pub(crate) const LEADER_METADATA: &str = "meridian-leader";

/// How long one address may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Dials the gateways over gRPC.
pub(crate) struct GrpcDialer {
    /// The configured addresses, `https://host:port` (`http://` when insecure), in order.
    gateways: Vec<String>,
    /// Read at every dial, so rotated files are picked up by the next connection.
    tls: Option<TlsFiles>,
    /// Where in `gateways` the next pass starts.
    start: AtomicUsize,
}

impl GrpcDialer {
    /// A dialer for `gateways` (at least one), with mutual TLS when `tls` is set.
    pub(crate) fn new(gateways: Vec<String>, tls: Option<TlsFiles>) -> Self {
        Self { gateways, tls, start: AtomicUsize::new(0) }
    }
}

impl Dial for GrpcDialer {
    fn dial(&self, hello: AgentHello) -> Dialing {
        let start = self.start.load(Ordering::Relaxed) % self.gateways.len().max(1);
        let order: Vec<String> = self.gateways[start..].iter().chain(&self.gateways[..start]).cloned().collect();
        let tls = self.tls.as_ref().map(client_tls);
        Box::pin(async move {
            let tls = tls.transpose()?;
            pass(order, tls, hello).await
        })
    }

    fn lost(&self, gateway: &str) {
        if let Some(index) = self.gateways.iter().position(|configured| same_address(configured, gateway)) {
            self.start.store((index + 1) % self.gateways.len(), Ordering::Relaxed);
        }
    }
}

/// The client TLS settings from the files as they are now. No server name is set: each
/// address's own host is the name its gateway's certificate must carry.
fn client_tls(files: &TlsFiles) -> Result<ClientTlsConfig, LinkError> {
    let read = |field: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|source| LinkError::TlsFile { field, path: path.to_path_buf(), source })
    };
    let ca = read("ca", &files.ca)?;
    let cert = read("cert", &files.cert)?;
    let key = read("key", &files.key)?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).identity(Identity::from_pem(cert, key)))
}

/// Tries `order`, following standbys to the leader, until one gateway takes the stream.
async fn pass(order: Vec<String>, tls: Option<ClientTlsConfig>, hello: AgentHello) -> Result<Connection, LinkError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut queue: VecDeque<String> = order.into();
    let mut tried: HashSet<String> = HashSet::new();
    let mut failures: Vec<(String, LinkError)> = Vec::new();
    while let Some(gateway) = queue.pop_front() {
        if !tried.insert(normalized(&gateway).to_string()) {
            continue;
        }
        let error = match attach(&gateway, tls.clone(), &hello).await {
            Ok(connection) => return Ok(connection),
            // The leader refused this agent: another gateway would only send it back here.
            Err(error @ (LinkError::Refused(_) | LinkError::Denied(_))) => return Err(error),
            Err(error) => error,
        };
        match &error {
            LinkError::Standby { leader: Some(leader), .. } => match leader_address(leader, scheme) {
                Ok(leader) if !tried.contains(normalized(&leader)) => {
                    tracing::info!(%gateway, %leader, "the gateway is not the leader and named it; dialing the leader");
                    queue.push_front(leader);
                }
                Ok(leader) => {
                    tracing::debug!(%gateway, %leader, "the gateway named a leader already tried in this pass");
                }
                Err(reason) => {
                    tracing::warn!(%gateway, %leader, %reason, "the gateway named a leader address this agent will not dial");
                }
            },
            LinkError::Standby { leader: None, .. } => {
                tracing::info!(%gateway, %error, "the gateway is not the leader and knows none; trying the next address");
            }
            _ => tracing::debug!(%gateway, %error, "gateway unreachable; trying the next address"),
        }
        failures.push((gateway, error));
    }
    match failures.len() {
        // One address: its own error, worded as before there were several.
        1 => Err(failures.remove(0).1),
        _ => Err(LinkError::Unattached { attempts: failures }),
    }
}

/// Opens a stream to `gateway` and sends `hello` on it.
async fn attach(gateway: &str, tls: Option<ClientTlsConfig>, hello: &AgentHello) -> Result<Connection, LinkError> {
    let bad_address =
        |e: tonic::transport::Error| LinkError::BadAddress { address: gateway.to_string(), reason: error_chain(&e) };
    let mut endpoint = Endpoint::from_shared(gateway.to_string())
        .map_err(bad_address)?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20));
    if let Some(tls) = tls {
        // Applied to this address's endpoint: its host is the TLS server name and the authority.
        endpoint = endpoint.tls_config(tls).map_err(bad_address)?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| LinkError::Connect { gateway: gateway.to_string(), reason: error_chain(&e) })?;
    let mut client = pb::federation_client::FederationClient::new(channel);
    let (tx, rx) = mpsc::channel::<AgentEvent>(OUTBOUND_CAPACITY);
    let first = pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(hello))) };
    let outbound = tokio_stream::once(first).chain(ReceiverStream::new(rx).map(|event| pb::AgentMessage::from(&event)));
    // The hello leaves during the call, so no earlier than this.
    let hello_sent = Instant::now();
    let inbound = client.attach(outbound).await.map_err(|status| refusal(gateway, status))?.into_inner();
    let inbound = inbound.map(|message| match message {
        Ok(message) => Ok(inbound_from_wire(message)),
        Err(status) => Err(LinkError::from_status(status)),
    });
    tracing::debug!(%gateway, "stream open; waiting for the welcome");
    Ok(Connection { gateway: gateway.to_string(), hello_sent, outbound: tx, inbound: Box::pin(inbound) })
}

/// What a refused `Attach` means: `Unavailable` is a gateway that is not the leader (it names
/// the leader when it knows one), anything else as on an open stream.
fn refusal(gateway: &str, status: tonic::Status) -> LinkError {
    if status.code() != tonic::Code::Unavailable {
        return LinkError::from_status(status);
    }
    let leader = status
        .metadata()
        .get(LEADER_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|leader| !leader.is_empty())
        .map(str::to_string);
    LinkError::Standby { gateway: gateway.to_string(), message: status.message().to_string(), leader }
}

/// The leader's address as a standby gave it, if the agent may dial it: a URI with a host and
/// the configured scheme (a plain-text address is never dialled by a TLS agent, nor the reverse).
fn leader_address(leader: &str, scheme: &str) -> Result<String, String> {
    let uri: tonic::transport::Uri = leader.parse().map_err(|e| format!("not a valid address: {e}"))?;
    if uri.scheme_str() != Some(scheme) {
        return Err(format!("this agent dials only {scheme}:// gateways"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("it names no host".to_string());
    }
    Ok(normalized(leader).to_string())
}

/// An address without surrounding blanks or a trailing `/`, for comparisons.
fn normalized(address: &str) -> &str {
    let address = address.trim();
    address.strip_suffix('/').unwrap_or(address)
}

fn same_address(a: &str, b: &str) -> bool {
    normalized(a) == normalized(b)
}

/// An error and its causes, `: `-separated (tonic's own text is only "transport error").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use meridian_proto::pb::federation_server::{Federation, FederationServer};
    use meridian_proto::protocol::GatewayCommand;
    use meridian_proto::testing::hello;
    use tokio::task::JoinHandle;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::metadata::MetadataMap;
    use tonic::{Request, Response, Status, Streaming};

    use super::*;
    use crate::agent::link::{FromGateway, Inbound};

    /// What a test gateway does with an `Attach`.
    #[derive(Clone)]
    enum Role {
        /// Refuses it as a standby, naming this leader (None: it knows none).
        Standby(Option<String>),
        /// Takes it and welcomes the agent at this epoch.
        Leader(u64),
        /// Refuses it: another agent holds the cluster.
        Busy,
    }

    /// The gateway's end of one stream it took.
    type ToAgent = mpsc::Sender<Result<pb::GatewayMessage, Status>>;

    /// A `Federation` service on loopback that records who attached.
    struct TestGateway {
        role: Role,
        name: &'static str,
        attaches: Arc<Mutex<Vec<&'static str>>>,
        /// The leader's stream senders, kept so its streams stay open.
        streams: Arc<Mutex<Vec<ToAgent>>>,
    }

    #[tonic::async_trait]
    impl Federation for TestGateway {
        type AttachStream = ReceiverStream<Result<pb::GatewayMessage, Status>>;

        async fn attach(
            &self,
            request: Request<Streaming<pb::AgentMessage>>,
        ) -> Result<Response<Self::AttachStream>, Status> {
            self.attaches.lock().unwrap().push(self.name);
            let first = request.into_inner().message().await?.and_then(|m| m.body);
            assert!(matches!(first, Some(pb::agent_message::Body::Hello(_))), "the hello comes first");
            match &self.role {
                Role::Standby(leader) => {
                    let mut metadata = MetadataMap::new();
                    if let Some(leader) = leader {
                        metadata.insert(LEADER_METADATA, leader.parse().unwrap());
                    }
                    Err(Status::with_metadata(tonic::Code::Unavailable, "this gateway is a standby", metadata))
                }
                Role::Busy => Err(Status::already_exists("cluster `east` is held by agent 1f2e")),
                Role::Leader(epoch) => {
                    let (tx, rx) = mpsc::channel(4);
                    let welcome = GatewayCommand::Welcome { bound: Vec::new(), lease: None };
                    let message = pb::GatewayMessage { epoch: *epoch, ..pb::GatewayMessage::from(&welcome) };
                    tx.send(Ok(message)).await.unwrap();
                    self.streams.lock().unwrap().push(tx);
                    Ok(Response::new(ReceiverStream::new(rx)))
                }
            }
        }
    }

    /// Running test gateways and the order in which they were dialled.
    struct Gateways {
        attaches: Arc<Mutex<Vec<&'static str>>>,
        servers: Vec<JoinHandle<()>>,
    }

    impl Gateways {
        fn new() -> Self {
            Self { attaches: Arc::default(), servers: Vec::new() }
        }

        /// Starts one on `127.0.0.1:0`; returns its `http://` address.
        async fn start(&mut self, name: &'static str, role: Role) -> String {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = format!("http://{}", listener.local_addr().unwrap());
            let service = TestGateway { role, name, attaches: Arc::clone(&self.attaches), streams: Arc::default() };
            let server = tonic::transport::Server::builder()
                .add_service(FederationServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener));
            self.servers.push(tokio::spawn(async move { server.await.unwrap() }));
            address
        }

        fn attaches(&self) -> Vec<&'static str> {
            self.attaches.lock().unwrap().clone()
        }

        /// Stops every gateway at once (a graceful stop would wait for the open streams).
        async fn stop(self) {
            for server in self.servers {
                server.abort();
                let _ = server.await;
            }
        }
    }

    /// An address nothing listens on (bound, then closed).
    async fn dead_address() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        address
    }

    async fn welcome_epoch(connection: &mut Connection) -> u64 {
        let received = connection.inbound.next().await.unwrap().unwrap();
        assert!(
            matches!(&received, FromGateway { message: Inbound::Command(c), .. } if matches!(**c, GatewayCommand::Welcome { .. }))
        );
        received.epoch
    }

    #[tokio::test]
    async fn a_standby_sends_the_agent_to_the_leader_it_names_even_one_not_configured() {
        let mut gateways = Gateways::new();
        let leader = gateways.start("leader", Role::Leader(7)).await;
        let dead = dead_address().await;
        let quiet = gateways.start("standby-without-leader", Role::Standby(None)).await;
        let standby = gateways.start("standby", Role::Standby(Some(leader.clone()))).await;
        let dialer = GrpcDialer::new(vec![dead, quiet, standby], None);
        let mut connection = dialer.dial(hello("east", "i")).await.unwrap();
        assert_eq!(connection.gateway, leader);
        assert_eq!(welcome_epoch(&mut connection).await, 7);
        assert_eq!(gateways.attaches(), ["standby-without-leader", "standby", "leader"]);
        gateways.stop().await;
    }

    #[tokio::test]
    async fn an_unreachable_gateway_is_passed_over_for_the_next() {
        let mut gateways = Gateways::new();
        let dead = dead_address().await;
        let leader = gateways.start("leader", Role::Leader(3)).await;
        let dialer = GrpcDialer::new(vec![dead, leader.clone()], None);
        let connection = dialer.dial(hello("east", "i")).await.unwrap();
        assert_eq!(connection.gateway, leader);
        gateways.stop().await;
    }

    #[tokio::test]
    async fn a_leader_of_another_scheme_is_not_followed() {
        let mut gateways = Gateways::new();
        let standby = gateways.start("standby", Role::Standby(Some("https://127.0.0.1:1".into()))).await;
        let leader = gateways.start("leader", Role::Leader(1)).await;
        let dialer = GrpcDialer::new(vec![standby, leader.clone()], None);
        let connection = dialer.dial(hello("east", "i")).await.unwrap();
        assert_eq!(connection.gateway, leader, "the https leader was skipped for the next address");
        assert_eq!(gateways.attaches(), ["standby", "leader"]);
        assert!(leader_address("http://gw:7071/", "http").is_ok_and(|a| a == "http://gw:7071"));
        assert!(leader_address("http:///x", "http").is_err());
        gateways.stop().await;
    }

    #[tokio::test]
    async fn when_no_gateway_takes_the_stream_each_says_why_and_a_busy_leader_ends_the_pass() {
        let mut gateways = Gateways::new();
        let dead = dead_address().await;
        let standby = gateways.start("standby", Role::Standby(None)).await;
        let dialer = GrpcDialer::new(vec![dead.clone(), standby.clone()], None);
        let error = dialer.dial(hello("east", "i")).await.err().unwrap();
        let text = error.to_string();
        assert!(matches!(&error, LinkError::Unattached { attempts } if attempts.len() == 2), "{error:?}");
        assert!(text.contains(&format!("{dead}: cannot connect to the gateway at {dead}")), "{text}");
        assert!(text.contains(&format!("{standby}: {standby} did not take the stream")), "{text}");
        assert!(text.contains("this gateway is a standby (it knows no leader)"), "{text}");

        let busy = gateways.start("busy", Role::Busy).await;
        let leader = gateways.start("leader", Role::Leader(1)).await;
        let dialer = GrpcDialer::new(vec![busy, leader], None);
        let error = dialer.dial(hello("east", "i")).await.err().unwrap();
        assert!(matches!(&error, LinkError::Refused(m) if m.contains("1f2e")), "{error:?}");
        assert!(!gateways.attaches().contains(&"leader"), "the leader's refusal ended the pass");
        gateways.stop().await;
    }

    #[tokio::test]
    async fn after_a_lost_stream_the_next_pass_starts_at_the_next_address() {
        let mut gateways = Gateways::new();
        let first = gateways.start("first", Role::Leader(1)).await;
        let second = gateways.start("second", Role::Leader(2)).await;
        let dialer = GrpcDialer::new(vec![first.clone(), second.clone()], None);
        assert_eq!(dialer.dial(hello("east", "i")).await.unwrap().gateway, first);
        dialer.lost(&first);
        assert_eq!(dialer.dial(hello("east", "i")).await.unwrap().gateway, second);
        dialer.lost(&second);
        assert_eq!(dialer.dial(hello("east", "i")).await.unwrap().gateway, first, "and wraps around");
        dialer.lost("http://not-configured:1");
        assert_eq!(dialer.dial(hello("east", "i")).await.unwrap().gateway, first);
        gateways.stop().await;
    }

    #[tokio::test]
    async fn a_missing_tls_file_is_named_at_dial() {
        let files = TlsFiles { ca: "/nonexistent/ca.pem".into(), cert: "c.pem".into(), key: "c.key".into() };
        let dialer = GrpcDialer::new(vec!["https://127.0.0.1:1".into()], Some(files));
        let err = dialer.dial(hello("east", "i")).await.err().unwrap().to_string();
        assert!(err.starts_with("tls.ca: cannot read /nonexistent/ca.pem"), "{err}");
    }
}
