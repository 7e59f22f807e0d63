//! The builtin backend with the process runner: real child processes (`sh -c …`), real time.
//! Every wait polls with a deadline.

use meridian_scheduler::testkit::node;
use tokio::sync::mpsc;

use super::fixture::Fixture;
use super::*;
use crate::backend::JobEventReceiver;
use crate::backend::process::discovery::{declared_host_nodes, device_table};
use crate::test_jobs::{assignment, job_spec};
use meridian_scheduler::{NodeSpec, QueueSpec};

/// Longest any single expectation may take.
const PATIENCE: Duration = Duration::from_secs(20);

/// A job of `replicas` × `gpus` running `sh -c script`.
fn job(job_id: &str, replicas: u32, gpus: u32, script: &str) -> Assignment {
    command_job(job_id, replicas, gpus, vec!["sh".into(), "-c".into(), script.into()])
}

fn command_job(job_id: &str, replicas: u32, gpus: u32, command: Vec<String>) -> Assignment {
    let mut spec = job_spec("a", replicas, gpus, 60);
    spec.payload.image = None;
    spec.payload.command = command;
    assignment(job_id, 1, spec)
}

/// One 4-GPU node, the given kill grace, 1 MiB of output per job.
fn backend_with(nodes: Vec<NodeSpec>, kill_grace: Duration, log_bytes: usize) -> (BuiltinBackend, JobEventReceiver) {
    let hosts = declared_host_nodes(nodes.clone());
    let settings = ProcessSettings {
        kill_grace,
        log_bytes,
        devices: device_table(&hosts),
        lease_watchdog: None,
        cluster: "local".into(),
    };
    let scheduler = BuiltinScheduler::new(nodes, vec![QueueSpec::new("a", 1.0)]).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    (BuiltinBackend::with_runner(scheduler, Runner::Process(settings), tx).unwrap(), rx)
}

fn backend() -> (BuiltinBackend, JobEventReceiver) {
    backend_with(vec![node("n-0", 4)], Duration::from_secs(5), 1 << 20)
}

/// The terminal event of `job_id`, skipping others.
async fn terminal(events: &mut JobEventReceiver, job_id: &str) -> JobPhase {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.unwrap();
            if event.job_id == job_id && event.phase.is_terminal() {
                return event.phase;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("job {job_id} did not end"))
}

