//! Sibling copies: a queued job that cannot start now may wait on its best few members at once,
//! queued in each member's own scheduler, and start on whichever is ready first.
//!
//! A member plans and reserves for its copy as for any pending job (EASY backfill on its own
//! nodes), which is exact where the gateway's hold is a cluster-level guess. What keeps it
//! "never two copies":
//! - a copy is not a binding: it runs nothing until the gateway grants it the job's start lock;
//! - a member whose scheduler would start a copy takes the nodes and asks
//!   ([`AgentEvent::CopyReady`](meridian_proto::protocol::AgentEvent::CopyReady)); the next round
//!   grants it by making it an ordinary offer (a new fencing token, `Offered`, durable before
//!   the [`GatewayCommand::Grant`] goes out) and drops every other copy. A job that is no longer
//!   queued has no copy to grant, so a second ready copy is only ever dropped;
//! - a ready copy that a round does not grant (its tenant is over quota, the job was placed
//!   elsewhere) is dropped at once, so no member holds nodes idle for it past one round;
//! - copies live in memory only, on both sides: an agent drops its copies when its stream ends,
//!   and the gateway forgets a cluster's copies then. A new leader starts with none.
//!
//! A round that finds the job could start now on a member holding its copy waits up to
//! `placement.copyStartGraceSecs` for that copy to ask for the lock instead of offering the job there:
//! the member's scheduler starts the copy at its next pass (Slurm's comes seconds after the
//! GPUs free), and an offer would replace the copy with a new job at the back of that member's
//! queue.
//!
//! Copy tokens come from one counter per gateway process and name a copy in every message; they
//! are not fencing tokens (a grant carries the binding's own, from the job's record).

use std::collections::HashSet;

use meridian_placement::{Decision, Verdict};
use meridian_proto::protocol::GatewayCommand;

use crate::io::Effects;

/// What a round does with a job it could offer to a member holding its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtCopy {
    /// Wait for the copy to ask for the lock; `first`: this round is the first to see it.
    Wait {
        /// The first round that found the job could start there.
        first: bool,
    },
    /// Offer as usual: no copy there, or it had its grace.
    Offer,
}
use crate::record::JobRecord;
use crate::registry::Registry;

/// One sibling copy of a queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SiblingCopy {
    /// The member holding it.
    pub(crate) cluster: String,
    /// Names it in every message.
    pub(crate) token: u64,
    /// The GPU type placement costed there (the copy is pinned to it).
    pub(crate) gpu_type: String,
    /// The member is ready to start it and asked for the lock.
    pub(crate) ready: bool,
    /// When a round first found the job could start now on this copy's member.
    pub(crate) starts_seen_at_ms: Option<i64>,
}

/// The copies of queued jobs, in memory.
#[derive(Debug, Default)]
pub(crate) struct CopyBook {
    /// The last copy token handed out.
    last_token: u64,
    /// Copies by job id; shared with read views (see [`Self::snapshot`]).
    by_job: imbl::HashMap<String, Vec<SiblingCopy>>,
    /// Clusters whose member said it holds no copies; until its stream ends.
    unsupported: HashSet<String>,
}

impl CopyBook {
    /// Whether job `id` waits as copies.
    pub(crate) fn has_copies(&self, id: &str) -> bool {
        // Rounds ask for every queued job: with no copies (the default), hash nothing.
        !self.by_job.is_empty() && self.by_job.contains_key(id)
    }

    /// Job `id`'s copies.
    pub(crate) fn of(&self, id: &str) -> &[SiblingCopy] {
        if self.by_job.is_empty() {
            return &[];
        }
        self.by_job.get(id).map_or(&[], Vec::as_slice)
    }

    /// Every job's copies, for a read view: cheap (shares structure with the book).
    pub(crate) fn snapshot(&self) -> imbl::HashMap<String, Vec<SiblingCopy>> {
        self.by_job.clone()
    }

    /// Job `id`'s ready copy, if a member asked for its lock.
    pub(crate) fn ready_copy(&self, id: &str) -> Option<&SiblingCopy> {
        self.of(id).iter().find(|c| c.ready)
    }

