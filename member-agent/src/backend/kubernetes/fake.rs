//! A small in-process Kubernetes API server for tests: real object JSON over real HTTP, so the
//! backend runs through kube's client unchanged.
//!
//! It serves list/get/create/delete of the resources the backend uses (nodes, pods and pod
//! logs, Volcano Jobs, PodGroups, batch Jobs, Kueue Workloads; create of Services), filters lists by label
//! selector, assigns `uid`/`resourceVersion`/`creationTimestamp`, answers 404/409 with Status
//! objects like the real API, garbage-collects owned objects on delete, and records every
//! created object. Tests may queue an error for the next create.
//!
//! [`FakeApi::run_controller`] stands in for Volcano/Kueue and the kubelet, and does little: it
//! gives each new job a PodGroup or Workload, starts the gang when every replica fits on the
//! nodes' free GPUs (pods Running on those nodes), else marks it unschedulable with a reason;
//! a job whose command is `sh -c '…'` ends one tick after it started: its `echo WORD`s become
//! the pod log and its `exit N` the exit code. Other jobs run until deleted.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::inventory::{self, GpuTypeMapper};

/// Store key of nodes.
pub(crate) const NODES: &str = "core/v1/nodes";
/// Store key of pods.
pub(crate) const PODS: &str = "core/v1/pods";
/// Store key of Volcano Jobs.
pub(crate) const VCJOBS: &str = "batch.volcano.sh/v1alpha1/jobs";
/// Store key of PodGroups.
pub(crate) const PODGROUPS: &str = "scheduling.volcano.sh/v1beta1/podgroups";
/// Store key of batch Jobs.
pub(crate) const BATCH_JOBS: &str = "batch/v1/jobs";
/// Store key of Services.
pub(crate) const SERVICES: &str = "core/v1/services";
/// Store key of Kueue Workloads.
pub(crate) const WORKLOADS: &str = "kueue.x-k8s.io/v1beta1/workloads";

/// The fake API server; dropping it stops the server and its controller.
pub(crate) struct FakeApi {
    state: Arc<Mutex<Store>>,
    addr: SocketAddr,
    server: JoinHandle<()>,
    controller: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Store {
    /// Objects by store key, then (namespace, name); namespace "" for cluster-scoped ones.
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    /// Every object created through the API, as it was stored.
    created: Vec<Value>,
    /// Errors to answer the next creates with: (HTTP code, message).
    create_failures: VecDeque<(u16, String)>,
    /// Errors to answer the next creates of one kind with, by store key.
    kind_failures: BTreeMap<String, VecDeque<(u16, String)>>,
    /// Pod logs by (namespace, pod).
    logs: BTreeMap<(String, String), String>,
    version: u64,
    /// Controller: ticks each job has been running, by uid.
    running_ticks: BTreeMap<String, u32>,
}

type Params = Query<BTreeMap<String, String>>;

impl FakeApi {
    /// Starts the server on 127.0.0.1:0 with `nodes` and `pods` (JSON arrays) stored.
    pub(crate) async fn start(nodes: Value, pods: Value) -> Arc<Self> {
        let mut store = Store::default();
        for node in nodes.as_array().into_iter().flatten() {
            store.insert(NODES, node.clone());
        }
        for pod in pods.as_array().into_iter().flatten() {
            store.insert(PODS, pod.clone());
        }
        let state = Arc::new(Mutex::new(store));
        let app = axum::Router::new()
            .route("/api/v1/{plural}", get(list_core_all))
            .route("/api/v1/namespaces/{ns}/{plural}", get(list_core_ns).post(create_core))
            .route("/api/v1/namespaces/{ns}/pods/{name}/log", get(pod_log))
            .route("/apis/{group}/{version}/{plural}", get(list_all))
            .route("/apis/{group}/{version}/namespaces/{ns}/{plural}", get(list_ns).post(create))
            .route("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", get(get_one).delete(delete_one))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Arc::new(Self { state, addr, server, controller: Mutex::new(None) })
    }

