//! What each tenant's jobs hold now (offered, bound, running, unknown), kept in step with every
//! change of a record, so a placement round reads each tenant's dominant-share numerators
//! without walking the jobs that hold resources.
//!
//! Tenants get a small number the first time a job of theirs is seen; a round turns those into
//! ranks in name order ([`HeldBook::ranks`]), so its fair-share queue orders tenants by name
//! while comparing integers.

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_placement::queue::Usage;
use meridian_proto::spec::JobSpec;

use crate::record::JobRecord;

/// A tenant's number in the [`HeldBook`]: given once, never reused.
pub(crate) type TenantId = u32;

/// Whole GPUs, cores and GiB, summed as integers so that adding and taking away is exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Held {
    gpus: u64,
    cpu: u64,
    memory_gib: u64,
}

/// Each tenant's number and what its jobs hold.
#[derive(Debug, Default)]
pub(crate) struct HeldBook {
    /// Tenant name → number, in name order.
    ids: BTreeMap<Arc<str>, TenantId>,
    /// By number.
    held: Vec<Held>,
}

/// One round's view of the tenants: each tenant's rank in name order, by number, and by rank its
/// name and what it holds.
pub(crate) struct Ranks {
    rank_of: Vec<u32>,
    by_rank: Vec<(Arc<str>, Usage)>,
}

impl HeldBook {
    /// The number of `tenant`, given now if it has none yet.
    pub(crate) fn id(&mut self, tenant: &str) -> TenantId {
        if let Some(&id) = self.ids.get(tenant) {
            return id;
        }
        let id = TenantId::try_from(self.held.len()).unwrap_or(TenantId::MAX);
        self.ids.insert(Arc::from(tenant), id);
        self.held.push(Held::default());
        id
    }

    /// Moves what a job holds from its record `before` (if any) to `after`: a record holds its
    /// gang's resources while [`JobRecord::holds_gpus`].
    pub(crate) fn changed(&mut self, before: Option<&JobRecord>, after: &JobRecord) {
        if let Some(before) = before.filter(|b| b.holds_gpus()) {
            let id = self.id(&before.spec.tenant);
            if let Some(held) = self.held.get_mut(id as usize) {
                held.take(&gang_of(&before.spec));
            }
        }
        if after.holds_gpus() {
            let id = self.id(&after.spec.tenant);
            if let Some(held) = self.held.get_mut(id as usize) {
                held.add(&gang_of(&after.spec));
            }
        }
    }

    /// This round's ranks (see [`Ranks`]).
    pub(crate) fn ranks(&self) -> Ranks {
        let mut rank_of = vec![0; self.held.len()];
        let mut by_rank = Vec::with_capacity(self.ids.len());
        for (rank, (name, &id)) in self.ids.iter().enumerate() {
            if let Some(slot) = rank_of.get_mut(id as usize) {
                *slot = u32::try_from(rank).unwrap_or(u32::MAX);
            }
            let held = self.held.get(id as usize).copied().unwrap_or_default();
            by_rank.push((Arc::clone(name), held.usage()));
        }
        Ranks { rank_of, by_rank }
    }
}

#[cfg(test)]
impl HeldBook {
    /// The number of `tenant` (MAX when it has none).
    pub(crate) fn id_of(&self, tenant: &str) -> TenantId {
        self.ids.get(tenant).copied().unwrap_or(TenantId::MAX)
    }

    /// Whether every tenant holds what it holds in `counted` (tenants `counted` does not know
    /// hold nothing).
    pub(crate) fn holds_as(&self, counted: &HeldBook) -> bool {
        self.ids.iter().all(|(name, &id)| {
            let held = self.held.get(id as usize).copied().unwrap_or_default();
            let expected = counted.ids.get(name.as_ref()).and_then(|&c| counted.held.get(c as usize)).copied();
            held == expected.unwrap_or_default()
        })
    }
}

impl Ranks {
    /// The rank (in name order) of tenant number `id`.
    pub(crate) fn rank(&self, id: TenantId) -> u32 {
        self.rank_of.get(id as usize).copied().unwrap_or(u32::MAX)
    }

    /// The name of the tenant of rank `rank`.
    pub(crate) fn name(&self, rank: u32) -> &str {
        self.by_rank.get(rank as usize).map_or("", |(name, _)| name)
    }

