//! What readers see: an immutable snapshot published after each commit, so `GET`s never wait on
//! writes and never see a change that is not durable yet.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use meridian_proto::inventory::{BackendKind, Tier};
use meridian_proto::job::JobState;
use meridian_proto::selector::Selector;
use serde::Serialize;

use crate::config::CoreConfig;
use crate::copies::SiblingCopy;
use crate::decision::Decided;
use crate::jobs::JobTable;
use crate::record::{CandidateView, JobRecord};
use crate::registry::Registry;
use crate::tally::{PendingReason, Tally};
use crate::usage::{JobUsage, UsageBook};

/// Filters of a job list.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// Only this tenant's jobs.
    pub tenant: Option<String>,
    /// Only jobs of these tenants (what a caller may see); `None`: every tenant.
    pub tenants: Option<BTreeSet<String>>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs whose labels match.
    pub selector: Option<Selector>,
}

impl JobFilter {
    /// Whether `job` passes.
    pub fn matches(&self, job: &JobRecord) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == job.spec.tenant)
            && self.tenants.as_ref().is_none_or(|set| set.contains(&job.spec.tenant))
            && self.state.is_none_or(|s| s == job.state)
            && self.selector.as_ref().is_none_or(|s| s.matches(&job.spec.labels))
    }
}

/// One page of a job list.
#[derive(Debug, Clone)]
pub struct Page {
    /// Jobs, oldest first.
    pub jobs: Vec<Arc<JobRecord>>,
    /// Where the next page starts (the last id of this page), or None on the last page.
    pub next: Option<String>,
}

/// Why a job is where it is.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The job.
    pub job_id: String,
    /// Its state now.
    pub state: JobState,
    /// Its cluster, if any.
    pub cluster: Option<String>,
    /// When the decision shown was made (Unix ms), if one was made.
    pub decided_at_ms: Option<i64>,
    /// One sentence with numbers.
    pub summary: String,
    /// What its member says now, once it holds the job (a local queue's reason, such as Slurm's
    /// pending reason; how it ended), when that is not the summary already.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member_says: Option<String>,
    /// Every cluster considered, with its verdict; for a queued job at scale, the best feasible
    /// ones and one example of each kind of rejection, the rest counted in `omitted_candidates`.
    pub candidates: Vec<CandidateView>,
    /// The clusters the decision counts instead of listing (none when it lists every one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub omitted_candidates: Option<meridian_placement::Omitted>,
    /// The members where the queued job waits as sibling copies (none when it does not).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sibling_copies: Vec<CopyView>,
}

/// A sibling copy of a queued job, as `explain` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyView {
    /// The member holding it.
    pub cluster: String,
    /// The GPU type it is pinned to there (empty: any).
    pub gpu_type: String,
    /// The member's scheduler would start it now and asked for the start lock.
    pub ready: bool,
}

/// A member cluster for `GET /v1/clusters` and `meridian clusters`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Cluster name.
    pub name: String,
    /// Region.
    pub region: String,
    /// `owned` or `cloud`.
    pub tier: Tier,
    /// Local scheduler kind.
    pub backend: BackendKind,
    /// Whether its agent is connected.
    pub connected: bool,
    /// When the agent last reported (Unix ms).
    #[serde(skip)]
    pub last_seen_ms: i64,
    /// Seconds since the agent last reported, as of the read.
    pub last_seen_secs_ago: Option<f64>,
    /// GPUs in the cluster.
    pub gpus_total: u32,
    /// GPUs free now (summed over nodes).
    pub gpus_free: u32,
    /// GPU types present.
    pub gpu_types: Vec<String>,
    /// Jobs waiting in the cluster's local queues.
    pub pending_jobs: u32,
    /// GPUs those jobs want.
    pub pending_gpus: u32,
    /// The agent's estimate of a new job's wait.
    pub estimated_wait_secs: u64,
    /// Federation jobs offered to, bound to or running on the cluster.
    pub federated_jobs: u32,
    /// US$ per GPU-hour by type.
    pub prices: BTreeMap<String, f64>,
    /// Labels a `placement.clusterSelector` sees: the configured ones plus the implicit
    /// `meridian.io/cluster`, `/region`, `/tier` and `/backend`.
    pub labels: BTreeMap<String, String>,
}

