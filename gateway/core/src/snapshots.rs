//! The federation as placement reads it: a fresh snapshot of the registry for each round, and
//! the one submits are checked against ("could this ever run anywhere?"), kept until a cluster
//! joins or changes shape.

use std::collections::BTreeMap;
use std::sync::Arc;

use meridian_placement::{FederationSnapshot, NetworkTable, StaticCache};

use crate::registry::Registry;

/// The network table every snapshot shares, and the cached never-fits snapshot.
pub(crate) struct Snapshots {
    /// `config.network`, shared by every snapshot instead of copied into each round's.
    network: Arc<NetworkTable>,
    /// What submits are checked against; None until the first submit after a change.
    never_fits: Option<Arc<FederationSnapshot>>,
    /// The clusters' static verdicts by job class, shared by every round's snapshot (each
    /// verdict is checked against its cluster's current report before use).
    statics: Arc<StaticCache>,
}

impl Snapshots {
    /// Snapshots over `network`.
    pub(crate) fn new(network: NetworkTable) -> Self {
        Self { network: Arc::new(network), never_fits: None, statics: Arc::default() }
    }

    /// A round's own snapshot of `registry` at `now_ms` (its reservations change only this
    /// copy). `gpu_speed` is placement's GPU-type throughput table.
    pub(crate) fn for_round(
        &self,
        registry: &Registry,
        gpu_speed: &BTreeMap<String, f64>,
        now_ms: i64,
    ) -> FederationSnapshot {
        registry.snapshot(&self.network, gpu_speed, now_ms).with_statics(Arc::clone(&self.statics))
    }

    /// The snapshot submits are checked against. Whether a job could ever run depends only on
    /// the clusters' shapes, so it is built once and kept until [`Self::shapes_changed`].
    pub(crate) fn for_never_fits(
        &mut self,
        registry: &Registry,
        gpu_speed: &BTreeMap<String, f64>,
    ) -> Arc<FederationSnapshot> {
        match &self.never_fits {
            Some(snapshot) => Arc::clone(snapshot),
            None => {
                // Whether a job could ever run reads no quote.
                let snapshot = Arc::new(registry.snapshot(&self.network, gpu_speed, 0));
                self.never_fits = Some(Arc::clone(&snapshot));
                snapshot
            }
        }
    }

    /// A cluster joined or changed shape: the next submit checks against a new snapshot.
    pub(crate) fn shapes_changed(&mut self) {
        self.never_fits = None;
    }
}
