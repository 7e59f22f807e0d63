//! The REST/JSON API (axum): thin handlers over the runtime's [`Handle`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, RawQuery, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use meridian_core::JobFilter;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::job::JobState;
use meridian_proto::validate::{MAX_SPEC_BYTES, SpecError, parse_job_spec};
use serde_json::json;

use super::error::{ApiError, Result};
use super::query::decode_query;
use super::redact::{redacted, shown};
use crate::auth::{Authenticator, Caller, Role};
use crate::runtime::{Handle, now_ms};

/// Bytes of output per `GET /v1/jobs/{id}/logs` answer when `maxBytes` is not given.
pub const DEFAULT_LOG_BYTES: u32 = 64 * 1024;
/// The largest `maxBytes` accepted (one answer crosses the agent's stream as one message).
pub const MAX_LOG_BYTES: u32 = 256 * 1024;

/// Jobs per page of `GET /v1/jobs` when `limit` is not given.
pub const DEFAULT_PAGE: usize = 500;
/// The largest `limit` accepted.
pub const MAX_PAGE: usize = 5000;

/// What the REST handlers share.
#[derive(Clone)]
pub struct RestState {
    /// The runtime.
    pub handle: Handle,
    /// GPU types specs may name.
    pub catalog: GpuCatalog,
    /// Per-tenant submit rates.
    pub submit_rate: std::sync::Arc<super::SubmitRate>,
    /// Who callers are.
    pub auth: Arc<Authenticator>,
}

/// The authenticated caller of a REST request, from its `Authorization: Bearer` header; a
/// request without valid credentials is answered 401 before its body is read.
impl FromRequestParts<RestState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &RestState) -> Result<Self> {
        let header = parts.headers.get(axum::http::header::AUTHORIZATION).map(|value| value.to_str());
        let header = match header {
            None => None,
            Some(Ok(text)) => Some(text),
            Some(Err(_)) => return Err(ApiError::Unauthenticated("the Authorization header is not ASCII".into())),
        };
        state.auth.authenticate(header).map_err(|rejection| {
            tracing::info!(path = %parts.uri.path(), reason = %rejection, "request not authenticated");
            ApiError::from(rejection)
        })
    }
}

/// The handler of a documented operation (by its `operationId`, see [`super::openapi`]).
fn handler(operation: &str) -> Option<MethodRouter<RestState>> {
    Some(match operation {
        "submitJob" => post(submit_job),
        "listJobs" => get(list_jobs),
        "getJob" => get(get_job),
        "cancelJob" => delete(cancel_job),
        "explainJob" => get(explain_job),
        "jobLogs" => get(job_logs),
        "listClusters" => get(list_clusters),
        "listTenants" => get(list_tenants),
        "watchEvents" => get(super::events::events),
        "health" => get(health),
        "ready" => get(ready),
        "openapi" => get(openapi),
        "consoleSession" => get(super::console::session),
        _ => return None,
    })
}

/// The REST router: every operation of [`super::openapi::OPERATIONS`], and JSON errors for
/// everything else.
pub fn router(state: RestState) -> Router {
    let mut paths: BTreeMap<&str, MethodRouter<RestState>> = BTreeMap::new();
    for operation in super::openapi::OPERATIONS.iter().filter(|op| !super::openapi::SERVED_ELSEWHERE.contains(&op.id)) {
        let Some(method) = handler(operation.id) else {
            // The tests make sure this never happens.
            tracing::error!(operation = operation.id, "a documented operation has no handler");
            continue;
        };
        let merged = match paths.remove(operation.path) {
            Some(existing) => existing.merge(method),
            None => method,
        };
        paths.insert(operation.path, merged);
    }
    paths
        .into_iter()
        .fold(Router::new(), |router, (path, method)| router.route(path, method))
        .fallback(|| async {
            let body = json!({"error": {"code": "not_found", "message": "no such endpoint; the API lives under /v1 (see docs/api.md)", "fields": []}});
            (StatusCode::NOT_FOUND, axum::Json(body))
        })
        // axum adds the `Allow` header to this answer.
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }
        })
        // Bodies a little over the spec limit still reach the handler, which answers with the
        // JSON error naming `spec`; larger ones are refused by the guard in front of the router
        // (`guard::MAX_BODY_BYTES`, the same limit) before they are read.
        .layer(DefaultBodyLimit::max(MAX_SPEC_BYTES * 4))
        .merge(super::console::router())
        .with_state(state)
}

/// The OpenAPI document, built once.
async fn openapi() -> Response {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    axum::Json(DOCUMENT.get_or_init(super::openapi::document)).into_response()
}

