//! The seam between the agent and a member cluster's local scheduler.
//!
//! Two traits, because the two jobs differ and real clusters split them:
//!
//! - [`LocalBackend`] runs jobs: [`submit`](LocalBackend::submit) answers with an [`Admission`]
//!   (started, queued locally with a reason, or refused), [`cancel`](LocalBackend::cancel) stops
//!   one binding, [`list`](LocalBackend::list) tells a restarted agent which jobs the member still
//!   holds (with their fencing tokens: Slurm keeps the token in the job comment, Kubernetes in an
//!   annotation), and everything that happens afterwards (a queued job starts, a job finishes)
//!   arrives as a [`JobEvent`] on the channel the backend was given when it was built.
//! - [`InventorySource`] says what the cluster looks like: node shapes with what is free, and
//!   queue pressure (NVML, Kubernetes nodes, Slurm nodes, or the builtin scheduler's own view).
//!
//! Both are async and object safe (methods return a boxed future), so the agent holds them as
//! `Arc<dyn …>` and runs every call as a task of its own: a scheduler that hangs never stops the
//! agent's heartbeats.
//!
//! [`BuiltinBackend`] implements both over the builtin gang + fair-share scheduler, with a
//! simulated runner or a [`process`] runner that runs commands on this host; [`nvml`] finds this
//! host's GPUs for it.

use std::future::Future;
use std::pin::Pin;

use meridian_proto::inventory::{BackendKind, Inventory, QueuePressure};
use meridian_proto::protocol::Assignment;
pub use meridian_proto::protocol::{LogChunk, StartQuote, TypeStart};
/// The local scheduler's answer to [`LocalBackend::submit`]: defined with the member's answer to
/// an offer, which the simulator's agents share.
pub use meridian_scheduler::offer::Admission;

/// Implements [`LocalBackend`] and [`InventorySource`] for `$backend`, whose every call is
/// answered by the method of its `shared` state named after the call with `_now`
/// (`submit_now`, `cancel_now`, `list_now`, `logs_now`, `quote_now`, `inventory_now`,
/// `pressure_now`): the
/// Slurm and Kubernetes backends, whose status loops hold the same state. One place for the
/// plumbing, so the two cannot drift apart. With a third argument `copies`, the sibling copy
/// calls go to `copy_now`, `drop_copy_now` and `grant_now` too, and `copy_events` takes the
/// backend's own `copy_events` receiver.
macro_rules! delegate_to_shared_state {
    (@copies) => {
        fn copy<'a>(
            &'a self,
            copy_token: u64,
            job: &'a ::meridian_proto::protocol::Assignment,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::CopyAdmission> {
            Box::pin(self.shared.copy_now(copy_token, job))
        }

        fn drop_copy<'a>(&'a self, job_id: &'a str, copy_token: u64) -> $crate::backend::BackendFuture<'a, ()> {
            Box::pin(self.shared.drop_copy_now(job_id, copy_token))
        }

        fn grant<'a>(
            &'a self,
            copy_token: u64,
            job: &'a ::meridian_proto::protocol::Assignment,
        ) -> $crate::backend::BackendFuture<'a, $crate::backend::Admission> {
            Box::pin(self.shared.grant_now(copy_token, job))
        }

        fn copy_events(&self) -> Option<$crate::backend::CopyEventReceiver> {
            self.copy_events.lock().unwrap_or_else(::std::sync::PoisonError::into_inner).take()
        }
    };
    ($backend:ty, $kind:expr $(, $copies:ident)?) => {
        impl $crate::backend::LocalBackend for $backend {
            fn kind(&self) -> ::meridian_proto::inventory::BackendKind {
                $kind
            }

            fn submit<'a>(
                &'a self,
                job: &'a ::meridian_proto::protocol::Assignment,
            ) -> $crate::backend::BackendFuture<'a, $crate::backend::Admission> {
                Box::pin(self.shared.submit_now(job))
            }

            fn cancel<'a>(&'a self, job_id: &'a str, fencing_token: u64) -> $crate::backend::BackendFuture<'a, ()> {
                Box::pin(self.shared.cancel_now(job_id, fencing_token))
            }

            fn list(&self) -> $crate::backend::BackendFuture<'_, Vec<$crate::backend::HeldJob>> {
                Box::pin(self.shared.list_now())
            }

            fn logs<'a>(
                &'a self,
                job_id: &'a str,
                fencing_token: u64,
                from: Option<u64>,
                max_bytes: usize,
            ) -> $crate::backend::BackendFuture<'a, $crate::backend::LogChunk> {
                let request = $crate::backend::logs::LogRequest { from, max_bytes };
                Box::pin(self.shared.logs_now(job_id, fencing_token, request))
            }

            fn quote<'a>(
                &'a self,
                job: &'a ::meridian_proto::protocol::Assignment,
            ) -> $crate::backend::BackendFuture<'a, $crate::backend::StartQuote> {
                Box::pin(self.shared.quote_now(job))
            }

            $($crate::backend::delegate_to_shared_state!(@$copies);)?
        }

        impl $crate::backend::InventorySource for $backend {
            fn inventory(&self) -> $crate::backend::BackendFuture<'_, ::meridian_proto::inventory::Inventory> {
                Box::pin(self.shared.inventory_now())
            }

            fn pressure(&self) -> $crate::backend::BackendFuture<'_, ::meridian_proto::inventory::QueuePressure> {
                Box::pin(self.shared.pressure_now())
            }
        }
    };
}
pub(crate) use delegate_to_shared_state;

