//! The Kubernetes backend against a real API server (Kubernetes v1.20.2, started by
//! `scripts/kube/up.sh DIR`, which `scripts/test.sh` runs): real validation, defaulting and
//! pruning, resource versions, RBAC and errors, where the fake API server (`fake.rs`) has only
//! our own reading of the API.
//!
//! - The tests read `MERIDIAN_KUBE_ENV` (`DIR/env`: URL, admin token, CA). Without it they fail,
//!   unless `MERIDIAN_SKIP_KUBE=1` says to skip them. They share one API server (nodes are
//!   cluster-wide), so they run one at a time and clean the namespace first.
//! - Set-up, as an admin: the Volcano CRDs (`testdata/volcano-crds.yaml`), the agent's
//!   ServiceAccount and RBAC as the agent chart renders them ([`agent_rbac`]), and two 8-GPU H100
//!   nodes (`testdata/member-nodes.json`).
//! - The agent's backend runs with the `meridian-agent` ServiceAccount's own token (a
//!   TokenRequest), never the admin's: a missing permission is a 403 and a failed test.
//! - No kubelet and no Volcano controller run here: [`StandIn`] plays both through the API, as
//!   they do (PodGroups, pods made from the task template, status through the status
//!   subresources, garbage collection of what a deleted Job owned). Pod logs need a kubelet, so
//!   `logs` is not tested here (the fake covers it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use meridian_proto::duration::HumanDuration;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::fake::{per_pod_gpus, script_of};
use super::*;
use crate::backend::conformance::{self, Reopened};
use crate::backend::slurm::read_env_file;
use crate::backend::{InventorySource, JobEventReceiver, JobPhase, LocalBackend};
use crate::test_jobs::{self, job_spec};

/// The agent's namespace and ServiceAccount, as the example RBAC names them.
const NS: &str = "meridian";
const AGENT: &str = "meridian-agent";
/// How long a job may take to move on the real server.
const PATIENCE: Duration = Duration::from_secs(30);

mod standin;
use standin::StandIn;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where the test API server is, from `MERIDIAN_KUBE_ENV`; None when the tests are skipped.
struct Server {
    url: String,
    admin_token: String,
    ca: String,
    /// The directory `scripts/kube/up.sh` keeps the server's state in.
    dir: String,
}

fn server() -> Option<Server> {
    if std::env::var("MERIDIAN_SKIP_KUBE").is_ok_and(|v| v == "1") {
        eprintln!("skipped: MERIDIAN_SKIP_KUBE=1 (no real Kubernetes API server)");
        return None;
    }
    let Ok(path) = std::env::var("MERIDIAN_KUBE_ENV") else {
        panic!(
            "these tests need a real Kubernetes API server: run `scripts/test.sh` (it starts one with \
             scripts/kube/up.sh and sets MERIDIAN_KUBE_ENV), or run `scripts/kube/up.sh DIR` and set \
             MERIDIAN_KUBE_ENV=DIR/env, or set MERIDIAN_SKIP_KUBE=1 to skip them"
        )
    };
    let env = read_env_file(std::path::Path::new(&path)).unwrap_or_else(|e| panic!("MERIDIAN_KUBE_ENV={path}: {e}"));
    Some(Server {
        url: env["MERIDIAN_KUBE_URL"].clone(),
        admin_token: env["MERIDIAN_KUBE_TOKEN"].clone(),
        ca: env["MERIDIAN_KUBE_CA"].clone(),
        dir: env["MERIDIAN_KUBE_DIR"].clone(),
    })
}

impl Server {
    /// A client that verifies the server against its certificate and sends `token`.
    fn client(&self, token: &str) -> kube::Client {
        install_crypto_provider();
        let mut config = kube::Config::new(self.url.parse().unwrap());
        config.root_cert_file = Some(self.ca.clone().into());
        config.auth_info.token = Some(token.to_owned().into());
        config.default_namespace = NS.into();
        kube::Client::try_from(config).unwrap()
    }
}

