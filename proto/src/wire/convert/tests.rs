//! The conversions' tests: round trips, and every refusal naming its field.
// Panicking on an unexpected result is how a test fails; the workspace lint targets library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::super::pb;
use super::*;
use crate::duration::HumanDuration;
use crate::gpu::GpuCatalog;
use crate::inventory::*;
use crate::spec::{self, BurstPolicy, JobSpec};
use crate::validate::parse_job_spec;
use std::collections::BTreeMap;

use crate::validate::EXAMPLE_SPEC as EXAMPLE;

fn example() -> JobSpec {
    parse_job_spec(EXAMPLE, &GpuCatalog::default()).unwrap()
}

fn round_trip(spec: &JobSpec) -> JobSpec {
    JobSpec::try_from(pb::JobSpec::from(spec)).unwrap()
}

fn cluster_info() -> ClusterInfo {
    ClusterInfo {
        name: "hpc-east".into(),
        region: "us-east".into(),
        tier: Tier::Cloud,
        backend: BackendKind::Slurm,
        prices: BTreeMap::from([("h100".to_string(), 2.5), ("a100-80g".to_string(), 0.0)]),
        supports_containers: true,
        supports_bare_commands: false,
        labels: BTreeMap::from([("gpu-fabric".to_string(), "ib".to_string())]),
    }
}

fn inventory() -> Inventory {
    Inventory {
        shapes: vec![
            NodeShape {
                name: "dgx-h100".into(),
                gpu_type: "h100".into(),
                gpu_memory_gib: 80,
                gpus_per_node: 8,
                cpu_per_node: 112,
                memory_gib_per_node: 2048,
                free: vec![
                    NodeFree { gpus: 8, cpu: 112, memory_gib: 2048 },
                    NodeFree { gpus: 3, cpu: 40, memory_gib: 512 },
                ],
                labels: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
            },
            NodeShape {
                name: "l4-box".into(),
                gpu_type: "l4".into(),
                gpu_memory_gib: 24,
                gpus_per_node: 4,
                cpu_per_node: 32,
                memory_gib_per_node: 256,
                free: vec![NodeFree::default()],
                labels: BTreeMap::new(),
            },
        ],
    }
}

fn pressure() -> QueuePressure {
    QueuePressure {
        queues: vec![
            QueueLoad { queue: "default".into(), weight: 1.0, pending_jobs: 3, pending_gpus: 24, running_gpus: 16 },
            QueueLoad { queue: "nlp".into(), weight: 2.5, pending_jobs: 0, pending_gpus: 0, running_gpus: 8 },
        ],
        releases: vec![GpuRelease { after_secs: 60, gpus: 8 }, GpuRelease { after_secs: 3600, gpus: 16 }],
        estimated_wait_secs: 900,
        preemptible: vec![
            crate::inventory::PreemptibleGpus { priority: 10, gpus: 8 },
            crate::inventory::PreemptibleGpus { priority: 40, gpus: 4 },
        ],
    }
}

fn missing_field(err: ConvertError) -> String {
    match err {
        ConvertError::MissingField(field) => field,
        other => panic!("expected MissingField, got {other:?}"),
    }
}

#[test]
fn the_documented_example_round_trips_through_the_wire() {
    let spec = example();
    assert_eq!(round_trip(&spec), spec);
    assert_eq!(spec_from_wire(pb::JobSpec::from(&spec), &GpuCatalog::default()).unwrap(), spec);
}

#[test]
fn secret_env_values_reach_the_member_over_the_wire() {
    let text = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n\
                payload: {command: [x], env: {API_KEY: real-value, LR: '1'}, secretEnv: [API_KEY]}\n";
    let spec = parse_job_spec(text, &GpuCatalog::default()).unwrap();
    let wire = pb::JobSpec::from(&spec);
    let payload = wire.payload.as_ref().unwrap();
    assert_eq!(payload.env["API_KEY"], "real-value");
    assert_eq!(payload.secret_env, vec!["API_KEY".to_string()]);
    assert_eq!(round_trip(&spec), spec);
    // What users see keeps the marking but not the value.
    let shown = pb::JobSpec::from(&spec.redacted());
    assert_eq!(shown.payload.unwrap().env["API_KEY"], crate::spec::SECRET_SET);
}

