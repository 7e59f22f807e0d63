//! Sibling copies on Slurm (see [`crate::backend::copies`]): a start gate in the batch script.
//!
//! A copy is an ordinary batch job (`sbatch`, the same options a submit of the job would use),
//! so Slurm's own priority, fair share and backfill plan it exactly; its comment is
//! `<tag>-copy:<job>:<copy token>`, which no agent adopts as a binding. Its script opens with a
//! start gate ([`script::Submission::Copy`]): once Slurm starts it, the batch shell creates
//! `<gate>.ready` in `workDir` and waits, holding the allocation and running nothing of the
//! payload. The status loop sees the job running with its ready file and tells the agent
//! [`CopyEvent::Ready`].
//!
//! The grant is one write, Slurm's own record: the comment becomes the binding's
//! (`<tag>:<job>:<grant token>`). The gate looks at its job's comment and runs the payload under
//! that token once it names a binding of the job, and this or a restarted agent reports and
//! adopts the job as that binding from the same moment: the payload runs exactly when the job
//! is the binding, whatever step an agent stops at. Before that write, the binding's output
//! file becomes a link to the copy's (Slurm fixed it at submit); after it,
//! `scancel --batch --signal=USR2` wakes the gate at once (without it the gate looks again
//! within [`script::GATE_LOOK_SECS`]).
//!
//! A drop rewrites the comment to a cancelled one (never taken for a grant) and `scancel`s the
//! job, waiting or ready. A copy that Slurm ends by itself (a node failure, its time limit while
//! it waits) is reported [`CopyEvent::Dropped`]. Copies die with the agent's stream, so a new
//! backend cancels every copy of its tag that a previous agent process left.
//!
//! Slurm never preempts for a copy only where the copy's QOS cannot preempt: the copy is
//! submitted with the QOS its job would get (see `docs/backends.md#sibling-copies`).

use std::collections::BTreeMap;

use meridian_proto::protocol::Assignment;

use super::command::args;
use super::parse::{QueueRow, cancelled_comment_for, comment_for, copy_of};
use super::script::{self, gate_ready_path};
use super::{Shared, poll};
use crate::backend::{Admission, BackendError, CopyAdmission, CopyEvent, JobPhase};

/// One copy the backend keeps, by job id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlurmCopy {
    pub(crate) copy_token: u64,
    pub(crate) slurm_id: String,
    /// The coordinator port its script exports (the binding's after the grant).
    pub(crate) port: u16,
    /// The nodes Slurm gave it, once it waits at its gate.
    pub(crate) ready_on: Option<Vec<String>>,
}

impl Shared {
    /// Queues copy `copy_token` of `job` as a gated batch job.
    pub(crate) async fn copy_now(&self, copy_token: u64, job: &Assignment) -> Result<CopyAdmission, BackendError> {
        let refused = |reason: String| Ok(CopyAdmission::Refused { reason, unsupported: false });
        let _one_at_a_time = self.submit_lock.lock().await;
        let rows = poll::squeue_all(&self.runner).await?;
        if let Some((token, row)) = poll::meridian_rows(&rows, &self.config.job_tag).remove(&job.job_id)
            && poll::is_live(&row.state)
        {
            return refused(format!(
                "binding {token} of job `{}` is held here (Slurm job {}); a member never holds a copy of a job it holds",
                job.job_id, row.slurm_id
            ));
        }
        match self.copy_of_job(&job.job_id) {
            Some(held) if held.copy_token == copy_token => return Ok(CopyAdmission::Queued),
            // A newer copy of the same job replaces the one held.
            Some(held) => self.cancel_copy(&job.job_id, &held).await?,
            None => {}
        }
        let excluded = self.excluded_by_selector(job).await?;
        let port = self.coordinator_port(&job.job_id, job.fencing_token);
        let contract = script::Contract { cluster: &self.cluster, port };
        let batch = match script::copy_batch_job(job, copy_token, &self.config, &excluded, &contract) {
            Ok(batch) => batch,
            Err(e) => return refused(e.to_string()),
        };
        let slurm_id = match self.sbatch(&batch).await? {
            Ok(slurm_id) => slurm_id,
            Err(refusal) => return refused(refusal),
        };
        tracing::info!(job = %job.job_id, copy_token, %slurm_id, "sibling copy queued in Slurm behind a start gate");
        self.lock_copies().insert(job.job_id.clone(), SlurmCopy { copy_token, slurm_id, port, ready_on: None });
        Ok(CopyAdmission::Queued)
    }

