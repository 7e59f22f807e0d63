//! The agent ↔ gateway protocol as domain types.
//!
//! The gateway's core and the agent speak these; the gRPC edge on each side converts them to and
//! from `pb::AgentMessage` / `pb::GatewayMessage` once (in `wire::protocol`, feature `wire`).
//!
//! The life of a result: the agent reports a job's terminal state in a [`JobReport`] (at once, and
//! in every [`AgentEvent::Heartbeat`] after that) until the gateway answers
//! [`GatewayCommand::Ack`], which it sends only once the result is durable. A result therefore
//! survives a dropped stream, a full channel and a gateway restart.

use std::time::Duration;

use serde::Serialize;

use crate::inventory::{ClusterInfo, Inventory, QueuePressure};
use crate::job::JobState;
use crate::spec::JobSpec;

/// What an agent says about one job it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// The job.
    pub job_id: String,
    /// The binding the agent holds it under.
    pub fencing_token: u64,
    /// Its state on the member (`Bound` while queued locally, `Running`, or terminal).
    pub state: JobState,
    /// Why it waits or failed, or a short note.
    pub message: String,
    /// Node of each replica, once running.
    pub nodes: Vec<String>,
    /// For a terminal state: stopped through no fault of the job (lease expired, preempted);
    /// the gateway places it again instead of failing it.
    pub requeue: bool,
    /// With `requeue`: the member preempted the job to make room for higher-priority work. The
    /// gateway queues it again and counts the preemption (a gateway that predates this still
    /// requeues it).
    pub preempted: bool,
    /// How busy a running job's GPUs were lately; None when unknown (the member measures no
    /// utilisation, an older agent, or no sample yet).
    pub usage: Option<GpuUsage>,
}

/// The mean utilisation of a running job's GPUs over a recent window, as its member measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuUsage {
    /// Mean over the job's GPUs and the window's samples, 0..=1.
    pub gpu_utilization: f64,
    /// How far back the samples reach.
    pub window: Duration,
    /// How many samples of the job's GPUs the mean is made of (at least one).
    pub samples: u32,
}

/// The first message on an agent stream.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentHello {
    /// Identity, tier and prices of the cluster.
    pub info: ClusterInfo,
    /// Random per agent process; tells a second agent for the same cluster from a reconnect.
    pub instance_id: String,
    /// The agent's version, for logs.
    pub agent_version: String,
}

/// Everything an agent sends after its hello.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    /// Node shapes and what is free.
    Inventory(Inventory),
    /// Local queue load and expected releases.
    Pressure(QueuePressure),
    /// The answer to an offer.
    OfferReply {
        /// The job offered.
        job_id: String,
        /// The offer's token.
        fencing_token: u64,
        /// Whether the member took the job (started or queued locally).
        accepted: bool,
        /// Why not, or where it waits.
        reason: String,
        /// Declined for good: the member's scheduler can never run the job as specified (its
        /// own words are in `reason`); offering it again anywhere is pointless.
        permanent: bool,
    },
    /// One job changed state.
    Status(JobReport),
    /// Every job the agent holds, with a sequence number the gateway's lease echoes.
    Heartbeat {
        /// Grows by one per heartbeat of this agent process.
        seq: u64,
        /// Every job held: running, queued locally, or finished and not yet acknowledged.
        jobs: Vec<JobReport>,
    },
    /// The answer to [`GatewayCommand::Logs`].
    Logs {
        /// The request answered.
        request_id: u64,
        /// The output, or why the member could not give it.
        result: Result<LogChunk, String>,
    },
    /// The answer to [`GatewayCommand::Quote`].
    Quote {
        /// The request answered.
        request_id: u64,
        /// When the gang could start, or why the member cannot say.
        result: Result<StartQuote, String>,
    },
    /// The member's scheduler is ready to start a sibling copy (its gang has nodes now, held
    /// for it): the agent asks for the job's start lock. The gateway answers
    /// [`GatewayCommand::Grant`] (exactly one copy of a job ever gets it) or
    /// [`GatewayCommand::DropCopy`].
    CopyReady {
        /// The job.
        job_id: String,
        /// The copy, as [`GatewayCommand::Copy`] named it.
        copy_token: u64,
    },
    /// The member no longer holds a copy it was given (it cannot queue it, or dropped it).
    CopyDropped {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
        /// Why, for people.
        reason: String,
        /// The member never holds copies (its backend has no start gate): send it none.
        unsupported: bool,
    },
}

