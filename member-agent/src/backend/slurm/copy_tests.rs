//! Sibling copies on the real Slurm (see `copies.rs`): the witness that nothing of a copy runs
//! before its grant is the payload itself, which appends its fencing token to a file.

use std::path::Path;
use std::time::Duration;

use super::live_tests::{
    ONE_AT_A_TIME, PATIENCE, assignment, clean, cluster, config, event_where, started, submit_running,
};
use super::*;
use crate::backend::{CopyAdmission, CopyEvent, CopyEventReceiver, InventorySource, LocalBackend};

/// A 1-node, 4-GPU job whose payload appends `<token> <node> <unix time>` to `witness` and
/// succeeds.
fn witnessed(name: &str, witness: &Path) -> Assignment {
    let line = format!("echo \"$MERIDIAN_FENCING_TOKEN $SLURMD_NODENAME $(date +%s.%N)\" >> '{}'", witness.display());
    assignment(name, 1, 4, &["sh", "-c", &line])
}

fn witness_lines(witness: &Path) -> Vec<String> {
    std::fs::read_to_string(witness).map(|text| text.lines().map(String::from).collect()).unwrap_or_default()
}

async fn next_copy_event(events: &mut CopyEventReceiver) -> CopyEvent {
    tokio::time::timeout(PATIENCE, events.recv())
        .await
        .unwrap_or_else(|_| panic!("no copy event within {PATIENCE:?}"))
        .expect("copy events open")
}

fn runner(config: &SlurmConfig) -> Runner {
    Runner { bin_dir: config.bin_dir.clone(), slurm_conf: config.slurm_conf.clone(), timeout: PATIENCE }
}

/// The Slurm state of the jobs whose comment is exactly `comment`.
async fn states_with_comment(config: &SlurmConfig, comment: &str) -> Vec<String> {
    let rows = poll::squeue_all(&runner(config)).await.unwrap();
    rows.into_iter().filter(|r| r.comment == comment).map(|r| r.state).collect()
}

/// Waits until no job with `comment` is live; returns the states they ended in.
async fn gone(config: &SlurmConfig, comment: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let states = states_with_comment(config, comment).await;
        if !states.iter().any(|s| poll::is_live(s)) {
            return states;
        }
        assert!(tokio::time::Instant::now() < deadline, "jobs with comment {comment} still live: {states:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn a_copy_waits_at_its_gate_holding_its_nodes_and_runs_once_under_its_grant() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, mut events) = started(&config).await;
    let mut copies = backend.copy_events().expect("copy events");
    let fills = assignment("fills", 4, 4, &["sleep", "600"]);
    submit_running(&backend, &mut events, &fills, PATIENCE).await;

    let witness = config.work_dir.join(format!("{}.witness", fills.job_id));
    let job = witnessed("gated", &witness);
    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued, "a repeat queues nothing more");
    let copy_comment = parse::copy_comment_for(&config.job_tag, &job.job_id, 11);
    assert_eq!(states_with_comment(&config, &copy_comment).await, ["PENDING"], "one copy, waiting in Slurm's queue");
    assert!(backend.list().await.unwrap().iter().all(|h| h.job_id != job.job_id), "a copy is no binding");
    assert!(copies.try_recv().is_err(), "not ready while the cluster is full");

    backend.cancel(&fills.job_id, fills.fencing_token).await.unwrap();
    let ready = next_copy_event(&mut copies).await;
    assert_eq!(ready, CopyEvent::Ready { job_id: job.job_id.clone(), copy_token: 11 });
    assert!(witness_lines(&witness).is_empty(), "nothing of the payload ran before the grant");
    assert_eq!(states_with_comment(&config, &copy_comment).await, ["RUNNING"], "Slurm started it: it holds its node");
    let free = backend.inventory().await.unwrap().gpus_free();
    assert_eq!(free, 12, "the copy at its gate holds its 4 GPUs");

    let granted = Assignment { fencing_token: 9, ..job.clone() };
    let grant_sent = std::time::SystemTime::now();
    let call = std::time::Instant::now();
    let admission = backend.grant(11, &granted).await.unwrap();
    let call = call.elapsed();
    assert!(matches!(&admission, Admission::Started { nodes } if nodes.len() == 1), "{admission:?}");
    let held = backend.list().await.unwrap();
    assert!(held.iter().any(|h| h.job_id == job.job_id && h.fencing_token == 9), "the grant is binding 9: {held:?}");
    let end = event_where(&mut events, &job.job_id, PATIENCE, JobPhase::is_terminal).await;
    assert!(matches!(end, JobPhase::Succeeded { .. }), "{end:?}");
    let lines = witness_lines(&witness);
    assert_eq!(lines.len(), 1, "the payload ran once: {lines:?}");
    assert!(lines[0].starts_with("9 n"), "under the grant's token: {lines:?}");
    // What the gate costs (docs/backends.md#sibling-copies); printed, not asserted.
    let started: f64 = lines[0].rsplit(' ').next().and_then(|t| t.parse().ok()).unwrap_or_default();
    let sent = grant_sent.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    eprintln!(
        "slurm copy grant: the call took {call:?}; the payload started {:.0} ms after it began",
        (started - sent) * 1e3
    );
    let logs = backend.logs(&job.job_id, 9, None, 1 << 16).await.unwrap();
    let text = logs.data;
    assert!(text.contains("waiting for the gateway's start lock") && text.contains("running as binding 9"), "{text}");
    assert!(copies.try_recv().is_err(), "a granted copy says nothing more");
    clean(&config).await;
}

