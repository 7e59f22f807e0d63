//! Power-loss tests: disk faults at every position of a run of commits, then a crash and a reopen.
//!
//! The promise under test: every commit acknowledged with `Ok` is present after power loss with
//! its value, a failed batch is all or nothing, and after the first failure every commit fails.

use std::collections::BTreeMap;

use super::*;
use crate::testing::SimulatedDisk;

type Entries = BTreeMap<String, Vec<u8>>;

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The n-th fsync after the store opened fails.
    FailSync(u64),
    /// The n-th write after the store opened is torn.
    TearWrite(u64),
    /// After n writes the disk is full.
    DiskFullAfter(u64),
}

#[derive(Clone, Copy, Debug)]
enum PowerLoss {
    /// Only synced pages survive.
    Clean,
    /// A random subset of unsynced pages reached the disk too.
    WithWriteback,
}

/// A little deterministic generator for the workload.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// Twelve batches of 1 to 6 writes over 20 keys: puts of 100 B to 6 KiB values (some span pages)
/// and deletes, so a partly applied batch would show.
fn workload(seed: u64) -> Vec<Vec<Write>> {
    let mut random = Random(seed);
    (0..12)
        .map(|commit| {
            (0..1 + random.below(6))
                .map(|index| {
                    let key = format!("jobs/{:02}", random.below(20));
                    if random.below(5) == 0 {
                        Write::delete(key)
                    } else {
                        let size = 100 + random.below(6000) as usize;
                        let mut value = format!("commit {commit} write {index} ").into_bytes();
                        value.resize(size, b'a' + (commit % 26) as u8);
                        Write::put(key, value)
                    }
                })
                .collect()
        })
        .collect()
}

fn apply_to(entries: &mut Entries, batch: &[Write]) {
    for write in batch {
        match write {
            Write::Put { key, value } => {
                entries.insert(key.clone(), value.clone());
            }
            Write::Delete { key } => {
                entries.remove(key);
            }
        }
    }
}

/// What a run saw: whether a commit failed, and the operations the disk performed.
struct Run {
    failed: bool,
    counts: crate::testing::DiskCounts,
}

/// Opens a store on a fresh simulated disk, arms `fault` (if any), commits the workload, loses
/// power, reopens, and checks the promise. Returns what happened, for the caller's own checks.
async fn run(seed: u64, fault: Option<Fault>, power_loss: PowerLoss) -> Run {
    let context = format!("seed {seed}, {fault:?}, {power_loss:?}");
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new(seed);
    let store = RedbStore::open_with_backend(dir.path(), disk.clone()).unwrap();
    let opened = disk.counts();
    match fault {
        Some(Fault::FailSync(nth)) => disk.fail_sync(nth),
        Some(Fault::TearWrite(nth)) => disk.tear_write(nth),
        Some(Fault::DiskFullAfter(writes)) => disk.fill_after_writes(writes),
        None => {}
    }

    let mut acknowledged = Entries::new();
    let mut failed: Option<(Vec<Write>, String)> = None;
    for batch in workload(seed) {
        match store.commit(batch.clone()).await {
            Ok(()) => {
                assert!(failed.is_none(), "{context}: a commit succeeded after a failure");
                apply_to(&mut acknowledged, &batch);
            }
            Err(Error::Failed { cause }) => match &failed {
                None => failed = Some((batch, cause)),
                Some((_, first)) => assert_eq!(&cause, first, "{context}: later failures name the first cause"),
            },
            Err(other) => panic!("{context}: expected Failed, got {other}"),
        }
    }
    if let Some((_, cause)) = &failed {
        assert_eq!(store.failure().as_ref(), Some(cause), "{context}");
        assert!(matches!(store.scan("").await, Err(Error::Failed { .. })), "{context}: a failed store refuses scans");
    } else {
        assert_eq!(store.failure(), None, "{context}");
    }
    let counts = disk.counts();
    let counts =
        crate::testing::DiskCounts { writes: counts.writes - opened.writes, syncs: counts.syncs - opened.syncs };

    let rebooted = match power_loss {
        PowerLoss::Clean => disk.crash(),
        PowerLoss::WithWriteback => disk.crash_with_writeback(),
    };
    drop(store);
    let reopened = match RedbStore::open_with_backend(dir.path(), rebooted) {
        Ok(store) => store,
        Err(error) => panic!("{context}: the store must reopen after power loss: {error}"),
    };
    let found: Entries = reopened.scan("").await.unwrap().into_iter().collect();
    let mut with_failed_batch = acknowledged.clone();
    if let Some((batch, _)) = &failed {
        apply_to(&mut with_failed_batch, batch);
    }
    assert!(
        found == acknowledged || found == with_failed_batch,
        "{context}: after power loss the store holds neither exactly the acknowledged commits nor those plus the \
         whole failed batch; found keys {:?}, acknowledged {:?}",
        found.keys().collect::<Vec<_>>(),
        acknowledged.keys().collect::<Vec<_>>()
    );
    // The reopened store works.
    reopened.commit(vec![Write::put("jobs/after", b"reboot".to_vec())]).await.unwrap();
    Run { failed: failed.is_some(), counts }
}