    /// Copies of all jobs (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_job.values().map(Vec::len).sum()
    }

    /// Queues copies of `job` (left waiting by `decision`) on its best `k` scored clusters that
    /// cannot start it now, connected and taking copies. Returns where they went (best first);
    /// nothing when the job already has copies: a copy keeps its place in its member's queue
    /// for the whole wait (a copy is dropped only when its member's stream ends, or the job is
    /// placed, granted or cancelled).
    pub(crate) fn place(
        &mut self,
        registry: &Registry,
        job: &JobRecord,
        decision: &Decision,
        k: u32,
        effects: &mut Effects,
    ) -> Vec<String> {
        if k == 0 || self.has_copies(&job.id) {
            return Vec::new();
        }
        let mut waiting: Vec<(&str, &str, f64)> = decision
            .candidates
            .iter()
            .filter(|c| !self.unsupported.contains(c.cluster.as_str()))
            .filter_map(|c| match &c.verdict {
                // A cluster that starts it now gets an offer, not a copy; one that needs a
                // preemption too (only a granted copy may preempt).
                Verdict::Scored(score) if !score.fits_now && !score.preempts => {
                    Some((c.cluster.as_ref(), score.gpu_type.as_ref(), score.total))
                }
                _ => None,
            })
            .collect();
        waiting.sort_by(|a, b| a.2.total_cmp(&b.2).then_with(|| a.0.cmp(b.0)));
        let mut copies = Vec::new();
        for (cluster, gpu_type, _) in waiting {
            if copies.len() >= k as usize {
                break;
            }
            let Some(conn) = registry.conn_of(cluster) else { continue };
            self.last_token += 1;
            let mut assignment = job.assignment();
            if !gpu_type.is_empty() {
                assignment.spec.gang.resources.gpu_types = meridian_proto::gpu::pinned_types(gpu_type);
            }
            effects.sends.push((conn, GatewayCommand::Copy { copy_token: self.last_token, assignment }));
            copies.push(SiblingCopy {
                cluster: cluster.to_string(),
                token: self.last_token,
                gpu_type: gpu_type.to_string(),
                ready: false,
                starts_seen_at_ms: None,
            });
        }
        let clusters = copies.iter().map(|c| c.cluster.clone()).collect();
        if !copies.is_empty() {
            self.by_job.insert(job.id.clone(), copies);
        }
        clusters
    }

    /// A round could offer job `id` to `cluster` now: whether to wait for the copy held there
    /// instead, for at most `grace_ms` since a round first found it could start there.
    pub(crate) fn at_copy(&mut self, id: &str, cluster: &str, now_ms: i64, grace_ms: i64) -> AtCopy {
        if self.by_job.is_empty() {
            return AtCopy::Offer;
        }
        let copy = self.by_job.get_mut(id).and_then(|copies| copies.iter_mut().find(|c| c.cluster == cluster));
        let Some(copy) = copy.filter(|c| !c.ready) else { return AtCopy::Offer };
        match copy.starts_seen_at_ms {
            None if grace_ms > 0 => {
                copy.starts_seen_at_ms = Some(now_ms);
                AtCopy::Wait { first: true }
            }
            Some(seen) if now_ms.saturating_sub(seen) < grace_ms => AtCopy::Wait { first: false },
            _ => AtCopy::Offer,
        }
    }

    /// Cluster `cluster` is ready to start copy `token` of job `id`: true when that copy is
    /// current (it is marked ready for the next round to grant), false when it is stale.
    pub(crate) fn mark_ready(&mut self, id: &str, cluster: &str, token: u64) -> bool {
        let copy = self.by_job.get_mut(id).and_then(|copies| copies.iter_mut().find(|c| c.token == token));
        match copy {
            Some(copy) if copy.cluster == cluster => {
                copy.ready = true;
                true
            }
            _ => false,
        }
    }

    /// Forgets every copy of job `id` and tells their members to drop them, except the copy
    /// `keep` (being granted). Drops go out before anything sent after this call.
    pub(crate) fn drop_all(&mut self, id: &str, keep: Option<u64>, registry: &Registry, effects: &mut Effects) {
        for copy in self.by_job.remove(id).unwrap_or_default() {
            if Some(copy.token) == keep {
                continue;
            }
            if let Some(conn) = registry.conn_of(&copy.cluster) {
                effects.sends.push((conn, GatewayCommand::DropCopy { job_id: id.to_string(), copy_token: copy.token }));
            }
        }
    }

    /// Drops the copies of every job that `queued` says is no longer queued, and every ready copy
    /// no round granted (the member would otherwise hold its nodes idle).
    pub(crate) fn sweep(&mut self, queued: impl Fn(&str) -> bool, registry: &Registry, effects: &mut Effects) {
        let gone: Vec<String> = self
            .by_job
            .iter()
            .filter(|(id, copies)| !queued(id) || copies.iter().any(|c| c.ready))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.drop_all(&id, None, registry, effects);
        }
    }

    /// The member of `cluster` no longer holds copy `token` of job `id`; `unsupported`: it holds
    /// none at all (no more are sent there until its stream ends).
    pub(crate) fn dropped(&mut self, id: &str, cluster: &str, token: u64, unsupported: bool) {
        if unsupported {
            self.unsupported.insert(cluster.to_string());
        }
        if let Some(copies) = self.by_job.get_mut(id) {
            copies.retain(|c| !(c.token == token && c.cluster == cluster));
            if copies.is_empty() {
                self.by_job.remove(id);
            }
        }
    }

    /// A cluster's stream ended or was replaced: its agent dropped every copy it held.
    pub(crate) fn cluster_gone(&mut self, cluster: &str) {
        self.unsupported.remove(cluster);
        let touched: Vec<String> = self
            .by_job
            .iter()
            .filter(|(_, copies)| copies.iter().any(|c| c.cluster == cluster))
            .map(|(id, _)| id.clone())
            .collect();
        for id in touched {
            if let Some(copies) = self.by_job.get_mut(&id) {
                copies.retain(|c| c.cluster != cluster);
                if copies.is_empty() {
                    self.by_job.remove(&id);
                }
            }
        }
    }
}
