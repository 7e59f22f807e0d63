//! A scheduling pass: which pending jobs start now, under fair share, the queues' policies and
//! the member's reservation.
//!
//! **Order.** The pass first tries the job holding the member's reservation, if any. Then it
//! repeatedly offers the queue with the smallest weighted share (see `fairshare.rs`) its next
//! startable job, recomputing the order after every start, until no queue can start anything.
//! Inside a queue, jobs are visited in queue order (priority, submit time, id), and what happens
//! to a job that cannot start is the queue's policy:
//! - `strict`: the queue is done for the pass (its head blocks it);
//! - `bestEffort`: the job is passed over and the next one tried;
//! - `backfill`: the same, but if no job holds the reservation yet, this one takes it (see
//!   `reservation.rs` for the plan).
//!
//! **Reservation and fair share.** There is one reservation per member, as Slurm keeps one per
//! partition under EASY backfill. Fair share decides who gets it: the first job of a `backfill`
//! queue that cannot start, in the order above, which puts the queue with the smallest share
//! first. Once held, the reservation is *sticky*: it stays with that job until the job starts or
//! is cancelled, and the job goes first in every pass. While it is held, every other start (any
//! queue and policy, `schedule` or `start_now`) must end by the reservation's start or leave the
//! reserved resources free. Re-picking the holder every pass would let fair share, whose order
//! shifts at every start and end, hand the reservation from queue to queue so that no holder is
//! ever protected. A member whose queues are all `strict` never reserves and behaves as a
//! strict-FIFO scheduler.
//!
//! **Cost.** Within a pass free resources only shrink and the reservation only tightens, so a job
//! that cannot start cannot start later in the same pass: each queue keeps a cursor and each
//! pending job is visited at most once per pass. A job is rejected without a placement attempt
//! when its gang needs more GPUs than are free, or when a job of the same shape already failed in
//! the pass under the same or looser rules; the pass ends a queue at once when no GPU is free.
//! The holder's plan (sorting the running jobs by estimated end) is made again only when a job
//! ended before its estimate or the planned start has passed; otherwise it stays valid, since
//! starts since then kept to its spare.

use std::ops::Bound;
use std::time::Duration;

use super::fairshare::{PendingKey, queues_by_share};
use super::reservation::Held;
use super::scheduler::BuiltinScheduler;
use super::{LocalJob, QueuePolicy, Started};

/// Most distinct job shapes a pass remembers as not startable; beyond it, jobs are simply tried.
const MAX_FAILED_SHAPES: usize = 64;

/// What [`BuiltinScheduler::scan`] found in a queue.
enum Scan {
    /// This job can start now on these nodes.
    Start(PendingKey, Vec<usize>),
    /// This job cannot start and should take the member's reservation.
    Reserve(PendingKey),
    /// Nothing more can start from the queue in this pass; the cursor is where the scan ended.
    Done(Option<PendingKey>),
}

/// Job shapes that could not be placed earlier in the pass. A shape that failed under the plain
/// free resources fails for every job later in the pass; one that failed under the reservation's
/// limits fails for every job that would run past the reservation's start.
#[derive(Default)]
struct FailedShapes {
    /// The shapes and whether they failed under the reservation's limits (`true`) or the plain
    /// free resources (`false`).
    shapes: Vec<(LocalJob, bool)>,
}

impl FailedShapes {
    /// Whether `job`, limited by the reservation if `limited`, is known not to fit.
    fn known(&self, job: &LocalJob, limited: bool) -> bool {
        self.shapes.iter().any(|(shape, under_limits)| (limited || !under_limits) && same_shape(shape, job))
    }

    /// Remembers that `job` did not fit, limited by the reservation if `limited`.
    fn remember(&mut self, job: &LocalJob, limited: bool) {
        if self.shapes.len() < MAX_FAILED_SHAPES {
            let shape = LocalJob { id: String::new(), queue: String::new(), ..job.clone() };
            self.shapes.push((shape, limited));
        }
    }
}

/// Whether two jobs ask for the same resources on the same kinds of nodes, so one fits exactly
/// when the other does.
fn same_shape(a: &LocalJob, b: &LocalJob) -> bool {
    a.replicas == b.replicas
        && a.gpus == b.gpus
        && a.cpu == b.cpu
        && a.memory_gib == b.memory_gib
        && a.gpu_memory_gib == b.gpu_memory_gib
        && a.gpu_types == b.gpu_types
        && a.node_selector == b.node_selector
}