/// The resource of an object's `apiVersion` and `kind`, for the kinds the set-up creates; and
/// whether it is namespaced.
fn resource_of(object: &Value) -> (ApiResource, bool) {
    let api_version = object["apiVersion"].as_str().unwrap();
    let kind = object["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (plural, namespaced) = match kind {
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "Namespace" => ("namespaces", false),
        "Node" => ("nodes", false),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Queue" => ("queues", false),
        "LocalQueue" => ("localqueues", true),
        "ServiceAccount" => ("serviceaccounts", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        other => panic!("the set-up does not create {other}"),
    };
    (ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural), namespaced)
}

/// Creates each object unless it exists.
async fn ensure(admin: &kube::Client, objects: &[Value]) {
    for object in objects {
        let (resource, namespaced) = resource_of(object);
        let api: Api<DynamicObject> = match (namespaced, object["metadata"]["namespace"].as_str()) {
            (true, Some(ns)) => Api::namespaced_with(admin.clone(), ns, &resource),
            (true, None) => Api::namespaced_with(admin.clone(), NS, &resource),
            (false, _) => Api::all_with(admin.clone(), &resource),
        };
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        match api.create(&PostParams::default(), &dynamic).await {
            Ok(_) => {}
            // There from an earlier run: bring it up to date (an RBAC file that changed).
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let name = object["metadata"]["name"].as_str().unwrap();
                let current = api.get(name).await.unwrap();
                let mut updated = dynamic.clone();
                updated.metadata.resource_version = current.metadata.resource_version;
                api.replace(name, &PostParams::default(), &updated).await.unwrap();
            }
            Err(error) => panic!("creating {} {}: {error}", object["kind"], object["metadata"]["name"]),
        }
    }
}

/// The documents of a multi-document YAML text.
fn yaml_documents(text: &str) -> Vec<Value> {
    text.split("\n---")
        .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .collect()
}

/// The agent's ServiceAccount and RBAC as the agent chart renders them for Volcano mode
/// (`helm template` with `MERIDIAN_HELM`, which the test command sets), else the example file
/// `deploy/examples/kubernetes/rbac-volcano.yaml`, whose rules `tests/tests/helm.rs` proves equal
/// to the chart's.
fn agent_rbac() -> Vec<Value> {
    const KINDS: [&str; 5] = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let helm = std::env::var_os("MERIDIAN_HELM").filter(|_| std::env::var("MERIDIAN_SKIP_HELM").as_deref() != Ok("1"));
    let Some(helm) = helm else {
        eprintln!(
            "no MERIDIAN_HELM: applying deploy/examples/kubernetes/rbac-volcano.yaml instead of the rendered chart"
        );
        let example = yaml_documents(include_str!("../../../../deploy/examples/kubernetes/rbac-volcano.yaml"));
        return example.into_iter().filter(|d| KINDS.contains(&d["kind"].as_str().unwrap_or_default())).collect();
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "cluster: k8s-real\nregion: us-east\nkubernetes:\n  mode: volcano\n").unwrap();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/meridian-agent");
    let out = std::process::Command::new(&helm)
        .args(["template", AGENT, chart, "--namespace", NS, "--values"])
        .arg(&values)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let rendered: Vec<Value> = yaml_documents(&String::from_utf8(out.stdout).unwrap())
        .into_iter()
        .filter(|d| KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .collect();
    let account = rendered.iter().find(|d| d["kind"] == "ServiceAccount").expect("the chart makes a ServiceAccount");
    assert_eq!(account["metadata"]["name"], AGENT, "the tests take tokens for this account");
    assert_eq!(rendered.len(), KINDS.len(), "one of each: {rendered:?}");
    rendered
}

/// Everything the tests need on the server, made once and kept; leftovers of earlier tests in
/// the namespace removed. Returns the admin client and the agent's own client.
async fn set_up(server: &Server) -> (kube::Client, kube::Client) {
    let admin = server.client(&server.admin_token);
    ensure(&admin, &yaml_documents(include_str!("testdata/volcano-crds.yaml"))).await;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    ensure(&admin, &[namespace]).await;
    ensure(&admin, &agent_rbac()).await;
    let nodes: Vec<Value> = serde_json::from_str(include_str!("testdata/member-nodes.json")).unwrap();
    ensure(&admin, &nodes).await;
    // The namespace's `default` ServiceAccount, which pods run as (the controller manager's
    // ServiceAccount controller would make it).
    let default_account =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NS}});
    ensure(&admin, &[default_account]).await;
    served(&Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Volcano)), "Volcano Job").await;
    clean(&admin).await;
    (admin.clone(), server.client(&agent_token(&admin).await))
}

