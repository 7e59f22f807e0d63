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

use super::decision::{Decision, Verdict};
use super::filter::Rejection;
use super::snapshot::FederationSnapshot;

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