/// Polls the job's whole output until `done` holds for it.
async fn output_until(backend: &BuiltinBackend, job_id: &str, done: impl Fn(&LogChunk) -> bool) -> LogChunk {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let chunk = backend.logs(job_id, 1, Some(0), 1 << 20).await.unwrap();
        if done(&chunk) {
            return chunk;
        }
        assert!(Instant::now() < deadline, "job {job_id}: output never got there: {chunk:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped: it runs no more).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_dead(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while !is_dead(pid) {
        assert!(Instant::now() < deadline, "process {pid} is still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first number in the job's output (a pid it printed).
async fn printed_pid(backend: &BuiltinBackend, job_id: &str) -> u32 {
    let chunk = output_until(backend, job_id, |c| c.data.contains('\n')).await;
    chunk.data.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("no pid in {chunk:?}"))
}

#[tokio::test]
async fn a_command_that_exits_0_succeeds_and_its_output_stays_readable() {
    let (backend, mut events) = backend();
    let admission = backend.submit(&job("ok", 1, 2, "echo hello; exit 0")).await.unwrap();
    assert_eq!(admission, Admission::Started { nodes: vec!["n-0".into()] });
    let phase = terminal(&mut events, "ok").await;
    assert!(
        matches!(&phase, JobPhase::Succeeded { message } if message.contains("exited 0") && message.contains("hello")),
        "{phase:?}"
    );
    let chunk = backend.logs("ok", 1, Some(0), 1 << 20).await.unwrap();
    assert_eq!((chunk.data.as_str(), chunk.complete), ("hello\n", true));
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 4, "the job's end frees its GPUs");
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn exit_code_3_fails_naming_the_code_and_the_last_lines() {
    let (backend, mut events) = backend();
    let script = "for i in $(seq 1 14); do echo line $i; done; echo oops >&2; exit 3";
    backend.submit(&job("bad", 1, 1, script)).await.unwrap();
    let JobPhase::Failed { message } = terminal(&mut events, "bad").await else { panic!("expected a failure") };
    assert!(message.contains("exited with code 3"), "{message}");
    assert!(message.contains("line 14\noops"), "{message}");
    assert!(!message.contains("line 5\n"), "at most 10 lines: {message}");
}

#[tokio::test]
async fn the_child_sees_the_payload_env_its_devices_and_its_replica() {
    let (backend, mut events) = backend();
    let mut assignment =
        job("env", 1, 2, "echo \"$FOO|$CUDA_VISIBLE_DEVICES|$MERIDIAN_JOB_ID|$MERIDIAN_REPLICA|$MERIDIAN_REPLICAS\"");
    assignment.spec.payload.env.insert("FOO".into(), "bar".into());
    backend.submit(&assignment).await.unwrap();
    terminal(&mut events, "env").await;
    let chunk = backend.logs("env", 1, None, 1000).await.unwrap();
    assert_eq!(chunk.data, "bar|0,1|env|0|1\n");
}

#[tokio::test]
async fn replicas_get_their_own_devices_and_prefixed_lines() {
    let (backend, mut events) = backend_with(vec![node("n-0", 2), node("n-1", 2)], Duration::from_secs(5), 1 << 20);
    backend
        .submit(&job("gang", 2, 2, "echo \"$MERIDIAN_REPLICA/$MERIDIAN_REPLICAS $CUDA_VISIBLE_DEVICES\""))
        .await
        .unwrap();
    assert!(matches!(terminal(&mut events, "gang").await, JobPhase::Succeeded { .. }));
    let data = backend.logs("gang", 1, Some(0), 1000).await.unwrap().data;
    let mut lines: Vec<&str> = data.lines().collect();
    lines.sort_unstable();
    // Declared nodes number the host's GPUs across nodes: n-0 has 0,1 and n-1 has 2,3.
    assert_eq!(lines, vec!["[0] 0/2 0,1", "[1] 1/2 2,3"]);
}

#[tokio::test]
async fn two_concurrent_jobs_get_disjoint_gpus() {
    let (backend, _events) = backend();
    backend.submit(&job("one", 1, 2, "echo $CUDA_VISIBLE_DEVICES; sleep 600")).await.unwrap();
    backend.submit(&job("two", 1, 2, "echo $CUDA_VISIBLE_DEVICES; sleep 600")).await.unwrap();
    let one = output_until(&backend, "one", |c| c.data.ends_with('\n')).await.data;
    let two = output_until(&backend, "two", |c| c.data.ends_with('\n')).await.data;
    assert_eq!((one.as_str(), two.as_str()), ("0,1\n", "2,3\n"));
    assert_eq!(backend.allocations().len(), 2);
    backend.cancel("one", 1).await.unwrap();
    backend.cancel("two", 1).await.unwrap();
    assert!(backend.allocations().is_empty());
}

#[tokio::test]
async fn a_waiting_job_starts_when_a_running_process_exits() {
    let (backend, mut events) = backend();
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    backend.submit(&job("first", 1, 4, &script)).await.unwrap();
    let admission = backend.submit(&job("second", 1, 4, "echo second")).await.unwrap();
    assert!(matches!(admission, Admission::Queued { .. }), "{admission:?}");
    std::fs::write(&release, b"").unwrap();
    assert!(matches!(terminal(&mut events, "first").await, JobPhase::Succeeded { .. }));
    assert!(matches!(terminal(&mut events, "second").await, JobPhase::Succeeded { .. }));
}

#[tokio::test]
async fn a_failing_replica_fails_the_gang_and_the_other_replica_is_stopped() {
    let (backend, mut events) = backend();
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    // Replica 0 traps TERM and says so; replica 1 fails once replica 0 is ready.
    let script = format!(
        "if [ \"$MERIDIAN_REPLICA\" = 1 ]; then while [ ! -e {r} ]; do sleep 0.05; done; exit 5; fi; \
         trap 'echo got TERM; exit 0' TERM; touch {r}; sleep 600 & wait",
        r = ready.display()
    );
    backend.submit(&job("gang", 2, 1, &script)).await.unwrap();
    let JobPhase::Failed { message } = terminal(&mut events, "gang").await else { panic!("expected a failure") };
    assert!(message.contains("replica 1 exited with code 5"), "{message}");
    assert!(message.contains("other replicas were stopped"), "{message}");
    let data = backend.logs("gang", 1, Some(0), 1000).await.unwrap().data;
    assert!(data.contains("[0] got TERM"), "{data}");
}

#[tokio::test]
async fn cancel_sends_sigterm_to_the_job_and_reports_nothing() {
    let (backend, mut events) = backend();
    backend.submit(&job("c", 1, 1, "trap 'echo bye; exit 0' TERM; echo ready; sleep 600 & wait")).await.unwrap();
    output_until(&backend, "c", |c| c.data.contains("ready")).await;
    backend.cancel("c", 1).await.unwrap();
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 4, "a cancel frees the GPUs at once");
    let chunk = output_until(&backend, "c", |c| c.complete).await;
    assert!(chunk.data.contains("bye"), "{chunk:?}");
    while let Ok(event) = events.try_recv() {
        assert!(!event.phase.is_terminal(), "a cancel produces no terminal event: {event:?}");
    }
}

#[tokio::test]
async fn a_job_that_ignores_sigterm_is_killed_after_the_grace() {
    let (backend, _events) = backend_with(vec![node("n-0", 4)], Duration::from_secs(2), 1 << 20);
    backend.submit(&job("stubborn", 1, 1, "trap '' TERM; echo $$; sleep 600")).await.unwrap();
    let pid = printed_pid(&backend, "stubborn").await;
    let cancel = backend.cancel("stubborn", 1);
    tokio::pin!(cancel);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut cancel).await.is_err(),
        "SIGTERM is ignored: the cancel has not returned while the job lives on"
    );
    assert!(!is_dead(pid), "SIGTERM is ignored, so the job lives on until the grace is over");
    cancel.await.unwrap();
    assert!(is_dead(pid), "a cancel returns only once the job's processes are gone (SIGKILL after the grace)");
    output_until(&backend, "stubborn", |c| c.complete).await;
}

