//! The job table: every change to a job goes through [`Core::save`], which keeps the indexes
//! and asks for the record to be persisted. Submit and cancel live here too.

use std::sync::Arc;

use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;
use meridian_proto::spec::JobSpec;

use crate::io::{Effects, Error, Reply};
use crate::record::{JobRecord, Record};
use crate::{ActiveJob, Core, Decided};

/// States in which a job holds (or is about to hold) GPUs on its cluster.
pub(crate) fn holds_gpus(state: JobState) -> bool {
    matches!(state, JobState::Offered | JobState::Bound | JobState::Running | JobState::Unknown)
}

impl Core {
    /// Moves `job` in the indexes that depend on its state and cluster (`previous`: its record
    /// before this change, if any).
    pub(crate) fn index(&mut self, previous: Option<&JobRecord>, job: &Arc<JobRecord>) {
        if let Some(cluster) = previous.and_then(|p| p.cluster.as_ref())
            && let Some(ids) = self.by_cluster.get_mut(cluster)
        {
            ids.remove(&job.id);
            if ids.is_empty() {
                self.by_cluster.remove(cluster);
            }
        }
        if job.state.is_terminal() {
            self.active.remove(&job.id);
            self.finished.insert((job.finished_at_ms.unwrap_or(job.submitted_at_ms), job.id.clone()));
        } else {
            match self.active.get_mut(&job.id) {
                Some(active) => active.record = Arc::clone(job),
                None => {
                    let decided = self.decisions.get(&job.id).map(Arc::clone);
                    self.active.insert(job.id.clone(), ActiveJob { record: Arc::clone(job), demand: None, decided });
                }
            }
            if let Some(cluster) = &job.cluster {
                self.by_cluster.entry(cluster.clone()).or_default().insert(job.id.clone());
            }
        }
    }

    /// Makes `decided` the latest decision of job `id`, for readers and for the rounds.
    pub(crate) fn decide(&mut self, id: &str, decided: Decided) {
        let decided = Arc::new(decided);
        if let Some(active) = self.active.get_mut(id) {
            active.decided = Some(Arc::clone(&decided));
        }
        self.decisions.insert(id.to_string(), decided);
    }