    /// A kube client for this server: plain HTTP, no credentials.
    pub(crate) fn client(&self) -> kube::Client {
        super::install_crypto_provider();
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        config.default_namespace = "meridian".into();
        kube::Client::try_from(config).unwrap()
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every object created through the API, oldest first.
    pub(crate) fn created(&self) -> Vec<Value> {
        self.lock().created.clone()
    }

    /// The stored objects of one kind.
    pub(crate) fn objects(&self, key: &str) -> Vec<Value> {
        self.lock().objects.get(key).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// Removes every stored object of one kind (as if deleted behind the backend's back).
    pub(crate) fn remove_all(&self, key: &str) {
        self.lock().objects.remove(key);
    }

    /// Stores (or replaces) an object.
    pub(crate) fn put(&self, key: &str, object: Value) {
        self.lock().insert(key, object);
    }

    /// Answers the next create with HTTP `code` and `message`.
    pub(crate) fn fail_next_create(&self, code: u16, message: &str) {
        self.lock().create_failures.push_back((code, message.into()));
    }

    /// Answers the next create of the kind stored under `key` with HTTP `code` and `message`.
    pub(crate) fn fail_next_create_of(&self, key: &str, code: u16, message: &str) {
        self.lock().kind_failures.entry(key.to_owned()).or_default().push_back((code, message.into()));
    }

    /// Starts the stand-in controller, ticking every `tick`.
    pub(crate) fn run_controller(self: &Arc<Self>, tick: Duration) {
        let me = Arc::clone(self);
        let handle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                me.lock().tick();
            }
        });
        *self.controller.lock().unwrap() = Some(handle);
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(controller) = self.controller.lock().unwrap_or_else(PoisonError::into_inner).take() {
            controller.abort();
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

fn key_of(group: &str, version: &str, plural: &str) -> String {
    format!("{group}/{version}/{plural}")
}

/// Whether `object`'s labels satisfy a selector of `k=v`, `k==v`, `k!=v` and `k` terms.
fn matches_selector(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else { return true };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim()].as_str() == Some(v.trim_start_matches('=').trim())
        } else {
            labels.get(term.trim()).is_some()
        }
    })
}

