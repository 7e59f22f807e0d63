//! Spans: a gang that accepts several GPU types may spread over types of equal, known speed on a
//! builtin cluster (A100 40 GB and 80 GB nodes), never over types of different speed, and never
//! on a backend that gives a gang one type.

use std::collections::BTreeMap;

use meridian_proto::inventory::BackendKind;

use super::*;

fn speeds(table: &[(&str, f64)]) -> BTreeMap<String, f64> {
    table.iter().map(|(t, s)| ((*t).to_owned(), *s)).collect()
}

/// Two free 8-GPU nodes of A100 40 GB and two of A100 80 GB, with both speeds listed as 1.
fn a100s(backend: BackendKind, free: &[u32]) -> FederationSnapshot {
    let mut info = info("a100s", "us-east", Tier::Owned);
    info.backend = backend;
    let c = snapshot(info, vec![shape("a100-40g", 8, &free[..2]), shape("a100-80g", 8, &free[2..])]);
    let mut fed = federation(vec![c]);
    fed.set_gpu_speed(&speeds(&[("a100-40g", 1.0), ("a100-80g", 1.0), ("h100", 2.5)]));
    fed
}

#[test]
fn a_gang_too_large_for_either_type_spans_both_when_they_run_alike() {
    let mut fed = a100s(BackendKind::Builtin, &[8, 8, 8, 8]);
    let d = place(&job(3, 8), &fed, &PlacementConfig::default());
    let choice = d.chosen.as_ref().expect("the span holds three 8-GPU replicas");
    assert!(choice.starts_now);
    assert_eq!(choice.gpu_type.as_str(), "a100-40g+a100-80g");
    // Reserving takes what the decision assumed: three whole nodes, across both types.
    let c = fed.cluster_mut("a100s").expect("cluster");
    assert!(c.reserve(&job(3, 8)));
    let free: u32 = c.inventory().shapes.iter().flat_map(|s| s.free.iter()).map(|n| n.gpus).sum();
    assert_eq!(free, 8);
    assert!(!c.reserve(&job(2, 8)), "one node is left");
}

#[test]
fn a_gang_that_fits_on_one_type_keeps_to_it() {
    let fed = a100s(BackendKind::Builtin, &[8, 8, 8, 8]);
    let d = place(&job(2, 8), &fed, &PlacementConfig::default());
    let choice = d.chosen.as_ref().expect("fits");
    assert!(choice.starts_now);
    assert!(!choice.gpu_type.contains('+'), "a single type is tried first: {}", choice.gpu_type);
}

#[test]
fn a_span_waits_for_releases_of_its_types_counting_each_free_gpu_once() {
    // Three nodes of each type, one free on each (16 GPUs), and 4 GPUs released at 5 and at 10
    // minutes: the 24-GPU gang, which each type could hold alone, waits for the second release.
    // Counting the free nodes once for each type and again for the span would make it the first.
    let mut info = info("a100s", "us-east", Tier::Owned);
    info.backend = BackendKind::Builtin;
    let pressure = QueuePressure {
        releases: vec![GpuRelease { after_secs: 300, gpus: 4 }, GpuRelease { after_secs: 600, gpus: 4 }],
        ..QueuePressure::default()
    };
    let shapes = vec![shape("a100-40g", 8, &[8, 0, 0]), shape("a100-80g", 8, &[8, 0, 0])];
    let mut fed = federation(vec![ClusterSnapshot::new(info, Inventory { shapes }, pressure, true)]);
    fed.set_gpu_speed(&speeds(&[("a100-40g", 1.0), ("a100-80g", 1.0)]));
    let d = place(&job(3, 8), &fed, &PlacementConfig::default());
    let choice = d.chosen.as_ref().expect("it can run there later");
    assert!(!choice.starts_now);
    assert_eq!(choice.gpu_type.as_str(), "a100-40g", "it waits for the cheapest option");
    let score = d.candidates[0].score().expect("scored");
    assert_eq!(score.expected_wait_secs, 600.0);
}

#[test]
fn no_span_over_types_of_different_or_unknown_speed_or_on_other_backends() {
    let never = |fed: &FederationSnapshot, why: &str| {
        let d = place(&job(3, 8), fed, &PlacementConfig::default());
        assert!(
            matches!(
                &rejections(&d, d.candidates[0].cluster.as_str())[..],
                [Rejection::GangNeverFits { max_replicas: 2, .. }]
            ),
            "{why}: {:?}",
            d.candidates[0]
        );
    };
    for backend in [BackendKind::Slurm, BackendKind::Kubernetes] {
        never(&a100s(backend, &[8, 8, 8, 8]), "one type per gang on this backend");
    }
    // The same builtin cluster without a speed table: the types are not known to run alike.
    let mut info = info("a100s", "us-east", Tier::Owned);
    info.backend = BackendKind::Builtin;
    let unknown = snapshot(info.clone(), vec![shape("a100-40g", 8, &[8, 8]), shape("a100-80g", 8, &[8, 8])]);
    never(&federation(vec![unknown]), "speeds unknown");
    // H100 and A100: the gang would step at the A100's pace.
    let mut mixed = federation(vec![snapshot(info, vec![shape("h100", 8, &[8, 8]), shape("a100-80g", 8, &[8, 8])])]);
    mixed.set_gpu_speed(&speeds(&[("a100-80g", 1.0), ("h100", 2.5)]));
    never(&mixed, "different speeds");
}

#[test]
fn a_gang_pinned_to_one_type_never_spans() {
    let fed = a100s(BackendKind::Builtin, &[8, 8, 8, 8]);
    let mut spec = job(3, 8);
    spec.gang.resources.gpu_types = vec!["a100-80g".into()];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert!(matches!(&rejections(&d, "a100s")[..], [Rejection::GangNeverFits { max_replicas: 2, .. }]));
    // Listing both types allows the span.
    spec.gang.resources.gpu_types = vec!["a100-80g".into(), "a100-40g".into()];
    let d = place(&spec, &fed, &PlacementConfig::default());
    assert_eq!(d.chosen.as_ref().map(|c| c.gpu_type.as_str()), Some("a100-40g+a100-80g"));
}
