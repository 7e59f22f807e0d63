//! The status loop: every `pollInterval` one `squeue` over all jobs, diffed against what the
//! backend last reported for each binding it tracks, turned into [`JobEvent`]s; the same
//! `squeue` tells which sibling copies wait at their start gate ([`super::copies`]).

use std::sync::Arc;
use std::sync::Weak;

use super::super::{BackendError, JobEvent, JobPhase};
use super::Shared;
use super::command::{Runner, args};
use super::parse::{QueueRow, SQUEUE_FORMAT, parse_job, parse_squeue};

/// Slurm states in which a job still holds or waits for resources.
pub(crate) fn is_live(state: &str) -> bool {
    matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_HOLD"
            | "REQUEUE_FED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
    )
}

/// `squeue` over every job in every state Slurm still remembers.
pub(crate) async fn squeue_all(runner: &Runner) -> Result<Vec<QueueRow>, BackendError> {
    let text = runner.query("squeue", &args(&["-h", "-a", "-t", "all", "-o", SQUEUE_FORMAT])).await?;
    Ok(parse_squeue(&text))
}

/// The newest Slurm job carrying each Meridian binding, by job id.
pub(crate) fn meridian_rows(rows: &[QueueRow], tag: &str) -> std::collections::BTreeMap<String, (u64, QueueRow)> {
    let mut newest: std::collections::BTreeMap<String, (u64, QueueRow)> = std::collections::BTreeMap::new();
    for row in rows {
        let Some((job_id, token)) = row.binding(tag) else { continue };
        if refused_at_submit(row) {
            continue;
        }
        let id: u64 = row.slurm_id.parse().unwrap_or(0);
        let newer = match newest.get(&job_id) {
            Some((_, old)) => old.slurm_id.parse::<u64>().unwrap_or(0) < id,
            None => true,
        };
        if newer {
            newest.insert(job_id, (token, row.clone()));
        }
    }
    newest
}

/// `sbatch` refused the job: Slurm still records it, as FAILED with reason BadConstraints,
/// but it was never held.
pub(crate) fn refused_at_submit(row: &QueueRow) -> bool {
    row.state == "FAILED" && row.reason == "BadConstraints" && row.node_list.is_empty()
}

/// The Meridian phase of a Slurm job; asks `scontrol` for the exit code of a failed one.
pub(crate) async fn phase_of(runner: &Runner, row: &QueueRow) -> JobPhase {
    let id = &row.slurm_id;
    match row.state.as_str() {
        "RUNNING" | "CONFIGURING" | "COMPLETING" | "SIGNALING" | "STAGE_OUT" | "RESIZING" => {
            JobPhase::Running { nodes: row.node_list.clone() }
        }
        state if is_live(state) => JobPhase::Pending { reason: pending_reason(row) },
        "COMPLETED" => JobPhase::Succeeded { message: format!("Slurm job {id} completed (exit code 0)") },
        "TIMEOUT" => {
            let limit = job_record(runner, id).await.map(|r| r.time_limit).unwrap_or_default();
            JobPhase::Failed {
                message: format!("Slurm job {id} was stopped at its time limit ({limit}; runtime.limit)"),
            }
        }
        "PREEMPTED" => {
            JobPhase::Preempted { message: format!("Slurm job {id} was preempted by Slurm for higher-priority work") }
        }
        "CANCELLED" => JobPhase::Failed { message: format!("Slurm job {id} was cancelled in Slurm, outside Meridian") },
        "FAILED" => match job_record(runner, id).await {
            Some(record) => JobPhase::Failed {
                message: match (record.exit_code, record.exit_signal) {
                    (Some(code), Some(signal)) if signal != 0 => {
                        format!("Slurm job {id} failed: exit code {code}, signal {signal}")
                    }
                    (Some(code), _) => format!("Slurm job {id} failed: exit code {code}"),
                    _ => format!("Slurm job {id} failed ({})", record.reason),
                },
            },
            None => JobPhase::Failed { message: format!("Slurm job {id} failed ({})", row.reason) },
        },
        other => JobPhase::Failed { message: format!("Slurm job {id} ended {other} ({})", row.reason) },
    }
}

/// `Slurm: Resources`, or a note that the scheduler has not looked at the job yet.
pub(crate) fn pending_reason(row: &QueueRow) -> String {
    match row.reason.as_str() {
        "" | "None" => format!("Slurm: job {} waits for the scheduler's next pass", row.slurm_id),
        reason => format!("Slurm: {reason}"),
    }
}

async fn job_record(runner: &Runner, id: &str) -> Option<super::parse::JobRecord> {
    let text = runner.query("scontrol", &args(&["-o", "show", "job", id])).await.ok()?;
    parse_job(&text)
}

/// Runs until the backend is dropped (its owner aborts this task).
pub(crate) async fn run_status_loop(shared: Weak<Shared>) {
    let interval = match shared.upgrade() {
        Some(shared) => shared.config.poll_interval.0,
        None => return,
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        if let Err(e) = sync_status(&shared).await {
            tracing::warn!(error = %e, "slurm status poll failed; retrying");
        }
    }
}

/// One status sync: reads every job once and reports what changed for tracked bindings.
pub(crate) async fn sync_status(shared: &Arc<Shared>) -> Result<usize, BackendError> {
    let rows = squeue_all(&shared.runner).await?;
    let tracked: Vec<(String, super::Tracked)> =
        shared.lock_tracked().iter().map(|(job, t)| (job.clone(), t.clone())).collect();
    let by_id: std::collections::HashMap<&str, &QueueRow> = rows.iter().map(|r| (r.slurm_id.as_str(), r)).collect();
    let mut sent = 0;
    for (job_id, before) in tracked {
        let phase = match by_id.get(before.slurm_id.as_str()) {
            Some(row) => phase_of(&shared.runner, row).await,
            None => JobPhase::Failed {
                message: format!("Slurm job {} vanished from the controller without an end state", before.slurm_id),
            },
        };
        if phase == before.phase {
            continue;
        }
        let mut tracked = shared.lock_tracked();
        // A cancel or a newer binding may have taken the entry while we asked Slurm.
        match tracked.get_mut(&job_id) {
            Some(now) if now.slurm_id == before.slurm_id && now.phase == before.phase => {
                if phase.is_terminal() {
                    tracked.remove(&job_id);
                } else {
                    now.phase = phase.clone();
                }
            }
            _ => continue,
        }
        drop(tracked);
        // A job that started and ended between two polls: say where it ran before how it ended,
        // so the gateway knows its nodes (each replica's rank and node) and that it started.
        let ran_on = by_id.get(before.slurm_id.as_str()).map(|row| row.node_list.clone()).unwrap_or_default();
        if phase.is_terminal() && matches!(before.phase, JobPhase::Pending { .. }) && !ran_on.is_empty() {
            sent += 1;
            let running = JobPhase::Running { nodes: ran_on };
            let _ = shared.events.send(JobEvent {
                job_id: job_id.clone(),
                fencing_token: before.fencing_token,
                phase: running,
            });
        }
        sent += 1;
        let _ = shared.events.send(JobEvent { job_id, fencing_token: before.fencing_token, phase });
    }
    shared.watch_copies(&rows).await;
    Ok(sent)
}