impl Store {
    fn insert(&mut self, key: &str, mut object: Value) {
        self.version += 1;
        let meta = &mut object["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{:06}", self.version));
        }
        meta["resourceVersion"] = json!(self.version.to_string());
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = json!("2026-12-03T00:00:00Z");
        }
        let ns = meta["namespace"].as_str().unwrap_or_default().to_string();
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        self.objects.entry(key.to_string()).or_default().insert((ns, name), object);
    }

    fn list(&self, key: &str, ns: Option<&str>, params: &BTreeMap<String, String>) -> Value {
        let items: Vec<Value> = self
            .objects
            .get(key)
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(|((object_ns, _), _)| ns.is_none_or(|ns| ns == object_ns))
            .map(|(_, object)| object)
            .filter(|object| matches_selector(object, params.get("labelSelector")))
            .cloned()
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.version.to_string()}, "items": items})
    }

    /// Deletes an object and, recursively, what it owns.
    fn delete(&mut self, key: &str, ns: &str, name: &str) -> Option<Value> {
        let removed = self.objects.get_mut(key)?.remove(&(ns.to_string(), name.to_string()))?;
        let uid = removed["metadata"]["uid"].clone();
        let owned: Vec<(String, String, String)> = self
            .objects
            .iter()
            .flat_map(|(key, m)| m.iter().map(move |((ns, name), o)| (key, ns, name, o)))
            .filter(|(_, _, _, o)| {
                o["metadata"]["ownerReferences"].as_array().into_iter().flatten().any(|r| r["uid"] == uid)
            })
            .map(|(key, ns, name, _)| (key.clone(), ns.clone(), name.clone()))
            .collect();
        for (key, ns, name) in owned {
            self.delete(&key, &ns, &name);
        }
        Some(removed)
    }

    // ---- the stand-in controller ----

    fn tick(&mut self) {
        for key in [VCJOBS, BATCH_JOBS] {
            let jobs: Vec<Value> = self.objects.get(key).map(|m| m.values().cloned().collect()).unwrap_or_default();
            for job in jobs {
                self.drive(key, job);
            }
        }
    }

    fn drive(&mut self, key: &str, mut job: Value) {
        let volcano = key == VCJOBS;
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let ns = job["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let name = job["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let owner =
            json!([{"apiVersion": job["apiVersion"], "kind": "Job", "name": name, "uid": uid, "controller": true}]);
        let (replicas, template) = if volcano {
            (job["spec"]["tasks"][0]["replicas"].as_u64().unwrap_or(1), job["spec"]["tasks"][0]["template"].clone())
        } else {
            (job["spec"]["parallelism"].as_u64().unwrap_or(1), job["spec"]["template"].clone())
        };
        let group_key = if volcano { PODGROUPS } else { WORKLOADS };
        let group_name = if volcano { format!("{name}-{uid}") } else { format!("job-{name}") };
        let group_id = (ns.clone(), group_name.clone());
        if !self.objects.get(group_key).is_some_and(|m| m.contains_key(&group_id)) {
            let gpus = per_pod_gpus(&template) * replicas as f64;
            let group = if volcano {
                json!({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                    "metadata": {"name": group_name, "namespace": ns, "ownerReferences": owner},
                    "spec": {"minMember": replicas, "queue": job["spec"]["queue"],
                        "minResources": {"nvidia.com/gpu": gpus.to_string()}},
                    "status": {"phase": "Pending"}})
            } else {
                json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                    "metadata": {"name": group_name, "namespace": ns, "ownerReferences": owner},
                    "spec": {"queueName": job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
                        "podSets": [{"name": "main", "count": replicas, "template": template}]},
                    "status": {}})
            };
            self.insert(group_key, group);
        }
        let Some(mut group) = self.objects.get(group_key).and_then(|m| m.get(&group_id)).cloned() else { return };
        let phase = if volcano {
            job["status"]["state"]["phase"].as_str().unwrap_or("Pending").to_string()
        } else if job["spec"]["suspend"] == true {
            "Pending".into()
        } else if job["status"]["conditions"].as_array().is_some_and(|c| !c.is_empty()) {
            "Done".into()
        } else {
            "Running".into()
        };
        match phase.as_str() {
            "Pending" => match self.place(&template, replicas) {
                Some(nodes) => {
                    for (i, node) in nodes.iter().enumerate() {
                        let mut pod = template.clone();
                        pod["apiVersion"] = json!("v1");
                        pod["kind"] = json!("Pod");
                        pod["metadata"]["name"] = json!(format!("{name}-main-{i}"));
                        pod["metadata"]["namespace"] = json!(ns);
                        pod["metadata"]["ownerReferences"] = owner.clone();
                        pod["spec"]["nodeName"] = json!(node);
                        pod["status"] = json!({"phase": "Running"});
                        self.insert(PODS, pod);
                    }
                    if volcano {
                        job["status"] = json!({"state": {"phase": "Running"}, "running": replicas});
                        group["status"] = json!({"phase": "Running"});
                    } else {
                        job["spec"]["suspend"] = json!(false);
                        job["status"] = json!({"active": replicas});
                        group["status"] = json!({"conditions": [
                            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                            {"type": "Admitted", "status": "True", "reason": "Admitted"}]});
                    }
                    self.running_ticks.insert(uid, 0);
                }
                None => {
                    let message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.";
                    if volcano {
                        job["status"] = json!({"state": {"phase": "Pending"}});
                        group["status"] = json!({"phase": "Pending", "conditions": [{"type": "Unschedulable",
                            "status": "True", "reason": "NotEnoughResources", "message": message}]});
                    } else {
                        group["status"] = json!({"conditions": [{"type": "QuotaReserved", "status": "False",
                            "reason": "Pending", "message": format!("couldn't assign flavors to pod set main: {message}")}]});
                    }
                }
            },
            "Running" => {
                let ticks = self.running_ticks.entry(uid.clone()).or_insert(0);
                *ticks += 1;
                let Some((echoes, code)) = script_of(&template) else { return };
                if *ticks < 2 {
                    return;
                }
                let pods: Vec<(String, String)> = self.objects[PODS]
                    .iter()
                    .filter(|(_, p)| p["metadata"]["ownerReferences"][0]["uid"] == uid.as_str())
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in pods {
                    if let Some(pod) = self.objects.get_mut(PODS).and_then(|m| m.get_mut(&id)) {
                        pod["status"] = json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
                            "containerStatuses": [{"name": "main", "image": "", "imageID": "", "ready": false,
                                "restartCount": 0, "state": {"terminated": {"exitCode": code,
                                    "reason": if code == 0 { "Completed" } else { "Error" }}}}]});
                    }
                    self.logs.insert(id, echoes.clone());
                }
                if volcano {
                    let phase = if code == 0 { "Completed" } else { "Failed" };
                    job["status"] = json!({"state": {"phase": phase}});
                    group["status"] = json!({"phase": "Completed"});
                } else {
                    let condition = if code == 0 {
                        json!({"type": "Complete", "status": "True"})
                    } else {
                        json!({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit"})
                    };
                    job["status"] = json!({"conditions": [condition]});
                    if let Some(conditions) = group["status"]["conditions"].as_array_mut() {
                        conditions.push(json!({"type": "Finished", "status": "True"}));
                    }
                }
            }
            _ => return,
        }
        self.insert(key, job);
        self.insert(group_key, group);
    }

    /// Nodes for `replicas` pods of `template` on what is free now, greedily; None if they do not fit.
    fn place(&self, template: &Value, replicas: u64) -> Option<Vec<String>> {
        let values =
            |key: &str| self.objects.get(key).map(|m| m.values().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let nodes: Vec<Node> = values(NODES).into_iter().filter_map(|n| serde_json::from_value(n).ok()).collect();
        let pods: Vec<Pod> = values(PODS).into_iter().filter_map(|p| serde_json::from_value(p).ok()).collect();
        let want = per_pod_gpus(template);
        let product = template["spec"]["nodeSelector"][inventory::PRODUCT_LABEL].as_str();
        let mut placed = Vec::new();
        for node in &nodes {
            if product.is_some_and(|p| {
                node.metadata.labels.as_ref().and_then(|l| l.get(inventory::PRODUCT_LABEL)).map(String::as_str)
                    != Some(p)
            }) {
                continue;
            }
            let name = node.metadata.name.clone().unwrap_or_default();
            let scan = inventory::scan(std::slice::from_ref(node), &pods, &GpuTypeMapper::default()).ok()?;
            let mut free =
                scan.inventory.shapes.iter().flat_map(|s| s.free.iter()).map(|f| f64::from(f.gpus)).sum::<f64>();
            while free >= want && (placed.len() as u64) < replicas {
                placed.push(name.clone());
                free -= want;
            }
        }
        ((placed.len() as u64) == replicas).then_some(placed)
    }
}