/// When a gang could start on a member, from the member's own scheduler (its plan, not a
/// guess from released GPUs): per GPU type the member has that the gang accepts.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartQuote {
    /// One entry per GPU type on which the gang can start; a type on which it never can (too
    /// few nodes, selectors) is left out, so an empty list means "never here".
    pub starts: Vec<TypeStart>,
    /// How the member worked it out (`EASY plan`, `sbatch --test-only`), for `explain`.
    pub basis: String,
}

impl StartQuote {
    /// The earliest start over all types, if any.
    pub fn earliest(&self) -> Option<&TypeStart> {
        self.starts.iter().min_by_key(|s| s.after_secs)
    }
}

/// When a gang could start on a member, on one GPU type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStart {
    /// The GPU type.
    pub gpu_type: String,
    /// Seconds from the answer until the member expects to start the gang (0: now).
    pub after_secs: u64,
    /// The start needs the member to preempt lower-priority preemptible jobs: offered the job,
    /// it queues it and stops them after their grace period.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preempts: bool,
}

/// A piece of a job's output, as the member keeps it (a bounded tail of everything it wrote).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogChunk {
    /// The output, as text (invalid UTF-8 replaced).
    pub data: String,
    /// Byte offset of `data` in everything the job wrote.
    pub offset: u64,
    /// Offset to ask for next to follow the output.
    pub next_offset: u64,
    /// The job has ended and `next_offset` is the end of its output: nothing more will come.
    pub complete: bool,
}

/// A job handed to a member under a binding.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The job.
    pub job_id: String,
    /// The binding's token; reports must carry it.
    pub fencing_token: u64,
    /// The spec, with the GPU type pinned to the one placement costed.
    pub spec: JobSpec,
    /// When a member last preempted the job (Unix ms); None if never. A member does not preempt
    /// it again within its minimum interval.
    pub last_preempted_at_ms: Option<i64>,
}

/// Everything the gateway sends to an agent.
// An offer carries a whole spec; commands are built once and moved, so boxing it buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayCommand {
    /// The first message: the jobs the gateway believes the cluster holds, and the lease.
    Welcome {
        /// Keep exactly these (matching tokens); stop the rest.
        bound: Vec<Assignment>,
        /// How long the agent may run the gateway's jobs without a renewal (None: no lease).
        lease: Option<Duration>,
    },
    /// Start this job now, or say why not.
    Offer(Assignment),
    /// Stop this binding of the job.
    Cancel {
        /// The job.
        job_id: String,
        /// The binding to stop; an agent holding a newer one ignores it.
        fencing_token: u64,
    },
    /// The terminal result of this binding is durable at the gateway: forget it.
    Ack {
        /// The job.
        job_id: String,
        /// The binding whose result was recorded.
        fencing_token: u64,
    },
    /// Renews the lease; answers heartbeat `heartbeat_seq`.
    Lease {
        /// The heartbeat answered.
        heartbeat_seq: u64,
        /// The lease, counted from when that heartbeat was sent.
        lease: Duration,
    },
    /// Asks for part of a binding's output; the agent answers [`AgentEvent::Logs`].
    Logs {
        /// Echoed in the answer.
        request_id: u64,
        /// The job.
        job_id: String,
        /// Its binding on this member.
        fencing_token: u64,
        /// Byte offset to read from; None: the last `max_bytes`.
        from: Option<u64>,
        /// The most bytes to send back.
        max_bytes: u32,
    },
    /// Asks when a gang shaped like `spec` could start on the member; nothing is submitted. The
    /// agent answers [`AgentEvent::Quote`].
    Quote {
        /// Echoed in the answer.
        request_id: u64,
        /// A queued job of that shape (for the member's logs and names).
        job_id: String,
        /// Its spec.
        spec: JobSpec,
    },
    /// Queue a sibling copy of a job the gateway keeps queued: the member's scheduler plans and
    /// reserves for it like any pending job, but never starts it without a
    /// [`GatewayCommand::Grant`] (it answers [`AgentEvent::CopyReady`] when it would). A copy is
    /// not a binding: it runs nothing, reports nothing, and is dropped when the stream ends.
    Copy {
        /// Names this copy in every later message; never reused by the gateway process.
        copy_token: u64,
        /// The job; `fencing_token` is the job's current binding token (informational).
        assignment: Assignment,
    },
    /// The start lock for a copy that said it is ready: start it now under the binding in
    /// `assignment` (a new fencing token, durable at the gateway before this was sent). The
    /// agent answers as to an [`GatewayCommand::Offer`]; if it no longer holds the copy, it
    /// treats this as one.
    Grant {
        /// The copy granted.
        copy_token: u64,
        /// The binding it starts under.
        assignment: Assignment,
    },
    /// Drop this copy (another copy started, the job was placed, cancelled, or the copy's
    /// lock request came too late). Never affects a binding.
    DropCopy {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
    },
}