    /// Drops copy `copy_token` of `job_id`, if held.
    pub(crate) async fn drop_copy_now(&self, job_id: &str, copy_token: u64) -> Result<(), BackendError> {
        let _one_at_a_time = self.submit_lock.lock().await;
        match self.copy_of_job(job_id) {
            Some(held) if held.copy_token == copy_token => self.cancel_copy(job_id, &held).await,
            _ => Ok(()),
        }
    }

    /// Grants copy `copy_token` the start of binding `job` (see the module's order); a copy not
    /// held or not ready makes it a submit.
    pub(crate) async fn grant_now(&self, copy_token: u64, job: &Assignment) -> Result<Admission, BackendError> {
        let guard = self.submit_lock.lock().await;
        let held = self.copy_of_job(&job.job_id);
        let ready = held.as_ref().filter(|h| h.copy_token == copy_token).and_then(|h| h.ready_on.clone());
        let (Some(held), Some(nodes)) = (held, ready) else {
            if let Some(held) = self.copy_of_job(&job.job_id) {
                self.cancel_copy(&job.job_id, &held).await?;
            }
            drop(guard);
            return self.submit_now(job).await;
        };
        // Slurm fixed the copy's output file at submit: the binding's output is a link to it
        // (made first; it leads nowhere used should the grant stop here).
        let output = script::output_path(&self.config.work_dir, &job.job_id, job.fencing_token);
        let copy_output = script::copy_output_path(&self.config.work_dir, &job.job_id, copy_token);
        let _ = tokio::fs::remove_file(&output).await;
        if let Err(error) = tokio::fs::symlink(&copy_output, &output).await {
            tracing::warn!(job = %job.job_id, %error, "could not link the binding's output to its copy's; its logs stay in {}", copy_output.display());
        }
        let comment = format!("Comment={}", comment_for(&self.config.job_tag, &job.job_id, job.fencing_token));
        let id = held.slurm_id.as_str();
        let out = self.runner.run("scontrol", &args(&["update", &format!("JobId={id}"), &comment]), None).await?;
        if !out.success() {
            // Slurm ended it meanwhile (the status loop reports the drop): the grant is a submit.
            tracing::warn!(job = %job.job_id, copy_token, slurm_id = %id, error = %out.message(), "granted copy is gone; submitting the job instead");
            self.lock_copies().remove(&job.job_id);
            drop(guard);
            return self.submit_now(job).await;
        }
        self.lock_copies().remove(&job.job_id);
        let phase = JobPhase::Running { nodes: nodes.clone() };
        self.track(&job.job_id, job.fencing_token, id, &phase, Some(held.port));
        self.wake_gate(id).await;
        tracing::info!(job = %job.job_id, copy_token, fencing_token = job.fencing_token, slurm_id = %id, "sibling copy granted; its gate is open");
        Ok(Admission::Started { nodes })
    }

    /// Wakes the batch shell of `slurm_id` at its gate, so that it looks at its comment now.
    async fn wake_gate(&self, slurm_id: &str) {
        let signal = self.runner.run("scancel", &args(&["--batch", "--signal=USR2", slurm_id]), None).await;
        if let Err(error) = signal
            .as_ref()
            .map_err(ToString::to_string)
            .and_then(|out| if out.success() { Ok(()) } else { Err(out.message()) })
        {
            // The gate looks at its comment again within GATE_LOOK_SECS anyway.
            tracing::warn!(slurm_id, %error, "could not signal the start gate; it opens at its next look");
        }
    }

