//! The member's one backfill reservation: which pending job holds it, when and where that job is
//! expected to start, and what a job that would still be running then may take meanwhile.
//!
//! **Planning.** The earliest start of the holder is found by replaying the running jobs' ends in
//! order of their *estimated* end (`started_at + run_for`; a job already past its estimate is, as
//! in the member's reports, expected to run on for `RunningJob::expected_remaining`), giving each one's resources back to a copy of the free nodes, and placing
//! the holder's gang after each distinct end time. The first time the whole gang fits is the
//! reservation's start (`at`), and the nodes of that placement are the reserved nodes.
//!
//! **What a backfilled job may take.** A job that starts now and ends (by its estimate) no later
//! than `at` is free to use anything free: it gives it back in time. A job that would still run at
//! `at` may use a reserved node only up to its *spare*, what the node is expected to have free at
//! `at` beyond what the holder needs there; unreserved nodes are not limited. Each such start
//! lowers the spare it used, so together they never take what the holder needs.
//!
//! **Why this never delays the holder** (when running jobs end at their estimates): let
//! "projected free at `at`" be what is free now plus what running jobs ending by `at` give back.
//! The plan makes it cover the holder on the reserved nodes; a job ending by `at` leaves it
//! unchanged, a job running past `at` lowers it by at most the spare, an end or cancel only
//! raises it. So at `at` the holder fits, and a later plan from a later state finds a start no
//! later than `at`.

use std::time::Duration;

use meridian_proto::inventory::NodeFree;

use super::fairshare::PendingKey;
use super::gang;
use super::scheduler::BuiltinScheduler;
use super::{LocalJob, Reservation};

/// The job holding the member's reservation and its current plan.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// The holder's id.
    pub(super) job_id: String,
    /// Its queue index.
    pub(super) queue: usize,
    /// Its place in that queue.
    pub(super) key: PendingKey,
    /// When and where it is expected to start.
    pub(super) plan: Plan,
}

/// When and where the holder is expected to start, and the spare left on the reserved nodes.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// The earliest start found.
    pub(super) at: Duration,
    /// Node index per replica of the holder's placement at `at`.
    pub(super) nodes: Vec<usize>,
    /// Per node index: `None` for an unreserved node; for a reserved node, what a job still
    /// running at `at` may take from it.
    spare: Vec<Option<NodeFree>>,
}

impl Plan {
    /// Whether a job started at `now` that runs for `run_for` (its estimate) ends by the
    /// reservation's start, and so may use anything free.
    pub(super) fn ends_in_time(&self, now: Duration, run_for: Duration) -> bool {
        now.checked_add(run_for).is_some_and(|end| end <= self.at)
    }

    /// What a job still running at `at` may take from node `index` whose free resources are
    /// `free`.
    pub(super) fn usable(&self, index: usize, free: NodeFree) -> NodeFree {
        match self.spare.get(index).copied().flatten() {
            Some(spare) => NodeFree {
                gpus: free.gpus.min(spare.gpus),
                cpu: free.cpu.min(spare.cpu),
                memory_gib: free.memory_gib.min(spare.memory_gib),
            },
            None => free,
        }
    }

    /// Records that a job still running at `at` took one replica of `job` on node `index`.
    pub(super) fn take(&mut self, index: usize, job: &LocalJob) {
        if let Some(Some(spare)) = self.spare.get_mut(index) {
            spare.gpus = spare.gpus.saturating_sub(job.gpus);
            spare.cpu = spare.cpu.saturating_sub(job.cpu);
            spare.memory_gib = spare.memory_gib.saturating_sub(job.memory_gib);
        }
    }
}

impl BuiltinScheduler {
    /// The member's reservation, if a pending job holds one.
    pub fn reservation(&self) -> Option<Reservation> {
        let held = self.reservation.as_ref()?;
        Some(Reservation {
            job_id: held.job_id.clone(),
            starts_at: held.plan.at,
            nodes: held.plan.nodes.iter().map(|&i| self.nodes[i].spec.name.clone()).collect(),
        })
    }

