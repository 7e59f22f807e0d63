//! [`ApiError`] and the one place that maps it to HTTP statuses and gRPC codes, so the same
//! failure looks the same on every API.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use meridian_proto::validate::{FieldError, SpecError};
use serde_json::json;
use tonic::Status;

use crate::runtime::{CallError, LogsError};

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The spec is malformed or invalid; names every field at fault.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// A request parameter is wrong.
    #[error("{field}: {reason}")]
    BadRequest {
        /// The parameter.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// No job with that id (a read).
    #[error("no job `{0}`")]
    NotFound(String),
    /// The core refused the change (never fits, idempotency conflict, unknown job, duplicate
    /// agent, failed store).
    #[error(transparent)]
    Core(#[from] meridian_core::Error),
    /// The gateway is shutting down.
    #[error("the gateway is shutting down; retry shortly")]
    ShuttingDown,
    /// The member cluster answered with an error (reading a job's output).
    #[error("{0}")]
    Member(String),
    /// The member cluster did not answer in time.
    #[error("{0}")]
    MemberTimeout(String),
    /// No credentials, or credentials that do not verify (401). Says which and what to do.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but may not do this (403).
    #[error("{subject} may not {action}: {missing}")]
    Forbidden {
        /// Who asked (the token's subject).
        subject: String,
        /// What they tried, e.g. `cancel job j-1 of tenant vision`.
        action: String,
        /// What was missing, e.g. `role member in tenant vision`.
        missing: String,
    },
    /// Too many requests from this client or tenant (429).
    #[error("{what}; retry in {retry_after_secs}s")]
    RateLimited {
        /// Which limit, e.g. `tenant nlp submits at most 10 jobs per second`.
        what: String,
        /// When a retry may succeed.
        retry_after_secs: u64,
    },
    /// The request's `Content-Type` is neither JSON nor YAML (415).
    #[error("Content-Type `{0}` is not supported; send application/json or application/yaml")]
    UnsupportedMediaType(String),
    /// The path exists but not with this method (405).
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The method asked for.
        method: String,
        /// The path asked for.
        path: String,
    },
    /// The request body did not arrive in time (408); the connection is closed.
    #[error("the request body did not arrive within {0:?}; send it promptly")]
    RequestTimeout(std::time::Duration),
    /// The request body is larger than any endpoint accepts (413); the connection is closed.
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge {
        /// The largest body read.
        limit: usize,
    },
    /// The request target (path and query) is too long (414).
    #[error("the request target is {length} bytes; at most {limit} are accepted")]
    UriTooLong {
        /// Its length.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// The gateway has no connection to spare (503); `/healthz` is still answered.
    #[error("{0}")]
    Overloaded(String),
    /// This gateway is a standby: only the leader takes changes (503 with `Retry-After` and,
    /// when known, the leader's address in `meridian-leader`).
    #[error("{}", crate::runtime::CallError::NotLeader { leader: leader.clone() })]
    NotLeader {
        /// The leader, when one is known.
        leader: Option<crate::runtime::LeaderAddrs>,
    },
    /// A rejection from the HTTP layer that has no variant of its own, kept with its status.
    #[error("{message}")]
    Rejected {
        /// The HTTP status it was answered with.
        status: StatusCode,
        /// What the layer said.
        message: String,
    },
}

impl From<LogsError> for ApiError {
    fn from(error: LogsError) -> Self {
        match error {
            LogsError::Call(call) => ApiError::from(call),
            LogsError::Member(_) => ApiError::Member(error.to_string()),
            LogsError::Timeout(_) => ApiError::MemberTimeout(error.to_string()),
        }
    }
}

impl From<crate::auth::Denied> for ApiError {
    fn from(denied: crate::auth::Denied) -> Self {
        ApiError::Forbidden { subject: denied.subject, action: denied.action, missing: denied.missing }
    }
}

impl From<crate::auth::Rejection> for ApiError {
    fn from(rejection: crate::auth::Rejection) -> Self {
        ApiError::Unauthenticated(rejection.to_string())
    }
}

/// Module result type.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

impl From<CallError> for ApiError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Stopped => ApiError::ShuttingDown,
            CallError::Core(core) => ApiError::Core(core),
            CallError::NotLeader { leader } => ApiError::NotLeader { leader },
        }
    }
}

