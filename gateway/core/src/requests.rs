//! What users ask of the core: submit a job, cancel one, read its output.

use std::sync::Arc;

use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;
use meridian_proto::spec::JobSpec;

use crate::config::CoreConfig;
use crate::io::{Effects, Error, Reply};
use crate::jobs::JobTable;
use crate::ledger::Ledger;
use crate::record::JobRecord;
use crate::registry::Registry;
use crate::snapshots::Snapshots;
use crate::tally::Outcome;

/// The parts a submit or a cancel reads and changes, borrowed from the core for one step.
pub(crate) struct Requests<'a> {
    /// Quotas and placement settings.
    pub(crate) config: &'a CoreConfig,
    /// Where cancels are sent.
    pub(crate) registry: &'a Registry,
    /// What submits are checked against.
    pub(crate) snapshots: &'a mut Snapshots,
    /// The jobs.
    pub(crate) ledger: Ledger<'a>,
}

impl Requests<'_> {
    /// Accepts `spec` as a new queued job, or returns the earlier job with the same tenant and
    /// idempotency key; refuses a job over its tenant's whole GPU quota or one no known cluster
    /// could ever run.
    pub(crate) fn submit(&mut self, spec: JobSpec, now_ms: i64, effects: &mut Effects) -> Result<Reply, Error> {
        if let Some(key) = &spec.idempotency_key
            && let Some(job) = self.ledger.table.keyed(&spec.tenant, key)
        {
            if job.spec != spec {
                return Err(Error::IdempotencyConflict { key: key.clone(), existing: job.id.clone() });
            }
            return Ok(Reply::Submitted { job: Arc::clone(job), created: false });
        }
        if let Some(limit) = self.config.quota(&spec.tenant).max_gpus
            && spec.total_gpus() > limit
        {
            return Err(Error::ExceedsQuota {
                field: format!("{}.maxGpus", self.config.quota_source(&spec.tenant)),
                tenant: spec.tenant.clone(),
                limit,
                needs: spec.total_gpus(),
            });
        }
        let snapshot = self.snapshots.for_never_fits(self.registry, &self.config.placement.gpu_speed);
        if let Some(reasons) = meridian_placement::never_fits(&spec, &snapshot) {
            self.ledger.tally().count_decision(Outcome::RefusedNeverFits, None);
            return Err(Error::NeverFits {
                reasons: reasons.into_iter().map(|(cluster, why)| (cluster, why.to_string())).collect(),
            });
        }
        let job = JobRecord::queued(self.ledger.table.new_id(now_ms), spec, "waiting for placement", now_ms);
        self.ledger.table.remember_key(&job);
        tracing::info!(job = %job.id, name = %job.spec.name, tenant = %job.spec.tenant, "job accepted");
        let id = job.id.clone();
        self.ledger.save(job, self.registry, effects);
        let job = self.ledger.table.get(&id).map(Arc::clone).ok_or(Error::NotFound(id))?;
        Ok(Reply::Submitted { job, created: true })
    }

    /// Cancels job `id`; a placed job's member is told to stop it once the cancel is durable.
    pub(crate) fn cancel(&mut self, id: &str, now_ms: i64, effects: &mut Effects) -> Result<Reply, Error> {
        let mut job = self.ledger.copy_of(id).ok_or_else(|| Error::NotFound(id.to_string()))?;
        if job.state.is_terminal() {
            return Ok(Reply::Cancelled(Arc::new(job)));
        }
        let placed = job.state != JobState::Queued;
        job.state = JobState::Cancelled;
        job.finished_at_ms = Some(now_ms);
        job.message = match job.cluster.clone() {
            Some(cluster) if placed => match self.registry.conn_of(&cluster) {
                Some(conn) => {
                    // Sent only after the Cancelled record is durable (the runtime's rule), so a
                    // crash cannot leave a job stopped on its member but Running at the gateway.
                    effects.sends.push((
                        conn,
                        GatewayCommand::Cancel { job_id: job.id.clone(), fencing_token: job.fencing_token },
                    ));
                    format!("cancelled by user; stop sent to {cluster}")
                }
                None => format!("cancelled by user; {cluster} is unreachable and will drop the job when it reconnects"),
            },
            _ => "cancelled by user before placement".into(),
        };
        tracing::info!(job = %job.id, "job cancelled by user");
        let job_id = job.id.clone();
        self.ledger.save(job, self.registry, effects);
        let job = self.ledger.table.get(&job_id).map(Arc::clone).ok_or(Error::NotFound(job_id))?;
        Ok(Reply::Cancelled(job))
    }
}

/// Sends a logs request for `job_id` to the stream of the cluster that holds its current
/// binding, and names that stream. Changes nothing: it works while the core refuses changes.
pub(crate) fn logs(
    jobs: &JobTable,
    registry: &Registry,
    job_id: &str,
    request_id: u64,
    from: Option<u64>,
    max_bytes: u32,
    effects: &mut Effects,
) -> Result<Reply, Error> {
    let job = jobs.get(job_id).ok_or_else(|| Error::NotFound(job_id.to_string()))?;
    let Some(cluster) = job.cluster.as_deref().filter(|_| job.fencing_token > 0) else {
        return Err(Error::NotStarted(job_id.to_string()));
    };
    let conn = registry
        .conn_of(cluster)
        .ok_or_else(|| Error::ClusterUnreachable { cluster: cluster.to_string(), job: job_id.to_string() })?;
    let command = meridian_proto::protocol::GatewayCommand::Logs {
        request_id,
        job_id: job_id.to_string(),
        fencing_token: job.fencing_token,
        from,
        max_bytes,
    };
    effects.sends.push((conn, command));
    Ok(Reply::LogsAsked { conn })
}
