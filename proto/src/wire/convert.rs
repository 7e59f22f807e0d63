//! Conversions between wire (`pb`) and domain types, done once at the edge.
//!
//! Domain → wire is infallible (`From<&Domain> for pb::Message`). Wire → domain is `TryFrom`:
//! it checks what the wire format cannot express (a required message that is absent, a required
//! string that is empty, an enum number this build does not know, a report that contradicts
//! itself) and returns a [`ConvertError`] naming the field. It does **not** repeat the job-spec
//! rules of [`validate`]: [`spec_from_wire`] converts and then validates.
//!
//! Field paths in errors:
//! - job specs use the user-facing names of the spec (`gang.resources`, `data[1].uri`), the same
//!   paths [`validate`] reports, so a user sees one vocabulary whatever API they used;
//! - agent reports use the message and its protobuf field names (`hello.prices[2].usd_per_gpu_hour`,
//!   `inventory.shapes[0].free[3].gpus`, `pressure.queues[1].weight`), which is what the author of
//!   an agent sees in `meridian.proto`.
//!
//! Mappings that are not one-to-one:
//! - durations travel as whole seconds; sub-second parts of a domain duration are dropped (floor,
//!   which keeps `limit >= estimate` true and matches the whole seconds [`validate`] checks);
//! - `runtime.limit` None ↔ `limit_seconds == 0`, `runtime.deadline` None ↔ `deadline_seconds == 0`,
//!   `idempotencyKey` None ↔ `""`, `payload.image` None ↔ `""`;
//! - `placement.burst` Never ↔ `never: true` (the other fields are then ignored);
//! - an absent `runtime`, `placement` or `placement.burst` message takes the same defaults as a
//!   spec that leaves the field out; scalar fields have no such defaults on the wire (proto3 cannot
//!   tell `0` from "not sent"), so `priority: 0` stays 0 and `replicas: 0` is refused by validation.

use super::pb;
use crate::gpu::GpuCatalog;
use crate::inventory::{BackendKind, Tier};
use crate::job::JobState;
use crate::spec::JobSpec;
use crate::validate::{self, SpecError};

/// Why a wire message could not become a domain value. Every variant names the field path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    /// A required message is absent or a required string is empty or blank (proto3 sends an
    /// absent and an empty value the same way: as nothing).
    #[error("{0}: is required but absent or empty")]
    MissingField(String),
    /// An enum field holds 0 (`*_UNSPECIFIED`) where a value is required, or a number this build
    /// does not know (a newer peer).
    #[error("{field}: {value} is not a valid value; expected one of {expected}")]
    InvalidEnum {
        /// Path of the enum field.
        field: String,
        /// The number received.
        value: i32,
        /// The accepted names, for the message.
        expected: &'static str,
    },
    /// A list that is keyed by name holds the same name twice, so it is ambiguous.
    #[error("{field}: `{key}` is listed more than once")]
    Duplicate {
        /// Path of the list.
        field: String,
        /// The repeated name.
        key: String,
    },
    /// A number is NaN, infinite or outside the range its meaning allows.
    #[error("{field}: {value} is out of range; must be {expected}")]
    OutOfRange {
        /// Path of the number.
        field: String,
        /// The number received.
        value: f64,
        /// The accepted range, in words.
        expected: &'static str,
    },
    /// A string field holds a name this build does not know (a newer peer, or a typo).
    #[error("{field}: `{value}` is not a valid value; expected one of {expected}")]
    InvalidName {
        /// Path of the field.
        field: String,
        /// The text received.
        value: String,
        /// The accepted names, for the message.
        expected: &'static str,
    },
    /// A node reports more of a resource free than every node of its shape has.
    #[error("{field}: {free} free is more than the {capacity} per node the shape declares")]
    FreeExceedsCapacity {
        /// Path of the free count (`inventory.shapes[0].free[3].gpus`).
        field: String,
        /// What the node reports free.
        free: u32,
        /// What the shape declares per node.
        capacity: u32,
    },
    /// A reported label (cluster or node shape) breaks the label rules or uses the reserved
    /// `meridian.io/` prefix.
    #[error("{field}: {reason}")]
    InvalidLabel {
        /// Path of the label (`inventory.shapes[0].labels.gpu-fabric`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The job spec converted, but breaks the spec rules; the source lists every field error.
    #[error("invalid job spec: {0}")]
    InvalidSpec(#[from] SpecError),
}

/// Result of a conversion.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

const JOB_STATES: &str = "JOB_STATE_QUEUED, JOB_STATE_OFFERED, JOB_STATE_BOUND, JOB_STATE_RUNNING, \
                          JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED, JOB_STATE_UNKNOWN";
const TIERS: &str = "TIER_OWNED, TIER_CLOUD";
const BACKENDS: &str = "BACKEND_KIND_BUILTIN, BACKEND_KIND_SLURM, BACKEND_KIND_KUBERNETES";

/// Converts a wire job spec and validates it with [`validate::validate`]: the one call an edge
/// needs to turn a received `pb::JobSpec` (an `Offer`, a stored `Job`) into a usable [`JobSpec`].
pub fn spec_from_wire(wire: pb::JobSpec, catalog: &GpuCatalog) -> Result<JobSpec> {
    let spec = JobSpec::try_from(wire)?;
    validate::validate(&spec, catalog)?;
    Ok(spec)
}

/// Reads a `JobState` enum field (`pb::Job.state`, `pb::JobStatus.state`); `field` is its path
/// for the error. 0 (`JOB_STATE_UNSPECIFIED`) is refused.
pub fn job_state_from_wire(field: &str, value: i32) -> Result<JobState> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: JOB_STATES };
    Ok(match pb::JobState::try_from(value).map_err(|_| invalid())? {
        pb::JobState::Unspecified => return Err(invalid()),
        pb::JobState::Queued => JobState::Queued,
        pb::JobState::Offered => JobState::Offered,
        pb::JobState::Bound => JobState::Bound,
        pb::JobState::Running => JobState::Running,
        pb::JobState::Succeeded => JobState::Succeeded,
        pb::JobState::Failed => JobState::Failed,
        pb::JobState::Cancelled => JobState::Cancelled,
        pb::JobState::Unknown => JobState::Unknown,
    })
}