#[tokio::test]
async fn without_faults_every_commit_is_acknowledged_and_survives_power_loss() {
    for seed in 0..4 {
        let run = run(seed, None, PowerLoss::Clean).await;
        assert!(!run.failed);
        assert!(run.counts.syncs >= 12, "each commit syncs at least once: {} syncs", run.counts.syncs);
    }
}

/// Runs `fault_at(position)` for every position up to `limit(counts)` (one past what a fault-free
/// run performs), for `seeds` workloads, alternating the two kinds of power loss; returns (cases,
/// runs in which a commit failed).
async fn sweep(
    seeds: u64,
    fault_at: impl Fn(u64) -> Fault,
    limit: impl Fn(crate::testing::DiskCounts) -> u64,
) -> (u64, u64) {
    let (mut cases, mut failures) = (0, 0);
    for seed in 0..seeds {
        let baseline = run(seed, None, PowerLoss::Clean).await.counts;
        for position in 0..=limit(baseline) {
            let power_loss = if position % 2 == 0 { PowerLoss::Clean } else { PowerLoss::WithWriteback };
            let fault = fault_at(position);
            let outcome = run(seed, Some(fault), power_loss).await;
            cases += 1;
            failures += u64::from(outcome.failed);
        }
    }
    (cases, failures)
}

#[tokio::test]
async fn a_failed_fsync_at_any_commit_loses_no_acknowledged_record() {
    let seeds = 6;
    let (cases, failures) = sweep(seeds, |position| Fault::FailSync(position + 1), |counts| counts.syncs).await;
    // Every fault aimed at an fsync the run performs must surface; the last position per seed is
    // past the end.
    assert!(cases > 100, "{cases} cases");
    assert_eq!(failures, cases - seeds, "{failures} of {cases} runs saw their fault");
}

#[tokio::test]
async fn a_torn_write_at_any_position_loses_no_acknowledged_record() {
    let seeds = 3;
    let (cases, failures) = sweep(seeds, |position| Fault::TearWrite(position + 1), |counts| counts.writes).await;
    assert!(cases > 100, "{cases} cases");
    assert_eq!(failures, cases - seeds, "{failures} of {cases} runs saw their fault");
}

#[tokio::test]
async fn a_disk_that_fills_at_any_position_loses_no_acknowledged_record() {
    let seeds = 3;
    let (cases, failures) = sweep(seeds, Fault::DiskFullAfter, |counts| counts.writes).await;
    assert!(cases > 100, "{cases} cases");
    assert_eq!(failures, cases - seeds, "{failures} of {cases} runs saw their fault");
}
