//! The builtin backend's sibling copies: simulated runner in paused time, and one check with the
//! process runner that nothing of a copy runs before its grant.

use meridian_scheduler::QueueSpec;
use meridian_scheduler::testkit::node;
use tokio::sync::mpsc;

use super::*;
use crate::backend::process::discovery::{declared_host_nodes, device_table};
use crate::backend::{CopyEvent, JobEventReceiver};
use crate::test_jobs::{assignment, job_spec};

/// Longest (virtual) wait for anything a test expects.
const PATIENCE: Duration = Duration::from_secs(36_000);

/// One 8-GPU node, one queue `a`, the simulated runner at real time; its job and copy events.
fn backend() -> (BuiltinBackend, JobEventReceiver, CopyEventReceiver) {
    let scheduler = BuiltinScheduler::new(vec![node("n-0", 8)], vec![QueueSpec::new("a", 1.0)]).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let backend = BuiltinBackend::new(scheduler, 1.0, tx).unwrap();
    let copies = backend.copy_events().expect("the builtin backend gives copy events");
    assert!(backend.copy_events().is_none(), "handed over once");
    (backend, rx, copies)
}

/// An 8-GPU job of `estimate_secs` in queue `a`.
fn whole_node(job_id: &str, fencing_token: u64, estimate_secs: u64) -> Assignment {
    assignment(job_id, fencing_token, job_spec("a", 1, 8, estimate_secs))
}

async fn next_copy_event(copies: &mut CopyEventReceiver) -> CopyEvent {
    tokio::time::timeout(PATIENCE, copies.recv()).await.expect("no copy event").unwrap()
}

/// The next job event that is not a pending job's new reason.
async fn next_change(events: &mut JobEventReceiver) -> JobEvent {
    loop {
        let event = tokio::time::timeout(PATIENCE, events.recv()).await.expect("no job event").unwrap();
        if !matches!(event.phase, JobPhase::Pending { .. }) {
            return event;
        }
    }
}

/// Lets the driver run its passes without moving the clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

async fn gpus_free(backend: &BuiltinBackend) -> u32 {
    backend.inventory().await.unwrap().gpus_free()
}

/// A blocker that ends in 60 s and a copy of `job` queued behind it; returns when the copy is
/// ready (the blocker's end, reported, is consumed).
async fn ready_copy(
    backend: &BuiltinBackend,
    events: &mut JobEventReceiver,
    copies: &mut CopyEventReceiver,
    job: &Assignment,
) {
    backend.submit(&whole_node("blocker", 1, 60)).await.unwrap();
    assert_eq!(backend.copy(11, job).await.unwrap(), CopyAdmission::Queued);
    let ended = next_change(events).await;
    assert_eq!((ended.job_id.as_str(), ended.phase.is_terminal()), ("blocker", true));
    let ready = next_copy_event(copies).await;
    assert_eq!(ready, CopyEvent::Ready { job_id: job.job_id.clone(), copy_token: 11 });
}

#[tokio::test(start_paused = true)]
async fn a_copy_waits_like_a_job_is_ready_when_it_would_start_and_never_runs_or_ends_by_itself() {
    let (backend, mut events, mut copies) = backend();
    let t0 = Instant::now();
    let job = whole_node("j", 3, 60);
    ready_copy(&backend, &mut events, &mut copies, &job).await;
    assert_eq!(t0.elapsed(), Duration::from_secs(60), "ready when the blocker's end freed its node");
    assert_eq!(gpus_free(&backend).await, 0, "the scheduler holds the node for the ready copy");
    assert!(backend.list().await.unwrap().is_empty(), "a copy is no binding");
    // Long past its estimate: nothing of it starts, runs or ends, and it is not ready twice.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(events.try_recv().is_err(), "no job event for a copy");
    assert!(copies.try_recv().is_err(), "ready once");
    assert_eq!(gpus_free(&backend).await, 0, "still held for its grant");
}