/// Waits until the API serves the custom resource of `api` (a moment after its CRD is created).
async fn served(api: &Api<DynamicObject>, kind: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while api.list(&ListParams::default()).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the {kind} CRD is not served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One test's hold on the shared API server: the lock, the set-up done, and the clients. Bind
/// `_one` when destructuring it: a field left to `..` is dropped at once, and the lock with it.
struct Session {
    _one: tokio::sync::MutexGuard<'static, ()>,
    server: Server,
    admin: kube::Client,
    agent: kube::Client,
}

/// The API server, set up and held for one test; None when the tests are skipped.
async fn session() -> Option<Session> {
    let server = server()?;
    let one = ONE_AT_A_TIME.lock().await;
    let (admin, agent) = set_up(&server).await;
    Some(Session { _one: one, server, admin, agent })
}

/// Deletes every Volcano Job, PodGroup and pod in the namespace.
async fn clean(admin: &kube::Client) {
    let all = DeleteParams::background();
    for resource in [job_resource(Mode::Volcano), group_resource(Mode::Volcano)] {
        let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &resource);
        api.delete_collection(&all, &ListParams::default()).await.unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    pods.delete_collection(&DeleteParams { grace_period_seconds: Some(0), ..all }, &ListParams::default())
        .await
        .unwrap();
}

/// A token of the agent's ServiceAccount, from the TokenRequest API.
async fn agent_token(admin: &kube::Client) -> String {
    token_of(admin, AGENT).await
}

/// A token of ServiceAccount `name` in the namespace, from the TokenRequest API.
async fn token_of(admin: &kube::Client, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}})).unwrap();
    let answer: TokenRequest =
        accounts.create_subresource("token", name, &PostParams::default(), &request).await.unwrap();
    answer.status.unwrap().token
}

fn config() -> KubernetesConfig {
    KubernetesConfig {
        mode: Mode::Volcano,
        namespace: NS.into(),
        poll_interval: HumanDuration(Duration::from_millis(100)),
        request_timeout: HumanDuration::from_secs(10),
        ..KubernetesConfig::default()
    }
}

/// A job of `replicas` × `gpus` H100s running `sh -c script`.
fn job(name: &str, replicas: u32, gpus: u32, script: &str) -> Assignment {
    let mut spec = job_spec("team", replicas, gpus, 600);
    spec.gang.resources.cpu = 4;
    spec.gang.resources.memory_gib = 16;
    spec.payload.image = Some("registry.example/train:1".into());
    spec.payload.command = vec!["sh".into(), "-c".into(), script.into()];
    test_jobs::assignment(name, 5, spec)
}

async fn backend_with(client: kube::Client) -> (Arc<KubernetesBackend>, JobEventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Arc::new(KubernetesBackend::with_client(client, config(), "k8s-real".into(), tx).await.unwrap()), rx)
}

// ---- the tests ----

#[tokio::test]
async fn the_volcano_mode_passes_the_conformance_suite_on_a_real_api_server_with_the_agents_own_rbac() {
    let Some(Session { _one, admin, agent, .. }) = session().await else { return };
    let _stand_in = StandIn::start(admin.clone());
    let (backend, events) = backend_with(agent.clone()).await;
    let reopen: Box<dyn Fn() -> Reopened + Send + Sync> = Box::new(move || {
        let agent = agent.clone();
        Box::pin(async move {
            let (backend, events) = backend_with(agent).await;
            (backend.clone() as Arc<dyn LocalBackend>, backend as Arc<dyn InventorySource>, events)
        })
    });
    conformance::run(conformance::Subject {
        backend: backend.clone(),
        inventory: backend,
        events,
        runs: job("runs", 1, 4, "sleep 600"),
        fills: job("fills", 2, 8, "sleep 600"),
        succeeds: job("succeeds", 1, 1, "echo hello; exit 0"),
        fails: job("fails", 1, 1, "echo oops >&2; exit 3"),
        never_fits: job("never", 1, 16, "true"),
        reopen,
        adopts: true,
        // Pod logs come from a kubelet, and none runs here.
        keeps_logs: false,
        patience: PATIENCE,
    })
    .await;
    clean(&admin).await;
}

