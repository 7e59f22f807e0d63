//! Federation queue order: weighted dominant resource fairness (DRF) across tenants, then
//! priority and age within a tenant.
//!
//! A tenant's *dominant share* is the largest of its shares of the federation's GPUs, CPU cores
//! and memory (what it holds now ÷ what the connected clusters have). Placement walks jobs in the
//! order [`FairQueue`] yields them: next comes the tenant with the smallest dominant share ÷
//! weight. Each time a job is handed out the caller says whether it was placed; a placed job adds
//! its resources to its tenant's usage, so a tenant that just got resources falls behind tenants
//! that hold less relative to their weight. A tenant of CPU-heavy jobs is charged for the CPU it
//! takes, not only for its GPUs.

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
    /// CPU cores of the whole gang.
    pub cpu: u32,
    /// Memory of the whole gang, GiB.
    pub memory_gib: u32,
}

/// Resources held or offered, as DRF counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// GPUs.
    pub gpus: f64,
    /// CPU cores.
    pub cpu: f64,
    /// Memory, GiB.
    pub memory_gib: f64,
}

impl Usage {
    /// What `job`'s whole gang takes.
    pub fn of<Id, Tenant>(job: &QueuedJob<Id, Tenant>) -> Self {
        Self { gpus: f64::from(job.gpus), cpu: f64::from(job.cpu), memory_gib: f64::from(job.memory_gib) }
    }

    /// Adds `other`.
    pub fn add(&mut self, other: Usage) {
        self.gpus += other.gpus;
        self.cpu += other.cpu;
        self.memory_gib += other.memory_gib;
    }

    /// The largest share of `capacity` this usage takes, over the resources `capacity` has. With
    /// no capacity at all (no cluster connected), GPUs held count as they are.
    pub fn dominant_share(&self, capacity: &Usage) -> f64 {
        let shares = [(self.gpus, capacity.gpus), (self.cpu, capacity.cpu), (self.memory_gib, capacity.memory_gib)];
        let dominant = shares
            .iter()
            .filter(|(_, cap)| *cap > 0.0)
            .map(|(used, cap)| used / cap)
            .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))));
        dominant.unwrap_or(self.gpus)
    }
}

/// Orders queued jobs by weighted dominant resource share across tenants.
#[derive(Debug)]
pub struct FairQueue<Id = String, Tenant = String> {
    /// Tenants in name order (the tie-breaker between equal shares).
    tenants: Vec<TenantQueue<Id, Tenant>>,
    /// What the federation has: the denominators of the shares.
    capacity: Usage,
}

#[derive(Debug)]
struct TenantQueue<Id, Tenant> {
    name: Tenant,
    weight: f64,
    /// Resources the tenant holds now (offered, bound, running).
    usage: Usage,
    /// Remaining jobs, best last (so `pop` is O(1)).
    jobs: Vec<QueuedJob<Id, Tenant>>,
}

