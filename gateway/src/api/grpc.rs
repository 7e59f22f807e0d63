//! The gRPC services: the users' `Jobs` API and the agents' `Federation` stream. Wire messages
//! are converted to domain types here, once.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use meridian_core::JobRecord;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::job::JobState;
use meridian_proto::names::check_cluster_name;
use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello};
use meridian_proto::validate::parse_job_spec;
use serde_json::json;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Status, Streaming};

use super::error::{self, ApiError};
use super::redact::redacted;
use super::rest::{authorize_list, authorized_job, parse_list_query, parse_logs_query};
use crate::auth::{Authenticator, Caller, Role};
use crate::runtime::{Handle, now_ms};

/// How long a new agent stream may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The agents' stream endpoint.
pub struct FederationApi {
    /// The runtime.
    pub handle: Handle,
    /// Flips to true at shutdown; ends every stream's reader.
    pub shutdown: watch::Receiver<bool>,
    /// Whether a stream must come with a client certificate naming its cluster (TLS); false
    /// only with `insecure: true`.
    pub require_certificate: bool,
}

type GatewayStream = Pin<Box<dyn Stream<Item = Result<pb::GatewayMessage, Status>> + Send>>;

#[tonic::async_trait]
impl pb::federation_server::Federation for FederationApi {
    type AttachStream = GatewayStream;

    async fn attach(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<tonic::Response<Self::AttachStream>, Status> {
        // The clusters this connection's certificate may speak for (rustls has verified it).
        let certified: Option<Vec<String>> = if self.require_certificate {
            let certificates = request.peer_certs();
            let leaf = certificates.as_deref().and_then(|certs| certs.first()).ok_or_else(|| {
                Status::unauthenticated(
                    "the Federation stream needs a client certificate naming the cluster \
                     (URI SAN urn:meridian:cluster:NAME; see `meridian certs issue`)",
                )
            })?;
            let names = crate::tls::identity::certified_clusters(leaf).map_err(|refused| {
                tracing::warn!(reason = %refused, "refused an agent certificate that names an invalid cluster");
                Status::permission_denied(format!("the client certificate's {refused}"))
            })?;
            Some(names)
        } else {
            None
        };
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10s"))??;
        let hello = match first.and_then(|m| m.body) {
            Some(pb::agent_message::Body::Hello(hello)) => hello,
            _ => return Err(Status::invalid_argument("the first message on the stream must be `hello`")),
        };
        let hello = AgentHello::try_from(hello).map_err(|e| Status::invalid_argument(format!("hello: {e}")))?;
        let cluster = hello.info.name.clone();
        // Checked before the name reaches a log line, a metric label or the store.
        if let Err(reason) = check_cluster_name(&cluster) {
            tracing::warn!(%reason, "refused an agent hello whose cluster name is invalid");
            return Err(Status::invalid_argument(format!("hello.cluster: {reason}")));
        }
        if let Some(names) = &certified
            && !names.contains(&cluster)
        {
            let certificate = if names.is_empty() { "no cluster".to_string() } else { names.join(", ") };
            tracing::warn!(
                hello = %cluster,
                certificate = %certificate,
                "refused an agent whose certificate names another cluster"
            );
            return Err(Status::permission_denied(format!(
                "the client certificate names {certificate}, not cluster `{cluster}`"
            )));
        }
        let conn = self.handle.next_conn();
        let (outbox, fence) =
            self.handle.attach_fenced(conn, hello).await.map_err(|e| error::grpc(&ApiError::from(e)))?;
        let handle = self.handle.clone();
        let mut shutdown = self.shutdown.clone();
        // The reader lives exactly as long as the agent's stream (or until shutdown).
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(message)) => match Option::<AgentEvent>::try_from(message) {
                            Ok(Some(event)) => {
                                if handle.agent_event(conn, event).await.is_err() {
                                    break;
                                }
                            }
                            Ok(None) => {}
                            Err(e) => tracing::warn!(cluster = %cluster, error = %e, "ignoring an invalid agent message"),
                        },
                        Ok(None) => break,
                        Err(status) => {
                            tracing::info!(cluster = %cluster, error = %status, "agent stream error");
                            break;
                        }
                    },
                    // The guard `wait_for` returns is dropped inside, so the task stays `Send`.
                    () = async { let _ = shutdown.wait_for(|s| *s).await; } => break,
                }
            }
            handle.agent_gone(conn).await;
        });
        // Every message carries the term's epoch, and none leaves once the term's fence has
        // turned invalid (a leader paused or cut from etcd past its lease): the stream ends
        // instead, at the moment the leadership is lost even when nothing is being sent, and the
        // agent looks for the leader again.
        let epoch = fence.epoch();
        let (forward, outgoing) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut outbox = outbox;
            let lapsed = fence.lapsed();
            tokio::pin!(lapsed);
            loop {
                let command = tokio::select! {
                    biased;
                    () = &mut lapsed => break,
                    command = outbox.recv() => command,
                };
                let Some(command) = command else { break };
                if !fence.is_valid() {
                    break;
                }
                let mut message = pb::GatewayMessage::from(&command);
                message.epoch = epoch;
                if forward.send(Ok(message)).await.is_err() {
                    break;
                }
            }
        });
        let outgoing = ReceiverStream::new(outgoing);
        Ok(tonic::Response::new(Box::pin(outgoing)))
    }
}