    /// What the tenant of rank `rank` holds.
    pub(crate) fn usage(&self, rank: u32) -> Usage {
        self.by_rank.get(rank as usize).map_or_else(Usage::default, |(_, usage)| *usage)
    }

    /// Whole GPUs each tenant holds, by name (what quotas count).
    pub(crate) fn held_gpus(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        // Whole numbers: usage adds whole gangs; `as` saturates, as the count of a quota should.
        self.by_rank.iter().map(|(name, usage)| (name.as_ref(), usage.gpus as u32))
    }
}

impl Held {
    fn add(&mut self, gang: &Held) {
        self.gpus = self.gpus.saturating_add(gang.gpus);
        self.cpu = self.cpu.saturating_add(gang.cpu);
        self.memory_gib = self.memory_gib.saturating_add(gang.memory_gib);
    }

    fn take(&mut self, gang: &Held) {
        self.gpus = self.gpus.saturating_sub(gang.gpus);
        self.cpu = self.cpu.saturating_sub(gang.cpu);
        self.memory_gib = self.memory_gib.saturating_sub(gang.memory_gib);
    }

    /// As the fair queue counts it. Integers below 2^53 convert exactly, so this equals adding
    /// each gang's usage as floating point.
    fn usage(self) -> Usage {
        Usage { gpus: self.gpus as f64, cpu: self.cpu as f64, memory_gib: self.memory_gib as f64 }
    }
}

/// What the whole gang of `spec` takes (each total saturating at `u32::MAX`, as the fair queue's
/// per-job counts do).
fn gang_of(spec: &JobSpec) -> Held {
    let r = &spec.gang.resources;
    Held {
        gpus: u64::from(spec.total_gpus()),
        cpu: u64::from(spec.gang.replicas.saturating_mul(r.cpu)),
        memory_gib: u64::from(spec.gang.replicas.saturating_mul(r.memory_gib)),
    }
}

#[cfg(test)]
mod tests {
    use meridian_proto::job::JobState;
    use meridian_proto::testing;

    use super::*;

    fn record(tenant: &str, state: JobState, gpus: u32) -> JobRecord {
        let mut spec = testing::spec(testing::JOB);
        spec.tenant = tenant.to_string();
        spec.gang.replicas = 2;
        spec.gang.resources.gpus = gpus;
        spec.gang.resources.cpu = 3;
        spec.gang.resources.memory_gib = 5;
        let mut job = JobRecord::queued(format!("j-{tenant}-{gpus}"), spec, "", 0);
        job.state = state;
        job
    }

    #[test]
    fn what_a_tenant_holds_follows_its_jobs_states() {
        let mut book = HeldBook::default();
        let queued = record("b", JobState::Queued, 4);
        book.changed(None, &queued);
        assert_eq!(book.ranks().usage(book.ranks().rank(book.id("b"))), Usage::default());
        let mut offered = queued.clone();
        offered.state = JobState::Offered;
        book.changed(Some(&queued), &offered);
        let mut running = offered.clone();
        running.state = JobState::Running;
        book.changed(Some(&offered), &running);
        let other = record("b", JobState::Running, 1);
        book.changed(None, &other);
        let b = book.id("b");
        let ranks = book.ranks();
        assert_eq!(ranks.usage(ranks.rank(b)), Usage { gpus: 10.0, cpu: 12.0, memory_gib: 20.0 });
        let mut done = running.clone();
        done.state = JobState::Succeeded;
        book.changed(Some(&running), &done);
        let ranks = book.ranks();
        assert_eq!(ranks.usage(ranks.rank(b)), Usage { gpus: 2.0, cpu: 6.0, memory_gib: 10.0 });
    }

    #[test]
    fn ranks_follow_names_not_first_sight() {
        let mut book = HeldBook::default();
        let (zed, alpha, mid) = (book.id("zed"), book.id("alpha"), book.id("mid"));
        let ranks = book.ranks();
        assert_eq!([ranks.rank(alpha), ranks.rank(mid), ranks.rank(zed)], [0, 1, 2]);
        assert_eq!(ranks.name(2), "zed");
        assert_eq!(book.id("mid"), mid, "a tenant keeps its number");
    }
}
