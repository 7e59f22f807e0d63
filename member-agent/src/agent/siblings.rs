//! Sibling copies on the agent's side: the gateway keeps a queued job waiting as copies on a
//! few members; each member's scheduler plans for its copy, and the first to be ready asks for
//! the job's start lock, which the gateway grants to exactly one copy.
//!
//! The agent keeps one record per copy (by job id, at most one per job) and answers:
//! - `Copy`: refused ([`AgentEvent::CopyDropped`]) when the member holds a binding of the job
//!   or its lease has run out; else handed to the backend, which queues it or refuses it (as
//!   unsupported when it has no start gate: Volcano, and Kueue without `kubernetes.startLockCheck`).
//! - The backend's [`CopyEvent::Ready`]: [`AgentEvent::CopyReady`], once per copy.
//! - `Grant` of a ready copy: started like an offer, on the nodes the copy holds
//!   ([`Start::Grant`]); of any other copy: an offer, after dropping the copy.
//! - `DropCopy`, an offer or a cancel of the job, the end of the stream or a new welcome: the
//!   copy is dropped in the backend, which frees what it holds.
//!
//! A copy is never a binding: it is not in the ledger, heartbeats or status reports. Every
//! backend call about a copy names its token, so calls that race (a drop and a late queue, a
//! replaced copy) cannot touch another copy; a backend answer or event for a copy the agent no
//! longer keeps is answered by dropping it there.

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_proto::protocol::{AgentEvent, Assignment};

use super::event_loop::EventLoop;
use super::offers::LEASE_EXPIRED;
use super::tasks::{self, Start, TaskLabel};
use crate::backend::{BackendError, CopyAdmission, CopyEvent, CopyEventReceiver};
use crate::metrics::CopyOutcome;

/// The copies the agent keeps for the gateway of the open stream, by job id.
#[derive(Debug, Default)]
pub(super) struct Copies {
    by_job: BTreeMap<String, HeldCopy>,
}

/// One copy the agent keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldCopy {
    copy_token: u64,
    /// [`AgentEvent::CopyReady`] was sent for it.
    ready: bool,
}

impl Copies {
    /// Forgets the copy of `job_id` if it is `copy_token`; returns it.
    fn remove_if(&mut self, job_id: &str, copy_token: u64) -> Option<HeldCopy> {
        match self.by_job.get(job_id) {
            Some(held) if held.copy_token == copy_token => self.by_job.remove(job_id),
            _ => None,
        }
    }

    fn is(&self, job_id: &str, copy_token: u64) -> bool {
        self.by_job.get(job_id).is_some_and(|held| held.copy_token == copy_token)
    }
}

impl EventLoop {
    /// The gateway asks the member to queue copy `copy_token` of `assignment`'s job.
    pub(super) fn on_copy(&mut self, copy_token: u64, assignment: Assignment) {
        let job_id = assignment.job_id.clone();
        if self.lease.is_expired() {
            return self.refuse_copy(job_id, copy_token, LEASE_EXPIRED.into());
        }
        if self.ledger.holds(&job_id) {
            let reason = format!("{} holds a binding of this job; it never holds a copy beside it", self.cluster);
            return self.refuse_copy(job_id, copy_token, reason);
        }
        if self.copies.is(&job_id, copy_token) {
            return;
        }
        // A copy under another token is replaced: the backend drops the old one when it
        // queues the new.
        self.copies.by_job.insert(job_id.clone(), HeldCopy { copy_token, ready: false });
        let label = TaskLabel::Copy { job_id, copy_token };
        self.spawn(label, tasks::copy(Arc::clone(&self.backend), copy_token, assignment));
    }