/// The snapshot readers use.
#[derive(Clone)]
pub struct ReadView {
    jobs: imbl::OrdMap<String, Arc<JobRecord>>,
    decisions: imbl::HashMap<String, Arc<Decided>>,
    clusters: Arc<Vec<ClusterSummary>>,
    config: Arc<CoreConfig>,
    tally: Arc<Tally>,
    failure: Option<String>,
    usage: UsageBook,
    copies: imbl::HashMap<String, Vec<SiblingCopy>>,
}

/// The cluster summaries a view shares, rebuilt only when they changed.
pub(crate) struct ClusterViewCache {
    built: Arc<Vec<ClusterSummary>>,
    /// The version of the cluster summaries `built` holds (0: none yet).
    version: u64,
}

impl ReadView {
    /// A view of the core's state: the jobs and decisions of `table` (shared, not copied),
    /// cluster summaries, configuration, counters, failure, usage and sibling copies.
    pub(crate) fn new(
        table: &JobTable,
        clusters: Arc<Vec<ClusterSummary>>,
        config: Arc<CoreConfig>,
        tally: Arc<Tally>,
        failure: Option<String>,
        usage: UsageBook,
        copies: imbl::HashMap<String, Vec<SiblingCopy>>,
    ) -> Self {
        let (jobs, decisions) = (table.records().clone(), table.decisions().clone());
        Self { jobs, decisions, clusters, config, tally, failure, usage, copies }
    }

    /// A running job's GPU utilisation and idle flag as of `now_ms`; None when unknown (not
    /// running, or its member sent no sample).
    pub fn usage(&self, job: &JobRecord, now_ms: i64) -> Option<JobUsage> {
        self.usage.of(job, now_ms)
    }

