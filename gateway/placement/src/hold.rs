//! Holding a cluster for a gang that has waited long enough: a federation-level reservation with
//! backfill.
//!
//! Late binding offers a job only when its whole gang fits now. Left alone, that starves large
//! gangs: every GPU a finishing job frees is taken at once by a small job, so 64 free GPUs on one
//! cluster never happen. A [`Holds`] table fixes that. When a gang has waited past
//! `holdAfterSecs` and its best cluster cannot start it yet, the caller holds that cluster for it
//! until the gang's expected start. While the hold lasts, other jobs may still take the cluster's
//! free GPUs, but only jobs whose runtime estimate ends before the holder is expected to start
//! (backfill), so they never delay it. One hold per cluster; the gang's own offer ends its hold.
//!
//! A placement round (the gateway's `place_queue`, and the simulator's replay of it) decides the
//! round's holds with [`Holds::for_round`], then each queued job in fair-share order with
//! [`Holds::place`].

use meridian_proto::spec::JobSpec;

use crate::config::PlacementConfig;
use crate::decision::Decision;
use crate::place::{choose_waited, place_waited};
use crate::reasons::Rejection;
use crate::snapshot::FederationSnapshot;
use crate::verdict::Verdict;

/// Queued jobs looked at per round when deciding holds: holds go to the first of the jobs that
/// have waited long enough, by priority and then age, one per cluster, so a few dozen cover any
/// federation while keeping rounds cheap.
pub const HOLD_SCAN: usize = 64;

/// Clusters held for gangs, by index into a [`FederationSnapshot`]'s clusters.
#[derive(Debug, Clone, PartialEq)]
pub struct Holds<Id> {
    by_cluster: Vec<Option<(Id, f64)>>,
}

impl<Id: PartialEq + Clone> Holds<Id> {
    /// No cluster held, for a federation of `clusters` clusters.
    pub fn new(clusters: usize) -> Self {
        Self { by_cluster: vec![None; clusters] }
    }

    /// Whether no cluster is held.
    pub fn is_empty(&self) -> bool {
        self.by_cluster.iter().all(Option::is_none)
    }

    /// Whether every cluster is held.
    pub fn all_held(&self) -> bool {
        self.by_cluster.iter().all(Option::is_some)
    }

    /// Drops every hold (before holds are decided again).
    pub fn clear(&mut self) {
        self.by_cluster.iter_mut().for_each(|h| *h = None);
    }

    /// This round's holds. `oldest_first` yields queued jobs (id, spec, seconds waited), oldest
    /// first. Of those that have waited `holdAfterSecs`, the first [`HOLD_SCAN`] by priority
    /// (highest first) and then age, as a member's own scheduler reserves for the head of its
    /// queue, hold the cluster placement prefers for them when they cannot start now, until their
    /// expected start (seconds from `now_secs` on the caller's clock). One hold per cluster.
    pub fn for_round<'a>(
        oldest_first: impl IntoIterator<Item = (Id, &'a JobSpec, f64)>,
        snapshot: &FederationSnapshot,
        config: &PlacementConfig,
        now_secs: f64,
    ) -> Self {
        let mut holds = Self::new(snapshot.clusters.len());
        // Each with its place in `oldest_first`, which orders equal priorities oldest first.
        let mut due: Vec<(usize, Id, &JobSpec, f64)> = oldest_first
            .into_iter()
            .take_while(|(_, _, waited)| *waited >= config.hold_after_secs)
            .enumerate()
            .map(|(at, (id, job, waited))| (at, id, job, waited))
            .collect();
        let order = |(at, _, job, _): &(usize, Id, &JobSpec, f64)| (std::cmp::Reverse(job.priority), *at);
        // Only the first HOLD_SCAN are looked at: select them in linear time, then order those.
        if due.len() > HOLD_SCAN {
            due.select_nth_unstable_by_key(HOLD_SCAN, order);
            due.truncate(HOLD_SCAN);
        }
        due.sort_unstable_by_key(order);
        for (_, id, job, waited_secs) in due {
            if holds.all_held() {
                break;
            }
            if let Some(choice) = choose_waited(job, snapshot, config, waited_secs).filter(|c| !c.starts_now)
                && let Some(index) = snapshot.clusters.iter().position(|c| *c.name() == choice.cluster)
            {
                holds.hold(index, id, now_secs + choice.expected_start_secs);
            }
        }
        holds
    }