    /// The backend answered the copy call.
    pub(super) fn on_copied(&mut self, job_id: String, copy_token: u64, result: Result<CopyAdmission, BackendError>) {
        let kept = self.copies.is(&job_id, copy_token);
        match result {
            Ok(CopyAdmission::Queued) if kept => {
                tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, "sibling copy queued locally");
                self.metrics.sibling_copy(CopyOutcome::Queued);
                // It counts in the member's queue pressure.
                self.report_wanted = true;
            }
            // Dropped while it was being queued: free it again.
            Ok(CopyAdmission::Queued) => self.drop_in_backend(job_id, copy_token),
            Ok(CopyAdmission::Refused { reason, unsupported }) => {
                let outcome = if unsupported { CopyOutcome::Unsupported } else { CopyOutcome::Refused };
                self.metrics.sibling_copy(outcome);
                // The gateway hears of an unsupported backend even for a copy it dropped
                // meanwhile: it sends this member no more.
                if kept || unsupported {
                    self.copies.remove_if(&job_id, copy_token);
                    tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, %reason, unsupported, "sibling copy refused");
                    self.send(AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported });
                }
            }
            Err(error) => {
                tracing::warn!(cluster = %self.cluster, job = %job_id, copy_token, %error, "sibling copy not queued");
                self.metrics.sibling_copy(CopyOutcome::Refused);
                if self.copies.remove_if(&job_id, copy_token).is_some() {
                    let reason = format!("the local scheduler on {} failed: {error}", self.cluster);
                    self.send(AgentEvent::CopyDropped {
                        job_id: job_id.clone(),
                        copy_token,
                        reason,
                        unsupported: false,
                    });
                }
                // A failed call may have left something behind.
                self.drop_in_backend(job_id, copy_token);
            }
        }
    }

    /// Something happened to a copy in the backend.
    pub(super) fn on_copy_event(&mut self, event: CopyEvent) {
        match event {
            CopyEvent::Ready { job_id, copy_token } => match self.copies.by_job.get_mut(&job_id) {
                Some(held) if held.copy_token == copy_token => {
                    if held.ready {
                        return;
                    }
                    held.ready = true;
                    self.metrics.sibling_copy(CopyOutcome::Ready);
                    tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, "sibling copy ready; asking for the start lock");
                    self.send(AgentEvent::CopyReady { job_id, copy_token });
                    // Its nodes are taken: the gateway must not count them free.
                    self.report_wanted = true;
                }
                // Nobody waits for it any more: its nodes are wanted elsewhere.
                _ => self.drop_in_backend(job_id, copy_token),
            },
            CopyEvent::Dropped { job_id, copy_token, reason } => {
                if self.copies.remove_if(&job_id, copy_token).is_some() {
                    self.metrics.sibling_copy(CopyOutcome::Dropped);
                    tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, %reason, "sibling copy dropped by the local scheduler");
                    self.send(AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported: false });
                }
            }
        }
    }

    /// The gateway granted copy `copy_token` the start lock of `assignment`'s job.
    pub(super) fn on_grant(&mut self, copy_token: u64, assignment: Assignment) {
        let ready = self.copies.by_job.get(&assignment.job_id).is_some_and(|c| c.copy_token == copy_token && c.ready);
        if !ready {
            tracing::info!(cluster = %self.cluster, job = %assignment.job_id, copy_token, "grant of a copy not ready here; taken as an offer");
            return self.on_offer(assignment);
        }
        self.copies.by_job.remove(&assignment.job_id);
        self.metrics.sibling_copy(CopyOutcome::Granted);
        tracing::info!(cluster = %self.cluster, job = %assignment.job_id, copy_token, fencing_token = assignment.fencing_token, "sibling copy granted; starting it");
        self.handle_offer(assignment, Start::Grant { copy_token });
    }

    /// The gateway drops copy `copy_token` of `job_id`; an unknown copy is ignored.
    pub(super) fn on_drop_copy(&mut self, job_id: String, copy_token: u64) {
        if self.copies.remove_if(&job_id, copy_token).is_none() {
            tracing::debug!(cluster = %self.cluster, job = %job_id, copy_token, "drop of a copy not held ignored");
            return;
        }
        self.metrics.sibling_copy(CopyOutcome::Dropped);
        tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, "sibling copy dropped by the gateway");
        self.drop_in_backend(job_id, copy_token);
    }

    /// Forgets the copy of `job_id`, if any, before an offer or cancel of the job; returns its
    /// token, for the caller to drop it in the backend first.
    pub(super) fn take_copy(&mut self, job_id: &str) -> Option<u64> {
        let held = self.copies.by_job.remove(job_id)?;
        self.metrics.sibling_copy(CopyOutcome::Dropped);
        Some(held.copy_token)
    }

    /// Drops the copy of `job_id`, if any.
    pub(super) fn drop_copy_of(&mut self, job_id: &str) {
        if let Some(copy_token) = self.take_copy(job_id) {
            self.drop_in_backend(job_id.to_string(), copy_token);
        }
    }

    /// Drops every copy: the stream they came on ended (or a new welcome came), and nobody
    /// else can grant them.
    pub(super) fn drop_all_copies(&mut self) {
        let copies = std::mem::take(&mut self.copies.by_job);
        if !copies.is_empty() {
            tracing::info!(cluster = %self.cluster, copies = copies.len(), "dropping every sibling copy: their gateway stream is gone");
        }
        for (job_id, held) in copies {
            self.metrics.sibling_copy(CopyOutcome::Dropped);
            self.drop_in_backend(job_id, held.copy_token);
        }
    }

    /// A start the offer path will not run after all: drops the copy it would have used.
    pub(super) fn abandon_start(&mut self, job_id: &str, start: Start) {
        match start {
            Start::Submit { drop_copy: Some(copy_token) } | Start::Grant { copy_token } => {
                self.drop_in_backend(job_id.to_string(), copy_token);
            }
            Start::Submit { drop_copy: None } => {}
        }
    }

    /// The backend's answer to a drop.
    pub(super) fn on_copy_dropped(&mut self, job_id: &str, copy_token: u64, result: Result<(), BackendError>) {
        if let Err(error) = result {
            tracing::error!(cluster = %self.cluster, job = %job_id, copy_token, %error, "could not drop a sibling copy in the backend; its nodes may stay taken");
        }
        self.report_wanted = true;
    }

    fn refuse_copy(&mut self, job_id: String, copy_token: u64, reason: String) {
        self.metrics.sibling_copy(CopyOutcome::Refused);
        tracing::info!(cluster = %self.cluster, job = %job_id, copy_token, %reason, "sibling copy refused");
        self.send(AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported: false });
    }

    fn drop_in_backend(&mut self, job_id: String, copy_token: u64) {
        let label = TaskLabel::DropCopy { job_id: job_id.clone(), copy_token };
        self.spawn(label, tasks::drop_copy(Arc::clone(&self.backend), job_id, copy_token));
    }
}

/// The next copy event; never when the backend gives none.
pub(super) async fn next_copy_event(events: Option<&mut CopyEventReceiver>) -> Option<CopyEvent> {
    match events {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}
