//! The backend calls the event loop runs as tasks, and what they send back to it.
//!
//! Each call is a `'static` future over `Arc`s, spawned into the loop's `JoinSet`; its result
//! comes back as a [`TaskOutput`]. Transient backend errors are retried inside the task with
//! backoff (a cancel must eventually happen), so the loop only ever sees final answers.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::inventory::{Inventory, QueuePressure};
use meridian_proto::protocol::{Assignment, StartQuote};

use crate::backend::{
    Admission, BackendError, BackendFuture, CopyAdmission, HeldJob, InventorySource, LocalBackend, LogChunk,
};
use crate::usage::{GpuSample, UsageError, UtilizationSource};

/// First and longest wait between retries of a transient backend error.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How long one `logs` call may take: a person is waiting for the answer.
const LOGS_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one start quote may take: the gateway's round never waits for it, but an answer
/// that comes later than this is stale.
const QUOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Start quotes worked out at once; more requests are answered "busy" at once, so a slow
/// scheduler (Slurm's `sbatch --test-only`) is never queued up behind.
pub(crate) const MAX_QUOTES_IN_FLIGHT: usize = 4;

/// The most output one logs answer carries (the gRPC stream's messages stay small).
pub(crate) const LOGS_MAX_BYTES: u32 = 256 * 1024;

/// How long one startup `list` may take before it counts as a transient failure: the agent does
/// not dial the gateway before it knows what the member holds, so a hung call must not wait
/// forever unnoticed.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// What a task hands back to the loop.
#[derive(Debug)]
pub(crate) enum TaskOutput {
    /// The startup `list`.
    Adopted(Result<Vec<HeldJob>, BackendError>),
    /// A `submit` (after cancelling the older binding it replaces, if any).
    Submitted {
        /// The job.
        job_id: String,
        /// The offer's binding.
        fencing_token: u64,
        /// The backend's answer.
        result: Result<Admission, BackendError>,
        /// Inventory and pressure right after a submit that took the job, to send before the
        /// acceptance.
        report: Option<Report>,
    },
    /// A `cancel`.
    Cancelled {
        /// The job.
        job_id: String,
        /// The binding stopped.
        fencing_token: u64,
        /// Whether it worked.
        result: Result<(), BackendError>,
    },
    /// Inventory and pressure for the gateway.
    Reported(Report),
    /// Part of a job's output, for the gateway's logs request `request_id`.
    Logs {
        /// The request answered.
        request_id: u64,
        /// The output, or why not, for people.
        result: Result<LogChunk, String>,
    },
    /// A start quote, for the gateway's quote request `request_id`.
    Quoted {
        /// The request answered.
        request_id: u64,
        /// When the gang could start, or why the member cannot say.
        result: Result<StartQuote, String>,
    },
    /// A round of GPU utilisation samples.
    Sampled(Result<Vec<GpuSample>, UsageError>),
    /// A sibling copy handed to the backend.
    Copied {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
        /// Whether the backend queued it.
        result: Result<CopyAdmission, BackendError>,
    },
    /// A sibling copy dropped in the backend.
    CopyDropped {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
        /// Whether it worked.
        result: Result<(), BackendError>,
    },
}

/// How a submit task starts the binding it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// An offer (or a grant of a copy that is not ready here): drop the job's copy `drop_copy`
    /// first when one is held, then submit.
    Submit {
        /// The copy of the job to drop before the submit.
        drop_copy: Option<u64>,
    },
    /// The grant of the ready copy `copy_token`: start on the nodes it holds.
    Grant {
        /// The copy granted.
        copy_token: u64,
    },
}

/// What a task was for, so a task that panicked can still be accounted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TaskLabel {
    /// The startup `list`.
    Adopt,
    /// A `submit` of this binding.
    Submit {
        /// The job.
        job_id: String,
        /// The binding.
        fencing_token: u64,
    },
    /// A `cancel` of this binding.
    Cancel {
        /// The job.
        job_id: String,
        /// The binding.
        fencing_token: u64,
    },
    /// An inventory and pressure report.
    Report,
    /// A logs request.
    Logs {
        /// The request.
        request_id: u64,
    },
    /// A start quote request.
    Quote {
        /// The request.
        request_id: u64,
    },
    /// A utilisation sample.
    Sample,
    /// A sibling copy handed to the backend.
    Copy {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
    },
    /// A sibling copy dropped in the backend.
    DropCopy {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
    },
}

/// Inventory and pressure as the source gave them.
#[derive(Debug)]
pub(crate) struct Report {
    /// Node shapes and free resources.
    pub(crate) inventory: Result<Inventory, BackendError>,
    /// Queue pressure.
    pub(crate) pressure: Result<QueuePressure, BackendError>,
}

/// Lists what the member holds, retrying transient errors.
pub(crate) async fn adopt(backend: Arc<dyn LocalBackend>) -> TaskOutput {
    let list = || -> BackendFuture<'_, Vec<HeldJob>> {
        Box::pin(async {
            match tokio::time::timeout(LIST_TIMEOUT, backend.list()).await {
                Ok(result) => result,
                Err(_) => Err(BackendError::transient(format!("no answer within {LIST_TIMEOUT:?}"))),
            }
        })
    };
    TaskOutput::Adopted(retrying("list the jobs the member holds", list).await)
}

