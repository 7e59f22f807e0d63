//! Job identity and life-cycle states.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting in the federation queue for a cluster.
    Queued,
    /// Offered to a cluster's agent, not yet confirmed.
    Offered,
    /// Accepted by a cluster; its local scheduler is starting the gang.
    Bound,
    /// All replicas running.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error, or ran past its limit.
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// Its cluster stopped reporting; the gateway does not know what happens to it.
    Unknown,
}

impl JobState {
    /// Every state, in life-cycle order.
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Offered,
        JobState::Bound,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Unknown,
    ];

    /// Succeeded, Failed and Cancelled never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }

    /// The state's name as written in APIs (`Running`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "Queued",
            JobState::Offered => "Offered",
            JobState::Bound => "Bound",
            JobState::Running => "Running",
            JobState::Succeeded => "Succeeded",
            JobState::Failed => "Failed",
            JobState::Cancelled => "Cancelled",
            JobState::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state name that is not one of the eight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown job state `{0}`: expected one of Queued, Offered, Bound, Running, Succeeded, Failed, Cancelled, Unknown"
)]
pub struct UnknownState(pub String);

impl FromStr for JobState {
    type Err = UnknownState;
    /// Case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}