/// The users' gRPC API.
pub struct JobsApi {
    /// The runtime.
    pub handle: Handle,
    /// GPU types specs may name.
    pub catalog: GpuCatalog,
    /// Per-tenant submit rates.
    pub submit_rate: std::sync::Arc<super::SubmitRate>,
    /// Who callers are.
    pub auth: Arc<Authenticator>,
}

impl JobsApi {
    /// The caller of `request`, from its `authorization` metadata (`Bearer <token>`).
    fn caller<T>(&self, request: &Request<T>, method: &str) -> Result<Caller, Status> {
        let header = match request.metadata().get("authorization").map(|value| value.to_str()) {
            None => None,
            Some(Ok(text)) => Some(text),
            Some(Err(_)) => {
                return Err(error::grpc(&ApiError::Unauthenticated("the authorization metadata is not ASCII".into())));
            }
        };
        self.auth.authenticate(header).map_err(|rejection| {
            tracing::info!(method, reason = %rejection, "gRPC call not authenticated");
            error::grpc(&ApiError::from(rejection))
        })
    }
}

/// A job as users see it on gRPC, as `job_to_wire_at` with the latest view, now.
fn job_to_wire(handle: &Handle, job: &JobRecord) -> pb::Job {
    job_to_wire_at(job, &handle.view(), now_ms())
}

/// A job as users see it on gRPC: secret env values hidden, with its GPU usage from `view` as of
/// `now_ms` (the same as the REST job).
fn job_to_wire_at(job: &JobRecord, view: &meridian_core::ReadView, now_ms: i64) -> pb::Job {
    let usage = view.usage(job, now_ms).map(|u| pb::JobGpuUsage {
        gpu_utilization: u.gpu_utilization,
        idle: u.idle,
        idle_since_ms: u.idle_since_ms,
        sampled_at_ms: u.sampled_at_ms,
        window_secs: u.window_secs,
    });
    let job = redacted(job);
    pb::Job {
        id: job.id.clone(),
        spec: Some(pb::JobSpec::from(&job.spec)),
        state: pb::JobState::from(job.state) as i32,
        cluster: job.cluster.clone().unwrap_or_default(),
        fencing_token: job.fencing_token,
        message: job.message.clone(),
        submitted_at_ms: job.submitted_at_ms,
        started_at_ms: job.started_at_ms.unwrap_or(0),
        finished_at_ms: job.finished_at_ms.unwrap_or(0),
        preemptions: job.preemptions,
        last_preempted_at_ms: job.last_preempted_at_ms,
        usage,
    }
}