    /// One status sync's look at the copies: a copy waiting at its gate is ready; one Slurm ended
    /// is dropped. `rows` is the sync's `squeue`.
    pub(crate) async fn watch_copies(&self, rows: &[QueueRow]) {
        let held: Vec<(String, SlurmCopy)> = self.lock_copies().iter().map(|(j, c)| (j.clone(), c.clone())).collect();
        for (job_id, copy) in held {
            let row = rows.iter().find(|r| r.slurm_id == copy.slurm_id);
            let event = match row {
                Some(row) if poll::is_live(&row.state) => {
                    let at_gate = copy.ready_on.is_none()
                        && row.state == "RUNNING"
                        && tokio::fs::try_exists(gate_ready_path(&self.config.work_dir, &copy.slurm_id))
                            .await
                            .unwrap_or(false);
                    if !at_gate {
                        continue;
                    }
                    CopyEvent::Ready { job_id: job_id.clone(), copy_token: copy.copy_token }
                }
                _ => CopyEvent::Dropped {
                    job_id: job_id.clone(),
                    copy_token: copy.copy_token,
                    reason: match row {
                        Some(row) => format!("Slurm job {} ended {} before its grant", copy.slurm_id, row.state),
                        None => format!("Slurm job {} vanished from the controller", copy.slurm_id),
                    },
                },
            };
            let mut copies = self.lock_copies();
            // A grant, drop or newer copy may have taken the entry while we looked.
            let Some(now) = copies.get_mut(&job_id).filter(|now| **now == copy) else { continue };
            match &event {
                CopyEvent::Ready { .. } => now.ready_on = row.map(|r| r.node_list.clone()),
                CopyEvent::Dropped { .. } => {
                    copies.remove(&job_id);
                }
            }
            drop(copies);
            let _ = self.copy_events.send(event);
        }
    }

    /// Cancels every live copy of this backend's tag in Slurm: copies belong to the stream of the
    /// agent that queued them, and a new backend is a new agent.
    pub(crate) async fn cancel_orphan_copies(&self) -> Result<usize, BackendError> {
        let rows = poll::squeue_all(&self.runner).await?;
        let mut cancelled = 0;
        for row in rows.iter().filter(|r| poll::is_live(&r.state)) {
            let Some((job_id, copy_token)) = copy_of(&self.config.job_tag, &row.comment) else { continue };
            let copy = SlurmCopy { copy_token, slurm_id: row.slurm_id.clone(), port: 0, ready_on: None };
            self.cancel_copy(&job_id, &copy).await?;
            cancelled += 1;
        }
        if cancelled > 0 {
            tracing::info!(cancelled, "cancelled the sibling copies a previous agent left in Slurm");
        }
        Ok(cancelled)
    }

    fn copy_of_job(&self, job_id: &str) -> Option<SlurmCopy> {
        self.lock_copies().get(job_id).cloned()
    }

    /// Cancels `copy` in Slurm (comment first, so nobody reads it as a copy any more) and
    /// forgets it; its ready mark goes with it.
    async fn cancel_copy(&self, job_id: &str, copy: &SlurmCopy) -> Result<(), BackendError> {
        let id = copy.slurm_id.as_str();
        self.cancel_in_slurm(id, &cancelled_comment_for(&self.config.job_tag, job_id, copy.copy_token)).await?;
        {
            let mut copies = self.lock_copies();
            if copies.get(job_id).is_some_and(|held| held.slurm_id == copy.slurm_id) {
                copies.remove(job_id);
            }
        }
        let _ = tokio::fs::remove_file(gate_ready_path(&self.config.work_dir, id)).await;
        tracing::info!(job = %job_id, copy_token = copy.copy_token, slurm_id = %id, "sibling copy cancelled in Slurm");
        Ok(())
    }

    pub(crate) fn lock_copies(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SlurmCopy>> {
        self.copies.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
