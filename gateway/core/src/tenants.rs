//! Each tenant's queue as readers see it: what it holds and waits for, against its fair share
//! and quota. Computed from a [`ReadView`] on read (the console's queue view, metrics), with the
//! weights and quotas of the core's own [`CoreConfig`](crate::CoreConfig).

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_proto::job::JobState;
use serde::Serialize;

use crate::view::ReadView;

/// One tenant's queue for `GET /v1/tenants`, the console and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantSummary {
    /// Tenant name.
    pub tenant: String,
    /// Its fair-share weight.
    pub weight: f64,
    /// Its weight over the weights of every tenant with active jobs (0..=1): the part of the
    /// federation it gets under contention.
    pub fair_share: f64,
    /// Jobs holding GPUs (offered, bound, running or unknown).
    pub running_jobs: u32,
    /// GPUs those jobs hold.
    pub running_gpus: u32,
    /// Jobs waiting in the federation queue.
    pub queued_jobs: u32,
    /// GPUs those jobs want.
    pub queued_gpus: u32,
    /// Its share of the GPUs held in the federation (0..=1).
    pub gpu_share: f64,
    /// Its quota's GPU limit, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    /// Its quota's limit on queued jobs placement considers, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queued_jobs: Option<u32>,
    /// Jobs finished successfully within retention.
    pub succeeded_jobs: u32,
    /// Jobs that failed within retention.
    pub failed_jobs: u32,
}

impl ReadView {
    /// Every tenant with a job remembered or a configured weight or quota, by name.
    pub fn tenants(&self) -> Vec<TenantSummary> {
        let config = self.config();
        let mut by_name: BTreeMap<Arc<str>, TenantSummary> = BTreeMap::new();
        let blank = |tenant: &str| TenantSummary {
            tenant: tenant.to_string(),
            weight: config.tenant_weight(tenant),
            fair_share: 0.0,
            running_jobs: 0,
            running_gpus: 0,
            queued_jobs: 0,
            queued_gpus: 0,
            gpu_share: 0.0,
            max_gpus: config.quota(tenant).max_gpus,
            max_queued_jobs: config.quota(tenant).max_queued_jobs,
            succeeded_jobs: 0,
            failed_jobs: 0,
        };
        for tenant in config.tenant_weights.keys().chain(config.quotas.keys()) {
            by_name.entry(Arc::from(tenant.as_str())).or_insert_with(|| blank(tenant));
        }
        for job in self.jobs() {
            let tenant = job.spec.tenant.as_str();
            let summary = match by_name.get_mut(tenant) {
                Some(summary) => summary,
                None => by_name.entry(Arc::from(tenant)).or_insert_with(|| blank(tenant)),
            };
            let gpus = job.spec.total_gpus();
            match job.state {
                JobState::Queued => {
                    summary.queued_jobs += 1;
                    summary.queued_gpus = summary.queued_gpus.saturating_add(gpus);
                }
                JobState::Succeeded => summary.succeeded_jobs += 1,
                JobState::Failed => summary.failed_jobs += 1,
                _ if job.holds_gpus() => {
                    summary.running_jobs += 1;
                    summary.running_gpus = summary.running_gpus.saturating_add(gpus);
                }
                _ => {}
            }
        }
        let active_weight: f64 =
            by_name.values().filter(|t| t.running_jobs + t.queued_jobs > 0).map(|t| t.weight).sum();
        let held: u32 = by_name.values().map(|t| t.running_gpus).sum();
        by_name
            .into_values()
            .map(|mut t| {
                if t.running_jobs + t.queued_jobs > 0 && active_weight > 0.0 {
                    t.fair_share = t.weight / active_weight;
                }
                if held > 0 {
                    t.gpu_share = f64::from(t.running_gpus) / f64::from(held);
                }
                t
            })
            .collect()
    }
}
