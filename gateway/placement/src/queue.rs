//! Federation queue order: weighted fair share of GPUs across tenants, then priority and age
//! within a tenant.
//!
//! Placement walks jobs in the order [`FairQueue`] yields them. Each time a job is handed out the
//! caller says whether it was placed; a placed job adds its GPUs to its tenant's usage, so a
//! tenant that just got GPUs falls behind tenants that have fewer relative to their weight.

use std::cmp::Ordering;

/// One queued job as the queue sees it. `Id` names the job (the last tie-breaker, so order is
/// total and deterministic) and `Tenant` its tenant: the gateway passes cheap stand-ins (an index
/// that sorts like the id, a borrowed name) so that building the queue each round copies no text.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob<Id = String, Tenant = String> {
    /// Job id (the last tie-breaker, so order is total and deterministic).
    pub id: Id,
    /// Tenant whose share the job counts against.
    pub tenant: Tenant,
    /// 0..=100, higher first.
    pub priority: u32,
    /// Submit time (Unix ms), older first.
    pub submitted_at_ms: i64,
    /// GPUs of the whole gang.
    pub gpus: u32,
}

/// Orders queued jobs by weighted GPU fair share across tenants.
#[derive(Debug)]
pub struct FairQueue<Id = String, Tenant = String> {
    /// Tenants in name order (the tie-breaker between equal shares).
    tenants: Vec<TenantQueue<Id, Tenant>>,
}

#[derive(Debug)]
struct TenantQueue<Id, Tenant> {
    name: Tenant,
    weight: f64,
    /// GPUs the tenant holds now (offered, bound, running).
    usage: f64,
    /// Remaining jobs, best last (so `pop` is O(1)).
    jobs: Vec<QueuedJob<Id, Tenant>>,
}

impl<Id: Ord, Tenant: Ord + Clone> FairQueue<Id, Tenant> {
    /// Builds the queue. `usage` gives the GPUs each tenant holds now; `weight` each tenant's
    /// weight. Each is asked once per tenant.
    pub fn new(
        jobs: Vec<QueuedJob<Id, Tenant>>,
        usage: impl Fn(&Tenant) -> u32,
        weight: impl Fn(&Tenant) -> f64,
    ) -> Self {
        let mut tenants: Vec<TenantQueue<Id, Tenant>> = Vec::new();
        for job in jobs {
            let at = match tenants.binary_search_by(|t| t.name.cmp(&job.tenant)) {
                Ok(at) => at,
                Err(at) => {
                    let name = job.tenant.clone();
                    let queue =
                        TenantQueue { weight: weight(&name), usage: f64::from(usage(&name)), name, jobs: Vec::new() };
                    tenants.insert(at, queue);
                    at
                }
            };
            if let Some(tenant) = tenants.get_mut(at) {
                tenant.jobs.push(job);
            }
        }
        for tenant in &mut tenants {
            // Worst first, so the best is at the end.
            tenant.jobs.sort_by(|a, b| within_tenant(b, a));
        }
        Self { tenants }
    }

    /// The next job: from the tenant with the smallest usage/weight, its best job.
    pub fn pop_next(&mut self) -> Option<QueuedJob<Id, Tenant>> {
        // Tenants are in name order and `min_by` keeps the first of equal shares, so ties go to
        // the first name.
        let tenant =
            self.tenants.iter_mut().filter(|t| !t.jobs.is_empty()).min_by(|a, b| share(a).total_cmp(&share(b)))?;
        tenant.jobs.pop()
    }

    /// Records that `job` was placed, so its tenant's share grows.
    pub fn placed(&mut self, job: &QueuedJob<Id, Tenant>) {
        if let Ok(at) = self.tenants.binary_search_by(|t| t.name.cmp(&job.tenant))
            && let Some(tenant) = self.tenants.get_mut(at)
        {
            tenant.usage += f64::from(job.gpus);
        }
    }
}

fn share<Id, Tenant>(t: &TenantQueue<Id, Tenant>) -> f64 {
    t.usage / t.weight
}

/// Priority first (higher first), then age (older first), then id.
fn within_tenant<Id: Ord, Tenant>(a: &QueuedJob<Id, Tenant>, b: &QueuedJob<Id, Tenant>) -> Ordering {
    b.priority.cmp(&a.priority).then(a.submitted_at_ms.cmp(&b.submitted_at_ms)).then_with(|| a.id.cmp(&b.id))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
        let mut q = FairQueue::new(jobs, |_| 0, |_| 1.0);
        assert_eq!(drain(&mut q), ["old-high", "new-high", "old-low"]);
    }

    #[test]
    fn tenants_alternate_in_proportion_to_weight() {
        let mut jobs = Vec::new();
        for i in 0..6 {
            jobs.push(job(&format!("a{i}"), "a", 50, i, 1));
            jobs.push(job(&format!("b{i}"), "b", 50, i, 1));
        }
        let mut q = FairQueue::new(jobs, |_| 0, |t| if t == "a" { 2.0 } else { 1.0 });
        let first_six: Vec<String> = drain(&mut q).into_iter().take(6).collect();
        let a_count = first_six.iter().filter(|id| id.starts_with('a')).count();
        assert_eq!(a_count, 4, "{first_six:?}");
    }

    #[test]
    fn a_tenant_already_holding_gpus_waits_behind_one_that_holds_none() {
        let jobs = vec![job("rich", "rich", 100, 0, 1), job("poor", "poor", 0, 9, 1)];
        let usage = BTreeMap::from([("rich".to_string(), 64)]);
        let mut q = FairQueue::new(jobs, |t| usage.get(t).copied().unwrap_or(0), |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("poor".to_string()));
    }

    #[test]
    fn jobs_that_are_not_placed_do_not_count_against_their_tenant() {
        let jobs = vec![job("a1", "a", 50, 0, 8), job("a2", "a", 50, 1, 8), job("b1", "b", 50, 2, 8)];
        let mut q = FairQueue::new(jobs, |_| 0, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("a1".to_string()));
        // a1 was not placed: tenant a's share stays 0, and the name breaks the tie.
        assert_eq!(q.pop_next().map(|j| j.id), Some("a2".to_string()));
    }
}