async fn health(State(state): State<RestState>) -> Response {
    match state.handle.view().failure() {
        None => "ok".into_response(),
        Some(reason) => ApiError::Core(meridian_core::Error::Unavailable(reason.to_string())).into_response(),
    }
}

/// `/readyz`: the role, for load balancers and probes. A leader is ready unless its store
/// failed; a standby once its view is loaded.
async fn ready(State(state): State<RestState>) -> Response {
    use crate::runtime::Role;
    let failure = state.handle.view().failure().map(str::to_string);
    let (ready, body) = match state.handle.role() {
        Role::Leader { epoch } => (failure.is_none(), json!({"role": "leader", "epoch": epoch, "failure": failure})),
        Role::Standby { leader, warm } => (warm, json!({"role": "standby", "leader": leader, "warm": warm})),
        Role::Stopped => (false, json!({"role": "stopping"})),
    };
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

/// Media types a job spec may be sent as (parameters such as `charset` aside).
pub const SPEC_MEDIA_TYPES: [&str; 4] = ["application/json", "application/yaml", "application/x-yaml", "text/yaml"];

/// Checks a spec's `Content-Type`: JSON or YAML, or none at all (the body is sniffed).
pub fn check_spec_content_type(headers: &HeaderMap) -> Result<()> {
    let Some(value) = headers.get(CONTENT_TYPE) else { return Ok(()) };
    let text = String::from_utf8_lossy(value.as_bytes());
    let media_type = text.split(';').next().unwrap_or_default().trim();
    if SPEC_MEDIA_TYPES.iter().any(|known| known.eq_ignore_ascii_case(media_type)) {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(text.chars().take(128).collect()))
    }
}

async fn submit_job(
    State(state): State<RestState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    check_spec_content_type(&headers)?;
    if body.len() > MAX_SPEC_BYTES {
        return Err(ApiError::InvalidSpec(SpecError::TooLarge { size: body.len(), limit: MAX_SPEC_BYTES }));
    }
    let text = std::str::from_utf8(&body).map_err(|e| {
        ApiError::InvalidSpec(SpecError::Syntax { format: "YAML", message: format!("body is not UTF-8: {e}") })
    })?;
    // Parsed here, on the caller's task, so the core's loop only sees valid specs.
    let spec = parse_job_spec(text, &state.catalog)?;
    caller.require(Role::Member, &spec.tenant, || format!("submit a job to tenant {}", spec.tenant))?;
    state.submit_rate.check(&spec.tenant)?;
    let (job, created) = state.handle.submit(spec).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(redacted(&job))).into_response())
}

/// A job list request: filters and a page.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Which jobs.
    pub filter: JobFilter,
    /// Jobs per page.
    pub limit: usize,
    /// The previous page's continue token.
    pub after: Option<String>,
}

/// Limits a list to what `caller` may read: a tenant filter needs the viewer role in that
/// tenant; without one, a non-admin sees only its own tenants.
pub fn authorize_list(caller: &Caller, query: &mut ListQuery) -> Result<()> {
    match &query.filter.tenant {
        Some(tenant) => caller.require(Role::Viewer, tenant, || format!("list jobs of tenant {tenant}"))?,
        None => query.filter.tenants = caller.visible_tenants(),
    }
    Ok(())
}

/// The job `id` if `caller` has at least `role` in its tenant; `verb` says what the call does
/// (`read`, `cancel`, ...), for the refusal.
pub fn authorized_job(
    handle: &Handle,
    caller: &Caller,
    id: &str,
    role: Role,
    verb: &str,
) -> Result<Arc<meridian_core::JobRecord>> {
    let job = handle.view().job(id).ok_or_else(|| ApiError::NotFound(id.to_owned()))?;
    let tenant = &job.spec.tenant;
    caller.require(role, tenant, || format!("{verb} job {id} of tenant {tenant}"))?;
    Ok(job)
}

/// Parses list parameters, naming any unknown or invalid one.
pub fn parse_list_query(params: &HashMap<String, String>) -> Result<ListQuery> {
    let mut query = ListQuery { limit: DEFAULT_PAGE, ..Default::default() };
    let bad = |field: &str, reason: String| ApiError::BadRequest { field: field.into(), reason };
    for (key, value) in params {
        match key.as_str() {
            "tenant" if !value.is_empty() => query.filter.tenant = Some(value.clone()),
            "state" if !value.is_empty() => {
                query.filter.state = Some(value.parse::<JobState>().map_err(|e| bad("state", e.to_string()))?);
            }
            "selector" if !value.is_empty() => {
                query.filter.selector = Some(
                    value
                        .parse()
                        .map_err(|e: meridian_proto::selector::SelectorError| bad("selector", e.to_string()))?,
                );
            }
            "limit" if !value.is_empty() => {
                query.limit =
                    value.parse::<usize>().ok().filter(|n| (1..=MAX_PAGE).contains(n)).ok_or_else(|| {
                        bad("limit", format!("`{value}` must be a whole number from 1 to {MAX_PAGE}"))
                    })?;
            }
            "continue" if !value.is_empty() => query.after = Some(value.clone()),
            "tenant" | "state" | "selector" | "limit" | "continue" => {}
            other => {
                return Err(bad(
                    other,
                    "unknown query parameter; use tenant, state, selector, limit or continue".into(),
                ));
            }
        }
    }
    Ok(query)
}

