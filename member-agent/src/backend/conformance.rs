//! One conformance suite for every [`LocalBackend`] + [`InventorySource`]: what the agent relies
//! on, checked the same way for each implementation (the builtin one today; Slurm and Kubernetes
//! run it against a real scheduler when they arrive).

use std::sync::Arc;

use meridian_proto::protocol::Assignment;

use super::{Admission, InventorySource, JobEventReceiver, JobPhase, LocalBackend};

/// A freshly built backend with nothing held, and two jobs to try on it.
pub(crate) struct Subject {
    /// The backend under test.
    pub(crate) backend: Arc<dyn LocalBackend>,
    /// Its inventory source.
    pub(crate) inventory: Arc<dyn InventorySource>,
    /// Its job events.
    pub(crate) events: JobEventReceiver,
    /// A job that fits the empty member.
    pub(crate) fits: Assignment,
    /// A job that can never run on the member.
    pub(crate) never_fits: Assignment,
}

/// Runs every check; panics with the broken rule.
pub(crate) async fn run(mut subject: Subject) {
    let backend = subject.backend.as_ref();
    let job = &subject.fits;
    let token = job.fencing_token;

    let first = backend.submit(job).await.expect("submit a job that fits");
    assert!(matches!(first, Admission::Started { .. } | Admission::Queued { .. }), "a fitting job is taken: {first:?}");
    let held = backend.list().await.expect("list");
    assert_eq!(held.len(), 1, "list shows the one binding: {held:?}");
    assert_eq!((held[0].job_id.as_str(), held[0].fencing_token), (job.job_id.as_str(), token));
    assert!(!held[0].phase.is_terminal(), "{held:?}");

    let again = backend.submit(job).await.expect("submit the same binding again");
    assert_eq!(
        std::mem::discriminant(&again),
        std::mem::discriminant(&first),
        "submit is idempotent per binding: {first:?} then {again:?}"
    );
    assert_eq!(backend.list().await.expect("list").len(), 1, "a repeated submit starts nothing twice");

    let newer = Assignment { fencing_token: token + 1, ..job.clone() };
    let refused = backend.submit(&newer).await.expect("submit a second binding");
    assert!(
        matches!(refused, Admission::Refused { permanent: false, .. }),
        "a second binding waits for the first to be cancelled: {refused:?}"
    );

    backend.cancel(&job.job_id, token + 1).await.expect("cancel a binding that is not held");
    assert_eq!(backend.list().await.expect("list").len(), 1, "cancel stops only the binding it names");
    backend.cancel(&job.job_id, token).await.expect("cancel the held binding");
    assert!(backend.list().await.expect("list").is_empty(), "a cancelled binding is gone");
    backend.cancel(&job.job_id, token).await.expect("cancel is idempotent");
    backend.cancel("never-submitted", 1).await.expect("cancelling an unknown job succeeds");

    let never = backend.submit(&subject.never_fits).await.expect("submit a job that never fits");
    assert!(matches!(never, Admission::Refused { permanent: true, .. }), "{never:?}");
    assert!(backend.list().await.expect("list").is_empty(), "a refused job is not held");

    subject.inventory.inventory().await.expect("inventory");
    subject.inventory.pressure().await.expect("pressure");

    while let Ok(event) = subject.events.try_recv() {
        assert!(
            !(event.job_id == job.job_id
                && matches!(event.phase, JobPhase::Succeeded { .. } | JobPhase::Failed { .. })),
            "a cancel produces no terminal event: {event:?}"
        );
    }
}