mod builtin;
#[cfg(test)]
pub(crate) mod conformance;
pub mod copies;
pub mod kubernetes;
mod logs;
pub mod nvml;
pub mod process;
pub mod slurm;

pub use builtin::{BuiltinBackend, Runner};
pub use copies::{CopyAdmission, CopyEvent, CopyEventReceiver, CopyEventSender};
pub use kubernetes::KubernetesBackend;
pub use slurm::{SlurmBackend, SlurmConfig};

/// What a backend call returns: a boxed, sendable future, so the traits stay object safe without
/// extra crates.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// The sending half of a backend's job events. Unbounded because a backend must never block on
/// the agent (it may hold scheduler locks while it reports), and each job produces only a
/// handful of events in its life.
pub type JobEventSender = tokio::sync::mpsc::UnboundedSender<JobEvent>;

/// The receiving half of a backend's job events; the agent owns it.
pub type JobEventReceiver = tokio::sync::mpsc::UnboundedReceiver<JobEvent>;

/// Module result type.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// A member cluster's local scheduler as the agent drives it.
///
/// # Contract
///
/// - A job is identified by its id *and* fencing token: the same job may come back under a newer
///   token after the gateway re-placed it.
/// - [`submit`](Self::submit) is idempotent per (job, token): submitting a binding the backend
///   already holds answers with its current admission and starts nothing twice. While another
///   binding of the same job is held, the new one is [`Admission::Refused`] (not permanent); the
///   agent cancels the old binding first.
/// - [`cancel`](Self::cancel) stops exactly the named binding and is idempotent: cancelling a
///   binding that is not held (never was, already finished, another token) succeeds. A cancel
///   produces no [`JobEvent`]; the agent records the result itself.
/// - Events report what the return values of `submit` did not: a queued job's new reason or its
///   start (with nodes), and every job's end. They carry the binding's token.
pub trait LocalBackend: Send + Sync {
    /// Which scheduler this is.
    fn kind(&self) -> BackendKind;

    /// The agent's lease on the gateway's jobs changed: every job the gateway placed here must
    /// be stopped by `deadline` (which may be in the past: the lease expired); None: no lease,
    /// never stop on the agent's behalf. Backends that can enforce it outside the agent's
    /// process (the process runner's watchdog) do; the others ignore it.
    fn lease_changed(&self, deadline: Option<std::time::SystemTime>) {
        let _ = deadline;
    }