pub(crate) fn per_pod_gpus(template: &Value) -> f64 {
    template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        .as_str()
        .and_then(|g| g.parse().ok())
        .unwrap_or(0.0)
}

/// For `sh -c 'echo a; exit N'`: the echoed words (the log) and N.
pub(crate) fn script_of(template: &Value) -> Option<(String, i32)> {
    let command = template["spec"]["containers"][0]["command"].as_array()?;
    if command.first()? != "sh" || command.get(1)? != "-c" {
        return None;
    }
    let script = command.get(2)?.as_str()?;
    let mut log = String::new();
    let mut code = 0;
    for step in script.split(';').map(str::trim) {
        if let Some(text) = step.strip_prefix("echo ") {
            log.push_str(text.split(">&").next().unwrap_or_default().trim());
            log.push('\n');
        } else if let Some(n) = step.strip_prefix("exit ") {
            code = n.trim().parse().unwrap_or(1);
        } else if step.starts_with("sleep") {
            return None;
        }
    }
    Some((log, code))
}

type Shared = State<Arc<Mutex<Store>>>;

fn store(state: &Shared) -> MutexGuard<'_, Store> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn list_core_all(state: Shared, Path(plural): Path<String>, Query(q): Params) -> Response {
    axum::Json(store(&state).list(&key_of("core", "v1", &plural), None, &q)).into_response()
}

