//! Priority preemption: a queue's head that cannot start may stop running preemptible jobs of
//! strictly lower priority.
//!
//! **When.** [`BuiltinScheduler::preempt`] looks at the head of every queue (by the queue's own
//! order: priority, submit time, id) that cannot start now and is not already waiting for victims.
//! It considers running jobs that are `preemptible`, of strictly lower priority than the head,
//! not already being stopped, not preempted within the policy's minimum interval, and holding at
//! least one node the head accepts.
//!
//! **Whom.** Candidates are taken lowest priority first, then youngest start (the least work
//! lost), then id, until the head's whole gang would fit on what they free plus what is free now,
//! under the same rules as any start (the member's backfill reservation included). Then every
//! chosen victim that is not needed after all (the later, more costly ones first) is dropped
//! again. If even all candidates together do not make room, nobody is preempted.
//!
//! **How.** Victims keep their nodes during the grace period (the caller signals them, SIGTERM,
//! so they may checkpoint); [`BuiltinScheduler::stop_preempted`] stops them once the grace has
//! passed and starts the head on the freed nodes straight away, before any other queue's pass
//! could take them. Nothing is ever over-committed: the head starts only through the ordinary
//! placement on free nodes. A victim that completes during its grace simply completes.

use std::time::Duration;

use meridian_proto::inventory::NodeFree;

use super::gang;
use super::scheduler::BuiltinScheduler;
use super::{LocalJob, Started};

/// A member's preemption policy (the agent config's `preemption` section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreemptionPolicy {
    /// Whether the member preempts at all.
    pub enabled: bool,
    /// How long a victim may run on after it is signalled before it is stopped.
    pub grace: Duration,
    /// A job preempted less than this long ago is not preempted again.
    pub min_interval: Duration,
}

impl Default for PreemptionPolicy {
    fn default() -> Self {
        Self { enabled: true, grace: Duration::from_secs(30), min_interval: Duration::from_secs(600) }
    }
}

impl PreemptionPolicy {
    /// A policy that never preempts.
    pub fn disabled() -> Self {
        Self { enabled: false, ..Self::default() }
    }
}

/// A running job chosen to make room for a higher-priority one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// The job being stopped.
    pub victim: String,
    /// The pending job it makes room for.
    pub for_job: String,
    /// When its grace ends and [`BuiltinScheduler::stop_preempted`] stops it.
    pub stop_at: Duration,
}

/// What [`BuiltinScheduler::stop_preempted`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreemptionStops {
    /// Victims stopped now (their nodes are free; report them preempted).
    pub stopped: Vec<String>,
    /// Jobs started on the room their victims left.
    pub started: Vec<Started>,
}

/// A victim in its grace period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Draining {
    /// When it is stopped.
    pub(super) stop_at: Duration,
    /// The job it makes room for.
    pub(super) for_job: String,
}

impl BuiltinScheduler {
    /// Sets the member's preemption policy (the default is [`PreemptionPolicy::default`]).
    pub fn set_preemption(&mut self, policy: PreemptionPolicy) {
        self.preemption = policy;
    }

    /// The member's preemption policy.
    pub fn preemption(&self) -> PreemptionPolicy {
        self.preemption
    }

    /// Chooses victims for every queue head that cannot start now (see the module docs) and
    /// returns the new ones; the caller signals them. Nothing is freed until
    /// [`stop_preempted`](Self::stop_preempted). Does nothing when preemption is disabled.
    pub fn preempt(&mut self, now: Duration) -> Vec<Preemption> {
        if !self.preemption.enabled {
            return Vec::new();
        }
        self.advance_to(now);
        // A sibling copy never preempts: only its granted start may take anyone's GPUs.
        let heads: Vec<LocalJob> = self
            .queues
            .iter()
            .filter_map(|q| q.head())
            .map(|(_, pending)| pending.job.clone())
            .filter(|job| !self.copies.contains(&job.id))
            .collect();
        let mut chosen = Vec::new();
        for head in heads {
            let free: Vec<NodeFree> = self.nodes.iter().map(|n| n.free).collect();
            if self.waiting_for_victims(&head.id) || self.fits_on(&head, &free, now) {
                continue;
            }
            let Some(victims) = self.victims_for(&head, now) else { continue };
            let stop_at = now.saturating_add(self.preemption.grace);
            for victim in victims {
                self.draining.insert(victim.clone(), Draining { stop_at, for_job: head.id.clone() });
                chosen.push(Preemption { victim, for_job: head.id.clone(), stop_at });
            }
        }
        chosen
    }