/// HTTP status, error code and per-field errors of `error`; used by both APIs.
pub fn classify(error: &ApiError) -> (StatusCode, &'static str, Vec<FieldError>) {
    use meridian_core::Error as Core;
    match error {
        ApiError::InvalidSpec(e @ SpecError::TooLarge { .. }) => {
            (StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.field_errors())
        }
        ApiError::InvalidSpec(e) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_spec", e.field_errors()),
        ApiError::Core(Core::NeverFits { reasons }) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "never_fits",
            reasons
                .iter()
                .map(|(cluster, reason)| FieldError { field: format!("clusters.{cluster}"), reason: reason.clone() })
                .collect(),
        ),
        ApiError::Core(Core::ExceedsQuota { field, .. }) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "exceeds_quota",
            vec![FieldError { field: field.clone(), reason: error.to_string() }],
        ),
        ApiError::Core(Core::IdempotencyConflict { .. }) => (
            StatusCode::CONFLICT,
            "conflict",
            vec![FieldError { field: "idempotencyKey".into(), reason: error.to_string() }],
        ),
        ApiError::NotFound(_) | ApiError::Core(Core::NotFound(_)) => (StatusCode::NOT_FOUND, "not_found", Vec::new()),
        ApiError::BadRequest { field, reason } => {
            (StatusCode::BAD_REQUEST, "bad_request", vec![FieldError { field: field.clone(), reason: reason.clone() }])
        }
        ApiError::Core(Core::DuplicateAgent { .. }) => (StatusCode::CONFLICT, "conflict", Vec::new()),
        ApiError::Core(Core::NotStarted(_)) => (StatusCode::CONFLICT, "not_started", Vec::new()),
        ApiError::Core(Core::ClusterUnreachable { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Vec::new()),
        ApiError::Member(_) => (StatusCode::BAD_GATEWAY, "member_error", Vec::new()),
        ApiError::MemberTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, "member_timeout", Vec::new()),
        ApiError::Core(Core::Unavailable(_)) | ApiError::ShuttingDown => {
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Vec::new())
        }
        ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated", Vec::new()),
        ApiError::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden", Vec::new()),
        ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited", Vec::new()),
        ApiError::UnsupportedMediaType(_) => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            vec![FieldError { field: "Content-Type".into(), reason: error.to_string() }],
        ),
        ApiError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", Vec::new()),
        ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout", Vec::new()),
        ApiError::BodyTooLarge { .. } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            vec![FieldError { field: "body".into(), reason: error.to_string() }],
        ),
        ApiError::UriTooLong { .. } => (
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            vec![FieldError { field: "uri".into(), reason: error.to_string() }],
        ),
        ApiError::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Vec::new()),
        ApiError::NotLeader { leader: Some(_) } => (StatusCode::SERVICE_UNAVAILABLE, "not_leader", Vec::new()),
        ApiError::NotLeader { leader: None } => (StatusCode::SERVICE_UNAVAILABLE, "no_leader", Vec::new()),
        ApiError::Rejected { status, .. } => (*status, code_of(*status), Vec::new()),
    }
}

/// The error code answered with `status` when nothing more specific is known.
pub fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::URI_TOO_LONG => "uri_too_long",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_spec",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        status if status.is_client_error() => "bad_request",
        _ => "internal",
    }
}

/// The JSON error body.
pub fn http(error: &ApiError) -> Response {
    let (status, code, fields) = classify(error);
    let body = json!({"error": {"code": code, "message": error.to_string(), "fields": fields}});
    let mut response = (status, axum::Json(body)).into_response();
    if let ApiError::RateLimited { retry_after_secs, .. } = error {
        response
            .headers_mut()
            .insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(*retry_after_secs));
    }
    // A retry may succeed later: at the next leader, or once this gateway is back (a failed
    // commit's outcome is unknown, so a write is repeated with its idempotency key).
    if matches!(error, ApiError::ShuttingDown | ApiError::Core(meridian_core::Error::Unavailable(_))) {
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(1u64));
    }
    if let ApiError::NotLeader { leader } = error {
        let headers = response.headers_mut();
        headers.insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(1u64));
        if let Some(value) = leader.as_ref().and_then(|l| axum::http::HeaderValue::from_str(&l.rest).ok()) {
            headers.insert(LEADER_HEADER, value);
        }
    }
    if let ApiError::Unauthenticated(_) = error {
        response
            .headers_mut()
            .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    }
    response
}

/// The header (REST) and metadata key (gRPC) that name the leader's address on a standby's
/// refusal: its REST base URL on REST, its gRPC URL on gRPC.
pub const LEADER_HEADER: &str = "meridian-leader";

/// The gRPC status: the code that matches the HTTP status, with the same message.
pub fn grpc(error: &ApiError) -> Status {
    let message = error.to_string();
    if let ApiError::NotLeader { leader } = error {
        let mut status = Status::unavailable(message);
        if let Some(value) = leader.as_ref().and_then(|l| l.grpc.parse().ok()) {
            status.metadata_mut().insert(LEADER_HEADER, value);
        }
        return status;
    }
    match classify(error).0 {
        StatusCode::NOT_FOUND => Status::not_found(message),
        // Not a duplicate: the job is in the wrong state for the call.
        StatusCode::CONFLICT if matches!(error, ApiError::Core(meridian_core::Error::NotStarted(_))) => {
            Status::failed_precondition(message)
        }
        StatusCode::CONFLICT => Status::already_exists(message),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => Status::unavailable(message),
        StatusCode::GATEWAY_TIMEOUT | StatusCode::REQUEST_TIMEOUT => Status::deadline_exceeded(message),
        StatusCode::UNAUTHORIZED => Status::unauthenticated(message),
        StatusCode::FORBIDDEN => Status::permission_denied(message),
        StatusCode::TOO_MANY_REQUESTS => Status::resource_exhausted(message),
        StatusCode::UNPROCESSABLE_ENTITY if matches!(error, ApiError::Core(_)) => Status::failed_precondition(message),
        status if status.is_server_error() => Status::internal(message),
        _ => Status::invalid_argument(message),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        http(&self)
    }
}
