//! A small HTTP client for the gateway's REST API (`/v1/...`).
//!
//! The `meridian` user commands, the demo and the end-to-end tests all talk to the gateway
//! through [`Client`]. Responses are returned as [`serde_json::Value`] so that callers see exactly
//! what the API sent (the CLI pretty-prints it for `-o json`) and the client keeps working while
//! the API grows new fields.
//!
//! Each request opens its own HTTP/1.1 connection: the CLI makes one or two calls per process,
//! so a connection pool would only add state. `https://` addresses are verified against the CA
//! file given with [`Client::with_ca_file`] (the gateway's own CA; the system roots are not
//! used); plain `http://` works against an `insecure` gateway.
//!
//! A client may be given several gateways (one leader, standbys): it finds the one that serves
//! each request, following standbys to the leader and retrying only what is safe to retry
//! (see [`crate::failover`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::failover::{self, Gateway, Gateways, NOT_LEADER_CODES, Outcome};
use crate::sse::{EventStream, SseParser};

/// A connection to the gateway, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// How long one request (connect, send, and read the whole answer) may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The port assumed when an address like `localhost` names no port (the gateway's default).
pub const DEFAULT_PORT: u16 = 7070;

/// Jobs asked for per page when following a list to its end.
const LIST_PAGE: usize = 1000;

/// Answers larger than this are refused rather than buffered.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Shown with connection failures: what a user most likely has to do.
const CONNECT_HINT: &str = "is `meridian gateway` running? set --gateway or MERIDIAN_GATEWAY";

/// Results of this module.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// A client for the REST API of one gateway, or of several of which one leads.
#[derive(Debug, Clone)]
pub struct Client {
    /// The gateways, and the one that answered last.
    gateways: Gateways,
    timeout: Duration,
    /// How long requests are retried while no gateway is the leader, all tries together.
    retry_budget: Duration,
    /// TLS settings trusting the CA file, once one is given.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Sent as `Authorization: Bearer <token>` when set.
    token: Option<Token>,
}

/// A bearer token; its `Debug` never shows the value.
#[derive(Clone)]
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// One invalid field reported by the API (`{"field": "gang.resources.gpus", "reason": "..."}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field in the job spec, such as `gang.resources.gpus`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What one gateway answered when several were tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAttempt {
    /// Its `host:port`.
    pub gateway: String,
    /// What became of the request there (the last time it was tried).
    pub answer: String,
}

/// Why a request to the gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The gateway address could not be understood.
    #[error("invalid gateway address `{addr}`: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No TCP connection could be made to the gateway.
    #[error("cannot reach the gateway at {addr}: {source} ({CONNECT_HINT})")]
    Connect {
        /// The `host:port` dialled.
        addr: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The gateway did not answer in time.
    #[error("the gateway at {addr} did not answer within {after:?}")]
    Timeout {
        /// The `host:port` dialled.
        addr: String,
        /// The time limit that passed.
        after: Duration,
    },
    /// An `https://` address was given without the gateway's CA.
    #[error(
        "{addr} is https: give the gateway's CA with --ca FILE or MERIDIAN_CA (the system roots are not used; \
         `meridian certs init` wrote it as ca.pem)"
    )]
    NoCa {
        /// The `host:port`.
        addr: String,
    },
    /// The CA file could not be used.
    #[error("CA file {}: {reason}", path.display())]
    CaFile {
        /// The file given with --ca or MERIDIAN_CA.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The TLS handshake failed (a gateway speaking plain HTTP, a certificate the CA did not
    /// sign, an expired or misnamed certificate).
    #[error("TLS with the gateway at {addr} failed: {source} (is the gateway serving TLS, and is the CA its CA?)")]
    Tls {
        /// The `host:port` dialled.
        addr: String,
        /// rustls's reason.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange broke off (connection reset, malformed HTTP).
    #[error("HTTP exchange with the gateway at {addr} failed: {source}")]
    Http {
        /// The `host:port` dialled.
        addr: String,
        /// The HTTP library's reason.
        #[source]
        source: hyper::Error,
    },
    /// The gateway answered with an error status (4xx or 5xx).
    #[error("{}", api_error_text(code, message, fields))]
    Api {
        /// HTTP status code.
        status: u16,
        /// Machine-readable error code, such as `invalid_spec` or `not_found`.
        code: String,
        /// Human-readable explanation.
        message: String,
        /// Invalid fields, for `invalid_spec` errors.
        fields: Vec<FieldError>,
    },
    /// The gateway answered something that is not the API's JSON.
    #[error("unexpected answer from the gateway: {0}")]
    Protocol(String),
    /// Every gateway was tried (some perhaps several times, while a leader was being elected)
    /// and none served the request.
    #[error(
        "every gateway was tried and none served the request{}:{}",
        if retried_for.is_zero() { String::new() } else { format!(" (retried for {:.1}s)", retried_for.as_secs_f64()) },
        attempts.iter().map(|a| format!("\n  {}: {}", a.gateway, a.answer)).collect::<String>()
    )]
    NoGateway {
        /// Each gateway asked, in order, with what it answered last.
        attempts: Vec<GatewayAttempt>,
        /// How long the tries took.
        retried_for: Duration,
        /// The last failure.
        #[source]
        last: Box<ClientError>,
    },
    /// A write failed after it was sent to a gateway: it may or may not have been applied, so
    /// it was not sent again.
    #[error(
        "{method} {path} failed after it was sent to the gateway at {addr}: {source}; the change may or may not \
         have been made. Check (`meridian jobs`, `meridian job ID`) before repeating it; a submit with an \
         `idempotencyKey` in its spec can be repeated safely (the same key returns the same job)"
    )]
    MaybeApplied {
        /// `POST`, `DELETE`.
        method: String,
        /// The request's path.
        path: String,
        /// The gateway it was sent to.
        addr: String,
        /// How the exchange failed.
        #[source]
        source: Box<ClientError>,
    },
}

