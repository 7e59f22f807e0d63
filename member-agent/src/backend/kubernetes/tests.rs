//! Tests of the Kubernetes backend: inventory from fixture nodes, GPU type mapping, and the
//! backend end to end against the fake API server (error mapping, the created objects,
//! status events, adoption, and the conformance suite in both modes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use meridian_proto::duration::HumanDuration;
use meridian_proto::protocol::Assignment;
use meridian_proto::spec::Payload;
use serde_json::Value;
use tokio::sync::mpsc;

use super::fake::{self, FakeApi};
use super::inventory::{GpuTypeMapper, scan};
use super::*;
use crate::backend::conformance::{self, Reopened};
use crate::backend::{InventorySource, JobEventReceiver, JobPhase, LocalBackend};
use crate::test_jobs::{self, job_spec};

/// A job of `replicas` × `gpus` for `tenant`, with an image.
pub(crate) fn assignment(job_id: &str, token: u64, tenant: &str, replicas: u32, gpus: u32) -> Assignment {
    let mut spec = job_spec(tenant, replicas, gpus, 600);
    spec.gang.resources.cpu = 4;
    spec.gang.resources.memory_gib = 16;
    spec.payload.image = Some("registry.example/train:1".into());
    test_jobs::assignment(job_id, token, spec)
}

pub(super) fn with_command(mut job: Assignment, script: &str) -> Assignment {
    job.spec.payload.command = vec!["sh".into(), "-c".into(), script.into()];
    job
}

pub(super) fn fixture(name: &str) -> Value {
    let text = match name {
        "nodes" => include_str!("testdata/nodes.json"),
        "pods" => include_str!("testdata/pods.json"),
        _ => include_str!("testdata/member-nodes.json"),
    };
    serde_json::from_str(text).unwrap()
}

/// A backend config for the fake API server (which answers lists, not watches) in `mode`.
pub(super) fn config(mode: Mode) -> KubernetesConfig {
    KubernetesConfig {
        mode,
        // The fake API server answers lists, not watches.
        status_updates: StatusUpdates::Poll,
        poll_interval: HumanDuration(Duration::from_millis(30)),
        request_timeout: HumanDuration::from_secs(5),
        ..KubernetesConfig::default()
    }
}

// ---- inventory ----

#[test]
fn nodes_become_shapes_with_gpus_from_allocatable_minus_bound_running_pods() {
    let nodes: Vec<Node> = serde_json::from_value(fixture("nodes")).unwrap();
    let pods: Vec<Pod> = serde_json::from_value(fixture("pods")).unwrap();
    let found = scan(&nodes, &pods, &GpuTypeMapper::default()).unwrap();
    let shapes = &found.inventory.shapes;
    let names: Vec<&str> = shapes.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a100-80gx8-96c-1007g", "a100-80g.1g.10gbx14-96c-1007g", "a100-80g.3g.40gbx2-96c-1007g"]);
    let a100 = &shapes[0];
    assert_eq!(
        (a100.gpu_type.as_str(), a100.gpu_memory_gib, a100.gpus_per_node, a100.cpu_per_node),
        ("a100-80g", 80, 8, 96)
    );
    // Node order: a100-0 (4 + 2 GPUs, 33.5 CPU, 264 GiB taken), a100-1 (a finished pod holds
    // nothing), a100-2 unschedulable, a100-3 NotReady.
    let free: Vec<(u32, u32, u32)> = a100.free.iter().map(|f| (f.gpus, f.cpu, f.memory_gib)).collect();
    assert_eq!(free, [(2, 62, 743), (8, 96, 1007), (0, 0, 0), (0, 0, 0)]);
    let mig = &shapes[1];
    assert_eq!((mig.gpu_memory_gib, mig.gpus_per_node, mig.free[0].gpus), (10, 14, 11));
    assert_eq!((shapes[2].gpu_memory_gib, shapes[2].free[0].gpus), (40, 2));
    assert_eq!(found.products["a100-80g"], ["NVIDIA-A100-SXM4-80GB"]);
    assert_eq!(found.products["a100-80g.1g.10gb"], ["NVIDIA-A100-SXM4-80GB"]);
}

