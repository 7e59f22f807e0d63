//! Tests against a real Slurm, started by `scripts/slurm/up.sh DIR` (which `scripts/test.sh`
//! runs). They read the file named by `MERIDIAN_SLURM_ENV` (`DIR/env`, written by up.sh); when
//! it is not set they fail, unless `MERIDIAN_SKIP_SLURM=1` says to skip them. They share one
//! cluster, so they run one at a time (a static lock) and cancel their leftovers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::protocol::Assignment;
use meridian_proto::spec::JobSpec;
use tokio::sync::mpsc;

use super::*;
use crate::backend::conformance;
use crate::backend::{InventorySource, JobEventReceiver, LocalBackend};

pub(super) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
pub(super) const PATIENCE: Duration = Duration::from_secs(90);

/// The test cluster's facts from `MERIDIAN_SLURM_ENV`, or None when the tests are skipped.
pub(super) fn cluster() -> Option<BTreeMap<String, String>> {
    if std::env::var("MERIDIAN_SKIP_SLURM").is_ok_and(|v| v == "1") {
        eprintln!("skipped: MERIDIAN_SKIP_SLURM=1 (no real Slurm)");
        return None;
    }
    let Ok(path) = std::env::var("MERIDIAN_SLURM_ENV") else {
        panic!(
            "these tests need a real Slurm: run `scripts/test.sh` (it starts one with scripts/slurm/up.sh and \
             sets MERIDIAN_SLURM_ENV), or run `scripts/slurm/up.sh DIR` and set MERIDIAN_SLURM_ENV=DIR/env, \
             or set MERIDIAN_SKIP_SLURM=1 to skip them"
        )
    };
    Some(super::read_env_file(std::path::Path::new(&path)).unwrap_or_else(|e| panic!("MERIDIAN_SLURM_ENV={path}: {e}")))
}

pub(super) fn config(env: &BTreeMap<String, String>) -> SlurmConfig {
    SlurmConfig {
        partition: Some("gpu".into()),
        gpu_types: [("a100".to_string(), "a100-80g".to_string())].into(),
        work_dir: PathBuf::from(&env["MERIDIAN_SLURM_DIR"]).join("work"),
        bin_dir: env.get("MERIDIAN_SLURM_BIN_DIR").map(PathBuf::from),
        slurm_conf: Some(PathBuf::from(&env["SLURM_CONF"])),
        poll_interval: HumanDuration::from_secs(1),
        // Each test its own tag: finished jobs of earlier tests stay visible for MinJobAge.
        job_tag: unique("mt").replace('-', "x"),
        ..SlurmConfig::default()
    }
}

/// Cancels every live job on the test cluster and waits until none is left.
pub(super) async fn clean(config: &SlurmConfig) {
    let runner = Runner { bin_dir: config.bin_dir.clone(), slurm_conf: config.slurm_conf.clone(), timeout: PATIENCE };
    runner.run("scancel", &args(&["--user=root"]), None).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = poll::squeue_all(&runner).await.unwrap();
        if !rows.iter().any(|r| poll::is_live(&r.state)) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "leftover jobs did not end: {rows:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A job id no earlier run used (finished jobs stay visible for MinJobAge).
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

pub(super) fn assignment(name: &str, replicas: u32, gpus: u32, command: &[&str]) -> Assignment {
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": name, "tenant": "team",
        "gang": {"replicas": replicas, "resources": {"gpus": gpus, "gpuTypes": ["a100-80g"], "cpu": 1, "memoryGiB": 1}},
        "payload": {"command": command}
    }))
    .unwrap();
    Assignment { job_id: unique(name), fencing_token: 3, spec, last_preempted_at_ms: None }
}

/// Every field of the conformance suite's (extended) Subject, for the real Slurm.
struct Fixture {
    backend: Arc<SlurmBackend>,
    events: JobEventReceiver,
    runs: Assignment,
    fills: Assignment,
    succeeds: Assignment,
    fails: Assignment,
    never_fits: Assignment,
    reopen: Box<dyn Fn() -> conformance::Reopened + Send + Sync>,
    adopts: bool,
    keeps_logs: bool,
    patience: Duration,
}