    /// Panics if an index disagrees with a full scan of the jobs (tests).
    #[cfg(test)]
    pub(crate) fn check_indexes(&self) {
        use std::collections::{BTreeSet, HashMap};
        let active: BTreeSet<String> =
            self.jobs.values().filter(|j| !j.state.is_terminal()).map(|j| j.id.clone()).collect();
        assert!(active.iter().eq(self.active.keys()), "active index holds other ids than the active jobs");
        for (id, active) in &self.active {
            assert!(
                self.jobs.get(id).is_some_and(|current| Arc::ptr_eq(current, &active.record)),
                "active index has a stale {id}"
            );
            let decided = self.decisions.get(id);
            assert!(
                match (decided, &active.decided) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                },
                "active index has a stale decision of {id}"
            );
        }
        let mut by_cluster: HashMap<String, BTreeSet<String>> = HashMap::new();
        for job in self.jobs.values().filter(|j| !j.state.is_terminal()) {
            if let Some(cluster) = &job.cluster {
                by_cluster.entry(cluster.clone()).or_default().insert(job.id.clone());
            }
        }
        assert_eq!(by_cluster, self.by_cluster, "by-cluster index");
    }

    /// Active jobs offered to, bound to or running on `cluster`.
    pub(crate) fn jobs_on<'a>(&'a self, cluster: &str) -> impl Iterator<Item = &'a Arc<JobRecord>> + 'a {
        self.by_cluster.get(cluster).into_iter().flatten().filter_map(|id| self.jobs.get(id))
    }

    /// Replaces a job's record, keeps the indexes and timers right, and persists it.
    pub(crate) fn save(&mut self, job: JobRecord, effects: &mut Effects) {
        if job.state != JobState::Offered {
            self.offered_at.remove(&job.id);
            self.withdrawing.remove(&job.id);
        }
        if job.state != JobState::Unknown {
            self.unknown_since.remove(&job.id);
        }
        if job.state == JobState::Queued || job.state.is_terminal() {
            // Capacity or the queue changed.
            self.round_wanted = true;
        }
        let previous = self.jobs.get(&job.id).cloned();
        if previous.as_ref().is_none_or(|p| p.cluster != job.cluster || p.state != job.state) {
            // Per-cluster job counts in the summaries may have changed.
            self.clusters_version += 1;
        }
        self.count_job_change(previous.as_deref(), &job);
        effects.persist.push(Record::Job(job.clone()));
        let job = Arc::new(job);
        self.index(previous.as_deref(), &job);
        self.jobs.insert(job.id.clone(), job);
    }

    /// A copy of a job to change and [`save`](Self::save).
    pub(crate) fn job_mut(&self, id: &str) -> Option<JobRecord> {
        self.jobs.get(id).map(|j| JobRecord::clone(j))
    }

    fn new_job_id(&mut self, now_ms: i64) -> String {
        loop {
            self.id_sequence += 1;
            // Fixed-width hex: ids sort by submission time, then by gateway process, then by order.
            let id = format!("j-{:011x}{:04x}{:06x}", now_ms.max(0), self.id_salt, self.id_sequence & 0xff_ffff);
            if !self.jobs.contains_key(&id) {
                return id;
            }
        }
    }

    pub(crate) fn submit(&mut self, spec: JobSpec, now_ms: i64, effects: &mut Effects) -> Result<Reply, Error> {
        if let Some(key) = &spec.idempotency_key
            && let Some(existing) = self.idempotency.get(&(spec.tenant.clone(), key.clone()))
            && let Some(job) = self.jobs.get(existing)
        {
            if job.spec != spec {
                return Err(Error::IdempotencyConflict { key: key.clone(), existing: existing.clone() });
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
        // Whether a job could ever run depends only on the clusters' shapes: the snapshot is
        // built once and kept until a cluster joins or changes shape.
        let snapshot = match &self.never_fits_snapshot {
            Some(snapshot) => Arc::clone(snapshot),
            None => {
                let snapshot = Arc::new(self.registry.snapshot(&self.network, &self.config.placement.gpu_speed));
                self.never_fits_snapshot = Some(Arc::clone(&snapshot));
                snapshot
            }
        };
        if let Some(reasons) = meridian_placement::never_fits(&spec, &snapshot) {
            self.count_decision(crate::tally::Outcome::RefusedNeverFits, None);
            return Err(Error::NeverFits {
                reasons: reasons.into_iter().map(|(cluster, why)| (cluster, why.to_string())).collect(),
            });
        }
        let job = JobRecord::queued(self.new_job_id(now_ms), spec, "waiting for placement", now_ms);
        if let Some(key) = &job.spec.idempotency_key {
            self.idempotency.insert((job.spec.tenant.clone(), key.clone()), job.id.clone());
        }
        tracing::info!(job = %job.id, name = %job.spec.name, tenant = %job.spec.tenant, "job accepted");
        let id = job.id.clone();
        self.save(job, effects);
        let job = self.jobs.get(&id).map(Arc::clone).ok_or(Error::NotFound(id))?;
        Ok(Reply::Submitted { job, created: true })
    }

    pub(crate) fn cancel(&mut self, id: &str, now_ms: i64, effects: &mut Effects) -> Result<Reply, Error> {
        let mut job = self.job_mut(id).ok_or_else(|| Error::NotFound(id.to_string()))?;
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
        self.save(job, effects);
        let job = self.jobs.get(&job_id).map(Arc::clone).ok_or(Error::NotFound(job_id))?;
        Ok(Reply::Cancelled(job))
    }

    /// Forgets finished jobs whose retention has passed, with their decisions.
    pub(crate) fn expire_finished(&mut self, now_ms: i64, effects: &mut Effects) {
        let retention_ms = i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(retention_ms);
        while let Some((finished_at, id)) = self.finished.first().cloned() {
            if finished_at > cutoff {
                break;
            }
            self.finished.pop_first();
            // The index may hold an older finish time of a job that was saved again; only the
            // job's current finish time counts.
            let Some(job) = self.jobs.get(&id) else { continue };
            if !job.state.is_terminal() || job.finished_at_ms.unwrap_or(job.submitted_at_ms) != finished_at {
                continue;
            }
            if let Some(key) = &job.spec.idempotency_key {
                let owner = (job.spec.tenant.clone(), key.clone());
                if self.idempotency.get(&owner) == Some(&id) {
                    self.idempotency.remove(&owner);
                }
            }
            self.jobs.remove(&id);
            if self.decisions.remove(&id).is_some() {
                effects.persist.push(Record::DeleteDecision(id.clone()));
            }
            effects.persist.push(Record::DeleteJob(id));
        }
    }

    /// Records the decision that placed a job, durable with the offer.
    pub(crate) fn save_decision(
        &mut self,
        id: &str,
        at_ms: i64,
        decision: meridian_placement::Decision,
        effects: &mut Effects,
    ) {
        let stored = crate::view::stored_decision(at_ms, &decision);
        effects.persist.push(Record::Decision(id.to_string(), stored));
        self.decide(id, Decided::Live { at_ms, decision });
    }
}
