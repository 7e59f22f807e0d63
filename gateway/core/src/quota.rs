//! Tenant quotas as placement enforces them: how many GPUs a tenant may hold across the
//! federation, and how many of its queued jobs a round looks at. A job held back by a quota stays
//! `Queued` with an explanation naming the limit; it never fails for it.
//!
//! Rounds work the counts out once per round from the active jobs they already walk (so a
//! restart, which rebuilds the active jobs from the store, cannot get them wrong) and keep them
//! up to date as they offer; checking a job is a map lookup and a comparison.
//!
//! The limits themselves ([`TenantQuota`]) are configuration (see `config.rs`); what a round does
//! with a job it holds back is in `round.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::config::{CoreConfig, TenantQuota};
use crate::record::JobRecord;

/// Why a round left a queued job waiting because of its tenant's quota (the explanation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaWait {
    /// Starting the job would take the tenant past `maxGpus`.
    Gpus {
        /// The tenant.
        tenant: Arc<str>,
        /// Where the limit is configured (`tenants.NAME.quota` or `defaultQuota`).
        source: Arc<str>,
        /// GPUs the tenant holds now.
        held: u32,
        /// Its `maxGpus`.
        limit: u32,
        /// GPUs the job's gang takes.
        needs: u32,
    },
    /// The job is not among the tenant's first `maxQueuedJobs` queued jobs.
    QueuedJobs {
        /// The tenant.
        tenant: Arc<str>,
        /// Where the limit is configured.
        source: Arc<str>,
        /// Its `maxQueuedJobs`.
        limit: u32,
    },
}

impl fmt::Display for QuotaWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaWait::Gpus { tenant, source, held, limit, needs } => {
                let over = held.saturating_add(*needs).saturating_sub(*limit);
                write!(
                    f,
                    "waiting for quota: tenant {tenant} holds {held} of its {limit} GPUs ({source}.maxGpus); \
                     this job needs {needs} more, so {over} must be released first"
                )
            }
            QuotaWait::QueuedJobs { tenant, source, limit } => write!(
                f,
                "waiting for quota: only the first {limit} queued jobs of tenant {tenant} are considered for \
                 placement ({source}.maxQueuedJobs); this job is behind them"
            ),
        }
    }
}

/// One tenant's quota during a round: its limits and the GPUs it holds as offers are made.
#[derive(Debug)]
pub(crate) struct TenantRound {
    tenant: Arc<str>,
    source: Arc<str>,
    quota: TenantQuota,
    held_gpus: u32,
}

/// Why a round holds a job back, borrowed from the round's quotas: comparing it with the job's
/// previous explanation costs no allocation; [`Hold::wait`] builds the explanation only when it
/// changed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hold<'a> {
    /// Past `maxGpus`: the tenant holds `round.held_gpus`, the job needs `needs`.
    Gpus {
        /// The tenant's quota in this round.
        round: &'a TenantRound,
        /// GPUs the job's gang takes.
        needs: u32,
    },
    /// Past `maxQueuedJobs` (`limit`).
    QueuedJobs {
        /// The tenant's quota in this round.
        round: &'a TenantRound,
        /// Its `maxQueuedJobs`.
        limit: u32,
    },
}

impl Hold<'_> {
    /// Whether `wait` already says this (for the same job, so the same tenant and config path).
    pub(crate) fn is_explained_by(&self, wait: &QuotaWait) -> bool {
        match (self, wait) {
            (Hold::Gpus { round, needs }, QuotaWait::Gpus { held, limit, needs: was, .. }) => {
                *held == round.held_gpus && Some(*limit) == round.quota.max_gpus && was == needs
            }
            (Hold::QueuedJobs { limit, .. }, QuotaWait::QueuedJobs { limit: was, .. }) => was == limit,
            _ => false,
        }
    }

    /// The explanation.
    pub(crate) fn wait(&self) -> QuotaWait {
        match *self {
            Hold::Gpus { round, needs } => QuotaWait::Gpus {
                tenant: Arc::clone(&round.tenant),
                source: Arc::clone(&round.source),
                held: round.held_gpus,
                limit: round.quota.max_gpus.unwrap_or(0),
                needs,
            },
            Hold::QueuedJobs { round, limit } => {
                QuotaWait::QueuedJobs { tenant: Arc::clone(&round.tenant), source: Arc::clone(&round.source), limit }
            }
        }
    }
}