#[tokio::test(start_paused = true)]
async fn a_grant_starts_the_ready_copy_on_its_nodes_under_the_grants_token() {
    let (backend, mut events, mut copies) = backend();
    let job = whole_node("j", 3, 60);
    ready_copy(&backend, &mut events, &mut copies, &job).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    let granted_at = Instant::now();
    let binding = Assignment { fencing_token: 9, ..job.clone() };
    let admission = backend.grant(11, &binding).await.unwrap();
    assert_eq!(admission, Admission::Started { nodes: vec!["n-0".into()] });
    let held = backend.list().await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].job_id.as_str(), held[0].fencing_token), ("j", 9));
    assert!(matches!(held[0].phase, JobPhase::Running { .. }), "{held:?}");
    let end = next_change(&mut events).await;
    assert_eq!((end.job_id.as_str(), end.fencing_token), ("j", 9));
    assert!(matches!(end.phase, JobPhase::Succeeded { .. }), "{end:?}");
    assert_eq!(granted_at.elapsed(), Duration::from_secs(60), "it runs its estimate from the grant");
    assert_eq!(gpus_free(&backend).await, 8);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_ready_copy_frees_its_nodes_for_another_job() {
    let (backend, mut events, mut copies) = backend();
    let job = whole_node("j", 3, 60);
    ready_copy(&backend, &mut events, &mut copies, &job).await;
    backend.drop_copy("j", 12).await.unwrap();
    assert_eq!(gpus_free(&backend).await, 0, "a drop of another copy token changes nothing");
    backend.drop_copy("j", 11).await.unwrap();
    assert_eq!(gpus_free(&backend).await, 8, "freed at once");
    let other = backend.submit(&whole_node("other", 4, 60)).await.unwrap();
    assert_eq!(other, Admission::Started { nodes: vec!["n-0".into()] });
    // A grant of the dropped copy is an offer: it queues behind `other`.
    let late = backend.grant(11, &Assignment { fencing_token: 9, ..job }).await.unwrap();
    assert!(matches!(late, Admission::Queued { .. }), "{late:?}");
}

#[tokio::test(start_paused = true)]
async fn a_grant_of_a_copy_still_waiting_is_a_submit_that_replaces_the_copy() {
    let (backend, mut events, mut copies) = backend();
    backend.submit(&whole_node("blocker", 1, 60)).await.unwrap();
    let job = whole_node("j", 3, 60);
    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued);
    let admission = backend.grant(11, &Assignment { fencing_token: 9, ..job }).await.unwrap();
    assert!(matches!(admission, Admission::Queued { .. }), "{admission:?}");
    assert_eq!(backend.pressure().await.unwrap().pending_jobs(), 1, "one entry for the job, not two");
    assert_eq!(next_change(&mut events).await.job_id, "blocker");
    let started = next_change(&mut events).await;
    assert_eq!((started.job_id.as_str(), started.fencing_token), ("j", 9));
    assert!(matches!(started.phase, JobPhase::Running { .. }), "{started:?}");
    settle().await;
    assert!(copies.try_recv().is_err(), "the replaced copy is never ready");
}

#[tokio::test(start_paused = true)]
async fn an_offer_of_a_job_drops_its_copy_and_a_copy_of_a_held_job_is_refused() {
    let (backend, _events, _copies) = backend();
    backend.submit(&whole_node("blocker", 1, 60)).await.unwrap();
    let job = whole_node("j", 3, 60);
    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued, "the same copy again");
    let admission = backend.submit(&Assignment { fencing_token: 4, ..job.clone() }).await.unwrap();
    assert!(matches!(admission, Admission::Queued { .. }), "the offer is taken: {admission:?}");
    assert_eq!(backend.pressure().await.unwrap().pending_jobs(), 1);
    let refused = backend.copy(12, &job).await.unwrap();
    assert!(
        matches!(&refused, CopyAdmission::Refused { reason, unsupported: false } if reason.contains("binding 4")),
        "{refused:?}"
    );
    let too_big = assignment("too-big", 1, job_spec("a", 1, 16, 60));
    let never = backend.copy(14, &too_big).await.unwrap();
    assert!(matches!(never, CopyAdmission::Refused { unsupported: false, .. }), "{never:?}");
}