/// Submits `assignment` as `start` says, first cancelling the older binding `replace` of the
/// same job.
pub(crate) async fn submit(
    backend: Arc<dyn LocalBackend>,
    inventory: Arc<dyn InventorySource>,
    assignment: Assignment,
    replace: Option<u64>,
    start: Start,
) -> TaskOutput {
    let (job_id, fencing_token) = (assignment.job_id.clone(), assignment.fencing_token);
    if let Some(old) = replace
        && let Err(e) = retrying("cancel the older binding", || backend.cancel(&job_id, old)).await
    {
        return TaskOutput::Submitted { job_id, fencing_token, result: Err(e), report: None };
    }
    if let Start::Submit { drop_copy: Some(copy_token) } = start
        && let Err(e) = retrying("drop the job's sibling copy", || backend.drop_copy(&job_id, copy_token)).await
    {
        return TaskOutput::Submitted { job_id, fencing_token, result: Err(e), report: None };
    }
    let result = match start {
        Start::Submit { .. } => backend.submit(&assignment).await,
        Start::Grant { copy_token } => backend.grant(copy_token, &assignment).await,
    };
    let report = match &result {
        Ok(Admission::Started { .. } | Admission::Queued { .. }) => Some(fetch_report(inventory.as_ref()).await),
        _ => None,
    };
    TaskOutput::Submitted { job_id, fencing_token, result, report }
}

/// Cancels one binding, retrying transient errors.
pub(crate) async fn cancel(backend: Arc<dyn LocalBackend>, job_id: String, fencing_token: u64) -> TaskOutput {
    let result = retrying("cancel a job", || backend.cancel(&job_id, fencing_token)).await;
    TaskOutput::Cancelled { job_id, fencing_token, result }
}

/// Hands the sibling copy `copy_token` of `assignment` to the backend; one try (a copy that
/// cannot be queued now is dropped, and the gateway may send another).
pub(crate) async fn copy(backend: Arc<dyn LocalBackend>, copy_token: u64, assignment: Assignment) -> TaskOutput {
    let result = backend.copy(copy_token, &assignment).await;
    TaskOutput::Copied { job_id: assignment.job_id, copy_token, result }
}

/// Drops a sibling copy in the backend, retrying transient errors (what it holds must be freed).
pub(crate) async fn drop_copy(backend: Arc<dyn LocalBackend>, job_id: String, copy_token: u64) -> TaskOutput {
    let result = retrying("drop a sibling copy", || backend.drop_copy(&job_id, copy_token)).await;
    TaskOutput::CopyDropped { job_id, copy_token, result }
}

/// Reads part of a binding's output; one try, bounded in time and size.
pub(crate) async fn logs(
    backend: Arc<dyn LocalBackend>,
    request_id: u64,
    job_id: String,
    fencing_token: u64,
    from: Option<u64>,
    max_bytes: u32,
) -> TaskOutput {
    let max_bytes = max_bytes.clamp(1, LOGS_MAX_BYTES) as usize;
    let result = match tokio::time::timeout(LOGS_TIMEOUT, backend.logs(&job_id, fencing_token, from, max_bytes)).await {
        Ok(Ok(chunk)) => Ok(chunk),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("the member's scheduler gave no output for job `{job_id}` within {LOGS_TIMEOUT:?}")),
    };
    TaskOutput::Logs { request_id, result }
}

/// Asks the backend for a start quote for `assignment`'s shape; one try, bounded in time.
pub(crate) async fn quote(backend: Arc<dyn LocalBackend>, request_id: u64, assignment: Assignment) -> TaskOutput {
    let result = match tokio::time::timeout(QUOTE_TIMEOUT, backend.quote(&assignment)).await {
        Ok(Ok(quote)) => Ok(quote),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("the member's scheduler gave no start quote within {QUOTE_TIMEOUT:?}")),
    };
    TaskOutput::Quoted { request_id, result }
}

/// Samples GPU utilisation on a blocking thread (the source reads a file or calls NVML).
pub(crate) async fn sample(source: Arc<dyn UtilizationSource>) -> TaskOutput {
    let result = tokio::task::spawn_blocking(move || source.sample())
        .await
        .unwrap_or_else(|e| Err(UsageError::Task(e.to_string())));
    TaskOutput::Sampled(result)
}

pub(crate) async fn report(inventory: Arc<dyn InventorySource>) -> TaskOutput {
    TaskOutput::Reported(fetch_report(inventory.as_ref()).await)
}

async fn fetch_report(source: &dyn InventorySource) -> Report {
    Report { inventory: source.inventory().await, pressure: source.pressure().await }
}

/// Calls `call` until it succeeds or fails permanently, waiting longer after each transient
/// failure.
async fn retrying<'a, T, F>(what: &str, mut call: F) -> Result<T, BackendError>
where
    F: FnMut() -> BackendFuture<'a, T>,
{
    let mut wait = RETRY_MIN;
    loop {
        match call().await {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, retry_in = ?wait, "backend could not {what}");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
            other => return other,
        }
    }
}
