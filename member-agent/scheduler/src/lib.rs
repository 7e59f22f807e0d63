//! Meridian's builtin local scheduler: gang placement plus weighted fair share between queues,
//! over the nodes declared in the agent's config.
//!
//! The scheduler is a pure, deterministic state machine. It does no I/O, spawns nothing and never
//! reads a clock: every call that depends on time takes `now`, a [`Duration`] since an epoch the
//! caller picks (monotonic). That is what lets the agent drive it with real time and the simulator
//! drive the very same code in virtual time.
//!
//! Policy, in short (details on [`BuiltinScheduler`]):
//! - **Gang, all or nothing.** A job starts only when every replica has a node; a replica never
//!   spans nodes. Nodes are chosen best fit, fewest nodes (`gang.rs`).
//! - **Weighted dominant resource fairness between queues** (`fairshare.rs`): the queue whose
//!   dominant share divided by its weight is smallest goes first.
//! - **Order inside a queue**: priority (higher first), then submit time, then job id. What a job
//!   that cannot start now does to the jobs behind it is the queue's [`QueuePolicy`]: `strict`
//!   (it blocks them), `bestEffort` (they may start in its place) or `backfill` (the default: EASY
//!   backfill, they may start if they do not delay the member's one reservation; `pass.rs` and
//!   `reservation.rs`).
//! - **Preemption** (`preempt.rs`): a queue head that cannot start may stop running preemptible
//!   jobs of strictly lower priority after a grace period, under the member's [`PreemptionPolicy`].

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_proto::gpu;
use meridian_proto::selector::Selector;
use meridian_proto::spec::JobSpec;

mod fairshare;
mod gang;
pub mod offer;
mod pass;
mod preempt;
mod quote;
mod releases;
mod remaining;
mod report;
mod reservation;
mod scheduler;

#[cfg(test)]
mod preempt_proptests;
#[cfg(test)]
mod proptests;
#[cfg(any(test, feature = "testing"))]
pub mod testkit;

pub use preempt::{Preemption, PreemptionPolicy, PreemptionStops};
pub use quote::QUOTE_BASIS;
pub use remaining::{OVERDUE_FLOOR, OVERDUE_RUN_ON_FRACTION};
pub use report::MAX_RELEASE_BUCKETS;
pub use scheduler::BuiltinScheduler;

/// Module-local result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A node the builtin backend manages, as declared in the agent's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Unique node name; placements name nodes by it.
    pub name: String,
    /// Shape name (`dgx-h100`); nodes of one shape must be identical.
    pub shape: String,
    /// GPU type of the node's GPUs (`h100`).
    pub gpu_type: String,
    /// Memory per GPU in GiB.
    pub gpu_memory_gib: u32,
    /// GPUs of the node (at least 1).
    pub gpus: u32,
    /// CPU cores of the node.
    pub cpu: u32,
    /// Host memory of the node in GiB.
    pub memory_gib: u32,
    /// Labels of the node (`gpu-fabric: ib`), matched by a job's `placement.nodeSelector` and
    /// reported with its shape; nodes of one shape must have the same labels.
    pub labels: BTreeMap<String, String>,
}

/// A local queue: its fair-share weight and what a job that cannot start does to those behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    /// Unique queue name; [`BuiltinScheduler::queue_for`] maps tenants to queues by it.
    pub name: String,
    /// Relative weight (finite, > 0): a queue of weight 2 is entitled to twice the share of a
    /// queue of weight 1 when both have work.
    pub weight: f64,
    /// How the queue treats a job that cannot start now.
    pub policy: QueuePolicy,
}

impl QueueSpec {
    /// A queue of `weight` with the default policy ([`QueuePolicy::Backfill`]).
    pub fn new(name: impl Into<String>, weight: f64) -> Self {
        Self { name: name.into(), weight, policy: QueuePolicy::default() }
    }
}

/// How a queue treats a pending job that cannot start now (named as in the agent config).
///
/// Every decision uses a job's `run_for`, the member's estimate of its run time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QueuePolicy {
    /// Strict FIFO: the first job that cannot start blocks every job behind it in its queue
    /// (other queues go on). Never takes the member's reservation.
    Strict,
    /// Kueue's `BestEffortFIFO`: a job that cannot start is passed over and later jobs of the
    /// queue may start in its place; nothing is reserved for it.
    BestEffort,
    /// EASY backfill (Slurm's backfill plugin, Volcano's backfill action): like `bestEffort`, but
    /// the first job that cannot start, in the order the pass visits jobs, holds the member's one
    /// reservation at its earliest start time on specific nodes, and no later start may delay it.
    #[default]
    Backfill,
}

impl QueuePolicy {
    /// Every policy, in documentation order.
    pub const ALL: [QueuePolicy; 3] = [QueuePolicy::Strict, QueuePolicy::BestEffort, QueuePolicy::Backfill];