#[tokio::test]
async fn what_the_agent_creates_survives_the_real_apis_validation_and_pruning_unchanged() {
    let Some(Session { _one, admin, agent, .. }) = session().await else { return };
    let _stand_in = StandIn::start(admin.clone());
    let (backend, mut events) = backend_with(agent).await;
    let mut job = job("pruned", 2, 4, "sleep 600");
    job.spec.priority = 90;
    job.spec.gang.resources.gpu_types = vec!["h100".into()];
    job.spec.placement.node_selector = "topology.kubernetes.io/zone=us-east-1a, !spot".parse().unwrap();
    job.spec.payload.env.insert("EPOCHS".into(), "3".into());
    backend.submit(&job).await.unwrap();
    let sent = objects::build(
        &job,
        &config(),
        &objects::GpuPlacement::for_type(Some("h100"), vec!["NVIDIA-H100-80GB-HBM3".into()]),
        "k8s-real",
    );
    let jobs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Volcano));
    let stored =
        serde_json::to_value(jobs.get(&objects::object_name(&job.job_id, job.fencing_token)).await.unwrap()).unwrap();
    // Every field we sent is stored as sent: nothing pruned by the schema, nothing renamed.
    assert_eq!(stored["spec"], sent["spec"], "stored {:#}\nsent {:#}", stored["spec"], sent["spec"]);
    assert_eq!(stored["metadata"]["labels"], sent["metadata"]["labels"]);
    assert_eq!(stored["metadata"]["annotations"], sent["metadata"]["annotations"]);
    // The pods made from the template pass the real Pod validation (the job contract's
    // downward-API index and `$(MERIDIAN_REPLICA)` references included), and the gang runs
    // with its nodes in replica order.
    let running = loop {
        let event = tokio::time::timeout(PATIENCE, events.recv()).await.expect("the gang starts").unwrap();
        if let JobPhase::Running { nodes } = event.phase {
            break nodes;
        }
    };
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let mut by_index = Vec::new();
    for pod in
        pods.list(&ListParams::default().labels(&format!("{}=m-pruned-t5", objects::BINDING_LABEL))).await.unwrap()
    {
        let index = pod.metadata.annotations.as_ref().unwrap()["volcano.sh/task-index"].clone();
        let env = &pod.spec.as_ref().unwrap().containers[0].env.as_ref().unwrap();
        let replica = env.iter().find(|e| e.name == "MERIDIAN_REPLICA").unwrap();
        let field = replica.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
        assert_eq!(field.field_path, "metadata.annotations['volcano.sh/task-index']");
        by_index.push((index, pod.spec.unwrap().node_name.unwrap()));
    }
    by_index.sort();
    let nodes: Vec<String> = by_index.into_iter().map(|(_, node)| node).collect();
    assert_eq!(running, nodes, "the backend reports the node of replica i at position i");
    clean(&admin).await;
}

