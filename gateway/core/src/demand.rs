//! Demand keys: what decides whether a job's gang could fit somewhere now (its shape and its
//! placement rules). Jobs with equal keys fit the same clusters, so a round that found one of
//! them fits nowhere skips the others without placing them; keys are numbered so the round
//! compares numbers, not strings.

use std::collections::HashMap;
use std::sync::Arc;

use meridian_proto::spec::JobSpec;

/// The demand keys in use, by their canonical copy, with their numbers.
#[derive(Debug, Default)]
pub(crate) struct DemandBook {
    ids: HashMap<Arc<str>, u32>,
    next_id: u32,
}

impl DemandBook {
    /// The canonical copy and number of the demand key of `spec`: equal keys get one number.
    /// The caller keeps the copy for as long as the job is queued (see [`Self::forget_unused`]).
    pub(crate) fn key_of(&mut self, spec: &JobSpec) -> (Arc<str>, u32) {
        let key = demand_key(spec);
        if let Some((canonical, id)) = self.ids.get_key_value(key.as_str()) {
            return (Arc::clone(canonical), *id);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let canonical: Arc<str> = key.into();
        self.ids.insert(Arc::clone(&canonical), id);
        (canonical, id)
    }

    /// Forgets demand keys no queued job uses any more (each job holds a clone of its key).
    pub(crate) fn forget_unused(&mut self) {
        self.ids.retain(|key, _| Arc::strong_count(key) > 1);
    }
}

/// What decides whether a job's gang could fit somewhere now: its shape and its placement rules
/// (and whether it needs container support).
fn demand_key(spec: &JobSpec) -> String {
    format!("{:?}|{:?}|{}", spec.gang, spec.placement, spec.payload.image.is_some())
}