    /// The policy's name as written in configs and on the command line (`bestEffort`).
    pub fn name(self) -> &'static str {
        match self {
            QueuePolicy::Strict => "strict",
            QueuePolicy::BestEffort => "bestEffort",
            QueuePolicy::Backfill => "backfill",
        }
    }
}

impl std::fmt::Display for QueuePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QueuePolicy {
    type Err = String;

    /// Parses a policy name as [`QueuePolicy::name`] writes it; the error lists the names.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|p| p.name()).collect();
            format!("unknown queue policy `{s}`; use one of {}", names.join(", "))
        })
    }
}

/// The member's reservation, as shown by [`BuiltinScheduler::reservation`]: the job that holds it
/// and where and when it is expected to start if running jobs end at their estimates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The pending job holding the reservation.
    pub job_id: String,
    /// Its earliest start time, from the running jobs' estimated ends.
    pub starts_at: Duration,
    /// One node name per replica of its planned placement at `starts_at`.
    pub nodes: Vec<String>,
}

/// A job as the builtin scheduler sees it: one gang of identical replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalJob {
    /// Unique job id (the gateway's id).
    pub id: String,
    /// Queue the job waits in and whose share it counts against.
    pub queue: String,
    /// Higher runs first within its queue.
    pub priority: u32,
    /// Number of replicas (at least 1); each lands on one node.
    pub replicas: u32,
    /// GPUs per replica (at least 1).
    pub gpus: u32,
    /// CPU cores per replica.
    pub cpu: u32,
    /// Host memory per replica in GiB.
    pub memory_gib: u32,
    /// Acceptable GPU types; empty means any.
    pub gpu_types: Vec<String>,
    /// Minimum memory per GPU in GiB; 0 means any.
    pub gpu_memory_gib: u32,
    /// Only nodes whose labels match may hold a replica (the spec's `placement.nodeSelector`);
    /// empty matches every node.
    pub node_selector: Selector,
    /// How long the member believes the job runs once started: the spec's runtime estimate (cut
    /// at its limit). Everything the scheduler decides or reports (releases, waits, reservations
    /// and backfill) uses this.
    pub run_for: Duration,
    /// How long the job really runs once started, when that differs from the estimate: set only
    /// by the simulator, which knows the truth; `None` means exactly `run_for` (the builtin
    /// backend's simulated runs). Only completion ([`BuiltinScheduler::complete_due`],
    /// [`BuiltinScheduler::next_completion`]) reads it, never a decision or a report.
    pub actual: Option<Duration>,
    /// The spec's `preemptible`: a job of strictly higher priority may preempt it.
    pub preemptible: bool,
    /// When it was last preempted, on the scheduler's clock (the gateway tells the member);
    /// it is not preempted again within the policy's minimum interval of this.
    pub last_preempted_at: Option<Duration>,
}

/// A job the scheduler has just started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The job's id.
    pub job_id: String,
    /// One node name per replica, in replica order; a name repeats when replicas share a node.
    pub nodes: Vec<String>,
    /// When the member expects the job to end (`now + run_for`, by estimate).
    pub ends_at: Duration,
    /// When the job really completes (`now + actual`); equals `ends_at` unless the simulator
    /// set [`LocalJob::actual`]. Only the caller that set it may read it.
    pub completes_at: Duration,
}

/// A job waiting in a queue, as shown by [`BuiltinScheduler::pending`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    /// The job.
    pub job: LocalJob,
    /// When it was submitted; orders jobs of equal priority.
    pub submitted_at: Duration,
}

/// A job holding nodes, as shown by [`BuiltinScheduler::running`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    /// The job.
    pub job: LocalJob,
    /// One node name per replica.
    pub nodes: Vec<String>,
    /// When it started.
    pub started_at: Duration,
    /// When the member expects it to end (`started_at + run_for`, by estimate); past this the
    /// job is overdue (see [`RunningJob::expected_remaining`]).
    pub ends_at: Duration,
    /// When it really completes (see [`Started::completes_at`]); never reported.
    pub completes_at: Duration,
}

/// What [`BuiltinScheduler::cancel`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was waiting; it left its queue.
    WasPending,
    /// The job was running; its nodes are free again.
    WasRunning,
    /// No pending or running job has this id (it may have completed already).
    NotFound,
}

