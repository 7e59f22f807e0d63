//! One conformance suite for every [`LocalBackend`] + [`InventorySource`]: what the agent relies
//! on, checked the same way for each implementation (builtin-simulated, process, Slurm against
//! a real Slurm, Kubernetes against the fake API server). Each backend's tests build a
//! [`Subject`] and call [`run`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::protocol::Assignment;

use super::{Admission, CopyAdmission, InventorySource, JobEvent, JobEventReceiver, JobPhase, LocalBackend};

/// What [`Subject::reopen`] builds: a second backend over the same member.
pub(crate) type Reopened =
    Pin<Box<dyn Future<Output = (Arc<dyn LocalBackend>, Arc<dyn InventorySource>, JobEventReceiver)> + Send>>;

/// A freshly built backend with nothing held, and the jobs to try on it.
pub(crate) struct Subject {
    /// The backend under test.
    pub(crate) backend: Arc<dyn LocalBackend>,
    /// Its inventory source.
    pub(crate) inventory: Arc<dyn InventorySource>,
    /// Its job events.
    pub(crate) events: JobEventReceiver,
    /// Fits the empty member and runs until cancelled.
    pub(crate) runs: Assignment,
    /// Takes every GPU of the member and runs until cancelled, so `runs` must wait behind it.
    pub(crate) fills: Assignment,
    /// Fits and ends Succeeded on its own; where output is kept, it wrote `hello`.
    pub(crate) succeeds: Assignment,
    /// Fits and ends Failed on its own; where a command runs, with exit code 3.
    pub(crate) fails: Assignment,
    /// Can never run on the member.
    pub(crate) never_fits: Assignment,
    /// Builds a second backend over the same member, as a restarted agent does.
    pub(crate) reopen: Box<dyn Fn() -> Reopened + Send + Sync>,
    /// Whether the member keeps jobs across an agent restart.
    pub(crate) adopts: bool,
    /// Whether [`LocalBackend::logs`] returns job output.
    pub(crate) keeps_logs: bool,
    /// Longest time the member may take to start or end a job.
    pub(crate) patience: Duration,
}

/// Runs every check; panics with the broken rule.
pub(crate) async fn run(mut subject: Subject) {
    empty_member(&subject).await;
    bindings(&subject).await;
    queueing_and_pressure(&mut subject).await;
    jobs_end_on_their_own(&mut subject).await;
    refusal(&subject).await;
    sibling_copies(&subject).await;
    restart(subject).await;
}

/// The empty member shows capacity and holds nothing.
async fn empty_member(subject: &Subject) {
    let inventory = subject.inventory.inventory().await.expect("inventory");
    assert!(!inventory.shapes.is_empty(), "the member has node shapes: {inventory:?}");
    assert!(inventory.gpus_free() > 0, "an empty member has free GPUs: {inventory:?}");
    assert_eq!(inventory.gpus_free(), inventory.gpus_total(), "nothing is taken on an empty member");
    subject.inventory.pressure().await.expect("pressure");
    assert!(subject.backend.list().await.expect("list").is_empty(), "an empty member holds nothing");
}