impl ClientError {
    /// The HTTP status of an [`ClientError::Api`] error (the last gateway's, when every gateway
    /// was tried), `None` for other errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::NoGateway { last, .. } => last.status(),
            _ => None,
        }
    }

    /// The API error code (`not_found`, `invalid_spec`, ...) of an [`ClientError::Api`] error
    /// (the last gateway's, when every gateway was tried).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            ClientError::NoGateway { last, .. } => last.code(),
            _ => None,
        }
    }

    /// Whether no gateway could be reached or none served the request (as opposed to a gateway
    /// refusing it).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Timeout { .. } | ClientError::Http { .. } => true,
            ClientError::NoGateway { last, .. } => last.is_unreachable() || last.code().is_some_and(is_not_leader),
            _ => false,
        }
    }
}

impl Client {
    /// A client for the gateway at `addr`: `127.0.0.1:7070`, `localhost:7070`, `localhost`
    /// (port 7070), `[::1]:7070`, `http://host:port` (port 80 when an `http://` URL names
    /// none) or `https://host:port` (port 443; needs [`Client::with_ca_file`]). Several
    /// gateways are separated by commas (`https://gw-1:7070,https://gw-2:7070`): requests go to
    /// the one that answered last and fail over to the others as [`crate::failover`] says.
    pub fn new(addr: &str) -> Result<Self> {
        Ok(Client {
            gateways: Gateways::parse(addr)?,
            timeout: DEFAULT_TIMEOUT,
            retry_budget: failover::DEFAULT_RETRY_BUDGET,
            tls: None,
            token: None,
        })
    }