    /// Whether a job like `job`, queued now, would start by preemption: it does not fit now, and
    /// stopping running preemptible jobs of lower priority (by the rules of
    /// [`preempt`](Self::preempt)) would make room. Then it would start once their grace has
    /// passed; returns that grace. None when the member does not preempt or no victims would do.
    pub fn start_by_preemption(&self, job: &LocalJob, now: Duration) -> Option<Duration> {
        if !self.preemption.enabled {
            return None;
        }
        let free: Vec<NodeFree> = self.nodes.iter().map(|n| n.free).collect();
        if self.fits_on(job, &free, now) {
            return None;
        }
        self.victims_for(job, now).map(|_| self.preemption.grace)
    }

    /// GPUs of running preemptible jobs not already being stopped, by priority (ascending):
    /// what a job of higher priority could have by preemption. Empty when the member does not
    /// preempt.
    pub fn preemptible_gpus(&self) -> Vec<meridian_proto::inventory::PreemptibleGpus> {
        if !self.preemption.enabled {
            return Vec::new();
        }
        // The running preemptible jobs are counted as they start and end; victims already being
        // stopped (few) are taken out here.
        let mut by_priority = self.preemptible.clone();
        for id in self.draining.keys() {
            let Some(running) = self.running.get(id) else { continue };
            let job = &running.view.job;
            if job.preemptible
                && let Some(gpus) = by_priority.get_mut(&job.priority)
            {
                *gpus = gpus.saturating_sub(job.total_gpus());
            }
        }
        by_priority
            .into_iter()
            .filter(|&(_, gpus)| gpus > 0)
            .map(|(priority, gpus)| meridian_proto::inventory::PreemptibleGpus {
                priority,
                gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
            })
            .collect()
    }

    /// When the next victim's grace ends, if any victim is in its grace period.
    pub fn next_preemption_stop(&self) -> Option<Duration> {
        self.draining.values().map(|d| d.stop_at).min()
    }

    /// Victims in their grace period: `(victim, stop_at)` by id.
    pub fn draining(&self) -> impl Iterator<Item = (&str, Duration)> {
        self.draining.iter().map(|(id, d)| (id.as_str(), d.stop_at))
    }

    /// Stops every victim whose grace has ended by `now`, then starts each job whose victims are
    /// all gone, if it still waits and now fits (it usually does: the room was freed for it).
    pub fn stop_preempted(&mut self, now: Duration) -> PreemptionStops {
        self.advance_to(now);
        let due: Vec<String> =
            self.draining.iter().filter(|(_, d)| d.stop_at <= now).map(|(id, _)| id.clone()).collect();
        let mut stops = PreemptionStops::default();
        let mut preemptors = Vec::new();
        for id in due {
            if let Some(draining) = self.draining.remove(&id) {
                preemptors.push(draining.for_job);
            }
            if self.release(&id).is_some() {
                stops.stopped.push(id);
            }
        }
        preemptors.sort();
        preemptors.dedup();
        for preemptor in preemptors {
            if self.waiting_for_victims(&preemptor) {
                continue;
            }
            if let Some(started) = self.start_waiting(&preemptor, now) {
                stops.started.push(started);
            }
        }
        stops
    }