#[test]
fn the_launcher_environment_choice_crosses_the_wire_and_a_name_this_build_lacks_is_refused() {
    let text = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n\
                payload: {command: [x], launcherEnvNames: {MASTER_PORT: TRAINER_PORT}}\n";
    let spec = parse_job_spec(text, &GpuCatalog::default()).unwrap();
    assert_eq!(round_trip(&spec), spec);
    let mut none = spec.clone();
    none.payload.launcher_env = crate::spec::LauncherEnv::None;
    none.payload.launcher_env_names.clear();
    assert_eq!(pb::JobSpec::from(&none).payload.unwrap().launcher_env, "none");
    assert_eq!(round_trip(&none), none);
    // The default travels as nothing, so an older gateway's specs mean `torch`.
    assert_eq!(pb::JobSpec::from(&spec).payload.unwrap().launcher_env, "");
    let mut wire = pb::JobSpec::from(&spec);
    wire.payload.as_mut().unwrap().launcher_env = "mpi".into();
    let err = spec_from_wire(wire, &GpuCatalog::default()).unwrap_err().to_string();
    assert!(err.contains("payload.launcher_env") && err.contains("`mpi`") && err.contains("torch, none"), "{err}");
}

/// The fenced code blocks of `docs/job-spec.md` tagged `lang`, in order.
fn doc_blocks(lang: &str) -> Vec<String> {
    let doc = include_str!("../../../../docs/job-spec.md");
    let fence = format!("```{lang}\n");
    doc.split(fence.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block.to_string()))
        .collect()
}

#[test]
fn the_reference_examples_are_the_example_in_both_forms() {
    let catalog = GpuCatalog::default();
    let yaml = doc_blocks("yaml");
    let json = doc_blocks("json");
    assert_eq!(parse_job_spec(&yaml[0], &catalog).unwrap(), example());
    assert_eq!(parse_job_spec(&json[0], &catalog).unwrap(), example());
    let smallest = parse_job_spec(&yaml[1], &catalog).unwrap();
    assert_eq!(round_trip(&smallest), smallest);
}

#[test]
fn the_job_environment_example_parses_and_renames_what_it_says() {
    let yaml = doc_blocks("yaml");
    let block = yaml.iter().find(|b| b.contains("name: ddp-two-nodes")).unwrap();
    let spec = parse_job_spec(block, &GpuCatalog::default()).unwrap();
    let names: Vec<String> = crate::job_env::variables(&spec.payload).into_iter().map(|v| v.name).collect();
    assert!(names.contains(&"TRAINER_NODE_RANK".to_string()) && !names.contains(&"NODE_RANK".to_string()), "{names:?}");
    assert_eq!(round_trip(&spec), spec);
}

#[test]
fn the_slice_and_selector_examples_parse_and_round_trip() {
    let catalog = GpuCatalog::default();
    let yaml = doc_blocks("yaml");
    let slice = yaml.iter().find(|b| b.contains("name: notebook-eval")).unwrap();
    let spec = parse_job_spec(slice, &catalog).unwrap();
    assert_eq!(spec.gang.resources.gpu_types, vec!["a100-80g.1g.10gb".to_string()]);
    assert_eq!(round_trip(&spec), spec);
    let selectors = yaml.iter().find(|b| b.contains("name: allreduce-bench")).unwrap();
    let spec = parse_job_spec(selectors, &catalog).unwrap();
    assert_eq!(spec.placement.node_selector().to_string(), "rack,!preemptible");
    assert_eq!(round_trip(&spec), spec);
    let snippet = yaml.iter().find(|b| b.starts_with("placement:\n  clusterSelector")).unwrap();
    let spec = parse_job_spec(&format!("{}{snippet}", yaml[1]), &catalog).unwrap();
    assert_eq!(spec.placement.cluster_selector().to_string(), "gpu-fabric=ib,meridian.io/tier!=cloud");
    assert_eq!(spec.placement.node_selector().to_string(), "rack=r1");
}

