//! What goes into the core and what comes out of it.

use std::sync::Arc;

use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand};
use meridian_proto::spec::JobSpec;

use crate::record::{JobRecord, Record};

/// Identifies one agent stream; given by the runtime, never reused within a process.
pub type ConnId = u64;

/// Identifies a caller waiting for an answer; given by the runtime, echoed in [`Effects::replies`].
pub type ReplyTo = u64;

/// One thing that happened, for [`crate::Core::step`].
// A submit carries a whole spec; inputs are built once and moved, so boxing it buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Input {
    /// A user submits a validated spec.
    Submit {
        /// The spec (validated at the edge).
        spec: JobSpec,
        /// Who waits for the answer.
        reply: ReplyTo,
    },
    /// A user cancels a job.
    Cancel {
        /// The job.
        job_id: String,
        /// Who waits for the answer.
        reply: ReplyTo,
    },
    /// An agent opened a stream and said hello.
    AgentHello {
        /// The new stream.
        conn: ConnId,
        /// What it said.
        hello: AgentHello,
        /// Who waits to learn whether the stream is accepted.
        reply: ReplyTo,
    },
    /// An agent said something on an accepted stream.
    Agent {
        /// The stream.
        conn: ConnId,
        /// What it said.
        event: AgentEvent,
    },
    /// An agent stream ended (closed, broken, or dropped by the runtime).
    AgentGone {
        /// The stream.
        conn: ConnId,
    },
    /// A user asks for part of a job's output: the core sends the request to the stream of the
    /// cluster that holds the job's current binding (the answer goes around the core).
    Logs {
        /// The job.
        job_id: String,
        /// Echoed by the agent's answer.
        request_id: u64,
        /// Byte offset to read from; None: the last `max_bytes`.
        from: Option<u64>,
        /// The most bytes wanted.
        max_bytes: u32,
        /// Who waits to learn which stream was asked.
        reply: ReplyTo,
    },
    /// Time passed: expire offers, silent clusters, lost jobs and finished jobs past retention.
    Tick,
    /// Place the queue (the runtime coalesces requests for rounds; see [`crate::Core::wants_round`]).
    Round,
}

/// A successful answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The submitted (or, for a repeated idempotency key, the earlier) job.
    Submitted {
        /// The job.
        job: Arc<JobRecord>,
        /// False when an earlier job with the same tenant and idempotency key was returned.
        created: bool,
    },
    /// The job after a cancel.
    Cancelled(Arc<JobRecord>),
    /// The agent stream is accepted; its welcome is among the sends.
    Attached,
    /// A logs request went to this stream; only it may answer.
    LogsAsked {
        /// The stream asked.
        conn: ConnId,
    },
}

/// Why the core refused an input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// No known cluster could ever run the job, whatever it waits for.
    #[error("no cluster could ever run this job: {}", .reasons.iter().map(|(c, r)| format!("{c}: {r}")).collect::<Vec<_>>().join("; "))]
    NeverFits {
        /// Per cluster, why not.
        reasons: Vec<(String, String)>,
    },
    /// The job's gang is larger than its tenant's whole GPU quota, so it could never start.
    #[error(
        "the job needs {needs} GPUs but tenant {tenant} may hold at most {limit} ({field}); split the job or raise the quota"
    )]
    ExceedsQuota {
        /// The config path of the limit, e.g. `tenants.nlp.quota.maxGpus`.
        field: String,
        /// The tenant.
        tenant: String,
        /// The limit.
        limit: u32,
        /// GPUs the gang takes.
        needs: u32,
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
    /// Another live agent holds the cluster's name.
    #[error(
        "cluster `{cluster}` is already connected from agent instance {instance}; stop that agent or wait until the gateway drops its stream"
    )]
    DuplicateAgent {
        /// The cluster.
        cluster: String,
        /// The instance that holds it.
        instance: String,
    },
    /// The job has not been placed on any cluster, so there is no output to show.
    #[error("job `{0}` has not run on any cluster yet; it has no output")]
    NotStarted(String),
    /// The cluster holding the job's output has no agent connected.
    #[error(
        "cluster `{cluster}`, which holds the output of job `{job}`, is not connected; try again once its agent is back"
    )]
    ClusterUnreachable {
        /// The cluster.
        cluster: String,
        /// The job.
        job: String,
    },
    /// The store failed; the gateway refuses changes until it is restarted.
    #[error("{0}")]
    Unavailable(String),
}

/// What a step asks the runtime to do, in this order: commit every record (one group commit
/// for a whole batch), and only once that is durable deliver the sends and replies. Nothing a
/// step sends or answers may depend on a record that is not yet durable.
#[derive(Debug, Default)]
pub struct Effects {
    /// Durable changes, in the order they were made.
    pub persist: Vec<Record>,
    /// Messages to agent streams.
    pub sends: Vec<(ConnId, GatewayCommand)>,
    /// Streams the runtime should close (replaced, silent past the timeout).
    pub close: Vec<ConnId>,
    /// Answers to waiting callers.
    pub replies: Vec<(ReplyTo, Result<Reply, Error>)>,
}

impl Effects {
    /// Whether the step produced nothing at all.
    pub fn is_empty(&self) -> bool {
        self.persist.is_empty() && self.sends.is_empty() && self.close.is_empty() && self.replies.is_empty()
    }

    /// Replaces every successful reply with `error` and drops the sends: what the runtime does
    /// with a batch whose commit failed.
    pub fn fail_all(&mut self, error: &Error) {
        self.sends.clear();
        self.close.clear();
        for (_, reply) in &mut self.replies {
            *reply = Err(error.clone());
        }
    }
}