#[tokio::test(start_paused = true)]
async fn a_copy_never_preempts_and_a_ready_copy_picked_as_a_victim_is_dropped_at_once() {
    let (backend, mut events, mut copies) = backend();
    let t0 = Instant::now();
    let low = JobSpec { priority: 10, preemptible: true, ..job_spec("a", 1, 8, 120) };
    backend.submit(&assignment("low", 1, low.clone())).await.unwrap();
    let urgent_copy = assignment("urgent", 1, JobSpec { priority: 90, ..job_spec("a", 1, 8, 60) });
    assert_eq!(backend.copy(11, &urgent_copy).await.unwrap(), CopyAdmission::Queued);
    let ended = next_change(&mut events).await;
    assert_eq!(ended.job_id, "low");
    assert!(matches!(ended.phase, JobPhase::Succeeded { .. }), "not preempted for a copy: {ended:?}");
    assert_eq!(t0.elapsed(), Duration::from_secs(120));
    assert!(matches!(next_copy_event(&mut copies).await, CopyEvent::Ready { .. }));
    backend.drop_copy("urgent", 11).await.unwrap();

    // A ready copy of a preemptible job gives way at once, with no grace.
    let victim = assignment("victim", 1, low);
    assert_eq!(backend.copy(12, &victim).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(next_copy_event(&mut copies).await, CopyEvent::Ready { job_id: "victim".into(), copy_token: 12 });
    let before = Instant::now();
    let urgent = assignment("urgent", 2, JobSpec { priority: 90, ..job_spec("a", 1, 8, 60) });
    assert!(matches!(backend.submit(&urgent).await.unwrap(), Admission::Queued { .. }));
    let dropped = next_copy_event(&mut copies).await;
    assert!(
        matches!(&dropped, CopyEvent::Dropped { job_id, copy_token: 12, reason } if job_id == "victim" && reason.contains("urgent")),
        "{dropped:?}"
    );
    let started = next_change(&mut events).await;
    assert_eq!((started.job_id.as_str(), started.fencing_token), ("urgent", 2));
    assert!(matches!(started.phase, JobPhase::Running { .. }), "{started:?}");
    assert_eq!(before.elapsed(), Duration::ZERO, "no grace for a copy that runs nothing");
}

#[tokio::test]
async fn under_the_process_runner_nothing_of_a_copy_runs_before_its_grant() {
    let dir = tempfile::tempdir().unwrap();
    let witness = dir.path().join("ran");
    let nodes = vec![node("n-0", 4)];
    let settings = ProcessSettings {
        kill_grace: Duration::from_secs(5),
        log_bytes: 1 << 20,
        devices: device_table(&declared_host_nodes(nodes.clone())),
        lease_watchdog: None,
        cluster: "local".into(),
    };
    let scheduler = BuiltinScheduler::new(nodes, vec![QueueSpec::new("a", 1.0)]).unwrap();
    let (tx, mut events) = mpsc::unbounded_channel();
    let backend = BuiltinBackend::with_runner(scheduler, Runner::Process(settings), tx).unwrap();
    let mut copies = backend.copy_events().unwrap();
    let mut spec = job_spec("a", 1, 4, 60);
    spec.payload.image = None;
    let script = format!("echo \"$MERIDIAN_FENCING_TOKEN\" >> {}", witness.display());
    spec.payload.command = vec!["sh".into(), "-c".into(), script];
    let job = assignment("j", 3, spec);

    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued);
    let ready = tokio::time::timeout(Duration::from_secs(20), copies.recv()).await.unwrap().unwrap();
    assert_eq!(ready, CopyEvent::Ready { job_id: "j".into(), copy_token: 11 });
    // A launched copy would also write its line (token 3); the witness below holds only 9.
    assert!(!witness.exists(), "a ready copy launches nothing");
    assert!(backend.allocations().is_empty(), "and holds no devices");
    assert_eq!(gpus_free(&backend).await, 0, "but its node is taken");

    let binding = Assignment { fencing_token: 9, ..job };
    assert_eq!(backend.grant(11, &binding).await.unwrap(), Admission::Started { nodes: vec!["n-0".into()] });
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let event = events.recv().await.unwrap();
            if event.phase.is_terminal() {
                return event;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!((end.job_id.as_str(), end.fencing_token), ("j", 9));
    assert!(matches!(end.phase, JobPhase::Succeeded { .. }), "{end:?}");
    assert_eq!(std::fs::read_to_string(&witness).unwrap(), "9\n", "ran once, under the grant's token");
    assert_eq!(gpus_free(&backend).await, 4);
}