fn grpc<T>(result: Result<T, ApiError>) -> Result<T, Status> {
    result.map_err(|e| error::grpc(&e))
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::jobs_server::Jobs for JobsApi {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<tonic::Response<Self::WatchStream>, Status> {
        let caller = self.caller(&request, "Watch")?;
        let request = request.into_inner();
        let mut params = HashMap::new();
        params.insert("after".to_string(), request.after);
        params.insert("kinds".to_string(), request.kinds.join(","));
        params.insert("tenant".to_string(), request.tenant);
        params.insert("job".to_string(), request.job);
        params.insert("selector".to_string(), request.selector);
        let query = grpc(super::events::parse_watch_query(&self.handle, &caller, &params))?;
        let subscription = self.handle.subscribe(query.after);
        let events = {
            let handle = self.handle.clone();
            super::events::said(subscription, query)
                .map(move |said| Ok(super::events::grpc_event(&said, |job| job_to_wire(&handle, job))))
        };
        Ok(tonic::Response::new(Box::pin(events)))
    }

    async fn submit(&self, request: Request<pb::SubmitRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let caller = self.caller(&request, "Submit")?;
        let spec = grpc(parse_job_spec(&request.into_inner().spec_text, &self.catalog).map_err(ApiError::from))?;
        grpc(
            caller
                .require(Role::Member, &spec.tenant, || format!("submit a job to tenant {}", spec.tenant))
                .map_err(ApiError::from),
        )?;
        grpc(self.submit_rate.check(&spec.tenant))?;
        let (job, _) = grpc(self.handle.submit(spec).await.map_err(ApiError::from))?;
        Ok(tonic::Response::new(job_to_wire(&self.handle, &job)))
    }

    async fn get(&self, request: Request<pb::GetJobRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let caller = self.caller(&request, "Get")?;
        let id = request.into_inner().id;
        let job = grpc(authorized_job(&self.handle, &caller, &id, Role::Viewer, "read"))?;
        Ok(tonic::Response::new(job_to_wire(&self.handle, &job)))
    }

    async fn list(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<tonic::Response<pb::ListJobsResponse>, Status> {
        let caller = self.caller(&request, "List")?;
        let request = request.into_inner();
        let mut params = HashMap::new();
        params.insert("tenant".to_string(), request.tenant);
        params.insert("selector".to_string(), request.selector);
        params.insert("continue".to_string(), request.continue_token);
        if request.limit != 0 {
            params.insert("limit".to_string(), request.limit.to_string());
        }
        if request.state != 0 {
            let state = pb::JobState::try_from(request.state)
                .ok()
                .and_then(|s| JobState::try_from(s).ok())
                .ok_or_else(|| Status::invalid_argument(format!("state: {} is not a job state", request.state)))?;
            params.insert("state".to_string(), state.as_str().to_string());
        }
        let mut query = grpc(parse_list_query(&params))?;
        grpc(authorize_list(&caller, &mut query))?;
        let view = self.handle.view();
        let page = view.list(&query.filter, query.limit, query.after.as_deref());
        let now = now_ms();
        Ok(tonic::Response::new(pb::ListJobsResponse {
            jobs: page.jobs.iter().map(|j| job_to_wire_at(j, &view, now)).collect(),
            continue_token: page.next.unwrap_or_default(),
        }))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let caller = self.caller(&request, "Cancel")?;
        let id = request.into_inner().id;
        grpc(authorized_job(&self.handle, &caller, &id, Role::Member, "cancel"))?;
        let job = grpc(self.handle.cancel(&id).await.map_err(ApiError::from))?;
        Ok(tonic::Response::new(job_to_wire(&self.handle, &job)))
    }

    async fn explain(
        &self,
        request: Request<pb::ExplainRequest>,
    ) -> Result<tonic::Response<pb::ExplainResponse>, Status> {
        let caller = self.caller(&request, "Explain")?;
        let id = request.into_inner().id;
        grpc(authorized_job(&self.handle, &caller, &id, Role::Viewer, "explain"))?;
        let explanation = grpc(self.handle.view().explain(&id).ok_or(ApiError::NotFound(id)))?;
        let explanation_json = serde_json::to_string(&explanation).map_err(|e| Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ExplainResponse { explanation_json }))
    }

    async fn logs(&self, request: Request<pb::JobLogsRequest>) -> Result<tonic::Response<pb::LogChunk>, Status> {
        let caller = self.caller(&request, "Logs")?;
        let request = request.into_inner();
        grpc(authorized_job(&self.handle, &caller, &request.id, Role::Viewer, "read the logs of"))?;
        let mut params = HashMap::new();
        if let Some(from) = request.from {
            params.insert("from".to_string(), from.to_string());
        }
        if request.max_bytes != 0 {
            params.insert("maxBytes".to_string(), request.max_bytes.to_string());
        }
        let (from, max_bytes) = grpc(parse_logs_query(&params))?;
        let chunk = grpc(self.handle.logs(&request.id, from, max_bytes).await.map_err(ApiError::from))?;
        Ok(tonic::Response::new(pb::LogChunk {
            data: chunk.data,
            offset: chunk.offset,
            next_offset: chunk.next_offset,
            complete: chunk.complete,
        }))
    }

    async fn list_clusters(
        &self,
        request: Request<pb::ListClustersRequest>,
    ) -> Result<tonic::Response<pb::ListClustersResponse>, Status> {
        // Any authenticated caller: clusters hold no tenant's data.
        self.caller(&request, "ListClusters")?;
        let clusters = self.handle.view().clusters(now_ms());
        let clusters_json =
            serde_json::to_string(&json!({ "clusters": clusters })).map_err(|e| Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ListClustersResponse { clusters_json }))
    }
}