#[test]
fn a_shape_keeps_the_labels_all_its_nodes_share() {
    let nodes: Vec<Node> = serde_json::from_value(fixture("nodes")).unwrap();
    let found = scan(&nodes, &[], &GpuTypeMapper::default()).unwrap();
    let labels = &found.shape_labels["a100-80gx8-96c-1007g"];
    assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1a");
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert!(!labels.contains_key("kubernetes.io/hostname"), "per-node labels are dropped: {labels:?}");
    assert_eq!(found.shape_labels["a100-80g.1g.10gbx14-96c-1007g"]["nvidia.com/mig.strategy"], "mixed");
    let shape = found.inventory.shapes.iter().find(|s| s.name == "a100-80gx8-96c-1007g").unwrap();
    assert_eq!(&shape.labels, labels, "the inventory's shape carries the labels a nodeSelector matches");
}

#[test]
fn gpu_products_map_to_meridian_types_with_overrides_first() {
    let mapper = GpuTypeMapper::default();
    let cases = [
        ("NVIDIA-A100-SXM4-80GB", None, "a100-80g"),
        ("NVIDIA-A100-PCIE-40GB", None, "a100-40g"),
        ("NVIDIA-A100-SXM4", Some(81920), "a100-80g"),
        ("NVIDIA-H100-80GB-HBM3", None, "h100"),
        ("NVIDIA-GH200-480GB", None, "gh200"),
        ("NVIDIA-L40S", None, "l40s"),
        ("NVIDIA-L4", None, "l4"),
        ("Tesla-T4", None, "t4"),
    ];
    for (product, memory, want) in cases {
        assert_eq!(mapper.gpu_type(product, memory).unwrap(), want, "{product}");
    }
    let err = mapper.gpu_type("NVIDIA-RTX-PRO-6000", None).unwrap_err().to_string();
    assert!(err.contains("NVIDIA-RTX-PRO-6000") && err.contains("kubernetes.gpuTypes"), "{err}");
    let mapper = GpuTypeMapper::new(BTreeMap::from([("NVIDIA-RTX-PRO-6000".into(), "l40s".into())]));
    assert_eq!(mapper.gpu_type("NVIDIA-RTX-PRO-6000", None).unwrap(), "l40s");
}

#[tokio::test]
async fn an_unmappable_product_stops_the_backend_at_start_naming_product_and_key() {
    let mut nodes = fixture("member");
    nodes[0]["metadata"]["labels"]["nvidia.com/gpu.product"] = "ACME-Z9".into();
    let api = FakeApi::start(nodes, Value::Array(Vec::new())).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    let Err(err) = KubernetesBackend::with_client(api.client(), config(Mode::Volcano), "k8s-test".into(), tx).await
    else {
        panic!("expected a start-up error")
    };
    let err = err.to_string();
    assert!(err.contains("ACME-Z9") && err.contains("kubernetes.gpuTypes"), "{err}");
}

// ---- against the fake API ----

async fn backend_on(api: &Arc<FakeApi>, mode: Mode) -> (KubernetesBackend, JobEventReceiver) {
    backend_with(api, config(mode)).await
}

pub(super) async fn backend_with(
    api: &Arc<FakeApi>,
    config: KubernetesConfig,
) -> (KubernetesBackend, JobEventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (KubernetesBackend::with_client(api.client(), config, "k8s-test".into(), tx).await.unwrap(), rx)
}

async fn member(mode: Mode, controller: bool) -> (Arc<FakeApi>, KubernetesBackend, JobEventReceiver) {
    let api = FakeApi::start(fixture("member"), Value::Array(Vec::new())).await;
    if controller {
        api.run_controller(Duration::from_millis(20));
    }
    let (backend, rx) = backend_on(&api, mode).await;
    (api, backend, rx)
}

/// The next event for `job_id` that satisfies `wanted`, within 10 s.
pub(super) async fn event_for(
    events: &mut JobEventReceiver,
    job_id: &str,
    wanted: impl Fn(&JobPhase) -> bool,
) -> JobEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let Ok(event) = tokio::time::timeout_at(deadline, events.recv()).await else {
            panic!("no wanted event for `{job_id}` within 10 s")
        };
        let event = event.expect("the backend keeps its event sender");
        eprintln!("event: {event:?}");
        if event.job_id == job_id && wanted(&event.phase) {
            return event;
        }
    }
}

