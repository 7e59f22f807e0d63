//! Static verdicts kept per class of job (`statics.rs`): they decide exactly as checking every
//! cluster again would, and are made again only where a cluster changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::properties::{arb_federation, arb_job};
use super::*;

/// `fed`'s clusters as they are now, with an empty cache.
fn uncached(fed: &FederationSnapshot) -> FederationSnapshot {
    FederationSnapshot::shared(fed.clusters.clone(), Arc::clone(&fed.network))
}

#[test]
fn a_class_is_checked_once_and_again_only_where_a_cluster_changed() {
    let config = PlacementConfig::default();
    let mut fed = federation(vec![
        // Both cloud, so both are scored by price (an owned cluster's GPUs cost nothing).
        cluster("east", "us-east", Tier::Cloud, vec![shape("h100", 8, &[8, 0])]),
        cluster("cloud", "us-west", Tier::Cloud, vec![shape("l4", 4, &[4]), shape("h100", 8, &[8])]),
    ]);
    let spec = job(1, 8);
    let first = place(&spec, &fed, &config);
    assert_eq!(fed.statics.len(), 2, "one verdict per cluster");
    // Another job of the same class (only its name differs) reads the kept verdicts.
    let mut twin = spec.clone();
    twin.name = "twin".into();
    assert_eq!(place(&twin, &fed, &config).candidates, first.candidates);
    assert_eq!(fed.statics.len(), 2);
    // Another class gets its own.
    let mut l4_only = job(1, 4);
    l4_only.gang.resources.gpu_types = vec!["l4".into()];
    let l4_decision = place(&l4_only, &fed, &config);
    assert_eq!(fed.statics.len(), 4);
    assert_eq!(rejections(&l4_decision, "east").len(), 1, "east has no L4: {l4_decision:?}");
    // New GPU speeds change what a type's work costs: the verdicts are made again, and decide as
    // a fresh check does.
    fed.set_gpu_speed(&BTreeMap::from([("h100".to_string(), 2.0)]));
    let again = place(&spec, &fed, &config);
    assert_ne!(again.candidates, first.candidates, "H100 work now costs half");
    assert_eq!(again, place(&spec, &uncached(&fed), &config));
    assert_eq!(fed.statics.len(), 4, "replaced, not added");
}

proptest! {
    #[test]
    fn kept_verdicts_decide_as_checking_every_cluster_again_would(
        fed in arb_federation(),
        jobs in prop::collection::vec(arb_job(), 1..12),
    ) {
        let config = PlacementConfig::default();
        let mut warm = fed;
        for spec in &jobs {
            let kept = place(spec, &warm, &config);
            prop_assert_eq!(&kept, &place(spec, &uncached(&warm), &config));
            // An offer changes what is free, not what is static.
            if let Some(choice) = kept.chosen.filter(|c| c.starts_now)
                && let Some(cluster) = warm.cluster_mut(&choice.cluster)
            {
                cluster.reserve(spec);
            }
        }
        // A federation whose clusters changed order reads no verdict made for another cluster.
        warm.clusters.reverse();
        for spec in &jobs {
            prop_assert_eq!(place(spec, &warm, &config), place(spec, &uncached(&warm), &config));
        }
    }
}
