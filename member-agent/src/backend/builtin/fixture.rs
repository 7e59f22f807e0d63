//! What the extended conformance suite asks of a subject, filled for each runner, and the
//! checks it adds, run here until the suite in `conformance.rs` has them.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::protocol::Assignment;

use super::BuiltinBackend;
use crate::backend::{Admission, InventorySource, JobEventReceiver, JobPhase, LocalBackend};

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
    pub(super) reopen: Box<dyn Fn() -> (Arc<BuiltinBackend>, JobEventReceiver) + Send + Sync>,
    /// Whether jobs survive a restart (no for both runners).
    pub(super) adopts: bool,
    /// Whether `logs` returns job output.
    pub(super) keeps_logs: bool,
    /// Longest time the member may take to start or end a job.
    pub(super) patience: Duration,
}

impl Fixture {
    /// The current conformance subject (a subset of the fixture).
    pub(super) fn subject(self) -> crate::backend::conformance::Subject {
        crate::backend::conformance::Subject {
            backend: self.backend.clone(),
            inventory: self.backend,
            events: self.events,
            fits: Assignment { job_id: "fits".into(), ..self.runs },
            never_fits: self.never_fits,
        }
    }
}

/// The next event of `job_id` that `wanted` accepts, within `patience`.
async fn event_of(f: &mut Fixture, job_id: &str, wanted: impl Fn(&JobPhase) -> bool) -> JobPhase {
    let patience = f.patience;
    let events = &mut f.events;
    let found = tokio::time::timeout(patience, async {
        loop {
            let event = events.recv().await.expect("the backend keeps its event channel open");
            if event.job_id == job_id && wanted(&event.phase) {
                return event.phase;
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("job {job_id}: the expected event did not come within {patience:?}"))
}

/// Queueing behind `fills`, starting after its cancel, ending on its own well and badly
/// (`fails` naming `failure_names`), logs, and a restart.
pub(super) async fn check(mut f: Fixture, failure_names: &str) {
    let backend = f.backend.clone();
    assert!(matches!(backend.submit(&f.fills).await.unwrap(), Admission::Started { .. }));
    let Admission::Queued { reason } = backend.submit(&f.runs).await.unwrap() else { panic!("runs must wait") };
    assert!(!reason.is_empty());
    assert_eq!(backend.pressure().await.unwrap().pending_gpus(), f.runs.spec.gang.resources.gpus);
    backend.cancel(&f.fills.job_id, f.fills.fencing_token).await.unwrap();
    let runs = f.runs.clone();
    event_of(&mut f, &runs.job_id, |p| matches!(p, JobPhase::Running { .. })).await;
    backend.cancel(&runs.job_id, runs.fencing_token).await.unwrap();

    let succeeds = f.succeeds.clone();
    backend.submit(&succeeds).await.unwrap();
    event_of(&mut f, &succeeds.job_id, |p| matches!(p, JobPhase::Succeeded { .. })).await;
    if f.keeps_logs {
        let chunk = backend.logs(&succeeds.job_id, succeeds.fencing_token, Some(0), 1000).await.unwrap();
        assert!(chunk.data.contains("hello") && chunk.complete, "{chunk:?}");
    } else {
        assert!(backend.logs(&succeeds.job_id, succeeds.fencing_token, None, 1000).await.is_err());
    }
    let fails = f.fails.clone();
    backend.submit(&fails).await.unwrap();
    let failed = event_of(&mut f, &fails.job_id, JobPhase::is_terminal).await;
    assert!(matches!(&failed, JobPhase::Failed { message } if message.contains(failure_names)), "{failed:?}");

    let never = backend.submit(&f.never_fits).await.unwrap();
    assert!(matches!(never, Admission::Refused { permanent: true, .. }), "{never:?}");

    backend.submit(&runs).await.unwrap();
    drop(backend);
    drop(f.backend);
    let (reopened, _events) = (f.reopen)();
    let held = reopened.list().await.unwrap();
    assert_eq!(held.is_empty(), !f.adopts, "{held:?}");
    reopened.cancel(&runs.job_id, runs.fencing_token).await.unwrap();
}