#[test]
fn optional_fields_round_trip_as_empty_values() {
    let mut spec = example();
    spec.idempotency_key = None;
    spec.runtime.limit = None;
    spec.payload.image = None;
    spec.placement.burst = BurstPolicy::Never;
    let wire = pb::JobSpec::from(&spec);
    assert_eq!(wire.idempotency_key, "");
    assert_eq!(wire.runtime.as_ref().map(|r| r.limit_seconds), Some(0));
    assert_eq!(wire.payload.as_ref().map(|p| p.image.as_str()), Some(""));
    assert!(wire.placement.as_ref().and_then(|p| p.burst).is_some_and(|b| b.never));
    assert_eq!(JobSpec::try_from(wire).unwrap(), spec);
}

#[test]
fn burst_without_a_cap_and_burst_at_once_round_trip() {
    let mut spec = example();
    spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(0), max_usd_per_hour: None };
    assert_eq!(round_trip(&spec), spec);
}

#[test]
fn a_deadline_round_trips_and_none_travels_as_zero() {
    let mut spec = example();
    spec.runtime.deadline = Some(HumanDuration::from_secs(12 * 3600));
    assert_eq!(pb::JobSpec::from(&spec).runtime.map(|r| r.deadline_seconds), Some(12 * 3600));
    assert_eq!(round_trip(&spec), spec);
    spec.runtime.deadline = None;
    assert_eq!(pb::JobSpec::from(&spec).runtime.map(|r| r.deadline_seconds), Some(0));
    assert_eq!(round_trip(&spec), spec);
}

#[test]
fn never_wins_over_the_other_burst_fields() {
    let wire = pb::BurstPolicy { never: true, after_seconds: 60, max_usd_per_hour: Some(10.0) };
    assert_eq!(BurstPolicy::from(wire), BurstPolicy::Never);
}

#[test]
fn sub_second_durations_are_floored_on_the_wire() {
    let runtime = spec::RuntimeSpec {
        estimate: "1s500ms".parse().unwrap(),
        limit: Some("2s999ms".parse().unwrap()),
        deadline: None,
    };
    let wire = pb::RuntimeSpec::from(&runtime);
    assert_eq!((wire.estimate_seconds, wire.limit_seconds), (1, 2));
}

#[test]
fn absent_optional_messages_take_the_spec_defaults() {
    let mut wire = pb::JobSpec::from(&example());
    wire.runtime = None;
    wire.placement = None;
    let spec = JobSpec::try_from(wire.clone()).unwrap();
    assert_eq!(spec.runtime, spec::RuntimeSpec::default());
    assert_eq!(spec.placement, spec::PlacementRules::default());

    wire.placement = Some(pb::PlacementRules { burst: None, ..Default::default() });
    assert_eq!(JobSpec::try_from(wire).unwrap().placement.burst, BurstPolicy::default());
}

#[test]
fn absent_required_messages_are_named() {
    let full = pb::JobSpec::from(&example());

    let mut wire = full.clone();
    wire.gang = None;
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "gang");

    let mut wire = full.clone();
    wire.gang = Some(pb::GangSpec { replicas: 2, resources: None });
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "gang.resources");

    let mut wire = full;
    wire.payload = None;
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "payload");
}

#[test]
fn empty_required_strings_are_named() {
    let full = pb::JobSpec::from(&example());

    let mut wire = full.clone();
    wire.name.clear();
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "name");

    let mut wire = full.clone();
    wire.tenant = "  ".into();
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "tenant");

    let mut wire = full.clone();
    wire.data.push(pb::DataRef { uri: String::new(), size_gib: 1.0, region: "eu-west".into() });
    assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "data[1].uri");

    let mut wire = full;
    wire.data[0].region.clear();
    let err = JobSpec::try_from(wire).unwrap_err();
    assert!(err.to_string().starts_with("data[0].region:"), "{err}");
    assert_eq!(missing_field(err), "data[0].region");
}