    /// The same client trusting the CA certificate(s) in the PEM file `ca` for `https://`.
    pub fn with_ca_file(mut self, ca: &Path) -> Result<Self> {
        let bad = |reason: String| ClientError::CaFile { path: ca.to_path_buf(), reason };
        let pem = std::fs::read(ca).map_err(|e| bad(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no `BEGIN CERTIFICATE` block found".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        self.tls = Some(Arc::new(config));
        Ok(self)
    }

    /// The same client, sending `token` as `Authorization: Bearer <token>` (or no header for
    /// `None`).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.map(Token);
        self
    }

    /// The same client with a different per-request time limit (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same client retrying for at most `budget` (all tries together) while no gateway is
    /// the leader (default [`failover::DEFAULT_RETRY_BUDGET`]).
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// The `host:port` the next request goes to first: the gateway that answered last (at
    /// first, the first one given).
    pub fn authority(&self) -> String {
        self.gateways.current().authority
    }

    /// How many gateway addresses this client was given.
    pub fn gateway_count(&self) -> usize {
        self.gateways.len()
    }

    /// The gateway at `authority` stopped serving (its event stream broke): the next request
    /// goes first to the gateway after it.
    pub fn skip_gateway(&self, authority: &str) {
        self.gateways.skip(authority);
    }

    /// Submits a job spec (YAML or JSON text; JSON when it starts with `{`). Returns the job and
    /// whether it was created now (`false`: the idempotency key was seen before and this is the
    /// existing job).
    pub async fn submit(&self, spec_text: &str) -> Result<(Value, bool)> {
        let content_type = if spec_text.trim_start_matches('\u{feff}').trim_start().starts_with('{') {
            "application/json"
        } else {
            "application/yaml"
        };
        let (status, job) =
            self.request(Method::POST, "/v1/jobs", Some((content_type, spec_text.as_bytes().to_vec()))).await?;
        Ok((job, status == StatusCode::CREATED))
    }

    /// Lists jobs, optionally only those of one tenant, in one state, or matching a label
    /// selector such as `project=llm`. Follows the pages to the end and returns
    /// `{"jobs": [...]}` with every job.
    pub async fn list(&self, tenant: Option<&str>, state: Option<&str>, selector: Option<&str>) -> Result<Value> {
        let mut jobs = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut page = self.list_page(tenant, state, selector, LIST_PAGE, after.as_deref()).await?;
            if let Some(Value::Array(items)) = page.get_mut("jobs").map(Value::take) {
                jobs.extend(items);
            }
            match page.get("continue").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => after = Some(next.to_owned()),
                _ => break,
            }
        }
        Ok(serde_json::json!({ "jobs": jobs }))
    }

    /// One page of jobs (`limit` at most), after the `continue` token of the previous page.
    pub async fn list_page(
        &self,
        tenant: Option<&str>,
        state: Option<&str>,
        selector: Option<&str>,
        limit: usize,
        after: Option<&str>,
    ) -> Result<Value> {
        let limit = limit.to_string();
        let query: Vec<String> = [
            ("tenant", tenant),
            ("state", state),
            ("selector", selector),
            ("limit", Some(&limit)),
            ("continue", after),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| format!("{key}={}", percent_encode(value))))
        .collect();
        self.get_json(&format!("/v1/jobs?{}", query.join("&"))).await
    }

    /// Fetches one job.
    pub async fn get(&self, id: &str) -> Result<Value> {
        self.get_json(&format!("/v1/jobs/{}", percent_encode(id))).await
    }

    /// Fetches the placement explanation of one job: why it went (or will go) where it did.
    pub async fn explain(&self, id: &str) -> Result<Value> {
        self.get_json(&format!("/v1/jobs/{}/explain", percent_encode(id))).await
    }

    /// Part of a job's output from the member that runs (or ran) it: up to `max_bytes` from byte
    /// `from`, or the last `max_bytes` when `from` is None. Returns the API's
    /// `{"data", "offset", "nextOffset", "complete"}` object.
    pub async fn logs(&self, id: &str, from: Option<u64>, max_bytes: u32) -> Result<Value> {
        let from = from.map_or_else(String::new, |from| format!("&from={from}"));
        self.get_json(&format!("/v1/jobs/{}/logs?maxBytes={max_bytes}{from}", percent_encode(id))).await
    }

    /// Cancels a job. Returns the job, cancelled or already in a terminal state.
    pub async fn cancel(&self, id: &str) -> Result<Value> {
        let (_, job) = self.request(Method::DELETE, &format!("/v1/jobs/{}", percent_encode(id)), None).await?;
        Ok(job)
    }

    /// Lists the member clusters with their capacity and queue. Returns the API's
    /// `{"clusters": [...]}` object.
    pub async fn clusters(&self) -> Result<Value> {
        self.get_json("/v1/clusters").await
    }

    /// `GET`s any API path (with its query string, already encoded) and returns the JSON answer.
    pub async fn get_json(&self, path_and_query: &str) -> Result<Value> {
        let (_, body) = self.request(Method::GET, path_and_query, None).await?;
        Ok(body)
    }

    /// Sends one request with an optional `(content type, bytes)` body and returns the status and
    /// JSON answer of a successful (2xx) response; an empty answer reads as `null`. Error
    /// statuses become [`ClientError::Api`].
    ///
    /// With several gateways, a request no gateway acted on goes on to the next (and to the
    /// leader a standby names); a read is also sent again after a failure mid-exchange, a write
    /// is not ([`ClientError::MaybeApplied`]).
    pub async fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<(StatusCode, Value)> {
        let body = body.map(|(content_type, bytes)| (content_type, Bytes::from(bytes)));
        let idempotent = is_idempotent(&method);
        let (status, bytes) = failover::run(
            &self.gateways,
            self.retry_budget,
            idempotent,
            (method.as_str(), path_and_query),
            |gateway| self.exchange(gateway, method.clone(), path_and_query, body.clone()),
        )
        .await?;
        interpret(status, &bytes).map(|value| (status, value))
    }

    fn build_request(
        &self,
        gateway: &Gateway,
        method: Method,
        path_and_query: &str,
        accept: &str,
        extra: Option<(&'static str, String)>,
        body: Option<(&str, Bytes)>,
    ) -> Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(HOST, &gateway.authority)
            .header(ACCEPT, accept)
            .header(USER_AGENT, concat!("meridian/", env!("CARGO_PKG_VERSION")));
        if let Some(Token(token)) = &self.token {
            let mut value = hyper::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ClientError::Protocol(
                    "the token has characters an HTTP header cannot carry (check MERIDIAN_TOKEN)".into(),
                )
            })?;
            value.set_sensitive(true);
            builder = builder.header(AUTHORIZATION, value);
        }
        if let Some((name, value)) = extra {
            builder = builder.header(name, value);
        }
        let payload = match body {
            Some((content_type, bytes)) => {
                builder = builder.header(CONTENT_TYPE, content_type);
                bytes
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(payload))
            .map_err(|e| ClientError::Protocol(format!("cannot build a request for `{path_and_query}`: {e}")))
    }

    /// Opens a connection to `gateway` within the time limit: TCP, then TLS for `https://`
    /// (the certificate must name that gateway's own host). Nothing of a request has been sent
    /// when this fails.
    async fn connect(&self, gateway: &Gateway, deadline: Instant) -> std::result::Result<Box<dyn Io>, Unconnected> {
        let addr = || gateway.authority.clone();
        let timed_out = || Unconnected::NotSent(ClientError::Timeout { addr: addr(), after: self.timeout });
        let tls = match (gateway.https, &self.tls) {
            (false, _) => None,
            (true, Some(tls)) => Some(Arc::clone(tls)),
            (true, None) => return Err(Unconnected::Fatal(ClientError::NoCa { addr: addr() })),
        };
        let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(&gateway.authority)).await {
            Err(_) => return Err(timed_out()),
            Ok(Err(source)) => return Err(Unconnected::NotSent(ClientError::Connect { addr: addr(), source })),
            Ok(Ok(stream)) => stream,
        };
        // Small request/response pairs: don't let Nagle delay them.
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls else { return Ok(Box::new(stream)) };
        let tls_error = |source| Unconnected::NotSent(ClientError::Tls { addr: addr(), source });
        let host = server_name(&gateway.authority).map_err(tls_error)?;
        match tokio::time::timeout_at(deadline, tokio_rustls::TlsConnector::from(tls).connect(host, stream)).await {
            Err(_) => Err(timed_out()),
            Ok(Err(source)) => Err(tls_error(source)),
            Ok(Ok(stream)) => Ok(Box::new(stream)),
        }
    }

    /// One request to one gateway, within the time limit.
    async fn exchange(
        &self,
        gateway: Gateway,
        method: Method,
        path_and_query: &str,
        body: Option<(&str, Bytes)>,
    ) -> Outcome<(StatusCode, Bytes)> {
        let request = match self.build_request(&gateway, method, path_and_query, "application/json", None, body) {
            Ok(request) => request,
            Err(error) => return Outcome::Fatal(error),
        };
        let deadline = Instant::now() + self.timeout;
        let io = match self.connect(&gateway, deadline).await {
            Ok(io) => io,
            Err(unconnected) => return unconnected.into(),
        };
        let answer = match tokio::time::timeout_at(deadline, self.send(&gateway, io, request)).await {
            Err(_) => Err(ClientError::Timeout { addr: gateway.authority.clone(), after: self.timeout }),
            Ok(answer) => answer,
        };
        match answer {
            Ok((status, headers, bytes)) => match not_leader(status, &headers, &bytes) {
                Some(outcome) => outcome,
                None => Outcome::Answered((status, bytes)),
            },
            Err(error) => Outcome::MaybeSent(error),
        }
    }

    /// Opens the event stream at `path_and_query` (`/v1/events?...`), resuming after
    /// `last_event_id` when given. Connecting and the answer's head must come within the
    /// client's time limit; the stream itself has none.
    ///
    /// With several gateways, the stream is opened at the first that serves it (standbys serve
    /// reads); a watcher whose stream broke calls [`Client::skip_gateway`] to resume at the next.
    pub async fn events(&self, path_and_query: &str, last_event_id: Option<&str>) -> Result<EventStream> {
        failover::run(&self.gateways, self.retry_budget, true, ("GET", path_and_query), |gateway| {
            self.open_events(gateway, path_and_query, last_event_id)
        })
        .await
    }

    async fn open_events(
        &self,
        gateway: Gateway,
        path_and_query: &str,
        last_event_id: Option<&str>,
    ) -> Outcome<EventStream> {
        let extra = last_event_id.map(|id| ("last-event-id", id.to_string()));
        let request = match self.build_request(&gateway, Method::GET, path_and_query, "text/event-stream", extra, None)
        {
            Ok(request) => request,
            Err(error) => return Outcome::Fatal(error),
        };
        let deadline = Instant::now() + self.timeout;
        let io = match self.connect(&gateway, deadline).await {
            Ok(io) => io,
            Err(unconnected) => return unconnected.into(),
        };
        let http_error = |source| ClientError::Http { addr: gateway.authority.clone(), source };
        let open = async {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(http_error)?;
            let mut connection: crate::sse::ConnectionFuture = Box::pin(connection);
            let response = tokio::select! {
                response = sender.send_request(request) => response.map_err(http_error)?,
                finished = &mut connection => {
                    finished.map_err(http_error)?;
                    return Err(ClientError::Protocol("the gateway closed the connection before answering".into()));
                }
            };
            Ok((response, connection))
        };
        let (response, connection) = match tokio::time::timeout_at(deadline, open).await {
            Err(_) => return Outcome::MaybeSent(ClientError::Timeout { addr: gateway.authority, after: self.timeout }),
            Ok(Err(error)) => return Outcome::MaybeSent(error),
            Ok(Ok(opened)) => opened,
        };
        let status = response.status();
        if !status.is_success() {
            let headers = response.headers().clone();
            let body =
                Limited::new(response.into_body(), 64 * 1024).collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            return not_leader(status, &headers, &body).unwrap_or_else(|| Outcome::Fatal(api_error(status, &body)));
        }
        Outcome::Answered(EventStream {
            authority: gateway.authority.clone(),
            body: response.into_body(),
            connection,
            connection_done: false,
            parser: SseParser::default(),
        })
    }

    /// Sends `request` over an open connection (plain or TLS) and reads the whole answer.
    async fn send<Io>(
        &self,
        gateway: &Gateway,
        io: Io,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, HeaderMap, Bytes)>
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let http_error = |source| ClientError::Http { addr: gateway.authority.clone(), source };
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(http_error)?;

        let response = async {
            let response = sender.send_request(request).await.map_err(http_error)?;
            let status = response.status();
            let headers = response.headers().clone();
            let collected = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await;
            match collected {
                Ok(collected) => Ok((status, headers, collected.to_bytes())),
                Err(error) => Err(match error.downcast::<hyper::Error>() {
                    Ok(source) => http_error(*source),
                    Err(_) => ClientError::Protocol(format!("answer larger than {MAX_RESPONSE_BYTES} bytes")),
                }),
            }
        };
        // The connection future does the socket I/O; drive it alongside the response in this
        // task so nothing outlives the call. Dropping it closes the socket.
        tokio::pin!(response, connection);
        tokio::select! {
            result = &mut response => result,
            finished = &mut connection => {
                finished.map_err(http_error)?;
                response.await
            }
        }
    }
}

