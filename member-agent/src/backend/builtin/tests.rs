//! The builtin backend with the simulated runner.
use meridian_scheduler::testkit::node;
use tokio::sync::mpsc;

use super::*;
use crate::backend::JobEventReceiver;
use crate::test_jobs::{assignment, job_spec};
use meridian_scheduler::{QueuePolicy, QueueSpec};

/// One 8-GPU node and two equal queues, `a` and `b`; jobs run for their estimate.
fn backend() -> (BuiltinBackend, JobEventReceiver) {
    backend_with(QueuePolicy::default())
}

/// Like [`backend`], with both queues under `policy`.
fn backend_with(policy: QueuePolicy) -> (BuiltinBackend, JobEventReceiver) {
    let queue = |name: &str| QueueSpec { policy, ..QueueSpec::new(name, 1.0) };
    let scheduler = BuiltinScheduler::new(vec![node("n-0", 8)], vec![queue("a"), queue("b")]).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    (BuiltinBackend::new(scheduler, 1.0, tx).unwrap(), rx)
}

async fn next_event(events: &mut JobEventReceiver) -> JobEvent {
    tokio::time::timeout(Duration::from_secs(3600), events.recv()).await.unwrap().unwrap()
}

/// The next event that is not a pending job's new reason.
async fn next_change(events: &mut JobEventReceiver) -> JobEvent {
    loop {
        let event = next_event(events).await;
        if !matches!(event.phase, JobPhase::Pending { .. }) {
            return event;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_that_fits_starts_at_once_and_succeeds_after_its_estimate() {
    let (backend, mut events) = backend();
    let started = Instant::now();
    let admission = backend.submit(&assignment("j-1", 7, job_spec("a", 1, 4, 60))).await.unwrap();
    assert_eq!(admission, Admission::Started { nodes: vec!["n-0".into()] });
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 4, "inventory shows the GPUs taken at once");
    let event = next_event(&mut events).await;
    assert_eq!(event.job_id, "j-1");
    assert_eq!(event.fencing_token, 7);
    assert!(matches!(event.phase, JobPhase::Succeeded { .. }), "{event:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 8);
}

#[tokio::test(start_paused = true)]
async fn a_job_queues_locally_when_the_cluster_is_busy_and_starts_when_capacity_frees() {
    let (backend, mut events) = backend();
    backend.submit(&assignment("big", 1, job_spec("a", 1, 8, 100))).await.unwrap();
    let admission = backend.submit(&assignment("next", 2, job_spec("a", 1, 8, 10))).await.unwrap();
    let Admission::Queued { reason } = admission else { panic!("expected queued, got {admission:?}") };
    assert!(reason.contains("local queue `a`") && reason.contains("0 of 8 free"), "{reason}");
    assert_eq!(backend.pressure().await.unwrap().pending_gpus(), 8);

    let done = next_change(&mut events).await;
    assert_eq!((done.job_id.as_str(), done.phase.is_terminal()), ("big", true));
    let started = next_change(&mut events).await;
    assert_eq!(
        started,
        JobEvent { job_id: "next".into(), fencing_token: 2, phase: JobPhase::Running { nodes: vec!["n-0".into()] } }
    );
}

#[tokio::test(start_paused = true)]
async fn fair_share_between_two_queues_decides_who_starts_when_capacity_frees() {
    // Strict queues: under backfill, `a-2` would take the member's reservation when it blocks
    // (before `b-1` arrives) and keep it, so it would go first.
    let (backend, mut events) = backend_with(QueuePolicy::Strict);
    // Queue `a` holds the whole node; `a` and then `b` queue one job each behind it.
    backend.submit(&assignment("a-1", 1, job_spec("a", 1, 8, 100))).await.unwrap();
    assert!(matches!(
        backend.submit(&assignment("a-2", 1, job_spec("a", 1, 8, 100))).await.unwrap(),
        Admission::Queued { .. }
    ));
    assert!(matches!(
        backend.submit(&assignment("b-1", 1, job_spec("b", 1, 8, 100))).await.unwrap(),
        Admission::Queued { .. }
    ));
    assert_eq!(next_change(&mut events).await.job_id, "a-1");
    // `a` has used the cluster for 100 s, `b` not at all: `b` goes first though it came later.
    let started = next_change(&mut events).await;
    assert_eq!((started.job_id.as_str(), &started.phase), ("b-1", &JobPhase::Running { nodes: vec!["n-0".into()] }));
    assert_eq!(next_change(&mut events).await.job_id, "b-1");
    assert_eq!(next_change(&mut events).await.job_id, "a-2");
}

#[tokio::test(start_paused = true)]
async fn a_job_that_can_never_fit_is_refused_permanently() {
    let (backend, _events) = backend();
    let admission = backend.submit(&assignment("huge", 1, job_spec("a", 1, 16, 10))).await.unwrap();
    assert!(matches!(admission, Admission::Refused { permanent: true, .. }), "{admission:?}");
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_second_binding_of_a_held_job_is_refused_until_the_first_is_cancelled() {
    let (backend, _events) = backend();
    backend.submit(&assignment("j", 1, job_spec("a", 1, 1, 100))).await.unwrap();
    let admission = backend.submit(&assignment("j", 2, job_spec("a", 1, 1, 100))).await.unwrap();
    assert!(matches!(admission, Admission::Refused { permanent: false, .. }), "{admission:?}");
    backend.cancel("j", 1).await.unwrap();
    assert!(matches!(
        backend.submit(&assignment("j", 2, job_spec("a", 1, 1, 100))).await.unwrap(),
        Admission::Started { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn a_job_cut_at_its_runtime_limit_fails() {
    let (backend, mut events) = backend();
    let mut limited = job_spec("a", 1, 1, 100);
    limited.runtime.limit = Some(HumanDuration::from_secs(30));
    backend.submit(&assignment("j", 1, limited)).await.unwrap();
    let event = next_event(&mut events).await;
    assert!(matches!(&event.phase, JobPhase::Failed { message } if message.contains("runtime limit")), "{event:?}");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_backend_stops_its_driver() {
    let (backend, mut events) = backend();
    backend.submit(&assignment("j", 1, job_spec("a", 1, 1, 100))).await.unwrap();
    drop(backend);
    // The driver held the only other sender; once it is stopped the channel closes.
    assert_eq!(tokio::time::timeout(Duration::from_secs(1000), events.recv()).await.unwrap(), None);
}

/// The simulated runner's fixture: nothing runs, so `succeeds` is a short estimate and `fails`
/// a runtime limit shorter than its estimate.
fn fixture() -> super::fixture::Fixture {
    let (first, events) = backend();
    let mut fails = assignment("fails", 3, job_spec("a", 1, 1, 600));
    fails.spec.runtime.limit = Some(HumanDuration::from_secs(30));
    super::fixture::Fixture {
        backend: Arc::new(first),
        events,
        runs: assignment("runs", 3, job_spec("a", 1, 2, 86_400)),
        fills: assignment("fills", 3, job_spec("a", 1, 8, 86_400)),
        succeeds: assignment("succeeds", 3, job_spec("a", 1, 1, 5)),
        fails,
        never_fits: assignment("never", 3, job_spec("a", 1, 64, 60)),
        reopen: Arc::new(|| {
            let (again, events) = backend();
            (Arc::new(again), events)
        }),
        adopts: false,
        keeps_logs: false,
        patience: Duration::from_secs(86_400),
    }
}

#[tokio::test(start_paused = true)]
async fn the_builtin_backend_passes_the_conformance_suite() {
    crate::backend::conformance::run(fixture().subject()).await;
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_job_preempts_a_preemptible_one_after_the_grace() {
    let (backend, mut events) = backend();
    let t0 = Instant::now();
    let low = JobSpec { priority: 10, preemptible: true, ..job_spec("a", 1, 8, 1000) };
    backend.submit(&assignment("low", 1, low)).await.unwrap();
    let urgent = JobSpec { priority: 90, ..job_spec("b", 1, 8, 60) };
    assert!(matches!(backend.submit(&assignment("urgent", 2, urgent)).await.unwrap(), Admission::Queued { .. }));

    let stopped = next_change(&mut events).await;
    assert_eq!((stopped.job_id.as_str(), stopped.fencing_token), ("low", 1));
    assert!(matches!(&stopped.phase, JobPhase::Preempted { message } if message.contains("preempted")), "{stopped:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(30), "stopped when the default 30 s grace ends");
    let started = next_change(&mut events).await;
    assert_eq!(
        started,
        JobEvent { job_id: "urgent".into(), fencing_token: 2, phase: JobPhase::Running { nodes: vec!["n-0".into()] } }
    );
    assert!(backend.list().await.unwrap().iter().all(|held| held.job_id != "low"), "the victim is no longer held");
}

#[tokio::test(start_paused = true)]
async fn a_job_preempted_recently_is_not_preempted_again() {
    let (backend, mut events) = backend();
    let low = JobSpec { priority: 10, preemptible: true, ..job_spec("a", 1, 8, 100) };
    let now_ms =
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let recent = Assignment { last_preempted_at_ms: Some(now_ms - 60_000), ..assignment("low", 1, low) };
    backend.submit(&recent).await.unwrap();
    let urgent = JobSpec { priority: 90, ..job_spec("b", 1, 8, 60) };
    backend.submit(&assignment("urgent", 2, urgent)).await.unwrap();
    // The victim would be protected for 9 more minutes; it runs to its end instead.
    let first = next_change(&mut events).await;
    assert_eq!(first.job_id, "low");
    assert!(matches!(first.phase, JobPhase::Succeeded { .. }), "{first:?}");
}