#[test]
fn a_standalone_data_ref_names_its_field_without_an_index() {
    let err = spec::DataRef::try_from(pb::DataRef { uri: "s3://x/y".into(), ..Default::default() }).unwrap_err();
    assert_eq!(missing_field(err), "data[].region");
}

#[test]
fn spec_from_wire_validates_and_keeps_every_field_error() {
    let mut wire = pb::JobSpec::from(&example());
    wire.priority = 150;
    if let Some(gang) = wire.gang.as_mut() {
        gang.replicas = 0;
    }
    let err = spec_from_wire(wire, &GpuCatalog::default()).unwrap_err();
    let ConvertError::InvalidSpec(spec_error) = &err else { panic!("expected InvalidSpec, got {err:?}") };
    let fields: Vec<String> = spec_error.field_errors().into_iter().map(|e| e.field).collect();
    assert_eq!(fields, vec!["priority", "gang.replicas"]);
    assert!(std::error::Error::source(&err).is_some());
    assert!(err.to_string().contains("gang.replicas"), "{err}");
}

#[test]
fn every_job_state_round_trips_and_unspecified_is_refused() {
    for state in JobState::ALL {
        let wire = pb::JobState::from(state);
        assert_eq!(JobState::try_from(wire).unwrap(), state);
        assert_eq!(job_state_from_wire("job.state", wire.into()).unwrap(), state);
    }
    assert!(matches!(
        JobState::try_from(pb::JobState::Unspecified),
        Err(ConvertError::InvalidEnum { value: 0, ref field, .. }) if field == "state"
    ));
    let err = job_state_from_wire("job.state", 42).unwrap_err();
    assert!(matches!(err, ConvertError::InvalidEnum { value: 42, .. }));
    assert!(err.to_string().starts_with("job.state: 42 is not a valid value"), "{err}");
}

#[test]
fn tiers_and_backends_round_trip_and_unspecified_is_refused() {
    for tier in [Tier::Owned, Tier::Cloud] {
        assert_eq!(Tier::try_from(pb::Tier::from(tier)).unwrap(), tier);
    }
    for backend in [BackendKind::Builtin, BackendKind::Slurm, BackendKind::Kubernetes] {
        assert_eq!(BackendKind::try_from(pb::BackendKind::from(backend)).unwrap(), backend);
    }
    assert!(matches!(Tier::try_from(pb::Tier::Unspecified), Err(ConvertError::InvalidEnum { value: 0, .. })));
    assert!(matches!(
        BackendKind::try_from(pb::BackendKind::Unspecified),
        Err(ConvertError::InvalidEnum { value: 0, .. })
    ));
    assert!(matches!(tier_from_wire("tier", 7), Err(ConvertError::InvalidEnum { value: 7, .. })));
    assert!(matches!(backend_from_wire("backend", -1), Err(ConvertError::InvalidEnum { value: -1, .. })));
}

#[test]
fn cluster_info_round_trips_through_hello() {
    let info = cluster_info();
    let hello = pb::Hello::from(&info);
    assert_eq!(hello.agent_version, "");
    assert_eq!(ClusterInfo::try_from(hello).unwrap(), info);
}

#[test]
fn hello_without_identity_is_refused() {
    let full = pb::Hello::from(&cluster_info());

    let mut hello = full.clone();
    hello.cluster.clear();
    assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.cluster");

    let mut hello = full.clone();
    hello.region.clear();
    assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.region");

    let mut hello = full.clone();
    hello.tier = pb::Tier::Unspecified.into();
    assert!(matches!(
        ClusterInfo::try_from(hello),
        Err(ConvertError::InvalidEnum { ref field, value: 0, .. }) if field == "hello.tier"
    ));

    let mut hello = full;
    hello.backend = 9;
    assert!(matches!(
        ClusterInfo::try_from(hello),
        Err(ConvertError::InvalidEnum { ref field, value: 9, .. }) if field == "hello.backend"
    ));
}

