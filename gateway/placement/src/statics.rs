//! What never changes with load, kept between decisions: each cluster's static verdict
//! (the static checks of `filter.rs`: the reasons it may never run a job, or the GPU types it may use) for
//! each class of job seen.
//!
//! Jobs of one class (equal gang, placement rules and payload kind: everything the static checks
//! read of a job) get equal static verdicts from a cluster, and a cluster's verdict changes only
//! with what the checks read of it: its report (identity, shapes, labels, prices) and its GPU
//! speeds. So a placement decision looks its class up once, instead of checking every cluster
//! again, which was a fifth of a decision's cost at 100 clusters.
//!
//! Each kept verdict names the cluster snapshot it was made for by its [`StaticsId`], given
//! when the snapshot is built or its speeds change and kept by clones, renewals and
//! reservations. A verdict whose cluster has another id (a new report, a federation whose
//! clusters changed) is made again, so a cache shared between snapshots is never stale.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use meridian_proto::spec::{GangSpec, JobSpec, PlacementRules};

use crate::options::TypeOptions;
use crate::quote::KeyHasher;
use crate::reasons::Reasons;

/// Most verdicts kept (classes × clusters): about 70 MB at most. When full the cache starts
/// over; a placement round or a bench cycle sees far fewer classes than this holds.
const MAX_VERDICTS: usize = 1 << 19;

/// Names what the static checks read of one cluster snapshot (see the module docs).
///
/// It is a cache key, not part of the snapshot's content: it compares equal to every other id,
/// so two snapshots of equal reports stay equal. The cache compares ids with [`Self::is`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StaticsId(u64);

impl StaticsId {
    /// An id no other snapshot of this process has.
    pub(crate) fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `self` and `other` name the same statics.
    fn is(self, other: StaticsId) -> bool {
        self.0 == other.0
    }
}

impl PartialEq for StaticsId {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// One cluster's static verdict for one class.
#[derive(Clone)]
pub(crate) struct StaticVerdict {
    /// The cluster snapshot it was made for.
    of: StaticsId,
    /// Why the cluster may never run the class; empty when it may.
    pub(crate) reasons: Reasons,
    /// The GPU types the class may use there (meaningful when `reasons` is empty).
    pub(crate) options: TypeOptions,
}

/// Static verdicts by class, shared by the clones of a federation snapshot (and by the core
/// between rounds). Safe to share: see the module docs.
#[derive(Default)]
pub struct StaticCache(Mutex<Classes>);

#[derive(Default)]
struct Classes {
    /// By [`JobClass::hash_of`], which is a hash already.
    by_hash: HashMap<u64, Vec<Class>, BuildHasherDefault<KeyHasher>>,
    verdicts: usize,
}

struct Class {
    class: JobClass,
    verdicts: Arc<[StaticVerdict]>,
}

/// What the static checks read of a job: its gang, its placement rules and whether it needs
/// container support. Jobs of one class may run on the same clusters, and fit now on the same
/// ones (the gateway's rounds use it for that too).
#[derive(Debug, PartialEq)]
pub struct JobClass {
    gang: GangSpec,
    placement: PlacementRules,
    container: bool,
}

impl JobClass {
    /// `job`'s class.
    pub fn of(job: &JobSpec) -> Self {
        Self { gang: job.gang.clone(), placement: job.placement.clone(), container: job.payload.image.is_some() }
    }

    /// Whether `job` is of this class.
    pub fn is_of(&self, job: &JobSpec) -> bool {
        self.gang == job.gang && self.placement == job.placement && self.container == job.payload.image.is_some()
    }

    /// A hash of `job`'s class from its plain fields (not its selectors or budget): jobs of one
    /// class hash alike, and [`Self::is_of`] tells apart those that only collide.
    pub fn hash_of(job: &JobSpec) -> u64 {
        let mut hasher = FoldHasher::default();
        let r = &job.gang.resources;
        (job.gang.replicas, r.gpus, r.cpu, r.memory_gib, r.gpu_memory_gib).hash(&mut hasher);
        r.gpu_types.hash(&mut hasher);
        job.placement.regions.hash(&mut hasher);
        job.payload.image.is_some().hash(&mut hasher);
        hasher.finish()
    }
}

impl StaticCache {
    /// The verdicts kept for `job`'s class (`hash`: [`JobClass::hash_of`]), if any.
    pub(crate) fn get(&self, hash: u64, job: &JobSpec) -> Option<Arc<[StaticVerdict]>> {
        let classes = self.0.lock().ok()?;
        let class = classes.by_hash.get(&hash)?.iter().find(|c| c.class.is_of(job))?;
        Some(Arc::clone(&class.verdicts))
    }

    /// Keeps `verdicts` for `job`'s class (`hash`: [`JobClass::hash_of`]), replacing older ones.
    pub(crate) fn put(&self, hash: u64, job: &JobSpec, verdicts: Arc<[StaticVerdict]>) {
        // A poisoned lock only means another thread panicked mid-update: the cache is advisory,
        // so it is skipped rather than trusted.
        let Ok(mut classes) = self.0.lock() else { return };
        if classes.verdicts + verdicts.len() > MAX_VERDICTS {
            classes.by_hash.clear();
            classes.verdicts = 0;
        }
        let same_hash = classes.by_hash.entry(hash).or_default();
        let added = verdicts.len();
        let removed = match same_hash.iter_mut().find(|c| c.class.is_of(job)) {
            Some(class) => std::mem::replace(&mut class.verdicts, verdicts).len(),
            None => {
                same_hash.push(Class { class: JobClass::of(job), verdicts });
                0
            }
        };
        classes.verdicts = classes.verdicts + added - removed;
    }

    /// Verdicts kept now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().map_or(0, |c| c.verdicts)
    }
}

impl StaticVerdict {
    /// The verdict `reasons` / `options` of the cluster snapshot named `of`.
    pub(crate) fn new(of: StaticsId, reasons: Reasons, options: TypeOptions) -> Self {
        Self { of, reasons, options }
    }

    /// Whether it was made for the snapshot named `id`.
    pub(crate) fn is_for(&self, id: StaticsId) -> bool {
        self.of.is(id)
    }
}

/// A fast hash for [`JobClass::hash_of`], which runs for every placement decision: each word is
/// folded in with a rotate, an xor and a multiply. Its keys are hashed by this process only and
/// [`JobClass::is_of`] settles collisions, so it need not resist crafted input.
#[derive(Default)]
struct FoldHasher(u64);

impl FoldHasher {
    fn fold(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.fold(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.fold(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.fold(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.fold(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.fold(value as u64);
    }
}

impl fmt::Debug for StaticCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.0.lock().map_or(0, |c| c.verdicts);
        f.debug_struct("StaticCache").field("verdicts", &kept).finish()
    }
}

/// A cache never makes two snapshots differ.
impl PartialEq for StaticCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