/// Submit is idempotent per binding, one binding per job, cancel stops exactly the named one.
async fn bindings(subject: &Subject) {
    let backend = subject.backend.as_ref();
    let job = &subject.runs;
    let token = job.fencing_token;

    let first = backend.submit(job).await.expect("submit a job that fits");
    assert!(matches!(first, Admission::Started { .. } | Admission::Queued { .. }), "a fitting job is taken: {first:?}");
    let held = backend.list().await.expect("list");
    assert_eq!(held.len(), 1, "list shows the one binding: {held:?}");
    assert_eq!((held[0].job_id.as_str(), held[0].fencing_token), (job.job_id.as_str(), token));
    assert!(!held[0].phase.is_terminal(), "{held:?}");

    let again = backend.submit(job).await.expect("submit the same binding again");
    assert!(
        matches!(again, Admission::Started { .. } | Admission::Queued { .. }),
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
}

/// A job behind a full member waits with a reason, pressure counts it, and it starts when the
/// member frees up.
async fn queueing_and_pressure(subject: &mut Subject) {
    let backend = Arc::clone(&subject.backend);
    let fills = subject.fills.clone();
    let runs = Assignment { fencing_token: subject.runs.fencing_token + 10, ..subject.runs.clone() };

    let admission = backend.submit(&fills).await.expect("submit the job that fills the member");
    assert!(matches!(admission, Admission::Started { .. } | Admission::Queued { .. }), "{admission:?}");
    if matches!(admission, Admission::Queued { .. }) {
        wait_for(subject, &fills, |p| matches!(p, JobPhase::Running { .. })).await;
    }
    let taken = subject.inventory.inventory().await.expect("inventory");
    assert_eq!(taken.gpus_free(), 0, "the member is full once `fills` runs: {taken:?}");

    let admission = backend.submit(&runs).await.expect("submit behind a full member");
    let reason = match admission {
        Admission::Queued { reason } => reason,
        other => panic!("a job behind a full member waits: {other:?}"),
    };
    assert!(!reason.trim().is_empty(), "a waiting job says why");
    let pressure = poll(subject.patience, || {
        let inventory = Arc::clone(&subject.inventory);
        async move {
            let pressure = inventory.pressure().await.expect("pressure");
            (pressure.pending_jobs() >= 1).then_some(pressure)
        }
    })
    .await
    .expect("pressure counts the waiting job");
    let wants = u64::from(runs.spec.total_gpus());
    assert!(u64::from(pressure.pending_gpus()) >= wants, "pressure counts its GPUs: {pressure:?}");

    backend.cancel(&fills.job_id, fills.fencing_token).await.expect("cancel `fills`");
    let started = wait_for(subject, &runs, |p| matches!(p, JobPhase::Running { .. })).await;
    let JobPhase::Running { nodes } = started.phase else { unreachable!("waited for running") };
    assert_eq!(nodes.len(), runs.spec.gang.replicas as usize, "one node per replica: {nodes:?}");
    backend.cancel(&runs.job_id, runs.fencing_token).await.expect("cancel `runs`");
    assert!(backend.list().await.expect("list").is_empty(), "both cancelled");
}

/// Jobs end by themselves and say how; cancels produce no terminal event.
async fn jobs_end_on_their_own(subject: &mut Subject) {
    let backend = Arc::clone(&subject.backend);
    let succeeds = subject.succeeds.clone();
    let fails = subject.fails.clone();
    backend.submit(&succeeds).await.expect("submit `succeeds`");
    let end = wait_for(subject, &succeeds, JobPhase::is_terminal).await;
    assert!(matches!(end.phase, JobPhase::Succeeded { .. }), "{end:?}");
    if subject.keeps_logs {
        let logs = backend.logs(&succeeds.job_id, succeeds.fencing_token, Some(0), 64 * 1024).await.expect("logs");
        assert!(logs.data.contains("hello"), "the job's output is kept: {logs:?}");
        assert_eq!(logs.offset, 0);
        assert!(logs.next_offset >= logs.data.len() as u64, "{logs:?}");
        let tail = backend.logs(&succeeds.job_id, succeeds.fencing_token, None, 3).await.expect("tail");
        assert!(tail.data.len() <= 3, "a tail is bounded: {tail:?}");
    }
    backend.submit(&fails).await.expect("submit `fails`");
    let end = wait_for(subject, &fails, JobPhase::is_terminal).await;
    match &end.phase {
        JobPhase::Failed { message } => {
            if !fails.spec.payload.command.is_empty() && subject.keeps_logs {
                assert!(message.contains('3'), "the message names the exit code: {message}");
            }
        }
        other => panic!("`fails` fails: {other:?}"),
    }
    assert!(backend.list().await.expect("list").iter().all(|h| h.phase.is_terminal()), "nothing left running");
}

/// A job that can never run is refused for good and not held.
async fn refusal(subject: &Subject) {
    let never = subject.backend.submit(&subject.never_fits).await.expect("submit a job that never fits");
    assert!(matches!(never, Admission::Refused { permanent: true, .. }), "{never:?}");
    let held = subject.backend.list().await.expect("list");
    assert!(!held.iter().any(|h| h.job_id == subject.never_fits.job_id), "a refused job is not held: {held:?}");
}

/// A backend queues a sibling copy at its start gate or refuses it as unsupported; a copy is no
/// binding, a dropped one holds nothing, and the grant of a copy it does not hold is a submit.
async fn sibling_copies(subject: &Subject) {
    let backend = subject.backend.as_ref();
    let job = Assignment { fencing_token: subject.runs.fencing_token + 30, ..subject.runs.clone() };
    let free = subject.inventory.inventory().await.expect("inventory").gpus_free();
    let queued = match backend.copy(7, &job).await.expect("copy") {
        CopyAdmission::Queued => true,
        CopyAdmission::Refused { reason, unsupported: true } => {
            assert!(reason.contains("no start gate for sibling copies"), "{reason}");
            false
        }
        other => panic!("a copy of a job that fits is queued, or copies are unsupported: {other:?}"),
    };
    let held = backend.list().await.expect("list");
    assert!(!held.iter().any(|h| h.job_id == job.job_id), "a copy is no binding: {held:?}");
    backend.drop_copy(&job.job_id, 7).await.expect("drop the copy");
    backend.drop_copy(&job.job_id, 7).await.expect("a drop is idempotent");
    if queued {
        let after = subject.inventory.inventory().await.expect("inventory").gpus_free();
        assert_eq!(after, free, "a dropped copy holds nothing");
    }

    let granted = backend.grant(8, &job).await.expect("grant a copy not held");
    assert!(matches!(granted, Admission::Started { .. } | Admission::Queued { .. }), "{granted:?}");
    let held = backend.list().await.expect("list");
    assert!(held.iter().any(|h| h.job_id == job.job_id && h.fencing_token == job.fencing_token), "{held:?}");
    backend.cancel(&job.job_id, job.fencing_token).await.expect("cancel the granted binding");
}

/// A second backend over the same member adopts what the first held, or says plainly it holds
/// nothing.
async fn restart(subject: Subject) {
    let runs = Assignment { fencing_token: subject.runs.fencing_token + 20, ..subject.runs.clone() };
    subject.backend.submit(&runs).await.expect("submit before the restart");
    let Subject { backend, inventory, events, reopen, adopts, .. } = subject;
    drop((backend, inventory, events));
    let (backend, _inventory, _events) = reopen().await;
    let held = backend.list().await.expect("list after the restart");
    let mine: Vec<_> = held.iter().filter(|h| h.job_id == runs.job_id).collect();
    if adopts {
        assert_eq!(mine.len(), 1, "the member kept the job across the restart: {held:?}");
        assert_eq!(mine[0].fencing_token, runs.fencing_token, "with its binding");
        backend.cancel(&runs.job_id, runs.fencing_token).await.expect("cancel the adopted job");
        let held = backend.list().await.expect("list");
        assert!(!held.iter().any(|h| h.job_id == runs.job_id && !h.phase.is_terminal()), "{held:?}");
    } else {
        assert!(mine.is_empty(), "jobs died with the first backend: {held:?}");
    }
}

/// The rendezvous program of the job contract's check: rank 0 listens on the coordinator port
/// (`MASTER_ADDR`/`MASTER_PORT`), every other rank connects to it and says who it is, rank 0
/// answers; both print what they learned. It exits non-zero when a rank cannot reach rank 0 or
/// rank 0 hears from fewer than `WORLD_SIZE - 1` ranks within 30 s, so the job succeeds only if
/// the replicas found each other.
pub(crate) const RENDEZVOUS: &str = include_str!("rendezvous.py");

/// `python3 -c RENDEZVOUS`.
pub(crate) fn rendezvous_command() -> Vec<String> {
    vec!["python3".into(), "-c".into(), RENDEZVOUS.into()]
}

/// Runs `job`, a two-replica gang whose command is [`rendezvous_command`], and checks that it
/// succeeds and that its output shows both ranks meeting through the coordinator. Returns the
/// output.
pub(crate) async fn rendezvous(
    backend: &dyn LocalBackend,
    events: &mut JobEventReceiver,
    job: &Assignment,
    patience: Duration,
) -> String {
    assert_eq!(job.spec.gang.replicas, 2, "the rendezvous check runs two replicas");
    let admission = backend.submit(job).await.expect("submit the rendezvous job");
    assert!(matches!(admission, Admission::Started { .. } | Admission::Queued { .. }), "{admission:?}");
    let end = next_event(events, patience, job, JobPhase::is_terminal).await.phase;
    let output = backend.logs(&job.job_id, job.fencing_token, Some(0), 64 * 1024).await.expect("logs").data;
    assert!(matches!(end, JobPhase::Succeeded { .. }), "the replicas did not find each other: {end:?}\n{output}");
    let id = &job.job_id;
    assert!(output.contains(&format!("rank 0/2 of {id}")) && output.contains("met ['rank 1/2"), "{output}");
    assert!(
        output.contains(&format!("rank 1/2 of {id}")) && output.contains("heard 'welcome from rank 0/2"),
        "{output}"
    );
    output
}

/// The next event of `job`'s binding that satisfies `wanted`; panics when none comes in time.
/// A terminal event of a cancelled binding is a broken rule.
async fn wait_for(subject: &mut Subject, job: &Assignment, wanted: impl Fn(&JobPhase) -> bool) -> JobEvent {
    next_event(&mut subject.events, subject.patience, job, wanted).await
}

/// The next event on `events` of `job`'s binding that satisfies `wanted`, within `patience`;
/// panics when none comes in time, or when a cancelled binding of the job reports an end.
async fn next_event(
    events: &mut JobEventReceiver,
    patience: Duration,
    job: &Assignment,
    wanted: impl Fn(&JobPhase) -> bool,
) -> JobEvent {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no matching event for `{}` within {patience:?}", job.job_id))
            .expect("the backend's event channel is open");
        if event.job_id == job.job_id && event.fencing_token == job.fencing_token && wanted(&event.phase) {
            return event;
        }
        assert!(
            !(event.job_id == job.job_id && event.phase.is_terminal() && event.fencing_token != job.fencing_token),
            "a cancelled binding produced a terminal event: {event:?}"
        );
    }
}

/// Calls `check` until it answers, up to `patience`; one call per 100 ms.
async fn poll<T, F, Fut>(patience: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