#[tokio::test]
async fn the_agents_role_is_not_wider_than_it_needs() {
    let Some(Session { _one, admin, .. }) = session().await else { return };
    let reviews: Api<SubjectAccessReview> = Api::all(admin);
    let user = format!("system:serviceaccount:{NS}:{AGENT}");
    let can = |verb: &'static str, group: &'static str, resource: &'static str, namespace: Option<&'static str>| {
        let reviews = reviews.clone();
        let user = user.clone();
        async move {
            let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {"user": user,
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": namespace}}}))
            .unwrap();
            reviews.create(&PostParams::default(), &review).await.unwrap().status.unwrap().allowed
        }
    };
    // What it must have.
    for (verb, group, resource, ns) in [
        ("list", "", "nodes", None),
        ("list", "", "pods", None),
        ("list", "scheduling.volcano.sh", "podgroups", None),
        ("create", "batch.volcano.sh", "jobs", Some(NS)),
        ("get", "batch.volcano.sh", "jobs", Some(NS)),
        ("delete", "batch.volcano.sh", "jobs", Some(NS)),
    ] {
        assert!(can(verb, group, resource, ns).await, "the agent must be able to {verb} {group}/{resource}");
    }
    // What it must not have.
    for (verb, group, resource, ns) in [
        ("get", "", "secrets", Some(NS)),
        ("list", "", "secrets", None),
        ("create", "", "nodes", None),
        ("update", "", "nodes", None),
        ("patch", "", "nodes", None),
        ("create", "", "pods", Some(NS)),
        ("delete", "", "pods", Some(NS)),
        ("update", "batch.volcano.sh", "jobs", Some(NS)),
        ("create", "batch.volcano.sh", "jobs", Some("default")),
        ("create", "scheduling.volcano.sh", "podgroups", Some(NS)),
        ("create", "", "services", Some(NS)),
        ("create", "rbac.authorization.k8s.io", "roles", Some(NS)),
    ] {
        assert!(
            !can(verb, group, resource, ns).await,
            "the agent must not be able to {verb} {group}/{resource} in {ns:?}"
        );
    }
}

#[tokio::test]
async fn a_value_the_servers_validation_refuses_fails_the_job_for_good_in_the_servers_words() {
    let Some(Session { _one, admin, agent, .. }) = session().await else { return };
    // A Volcano queue name the CRD's pattern refuses (a 422 from the server, not from us).
    let config = KubernetesConfig { default_queue: "Not_A_Queue".into(), ..config() };
    let (tx, _rx) = mpsc::unbounded_channel();
    let backend = KubernetesBackend::with_client(agent, config, "k8s-real".into(), tx).await.unwrap();
    let admission = backend.submit(&job("badq", 1, 1, "true")).await.unwrap();
    let Admission::Refused { reason, permanent: true } = admission else { panic!("{admission:?}") };
    assert!(reason.contains("spec.queue") && reason.contains("Not_A_Queue"), "{reason}");
    assert!(backend.list().await.unwrap().is_empty(), "nothing is held");
    clean(&admin).await;
}

#[tokio::test]
async fn a_permission_the_agent_lacks_is_a_permanent_error_naming_the_verb_and_resource() {
    let Some(Session { _one, admin, server, .. }) = session().await else { return };
    let nobody = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody", "namespace": NS}});
    ensure(&admin, &[nobody]).await;
    let client = server.client(&token_of(&admin, "nobody").await);
    let (tx, _rx) = mpsc::unbounded_channel();
    let Err(error) = KubernetesBackend::with_client(client, config(), "k8s-real".into(), tx).await else {
        panic!("a ServiceAccount without the agent's role cannot run the backend")
    };
    assert!(!error.is_transient(), "a 403 is a configuration error, not worth retrying: {error}");
    let text = error.to_string();
    assert!(text.contains("403") && text.contains("list") && text.contains("nodes"), "{text}");
}

#[tokio::test]
async fn watches_resume_after_the_api_server_restarts_and_report_what_changed_meanwhile() {
    let Some(Session { _one, admin, agent, server, .. }) = session().await else { return };
    let stand_in = StandIn::start(admin.clone());
    let (backend, mut events) = backend_with(agent).await;
    let job = job("survivor", 1, 1, "sleep 600");
    backend.submit(&job).await.unwrap();
    loop {
        if matches!(next_event(&mut events).await.phase, JobPhase::Running { .. }) {
            break;
        }
    }
    // The API server goes away under the open watches and comes back over the same etcd.
    drop(stand_in);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kube/restart-apiserver.sh");
    let restarted = std::process::Command::new(script).arg(&server.dir).output().unwrap();
    assert!(restarted.status.success(), "{}", String::from_utf8_lossy(&restarted.stderr));
    // The job ends while nothing watched it live: the resumed watch reports it.
    let jobs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Volcano));
    let name = objects::object_name(&job.job_id, job.fencing_token);
    let ended = json!({"status": {"state": {"phase": "Failed", "message": "ended while the API server restarted"}}});
    jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&ended)).await.unwrap();
    let phase = loop {
        let event = next_event(&mut events).await;
        if event.phase.is_terminal() {
            break event.phase;
        }
    };
    assert!(
        matches!(&phase, JobPhase::Failed { message } if message.contains("ended while the API server restarted")),
        "{phase:?}"
    );
    clean(&admin).await;
}