/// Reads a `Tier` enum field; `field` is its path for the error. 0 (`TIER_UNSPECIFIED`) is refused.
pub fn tier_from_wire(field: &str, value: i32) -> Result<Tier> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: TIERS };
    match pb::Tier::try_from(value).map_err(|_| invalid())? {
        pb::Tier::Unspecified => Err(invalid()),
        pb::Tier::Owned => Ok(Tier::Owned),
        pb::Tier::Cloud => Ok(Tier::Cloud),
    }
}

/// Reads a `BackendKind` enum field; `field` is its path for the error. 0
/// (`BACKEND_KIND_UNSPECIFIED`) is refused.
pub fn backend_from_wire(field: &str, value: i32) -> Result<BackendKind> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: BACKENDS };
    match pb::BackendKind::try_from(value).map_err(|_| invalid())? {
        pb::BackendKind::Unspecified => Err(invalid()),
        pb::BackendKind::Builtin => Ok(BackendKind::Builtin),
        pb::BackendKind::Slurm => Ok(BackendKind::Slurm),
        pb::BackendKind::Kubernetes => Ok(BackendKind::Kubernetes),
    }
}

// ---------------------------------------------------------------- enums

impl From<JobState> for pb::JobState {
    fn from(state: JobState) -> Self {
        match state {
            JobState::Queued => pb::JobState::Queued,
            JobState::Offered => pb::JobState::Offered,
            JobState::Bound => pb::JobState::Bound,
            JobState::Running => pb::JobState::Running,
            JobState::Succeeded => pb::JobState::Succeeded,
            JobState::Failed => pb::JobState::Failed,
            JobState::Cancelled => pb::JobState::Cancelled,
            JobState::Unknown => pb::JobState::Unknown,
        }
    }
}

impl TryFrom<pb::JobState> for JobState {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `state`).
    fn try_from(state: pb::JobState) -> Result<Self> {
        job_state_from_wire("state", state.into())
    }
}

impl From<Tier> for pb::Tier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Owned => pb::Tier::Owned,
            Tier::Cloud => pb::Tier::Cloud,
        }
    }
}

impl TryFrom<pb::Tier> for Tier {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `tier`).
    fn try_from(tier: pb::Tier) -> Result<Self> {
        tier_from_wire("tier", tier.into())
    }
}

impl From<BackendKind> for pb::BackendKind {
    fn from(backend: BackendKind) -> Self {
        match backend {
            BackendKind::Builtin => pb::BackendKind::Builtin,
            BackendKind::Slurm => pb::BackendKind::Slurm,
            BackendKind::Kubernetes => pb::BackendKind::Kubernetes,
        }
    }
}

impl TryFrom<pb::BackendKind> for BackendKind {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `backend`).
    fn try_from(backend: pb::BackendKind) -> Result<Self> {
        backend_from_wire("backend", backend.into())
    }
}

// ---------------------------------------------------------------- helpers

fn missing(field: &str) -> ConvertError {
    ConvertError::MissingField(field.to_string())
}

/// `value` itself, or `MissingField` when it is empty or only whitespace.
fn required(value: String, field: impl FnOnce() -> String) -> Result<String> {
    if value.trim().is_empty() { Err(ConvertError::MissingField(field())) } else { Ok(value) }
}

fn non_empty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

mod cluster;
mod job_spec;
#[cfg(test)]
mod tests;