#[test]
fn hello_with_bad_prices_is_refused() {
    let full = pb::Hello::from(&cluster_info());
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        let mut hello = full.clone();
        hello.prices[1].usd_per_gpu_hour = bad;
        let err = ClusterInfo::try_from(hello).unwrap_err();
        assert!(
            matches!(err, ConvertError::OutOfRange { ref field, .. } if field == "hello.prices[1].usd_per_gpu_hour"),
            "{err:?}"
        );
    }

    let mut hello = full.clone();
    hello.prices.push(pb::GpuPrice { gpu_type: "h100".into(), usd_per_gpu_hour: 3.0 });
    assert_eq!(
        ClusterInfo::try_from(hello).unwrap_err(),
        ConvertError::Duplicate { field: "hello.prices".into(), key: "h100".into() }
    );

    let mut hello = full;
    hello.prices[0].gpu_type.clear();
    assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.prices[0].gpu_type");
}

#[test]
fn inventory_round_trips() {
    let inventory = inventory();
    assert_eq!(Inventory::try_from(pb::Inventory::from(&inventory)).unwrap(), inventory);
    assert_eq!(Inventory::try_from(pb::Inventory::default()).unwrap(), Inventory::default());
}

#[test]
fn a_node_with_more_free_than_its_shape_is_refused() {
    let full = pb::Inventory::from(&inventory());
    let cases = [
        (pb::NodeFree { gpus: 9, cpu: 0, memory_gib: 0 }, "gpus", 9, 8),
        (pb::NodeFree { gpus: 0, cpu: 113, memory_gib: 0 }, "cpu", 113, 112),
        (pb::NodeFree { gpus: 0, cpu: 0, memory_gib: 4096 }, "memory_gib", 4096, 2048),
    ];
    for (node, resource, free, capacity) in cases {
        let mut wire = full.clone();
        wire.shapes[0].free[1] = node;
        assert_eq!(
            Inventory::try_from(wire).unwrap_err(),
            ConvertError::FreeExceedsCapacity {
                field: format!("inventory.shapes[0].free[1].{resource}"),
                free,
                capacity
            }
        );
    }
}

#[test]
fn a_cpu_only_shape_is_accepted() {
    let mut wire = pb::Inventory::from(&inventory());
    wire.shapes.push(pb::NodeShape {
        name: "cpu-only".into(),
        cpu_per_node: 64,
        memory_gib_per_node: 512,
        free: vec![pb::NodeFree { gpus: 0, cpu: 64, memory_gib: 512 }],
        ..Default::default()
    });
    let inventory = Inventory::try_from(wire).unwrap();
    assert_eq!(inventory.shapes[2].gpus_total(), 0);
}

#[test]
fn inventory_shapes_need_a_unique_name_and_a_gpu_type() {
    let full = pb::Inventory::from(&inventory());

    let mut wire = full.clone();
    wire.shapes[1].name.clear();
    assert_eq!(missing_field(Inventory::try_from(wire).unwrap_err()), "inventory.shapes[1].name");

    let mut wire = full.clone();
    wire.shapes[1].name = "dgx-h100".into();
    assert_eq!(
        Inventory::try_from(wire).unwrap_err(),
        ConvertError::Duplicate { field: "inventory.shapes".into(), key: "dgx-h100".into() }
    );

    let mut wire = full;
    wire.shapes[0].gpu_type.clear();
    assert_eq!(missing_field(Inventory::try_from(wire).unwrap_err()), "inventory.shapes[0].gpu_type");
}

#[test]
fn queue_pressure_round_trips() {
    let pressure = pressure();
    assert_eq!(QueuePressure::try_from(pb::QueuePressure::from(&pressure)).unwrap(), pressure);
}

