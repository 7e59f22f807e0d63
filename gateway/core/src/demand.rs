//! Demand keys: what decides whether a job's gang could fit somewhere now (its shape and its
//! placement rules). Jobs with equal keys fit the same clusters, so a round that found one of
//! them fits nowhere skips the others without placing them; keys are numbered so the round
//! compares numbers, not specs.

use std::collections::HashMap;
use std::sync::Arc;

use meridian_placement::JobClass;
use meridian_proto::spec::JobSpec;

/// The demands in use (a job's demand is its [`JobClass`]: shape, placement rules and whether it
/// needs container support), by [`JobClass::hash_of`], each with its number.
#[derive(Debug, Default)]
pub(crate) struct DemandBook {
    by_hash: HashMap<u64, Vec<(Arc<JobClass>, u32)>>,
    next_id: u32,
}

impl DemandBook {
    /// The canonical copy and number of the demand of `spec`: equal demands get one number.
    /// The caller keeps the copy for as long as the job is queued (see [`Self::forget_unused`]).
    pub(crate) fn key_of(&mut self, spec: &JobSpec) -> (Arc<JobClass>, u32) {
        let same_hash = self.by_hash.entry(JobClass::hash_of(spec)).or_default();
        if let Some((canonical, id)) = same_hash.iter().find(|(demand, _)| demand.is_of(spec)) {
            return (Arc::clone(canonical), *id);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let canonical = Arc::new(JobClass::of(spec));
        same_hash.push((Arc::clone(&canonical), id));
        (canonical, id)
    }

    /// Forgets demands no queued job uses any more (each job holds a clone of its demand).
    pub(crate) fn forget_unused(&mut self) {
        self.by_hash.retain(|_, same_hash| {
            same_hash.retain(|(demand, _)| Arc::strong_count(demand) > 1);
            !same_hash.is_empty()
        });
    }
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use meridian_proto::spec::BurstPolicy;
    use meridian_proto::testing;

    use super::*;

    fn spec(gpus: u32) -> JobSpec {
        testing::spec(&format!(
            "name: j\ntenant: t\ngang: {{replicas: 1, resources: {{gpus: {gpus}}}}}\npayload: {{command: [x]}}\n"
        ))
    }

    #[test]
    fn equal_demands_share_a_number_and_any_difference_gets_another() {
        let mut book = DemandBook::default();
        let (_, one) = book.key_of(&spec(1));
        // Another job's name and tenant do not matter.
        let mut other = spec(1);
        other.tenant = "prod".into();
        assert_eq!(book.key_of(&other).1, one);
        assert_ne!(book.key_of(&spec(2)).1, one);
        // Fields the rough hash skips still tell demands apart.
        let mut never = spec(1);
        never.placement.burst = BurstPolicy::Never;
        let (_, never_id) = book.key_of(&never);
        assert_ne!(never_id, one);
        assert_eq!(book.key_of(&never).1, never_id);
    }

    #[test]
    fn a_demand_no_job_holds_is_forgotten() {
        let mut book = DemandBook::default();
        let held = book.key_of(&spec(1));
        let dropped = book.key_of(&spec(2));
        drop(dropped);
        book.forget_unused();
        assert_eq!(book.by_hash.values().map(Vec::len).sum::<usize>(), 1);
        // The held one keeps its number; the forgotten shape gets a new one.
        assert_eq!(book.key_of(&spec(1)).1, held.1);
        assert_eq!(book.key_of(&spec(2)).1, 2);
    }
}