    /// Ends the grace of victim `job_id` now (its processes exited on the signal), so the next
    /// [`stop_preempted`](Self::stop_preempted) stops it. False when it is not a victim.
    pub fn end_grace_now(&mut self, job_id: &str, now: Duration) -> bool {
        match self.draining.get_mut(job_id) {
            Some(draining) => {
                draining.stop_at = draining.stop_at.min(now);
                true
            }
            None => false,
        }
    }

    /// Forgets a victim that ended by itself (completed or cancelled) during its grace.
    pub(super) fn forget_draining(&mut self, job_id: &str) {
        self.draining.remove(job_id);
    }

    /// Whether victims are still being stopped for `job_id`.
    fn waiting_for_victims(&self, job_id: &str) -> bool {
        self.draining.values().any(|d| d.for_job == job_id)
    }

    /// Starts the pending job `job_id` if it fits now; as the reservation's holder it takes the
    /// reservation's room, as any other job it keeps to the reservation's rules.
    fn start_waiting(&mut self, job_id: &str, now: Duration) -> Option<Started> {
        let (queue, key) = self.pending_key(job_id)?;
        let holder = self.reservation.as_ref().is_some_and(|held| held.job_id == job_id);
        let held = if holder { self.reservation.take() } else { None };
        let job = self.queues.get(queue)?.pending.get(&key)?.job.clone();
        match self.place_now(&job, now) {
            Some(placement) => self.start_pending(queue, &key, placement, now),
            None => {
                if held.is_some() {
                    self.reservation = held;
                }
                None
            }
        }
    }

    /// The fewest, cheapest victims whose room lets `head` start now, or None (see module docs).
    fn victims_for(&self, head: &LocalJob, now: Duration) -> Option<Vec<String>> {
        let min_interval = self.preemption.min_interval;
        let mut candidates: Vec<(u32, std::cmp::Reverse<Duration>, &str)> = self
            .running
            .values()
            .filter(|r| {
                let job = &r.view.job;
                job.preemptible
                    && job.priority < head.priority
                    && !self.draining.contains_key(&job.id)
                    && job.last_preempted_at.is_none_or(|at| now.saturating_sub(at) >= min_interval)
                    && r.nodes.iter().any(|&i| self.nodes.get(i).is_some_and(|n| n.accepts(head)))
            })
            .map(|r| (r.view.job.priority, std::cmp::Reverse(r.view.started_at), r.view.job.id.as_str()))
            .collect();
        candidates.sort();
        let base: Vec<NodeFree> = self.nodes.iter().map(|n| n.free).collect();
        let mut free = base.clone();
        let mut victims: Vec<&str> = Vec::new();
        for (_, _, id) in candidates {
            if self.fits_on(head, &free, now) {
                break;
            }
            self.give_back_on(id, &mut free);
            victims.push(id);
        }
        if victims.is_empty() || !self.fits_on(head, &free, now) {
            return None;
        }
        // Drop victims that are not needed after all, the most costly (chosen last) first.
        let mut index = victims.len();
        while index > 0 {
            index -= 1;
            let mut without = base.clone();
            for (i, id) in victims.iter().enumerate() {
                if i != index {
                    self.give_back_on(id, &mut without);
                }
            }
            if self.fits_on(head, &without, now) {
                victims.remove(index);
            }
        }
        Some(victims.into_iter().map(str::to_string).collect())
    }

    /// Adds what the running job `id` holds to `free`, as if it had stopped.
    fn give_back_on(&self, id: &str, free: &mut [NodeFree]) {
        let Some(running) = self.running.get(id) else { return };
        let job = &running.view.job;
        for &index in &running.nodes {
            let (Some(f), Some(node)) = (free.get_mut(index), self.nodes.get(index)) else { continue };
            let capacity = node.capacity();
            f.gpus = f.gpus.saturating_add(job.gpus).min(capacity.gpus);
            f.cpu = f.cpu.saturating_add(job.cpu).min(capacity.cpu);
            f.memory_gib = f.memory_gib.saturating_add(job.memory_gib).min(capacity.memory_gib);
        }
    }