async fn fixture(config: SlurmConfig) -> Fixture {
    let (tx, events) = mpsc::unbounded_channel();
    let backend = Arc::new(SlurmBackend::new(config.clone(), "slurm-test".into(), tx).await.unwrap());
    let reopen_config = config.clone();
    Fixture {
        backend,
        events,
        runs: assignment("runs", 1, 1, &["sleep", "600"]),
        fills: assignment("fills", 4, 4, &["sleep", "600"]),
        succeeds: assignment("succeeds", 1, 1, &["sh", "-c", "echo hello; exit 0"]),
        fails: assignment("fails", 1, 1, &["sh", "-c", "echo oops >&2; exit 3"]),
        never_fits: assignment("never", 1, 5, &["true"]),
        reopen: Box::new(move || {
            let config = reopen_config.clone();
            Box::pin(async move {
                let (tx, rx) = mpsc::unbounded_channel();
                let backend = Arc::new(SlurmBackend::new(config, "slurm-test".into(), tx).await.unwrap());
                (backend.clone() as Arc<dyn LocalBackend>, backend as Arc<dyn InventorySource>, rx)
            })
        }),
        adopts: true,
        keeps_logs: true,
        patience: PATIENCE,
    }
}

/// A backend over the test cluster, and its job events.
pub(super) async fn started(config: &SlurmConfig) -> (SlurmBackend, JobEventReceiver) {
    let (tx, events) = mpsc::unbounded_channel();
    (SlurmBackend::new(config.clone(), "slurm-test".into(), tx).await.unwrap(), events)
}

/// Submits `job` and waits until its whole gang runs (at once, or by its event).
pub(super) async fn submit_running(
    backend: &SlurmBackend,
    events: &mut JobEventReceiver,
    job: &Assignment,
    patience: Duration,
) {
    let replicas = job.spec.gang.replicas as usize;
    if !matches!(backend.submit(job).await.unwrap(), Admission::Started { .. }) {
        event_where(
            events,
            &job.job_id,
            patience,
            |p| matches!(p, JobPhase::Running { nodes } if nodes.len() == replicas),
        )
        .await;
    }
}

/// The next event of `job_id` that satisfies `wanted`, within `patience`.
pub(super) async fn event_where(
    events: &mut JobEventReceiver,
    job_id: &str,
    patience: Duration,
    wanted: impl Fn(&JobPhase) -> bool,
) -> JobPhase {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no wanted event for `{job_id}` within {patience:?}"))
            .expect("event channel open");
        if event.job_id == job_id && wanted(&event.phase) {
            return event.phase;
        }
    }
}

#[tokio::test]
async fn the_slurm_backend_passes_the_conformance_suite() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let f = fixture(config.clone()).await;
    conformance::run(conformance::Subject {
        backend: f.backend.clone(),
        inventory: f.backend.clone(),
        events: f.events,
        runs: f.runs,
        fills: f.fills,
        succeeds: f.succeeds,
        fails: f.fails,
        never_fits: f.never_fits,
        reopen: f.reopen,
        adopts: f.adopts,
        keeps_logs: f.keeps_logs,
        patience: f.patience,
    })
    .await;
    clean(&config).await;
}

#[tokio::test]
async fn the_empty_cluster_reports_four_a100_nodes_in_two_feature_shapes() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let f = fixture(config.clone()).await;
    let inventory = f.backend.inventory().await.unwrap();
    let names: Vec<&str> = inventory.shapes.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, vec!["a100-80gx4-8c-15g-eth", "a100-80gx4-8c-15g-ib"], "{inventory:?}");
    assert_eq!((inventory.gpus_total(), inventory.gpus_free()), (16, 16));
    assert!(inventory.shapes.iter().all(|s| s.gpu_type == "a100-80g" && s.gpu_memory_gib == 80));
    let labels = f.backend.node_labels().await.unwrap();
    assert_eq!(labels["n1"].get("ib").map(String::as_str), Some("true"));
    assert_eq!(labels["n4"].get("eth").map(String::as_str), Some("true"));
    let pressure = f.backend.pressure().await.unwrap();
    assert_eq!(pressure.pending_jobs(), 0, "{pressure:?}");
}

