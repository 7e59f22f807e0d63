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
//! The holder's plan is recomputed once per pass (sorting the running jobs by estimated end).

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

    /// Starts the reservation's holder if it fits now, else recomputes its plan from the current
    /// running jobs. Drops a reservation whose holder is no longer pending.
    fn start_or_replan_holder(&mut self, now: Duration) -> Option<Started> {
        let held = self.reservation.take()?;
        let job = &self.queues.get(held.queue)?.pending.get(&held.key)?.job;
        // The reservation is taken out, so the holder is placed on everything free.
        if let Some(placement) = self.place_now(job, now) {
            return self.start_pending(held.queue, &held.key, placement, now);
        }
        let plan = self.plan(job, now)?;
        self.reservation = Some(Held { plan, ..held });
        None
    }

    /// Gives the member's reservation to the pending job at `key` of `queue`.
    fn reserve(&mut self, queue: usize, key: &PendingKey, now: Duration) {
        let Some(pending) = self.queues.get(queue).and_then(|q| q.pending.get(key)) else { return };
        if let Some(plan) = self.plan(&pending.job, now) {
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