    /// Hands `job` to the local scheduler. It starts now, waits in a local queue, or is refused.
    fn submit<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, Admission>;

    /// Stops the copy of `job_id` held under `fencing_token`, running or queued.
    fn cancel<'a>(&'a self, job_id: &'a str, fencing_token: u64) -> BackendFuture<'a, ()>;

    /// Every binding the member holds (queued or running), and jobs that finished and whose
    /// result the member still keeps, so a restarted agent adopts them.
    fn list(&self) -> BackendFuture<'_, Vec<HeldJob>>;

    /// The devices each running job holds, by job id: (node, device ids) per replica, the ids
    /// as `CUDA_VISIBLE_DEVICES` takes them. Used to map GPU utilisation samples to jobs; a
    /// backend that does not name devices returns nothing (the default), and a job's GPUs are
    /// then every GPU of its nodes.
    fn devices(&self) -> std::collections::BTreeMap<String, Vec<(String, Vec<String>)>> {
        std::collections::BTreeMap::new()
    }

    /// When a gang shaped like `job` could start here, per GPU type the member has that the job
    /// accepts, from the local scheduler's own plan; nothing is submitted and nothing changes.
    /// `job.fencing_token` is 0: it is no binding. A backend that cannot plan answers
    /// [`BackendError::Permanent`] saying so (the default); the gateway then keeps its own
    /// estimate from the member's release profile. What each backend answers, and what it costs,
    /// is in `docs/backends.md#start-quotes`.
    fn quote<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, StartQuote> {
        let _ = job;
        Box::pin(std::future::ready(Err(BackendError::permanent(format!(
            "the {} backend gives no start quotes",
            backend_name(self.kind())
        )))))
    }

    /// Part of the output of the binding (`job_id`, `fencing_token`): at most `max_bytes` from
    /// byte `from` of everything it wrote, or its last `max_bytes` when `from` is None.
    ///
    /// A backend keeps a bounded tail of each job's output (what it keeps is its own
    /// business, say so in `docs/backends.md`); asking for bytes it no longer keeps answers
    /// from the oldest byte it has, with [`LogChunk::offset`] saying where that is. A binding
    /// it never held is a [`BackendError::Permanent`] naming the job.
    fn logs<'a>(
        &'a self,
        job_id: &'a str,
        fencing_token: u64,
        from: Option<u64>,
        max_bytes: usize,
    ) -> BackendFuture<'a, LogChunk> {
        let _ = (fencing_token, from, max_bytes);
        Box::pin(std::future::ready(Err(BackendError::permanent(format!(
            "job `{job_id}`: the {} backend keeps no job output",
            backend_name(self.kind())
        )))))
    }

    /// Queues a sibling copy of `job` (see [`copies`]): planned and started by the local
    /// scheduler like any pending job, except that nothing of it is launched until
    /// [`grant`](Self::grant), and the member never preempts for it. `job.fencing_token` is
    /// the job's current binding token, for logs only: a copy is no binding. A copy of a job
    /// the backend already holds under `copy_token` is not queued twice; one under another
    /// token is replaced. A backend without a start gate refuses it as unsupported (the
    /// default).
    fn copy<'a>(&'a self, copy_token: u64, job: &'a Assignment) -> BackendFuture<'a, CopyAdmission> {
        let _ = (copy_token, job);
        let reason = copies::unsupported_reason(backend_name(self.kind()));
        Box::pin(std::future::ready(Ok(CopyAdmission::Refused { reason, unsupported: true })))
    }

    /// Drops the copy `copy_token` of `job_id`, queued or ready, freeing whatever it holds.
    /// Idempotent: a copy not held (never was, another token) is no error.
    fn drop_copy<'a>(&'a self, job_id: &'a str, copy_token: u64) -> BackendFuture<'a, ()> {
        let _ = (job_id, copy_token);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Starts the binding `job` on the nodes its ready copy `copy_token` holds: the gateway
    /// granted the copy the job's start lock. Answers as [`submit`](Self::submit) does; when
    /// the copy is not held or not ready, it *is* a submit of `job` (after dropping any copy of
    /// the job). The default, for backends that hold no copies, submits.
    fn grant<'a>(&'a self, copy_token: u64, job: &'a Assignment) -> BackendFuture<'a, Admission> {
        let _ = copy_token;
        self.submit(job)
    }

    /// Hands over the receiving end of the backend's [`CopyEvent`]s, once (later calls get
    /// None); None from a backend that holds no copies (the default).
    fn copy_events(&self) -> Option<CopyEventReceiver> {
        None
    }
}

