//! The job table: every job the gateway remembers (active ones and finished ones within
//! retention), each job's latest placement decision, and the indexes that spare rounds,
//! heartbeats and retention a scan of every job. Every change of a record goes through
//! [`JobTable::put`], which keeps the indexes right; what else a change must keep in step (its
//! timers, the counters, the store) is in `ledger.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use meridian_placement::JobClass;
use meridian_proto::job::JobState;

use crate::decision::Decided;
use crate::held::{HeldBook, Ranks, TenantId};
use crate::record::{JobRecord, Record};

/// An active job as rounds read it: its record, and what rounds keep about it between rounds.
pub(crate) struct ActiveJob {
    /// The current record (the one the table holds).
    pub(crate) record: Arc<JobRecord>,
    /// The record's state, kept beside it so that a round skips the jobs it does not place
    /// (bound, running) without reading their records.
    pub(crate) state: JobState,
    /// The number of the job's tenant in the table's [`HeldBook`].
    pub(crate) tenant: TenantId,
    /// Its demand key (see `demand.rs`) and the key's number, worked out at its first round.
    pub(crate) demand: Option<(Arc<JobClass>, u32)>,
    /// Its latest decision: the one the table holds for it.
    pub(crate) decided: Option<Arc<Decided>>,
}

/// The jobs, their decisions and their indexes. See the module documentation.
pub(crate) struct JobTable {
    /// Every job the gateway remembers, by id (shared with the read views).
    jobs: imbl::OrdMap<String, Arc<JobRecord>>,
    /// Jobs not in a terminal state, with their current records, by id: what rounds and the
    /// cluster summaries read, without looking every active job up in `jobs`.
    active: BTreeMap<String, ActiveJob>,
    /// Active jobs by the cluster they are offered to, bound to or ran on: what heartbeats,
    /// welcomes and lost clusters look at, without scanning every active job.
    by_cluster: HashMap<String, BTreeSet<String>>,
    /// Finished jobs by finish time, for retention.
    finished: BTreeSet<(i64, String)>,
    /// (tenant, idempotency key) → job id.
    idempotency: HashMap<(String, String), String>,
    /// Each job's latest decision (shared with the read views).
    decisions: imbl::HashMap<String, Arc<Decided>>,
    /// What each tenant's active jobs hold, kept in step by [`Self::put`].
    held: HeldBook,
    /// Keeps the ids of two gateway processes apart.
    id_salt: u16,
    id_sequence: u64,
}

impl JobTable {
    /// An empty table whose new ids carry `id_salt`.
    pub(crate) fn new(id_salt: u16) -> Self {
        Self {
            jobs: imbl::OrdMap::new(),
            active: BTreeMap::new(),
            by_cluster: HashMap::new(),
            finished: BTreeSet::new(),
            idempotency: HashMap::new(),
            decisions: imbl::HashMap::new(),
            held: HeldBook::default(),
            id_salt,
            id_sequence: 0,
        }
    }

    /// A job by id.
    pub(crate) fn get(&self, id: &str) -> Option<&Arc<JobRecord>> {
        self.jobs.get(id)
    }

    /// A copy of a job to change and put back.
    pub(crate) fn copy_of(&self, id: &str) -> Option<JobRecord> {
        self.jobs.get(id).map(|j| JobRecord::clone(j))
    }

    /// Number of jobs remembered.
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Number of jobs not yet finished.
    pub(crate) fn active_len(&self) -> usize {
        self.active.len()
    }