/// Why no connection was made: nothing of the request was sent.
enum Unconnected {
    /// This gateway could not be reached; another may be.
    NotSent(ClientError),
    /// No gateway would do (https without a CA).
    Fatal(ClientError),
}

impl<T> From<Unconnected> for Outcome<T> {
    fn from(unconnected: Unconnected) -> Self {
        match unconnected {
            Unconnected::NotSent(error) => Outcome::NotSent(error),
            Unconnected::Fatal(error) => Outcome::Fatal(error),
        }
    }
}

/// Whether a request may be sent again after it may have been acted on.
fn is_idempotent(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn is_not_leader(code: &str) -> bool {
    NOT_LEADER_CODES.contains(&code)
}

/// A `503 not_leader`/`no_leader` answer (a gateway that did nothing) as its outcome; `None` for
/// every other answer.
fn not_leader<T>(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Outcome<T>> {
    if status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let error = api_error(status, body);
    if !error.code().is_some_and(is_not_leader) {
        return None;
    }
    let (leader, retry_after) = failover::not_leader_headers(headers);
    Some(Outcome::NotLeader { leader, retry_after, error })
}

/// The name the gateway's certificate must carry: the host of `host:port`, an IP address when
/// it is one (brackets dropped).
fn server_name(authority: &str) -> std::io::Result<ServerName<'static>> {
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Percent-encodes `text` for a URL path segment or query value: everything except the RFC 3986
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX` of its UTF-8 bytes.
pub fn percent_encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    encoded
}

/// Turns a user-given gateway address into `host:port`, or says what is wrong with it.
pub(crate) fn parse_address(input: &str) -> std::result::Result<String, String> {
    let trimmed = input.trim();
    let (rest, default_port) = match trimmed.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (rest, 80),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (rest, 443),
        Some((scheme, _)) => {
            return Err(format!("unsupported scheme `{scheme}`; use https://HOST:PORT, http://HOST:PORT or HOST:PORT"));
        }
        None => (trimmed, DEFAULT_PORT),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("no host given; use HOST:PORT, such as 127.0.0.1:7070".into());
    }
    if let Some(bad) = authority.chars().find(|c| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace()) {
        return Err(format!("unexpected `{bad}`; give only HOST:PORT, such as 127.0.0.1:7070"));
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        // IPv6 literal: [::1] or [::1]:7070.
        let (address, after) = bracketed.split_once(']').ok_or_else(|| "unclosed `[` in IPv6 address".to_owned())?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| format!("unexpected `{after}` after `]`"))?),
        };
        (format!("[{address}]"), port)
    } else {
        match authority.split_once(':') {
            Some((_, after)) if after.contains(':') => {
                return Err("write IPv6 addresses in brackets, such as [::1]:7070".into());
            }
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (authority.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("no host given; use HOST:PORT, such as 127.0.0.1:7070".into());
    }
    let port = match port {
        None => default_port,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("`{port}` is not a port number (1-65535)")),
        },
    };
    Ok(format!("{host}:{port}"))
}

/// Reads a response: JSON for 2xx, an [`ClientError::Api`] error otherwise.
fn interpret(status: StatusCode, body: &[u8]) -> Result<Value> {
    if !status.is_success() {
        return Err(api_error(status, body));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| ClientError::Protocol(format!("{status} answer is not JSON: {e}")))
}

/// Builds the error for a 4xx/5xx answer from the API's `{"error": {...}}` body, or from the
/// status alone when a proxy or an older gateway sent something else.
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let text_of = |key: &str| error.and_then(|e| e.get(key)).and_then(Value::as_str).map(str::to_owned);
    let code = text_of("code").unwrap_or_else(|| fallback_code(status));
    let message = text_of("message").unwrap_or_else(|| {
        let body_text = String::from_utf8_lossy(body);
        let body_text = body_text.trim();
        let reason = status.canonical_reason().unwrap_or("error");
        if body_text.is_empty() || error.is_some() {
            format!("the gateway answered {} {reason}", status.as_u16())
        } else {
            let snippet: String = body_text.chars().take(200).collect();
            format!("the gateway answered {} {reason}: {snippet}", status.as_u16())
        }
    });
    let fields = error
        .and_then(|e| e.get("fields"))
        .and_then(Value::as_array)
        .map(|fields| {
            fields
                .iter()
                .map(|f| FieldError {
                    field: f.get("field").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    reason: f.get("reason").and_then(Value::as_str).unwrap_or_default().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    ClientError::Api { status: status.as_u16(), code, message, fields }
}

fn fallback_code(status: StatusCode) -> String {
    match status.as_u16() {
        400 => "bad_request".into(),
        404 => "not_found".into(),
        413 => "too_large".into(),
        503 => "unavailable".into(),
        500..=599 => "internal".into(),
        other => format!("http_{other}"),
    }
}

/// The message, then each invalid field as `field: reason` on its own line. Gateways often
/// build the message from the fields; then the fields are not repeated, and a message that is only
/// the fields joined by `; ` becomes a short heading above them.
fn api_error_text(code: &str, message: &str, fields: &[FieldError]) -> String {
    let lines: Vec<String> = fields.iter().map(|f| format!("{}: {}", f.field, f.reason)).collect();
    let (mut text, shown) = if !lines.is_empty() && message == lines.join("; ") {
        let heading = if code == "invalid_spec" { "the job spec is invalid:" } else { "the request is invalid:" };
        (heading.to_owned(), lines.iter().collect::<Vec<_>>())
    } else {
        let unsaid = fields.iter().zip(&lines).filter(|(f, _)| !message.contains(f.reason.as_str()));
        (message.to_owned(), unsaid.map(|(_, line)| line).collect())
    };
    for line in shown {
        text.push_str("\n  ");
        text.push_str(line);
    }
    text
}

#[cfg(test)]
mod failover_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[test]
    fn addresses_accept_host_port_and_http_urls() {
        assert_eq!(parse_address("127.0.0.1:7070").unwrap(), "127.0.0.1:7070");
        assert_eq!(parse_address("localhost:8080").unwrap(), "localhost:8080");
        assert_eq!(parse_address("localhost").unwrap(), "localhost:7070");
        assert_eq!(parse_address(" http://gw.example:9000/ ").unwrap(), "gw.example:9000");
        assert_eq!(parse_address("HTTP://gw.example").unwrap(), "gw.example:80");
        assert_eq!(parse_address("[::1]:7070").unwrap(), "[::1]:7070");
        assert_eq!(parse_address("http://[::1]").unwrap(), "[::1]:80");
    }

    #[test]
    fn addresses_reject_paths_and_bad_ports() {
        assert_eq!(parse_address("https://gw:7070").unwrap(), "gw:7070");
        assert_eq!(parse_address("HTTPS://gw").unwrap(), "gw:443");
        assert!(parse_address("grpc://gw:7070").unwrap_err().contains("unsupported scheme"));
        assert!(parse_address("http://gw:7070/v1").is_err());
        assert!(parse_address("gw:0").is_err());
        assert!(parse_address("gw:99999").is_err());
        assert!(parse_address("gw:").is_err());
        assert!(parse_address("").is_err());
        assert!(parse_address(":7070").is_err());
        assert!(parse_address("::1:7070").unwrap_err().contains("brackets"));
        assert!(parse_address("[::1").is_err());
        assert!(Client::new("https://x").unwrap().gateways.current().https);
        assert!(!Client::new("http://x").unwrap().gateways.current().https);
    }

    #[test]
    fn percent_encoding_keeps_unreserved_characters_only() {
        assert_eq!(percent_encode("j-01ab_C.~"), "j-01ab_C.~");
        assert_eq!(percent_encode("project=llm"), "project%3Dllm");
        assert_eq!(percent_encode("a b/c?d&e#f%"), "a%20b%2Fc%3Fd%26e%23f%25");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode(""), "");
    }

    #[test]
    fn api_errors_keep_code_message_and_fields() {
        let body = br#"{"error":{"code":"invalid_spec","message":"spec has problems","fields":[
            {"field":"gang.resources.gpus","reason":"must be at least 1"},
            {"field":"tenant","reason":"must not be empty"}]}}"#;
        let error = api_error(StatusCode::BAD_REQUEST, body);
        assert_eq!(error.status(), Some(400));
        assert_eq!(error.code(), Some("invalid_spec"));
        assert_eq!(
            error.to_string(),
            "spec has problems\n  gang.resources.gpus: must be at least 1\n  tenant: must not be empty"
        );
    }

    #[test]
    fn field_errors_already_in_the_message_are_not_repeated() {
        let field = |field: &str, reason: &str| FieldError { field: field.into(), reason: reason.into() };
        let fields = [field("gang.resources.gpus", "must be at least 1"), field("payload", "needs a command")];
        assert_eq!(
            api_error_text(
                "invalid_spec",
                "gang.resources.gpus: must be at least 1; payload: needs a command",
                &fields
            ),
            "the job spec is invalid:\n  gang.resources.gpus: must be at least 1\n  payload: needs a command"
        );
        let yaml = [field("spec", "not valid YAML: line 1")];
        assert_eq!(
            api_error_text("invalid_spec", "spec is not valid YAML: line 1", &yaml),
            "spec is not valid YAML: line 1"
        );
        assert_eq!(
            api_error_text("bad_request", "bad query", &[field("state", "unknown state `x`")]),
            "bad query\n  state: unknown state `x`"
        );
    }

    #[test]
    fn api_errors_without_json_fall_back_to_the_status() {
        let error = api_error(StatusCode::BAD_GATEWAY, b"upstream down");
        assert_eq!(error.code(), Some("internal"));
        assert_eq!(error.to_string(), "the gateway answered 502 Bad Gateway: upstream down");
        assert_eq!(api_error(StatusCode::NOT_FOUND, b"").code(), Some("not_found"));
    }

    #[test]
    fn successful_answers_must_be_json() {
        assert_eq!(interpret(StatusCode::OK, br#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(interpret(StatusCode::NO_CONTENT, b"").unwrap(), Value::Null);
        assert!(matches!(interpret(StatusCode::OK, b"<html>"), Err(ClientError::Protocol(_))));
    }

    /// Serves one canned HTTP answer on a port-0 listener; returns its address and the request
    /// it received.
    async fn serve_once(status: &str, body: &str) -> (String, tokio::task::JoinHandle<String>) {
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the end of the headers plus any declared body.
            loop {
                let n = socket.read(&mut buf).await.unwrap();
                received.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&received).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if received.len() >= end + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            socket.write_all(answer.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
            String::from_utf8_lossy(&received).to_string()
        });
        (addr, server)
    }

    #[tokio::test]
    async fn submit_sends_yaml_and_reports_creation() {
        let (addr, server) = serve_once("201 Created", r#"{"id":"j-1","state":"Queued"}"#).await;
        let client = Client::new(&addr).unwrap();
        let (job, created) = client.submit("name: x\ntenant: t\n").await.unwrap();
        assert!(created);
        assert_eq!(job["id"], "j-1");
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /v1/jobs HTTP/1.1\r\n"), "{request}");
        assert!(request.to_ascii_lowercase().contains("content-type: application/yaml"), "{request}");
        assert!(request.ends_with("name: x\ntenant: t\n"), "{request}");
    }

    #[tokio::test]
    async fn list_encodes_its_query_and_errors_become_api_errors() {
        let body = r#"{"error":{"code":"not_found","message":"no such job"}}"#;
        let (addr, server) = serve_once("404 Not Found", body).await;
        let error = Client::new(&addr).unwrap().list(Some("ml team"), None, Some("project=llm")).await.unwrap_err();
        assert_eq!(error.code(), Some("not_found"));
        assert_eq!(error.to_string(), "no such job");
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /v1/jobs?tenant=ml%20team&selector=project%3Dllm&limit=1000 HTTP/1.1"),
            "{request}"
        );
    }

    #[tokio::test]
    async fn a_token_is_sent_as_a_bearer_header_and_a_403_prints_the_servers_message() {
        let body = r#"{"error":{"code":"forbidden","message":"alice may not cancel job j-1 of tenant vision: needs role member in tenant vision; alice is viewer in vision","fields":[]}}"#;
        let (addr, server) = serve_once("403 Forbidden", body).await;
        let client = Client::new(&addr).unwrap().with_token(Some("tok-123".into()));
        assert!(!format!("{client:?}").contains("tok-123"));
        let error = client.cancel("j-1").await.unwrap_err();
        assert_eq!(error.status(), Some(403));
        assert!(error.to_string().starts_with("alice may not cancel job j-1 of tenant vision"), "{error}");
        let request = server.await.unwrap();
        assert!(request.to_ascii_lowercase().contains("authorization: bearer tok-123\r\n"), "{request}");
    }

    #[tokio::test]
    async fn unreachable_gateways_say_what_to_do() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let error = Client::new(&addr).unwrap().clusters().await.unwrap_err();
        assert!(matches!(error, ClientError::Connect { .. }), "{error:?}");
        assert!(error.to_string().contains("meridian gateway"), "{error}");
    }

    #[tokio::test]
    async fn silent_gateways_time_out() {
        // The listener accepts (in the kernel) but never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let client = Client::new(&addr).unwrap().with_timeout(Duration::from_millis(200));
        let error = client.get("j-1").await.unwrap_err();
        assert!(matches!(error, ClientError::Timeout { .. }), "{error:?}");
        drop(listener);
    }
}