#[tokio::test]
async fn submit_creates_one_volcano_job_with_the_node_selector_of_its_gpu_type() {
    let (api, backend, _rx) = member(Mode::Volcano, false).await;
    let mut job = assignment("j-1", 4, "vision", 2, 8);
    job.spec.gang.resources.gpu_types = vec!["h100".into()];
    let admission = backend.submit(&job).await.unwrap();
    assert!(matches!(&admission, Admission::Queued { reason } if reason.contains("queue `default`")), "{admission:?}");
    let created = api.created();
    assert_eq!(created.len(), 1);
    let object = &created[0];
    assert_eq!(object["metadata"]["name"], "m-j-1-t4");
    assert_eq!(object["metadata"]["namespace"], "meridian");
    assert_eq!(object["spec"]["minAvailable"], 2);
    let pod = &object["spec"]["tasks"][0]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
    assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
    // The same binding again creates nothing.
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
    assert_eq!(api.created().len(), 1);
}

#[tokio::test]
async fn a_kueue_job_gets_a_headless_service_owned_by_it_and_a_retry_ensures_it_again() {
    let (api, backend, _rx) = member(Mode::Kueue, false).await;
    let job = assignment("j-k", 2, "t", 2, 1);
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
    let jobs = api.objects(fake::BATCH_JOBS);
    let services = api.objects(fake::SERVICES);
    assert_eq!((jobs.len(), services.len()), (1, 1), "{services:?}");
    assert_eq!(services[0]["metadata"]["name"], jobs[0]["metadata"]["name"]);
    assert_eq!(services[0]["metadata"]["ownerReferences"][0]["uid"], jobs[0]["metadata"]["uid"]);
    assert_eq!(jobs[0]["spec"]["completionMode"], "Indexed");
    // The Service lost (an earlier try failed after the Job was created): the retry makes it.
    api.remove_all(fake::SERVICES);
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
    assert_eq!(api.objects(fake::SERVICES).len(), 1);
    assert_eq!(api.objects(fake::BATCH_JOBS).len(), 1, "no second Job");
    // And a Service that exists already is fine.
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
}