    /// Whether `job` would start at `now` with `free` free, under the rules of
    /// [`place_now`](BuiltinScheduler::place_now): the reservation's holder may use everything,
    /// any other job that runs past the reservation's start only the reserved nodes' spare.
    fn fits_on(&self, job: &LocalJob, free: &[NodeFree], now: Duration) -> bool {
        let at = |index: usize| free.get(index).copied().unwrap_or_default();
        match &self.reservation {
            Some(held) if held.job_id != job.id && !held.plan.ends_in_time(now, job.run_for) => {
                gang::place_with(&self.nodes, job, |index, _| held.plan.usable(index, at(index))).is_some()
            }
            _ => gang::place_on(&self.nodes, job, free).is_some(),
        }
    }
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::testkit::{self, node};
    use super::super::{QueuePolicy, QueueSpec};
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A job of `gpus` on one node in `queue`, of `priority`, running 1000 s.
    fn job(id: &str, queue: &str, gpus: u32, priority: u32, preemptible: bool) -> LocalJob {
        LocalJob { priority, preemptible, ..testkit::job(id, queue, 1, gpus, 1000) }
    }

    /// Two 8-GPU nodes, queues `low` and `high` with the given policy.
    fn member(policy: QueuePolicy) -> BuiltinScheduler {
        let queues = ["low", "high"].map(|name| QueueSpec { policy, ..QueueSpec::new(name, 1.0) }).to_vec();
        BuiltinScheduler::new(vec![node("a", 8), node("b", 8)], queues).unwrap()
    }

    fn ids(preemptions: &[Preemption]) -> Vec<&str> {
        preemptions.iter().map(|p| p.victim.as_str()).collect()
    }

    #[test]
    fn a_higher_priority_head_stops_preemptible_jobs_after_the_grace_and_starts_on_their_room() {
        let mut s = member(QueuePolicy::Backfill);
        s.start_now(job("victim", "low", 8, 10, true), secs(0)).unwrap();
        s.start_now(job("keeper", "low", 8, 10, false), secs(0)).unwrap();
        s.submit(job("urgent", "high", 8, 90, false), secs(5)).unwrap();
        assert!(s.schedule(secs(5)).is_empty());
        let chosen = s.preempt(secs(5));
        assert_eq!(chosen, vec![Preemption { victim: "victim".into(), for_job: "urgent".into(), stop_at: secs(35) }]);
        // During the grace the victim keeps its GPUs and nothing more is chosen.
        assert_eq!(s.free_gpus(), 0);
        assert!(s.preempt(secs(10)).is_empty());
        assert_eq!(s.stop_preempted(secs(34)), PreemptionStops::default());
        assert_eq!(s.next_preemption_stop(), Some(secs(35)));
        let stops = s.stop_preempted(secs(35));
        assert_eq!(stops.stopped, ["victim"]);
        assert_eq!(stops.started.iter().map(|s| s.job_id.as_str()).collect::<Vec<_>>(), ["urgent"]);
        assert_eq!(s.running().map(|r| r.job.id.as_str()).collect::<Vec<_>>(), ["keeper", "urgent"]);
        assert_eq!(s.next_preemption_stop(), None);
    }

    #[test]
    fn non_preemptible_and_equal_priority_jobs_are_never_victims() {
        let mut s = member(QueuePolicy::Strict);
        s.start_now(job("pinned", "low", 8, 10, false), secs(0)).unwrap();
        s.start_now(job("peer", "low", 8, 90, true), secs(0)).unwrap();
        s.submit(job("urgent", "high", 8, 90, false), secs(1)).unwrap();
        assert!(s.preempt(secs(1)).is_empty());
        assert!(s.draining().next().is_none());
    }