    /// Every running job with a known utilisation, as of `now_ms` (for metrics).
    pub fn usages(&self, now_ms: i64) -> impl Iterator<Item = (&Arc<JobRecord>, JobUsage)> + '_ {
        self.usage.job_ids().filter_map(move |id| {
            let job = self.jobs.get(id)?;
            Some((job, self.usage.of(job, now_ms)?))
        })
    }

    /// The counters of what happened up to this view (decisions, delays, burst use, data
    /// moved), for metrics.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Why job `id` waits, as a bounded class (for metrics and alerts); None when it is not
    /// waiting or unknown.
    pub fn pending_reason(&self, id: &str) -> Option<PendingReason> {
        let job = self.jobs.get(id)?;
        PendingReason::of(job, self.decisions.get(id).map(Arc::as_ref))
    }

    /// Every job remembered, by id (oldest first).
    pub fn jobs(&self) -> impl Iterator<Item = &Arc<JobRecord>> + '_ {
        self.jobs.values()
    }

    /// The core's configuration (tenant weights and quotas for readers).
    pub(crate) fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// The same view, marked failed: what readers keep seeing once a commit failed (the core's
    /// memory may then hold changes that never became durable, so it is not published again).
    pub fn with_failure(&self, reason: impl Into<String>) -> Self {
        Self { failure: Some(reason.into()), ..self.clone() }
    }

    /// Why the gateway refuses changes, if it does.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Number of jobs remembered.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// One job.
    pub fn job(&self, id: &str) -> Option<Arc<JobRecord>> {
        self.jobs.get(id).cloned()
    }

    /// Up to `limit` jobs matching `filter`, oldest first, starting after the id `after`.
    pub fn list(&self, filter: &JobFilter, limit: usize, after: Option<&str>) -> Page {
        let start = match after {
            Some(id) => Bound::Excluded(id.to_string()),
            None => Bound::Unbounded,
        };
        let mut jobs = Vec::with_capacity(limit.min(1024));
        let mut next = None;
        for (id, job) in self.jobs.range((start, Bound::Unbounded)) {
            if !filter.matches(job) {
                continue;
            }
            if jobs.len() == limit {
                next = jobs.last().map(|j: &Arc<JobRecord>| j.id.clone());
                let _ = id;
                break;
            }
            jobs.push(Arc::clone(job));
        }
        Page { jobs, next }
    }

    /// Why a job is where it is, or None for an unknown job.
    pub fn explain(&self, id: &str) -> Option<Explanation> {
        let job = self.jobs.get(id)?;
        let decided = self.decisions.get(id);
        let (decided_at_ms, decision_summary, candidates, omitted_candidates) = match decided.map(|d| d.explained()) {
            Some((at_ms, summary, candidates, omitted)) => (Some(at_ms), Some(summary), candidates, omitted),
            None => (None, None, Vec::new(), None),
        };
        let summary = match (job.state, decision_summary, &job.placement) {
            (JobState::Queued, Some(summary), _) => summary,
            (JobState::Queued, None, _) => job.message.clone(),
            (_, _, Some(placement)) => placement.clone(),
            (_, _, None) => job.message.clone(),
        };
        let member_says = (job.state != JobState::Queued && !job.message.is_empty() && job.message != summary)
            .then(|| job.message.clone());
        Some(Explanation {
            job_id: job.id.clone(),
            state: job.state,
            cluster: job.cluster.clone(),
            decided_at_ms,
            summary,
            member_says,
            candidates,
            omitted_candidates,
            sibling_copies: self
                .copies
                .get(id)
                .map(|copies| {
                    copies
                        .iter()
                        .map(|c| CopyView { cluster: c.cluster.clone(), gpu_type: c.gpu_type.clone(), ready: c.ready })
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Member clusters as last summarised (`last_seen_secs_ago` unset; see [`Self::clusters`]).
    pub fn cluster_summaries(&self) -> &[ClusterSummary] {
        &self.clusters
    }

    /// Whether `other` holds the very same cluster summaries (cheap: no comparison of contents).
    pub fn same_clusters(&self, other: &ReadView) -> bool {
        Arc::ptr_eq(&self.clusters, &other.clusters)
    }

    /// Member clusters as of `now_ms`.
    pub fn clusters(&self, now_ms: i64) -> Vec<ClusterSummary> {
        self.clusters
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.last_seen_secs_ago = Some((now_ms.saturating_sub(c.last_seen_ms)).max(0) as f64 / 1000.0);
                c
            })
            .collect()
    }
}

impl ClusterViewCache {
    /// An empty cache (versions start at 1).
    pub(crate) fn new() -> Self {
        Self { built: Arc::new(Vec::new()), version: 0 }
    }

    /// The summaries of `version`, built by `build` unless they are already.
    pub(crate) fn current(
        &mut self,
        version: u64,
        build: impl FnOnce() -> Vec<ClusterSummary>,
    ) -> Arc<Vec<ClusterSummary>> {
        if self.version != version {
            self.built = Arc::new(build());
            self.version = version;
        }
        Arc::clone(&self.built)
    }
}

impl ClusterSummary {
    /// Every cluster of `registry`, by name, with the number of `active` jobs that hold GPUs on
    /// it.
    pub(crate) fn all<'a>(registry: &Registry, active: impl Iterator<Item = &'a JobRecord>) -> Vec<ClusterSummary> {
        let mut federated: BTreeMap<&str, u32> = BTreeMap::new();
        for job in active {
            if let (Some(cluster), true) = (&job.cluster, job.holds_gpus()) {
                *federated.entry(cluster.as_str()).or_default() += 1;
            }
        }
        registry
            .iter()
            .map(|c| {
                let mut gpu_types: Vec<String> = c.inventory.shapes.iter().map(|s| s.gpu_type.clone()).collect();
                gpu_types.sort();
                gpu_types.dedup();
                ClusterSummary {
                    name: c.info.name.clone(),
                    region: c.info.region.clone(),
                    tier: c.info.tier,
                    backend: c.info.backend,
                    connected: c.link.is_some(),
                    last_seen_ms: c.last_seen_ms,
                    last_seen_secs_ago: None,
                    gpus_total: c.inventory.gpus_total(),
                    gpus_free: c.inventory.gpus_free(),
                    gpu_types,
                    pending_jobs: c.pressure.pending_jobs(),
                    pending_gpus: c.pressure.pending_gpus(),
                    estimated_wait_secs: c.pressure.estimated_wait_secs,
                    federated_jobs: federated.get(c.info.name.as_str()).copied().unwrap_or(0),
                    prices: c.info.prices.clone(),
                    labels: c.info.selectable_labels(),
                }
            })
            .collect()
    }
}