#[test]
fn releases_out_of_order_are_sorted() {
    let mut wire = pb::QueuePressure::from(&pressure());
    wire.releases.reverse();
    wire.releases.push(pb::GpuRelease { after_seconds: 60, gpus: 1 });
    let releases = QueuePressure::try_from(wire).unwrap().releases;
    assert_eq!(
        releases,
        vec![
            GpuRelease { after_secs: 60, gpus: 8 },
            GpuRelease { after_secs: 60, gpus: 1 },
            GpuRelease { after_secs: 3600, gpus: 16 },
        ]
    );
}

#[test]
fn queue_weights_must_be_finite_and_positive() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut wire = pb::QueuePressure::from(&pressure());
        wire.queues[1].weight = bad;
        let err = QueuePressure::try_from(wire).unwrap_err();
        assert!(
            matches!(err, ConvertError::OutOfRange { ref field, .. } if field == "pressure.queues[1].weight"),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("pressure.queues[1].weight:"), "{err}");
    }
}

#[test]
fn queues_need_a_unique_name() {
    let full = pb::QueuePressure::from(&pressure());

    let mut wire = full.clone();
    wire.queues[0].queue.clear();
    assert_eq!(missing_field(QueuePressure::try_from(wire).unwrap_err()), "pressure.queues[0].queue");

    let mut wire = full;
    wire.queues[1].queue = "default".into();
    assert_eq!(
        QueuePressure::try_from(wire).unwrap_err(),
        ConvertError::Duplicate { field: "pressure.queues".into(), key: "default".into() }
    );
}

#[test]
fn selectors_round_trip_through_the_wire() {
    let mut spec = example();
    spec.placement.cluster_selector = "gpu-fabric=ib,meridian.io/tier!=cloud".parse().unwrap();
    spec.placement.node_selector = "rack,!preemptible".parse().unwrap();
    let wire = pb::JobSpec::from(&spec);
    let placement = wire.placement.as_ref().unwrap();
    assert_eq!(placement.cluster_selector, "gpu-fabric=ib,meridian.io/tier!=cloud");
    assert_eq!(placement.node_selector, "rack,!preemptible");
    assert_eq!(spec_from_wire(wire, &GpuCatalog::default()).unwrap(), spec);
}

#[test]
fn bad_selectors_on_the_wire_name_their_fields() {
    let mut wire = pb::JobSpec::from(&example());
    if let Some(placement) = wire.placement.as_mut() {
        placement.cluster_selector = "a=1,=x".into();
        placement.node_selector = "rack=r 1".into();
    }
    let err = JobSpec::try_from(wire).unwrap_err();
    let ConvertError::InvalidSpec(spec_error) = &err else { panic!("expected InvalidSpec, got {err:?}") };
    let fields: Vec<String> = spec_error.field_errors().into_iter().map(|e| e.field).collect();
    assert_eq!(fields, vec!["placement.clusterSelector", "placement.nodeSelector"]);
    assert!(err.to_string().contains("placement.nodeSelector: requirement 1 `rack=r 1`"), "{err}");
}

#[test]
fn cluster_and_node_labels_travel_and_bad_ones_are_refused() {
    let hello = pb::Hello::from(&cluster_info());
    assert_eq!(hello.labels.get("gpu-fabric").map(String::as_str), Some("ib"));

    let mut bad = hello.clone();
    bad.labels.insert("meridian.io/region".into(), "x".into());
    let err = ClusterInfo::try_from(bad).unwrap_err();
    assert!(
        matches!(err, ConvertError::InvalidLabel { ref field, .. } if field == "hello.labels.meridian.io/region"),
        "{err:?}"
    );

    let mut wire = pb::Inventory::from(&inventory());
    assert_eq!(wire.shapes[0].labels.get("rack").map(String::as_str), Some("r1"));
    wire.shapes[1].labels.insert("rack".into(), "r 1".into());
    let err = Inventory::try_from(wire).unwrap_err();
    assert!(err.to_string().starts_with("inventory.shapes[1].labels.rack: label values are"), "{err}");
}