/// The quotas of the tenants with queued jobs in one round.
#[derive(Debug, Default)]
pub(crate) struct RoundQuotas {
    tenants: HashMap<String, TenantRound>,
}

impl RoundQuotas {
    /// The quotas of the tenants in `queued` that have one, with the GPUs each holds (`held`).
    pub(crate) fn new<'a>(
        config: &CoreConfig,
        queued: impl IntoIterator<Item = &'a JobRecord>,
        held: &HashMap<String, u32>,
    ) -> Self {
        let mut tenants = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for job in queued {
            let tenant = job.spec.tenant.as_str();
            if !seen.insert(tenant) {
                continue;
            }
            let quota = config.quota(tenant);
            if quota.limits_anything() {
                let round = TenantRound {
                    tenant: tenant.into(),
                    source: config.quota_source(tenant).into(),
                    quota,
                    held_gpus: held.get(tenant).copied().unwrap_or(0),
                };
                tenants.insert(tenant.to_string(), round);
            }
        }
        Self { tenants }
    }

    /// Whether any tenant in the round has a quota.
    pub(crate) fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// For each position in `queued`, the hold of a job past its tenant's `maxQueuedJobs` (None:
    /// considered); empty when no job is past its limit. The first jobs of each tenant in
    /// fair-queue order (priority, then age) are considered.
    pub(crate) fn beyond_queue_limits(&self, queued: &[&JobRecord]) -> Vec<Option<Hold<'_>>> {
        if !self.tenants.values().any(|round| round.quota.max_queued_jobs.is_some()) {
            return Vec::new();
        }
        let mut by_tenant: HashMap<&str, (&TenantRound, Vec<usize>)> = HashMap::new();
        for (at, job) in queued.iter().enumerate() {
            let tenant = job.spec.tenant.as_str();
            if let Some((_, positions)) = by_tenant.get_mut(tenant) {
                positions.push(at);
            } else if let Some(round) = self.tenants.get(tenant)
                && round.quota.max_queued_jobs.is_some()
            {
                by_tenant.insert(tenant, (round, vec![at]));
            }
        }
        let mut holds = Vec::new();
        for (round, mut positions) in by_tenant.into_values() {
            let Some(limit) = round.quota.max_queued_jobs else { continue };
            let keep = usize::try_from(limit).unwrap_or(usize::MAX);
            if positions.len() <= keep {
                continue;
            }
            // Split off the first `keep` in the order the fair queue serves one tenant's jobs
            // (positions sort like ids): linear, no full sort of a long backlog.
            positions.select_nth_unstable_by(keep, |&a, &b| {
                let (a_job, b_job) = (queued[a], queued[b]);
                b_job
                    .spec
                    .priority
                    .cmp(&a_job.spec.priority)
                    .then(a_job.submitted_at_ms.cmp(&b_job.submitted_at_ms))
                    .then(a.cmp(&b))
            });
            if holds.is_empty() {
                holds = vec![None; queued.len()];
            }
            for &at in &positions[keep..] {
                holds[at] = Some(Hold::QueuedJobs { round, limit });
            }
        }
        holds
    }

    /// The hold of `job` if offering it would take its tenant past `maxGpus`.
    pub(crate) fn gpu_hold(&self, job: &JobRecord) -> Option<Hold<'_>> {
        if self.tenants.is_empty() {
            return None;
        }
        let round = self.tenants.get(job.spec.tenant.as_str())?;
        let limit = round.quota.max_gpus?;
        let needs = job.spec.total_gpus();
        (round.held_gpus.saturating_add(needs) > limit).then_some(Hold::Gpus { round, needs })
    }

    /// Counts an offer of `job` against its tenant's GPUs.
    pub(crate) fn offered(&mut self, job: &JobRecord) {
        if self.tenants.is_empty() {
            return;
        }
        if let Some(round) = self.tenants.get_mut(job.spec.tenant.as_str()) {
            round.held_gpus = round.held_gpus.saturating_add(job.spec.total_gpus());
        }
    }
}
