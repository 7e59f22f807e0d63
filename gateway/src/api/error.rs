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
    if let ApiError::Unauthenticated(_) = error {
        response
            .headers_mut()
            .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    }
    response
}

/// The gRPC status: the code that matches the HTTP status, with the same message.
pub fn grpc(error: &ApiError) -> Status {
    let message = error.to_string();
    match classify(error).0 {
        StatusCode::NOT_FOUND => Status::not_found(message),
        // Not a duplicate: the job is in the wrong state for the call.
        StatusCode::CONFLICT if matches!(error, ApiError::Core(meridian_core::Error::NotStarted(_))) => {
            Status::failed_precondition(message)
        }
        StatusCode::CONFLICT => Status::already_exists(message),
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => Status::unavailable(message),
        StatusCode::GATEWAY_TIMEOUT => Status::deadline_exceeded(message),
        StatusCode::UNAUTHORIZED => Status::unauthenticated(message),
        StatusCode::FORBIDDEN => Status::permission_denied(message),
        StatusCode::TOO_MANY_REQUESTS => Status::resource_exhausted(message),
        StatusCode::UNPROCESSABLE_ENTITY if matches!(error, ApiError::Core(_)) => Status::failed_precondition(message),
        _ => Status::invalid_argument(message),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        http(&self)
    }
}
