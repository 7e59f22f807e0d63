//! The policy the core runs with (the gateway's config file maps onto this), including each
//! tenant's placement quota.

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_placement::{NetworkTable, PlacementConfig};

use crate::usage::IdleGpuConfig;

/// Timeouts, weights and limits of the core. `Default` reads as the documented defaults.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Placement weights.
    pub placement: PlacementConfig,
    /// Region-pair network (seeded defaults plus overrides).
    pub network: NetworkTable,
    /// Fair-share weight per tenant.
    pub tenant_weights: BTreeMap<String, f64>,
    /// Weight of tenants not listed.
    pub default_tenant_weight: f64,
    /// An offer unanswered this long is withdrawn and the job placed again.
    pub offer_timeout: Duration,
    /// A cluster silent this long is disconnected and its jobs become `Unknown`.
    pub cluster_timeout: Duration,
    /// A job `Unknown` this long, counted from when its cluster was last heard, is placed again.
    pub lost_job_timeout: Duration,
    /// Agents get a lease of `lost_job_timeout - lease_margin`: they stop the gateway's jobs
    /// once they have not heard from it for that long, before the gateway places them again.
    /// The margin covers the two clocks running at slightly different rates.
    pub lease_margin: Duration,
    /// Finished jobs (and their decisions) are forgotten this long after they finished.
    pub retention: Duration,
    /// Placement quotas of the tenants that have their own (`tenants.NAME.quota`).
    pub quotas: BTreeMap<String, TenantQuota>,
    /// Placement quota of every other tenant (`defaultQuota`); the default sets no limit.
    pub default_quota: TenantQuota,
    /// When a running job's GPUs count as idle (`idleGpu`).
    pub idle_gpu: IdleGpuConfig,
}

/// Limits placement enforces for one tenant; `None` sets no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantQuota {
    /// GPUs the tenant may hold at once across the federation: its jobs that are offered, bound,
    /// running, or `Unknown` (their cluster is away, so they may still hold their GPUs).
    pub max_gpus: Option<u32>,
    /// Only the tenant's first this many queued jobs (priority, then age) are placed; later ones
    /// wait.
    pub max_queued_jobs: Option<u32>,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            placement: PlacementConfig::default(),
            network: NetworkTable::default_seeded(),
            tenant_weights: BTreeMap::new(),
            default_tenant_weight: 1.0,
            offer_timeout: Duration::from_secs(30),
            cluster_timeout: Duration::from_secs(15),
            lost_job_timeout: Duration::from_secs(600),
            lease_margin: Duration::from_secs(60),
            retention: Duration::from_secs(7 * 24 * 3600),
            quotas: BTreeMap::new(),
            default_quota: TenantQuota::default(),
            idle_gpu: IdleGpuConfig::default(),
        }
    }
}

impl CoreConfig {
    /// Fair-share weight of `tenant`.
    pub fn tenant_weight(&self, tenant: &str) -> f64 {
        self.tenant_weights.get(tenant).copied().unwrap_or(self.default_tenant_weight)
    }

    /// The placement quota of `tenant`.
    pub fn quota(&self, tenant: &str) -> TenantQuota {
        self.quotas.get(tenant).copied().unwrap_or(self.default_quota)
    }

    /// Where the quota of `tenant` is configured, for explanations: `tenants.NAME.quota` or
    /// `defaultQuota`.
    pub fn quota_source(&self, tenant: &str) -> String {
        if self.quotas.contains_key(tenant) { format!("tenants.{tenant}.quota") } else { "defaultQuota".to_string() }
    }

    /// Whether any tenant has a placement quota: without one, rounds skip quota work entirely.
    pub fn has_quotas(&self) -> bool {
        self.default_quota.limits_anything() || self.quotas.values().any(TenantQuota::limits_anything)
    }

    /// The lease agents get, or None when the margin leaves none (then agents never stop jobs
    /// on their own, and a partition can briefly run two copies).
    pub fn agent_lease(&self) -> Option<Duration> {
        self.lost_job_timeout.checked_sub(self.lease_margin).filter(|lease| !lease.is_zero())
    }
}

impl TenantQuota {
    /// Whether the quota sets any limit.
    pub fn limits_anything(&self) -> bool {
        self.max_gpus.is_some() || self.max_queued_jobs.is_some()
    }
}