/// FNV-1a of `text`: a hash that is the same on every agent build, for names and ports derived
/// from job ids (Kubernetes object names, Slurm coordinator ports).
pub(crate) fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, b| (hash ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// The name of a backend kind in messages and configs.
pub fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Builtin => "builtin",
        BackendKind::Slurm => "slurm",
        BackendKind::Kubernetes => "kubernetes",
    }
}

/// Where a cluster's node shapes, free resources and queue load come from.
///
/// After a [`LocalBackend::submit`] or [`LocalBackend::cancel`] has returned, the next answer
/// must already reflect it: the agent reports inventory before it accepts an offer, so the
/// gateway never places into GPUs that are already taken.
pub trait InventorySource: Send + Sync {
    /// Node shapes and what is free on each node.
    fn inventory(&self) -> BackendFuture<'_, Inventory>;

    /// Local queue load and expected GPU releases, in job time.
    fn pressure(&self) -> BackendFuture<'_, QueuePressure>;
}

/// A binding the member holds, as [`LocalBackend::list`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldJob {
    /// The job.
    pub job_id: String,
    /// The binding it runs under.
    pub fencing_token: u64,
    /// Where it is.
    pub phase: JobPhase,
}

/// Something that happened to a binding after `submit` returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvent {
    /// The job.
    pub job_id: String,
    /// The binding it happened to.
    pub fencing_token: u64,
    /// What it is now.
    pub phase: JobPhase,
}

/// Where a job is on the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    /// Waiting in a local queue.
    Pending {
        /// Why it waits.
        reason: String,
    },
    /// The whole gang runs.
    Running {
        /// Node of each replica.
        nodes: Vec<String>,
    },
    /// Finished well.
    Succeeded {
        /// A short note (`completed after 12.0s`).
        message: String,
    },
    /// Finished badly, by the job's own doing (exit code, runtime limit).
    Failed {
        /// Why.
        message: String,
    },
    /// Stopped by the member's scheduler to make room for higher-priority work (builtin
    /// preemption, Slurm `PREEMPTED`, a Kubernetes preemption eviction): no fault of the job,
    /// which the gateway queues again.
    Preempted {
        /// Who preempted it and how, for people.
        message: String,
    },
}

impl JobPhase {
    /// Succeeded, failed or preempted: nothing more will happen to the binding.
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobPhase::Succeeded { .. } | JobPhase::Failed { .. } | JobPhase::Preempted { .. })
    }
}

/// Why a backend call failed (as opposed to the scheduler saying no, which is an [`Admission`]).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Worth retrying: the scheduler was unreachable, busy or timed out.
    #[error("{message} (transient; will retry)")]
    Transient {
        /// What failed, for people.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Retrying will not help: bad credentials, a misconfigured scheduler, a bug.
    #[error("{message}")]
    Permanent {
        /// What failed and what to do about it, for people.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl BackendError {
    /// A transient failure described by `message`.
    pub fn transient(message: impl Into<String>) -> Self {
        BackendError::Transient { message: message.into(), source: None }
    }

    /// A permanent failure described by `message`.
    pub fn permanent(message: impl Into<String>) -> Self {
        BackendError::Permanent { message: message.into(), source: None }
    }

    /// Whether the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, BackendError::Transient { .. })
    }
}