    /// Decides for queued job `id` in a placement round: clusters held for other jobs that it
    /// would still occupy when they are expected to start are closed to it, and the decision says
    /// so. When its best cluster cannot start it now, it stays queued and counts as waiting
    /// there for every job decided after it in the round
    /// ([`ClusterSnapshot::expect_waiting`](crate::snapshot::ClusterSnapshot::expect_waiting)).
    ///
    /// When the decision starts the job now, the caller offers it and
    /// [`reserve`](crate::snapshot::ClusterSnapshot::reserve)s its nodes.
    pub fn place(
        &self,
        snapshot: &mut FederationSnapshot,
        id: &Id,
        job: &JobSpec,
        waited_secs: f64,
        config: &PlacementConfig,
        now_secs: f64,
    ) -> Decision {
        let masked = self.mask(snapshot, id, now_secs, job.runtime.estimate.as_secs_f64());
        let mut decision = place_waited(job, snapshot, config, waited_secs);
        self.restore(snapshot, &masked, Some(&mut decision));
        if let Some(choice) = decision.chosen.as_ref().filter(|c| !c.starts_now)
            && let Some(target) = snapshot.clusters.iter_mut().find(|c| *c.name() == choice.cluster)
        {
            target.expect_waiting(u64::from(job.total_gpus()));
        }
        decision
    }

    /// Holds `cluster` for `job`, expected to start at `start_at` (seconds on the caller's clock),
    /// unless another job holds it already or `job` holds a cluster. Returns whether it did.
    pub fn hold(&mut self, cluster: usize, job: Id, start_at: f64) -> bool {
        if self.holder_of(&job).is_some() {
            return false;
        }
        match self.by_cluster.get_mut(cluster) {
            Some(slot @ None) => {
                *slot = Some((job, start_at));
                true
            }
            _ => false,
        }
    }

    /// The cluster `job` holds, if any.
    pub fn holder_of(&self, job: &Id) -> Option<usize> {
        self.by_cluster.iter().position(|h| h.as_ref().is_some_and(|(id, _)| id == job))
    }

    /// Ends `job`'s hold (it was offered).
    pub fn release(&mut self, job: &Id) {
        if let Some(index) = self.holder_of(job)
            && let Some(slot) = self.by_cluster.get_mut(index)
        {
            *slot = None;
        }
    }

    /// Takes out of `snapshot` (marks disconnected) every cluster `job` may not use now: held by
    /// another job that is expected to start before `now + estimate_secs`. Returns what it took
    /// out, for [`restore`](Self::restore).
    pub fn mask(&self, snapshot: &mut FederationSnapshot, job: &Id, now: f64, estimate_secs: f64) -> Vec<(usize, f64)> {
        let mut masked = Vec::new();
        for (index, (hold, cluster)) in self.by_cluster.iter().zip(snapshot.clusters.iter_mut()).enumerate() {
            if let Some((holder, start_at)) = hold
                && holder != job
                && cluster.connected
                && now + estimate_secs > *start_at
            {
                cluster.connected = false;
                masked.push((index, (*start_at - now).max(0.0)));
            }
        }
        masked
    }

    /// Puts back what [`mask`](Self::mask) took out, and in `decision` (made while masked) says
    /// why those clusters were passed over.
    pub fn restore(&self, snapshot: &mut FederationSnapshot, masked: &[(usize, f64)], decision: Option<&mut Decision>) {
        for &(index, _) in masked {
            if let Some(cluster) = snapshot.clusters.get_mut(index) {
                cluster.connected = true;
            }
        }
        let Some(decision) = decision else { return };
        for &(index, in_secs) in masked {
            if let Some(candidate) = decision.candidates.get_mut(index)
                && let Verdict::Rejected { reasons } = &mut candidate.verdict
            {
                reasons.replace(&Rejection::Disconnected, Rejection::HeldForOlderGang { in_secs });
            }
        }
    }
}