#[tokio::test]
async fn the_runtime_limit_stops_the_job_and_fails_it() {
    let (backend, mut events) = backend_with(vec![node("n-0", 4)], Duration::from_millis(200), 1 << 20);
    let mut limited = job("slow", 1, 1, "echo started; sleep 600");
    limited.spec.runtime.limit = Some(HumanDuration::from_secs(1));
    backend.submit(&limited).await.unwrap();
    let JobPhase::Failed { message } = terminal(&mut events, "slow").await else { panic!("expected a failure") };
    assert!(message.contains("runtime limit of 1s") && message.contains("started"), "{message}");
}

#[tokio::test]
async fn a_command_that_cannot_start_fails_naming_the_program() {
    let (backend, mut events) = backend();
    backend.submit(&command_job("missing", 1, 1, vec!["/nonexistent/train".into()])).await.unwrap();
    let JobPhase::Failed { message } = terminal(&mut events, "missing").await else { panic!("expected a failure") };
    assert!(message.contains("cannot start `/nonexistent/train`") && message.contains("No such file"), "{message}");
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 4);
}

#[tokio::test]
async fn payloads_without_a_command_or_with_an_image_are_refused_for_good() {
    let (backend, _events) = backend();
    let admission = backend.submit(&command_job("none", 1, 1, Vec::new())).await.unwrap();
    assert!(
        matches!(&admission, Admission::Refused { permanent: true, reason } if reason.contains("payload.command")),
        "{admission:?}"
    );
    let mut image = job("image", 1, 1, "true");
    image.spec.payload.image = Some("pytorch:2".into());
    let admission = backend.submit(&image).await.unwrap();
    assert!(
        matches!(&admission, Admission::Refused { permanent: true, reason } if reason.contains("payload.image")),
        "{admission:?}"
    );
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn logs_answer_from_offsets_and_the_tail_and_say_where_a_truncated_ring_starts() {
    let (backend, mut events) = backend_with(vec![node("n-0", 4)], Duration::from_secs(5), 64);
    backend.submit(&job("chatty", 1, 1, "seq 1 100")).await.unwrap();
    terminal(&mut events, "chatty").await;
    // `seq 1 100` writes 292 bytes; the ring keeps the last 64.
    let oldest = backend.logs("chatty", 1, Some(0), 1 << 20).await.unwrap();
    assert_eq!((oldest.offset, oldest.next_offset, oldest.complete), (228, 292, true));
    assert!(oldest.data.ends_with("99\n100\n"), "{oldest:?}");
    let tail = backend.logs("chatty", 1, None, 4).await.unwrap();
    assert_eq!((tail.data.as_str(), tail.offset), ("100\n", 288));
    let middle = backend.logs("chatty", 1, Some(280), 4).await.unwrap();
    assert_eq!((middle.offset, middle.next_offset, middle.complete), (280, 284, false));
    let unknown = backend.logs("never", 1, None, 10).await.unwrap_err();
    assert!(!unknown.is_transient() && unknown.to_string().contains("never"), "{unknown}");
}

#[tokio::test]
async fn dropping_the_backend_kills_its_processes() {
    let (backend, _events) = backend();
    // The shell prints its background child's pid: a grandchild the agent never waits for.
    backend.submit(&job("orphan", 1, 1, "sleep 600 & echo $!; wait")).await.unwrap();
    let pid = printed_pid(&backend, "orphan").await;
    assert!(!is_dead(pid));
    drop(backend);
    wait_dead(pid).await;
}

fn fixture() -> Fixture {
    let (first, events) = backend();
    Fixture {
        backend: Arc::new(first),
        events,
        runs: job("runs", 1, 2, "sleep 600"),
        fills: job("fills", 1, 4, "sleep 600"),
        succeeds: job("succeeds", 1, 1, "echo hello; exit 0"),
        fails: job("fails", 1, 1, "echo oops >&2; exit 3"),
        never_fits: job("never", 1, 64, "true"),
        reopen: Arc::new(|| {
            let (again, events) = backend();
            (Arc::new(again), events)
        }),
        adopts: false,
        keeps_logs: true,
        patience: PATIENCE,
    }
}

#[tokio::test]
async fn the_process_runner_passes_the_conformance_suite() {
    crate::backend::conformance::run(fixture().subject()).await;
}

#[tokio::test]
async fn two_replicas_find_each_other_through_the_coordinator() {
    let (backend, mut events) = backend_with(vec![node("n-0", 2), node("n-1", 2)], Duration::from_secs(5), 1 << 20);
    let job = command_job("meet", 2, 1, crate::backend::conformance::rendezvous_command());
    let output = crate::backend::conformance::rendezvous(&backend, &mut events, &job, PATIENCE).await;
    // On one host the coordinator is loopback.
    assert!(output.contains("listening on 127.0.0.1:"), "{output}");
}

#[tokio::test]
async fn every_replica_gets_the_job_contract_and_its_own_port() {
    let (backend, mut events) = backend_with(vec![node("n-0", 2), node("n-1", 2)], Duration::from_secs(5), 1 << 20);
    let script = "echo \"$MERIDIAN_REPLICA $RANK $NODE_RANK $WORLD_SIZE $MERIDIAN_GPUS_PER_REPLICA $MERIDIAN_CLUSTER \
                  $MERIDIAN_COORDINATOR $MASTER_ADDR:$MASTER_PORT\"";
    backend.submit(&job("contract", 2, 1, script)).await.unwrap();
    assert!(matches!(terminal(&mut events, "contract").await, JobPhase::Succeeded { .. }));
    let data = backend.logs("contract", 1, Some(0), 1000).await.unwrap().data;
    let mut lines: Vec<&str> = data.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 2, "{data}");
    for (index, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = index.to_string();
        assert_eq!(
            words[..7],
            [&format!("[{index}]"), i.as_str(), i.as_str(), i.as_str(), "2", "1", "local"],
            "{line}"
        );
        assert_eq!(words[7], words[8], "MERIDIAN_COORDINATOR is MASTER_ADDR:MASTER_PORT: {line}");
        assert!(words[7].starts_with("127.0.0.1:"), "{line}");
    }
    assert_eq!(lines[0].split_whitespace().nth(7), lines[1].split_whitespace().nth(7), "one coordinator: {data}");

    // Two jobs running at once get different ports.
    backend.submit(&job("p1", 1, 1, "echo $MASTER_PORT; sleep 600")).await.unwrap();
    backend.submit(&job("p2", 1, 1, "echo $MASTER_PORT; sleep 600")).await.unwrap();
    let one = output_until(&backend, "p1", |c| c.data.ends_with('\n')).await.data;
    let two = output_until(&backend, "p2", |c| c.data.ends_with('\n')).await.data;
    assert_ne!(one, two, "concurrent jobs share no coordinator port");
}