    /// The active jobs, oldest first (ids sort by submission).
    pub(crate) fn active(&self) -> impl Iterator<Item = &ActiveJob> + '_ {
        self.active.values()
    }

    /// Active jobs offered to, bound to or running on `cluster`.
    pub(crate) fn on_cluster<'a>(&'a self, cluster: &str) -> impl Iterator<Item = &'a Arc<JobRecord>> + 'a {
        self.by_cluster.get(cluster).into_iter().flatten().filter_map(|id| self.jobs.get(id))
    }

    /// Each tenant's rank in name order and what its jobs hold now, for a round.
    pub(crate) fn tenant_ranks(&self) -> Ranks {
        self.held.ranks()
    }

    /// Every job, by id (what read views share).
    pub(crate) fn records(&self) -> &imbl::OrdMap<String, Arc<JobRecord>> {
        &self.jobs
    }

    /// Every job's latest decision (what read views share).
    pub(crate) fn decisions(&self) -> &imbl::HashMap<String, Arc<Decided>> {
        &self.decisions
    }

    /// Replaces (or adds) a job's record and moves it in the indexes; returns the record it
    /// replaced.
    pub(crate) fn put(&mut self, job: Arc<JobRecord>) -> Option<Arc<JobRecord>> {
        let previous = self.jobs.get(&job.id).cloned();
        self.index(previous.as_deref(), &job);
        self.jobs.insert(job.id.clone(), job);
        previous
    }

    /// Makes `decided` the latest decision of job `id`, for readers and for the rounds.
    pub(crate) fn decide(&mut self, id: &str, decided: Arc<Decided>) {
        if let Some(active) = self.active.get_mut(id) {
            active.decided = Some(Arc::clone(&decided));
        }
        self.decisions.insert(id.to_string(), decided);
    }

    /// The number of job `id`'s demand key, if a round worked it out already.
    pub(crate) fn demand(&self, id: &str) -> Option<u32> {
        self.active.get(id).and_then(|a| a.demand.as_ref()).map(|(_, number)| *number)
    }

    /// Keeps the demand key of active job `id` (a clone of the canonical copy) for later rounds.
    pub(crate) fn set_demand(&mut self, id: &str, key: (Arc<JobClass>, u32)) {
        if let Some(active) = self.active.get_mut(id) {
            active.demand = Some(key);
        }
    }

    /// A fresh job id for a submit at `now_ms`.
    pub(crate) fn new_id(&mut self, now_ms: i64) -> String {
        loop {
            self.id_sequence += 1;
            // Fixed-width hex: ids sort by submission time, then by gateway process, then by order.
            let id = format!("j-{:011x}{:04x}{:06x}", now_ms.max(0), self.id_salt, self.id_sequence & 0xff_ffff);
            if !self.jobs.contains_key(&id) {
                return id;
            }
        }
    }

    /// The job that holds `key` for `tenant`, if any.
    pub(crate) fn keyed(&self, tenant: &str, key: &str) -> Option<&Arc<JobRecord>> {
        let id = self.idempotency.get(&(tenant.to_string(), key.to_string()))?;
        self.jobs.get(id)
    }

    /// Remembers `job`'s idempotency key, if it has one.
    pub(crate) fn remember_key(&mut self, job: &JobRecord) {
        if let Some(key) = &job.spec.idempotency_key {
            self.idempotency.insert((job.spec.tenant.clone(), key.clone()), job.id.clone());
        }
    }

    /// Forgets the jobs that finished at or before `cutoff_ms` (Unix ms), with their decisions
    /// and idempotency keys; returns the deletes to persist, in order.
    pub(crate) fn forget_finished(&mut self, cutoff_ms: i64) -> Vec<Record> {
        let mut deletes = Vec::new();
        while let Some((finished_at, id)) = self.finished.first().cloned() {
            if finished_at > cutoff_ms {
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
                deletes.push(Record::DeleteDecision(id.clone()));
            }
            deletes.push(Record::DeleteJob(id));
        }
        deletes
    }

    /// Moves `job` in the indexes that depend on its state and cluster (`previous`: its record
    /// before this change, if any).
    fn index(&mut self, previous: Option<&JobRecord>, job: &Arc<JobRecord>) {
        if let Some(cluster) = previous.and_then(|p| p.cluster.as_ref())
            && let Some(ids) = self.by_cluster.get_mut(cluster)
        {
            ids.remove(&job.id);
            if ids.is_empty() {
                self.by_cluster.remove(cluster);
            }
        }
        self.held.changed(previous, job);
        if job.state.is_terminal() {
            self.active.remove(&job.id);
            self.finished.insert((job.finished_at_ms.unwrap_or(job.submitted_at_ms), job.id.clone()));
        } else {
            match self.active.get_mut(&job.id) {
                Some(active) => {
                    active.record = Arc::clone(job);
                    active.state = job.state;
                    if previous.is_some_and(|p| p.spec.tenant != job.spec.tenant) {
                        active.tenant = self.held.id(&job.spec.tenant);
                    }
                }
                None => {
                    let decided = self.decisions.get(&job.id).map(Arc::clone);
                    let active = ActiveJob {
                        record: Arc::clone(job),
                        state: job.state,
                        tenant: self.held.id(&job.spec.tenant),
                        demand: None,
                        decided,
                    };
                    self.active.insert(job.id.clone(), active);
                }
            }
            if let Some(cluster) = &job.cluster {
                self.by_cluster.entry(cluster.clone()).or_default().insert(job.id.clone());
            }
        }
    }

    /// Panics if an index disagrees with a full scan of the jobs (tests).
    #[cfg(test)]
    pub(crate) fn check_indexes(&self) {
        let active: BTreeSet<String> =
            self.jobs.values().filter(|j| !j.state.is_terminal()).map(|j| j.id.clone()).collect();
        assert!(active.iter().eq(self.active.keys()), "active index holds other ids than the active jobs");
        let mut held = HeldBook::default();
        for (id, active) in &self.active {
            assert!(
                self.jobs.get(id).is_some_and(|current| Arc::ptr_eq(current, &active.record)),
                "active index has a stale {id}"
            );
            assert_eq!(active.state, active.record.state, "active index has a stale state of {id}");
            assert_eq!(active.tenant, self.held.id_of(&active.record.spec.tenant), "tenant number of {id}");
            held.changed(None, &active.record);
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
        assert!(self.held.holds_as(&held), "what tenants hold differs from a count of the active jobs");
    }
}