/// The next job event, within [`PATIENCE`].
async fn next_event(events: &mut JobEventReceiver) -> crate::backend::JobEvent {
    tokio::time::timeout(PATIENCE, events.recv()).await.expect("an event in time").expect("events open")
}

/// Reads from the API server's own metrics how many GET, LIST and WATCH requests it has served
/// on jobs, pods and PodGroups, all clients together.
async fn status_reads(admin: &kube::Client) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.unwrap();
    text.lines()
        .filter(|line| line.starts_with("apiserver_request_total{"))
        .filter(|line| ["jobs", "pods", "podgroups"].iter().any(|r| line.contains(&format!("resource=\"{r}\""))))
        .filter(|line| ["GET", "LIST", "WATCH"].iter().any(|v| line.contains(&format!("verb=\"{v}\""))))
        .filter(|line| line.contains("subresource=\"\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

/// Waits until [`status_reads`] stays the same for a second (within [`PATIENCE`]).
async fn settled_reads(admin: &kube::Client) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = status_reads(admin).await;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = status_reads(admin).await;
        if now == last {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the status reads never settled");
        last = now;
    }
}

/// The API calls the status loop makes with many held jobs, polling and watching, counted by
/// the API server itself over a window in which nothing else calls it. The figures in
/// docs/benchmarks.md come from `MERIDIAN_KUBE_CALLS_JOBS=1000 MERIDIAN_KUBE_CALLS_WINDOW_SECS=60`;
/// the test command runs it with 50 jobs for 10 s per mode.
#[tokio::test]
async fn watching_costs_no_api_calls_per_round_however_many_jobs_are_held() {
    let Some(Session { _one, admin, agent, .. }) = session().await else { return };
    let count: usize = std::env::var("MERIDIAN_KUBE_CALLS_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let window = Duration::from_secs(
        std::env::var("MERIDIAN_KUBE_CALLS_WINDOW_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10),
    );
    // Held jobs as the agent would have submitted them; no stand-in runs, so they stay queued.
    let jobs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Volcano));
    let gpu = objects::GpuPlacement::for_type(None, Vec::new());
    for i in 0..count {
        let object = objects::build(&job(&format!("held-{i}"), 1, 1, "sleep 600"), &config(), &gpu, "k8s-real");
        jobs.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
    }
    let mut per_minute = BTreeMap::new();
    for mode in [StatusUpdates::Poll, StatusUpdates::Watch] {
        let config = KubernetesConfig { status_updates: mode, poll_interval: HumanDuration::from_secs(2), ..config() };
        let (tx, _events) = mpsc::unbounded_channel();
        let backend = KubernetesBackend::with_client(agent.clone(), config, "k8s-real".into(), tx).await.unwrap();
        assert_eq!(backend.list().await.unwrap().len(), count, "every held job is adopted");
        // The watches' first lists are not a per-round cost: count from when the reads stop
        // growing (at once when polling, whose rounds are the cost).
        if mode == StatusUpdates::Watch {
            settled_reads(&admin).await;
        }
        let before = status_reads(&admin).await;
        tokio::time::sleep(window).await;
        let calls = status_reads(&admin).await - before;
        drop(backend);
        per_minute.insert(format!("{mode:?}"), calls as f64 * 60.0 / window.as_secs_f64());
    }
    println!("kubernetes status loop, {count} held jobs, API calls per minute: {per_minute:?}");
    let (poll, watch) = (per_minute["Poll"], per_minute["Watch"]);
    // Polling lists jobs, pods and PodGroups every round (every 2 s); watching lists nothing.
    let one_round = 3.0 * 60.0 / window.as_secs_f64();
    assert!(poll >= one_round, "polling read at least one round in the window: {per_minute:?}");
    assert!(watch * 10.0 <= poll, "watching costs a tenth of polling or less: {per_minute:?}");
    clean(&admin).await;
}

