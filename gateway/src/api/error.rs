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
    }
}

/// The JSON error body.
pub fn http(error: &ApiError) -> Response {
    let (status, code, fields) = classify(error);
    let body = json!({"error": {"code": code, "message": error.to_string(), "fields": fields}});
    (status, axum::Json(body)).into_response()
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
        StatusCode::UNPROCESSABLE_ENTITY if matches!(error, ApiError::Core(_)) => Status::failed_precondition(message),
        _ => Status::invalid_argument(message),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        http(&self)
    }
}
