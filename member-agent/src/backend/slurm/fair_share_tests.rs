//! Fair share through a real Slurm with slurmdbd: `scripts/slurm/up.sh DIR --accounting` (what
//! `scripts/test.sh` starts) gives accounts `teama` (70 shares) and `teamb` (30 shares). The test
//! needs that mode: on a cluster without accounting it fails, unless
//! `MERIDIAN_SKIP_SLURM_FAIR_SHARE=1` says to skip it (or `MERIDIAN_SKIP_SLURM=1` skips every
//! Slurm test).
//!
//! Slurm charges usage at most once a minute (`PriorityCalcPeriod=1`), so the test takes one to
//! three minutes; it polls for the priority change rather than sleeping.

use std::time::{Duration, Instant};

use super::live_tests::{
    ONE_AT_A_TIME, PATIENCE, assignment, clean, cluster, config, event_where, started, submit_running,
};
use super::*;
use crate::backend::LocalBackend;

/// How long Slurm may take to charge teama's usage and recompute the pending jobs' priorities.
const USAGE_PATIENCE: Duration = Duration::from_secs(240);

/// The Slurm priority (`squeue %Q`) of each of `ids`.
async fn priorities(runner: &Runner, ids: &[&str]) -> BTreeMap<String, u64> {
    let text = runner.query("squeue", &args(&["-h", "-j", &ids.join(","), "-o", "%i|%Q"])).await.unwrap();
    text.lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(id, q)| (id.trim().to_string(), q.trim().parse().unwrap_or(0)))
        .collect()
}

fn slurm_id_of(held: &[HeldJob], job_id: &str, tracked: &Shared) -> String {
    assert!(held.iter().any(|h| h.job_id == job_id), "`{job_id}` is held: {held:?}");
    tracked.lock_tracked()[job_id].slurm_id.clone()
}

#[tokio::test]
async fn after_teama_used_the_cluster_slurm_starts_teambs_equal_job_first() {
    let Some(env) = cluster() else { return };
    if env.get("MERIDIAN_SLURM_ACCOUNTING").map(String::as_str) != Some("1") {
        if std::env::var("MERIDIAN_SKIP_SLURM_FAIR_SHARE").is_ok_and(|v| v == "1") {
            eprintln!("skipped: MERIDIAN_SKIP_SLURM_FAIR_SHARE=1 (the test Slurm has no slurmdbd)");
            return;
        }
        panic!(
            "the fair-share test needs the test Slurm in accounting mode (slurmdbd, accounts teama/teamb): \
             start it with `scripts/slurm/up.sh DIR --accounting` (scripts/test.sh does), or set \
             MERIDIAN_SKIP_SLURM_FAIR_SHARE=1 to skip it"
        );
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let began = Instant::now();
    let config = SlurmConfig {
        accounts: [("team-a".to_string(), "teama".to_string()), ("team-b".to_string(), "teamb".to_string())].into(),
        ..config(&env)
    };
    clean(&config).await;
    let (backend, mut events) = started(&config).await;

    // teama takes the whole cluster (16 GPUs) and keeps it until its usage is charged.
    let mut hog = assignment("teama-hog", 4, 4, &["sleep", "600"]);
    hog.spec.tenant = "team-a".into();
    submit_running(&backend, &mut events, &hog, PATIENCE).await;

    // Two equal jobs, each wanting the whole cluster, queue behind it: teama's first, so that
    // without fair share (equal priorities, older job first) teama's would start first.
    let mut a_waits = assignment("teama-waits", 4, 4, &["sleep", "600"]);
    a_waits.spec.tenant = "team-a".into();
    let mut b_waits = assignment("teamb-waits", 4, 4, &["sleep", "600"]);
    b_waits.spec.tenant = "team-b".into();
    assert!(matches!(backend.submit(&a_waits).await.unwrap(), Admission::Queued { .. }));
    assert!(matches!(backend.submit(&b_waits).await.unwrap(), Admission::Queued { .. }));
    let held = backend.list().await.unwrap();
    let a_id = slurm_id_of(&held, &a_waits.job_id, &backend.shared);
    let b_id = slurm_id_of(&held, &b_waits.job_id, &backend.shared);
    let accounts = backend
        .shared
        .runner
        .query("squeue", &args(&["-h", "-j", &format!("{a_id},{b_id}"), "-o", "%i|%a"]))
        .await
        .unwrap();
    assert!(accounts.contains(&format!("{a_id}|teama")) && accounts.contains(&format!("{b_id}|teamb")), "{accounts}");

    // Slurm charges teama's usage within a minute or two; then teamb's job outranks teama's.
    let deadline = tokio::time::Instant::now() + USAGE_PATIENCE;
    let mut seen = priorities(&backend.shared.runner, &[&a_id, &b_id]).await;
    while seen.get(&b_id) <= seen.get(&a_id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "teamb's job never outranked teama's within {USAGE_PATIENCE:?}: priorities {seen:?} (teama {a_id}, teamb {b_id})"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        seen = priorities(&backend.shared.runner, &[&a_id, &b_id]).await;
    }
    eprintln!(
        "priorities after {:?}: teama job {} → {}, teamb job {} → {}",
        began.elapsed(),
        a_id,
        seen[&a_id],
        b_id,
        seen[&b_id]
    );

    // The cluster frees up: Slurm starts teamb's job, and teama's keeps waiting.
    backend.cancel(&hog.job_id, hog.fencing_token).await.unwrap();
    let started = event_where(&mut events, &b_waits.job_id, PATIENCE, |p| matches!(p, JobPhase::Running { .. })).await;
    assert!(matches!(started, JobPhase::Running { nodes } if nodes.len() == 4));
    let held = backend.list().await.unwrap();
    let a_phase = held.iter().find(|h| h.job_id == a_waits.job_id).map(|h| h.phase.clone());
    assert!(matches!(a_phase, Some(JobPhase::Pending { .. })), "teama's job still waits: {a_phase:?}");
    eprintln!("fair share held after {:?}", began.elapsed());
    clean(&config).await;
}