#[tokio::test]
async fn an_unmapped_gres_type_stops_the_backend_at_start_naming_the_key() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = SlurmConfig { gpu_types: BTreeMap::new(), ..config(&env) };
    let (tx, _rx) = mpsc::unbounded_channel();
    let err = SlurmBackend::new(config, "slurm-test".into(), tx).await.err().expect("a100 is not a Meridian GPU type");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("`a100`") && err.to_string().contains("slurm.gpuTypes"), "{err}");
}

#[tokio::test]
async fn fills_queues_runs_with_slurms_reason_until_it_is_cancelled() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let mut f = fixture(config.clone()).await;
    let backend = f.backend.clone();
    submit_running(&backend, &mut f.events, &f.fills, f.patience).await;
    assert_eq!(backend.inventory().await.unwrap().gpus_free(), 0);
    let queued = backend.submit(&f.runs).await.unwrap();
    assert!(matches!(queued, Admission::Queued { .. }), "{queued:?}");
    let reason = event_where(
        &mut f.events,
        &f.runs.job_id,
        f.patience,
        |p| matches!(p, JobPhase::Pending { reason } if reason == "Slurm: Resources"),
    )
    .await;
    assert!(matches!(reason, JobPhase::Pending { .. }));
    let pressure = backend.pressure().await.unwrap();
    assert_eq!((pressure.pending_jobs(), pressure.pending_gpus()), (1, 1), "{pressure:?}");
    backend.cancel(&f.fills.job_id, f.fills.fencing_token).await.unwrap();
    let started =
        event_where(&mut f.events, &f.runs.job_id, f.patience, |p| matches!(p, JobPhase::Running { .. })).await;
    assert!(matches!(started, JobPhase::Running { nodes } if nodes.len() == 1));
    clean(&config).await;
}

#[tokio::test]
async fn a_two_node_gang_runs_its_command_once_per_replica_with_its_env() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, mut events) = started(&config).await;
    let out = config.work_dir.join(unique("gang-out"));
    let script = format!("echo \"$GREETING on $SLURMD_NODENAME\" >> '{}'", out.display());
    let mut job = assignment("gang", 2, 2, &["sh", "-c", &script]);
    job.spec.payload.env.insert("GREETING".into(), "it's a gang".into());
    backend.submit(&job).await.unwrap();
    let end = event_where(&mut events, &job.job_id, PATIENCE, JobPhase::is_terminal).await;
    assert!(matches!(end, JobPhase::Succeeded { .. }), "{end:?}");
    let mut lines: Vec<String> = std::fs::read_to_string(&out).unwrap().lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("it's a gang on n")), "{lines:?}");
    assert_ne!(lines[0], lines[1], "two different nodes");
}

#[tokio::test]
async fn two_replicas_find_each_other_through_the_coordinator_on_slurm() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, mut events) = started(&config).await;
    let command = conformance::rendezvous_command();
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    let job = assignment("meet", 2, 1, &words);
    let output = conformance::rendezvous(&backend, &mut events, &job, PATIENCE).await;
    // The coordinator is the first node's NodeAddr (127.0.0.1 on this one-host cluster), and
    // the port the agent chose from `coordinatorPorts`.
    let range = config.coordinator_ports;
    let port = output
        .split("listening on 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|port| port.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("rank 0 names 127.0.0.1 and a port: {output}"));
    assert!((range.first..=range.last).contains(&port), "{port} is from {range:?}");
    eprintln!("the rendezvous job's output on Slurm:\n{output}");
    clean(&config).await;
}
