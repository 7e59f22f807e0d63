//! The gateway's APIs: REST/JSON (axum) and gRPC (tonic), thin adapters over [`Gateway`].
//! [`respond`] is the one place that maps errors to HTTP statuses and gRPC codes.

use std::collections::HashMap;
use std::pin::Pin;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::validate::{FieldError, MAX_SPEC_BYTES, SpecError};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Status, Streaming};

use crate::dispatch;
use crate::server::{ApiError, Gateway, JobFilter};
use crate::store::JobRecord;

/// Status, machine-readable code and field errors for an [`ApiError`]; used by both APIs.
pub mod respond {
    use super::*;

    /// HTTP status, error code and per-field errors of `error`.
    pub fn classify(error: &ApiError) -> (StatusCode, &'static str, Vec<FieldError>) {
        match error {
            ApiError::InvalidSpec(e @ SpecError::TooLarge { .. }) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.field_errors())
            }
            ApiError::InvalidSpec(e) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec", e.field_errors()),
            ApiError::NeverFits { reasons } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "never_fits",
                reasons
                    .iter()
                    .map(|(cluster, reason)| FieldError {
                        field: format!("clusters.{cluster}"),
                        reason: reason.clone(),
                    })
                    .collect(),
            ),
            ApiError::IdempotencyConflict { .. } => (
                StatusCode::CONFLICT,
                "conflict",
                vec![FieldError { field: "idempotencyKey".into(), reason: error.to_string() }],
            ),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", Vec::new()),
            ApiError::BadRequest { field, reason } => (
                StatusCode::BAD_REQUEST,
                "bad_request",
                vec![FieldError { field: field.clone(), reason: reason.clone() }],
            ),
            ApiError::Storage(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Vec::new()),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", Vec::new()),
        }
    }

    /// The JSON error body.
    pub fn http(error: &ApiError) -> Response {
        let (status, code, fields) = classify(error);
        let body = json!({"error": {"code": code, "message": error.to_string(), "fields": fields}});
        (status, axum::Json(body)).into_response()
    }

    /// The gRPC status.
    pub fn grpc(error: &ApiError) -> Status {
        let (status, _, _) = classify(error);
        let message = error.to_string();
        match status {
            StatusCode::NOT_FOUND => Status::not_found(message),
            StatusCode::CONFLICT => Status::already_exists(message),
            StatusCode::SERVICE_UNAVAILABLE => Status::unavailable(message),
            StatusCode::INTERNAL_SERVER_ERROR => Status::internal(message),
            StatusCode::UNPROCESSABLE_ENTITY if matches!(error, ApiError::NeverFits { .. }) => {
                Status::failed_precondition(message)
            }
            _ => Status::invalid_argument(message),
        }
    }
}

struct HttpError(ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        respond::http(&self.0)
    }
}

type HttpResult<T> = Result<T, HttpError>;

/// The REST router.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/v1/jobs", get(list_jobs).post(submit_job))
        .route("/v1/jobs/{id}", get(get_job).delete(cancel_job))
        .route("/v1/jobs/{id}/explain", get(explain_job))
        .route("/v1/clusters", get(list_clusters))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|| async {
            let body = json!({"error": {"code": "not_found", "message": "no such endpoint; the API lives under /v1 (see docs/api.md)", "fields": []}});
            (StatusCode::NOT_FOUND, axum::Json(body))
        })
        // Bodies a little over the spec limit still reach the handler, which answers with the
        // JSON error; far larger ones are cut off by axum.
        .layer(DefaultBodyLimit::max(MAX_SPEC_BYTES * 4))
        .with_state(gateway)
}

async fn submit_job(State(gateway): State<Gateway>, body: Bytes) -> HttpResult<Response> {
    if body.len() > MAX_SPEC_BYTES {
        return Err(ApiError::InvalidSpec(SpecError::TooLarge { size: body.len(), limit: MAX_SPEC_BYTES }).into());
    }
    let text = std::str::from_utf8(&body).map_err(|e| {
        ApiError::InvalidSpec(SpecError::Syntax { format: "YAML", message: format!("body is not UTF-8: {e}") })
    })?;
    let (job, created) = gateway.submit(text)?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(job)).into_response())
}

/// Parses list filters, naming any unknown or invalid parameter.
pub fn parse_filter(params: &HashMap<String, String>) -> Result<JobFilter, ApiError> {
    let mut filter = JobFilter::default();
    for (key, value) in params {
        match key.as_str() {
            "tenant" if !value.is_empty() => filter.tenant = Some(value.clone()),
            "state" if !value.is_empty() => {
                filter.state = Some(
                    value
                        .parse::<JobState>()
                        .map_err(|e| ApiError::BadRequest { field: "state".into(), reason: e.to_string() })?,
                );
            }
            "selector" if !value.is_empty() => {
                filter.selector = Some(value.parse().map_err(|e: meridian_proto::selector::SelectorError| {
                    ApiError::BadRequest { field: "selector".into(), reason: e.to_string() }
                })?);
            }
            "tenant" | "state" | "selector" => {}
            other => {
                return Err(ApiError::BadRequest {
                    field: other.to_string(),
                    reason: "unknown query parameter; use tenant, state or selector".into(),
                });
            }
        }
    }
    Ok(filter)
}

async fn list_jobs(
    State(gateway): State<Gateway>,
    Query(params): Query<HashMap<String, String>>,
) -> HttpResult<axum::Json<serde_json::Value>> {
    let filter = parse_filter(&params)?;
    let jobs = gateway.list(&filter)?;
    Ok(axum::Json(json!({ "jobs": jobs })))
}

