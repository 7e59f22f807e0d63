//! [`ApiError`] and the one place that maps it to HTTP statuses and gRPC codes, so the same
//! failure looks the same on every API.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use meridian_proto::validate::{FieldError, SpecError};
use serde_json::json;
use tonic::Status;

use crate::runtime::CallError;

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The spec is malformed or invalid; names every field at fault.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// No known cluster could ever run the job, whatever it waits for.
    #[error("no cluster could ever run this job: {}", .reasons.iter().map(|(c, r)| format!("{c}: {r}")).collect::<Vec<_>>().join("; "))]
    NeverFits {
        /// Per cluster, why not.
        reasons: Vec<(String, String)>,
    },
    /// The idempotency key was used before for a different spec.
    #[error("idempotencyKey `{key}` was already used by job {existing} with a different spec")]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The job that holds it.
        existing: String,
    },
    /// No job with that id.
    #[error("no job `{0}`")]
    NotFound(String),
    /// A request parameter is wrong.
    #[error("{field}: {reason}")]
    BadRequest {
        /// The parameter.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Another live agent holds the cluster's name.
    #[error("{0}")]
    DuplicateAgent(String),
    /// The gateway cannot take changes now (its store failed, or it is shutting down). The
    /// message is for clients: it names no server paths.
    #[error("{0}")]
    Unavailable(String),
}

/// Module result type.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

impl From<CallError> for ApiError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Stopped => ApiError::Unavailable("the gateway is shutting down; retry shortly".into()),
            CallError::Core(core) => core.into(),
        }
    }
}

impl From<meridian_core::Error> for ApiError {
    fn from(error: meridian_core::Error) -> Self {
        use meridian_core::Error as E;
        match error {
            E::NeverFits { reasons } => ApiError::NeverFits { reasons },
            E::IdempotencyConflict { key, existing } => ApiError::IdempotencyConflict { key, existing },
            E::NotFound(id) => ApiError::NotFound(id),
            e @ E::DuplicateAgent { .. } => ApiError::DuplicateAgent(e.to_string()),
            E::Unavailable(message) => ApiError::Unavailable(message),
        }
    }
}

/// HTTP status, error code and per-field errors of `error`; used by both APIs.
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
                .map(|(cluster, reason)| FieldError { field: format!("clusters.{cluster}"), reason: reason.clone() })
                .collect(),
        ),
        ApiError::IdempotencyConflict { .. } => (
            StatusCode::CONFLICT,
            "conflict",
            vec![FieldError { field: "idempotencyKey".into(), reason: error.to_string() }],
        ),
        ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", Vec::new()),
        ApiError::BadRequest { field, reason } => {
            (StatusCode::BAD_REQUEST, "bad_request", vec![FieldError { field: field.clone(), reason: reason.clone() }])
        }
        ApiError::DuplicateAgent(_) => (StatusCode::CONFLICT, "conflict", Vec::new()),
        ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", Vec::new()),
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
    let message = error.to_string();
    match error {
        ApiError::NotFound(_) => Status::not_found(message),
        ApiError::IdempotencyConflict { .. } | ApiError::DuplicateAgent(_) => Status::already_exists(message),
        ApiError::Unavailable(_) => Status::unavailable(message),
        ApiError::NeverFits { .. } => Status::failed_precondition(message),
        ApiError::InvalidSpec(_) | ApiError::BadRequest { .. } => Status::invalid_argument(message),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        http(&self)
    }
}