impl BuiltinScheduler {
    /// Starts whatever pending jobs the policies allow now, in the order they start (see the
    /// module docs for the order, the policies and the reservation).
    pub fn schedule(&mut self, now: Duration) -> Vec<Started> {
        self.advance_to(now);
        let mut started = Vec::new();
        if let Some(job) = self.start_or_replan_holder(now) {
            started.push(job);
        }
        let mut done = vec![false; self.queues.len()];
        let mut cursors: Vec<Option<PendingKey>> = vec![None; self.queues.len()];
        let mut failed = FailedShapes::default();
        'rounds: loop {
            for queue in queues_by_share(&self.queues, &self.totals, &done) {
                loop {
                    match self.scan(queue, cursors[queue].as_ref(), now, &mut failed) {
                        Scan::Start(key, placement) => {
                            if let Some(job) = self.start_pending(queue, &key, placement, now) {
                                started.push(job);
                            }
                            cursors[queue] = Some(key);
                            // Shares changed: recompute the order.
                            continue 'rounds;
                        }
                        Scan::Reserve(key) => {
                            self.reserve(queue, &key, now);
                            cursors[queue] = Some(key);
                        }
                        Scan::Done(cursor) => {
                            cursors[queue] = cursor;
                            done[queue] = true;
                            break;
                        }
                    }
                }
            }
            return started;
        }
    }

    /// Starts the reservation's holder if it fits now. Otherwise keeps its plan, or plans again
    /// when a job ended before its estimate or the planned start has passed (a job overran).
    /// Drops a reservation whose holder is no longer pending.
    fn start_or_replan_holder(&mut self, now: Duration) -> Option<Started> {
        let held = self.reservation.take()?;
        let job = &self.queues.get(held.queue)?.pending.get(&held.key)?.job;
        // The reservation is taken out, so the holder is placed on everything free.
        if let Some(placement) = self.place_now(job, now) {
            return self.start_pending(held.queue, &held.key, placement, now);
        }
        if !self.replan && now <= held.plan.at {
            // Nothing since the plan can make it earlier: ends at their estimates leave the
            // projection as it was, and starts since then kept to the spare.
            self.reservation = Some(held);
            return None;
        }
        let plan = self.plan(job, now)?;
        self.replan = false;
        self.reservation = Some(Held { plan, ..held });
        None
    }

    /// Gives the member's reservation to the pending job at `key` of `queue`.
    fn reserve(&mut self, queue: usize, key: &PendingKey, now: Duration) {
        let Some(pending) = self.queues.get(queue).and_then(|q| q.pending.get(key)) else { return };
        if let Some(plan) = self.plan(&pending.job, now) {
            self.replan = false;
            self.reservation = Some(Held { job_id: pending.job.id.clone(), queue, key: key.clone(), plan });
        }
    }

    /// Looks through `queue` after `cursor` for the next job that can start now, following the
    /// queue's policy for jobs that cannot.
    fn scan(&self, queue: usize, cursor: Option<&PendingKey>, now: Duration, failed: &mut FailedShapes) -> Scan {
        let state = &self.queues[queue];
        let policy = state.policy;
        let after = cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = cursor;
        for (key, pending) in state.pending.range((after, Bound::Unbounded)) {
            let job = &pending.job;
            let holder = self.reservation.as_ref().is_some_and(|held| held.job_id == job.id);
            if !holder {
                let limited = self.reservation.as_ref().is_some_and(|held| !held.plan.ends_in_time(now, job.run_for));
                if !failed.known(job, limited) {
                    if let Some(placement) = self.place_now(job, now) {
                        return Scan::Start(key.clone(), placement);
                    }
                    if job.total_gpus() <= self.free_gpus {
                        failed.remember(job, limited);
                    }
                }
            }
            match policy {
                QueuePolicy::Strict => return Scan::Done(last.cloned()),
                QueuePolicy::Backfill if self.reservation.is_none() => return Scan::Reserve(key.clone()),
                QueuePolicy::BestEffort | QueuePolicy::Backfill => {}
            }
            last = Some(key);
            if self.free_gpus == 0 {
                // Nothing can start, and the reservation (if the queue could take one) is held.
                break;
            }
        }
        Scan::Done(last.cloned())
    }
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::testkit::{job, node};
    use super::super::{Cancelled, Error, QueueSpec, Reservation};
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn queue(name: &str, policy: QueuePolicy) -> QueueSpec {
        QueueSpec { policy, ..QueueSpec::new(name, 1.0) }
    }

    fn ids(started: Vec<Started>) -> Vec<String> {
        started.into_iter().map(|s| s.job_id).collect()
    }

    /// Nodes `a` and `b` of 8 GPUs; `hog` holds all of `a` until 100 s; a 2×8 `gang` waits for
    /// both nodes, and behind it come `short` (1×8, ends at 50 s) and `long` (1×1, ends at 300 s).
    fn blocked_gang(policy: QueuePolicy) -> BuiltinScheduler {
        let mut s = BuiltinScheduler::new(vec![node("a", 8), node("b", 8)], vec![queue("default", policy)]).unwrap();
        s.start_now(job("hog", "default", 1, 8, 100), secs(0)).unwrap();
        s.submit(job("gang", "default", 2, 8, 100), secs(1)).unwrap();
        s.submit(job("long", "default", 1, 1, 300), secs(2)).unwrap();
        s.submit(job("short", "default", 1, 8, 50), secs(3)).unwrap();
        s
    }

    #[test]
    fn strict_head_blocks_every_job_behind_it() {
        let mut s = blocked_gang(QueuePolicy::Strict);
        assert!(s.schedule(secs(0)).is_empty());
        assert_eq!(s.reservation(), None, "strict queues never reserve");
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["gang"]);
    }

    #[test]
    fn best_effort_passes_the_blocked_job_and_reserves_nothing() {
        let mut s = blocked_gang(QueuePolicy::BestEffort);
        assert_eq!(ids(s.schedule(secs(0))), ["long"], "long fits on b; short no longer does");
        assert_eq!(s.reservation(), None);
        // No reservation: the gang waits for `long` too, until 300 s.
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["short"], "short overtakes the gang again");
        s.complete_due(secs(300));
        assert_eq!(ids(s.schedule(secs(300))), ["gang"]);
    }

    #[test]
    fn backfill_reserves_for_the_head_and_passes_only_a_job_that_ends_in_time() {
        let mut s = blocked_gang(QueuePolicy::Backfill);
        assert_eq!(ids(s.schedule(secs(0))), ["short"], "short ends at 50 s, before the gang's 100 s; long would not");
        assert_eq!(
            s.reservation(),
            Some(Reservation { job_id: "gang".into(), starts_at: secs(100), nodes: vec!["a".into(), "b".into()] })
        );
        s.complete_due(secs(50));
        assert!(s.schedule(secs(50)).is_empty(), "long would still hold b at 100 s");
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["gang"]);
        assert_eq!(s.reservation().map(|r| (r.job_id, r.starts_at)), Some(("long".to_string(), secs(200))));
        s.complete_due(secs(200));
        assert_eq!(ids(s.schedule(secs(200))), ["long"]);
    }

    #[test]
    fn backfill_lets_a_long_job_use_nodes_the_reservation_does_not_need() {
        let mut s = BuiltinScheduler::new(
            vec![node("a", 8), node("b", 8), node("c", 8)],
            vec![queue("default", QueuePolicy::Backfill)],
        )
        .unwrap();
        s.start_now(job("hog-a", "default", 1, 8, 100), secs(0)).unwrap();
        s.start_now(job("hog-b", "default", 1, 4, 300), secs(0)).unwrap();
        s.submit(job("gang", "default", 2, 8, 100), secs(1)).unwrap();
        s.submit(job("long", "default", 1, 4, 1_000), secs(2)).unwrap();
        s.submit(job("too-long", "default", 1, 1, 1_000), secs(3)).unwrap();
        let started = s.schedule(secs(3));
        assert_eq!(started.len(), 1);
        assert_eq!((started[0].job_id.as_str(), started[0].nodes.as_slice()), ("long", &["b".to_string()][..]));
        assert_eq!(s.reservation().unwrap().nodes, ["a", "c"], "b is busy until 300 s, so the gang takes a and c");
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["gang"]);
    }

    #[test]
    fn backfill_lets_a_long_job_use_only_the_spare_of_a_reserved_node() {
        let mut s = BuiltinScheduler::new(vec![node("a", 8)], vec![queue("default", QueuePolicy::Backfill)]).unwrap();
        s.start_now(job("hog", "default", 1, 4, 100), secs(0)).unwrap();
        // The head needs 6 GPUs: at 100 s, 8 are free, so 2 are spare.
        s.submit(job("head", "default", 1, 6, 100), secs(1)).unwrap();
        s.submit(job("long-1", "default", 1, 2, 1_000), secs(2)).unwrap();
        s.submit(job("long-2", "default", 1, 2, 1_000), secs(3)).unwrap();
        s.submit(job("short", "default", 1, 2, 40), secs(4)).unwrap();
        assert_eq!(ids(s.schedule(secs(4))), ["long-1", "short"]);
        assert_eq!(s.reservation().unwrap().starts_at, secs(100));
        assert!(
            matches!(s.start_now(job("offer", "default", 1, 1, 1_000), secs(5)), Err(Error::DoesNotFitNow { .. })),
            "the offer path respects the reservation too"
        );
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["head"]);
        s.complete_due(secs(1_004));
        assert_eq!(ids(s.schedule(secs(1_004))), ["long-2"]);
    }

    #[test]
    fn a_strict_queue_does_not_reserve_but_respects_another_queues_reservation() {
        let mut s = BuiltinScheduler::new(
            vec![node("a", 8), node("b", 8)],
            vec![queue("batch", QueuePolicy::Backfill), queue("prod", QueuePolicy::Strict)],
        )
        .unwrap();
        s.start_now(job("hog", "batch", 1, 8, 100), secs(0)).unwrap();
        s.submit(job("gang", "batch", 2, 8, 100), secs(1)).unwrap();
        assert!(s.schedule(secs(1)).is_empty());
        assert_eq!(s.reservation().unwrap().job_id, "gang");
        // prod's head would still run at 100 s on reserved b, so it waits, and being strict it
        // blocks prod-short, which would have ended in time.
        s.submit(job("prod-long", "prod", 1, 1, 500), secs(2)).unwrap();
        s.submit(job("prod-short", "prod", 1, 1, 10), secs(3)).unwrap();
        assert!(s.schedule(secs(3)).is_empty());
        assert_eq!(s.reservation().unwrap().job_id, "gang");
        s.complete_due(secs(100));
        assert_eq!(ids(s.schedule(secs(100))), ["gang"]);
    }

    #[test]
    fn the_reservation_stays_with_its_holder_until_it_starts_or_is_cancelled() {
        let mut s = BuiltinScheduler::new(
            vec![node("a", 8), node("b", 8)],
            vec![queue("x", QueuePolicy::Backfill), queue("y", QueuePolicy::Backfill)],
        )
        .unwrap();
        s.start_now(job("hog", "x", 1, 8, 100), secs(0)).unwrap();
        s.submit(job("gang-y", "y", 2, 8, 100), secs(1)).unwrap();
        assert!(s.schedule(secs(1)).is_empty());
        assert_eq!(s.reservation().unwrap().job_id, "gang-y");
        // A more urgent gang in x, whose share is now the smaller one after hog is cancelled,
        // does not take the reservation over.
        let mut urgent = job("gang-x", "x", 2, 8, 100);
        urgent.priority = 90;
        s.submit(urgent, secs(2)).unwrap();
        assert!(s.schedule(secs(2)).is_empty());
        assert_eq!(s.reservation().unwrap().job_id, "gang-y");
        s.cancel("hog");
        assert_eq!(ids(s.schedule(secs(3))), ["gang-y"], "the holder goes first");
        assert_eq!(s.reservation().unwrap().job_id, "gang-x");
        assert_eq!(s.cancel("gang-x"), Cancelled::WasPending);
        assert_eq!(s.reservation(), None);
    }

    #[test]
    fn a_job_past_its_estimate_is_expected_to_run_on_by_the_overdue_model() {
        let mut s = BuiltinScheduler::new(vec![node("a", 8)], vec![queue("default", QueuePolicy::Backfill)]).unwrap();
        s.start_now(job("hog", "default", 1, 8, 100), secs(0)).unwrap();
        s.submit(job("head", "default", 1, 8, 100), secs(1)).unwrap();
        // hog has run 150 s of its 100 s estimate: it is expected to run on for half its age
        // (75 s), as the member reports it, not to end now.
        assert!(s.schedule(secs(150)).is_empty());
        assert_eq!(s.reservation().unwrap().starts_at, secs(225));
    }
}
