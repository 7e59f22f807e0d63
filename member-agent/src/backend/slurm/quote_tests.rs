//! Start quotes against a real Slurm (`scripts/slurm/up.sh DIR`, found through
//! `MERIDIAN_SLURM_ENV` like the other live tests): `sbatch --test-only` must say when the
//! controller's own plan starts a gang, and submit nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::protocol::Assignment;

use super::live_tests::{ONE_AT_A_TIME, PATIENCE, assignment, clean, cluster, config, started, submit_running};
use super::*;
use crate::backend::LocalBackend;

/// How far a quote may be from the end the test computes from `squeue`: the two are read a
/// moment apart, and Slurm rounds time left and limits to whole seconds.
const SLACK_SECS: u64 = 5;

/// Every Slurm job id `squeue` knows, finished ones included (kept for MinJobAge).
async fn slurm_ids(runner: &Runner) -> BTreeSet<String> {
    poll::squeue_all(runner).await.unwrap().into_iter().map(|row| row.slurm_id).collect()
}

/// Seconds until the time limit of the Slurm job carrying `job_id`'s binding.
async fn time_left(runner: &Runner, tag: &str, job_id: &str) -> u64 {
    let rows = poll::squeue_all(runner).await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.binding(tag).is_some_and(|(id, _)| id == job_id))
        .unwrap_or_else(|| panic!("`{job_id}` is in squeue: {rows:?}"));
    row.time_left_secs.unwrap_or_else(|| panic!("`{job_id}` has a time limit: {row:?}"))
}

/// A gang to ask a quote for: no binding, so fencing token 0 (as the agent asks).
fn quoted(name: &str, replicas: u32, gpus: u32) -> Assignment {
    Assignment { fencing_token: 0, ..assignment(name, replicas, gpus, &["true"]) }
}

fn assert_near(actual: u64, expected: u64, what: &str) {
    assert!(actual.abs_diff(expected) <= SLACK_SECS, "{what}: quoted {actual}s, expected about {expected}s");
}

#[tokio::test]
async fn a_gang_that_cannot_start_now_is_quoted_when_the_jobs_ahead_end_and_nothing_is_submitted() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, mut events) = started(&config).await;
    let runner = backend.shared.runner.clone();

    // The whole cluster (4 nodes × 4 GPUs) for at most 10 minutes.
    let mut hog = assignment("hog", 4, 4, &["sleep", "900"]);
    hog.spec.runtime.limit = Some(HumanDuration::from_secs(600));
    submit_running(&backend, &mut events, &hog, PATIENCE).await;
    let before = slurm_ids(&runner).await;

    // A two-node gang starts when the hog's limit ends.
    let gang = quoted("gang", 2, 4);
    let quote = backend.quote(&gang).await.unwrap();
    let hog_left = time_left(&runner, &config.job_tag, &hog.job_id).await;
    assert_eq!(quote.basis, "sbatch --test-only", "{quote:?}");
    assert_eq!(quote.starts.len(), 1, "{quote:?}");
    assert_eq!(quote.starts[0].gpu_type, "a100-80g");
    assert!(quote.starts[0].after_secs > 0, "the cluster is full now: {quote:?}");
    assert_near(quote.starts[0].after_secs, hog_left, "a gang behind a 10-minute hog");

    // A job pending ahead (the whole cluster for 5 minutes after the hog) counts too.
    let mut next = assignment("next", 4, 4, &["sleep", "900"]);
    next.spec.runtime.limit = Some(HumanDuration::from_secs(300));
    assert!(matches!(backend.submit(&next).await.unwrap(), Admission::Queued { .. }));
    let with_next = slurm_ids(&runner).await;
    assert_eq!(with_next.len(), before.len() + 1, "`next` is the one new job: the quote submitted nothing");
    let before = with_next;
    let small = quoted("small", 1, 1);
    let quote = backend.quote(&small).await.unwrap();
    let hog_left = time_left(&runner, &config.job_tag, &hog.job_id).await;
    assert_eq!(quote.starts.len(), 1, "{quote:?}");
    assert_near(quote.starts[0].after_secs, hog_left + 300, "a 1-GPU job behind the hog and a 5-minute gang");

    // A gang too big for any node is never; a GPU type the cluster lacks is not asked about.
    let too_big = quoted("too-big", 1, 5);
    let quote = backend.quote(&too_big).await.unwrap();
    assert!(quote.starts.is_empty(), "{quote:?}");
    assert!(quote.basis.contains("Requested node configuration is not available"), "{quote:?}");
    let mut other_type = quoted("h100", 1, 1);
    other_type.spec.gang.resources.gpu_types = vec!["h100".into()];
    assert!(backend.quote(&other_type).await.unwrap().starts.is_empty());

    // Nothing was submitted: squeue knows the same jobs as before the quotes.
    assert_eq!(slurm_ids(&runner).await, before, "a quote submitted a job");
    clean(&config).await;
}

#[tokio::test]
async fn a_gang_that_fits_now_is_quoted_zero_on_every_accepted_type() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, _events) = started(&config).await;
    let before = slurm_ids(&backend.shared.runner).await;
    let mut gang = quoted("fits", 2, 4);
    // No gpuTypes: every whole-GPU type of the cluster (here only a100-80g).
    gang.spec.gang.resources.gpu_types.clear();
    let quote = backend.quote(&gang).await.unwrap();
    assert_eq!(quote.starts.len(), 1, "{quote:?}");
    assert_eq!(quote.starts[0].gpu_type, "a100-80g");
    // The controller says "now" in its own whole second; allow the second to turn over.
    assert!(quote.starts[0].after_secs <= 1, "an idle cluster starts it at once: {quote:?}");
    assert_eq!(slurm_ids(&backend.shared.runner).await, before, "a quote submitted a job");
}

#[tokio::test]
async fn quotes_asked_all_at_once_are_spaced_and_the_overflow_is_busy() {
    let Some(env) = cluster() else { return };
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config(&env);
    clean(&config).await;
    let (backend, _events) = started(&config).await;
    let backend = std::sync::Arc::new(backend);
    let gang = quoted("burst", 1, 1);
    // 30 quotes at 200 ms apart need about 6 s: the later ones are turned away, none hangs.
    let calls: Vec<_> = (0..30)
        .map(|_| {
            let backend = backend.clone();
            let gang = gang.clone();
            tokio::spawn(async move { backend.quote(&gang).await })
        })
        .collect();
    let mut answered = 0;
    let mut busy = 0;
    for call in calls {
        match tokio::time::timeout(Duration::from_secs(30), call).await.unwrap().unwrap() {
            Ok(quote) => {
                assert_eq!(quote.starts.len(), 1, "{quote:?}");
                answered += 1;
            }
            Err(e) => {
                assert!(e.is_transient() && e.to_string().contains("busy"), "{e}");
                busy += 1;
            }
        }
    }
    assert!(answered >= 1 && busy >= 1, "answered {answered}, busy {busy}");
    eprintln!("30 quotes at once: {answered} answered, {busy} busy");
}