/// The request's query parameters, decoded strictly (see [`decode_query`]).
fn query_params(raw: Option<String>) -> Result<HashMap<String, String>> {
    Ok(decode_query(raw.as_deref().unwrap_or_default())?.into_iter().collect())
}

async fn list_jobs(
    State(state): State<RestState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<axum::Json<serde_json::Value>> {
    let mut query = parse_list_query(&query_params(raw)?)?;
    authorize_list(&caller, &mut query)?;
    let view = state.handle.view();
    let page = view.list(&query.filter, query.limit, query.after.as_deref());
    let now = now_ms();
    let jobs: Vec<_> = page.jobs.iter().map(|job| shown(job, &view, now)).collect();
    let mut body = json!({ "jobs": jobs });
    if let Some(next) = page.next {
        body["continue"] = json!(next);
    }
    Ok(axum::Json(body))
}

async fn get_job(State(state): State<RestState>, caller: Caller, Path(id): Path<String>) -> Result<Response> {
    let job = authorized_job(&state.handle, &caller, &id, Role::Viewer, "read")?;
    Ok(axum::Json(shown(&job, &state.handle.view(), now_ms())).into_response())
}

async fn cancel_job(State(state): State<RestState>, caller: Caller, Path(id): Path<String>) -> Result<Response> {
    authorized_job(&state.handle, &caller, &id, Role::Member, "cancel")?;
    let job = state.handle.cancel(&id).await?;
    Ok(axum::Json(redacted(&job)).into_response())
}

async fn explain_job(State(state): State<RestState>, caller: Caller, Path(id): Path<String>) -> Result<Response> {
    authorized_job(&state.handle, &caller, &id, Role::Viewer, "explain")?;
    let explanation = state.handle.view().explain(&id).ok_or(ApiError::NotFound(id))?;
    Ok(axum::Json(explanation).into_response())
}

/// `from` and `maxBytes` of a logs request, naming any unknown or invalid parameter.
pub fn parse_logs_query(params: &HashMap<String, String>) -> Result<(Option<u64>, u32)> {
    let bad = |field: &str, reason: String| ApiError::BadRequest { field: field.into(), reason };
    let (mut from, mut max_bytes) = (None, DEFAULT_LOG_BYTES);
    for (key, value) in params {
        match key.as_str() {
            "from" => {
                from = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| bad("from", format!("`{value}` must be a byte offset (a whole number ≥ 0)")))?,
                );
            }
            "maxBytes" => {
                max_bytes = value.parse::<u32>().ok().filter(|n| (1..=MAX_LOG_BYTES).contains(n)).ok_or_else(|| {
                    bad("maxBytes", format!("`{value}` must be a whole number from 1 to {MAX_LOG_BYTES}"))
                })?;
            }
            other => return Err(bad(other, "unknown query parameter; use from or maxBytes".into())),
        }
    }
    Ok((from, max_bytes))
}

async fn job_logs(
    State(state): State<RestState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let (from, max_bytes) = parse_logs_query(&query_params(raw)?)?;
    authorized_job(&state.handle, &caller, &id, Role::Viewer, "read the logs of")?;
    let chunk = state.handle.logs(&id, from, max_bytes).await?;
    Ok(axum::Json(chunk).into_response())
}

/// Any authenticated caller may see the clusters (they hold no tenant's data).
async fn list_clusters(State(state): State<RestState>, _caller: Caller) -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "clusters": state.handle.view().clusters(now_ms()) }))
}

/// Tenants' queues (running and queued GPUs, fair share, quota); a non-admin sees only its own
/// tenants.
async fn list_tenants(State(state): State<RestState>, caller: Caller) -> axum::Json<serde_json::Value> {
    let visible = caller.visible_tenants();
    let tenants: Vec<_> = state
        .handle
        .view()
        .tenants()
        .into_iter()
        .filter(|t| visible.as_ref().is_none_or(|set| set.contains(&t.tenant)))
        .collect();
    axum::Json(json!({ "tenants": tenants }))
}