async fn list_core_ns(state: Shared, Path((ns, plural)): Path<(String, String)>, Query(q): Params) -> Response {
    axum::Json(store(&state).list(&key_of("core", "v1", &plural), Some(&ns), &q)).into_response()
}

async fn list_all(state: Shared, Path((g, v, plural)): Path<(String, String, String)>, Query(q): Params) -> Response {
    axum::Json(store(&state).list(&key_of(&g, &v, &plural), None, &q)).into_response()
}

async fn list_ns(
    state: Shared,
    Path((g, v, ns, plural)): Path<(String, String, String, String)>,
    Query(q): Params,
) -> Response {
    axum::Json(store(&state).list(&key_of(&g, &v, &plural), Some(&ns), &q)).into_response()
}

async fn get_one(
    state: Shared,
    Path((g, v, ns, plural, name)): Path<(String, String, String, String, String)>,
) -> Response {
    let store = store(&state);
    match store.objects.get(&key_of(&g, &v, &plural)).and_then(|m| m.get(&(ns, name.clone()))) {
        Some(object) => axum::Json(object.clone()).into_response(),
        None => status(404, "NotFound", &format!("{plural}.{g} \"{name}\" not found")),
    }
}

async fn delete_one(
    state: Shared,
    Path((g, v, ns, plural, name)): Path<(String, String, String, String, String)>,
) -> Response {
    match store(&state).delete(&key_of(&g, &v, &plural), &ns, &name) {
        Some(object) => axum::Json(object).into_response(),
        None => status(404, "NotFound", &format!("{plural}.{g} \"{name}\" not found")),
    }
}

async fn create(
    state: Shared,
    Path((g, v, ns, plural)): Path<(String, String, String, String)>,
    body: Bytes,
) -> Response {
    let mut store = store(&state);
    let key = key_of(&g, &v, &plural);
    let queued = store.kind_failures.get_mut(&key).and_then(VecDeque::pop_front);
    if let Some((code, message)) = queued.or_else(|| store.create_failures.pop_front()) {
        let reason = match code {
            422 => "Invalid",
            400 => "BadRequest",
            403 => "Forbidden",
            409 => "AlreadyExists",
            _ => "InternalError",
        };
        return status(code, reason, &message);
    }
    let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the body is not a JSON object");
    };
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if !super::config::is_dns_label(&name) {
        return status(422, "Invalid", &format!("{plural}.{g} \"{name}\" is invalid: metadata.name: Invalid value"));
    }
    if store.objects.get(&key).is_some_and(|m| m.contains_key(&(ns.clone(), name.clone()))) {
        return status(409, "AlreadyExists", &format!("{plural}.{g} \"{name}\" already exists"));
    }
    object["metadata"]["namespace"] = json!(ns);
    store.insert(&key, object);
    let stored = store.objects[&key][&(ns, name)].clone();
    store.created.push(stored.clone());
    (StatusCode::CREATED, axum::Json(stored)).into_response()
}

/// A create in the core group (`/api/v1/namespaces/{ns}/{plural}`): Services.
async fn create_core(state: Shared, Path((ns, plural)): Path<(String, String)>, body: Bytes) -> Response {
    create(state, Path(("core".to_owned(), "v1".to_owned(), ns, plural)), body).await
}

async fn pod_log(state: Shared, Path((ns, name)): Path<(String, String)>, Query(q): Params) -> Response {
    let store = store(&state);
    if !store.objects.get(PODS).is_some_and(|m| m.contains_key(&(ns.clone(), name.clone()))) {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    }
    let mut text = store.logs.get(&(ns, name)).cloned().unwrap_or_default();
    if let Some(limit) = q.get("limitBytes").and_then(|l| l.parse::<usize>().ok()) {
        text.truncate(limit.min(text.len()));
    }
    text.into_response()
}