    #[test]
    fn victims_are_the_lowest_priority_then_the_youngest_and_no_more_than_needed() {
        let mut s = member(QueuePolicy::Strict);
        s.start_now(job("old-low", "low", 4, 10, true), secs(0)).unwrap();
        s.start_now(job("young-low", "low", 4, 10, true), secs(50)).unwrap();
        s.start_now(job("mid", "low", 4, 30, true), secs(0)).unwrap();
        s.start_now(job("mid2", "low", 4, 30, true), secs(0)).unwrap();
        s.submit(job("urgent", "high", 4, 90, false), secs(60)).unwrap();
        assert_eq!(ids(&s.preempt(secs(60))), ["young-low"]);
        s.submit(job("bigger", "high", 8, 80, false), secs(61)).unwrap();
        // `urgent` still waits for its victim, so `bigger` is not the head: nothing more.
        assert!(s.preempt(secs(61)).is_empty());
        let stops = s.stop_preempted(secs(90));
        assert_eq!(stops.stopped, ["young-low"]);
        // Node a holds old-low and urgent, node b mid and mid2. `bigger` needs a whole node:
        // old-low (lowest) is tried first but frees no whole node; mid and mid2 free node b, and
        // then old-low is not needed after all and is spared.
        let layout: Vec<(String, Vec<String>)> = s.running().map(|r| (r.job.id.clone(), r.nodes.clone())).collect();
        assert_eq!(ids(&s.preempt(secs(91))), ["mid", "mid2"], "{layout:?}");
    }

    #[test]
    fn a_job_is_not_preempted_again_within_the_minimum_interval() {
        let mut s = member(QueuePolicy::Strict);
        let mut recent = job("recent", "low", 8, 10, true);
        recent.last_preempted_at = Some(secs(500));
        s.start_now(recent, secs(600)).unwrap();
        s.start_now(job("other", "low", 8, 50, false), secs(600)).unwrap();
        s.submit(job("urgent", "high", 8, 90, false), secs(700)).unwrap();
        assert!(s.preempt(secs(1099)).is_empty(), "preempted 599 s ago");
        assert_eq!(ids(&s.preempt(secs(1100))), ["recent"]);
    }

    #[test]
    fn nothing_is_preempted_when_the_room_would_not_suffice_or_preemption_is_off() {
        let mut s = member(QueuePolicy::Strict);
        s.start_now(job("small", "low", 4, 10, true), secs(0)).unwrap();
        s.start_now(job("pinned", "low", 4, 10, false), secs(0)).unwrap();
        s.start_now(job("pinned2", "low", 8, 10, false), secs(0)).unwrap();
        s.submit(job("urgent", "high", 8, 90, false), secs(1)).unwrap();
        assert!(s.preempt(secs(1)).is_empty(), "stopping `small` alone leaves no whole node");

        let mut off = member(QueuePolicy::Strict);
        off.set_preemption(PreemptionPolicy::disabled());
        off.start_now(job("victim", "low", 8, 10, true), secs(0)).unwrap();
        off.start_now(job("v2", "low", 8, 10, true), secs(0)).unwrap();
        off.submit(job("urgent", "high", 8, 90, false), secs(1)).unwrap();
        assert!(off.preempt(secs(1)).is_empty());
    }

    #[test]
    fn a_victim_that_completes_in_its_grace_just_completes() {
        let mut s = member(QueuePolicy::Strict);
        s.set_preemption(PreemptionPolicy { grace: secs(100), ..PreemptionPolicy::default() });
        s.start_now(job("victim", "low", 8, 10, true), secs(0)).unwrap();
        s.start_now(job("other", "low", 8, 10, false), secs(0)).unwrap();
        s.submit(job("urgent", "high", 8, 90, false), secs(950)).unwrap();
        assert_eq!(ids(&s.preempt(secs(950))), ["victim"]);
        assert_eq!(s.complete_due(secs(1000)), ["other", "victim"]);
        assert!(s.draining().next().is_none());
        assert_eq!(s.stop_preempted(secs(1050)), PreemptionStops::default());
    }
}