    /// What node `index` has free for a job offered now, as the inventory reports it: all of
    /// it, except that while a sibling copy holds the reservation, a node held for it shows only
    /// its spare (what a job still running at the reservation's start may take), so the gateway
    /// offers nothing the member would have to decline to keep it. A short job that would end in
    /// time could take more. A reservation for a job the member queued itself (an accepted
    /// offer waiting here) is not hidden: the reported inventory stays what it was without
    /// copies.
    pub(super) fn free_for_offers(&self, index: usize) -> NodeFree {
        let free = self.nodes.get(index).map(|n| n.free).unwrap_or_default();
        match &self.reservation {
            Some(held) if self.copies.contains(&held.job_id) => held.plan.usable(index, free),
            _ => free,
        }
    }

    /// The earliest start of `job` at or after `now` if running jobs end at their estimates,
    /// with its placement then; `None` only for a job that could not fit the empty member.
    pub(super) fn plan(&self, job: &LocalJob, now: Duration) -> Option<Plan> {
        let mut free: Vec<NodeFree> = self.nodes.iter().map(|n| n.free).collect();
        let accepts: Vec<bool> = self.nodes.iter().map(|n| n.accepts(job)).collect();
        // GPUs free on nodes the job accepts: a cheap bound before any placement is tried.
        let mut usable_gpus: u64 =
            free.iter().zip(&accepts).filter(|(_, ok)| **ok).map(|(f, _)| u64::from(f.gpus)).sum();
        let need = job.total_gpus();
        if usable_gpus >= need
            && let Some(nodes) = gang::place_on(&self.nodes, job, &free)
        {
            return Some(Plan::new(now, nodes, &free, job));
        }
        // `running` iterates by id, so the stable sort leaves equal ends in id order.
        let mut ends: Vec<(Duration, &super::scheduler::Running)> =
            // By estimate; a job already past its estimate by the overdue model (not "now"), the
            // same expected end the member reports to the gateway.
            self.running.values().map(|r| (now.saturating_add(r.view.expected_remaining(now)), r)).collect();
        ends.sort_by_key(|(end, _)| *end);
        let mut i = 0;
        while let Some(&(at, _)) = ends.get(i) {
            while let Some(&(end, running)) = ends.get(i)
                && end == at
            {
                let held = &running.view.job;
                for &index in &running.nodes {
                    let (Some(f), Some(node)) = (free.get_mut(index), self.nodes.get(index)) else { continue };
                    let capacity = node.capacity();
                    f.gpus = f.gpus.saturating_add(held.gpus).min(capacity.gpus);
                    f.cpu = f.cpu.saturating_add(held.cpu).min(capacity.cpu);
                    f.memory_gib = f.memory_gib.saturating_add(held.memory_gib).min(capacity.memory_gib);
                    if accepts[index] {
                        usable_gpus = usable_gpus.saturating_add(u64::from(held.gpus));
                    }
                }
                i += 1;
            }
            if usable_gpus >= need
                && let Some(nodes) = gang::place_on(&self.nodes, job, &free)
            {
                return Some(Plan::new(at, nodes, &free, job));
            }
        }
        None
    }
}

impl Plan {
    /// A plan to start `job` at `at` on `nodes`, given what is projected free then.
    fn new(at: Duration, nodes: Vec<usize>, free_at: &[NodeFree], job: &LocalJob) -> Self {
        let mut spare: Vec<Option<NodeFree>> = vec![None; free_at.len()];
        for &index in &nodes {
            let Some(slot) = spare.get_mut(index) else { continue };
            let left = slot.get_or_insert(free_at[index]);
            left.gpus = left.gpus.saturating_sub(job.gpus);
            left.cpu = left.cpu.saturating_sub(job.cpu);
            left.memory_gib = left.memory_gib.saturating_sub(job.memory_gib);
        }
        Self { at, nodes, spare }
    }
}