/// Kueue's objects where 1.20 takes them: Kueue's suspended-Job flow cannot run here (1.20 has
/// no `Job.spec.suspend` and drops it silently), but the LocalQueues and Workloads the backend
/// reads are custom resources the real server stores and validates; queue pressure and the
/// watch caches read them back from it. As the admin: the example RBAC's Kueue role would widen
/// the Volcano role the other tests check.
#[tokio::test]
async fn kueue_workloads_on_the_real_server_give_the_queue_pressure() {
    let Some(Session { _one, admin, .. }) = session().await else { return };
    ensure(&admin, &yaml_documents(include_str!("testdata/kueue-crds.yaml"))).await;
    let workloads: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &group_resource(Mode::Kueue));
    served(&workloads, "Workload").await;
    workloads.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
    let queue = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
        "metadata": {"name": "lq-team", "namespace": NS}, "spec": {"clusterQueue": "cq-gpu"}});
    // Each CRD is served on its own: a LocalQueue created right after the Workloads answer can
    // still meet a 404 (seen once in CI under load).
    served(&Api::namespaced_with(admin.clone(), NS, &resource_of(&queue).0), "LocalQueue").await;
    ensure(&admin, &[queue]).await;
    let now = "2026-12-04T00:00:00Z";
    for (name, count, gpus, condition) in [
        (
            "waits",
            2,
            "8",
            json!({"type": "QuotaReserved", "status": "False", "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu", "lastTransitionTime": now}),
        ),
        (
            "runs",
            1,
            "4",
            json!({"type": "Admitted", "status": "True", "reason": "Admitted", "message": "admitted", "lastTransitionTime": now}),
        ),
    ] {
        let workload = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"queueName": "lq-team", "podSets": [{"name": "main", "count": count, "template": {"spec": {
                "containers": [{"name": "main", "image": "i", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}}]}});
        workloads.create(&PostParams::default(), &serde_json::from_value(workload).unwrap()).await.unwrap();
        let status = json!({"status": {"conditions": [condition]}});
        workloads.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }
    let config = KubernetesConfig { mode: Mode::Kueue, ..config() };
    let (tx, _events) = mpsc::unbounded_channel();
    let backend = KubernetesBackend::with_client(admin.clone(), config, "k8s-real".into(), tx).await.unwrap();
    let pressure = backend.pressure().await.unwrap();
    let loads: Vec<(&str, u32, u32, u32)> =
        pressure.queues.iter().map(|q| (&*q.queue, q.pending_jobs, q.pending_gpus, q.running_gpus)).collect();
    assert_eq!(loads, [("lq-team", 1, 16, 4)], "{pressure:?}");
    workloads.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
}