#[tokio::test]
async fn a_service_the_agent_may_not_create_refuses_the_job_for_good_and_removes_it() {
    let (api, backend, _rx) = member(Mode::Kueue, false).await;
    api.fail_next_create_of(
        fake::SERVICES,
        403,
        "services is forbidden: User \"system:serviceaccount:meridian:agent\" cannot create resource \"services\"",
    );
    let admission = backend.submit(&assignment("j-f", 1, "t", 1, 1)).await.unwrap();
    let Admission::Refused { reason, permanent: true } = admission else { panic!("{admission:?}") };
    assert!(reason.contains("403") && reason.contains("create on services"), "{reason}");
    assert!(api.objects(fake::BATCH_JOBS).is_empty(), "the Job is deleted again");
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_job_found_from_an_earlier_try_gets_its_service_and_is_never_deleted_for_it() {
    let (api, backend, _rx) = member(Mode::Kueue, false).await;
    let job = assignment("j-e", 4, "t", 2, 1);
    // An earlier try created the Job, but its answer (and the Service) were lost: the create
    // answers 409 and the Service is made now.
    let object = objects::build(&job, &config(Mode::Kueue), &GpuPlacement::for_type(None, Vec::new()), "k8s-test");
    api.put(fake::BATCH_JOBS, object);
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
    assert_eq!(api.objects(fake::SERVICES).len(), 1, "the retry made the Service");
    // A Service the API refuses for good on a later retry keeps the Job (it may run).
    api.remove_all(fake::SERVICES);
    api.fail_next_create_of(fake::SERVICES, 403, "services is forbidden");
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
    assert_eq!(api.objects(fake::BATCH_JOBS).len(), 1, "the Job stays");
}

#[tokio::test]
async fn volcano_mode_creates_no_service_of_its_own() {
    let (api, backend, _rx) = member(Mode::Volcano, false).await;
    backend.submit(&assignment("j-v", 2, "t", 2, 1)).await.unwrap();
    assert!(api.objects(fake::SERVICES).is_empty(), "Volcano's svc plugin makes it");
}

#[tokio::test]
async fn a_command_only_payload_is_refused_permanently() {
    let (api, backend, _rx) = member(Mode::Volcano, false).await;
    let mut job = assignment("bare", 1, "t", 1, 1);
    job.spec.payload = Payload { image: None, command: vec!["true".into()], ..Payload::default() };
    let admission = backend.submit(&job).await.unwrap();
    assert!(
        matches!(&admission, Admission::Refused { permanent: true, reason } if reason.contains("image")),
        "{admission:?}"
    );
    assert!(api.created().is_empty());
}

#[tokio::test]
async fn an_invalid_object_is_refused_permanently_with_the_apis_message() {
    let (api, backend, _rx) = member(Mode::Volcano, false).await;
    api.fail_next_create(422, "Job.batch.volcano.sh \"x\" is invalid: spec.queue: queue `nope` does not exist");
    let admission = backend.submit(&assignment("j", 1, "t", 1, 1)).await.unwrap();
    let Admission::Refused { reason, permanent: true } = admission else { panic!("{admission:?}") };
    assert!(reason.contains("queue `nope` does not exist"), "{reason}");
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_server_error_is_transient_and_a_retry_succeeds() {
    let (_api, backend, _rx) = member(Mode::Kueue, false).await;
    let job = assignment("j", 1, "t", 1, 1);
    _api.fail_next_create(500, "etcdserver: request timed out");
    let err = backend.submit(&job).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("request timed out"), "{err}");
    assert!(matches!(backend.submit(&job).await.unwrap(), Admission::Queued { .. }));
}

#[tokio::test]
async fn an_unreachable_api_is_transient() {
    let api = FakeApi::start(fixture("member"), Value::Array(Vec::new())).await;
    let client = api.client();
    let (tx, _rx) = mpsc::unbounded_channel();
    let backend = KubernetesBackend::with_client(client, config(Mode::Volcano), "k8s-test".into(), tx).await.unwrap();
    drop(api);
    let err = backend.submit(&assignment("j", 1, "t", 1, 1)).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}

#[tokio::test]
async fn a_create_that_conflicts_with_the_same_binding_is_idempotent() {
    let (api, backend, _rx) = member(Mode::Volcano, false).await;
    let job = assignment("j", 9, "t", 1, 1);
    // An earlier try created the object but its answer was lost; this create answers 409.
    let object = objects::build(&job, &config(Mode::Volcano), &GpuPlacement::for_type(None, Vec::new()), "k8s-test");
    api.put(fake::VCJOBS, object);
    let held = backend.submit(&job).await.unwrap();
    assert!(matches!(held, Admission::Queued { .. }), "{held:?}");
    assert!(api.created().is_empty(), "nothing created twice");
}

#[tokio::test]
async fn a_finished_gang_reports_exit_codes_and_logs() {
    let (_api, backend, mut events) = member(Mode::Volcano, true).await;
    let job = with_command(assignment("fails", 1, "t", 2, 1), "echo oops >&2; exit 3");
    backend.submit(&job).await.unwrap();
    // A poll may miss the short Running phase; when it is seen, it names both replicas' node.
    let failed = event_for(&mut events, "fails", |phase| {
        if let JobPhase::Running { nodes } = phase {
            assert_eq!(nodes, &["h100-0", "h100-0"]);
        }
        phase.is_terminal()
    })
    .await;
    let JobPhase::Failed { message } = failed.phase else { panic!("{failed:?}") };
    assert!(message.contains("exited with code 3"), "{message}");
    let logs = backend.logs("fails", 1, None, 1000).await.unwrap();
    assert!(logs.data.contains("==> m-fails-t1-main-0 <==\noops\n"), "{logs:?}");
    assert!(logs.complete);
}

/// The conformance subject for one mode: two 8-GPU H100 nodes behind the fake API with its
/// stand-in controller (and the fake, for looking at what was created).
async fn subject(mode: Mode) -> (Arc<FakeApi>, conformance::Subject) {
    let api = FakeApi::start(fixture("member"), Value::Array(Vec::new())).await;
    api.run_controller(Duration::from_millis(20));
    subject_with(api, config(mode)).await
}

/// The conformance subject over `api` (its controller running) with backends of `config`.
pub(super) async fn subject_with(api: Arc<FakeApi>, config: KubernetesConfig) -> (Arc<FakeApi>, conformance::Subject) {
    let (backend, events) = backend_with(&api, config.clone()).await;
    let backend = Arc::new(backend);
    let subject = conformance::Subject {
        backend: backend.clone(),
        inventory: backend,
        events,
        runs: with_command(assignment("runs", 3, "a", 1, 4), "sleep 600"),
        fills: with_command(assignment("fills", 3, "a", 2, 8), "sleep 600"),
        succeeds: with_command(assignment("succeeds", 3, "a", 1, 1), "echo hello; exit 0"),
        fails: with_command(assignment("fails", 3, "a", 1, 1), "echo oops >&2; exit 3"),
        never_fits: assignment("never", 3, "a", 1, 16),
        reopen: reopener(&api, config),
        adopts: true,
        keeps_logs: true,
        patience: Duration::from_secs(10),
    };
    (api, subject)
}

fn reopener(api: &Arc<FakeApi>, config: KubernetesConfig) -> Box<dyn Fn() -> Reopened + Send + Sync> {
    let api = Arc::clone(api);
    Box::new(move || {
        let (api, config) = (Arc::clone(&api), config.clone());
        Box::pin(async move {
            let (backend, events) = backend_with(&api, config).await;
            let backend = Arc::new(backend);
            (backend.clone() as Arc<dyn LocalBackend>, backend as Arc<dyn InventorySource>, events)
        })
    })
}

/// The shared suite, against the fake API with its stand-in controller.
async fn conformance_in(mode: Mode) {
    conformance::run(subject(mode).await.1).await;
}

#[tokio::test]
async fn the_volcano_mode_passes_the_conformance_suite() {
    conformance_in(Mode::Volcano).await;
}

#[tokio::test]
async fn the_kueue_mode_passes_the_conformance_suite() {
    conformance_in(Mode::Kueue).await;
}

/// What the suite does not look at on Kubernetes: the scheduler's own reason while a gang
/// waits, and the pod group (Volcano) or Workload (Kueue) going away with a cancelled job.
async fn waiting_reason_and_cleanup(mode: Mode) {
    let (api, mut f) = subject(mode).await;
    let backend = f.backend.clone();
    backend.submit(&f.fills).await.unwrap();
    event_for(&mut f.events, "fills", |p| matches!(p, JobPhase::Running { .. })).await;
    backend.submit(&f.runs).await.unwrap();
    event_for(&mut f.events, "runs", |p| matches!(p, JobPhase::Pending { reason } if reason.contains("Insufficient")))
        .await;
    let again = backend.submit(&f.runs).await.unwrap();
    assert!(matches!(&again, Admission::Queued { reason } if reason.contains("Insufficient")), "{again:?}");
    backend.cancel("fills", 3).await.unwrap();
    let groups = api.objects(if mode == Mode::Volcano { fake::PODGROUPS } else { fake::WORKLOADS });
    assert_eq!(groups.len(), 1, "the cancelled job's pod group went with it: {groups:?}");
    event_for(&mut f.events, "runs", |p| matches!(p, JobPhase::Running { .. })).await;
}

#[tokio::test]
async fn volcano_mode_says_why_a_gang_waits_and_cleans_up_after_cancel() {
    waiting_reason_and_cleanup(Mode::Volcano).await;
}

#[tokio::test]
async fn kueue_mode_says_why_a_gang_waits_and_cleans_up_after_cancel() {
    waiting_reason_and_cleanup(Mode::Kueue).await;
}

#[test]
fn the_example_agent_configs_are_valid() {
    for (name, text) in [
        ("agent-volcano.yaml", include_str!("../../../../deploy/examples/kubernetes/agent-volcano.yaml")),
        ("agent-kueue.yaml", include_str!("../../../../deploy/examples/kubernetes/agent-kueue.yaml")),
    ] {
        let config = crate::config::AgentConfig::parse(text, std::path::Path::new(name)).unwrap();
        assert!(config.kubernetes.is_some(), "{name}");
    }
}

#[test]
fn the_example_rbac_grants_what_the_backend_calls() {
    let volcano = include_str!("../../../../deploy/examples/kubernetes/rbac-volcano.yaml");
    let kueue = include_str!("../../../../deploy/examples/kubernetes/rbac-kueue.yaml");
    for (rbac, group, jobs_group) in
        [(volcano, "scheduling.volcano.sh", "batch.volcano.sh"), (kueue, "kueue.x-k8s.io", "batch")]
    {
        assert!(rbac.contains(&format!("apiGroups: [\"{group}\"]")), "{rbac}");
        assert!(rbac.contains(&format!("apiGroups: [\"{jobs_group}\"]")), "{rbac}");
        assert!(rbac.contains("verbs: [\"create\", \"get\", \"list\", \"watch\", \"delete\"]"));
        assert!(rbac.contains("resources: [\"pods/log\"]"));
        assert!(rbac.contains("resources: [\"nodes\", \"pods\"]"));
    }
    // Kueue mode creates each Job's headless Service; Volcano's svc plugin makes its own.
    let services = "resources: [\"services\"]\n    verbs: [\"create\"]";
    assert!(kueue.contains(services), "{kueue}");
    assert!(!volcano.contains("services"), "{volcano}");
}
