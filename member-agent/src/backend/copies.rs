//! Sibling copies as a backend sees them: what it answers when asked to queue one, and what it
//! tells the agent afterwards.
//!
//! A sibling copy is a gateway job queued in the member's own scheduler, so the member plans,
//! reserves and backfills for it exactly, but started only once the gateway grants it the job's
//! start lock: exactly one copy of a job is ever granted. A copy is no binding: it runs nothing
//! and is never listed or reported as a job. A backend that can hold a copy at its start gate
//! (the builtin scheduler; Slurm, with a gate in the batch script) queues it and says
//! [`CopyEvent::Ready`] when its scheduler has taken nodes for it (Kueue, held by the agent's
//! own AdmissionCheck: when Kueue has reserved quota for it); the others (Volcano) refuse every
//! copy as unsupported, and the gateway then sends them none.

/// The backend's answer to [`super::LocalBackend::copy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyAdmission {
    /// Queued in the local scheduler; [`CopyEvent::Ready`] follows when it would start it.
    Queued,
    /// Not queued: nothing of the copy is held.
    Refused {
        /// Why, for people.
        reason: String,
        /// The backend never holds copies (it has no start gate): the gateway sends no more.
        unsupported: bool,
    },
}

/// Something that happened to a queued copy, as the backend tells the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyEvent {
    /// The member's scheduler would start the copy now and holds its nodes for it: the agent
    /// asks the gateway for the job's start lock. Sent once per copy.
    Ready {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
    },
    /// The backend dropped the copy on its own (its nodes were wanted by higher-priority work,
    /// say) and holds nothing of it any more.
    Dropped {
        /// The job.
        job_id: String,
        /// The copy.
        copy_token: u64,
        /// Why, for people.
        reason: String,
    },
}

/// The sending half of a backend's copy events; unbounded for the same reason as
/// [`super::JobEventSender`] (a backend never blocks on the agent).
pub type CopyEventSender = tokio::sync::mpsc::UnboundedSender<CopyEvent>;

/// The receiving half of a backend's copy events; the agent's event loop takes it once, with
/// [`super::LocalBackend::copy_events`].
pub type CopyEventReceiver = tokio::sync::mpsc::UnboundedReceiver<CopyEvent>;

/// The reason a backend without a start gate gives for refusing a copy.
pub fn unsupported_reason(backend: &str) -> String {
    format!("{backend} has no start gate for sibling copies yet")
}