async fn get_job(State(gateway): State<Gateway>, Path(id): Path<String>) -> HttpResult<axum::Json<JobRecord>> {
    Ok(axum::Json(gateway.get(&id)?))
}

async fn cancel_job(State(gateway): State<Gateway>, Path(id): Path<String>) -> HttpResult<axum::Json<JobRecord>> {
    Ok(axum::Json(gateway.cancel(&id)?))
}

async fn explain_job(
    State(gateway): State<Gateway>,
    Path(id): Path<String>,
) -> HttpResult<axum::Json<crate::server::Explanation>> {
    Ok(axum::Json(gateway.explain(&id)?))
}

async fn list_clusters(State(gateway): State<Gateway>) -> HttpResult<axum::Json<serde_json::Value>> {
    Ok(axum::Json(json!({ "clusters": gateway.clusters()? })))
}

/// Serves the REST API on `listener` until `shutdown` flips.
pub async fn serve_rest(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    axum::serve(listener, router(gateway))
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}

/// Serves the gRPC services (agents' `Federation`, users' `Jobs`) until `shutdown` flips.
pub async fn serve_grpc(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut stop = shutdown.clone();
    tonic::transport::Server::builder()
        .add_service(pb::federation_server::FederationServer::new(FederationApi { gateway: gateway.clone(), shutdown }))
        .add_service(pb::jobs_server::JobsServer::new(JobsApi { gateway }))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
        .map_err(std::io::Error::other)
}

/// The agents' stream endpoint.
pub struct FederationApi {
    gateway: Gateway,
    shutdown: watch::Receiver<bool>,
}

type GatewayStream = Pin<Box<dyn Stream<Item = Result<pb::GatewayMessage, Status>> + Send>>;

#[tonic::async_trait]
impl pb::federation_server::Federation for FederationApi {
    type AttachStream = GatewayStream;

    async fn attach(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<tonic::Response<Self::AttachStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within 10s"))??;
        let hello = match first.and_then(|m| m.body) {
            Some(pb::agent_message::Body::Hello(hello)) => hello,
            _ => return Err(Status::invalid_argument("the first message on the stream must be `hello`")),
        };
        let info = dispatch::hello_info(hello).map_err(|e| Status::invalid_argument(format!("hello: {e}")))?;
        let cluster = info.name.clone();
        let (tx, rx) = mpsc::channel(1024);
        let connection = self.gateway.connect_agent(info, tx).map_err(|e| respond::grpc(&e))?;
        let gateway = self.gateway.clone();
        let mut shutdown = self.shutdown.clone();
        // The reader lives exactly as long as the agent's stream (or until shutdown).
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(message)) => {
                            if let Err(e) = gateway.agent_message(&cluster, connection, message) {
                                tracing::error!(cluster = %cluster, error = %e, "agent message failed");
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::info!(cluster = %cluster, error = %status, "agent stream error");
                            break;
                        }
                    },
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
            gateway.disconnect_agent(&cluster, connection);
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The users' gRPC API.
pub struct JobsApi {
    gateway: Gateway,
}

fn job_to_wire(job: &JobRecord) -> pb::Job {
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
    }
}

fn grpc<T>(result: Result<T, ApiError>) -> Result<T, Status> {
    result.map_err(|e| respond::grpc(&e))
}

#[tonic::async_trait]
impl pb::jobs_server::Jobs for JobsApi {
    async fn submit(&self, request: Request<pb::SubmitRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let (job, _) = grpc(self.gateway.submit(&request.into_inner().spec_text))?;
        Ok(tonic::Response::new(job_to_wire(&job)))
    }

    async fn get(&self, request: Request<pb::GetJobRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let job = grpc(self.gateway.get(&request.into_inner().id))?;
        Ok(tonic::Response::new(job_to_wire(&job)))
    }

    async fn list(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<tonic::Response<pb::ListJobsResponse>, Status> {
        let request = request.into_inner();
        let mut params = HashMap::new();
        params.insert("tenant".to_string(), request.tenant);
        params.insert("selector".to_string(), request.selector);
        if request.state != 0 {
            let state = pb::JobState::try_from(request.state)
                .ok()
                .and_then(|s| JobState::try_from(s).ok())
                .ok_or_else(|| Status::invalid_argument(format!("state: {} is not a job state", request.state)))?;
            params.insert("state".to_string(), state.as_str().to_string());
        }
        let filter = grpc(parse_filter(&params))?;
        let jobs = grpc(self.gateway.list(&filter))?;
        Ok(tonic::Response::new(pb::ListJobsResponse { jobs: jobs.iter().map(job_to_wire).collect(), continue_token: String::new() }))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Result<tonic::Response<pb::Job>, Status> {
        let job = grpc(self.gateway.cancel(&request.into_inner().id))?;
        Ok(tonic::Response::new(job_to_wire(&job)))
    }

    async fn explain(
        &self,
        request: Request<pb::ExplainRequest>,
    ) -> Result<tonic::Response<pb::ExplainResponse>, Status> {
        let explanation = grpc(self.gateway.explain(&request.into_inner().id))?;
        let explanation_json = serde_json::to_string(&explanation).map_err(|e| Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ExplainResponse { explanation_json }))
    }

    async fn list_clusters(
        &self,
        _request: Request<pb::ListClustersRequest>,
    ) -> Result<tonic::Response<pb::ListClustersResponse>, Status> {
        let clusters = grpc(self.gateway.clusters())?;
        let clusters_json =
            serde_json::to_string(&json!({ "clusters": clusters })).map_err(|e| Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::ListClustersResponse { clusters_json }))
    }
}