impl<Id: Ord, Tenant: Ord + Clone> FairQueue<Id, Tenant> {
    /// Builds the queue. `usage` gives what each tenant holds now, `capacity` what the federation
    /// has (the denominators of the shares); `weight` each tenant's weight. `usage` and `weight`
    /// are asked once per tenant.
    pub fn new(
        jobs: Vec<QueuedJob<Id, Tenant>>,
        usage: impl Fn(&Tenant) -> Usage,
        capacity: Usage,
        weight: impl Fn(&Tenant) -> f64,
    ) -> Self {
        let mut tenants: Vec<TenantQueue<Id, Tenant>> = Vec::new();
        for job in jobs {
            let at = match tenants.binary_search_by(|t| t.name.cmp(&job.tenant)) {
                Ok(at) => at,
                Err(at) => {
                    let name = job.tenant.clone();
                    let queue = TenantQueue { weight: weight(&name), usage: usage(&name), name, jobs: Vec::new() };
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
        Self { tenants, capacity }
    }

    /// The next job: from the tenant with the smallest dominant share ÷ weight, its best job.
    pub fn pop_next(&mut self) -> Option<QueuedJob<Id, Tenant>> {
        // Tenants are in name order and `min_by` keeps the first of equal shares, so ties go to
        // the first name.
        let tenant = self
            .tenants
            .iter_mut()
            .filter(|t| !t.jobs.is_empty())
            .min_by(|a, b| share(a, &self.capacity).total_cmp(&share(b, &self.capacity)))?;
        tenant.jobs.pop()
    }

    /// Records that `job` was placed, so its tenant's share grows.
    pub fn placed(&mut self, job: &QueuedJob<Id, Tenant>) {
        if let Ok(at) = self.tenants.binary_search_by(|t| t.name.cmp(&job.tenant))
            && let Some(tenant) = self.tenants.get_mut(at)
        {
            tenant.usage.add(Usage::of(job));
        }
    }
}

fn share<Id, Tenant>(t: &TenantQueue<Id, Tenant>, capacity: &Usage) -> f64 {
    t.usage.dominant_share(capacity) / t.weight
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
        QueuedJob { id: id.into(), tenant: tenant.into(), priority, submitted_at_ms: at, gpus, cpu: 0, memory_gib: 0 }
    }

    const GPUS_ONLY: Usage = Usage { gpus: 100.0, cpu: 0.0, memory_gib: 0.0 };

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
        let mut q = FairQueue::new(jobs, |_| Usage::default(), GPUS_ONLY, |_| 1.0);
        assert_eq!(drain(&mut q), ["old-high", "new-high", "old-low"]);
    }

    #[test]
    fn tenants_alternate_in_proportion_to_weight() {
        let mut jobs = Vec::new();
        for i in 0..6 {
            jobs.push(job(&format!("a{i}"), "a", 50, i, 1));
            jobs.push(job(&format!("b{i}"), "b", 50, i, 1));
        }
        let mut q = FairQueue::new(jobs, |_| Usage::default(), GPUS_ONLY, |t| if t == "a" { 2.0 } else { 1.0 });
        let first_six: Vec<String> = drain(&mut q).into_iter().take(6).collect();
        let a_count = first_six.iter().filter(|id| id.starts_with('a')).count();
        assert_eq!(a_count, 4, "{first_six:?}");
    }

    #[test]
    fn a_tenant_already_holding_gpus_waits_behind_one_that_holds_none() {
        let jobs = vec![job("rich", "rich", 100, 0, 1), job("poor", "poor", 0, 9, 1)];
        let usage = BTreeMap::from([("rich".to_string(), Usage { gpus: 64.0, ..Usage::default() })]);
        let mut q = FairQueue::new(jobs, |t| usage.get(t).copied().unwrap_or_default(), GPUS_ONLY, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("poor".to_string()));
    }

    #[test]
    fn jobs_that_are_not_placed_do_not_count_against_their_tenant() {
        let jobs = vec![job("a1", "a", 50, 0, 8), job("a2", "a", 50, 1, 8), job("b1", "b", 50, 2, 8)];
        let mut q = FairQueue::new(jobs, |_| Usage::default(), GPUS_ONLY, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("a1".to_string()));
        // a1 was not placed: tenant a's share stays 0, and the name breaks the tie.
        assert_eq!(q.pop_next().map(|j| j.id), Some("a2".to_string()));
    }

    #[test]
    fn the_dominant_resource_decides_a_tenants_share() {
        // 100 GPUs, 1,000 cores. `cpu-heavy` holds 10 GPUs and 600 cores (dominant: 60 % of the
        // CPU); `gpu-heavy` holds 40 GPUs and 40 cores (dominant: 40 % of the GPUs). Counting
        // GPUs only, `cpu-heavy` would go first; by DRF `gpu-heavy` does.
        let capacity = Usage { gpus: 100.0, cpu: 1000.0, memory_gib: 0.0 };
        let usage = BTreeMap::from([
            ("cpu-heavy".to_string(), Usage { gpus: 10.0, cpu: 600.0, memory_gib: 0.0 }),
            ("gpu-heavy".to_string(), Usage { gpus: 40.0, cpu: 40.0, memory_gib: 0.0 }),
        ]);
        let jobs = vec![job("c", "cpu-heavy", 50, 0, 1), job("g", "gpu-heavy", 50, 0, 1)];
        let mut q = FairQueue::new(jobs.clone(), |t| usage.get(t).copied().unwrap_or_default(), capacity, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("g".to_string()));
        let gpus_only = Usage { cpu: 0.0, ..capacity };
        let mut q = FairQueue::new(jobs.clone(), |t| usage.get(t).copied().unwrap_or_default(), gpus_only, |_| 1.0);
        assert_eq!(q.pop_next().map(|j| j.id), Some("c".to_string()));
        // Weight divides the dominant share: at weight 2, 60 % counts as 30 %, ahead of 40 %.
        let mut q = FairQueue::new(
            jobs,
            |t| usage.get(t).copied().unwrap_or_default(),
            capacity,
            |t| if t == "cpu-heavy" { 2.0 } else { 1.0 },
        );
        assert_eq!(q.pop_next().map(|j| j.id), Some("c".to_string()));
    }

    #[test]
    fn a_placed_job_charges_its_dominant_resource() {
        let capacity = Usage { gpus: 8.0, cpu: 64.0, memory_gib: 512.0 };
        let mut big_memory = job("m1", "m", 50, 0, 1);
        big_memory.memory_gib = 256;
        let jobs = vec![big_memory, job("m2", "m", 50, 1, 1), job("o1", "o", 50, 2, 2), job("o2", "o", 50, 3, 2)];
        let mut q = FairQueue::new(jobs, |_| Usage::default(), capacity, |_| 1.0);
        // Both start at 0; the name breaks the tie. m1 takes half the memory (share 0.5), so
        // `o` (2 of 8 GPUs after its first job: 0.25) goes twice before `m` again.
        assert_eq!(drain(&mut q), ["m1", "o1", "o2", "m2"]);
    }

    #[test]
    fn without_capacity_gpus_held_decide() {
        let none = Usage::default();
        assert_eq!(Usage { gpus: 3.0, cpu: 9.0, memory_gib: 9.0 }.dominant_share(&none), 3.0);
        let cap = Usage { gpus: 10.0, cpu: 0.0, memory_gib: 100.0 };
        assert_eq!(Usage { gpus: 1.0, cpu: 50.0, memory_gib: 50.0 }.dominant_share(&cap), 0.5);
    }
}
