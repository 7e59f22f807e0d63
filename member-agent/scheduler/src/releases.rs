//! When running jobs are expected to give their GPUs back, kept in order as jobs start and end,
//! so a pressure report reads it in one pass instead of sorting every running job each time.
//!
//! A job within its estimate releases at its expected end, so jobs ordered by `ends_at` release
//! in that order. An overdue job is expected to run on for a fraction of its age (`remaining.rs`),
//! so overdue jobs ordered by `started_at`, latest first, release in that order. The report
//! merges the two orders.

use std::time::Duration;

use meridian_proto::inventory::GpuRelease;

use super::remaining::{expected_remaining, is_overdue};

/// One running job as the index sees it. Equal entries are interchangeable: removing any one of
/// them leaves the same index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    /// The sort key: `ends_at` in `by_end`, `started_at` in `by_start`.
    key: Duration,
    /// The other of the two times.
    other: Duration,
    /// GPUs the whole gang holds.
    gpus: u32,
}

/// Running jobs' expected releases, by expected end and by start.
#[derive(Debug, Clone, Default)]
pub(super) struct ReleaseIndex {
    by_end: Vec<Entry>,
    by_start: Vec<Entry>,
}

impl ReleaseIndex {
    /// A job started at `started_at`, expected to end at `ends_at`, holding `gpus`.
    pub(super) fn add(&mut self, started_at: Duration, ends_at: Duration, gpus: u32) {
        insert(&mut self.by_end, Entry { key: ends_at, other: started_at, gpus });
        insert(&mut self.by_start, Entry { key: started_at, other: ends_at, gpus });
    }

    /// The job [`add`](Self::add) recorded with the same values ended.
    pub(super) fn remove(&mut self, started_at: Duration, ends_at: Duration, gpus: u32) {
        remove(&mut self.by_end, Entry { key: ends_at, other: started_at, gpus });
        remove(&mut self.by_start, Entry { key: started_at, other: ends_at, gpus });
    }

    /// Releases per whole second from `now` (each job's expected remaining time rounded up),
    /// ascending, one entry per second with the GPUs of every job releasing then.
    pub(super) fn at(&self, now: Duration) -> Vec<GpuRelease> {
        // Expected to end after now: within their estimate. At or before now: overdue, but for a
        // job with a zero estimate started this very instant (see `is_overdue`).
        let ended = self.by_end.partition_point(|e| e.key <= now);
        let (due, later) = self.by_end.split_at(ended);
        let mut within = due
            .iter()
            .filter(|e| !is_overdue(e.other, e.key, now))
            .chain(later)
            .map(|e| (ceil_secs(e.key.saturating_sub(now)), e.gpus))
            .peekable();
        // Only jobs started before now can be overdue; the latest start has the least left.
        let started = self.by_start.partition_point(|e| e.key < now);
        let mut overdue = self.by_start[..started]
            .iter()
            .rev()
            .filter(|e| e.other <= now)
            .map(|e| (ceil_secs(expected_remaining(e.key, e.other, now)), e.gpus))
            .peekable();
        let mut releases: Vec<GpuRelease> = Vec::with_capacity(self.by_end.len());
        loop {
            let next = match (within.peek(), overdue.peek()) {
                (Some(a), Some(b)) if a.0 <= b.0 => within.next(),
                (Some(_), Some(_)) | (None, Some(_)) => overdue.next(),
                (Some(_), None) => within.next(),
                (None, None) => None,
            };
            let Some((after_secs, gpus)) = next else { break };
            match releases.last_mut() {
                Some(last) if last.after_secs == after_secs => last.gpus = last.gpus.saturating_add(gpus),
                _ => releases.push(GpuRelease { after_secs, gpus }),
            }
        }
        releases
    }
}

fn insert(entries: &mut Vec<Entry>, entry: Entry) {
    let at = entries.partition_point(|e| *e < entry);
    entries.insert(at, entry);
}

fn remove(entries: &mut Vec<Entry>, entry: Entry) {
    if let Ok(at) = entries.binary_search(&entry) {
        entries.remove(at);
    }
}

pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What the index must equal: every job's remaining time, sorted, equal seconds summed.
    fn sorted(jobs: &[(Duration, Duration, u32)], now: Duration) -> Vec<GpuRelease> {
        let mut by_time: Vec<(u64, u32)> =
            jobs.iter().map(|&(start, end, gpus)| (ceil_secs(expected_remaining(start, end, now)), gpus)).collect();
        by_time.sort_unstable();
        let mut releases: Vec<GpuRelease> = Vec::new();
        for (after_secs, gpus) in by_time {
            match releases.last_mut() {
                Some(last) if last.after_secs == after_secs => last.gpus += gpus,
                _ => releases.push(GpuRelease { after_secs, gpus }),
            }
        }
        releases
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn overdue_and_timely_jobs_merge_in_release_order() {
        let mut index = ReleaseIndex::default();
        // Started at 0 with a 100 s estimate: overdue at 300, expected to run on 150 s.
        index.add(secs(0), secs(100), 8);
        // Started at 200 with a 1,000 s estimate: 900 s left at 300.
        index.add(secs(200), secs(1_200), 1);
        // Started at 250 with a 40 s estimate: overdue at 300, the floor of 60 s.
        index.add(secs(250), secs(290), 2);
        // Within its estimate, ending in 60 s too: merged with the floor.
        index.add(secs(100), secs(360), 4);
        // Started now with a zero estimate: expected to end now, not overdue.
        index.add(secs(300), secs(300), 1);
        let releases = index.at(secs(300));
        let pairs: Vec<(u64, u32)> = releases.iter().map(|r| (r.after_secs, r.gpus)).collect();
        assert_eq!(pairs, [(0, 1), (60, 6), (150, 8), (900, 1)]);
        index.remove(secs(0), secs(100), 8);
        let pairs: Vec<(u64, u32)> = index.at(secs(300)).iter().map(|r| (r.after_secs, r.gpus)).collect();
        assert_eq!(pairs, [(0, 1), (60, 6), (900, 1)]);
    }

    proptest! {
        #[test]
        fn the_index_equals_sorting_every_job(
            jobs in prop::collection::vec((0u64..5_000, 0u64..5_000, 1u32..64, 0u32..1_000), 0..60),
            removed in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
            now_ms in 0u64..20_000_000,
        ) {
            let mut kept: Vec<(Duration, Duration, u32)> = jobs
                .iter()
                .map(|&(start, estimate, gpus, ms)| {
                    let started = Duration::from_millis(start * 1_000 + u64::from(ms));
                    (started, started + secs(estimate), gpus)
                })
                .collect();
            let mut index = ReleaseIndex::default();
            for &(start, end, gpus) in &kept {
                index.add(start, end, gpus);
            }
            for pick in removed {
                if kept.is_empty() {
                    break;
                }
                let (start, end, gpus) = kept.remove(pick.index(kept.len()));
                index.remove(start, end, gpus);
            }
            let now = Duration::from_millis(now_ms);
            prop_assert_eq!(index.at(now), sorted(&kept, now));
        }
    }
}