/// A backend over the empty test cluster, with its copy events and a witness file.
struct Gated {
    config: SlurmConfig,
    backend: SlurmBackend,
    copies: CopyEventReceiver,
    witness: std::path::PathBuf,
}

impl Gated {
    async fn start(env: &std::collections::BTreeMap<String, String>) -> Self {
        let config = config(env);
        clean(&config).await;
        let (backend, _events) = started(&config).await;
        let copies = backend.copy_events().expect("copy events");
        let witness = config.work_dir.join(format!("{}.witness", config.job_tag));
        Self { config, backend, copies, witness }
    }

    /// Queues copy 11 of a witnessed job on the empty cluster and waits until it is ready.
    async fn ready_copy(&mut self, name: &str) -> Assignment {
        let job = witnessed(name, &self.witness);
        assert_eq!(self.backend.copy(11, &job).await.unwrap(), CopyAdmission::Queued);
        let ready = next_copy_event(&mut self.copies).await;
        assert_eq!(ready, CopyEvent::Ready { job_id: job.job_id.clone(), copy_token: 11 });
        job
    }
}

#[tokio::test]
async fn a_dropped_copy_is_gone_from_slurm_and_a_new_backend_cancels_the_copies_left_behind() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut g = Gated::start(&env).await;
    let (config, witness) = (g.config.clone(), g.witness.clone());

    // Ready at its gate, then dropped: cancelled in Slurm, and nothing of it ran.
    let dropped = g.ready_copy("dropped").await;
    let backend = g.backend;
    backend.drop_copy(&dropped.job_id, 12).await.unwrap();
    let comment = parse::copy_comment_for(&config.job_tag, &dropped.job_id, 11);
    assert_eq!(states_with_comment(&config, &comment).await, ["RUNNING"], "a drop of another copy changes nothing");
    backend.drop_copy(&dropped.job_id, 11).await.unwrap();
    backend.drop_copy(&dropped.job_id, 11).await.unwrap();
    let cancelled = parse::cancelled_comment_for(&config.job_tag, &dropped.job_id, 11);
    assert!(states_with_comment(&config, &comment).await.is_empty(), "its comment no longer says copy");
    let ended = gone(&config, &cancelled).await;
    assert_eq!(ended, ["CANCELLED"], "squeue shows it cancelled, nothing live");

    // A copy the agent left when it stopped is cancelled by the next backend.
    let left = witnessed("left", &witness);
    assert_eq!(backend.copy(12, &left).await.unwrap(), CopyAdmission::Queued);
    drop(backend);
    let (_backend, _events) = started(&config).await;
    let left_comment = parse::copy_comment_for(&config.job_tag, &left.job_id, 12);
    assert!(states_with_comment(&config, &left_comment).await.is_empty());
    gone(&config, &parse::cancelled_comment_for(&config.job_tag, &left.job_id, 12)).await;
    assert!(witness_lines(&witness).is_empty(), "no copy ran: {:?}", witness_lines(&witness));
    clean(&config).await;
}

#[tokio::test]
async fn a_grant_cut_short_after_the_comment_runs_once_and_the_next_backend_adopts_it() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let mut g = Gated::start(&env).await;
    let (config, witness) = (g.config.clone(), g.witness.clone());
    let job = g.ready_copy("cut").await;
    let backend = g.backend;

    // The agent stopped right after the grant's one write: the comment names binding 9, and no
    // signal was sent. The gate finds the grant at its next look.
    let comment = parse::copy_comment_for(&config.job_tag, &job.job_id, 11);
    let runner = runner(&config);
    let rows = poll::squeue_all(&runner).await.unwrap();
    let slurm_id = rows.iter().find(|r| r.comment == comment).map(|r| r.slurm_id.clone()).expect("the copy's row");
    let binding = format!("Comment={}", parse::comment_for(&config.job_tag, &job.job_id, 9));
    let out = runner.run("scontrol", &args(&["update", &format!("JobId={slurm_id}"), &binding]), None).await.unwrap();
    assert!(out.success(), "{}", out.message());
    drop(backend);

    let (backend, mut events) = started(&config).await;
    let held = backend.list().await.unwrap();
    assert!(held.iter().any(|h| h.job_id == job.job_id && h.fencing_token == 9), "adopted as binding 9: {held:?}");
    let end = event_where(&mut events, &job.job_id, PATIENCE, JobPhase::is_terminal).await;
    assert!(matches!(end, JobPhase::Succeeded { .. }), "{end:?}");
    let lines = witness_lines(&witness);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("9 n"), "it ran once, under binding 9: {lines:?}");
    clean(&config).await;
}
