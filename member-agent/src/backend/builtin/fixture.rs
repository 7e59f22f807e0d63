//! The builtin backend's conformance subject, filled the same way for both runners.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::protocol::Assignment;

use super::BuiltinBackend;
use crate::backend::conformance::Subject;
use crate::backend::{InventorySource, JobEventReceiver, LocalBackend};

/// A freshly built backend and the jobs the suite tries on it.
pub(super) struct Fixture {
    pub(super) backend: Arc<BuiltinBackend>,
    pub(super) events: JobEventReceiver,
    /// Fits the empty member and runs until cancelled.
    pub(super) runs: Assignment,
    /// Takes every GPU and runs until cancelled.
    pub(super) fills: Assignment,
    /// Ends Succeeded on its own (writes `hello` where commands run).
    pub(super) succeeds: Assignment,
    /// Ends Failed on its own.
    pub(super) fails: Assignment,
    /// Can never run on the member.
    pub(super) never_fits: Assignment,
    /// A second backend over the same member, as a restarted agent builds.
    pub(super) reopen: Arc<dyn Fn() -> (Arc<BuiltinBackend>, JobEventReceiver) + Send + Sync>,
    /// Whether jobs survive a restart (no for both runners).
    pub(super) adopts: bool,
    /// Whether `logs` returns job output.
    pub(super) keeps_logs: bool,
    /// Longest time the member may take to start or end a job.
    pub(super) patience: Duration,
}

impl Fixture {
    /// The conformance suite's subject.
    pub(super) fn subject(self) -> Subject {
        let reopen = self.reopen;
        Subject {
            backend: self.backend.clone(),
            inventory: self.backend,
            events: self.events,
            runs: self.runs,
            fills: self.fills,
            succeeds: self.succeeds,
            fails: self.fails,
            never_fits: self.never_fits,
            reopen: Box::new(move || {
                let (backend, events) = reopen();
                Box::pin(async move {
                    (backend.clone() as Arc<dyn LocalBackend>, backend as Arc<dyn InventorySource>, events)
                })
            }),
            adopts: self.adopts,
            keeps_logs: self.keeps_logs,
            patience: self.patience,
        }
    }
}