/// Why the builtin scheduler refused a config or a job.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The config declares no node, so nothing could ever run.
    #[error("builtin backend: no nodes declared; add at least one node to the agent config")]
    NoNodes,
    /// Two nodes share a name, so placements would be ambiguous.
    #[error("builtin backend: node `{name}` is declared twice; node names must be unique")]
    DuplicateNode {
        /// The repeated name.
        name: String,
    },
    /// A node declares zero GPUs; the builtin backend only runs GPU jobs.
    #[error("builtin backend: node `{name}` declares 0 GPUs; declare its GPUs or leave it out")]
    NodeWithoutGpus {
        /// The node.
        name: String,
    },
    /// A node differs from the first node of its shape (hardware or labels); a shape must
    /// describe identical nodes because the inventory reports one description per shape.
    #[error(
        "builtin backend: node `{node}` differs from earlier nodes of shape `{shape}` (hardware or labels); give it its own shape"
    )]
    InconsistentShape {
        /// The shape.
        shape: String,
        /// The node that differs.
        node: String,
    },
    /// The config declares no queue, so no job has anywhere to wait.
    #[error("builtin backend: no queues declared; add at least one queue (e.g. `default`)")]
    NoQueues,
    /// Two queues share a name.
    #[error("builtin backend: queue `{name}` is declared twice; queue names must be unique")]
    DuplicateQueue {
        /// The repeated name.
        name: String,
    },
    /// A queue weight is zero, negative, NaN or infinite, which makes shares meaningless.
    #[error("builtin backend: queue `{queue}` has weight {weight}; weights must be finite and > 0")]
    InvalidWeight {
        /// The queue.
        queue: String,
        /// The weight given.
        weight: f64,
    },
    /// A job names a queue that does not exist.
    #[error("job `{job_id}`: unknown queue `{queue}`")]
    UnknownQueue {
        /// The job.
        job_id: String,
        /// The queue it named.
        queue: String,
    },
    /// A job with this id is already pending or running.
    #[error("job `{job_id}` is already pending or running")]
    DuplicateJob {
        /// The job.
        job_id: String,
    },
    /// A job asks for something meaningless (zero replicas or zero GPUs per replica).
    #[error("job `{job_id}`: {reason}")]
    InvalidJob {
        /// The job.
        job_id: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The job could not start even on a completely empty cluster (no node matches its
    /// nodeSelector, GPU type, GPU memory, or a gang bigger than the nodes), so queueing it would
    /// wait forever.
    #[error("job `{job_id}` can never fit this cluster's nodes, even when all are free: {reason}")]
    NeverFits {
        /// The job.
        job_id: String,
        /// Which rule no node meets, naming the selector or the GPU request.
        reason: String,
    },
    /// [`BuiltinScheduler::start_now`]: the whole gang does not fit on the free nodes now.
    #[error("job `{job_id}` does not fit on the free nodes now")]
    DoesNotFitNow {
        /// The job.
        job_id: String,
    },
    /// [`BuiltinScheduler::start_now`]: starting the job would overtake a pending job of equal or
    /// higher priority in the same queue.
    #[error("job `{job_id}` would overtake pending job `{ahead}` in queue `{queue}`")]
    WouldOvertake {
        /// The job.
        job_id: String,
        /// Its queue.
        queue: String,
        /// The pending job it would overtake (the queue's head).
        ahead: String,
    },
}

impl LocalJob {
    /// Builds the local view of a submitted job spec; `queue` usually comes from
    /// [`BuiltinScheduler::queue_for`] with the spec's tenant.
    pub fn from_spec(id: impl Into<String>, spec: &JobSpec, queue: impl Into<String>, run_for: Duration) -> Self {
        let resources = &spec.gang.resources;
        Self {
            id: id.into(),
            queue: queue.into(),
            priority: spec.priority,
            replicas: spec.gang.replicas,
            gpus: resources.gpus,
            cpu: resources.cpu,
            memory_gib: resources.memory_gib,
            gpu_types: resources.gpu_types.clone(),
            gpu_memory_gib: resources.gpu_memory_gib,
            node_selector: spec.placement.node_selector().clone(),
            run_for,
            actual: None,
            preemptible: spec.preemptible,
            last_preempted_at: None,
        }
    }

    /// How long the job really runs once started: [`actual`](Self::actual), else `run_for`.
    pub fn true_run_time(&self) -> Duration {
        self.actual.unwrap_or(self.run_for)
    }

    /// GPUs of the whole gang, widened so large gangs cannot overflow.
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.gpus)
    }

    /// Whether a node of `gpu_type` with `gpu_memory_gib` per GPU is acceptable to this job. A
    /// job that lists no GPU types takes whole GPUs only, never slices (`a100-80g.1g.10gb`); a
    /// slice is used only by a job that names it.
    pub fn accepts_gpu(&self, gpu_type: &str, gpu_memory_gib: u32) -> bool {
        let type_ok = if self.gpu_types.is_empty() {
            !gpu::is_slice(gpu_type)
        } else {
            self.gpu_types.iter().any(|t| t == gpu_type)
        };
        type_ok && gpu_memory_gib >= self.gpu_memory_gib
    }

    /// Whether a node with `labels` may hold a replica of this job (its nodeSelector).
    pub fn accepts_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector.matches(labels)
    }
}