/// The start lock's writes where the real server validates them against Kueue's schema
/// (`testdata/kueue-crds.yaml`): the AdmissionCheck marked `Active` through its status
/// subresource, a binding's Workload let through (its `admissionChecks` entry set `Ready`, a
/// write conditional on the resource version), and a copy whose Workload holds a quota
/// reservation reported ready while its check stays `Pending`. Workloads are made as Kueue would
/// (1.20 runs no Kueue, and refuses the grant's template write: a suspended Job's template
/// annotations may change from 1.23, which every Kueue release needs). As the admin, like the
/// test above.
#[tokio::test]
async fn the_start_lock_check_on_the_real_server_lets_bindings_through_and_holds_copies() {
    let Some(Session { _one, admin, .. }) = session().await else { return };
    ensure(&admin, &yaml_documents(include_str!("testdata/kueue-crds.yaml"))).await;
    let checks: Api<DynamicObject> = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "AdmissionCheck"),
            "admissionchecks",
        ),
    );
    served(&checks, "AdmissionCheck").await;
    let workloads: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &group_resource(Mode::Kueue));
    served(&workloads, "Workload").await;
    let jobs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Kueue));
    let cleanup = || async {
        workloads.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
        jobs.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
        let _ = checks.delete("meridian-start-lock", &DeleteParams::default()).await;
    };
    cleanup().await;
    let check = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
        "metadata": {"name": "meridian-start-lock"}, "spec": {"controllerName": config::START_LOCK_CONTROLLER}});
    checks.create(&PostParams::default(), &serde_json::from_value(check).unwrap()).await.unwrap();

    let config = KubernetesConfig {
        mode: Mode::Kueue,
        start_lock_check: Some("meridian-start-lock".into()),
        status_updates: StatusUpdates::Poll,
        ..config()
    };
    let (tx, _events) = mpsc::unbounded_channel();
    let backend = KubernetesBackend::with_client(admin.clone(), config, "k8s-real".into(), tx).await.unwrap();
    let active = serde_json::to_value(checks.get("meridian-start-lock").await.unwrap()).unwrap();
    assert_eq!(active["status"]["conditions"][0]["type"], "Active", "{active}");
    assert_eq!(active["status"]["conditions"][0]["status"], "True", "{active}");
    let mut copies = backend.copy_events().unwrap();

    // What Kueue does once it reserves quota for a Job: its Workload, with the check pending.
    let reserve = |job: DynamicObject| {
        let workloads = workloads.clone();
        async move {
            let name = format!("job-{}", job.metadata.name.clone().unwrap());
            let workload = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                "metadata": {"name": name, "namespace": NS, "ownerReferences": [{"apiVersion": "batch/v1",
                    "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid, "controller": true}]},
                "spec": {"queueName": "default", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                    "containers": [{"name": "main", "image": "i"}]}}}]}});
            workloads.create(&PostParams::default(), &serde_json::from_value(workload).unwrap()).await.unwrap();
            let now = "2026-12-04T00:00:00Z";
            let status = json!({"status": {
                "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                    "message": "Quota reserved in ClusterQueue cq-gpu", "lastTransitionTime": now}],
                "admissionChecks": [{"name": "meridian-start-lock", "state": "Pending", "message": "Reset to Pending after eviction",
                    "lastTransitionTime": now}]}});
            workloads.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            name
        }
    };
    let state_of = |name: String| {
        let workloads = workloads.clone();
        async move {
            let workload = serde_json::to_value(workloads.get(&name).await.unwrap()).unwrap();
            let check = &workload["status"]["admissionChecks"][0];
            (
                check["state"].as_str().unwrap_or_default().to_owned(),
                check["message"].as_str().unwrap_or_default().to_owned(),
            )
        }
    };

    let binding = job("bound", 1, 8, "sleep 600");
    backend.submit(&binding).await.unwrap();
    let bound = reserve(jobs.get(&objects::object_name("bound", 5)).await.unwrap()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let message = loop {
        let (state, message) = state_of(bound.clone()).await;
        if state == "Ready" {
            break message;
        }
        assert!(tokio::time::Instant::now() < deadline, "the binding's check was not set ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(message.contains("binding 5 of job `bound`"), "{message}");

    let waiting = job("waits", 1, 8, "sleep 600");
    assert_eq!(backend.copy(7, &waiting).await.unwrap(), crate::backend::CopyAdmission::Queued);
    let copy = reserve(jobs.get(&objects::copy_name("waits", 7)).await.unwrap()).await;
    let ready = tokio::time::timeout(PATIENCE, copies.recv()).await.expect("the copy is ready").unwrap();
    assert_eq!(ready, crate::backend::CopyEvent::Ready { job_id: "waits".into(), copy_token: 7 });
    assert_eq!(state_of(copy).await.0, "Pending", "a copy's check waits for the grant");
    backend.drop_copy("waits", 7).await.unwrap();
    assert!(jobs.get_opt(&objects::copy_name("waits", 7)).await.unwrap().is_none(), "a dropped copy's Job is deleted");
    drop(backend);
    cleanup().await;
}
