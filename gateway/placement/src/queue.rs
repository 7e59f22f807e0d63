//! Federation queue order: weighted fair share of GPUs across tenants, then priority and age
//! within a tenant.
//!
//! Placement walks jobs in the order [`FairQueue`] yields them. Each time a job is handed out the
//! caller says whether it was placed; a placed job adds its GPUs to its tenant's usage, so a
//! tenant that just got GPUs falls behind tenants that have fewer relative to their weight.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// One queued job as the queue sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    /// Job id (the last tie-breaker, so order is total and deterministic).
    pub id: String,
    /// Tenant whose share the job counts against.
    pub tenant: String,
    /// 0..=100, higher first.
    pub priority: u32,
    /// Submit time (Unix ms), older first.
    pub submitted_at_ms: i64,
    /// GPUs of the whole gang.
    pub gpus: u32,
}

/// Orders queued jobs by weighted GPU fair share across tenants.
#[derive(Debug)]
pub struct FairQueue {
    tenants: BTreeMap<String, TenantQueue>,
}

#[derive(Debug)]
struct TenantQueue {
    weight: f64,
    /// GPUs the tenant holds now (offered, bound, running).
    usage: f64,
    /// Remaining jobs, best last (so `pop` is O(1)).
    jobs: Vec<QueuedJob>,
}

impl FairQueue {
    /// Builds the queue. `usage` is GPUs each tenant holds now; `weight` gives each tenant's weight.
    pub fn new(jobs: Vec<QueuedJob>, usage: &BTreeMap<String, u32>, weight: impl Fn(&str) -> f64) -> Self {
        let mut tenants: BTreeMap<String, TenantQueue> = BTreeMap::new();
        for job in jobs {
            let entry = tenants.entry(job.tenant.clone()).or_insert_with(|| TenantQueue {
                weight: weight(&job.tenant),
                usage: f64::from(usage.get(&job.tenant).copied().unwrap_or(0)),
                jobs: Vec::new(),
            });
            entry.jobs.push(job);
        }
        for tenant in tenants.values_mut() {
            // Worst first, so the best is at the end.
            tenant.jobs.sort_by(|a, b| within_tenant(b, a));
        }
        Self { tenants }
    }

    /// The next job: from the tenant with the smallest usage/weight, its best job.
    pub fn pop_next(&mut self) -> Option<QueuedJob> {
        let tenant = self
            .tenants
            .iter()
            .filter(|(_, t)| !t.jobs.is_empty())
            .min_by(|(an, a), (bn, b)| share(a).total_cmp(&share(b)).then_with(|| an.cmp(bn)))
            .map(|(name, _)| name.clone())?;
        self.tenants.get_mut(&tenant).and_then(|t| t.jobs.pop())
    }

    /// Records that `job` was placed, so its tenant's share grows.
    pub fn placed(&mut self, job: &QueuedJob) {
        if let Some(tenant) = self.tenants.get_mut(&job.tenant) {
            tenant.usage += f64::from(job.gpus);
        }
    }
}

fn share(t: &TenantQueue) -> f64 {
    t.usage / t.weight
}

/// Priority first (higher first), then age (older first), then id.
fn within_tenant(a: &QueuedJob, b: &QueuedJob) -> Ordering {
    b.priority.cmp(&a.priority).then(a.submitted_at_ms.cmp(&b.submitted_at_ms)).then_with(|| a.id.cmp(&b.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, tenant: &str, priority: u32, at: i64, gpus: u32) -> QueuedJob {
        QueuedJob { id: id.into(), tenant: tenant.into(), priority, submitted_at_ms: at, gpus }
    }

    fn drain(queue: &mut FairQueue) -> Vec<String> {
        let mut order = Vec::new();
        while let Some(j) = queue.pop_next() {
            queue.placed(&j);
            order.push(j.id);
        }
        order
    }

    #[test]
    fn within_a_tenant_priority_comes_before_age() {
        let jobs = vec![job("old-low", "a", 10, 1, 1), job("new-high", "a", 90, 5, 1), job("old-high", "a", 90, 2, 1)];
        let mut q = FairQueue::new(jobs, &BTreeMap::new(), |_| 1.0);
        assert_eq!(drain(&mut q), ["old-high", "new-high", "old-low"]);
    }

    #[test]
    fn tenants_alternate_in_proportion_to_weight() {
        let mut jobs = Vec::new();
        for i in 0..6 {
            jobs.push(job(&format!("a{i}"), "a", 50, i, 1));
            jobs.push(job(&format!("b{i}"), "b", 50, i, 1));
        }
        let mut q = FairQueue::new(jobs, &BTreeMap::new(), |t| if t == "a" { 2.0 } else { 1.0 });
        let first_six: Vec<String> = drain(&mut q).into_iter().take(6).collect();
        let a_count = first_six.iter().filter(|id| id.starts_with('a')).count();
        assert_eq!(a_count, 4, "{first_six:?}");
    }

    #[test]
    fn a_tenant_already_holding_gpus_waits_behind_one_that_holds_none() {
        let jobs = vec![job("rich", "rich", 100, 0, 1), job("poor", "poor", 0, 9, 1)];
        let usage = BTreeMap::from([("rich".to_string(), 64)]);
        let mut q = FairQueue::new(jobs, &usage, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("poor".to_string()));
    }

    #[test]
    fn jobs_that_are_not_placed_do_not_count_against_their_tenant() {
        let jobs = vec![job("a1", "a", 50, 0, 8), job("a2", "a", 50, 1, 8), job("b1", "b", 50, 2, 8)];
        let mut q = FairQueue::new(jobs, &BTreeMap::new(), |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("a1".to_string()));
        // a1 was not placed: tenant a's share stays 0, and the name breaks the tie.
        assert_eq!(q.pop_next().map(|j| j.id), Some("a2".to_string()));
    }
}
