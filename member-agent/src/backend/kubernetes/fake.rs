//! A small in-process Kubernetes API server for tests: real object JSON over real HTTP, so the
//! backend runs through kube's client unchanged.
//!
//! It serves list/get/create/delete of the resources the backend uses (nodes, pods and pod
//! logs, Volcano Jobs, PodGroups, batch Jobs, Kueue Workloads; create of Services), filters lists by label
//! selector, assigns `uid`/`resourceVersion`/`creationTimestamp`, answers 404/409 with Status
//! objects like the real API, garbage-collects owned objects on delete, and records every
//! created object. Tests may queue an error for the next create.
//!
//! It also serves JSON merge patches (RFC 7386, `application/merge-patch+json`, what kube's
//! `Patch::Merge` sends; other patch types get 415) of `/apis` objects, namespaced
//! (`…/namespaces/{ns}/{plural}/{name}` and its `/status`) and cluster-scoped
//! (`/apis/{g}/{v}/{plural}/{name}` and its `/status`, which also answer GET): both paths apply
//! the whole patch; `metadata.name`/`namespace`/`uid`/`creationTimestamp` stay as stored. A patch
//! whose `metadata.resourceVersion` differs from the stored one gets 409 Conflict.
//!
//! [`FakeApi::run_controller`] stands in for Volcano/Kueue and the kubelet, and does little: it
//! gives each new job a PodGroup or Workload, starts the gang when every replica fits on the
//! nodes' free GPUs (pods Running on those nodes), else marks it unschedulable with a reason;
//! a job whose command is `sh -c '…'` ends one tick after it started: its `echo WORD`s become
//! the pod log and its `exit N` the exit code. Other jobs run until deleted.
//!
//! With Kueue admission checks configured ([`FakeApi::set_admission_checks`]), a batch Job's
//! Workload is created with `status.admissionChecks` (one `Pending` entry per check) and is
//! admitted in two steps, as in Kueue v1beta1. When the gang fits on the free GPUs (reserved
//! GPUs of other Workloads count as taken), the controller reserves nodes for it: `QuotaReserved`
//! True, `Admitted` False (`UnsatisfiedChecks`); the Job stays suspended, with no pods. Once every
//! entry of the Workload's `status.admissionChecks` is `Ready` (a client patches them), it is
//! admitted: the Job is unsuspended and its pods, copies of the Job's template as stored then,
//! run on the reserved nodes. A check in state `Retry` or `Rejected` releases the reservation
//! (`QuotaReserved` False, reason `AdmissionCheck`); `Retry` goes back to `Pending` and the
//! Workload queues again, a `Rejected` one is not reserved again. The controller reads the
//! Workload anew each tick and never rewrites the client's `status.admissionChecks` entries
//! (it only resets `Retry` and adds configured checks a Workload lacks when it reserves), and
//! writes a Workload only when something changed. Without checks, jobs start in one step as above.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
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
    /// Controller: the Kueue admission checks every new Workload gets; empty: none.
    admission_checks: Vec<String>,
    /// Controller: the nodes reserved for suspended batch Jobs awaiting their admission checks,
    /// by Job uid.
    reservations: BTreeMap<String, Reservation>,
}

/// Nodes held for a Workload whose quota is reserved but which is not yet admitted.
#[derive(Clone)]
struct Reservation {
    /// GPUs each pod asks for.
    per_pod_gpus: f64,
    /// A node per pod, in pod index order (a node appears once per pod placed on it).
    nodes: Vec<String>,
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
            .route("/apis/{group}/{version}/{plural}/{name}", get(get_cluster).patch(patch_cluster))
            .route("/apis/{group}/{version}/{plural}/{name}/status", get(get_cluster).patch(patch_cluster))
            .route(
                "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}",
                get(get_one).delete(delete_one).patch(patch_ns),
            )
            .route("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/status", get(get_one).patch(patch_ns))
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

    /// The stored object of one kind named `name` in namespace `ns` ("" for cluster-scoped ones).
    pub(crate) fn get(&self, key: &str, ns: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(key).and_then(|m| m.get(&(ns.to_owned(), name.to_owned()))).cloned()
    }

    /// Sets the Kueue admission checks the controller gives each Workload it creates from now
    /// on, and waits for before admitting a reserved one (see the module doc); empty: none.
    pub(crate) fn set_admission_checks(&self, names: &[&str]) {
        self.lock().admission_checks = names.iter().map(|&n| n.to_owned()).collect();
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
        // A reservation whose Job is gone is dropped (the GC deleted its Workload).
        let jobs: BTreeSet<&str> = self
            .objects
            .get(BATCH_JOBS)
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(|job| job["metadata"]["uid"].as_str())
            .collect();
        let gone: Vec<String> = self.reservations.keys().filter(|uid| !jobs.contains(uid.as_str())).cloned().collect();
        for uid in gone {
            self.reservations.remove(&uid);
        }
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
            let mut group = if volcano {
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
            if !volcano && !self.admission_checks.is_empty() {
                let checks: Vec<Value> = self.admission_checks.iter().map(|check| pending_check(check)).collect();
                group["status"]["admissionChecks"] = json!(checks);
            }
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
        if !volcano && phase == "Pending" && (!self.admission_checks.is_empty() || self.reservations.contains_key(&uid))
        {
            self.drive_checks(job, group);
            return;
        }
        match phase.as_str() {
            "Pending" => match self.place(&template, replicas) {
                Some(nodes) => {
                    self.start_pods(&job, &template, &nodes);
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

    /// Creates the pods of `job` from `template`, Running, the i-th on `nodes[i]`.
    fn start_pods(&mut self, job: &Value, template: &Value, nodes: &[String]) {
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = job["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = job["metadata"]["name"].as_str().unwrap_or_default();
        let owner =
            json!([{"apiVersion": job["apiVersion"], "kind": "Job", "name": name, "uid": uid, "controller": true}]);
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
    }

    /// A suspended batch Job while admission checks are configured or it holds a reservation:
    /// reserves, admits or releases (see the module doc). `group` is its Workload as stored now.
    fn drive_checks(&mut self, mut job: Value, mut group: Value) {
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let replicas = job["spec"]["parallelism"].as_u64().unwrap_or(1);
        let template = job["spec"]["template"].clone();
        let before = group.clone();
        let states: Vec<(String, String)> = group["status"]["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let field = |f: &str| c[f].as_str().unwrap_or_default().to_string();
                (field("name"), field("state"))
            })
            .collect();
        let failed = states.iter().find(|(_, state)| state == "Retry" || state == "Rejected");
        let released = |check: &str, state: &str| {
            json!([{"type": "QuotaReserved", "status": "False", "reason": "AdmissionCheck",
                "message": format!("The workload has admission check {check:?} in state {state}")}])
        };
        if let Some(reservation) = self.reservations.get(&uid).cloned() {
            if let Some((check, state)) = failed {
                group["status"]["conditions"] = released(check, state);
                self.reservations.remove(&uid);
                retry_to_pending(&mut group);
            } else if states.iter().all(|(_, state)| state == "Ready") {
                self.start_pods(&job, &template, &reservation.nodes);
                self.reservations.remove(&uid);
                job["spec"]["suspend"] = json!(false);
                job["status"] = json!({"active": replicas});
                group["status"]["conditions"] = json!([
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                    {"type": "Admitted", "status": "True", "reason": "Admitted"}]);
                self.running_ticks.insert(uid, 0);
                self.insert(BATCH_JOBS, job);
            }
        } else if let Some((check, state)) = failed.filter(|(_, state)| state == "Rejected") {
            // Kueue deactivates a rejected Workload: it is not reserved again.
            group["status"]["conditions"] = released(check, state);
        } else {
            retry_to_pending(&mut group);
            match self.place(&template, replicas) {
                Some(nodes) => {
                    let listed: BTreeSet<&str> = states.iter().map(|(name, _)| name.as_str()).collect();
                    let missing: Vec<Value> = self
                        .admission_checks
                        .iter()
                        .filter(|check| !listed.contains(check.as_str()))
                        .map(|check| pending_check(check))
                        .collect();
                    if !missing.is_empty() {
                        let status = &mut group["status"];
                        if !status["admissionChecks"].is_array() {
                            status["admissionChecks"] = json!([]);
                        }
                        if let Some(checks) = status["admissionChecks"].as_array_mut() {
                            checks.extend(missing);
                        }
                    }
                    self.reservations.insert(uid, Reservation { per_pod_gpus: per_pod_gpus(&template), nodes });
                    group["status"]["conditions"] = json!([
                        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                        {"type": "Admitted", "status": "False", "reason": "UnsatisfiedChecks",
                            "message": "The workload has not all admission checks in Ready state"}]);
                }
                None => {
                    let message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.";
                    group["status"]["conditions"] = json!([{"type": "QuotaReserved", "status": "False",
                        "reason": "Pending", "message": format!("couldn't assign flavors to pod set main: {message}")}]);
                }
            }
        }
        if group != before {
            self.insert(WORKLOADS, group);
        }
    }

    /// Nodes for `replicas` pods of `template` on what is free now, greedily; None if they do not
    /// fit. GPUs reserved for Workloads awaiting their admission checks are not free.
    fn place(&self, template: &Value, replicas: u64) -> Option<Vec<String>> {
        let mut reserved: BTreeMap<&str, f64> = BTreeMap::new();
        for reservation in self.reservations.values() {
            for node in &reservation.nodes {
                *reserved.entry(node.as_str()).or_default() += reservation.per_pod_gpus;
            }
        }
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
            free -= reserved.get(name.as_str()).copied().unwrap_or_default();
            while free >= want && (placed.len() as u64) < replicas {
                placed.push(name.clone());
                free -= want;
            }
        }
        ((placed.len() as u64) == replicas).then_some(placed)
    }
}

/// A Workload's entry for admission check `name`, as Kueue adds it: Pending.
fn pending_check(name: &str) -> Value {
    json!({"name": name, "state": "Pending", "message": "", "lastTransitionTime": "2026-12-03T00:00:00Z"})
}

/// Sets every admission check of `workload` in state Retry back to Pending.
fn retry_to_pending(workload: &mut Value) {
    for check in workload["status"]["admissionChecks"].as_array_mut().into_iter().flatten() {
        if check["state"] == "Retry" {
            check["state"] = json!("Pending");
        }
    }
}

/// Applies a JSON merge patch (RFC 7386) to `target`: `null` deletes a key, objects merge
/// recursively, everything else (arrays, scalars) replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.as_str()).or_insert(Value::Null), value);
            }
        }
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

/// GET of a cluster-scoped object (stored with namespace "").
async fn get_cluster(state: Shared, Path((g, v, plural, name)): Path<(String, String, String, String)>) -> Response {
    get_one(state, Path((g, v, String::new(), plural, name))).await
}

/// PATCH of a namespaced object or its status.
async fn patch_ns(
    state: Shared,
    headers: HeaderMap,
    Path(target): Path<(String, String, String, String, String)>,
    body: Bytes,
) -> Response {
    patch_object(&state, &headers, target, &body)
}

/// PATCH of a cluster-scoped object or its status.
async fn patch_cluster(
    state: Shared,
    headers: HeaderMap,
    Path((g, v, plural, name)): Path<(String, String, String, String)>,
    body: Bytes,
) -> Response {
    patch_object(&state, &headers, (g, v, String::new(), plural, name), &body)
}

/// Applies a JSON merge patch to the stored object (group, version, namespace, plural, name).
fn patch_object(
    state: &Shared,
    headers: &HeaderMap,
    (g, v, ns, plural, name): (String, String, String, String, String),
    body: &[u8],
) -> Response {
    let media = headers.get(CONTENT_TYPE).and_then(|t| t.to_str().ok()).unwrap_or_default();
    if media.split(';').next().map(str::trim) != Some("application/merge-patch+json") {
        return status(
            415,
            "UnsupportedMediaType",
            &format!("the fake API server serves only application/merge-patch+json patches, not {media:?}"),
        );
    }
    let Ok(patch @ Value::Object(_)) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not a JSON object");
    };
    let mut store = store(state);
    let key = key_of(&g, &v, &plural);
    let Some(stored) = store.objects.get(&key).and_then(|m| m.get(&(ns.clone(), name.clone()))).cloned() else {
        return status(404, "NotFound", &format!("{plural}.{g} \"{name}\" not found"));
    };
    if let Some(version) = patch["metadata"]["resourceVersion"].as_str()
        && stored["metadata"]["resourceVersion"].as_str() != Some(version)
    {
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {plural}.{g} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        );
    }
    let mut object = stored.clone();
    merge_patch(&mut object, &patch);
    // What identifies the object stays as stored.
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        match stored["metadata"].get(field) {
            Some(value) => object["metadata"][field] = value.clone(),
            None => {
                if let Some(meta) = object["metadata"].as_object_mut() {
                    meta.remove(field);
                }
            }
        }
    }
    store.insert(&key, object);
    axum::Json(store.objects[&key][&(ns, name)].clone()).into_response()
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

#[cfg(test)]
mod tests {
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};

    use super::*;

    const NS: &str = "meridian";

    /// A ready node with 8 H100s, shaped like `testdata/member-nodes.json`.
    fn node(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": "8"}},
            "status": {
                "capacity": {"cpu": "192", "memory": "2113929216Ki", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "192", "memory": "2113929216Ki", "pods": "110", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status"}]}})
    }

    async fn two_nodes() -> Arc<FakeApi> {
        FakeApi::start(json!([node("h100-0"), node("h100-1")]), json!([])).await
    }

    fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    fn jobs_api(api: &FakeApi) -> Api<DynamicObject> {
        Api::namespaced_with(api.client(), NS, &resource("batch", "v1", "Job", "jobs"))
    }

    fn workloads_api(api: &FakeApi) -> Api<DynamicObject> {
        Api::namespaced_with(api.client(), NS, &resource("kueue.x-k8s.io", "v1beta1", "Workload", "workloads"))
    }

    fn dynamic(object: Value) -> DynamicObject {
        serde_json::from_value(object).unwrap()
    }

    fn merge(patch: Value) -> Patch<Value> {
        Patch::Merge(patch)
    }

    /// A suspended Kueue batch Job of `replicas` pods with `gpus` GPUs each, running until deleted.
    fn batch_job(name: &str, replicas: u64, gpus: u64) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "default"}},
            "spec": {"parallelism": replicas, "completions": replicas, "suspend": true,
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": {"meridian.io/runtime-estimate-seconds": "60"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                        "command": ["sleep", "infinity"],
                        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}}})
    }

    async fn create_job(api: &FakeApi, name: &str, replicas: u64, gpus: u64) {
        jobs_api(api).create(&PostParams::default(), &dynamic(batch_job(name, replicas, gpus))).await.unwrap();
    }

    /// Sets the single admission check `start-lock` of Workload `job-{job}` to `state`.
    async fn set_check(api: &FakeApi, job: &str, state: &str) {
        let patch = json!({"status": {"admissionChecks": [{"name": "start-lock", "state": state,
            "message": format!("set to {state}"), "lastTransitionTime": "2026-12-03T00:00:01Z"}]}});
        workloads_api(api).patch_status(&format!("job-{job}"), &PatchParams::default(), &merge(patch)).await.unwrap();
    }

    /// Polls `check` every 20 ms, at most 250 times.
    async fn eventually(api: &FakeApi, what: &str, check: impl Fn(&FakeApi) -> bool) {
        for _ in 0..250 {
            if check(api) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("never happened: {what}");
    }

    /// Condition `kind` of the Workload of `job` (Null if none).
    fn condition(api: &FakeApi, job: &str, kind: &str) -> Value {
        let workload = api.get(WORKLOADS, NS, &format!("job-{job}")).unwrap_or_default();
        let conditions = workload["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.into_iter().find(|c| c["type"] == kind).unwrap_or_default()
    }

    fn reserved(api: &FakeApi, job: &str) -> bool {
        condition(api, job, "QuotaReserved")["status"] == "True"
    }

    fn unreserved(api: &FakeApi, job: &str) -> bool {
        condition(api, job, "QuotaReserved")["status"] == "False"
    }

    /// (name, state) of each admission check of the Workload of `job`.
    fn checks(api: &FakeApi, job: &str) -> Vec<(String, String)> {
        let workload = api.get(WORKLOADS, NS, &format!("job-{job}")).unwrap_or_default();
        let checks = workload["status"]["admissionChecks"].as_array().cloned().unwrap_or_default();
        checks
            .iter()
            .map(|c| (c["name"].as_str().unwrap_or_default().into(), c["state"].as_str().unwrap_or_default().into()))
            .collect()
    }

    /// (pod name, node) of each pod of `job`.
    fn pods_of(api: &FakeApi, job: &str) -> Vec<(String, String)> {
        api.objects(PODS)
            .iter()
            .filter(|p| p["metadata"]["ownerReferences"][0]["name"] == job)
            .map(|p| (p["metadata"]["name"].as_str().unwrap().into(), p["spec"]["nodeName"].as_str().unwrap().into()))
            .collect()
    }

    fn suspended(api: &FakeApi, job: &str) -> bool {
        api.get(BATCH_JOBS, NS, job).is_some_and(|j| j["spec"]["suspend"] == true)
    }

    fn pending(name: &str) -> (String, String) {
        (name.into(), "Pending".into())
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        // The examples of RFC 7386, appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": "b", "b": "c"}), json!({"a": null}), json!({"b": "c"})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (json!({"a": {"b": "c"}}), json!({"a": {"b": "d", "c": null}}), json!({"a": {"b": "d"}})),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
            (json!({}), json!({"a": {"bb": {"ccc": null}}}), json!({"a": {"bb": {}}})),
        ];
        for (target, patch, want) in cases {
            let mut got = target.clone();
            merge_patch(&mut got, &patch);
            assert_eq!(got, want, "{target} patched with {patch}");
        }
    }

    #[tokio::test]
    async fn merge_patches_namespaced_and_cluster_scoped_objects_and_refuses_stale_versions() {
        let api = two_nodes().await;
        let workloads = workloads_api(&api);
        let workload = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": "w", "labels": {"keep": "1", "drop": "1"}},
            "spec": {"queueName": "default", "podSets": [{"name": "main", "count": 1}]}});
        let created = workloads.create(&PostParams::default(), &dynamic(workload)).await.unwrap();
        let stale = created.metadata.resource_version.clone().unwrap();

        let patch = json!({"metadata": {"labels": {"drop": null, "new": "2"}},
            "spec": {"podSets": [{"name": "main", "count": 2}], "active": false},
            "status": {"admissionChecks": [{"name": "start-lock", "state": "Ready"}]}});
        let patched = workloads.patch("w", &PatchParams::default(), &merge(patch)).await.unwrap();
        let stored = api.get(WORKLOADS, NS, "w").unwrap();
        assert_eq!(serde_json::to_value(&patched).unwrap(), stored, "the answer is the stored object");
        assert_eq!(stored["metadata"]["labels"], json!({"keep": "1", "new": "2"}));
        assert_eq!(
            stored["spec"],
            json!({"queueName": "default", "podSets": [{"name": "main", "count": 2}], "active": false})
        );
        assert_eq!(stored["status"]["admissionChecks"][0]["state"], "Ready");
        assert_eq!(stored["metadata"]["uid"], json!(created.metadata.uid), "the identity stays");
        let current = stored["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
        assert_ne!(current, stale, "a patch bumps the resourceVersion");

        // The status subresource, with the current resourceVersion.
        let patch = json!({"metadata": {"resourceVersion": current}, "status": {"conditions": [{"type": "Admitted", "status": "True"}]}});
        workloads.patch_status("w", &PatchParams::default(), &merge(patch)).await.unwrap();
        let stored = api.get(WORKLOADS, NS, "w").unwrap();
        assert_eq!(stored["status"]["conditions"][0]["type"], "Admitted");
        assert_eq!(stored["status"]["admissionChecks"][0]["state"], "Ready", "the rest of the status stays");

        // A stale resourceVersion: 409, nothing changes.
        let patch = json!({"metadata": {"resourceVersion": stale}, "spec": {"active": true}});
        let Err(kube::Error::Api(err)) = workloads.patch("w", &PatchParams::default(), &merge(patch)).await else {
            panic!("a stale resourceVersion must be refused")
        };
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
        assert_eq!(
            err.message,
            "Operation cannot be fulfilled on workloads.kueue.x-k8s.io \"w\": the object has been modified; \
             please apply your changes to the latest version and try again"
        );
        assert_eq!(api.get(WORKLOADS, NS, "w").unwrap(), stored);

        // A missing object: 404.
        let Err(kube::Error::Api(err)) =
            workloads.patch_status("nope", &PatchParams::default(), &merge(json!({}))).await
        else {
            panic!("a missing object must be 404")
        };
        assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));

        // A cluster-scoped object: GET and a status patch.
        let queues: Api<DynamicObject> =
            Api::all_with(api.client(), &resource("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues"));
        let key = "kueue.x-k8s.io/v1beta1/clusterqueues";
        api.put(
            key,
            json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": "cq"}, "spec": {"namespaceSelector": {}}, "status": {"pendingWorkloads": 0}}),
        );
        let got = queues.get("cq").await.unwrap();
        assert_eq!(serde_json::to_value(&got).unwrap(), api.get(key, "", "cq").unwrap());
        let patch = json!({"status": {"pendingWorkloads": 3, "admittedWorkloads": 1}});
        let patched = queues.patch_status("cq", &PatchParams::default(), &merge(patch)).await.unwrap();
        let stored = api.get(key, "", "cq").unwrap();
        assert_eq!(serde_json::to_value(&patched).unwrap(), stored);
        assert_eq!(stored["status"], json!({"pendingWorkloads": 3, "admittedWorkloads": 1}));
        assert_eq!(stored["spec"], json!({"namespaceSelector": {}}));
        assert!(stored["metadata"].get("namespace").is_none(), "it stays cluster-scoped");
        let Err(kube::Error::Api(err)) = queues.get("other").await else { panic!("a missing object must be 404") };
        assert_eq!(err.code, 404);
    }

    #[tokio::test]
    async fn admission_checks_hold_a_reserved_job_until_they_are_ready() {
        let api = two_nodes().await;
        api.set_admission_checks(&["start-lock"]);
        api.run_controller(Duration::from_millis(20));

        // One 8-GPU pod each: `first` reserves h100-0, `second` h100-1 (reserved GPUs are taken).
        create_job(&api, "first", 1, 8).await;
        eventually(&api, "first reserved", |api| reserved(api, "first")).await;
        create_job(&api, "second", 1, 8).await;
        eventually(&api, "second reserved", |api| reserved(api, "second")).await;
        let workload = api.get(WORKLOADS, NS, "job-first").unwrap();
        assert_eq!(
            workload["status"]["admissionChecks"],
            json!([{"name": "start-lock", "state": "Pending", "message": "", "lastTransitionTime": "2026-12-03T00:00:00Z"}])
        );
        let admitted = condition(&api, "first", "Admitted");
        assert_eq!(
            (admitted["status"].as_str(), admitted["reason"].as_str()),
            (Some("False"), Some("UnsatisfiedChecks"))
        );
        assert_eq!(admitted["message"], "The workload has not all admission checks in Ready state");
        assert!(suspended(&api, "first") && suspended(&api, "second"), "reserved jobs stay suspended");
        assert!(api.objects(PODS).is_empty(), "no pods before the checks are Ready");

        // A third needs the reserved GPUs.
        create_job(&api, "third", 1, 8).await;
        eventually(&api, "third not reserved", |api| unreserved(api, "third")).await;
        assert_eq!(checks(&api, "third"), [pending("start-lock")]);
        let quota = condition(&api, "third", "QuotaReserved");
        assert_eq!(quota["reason"], "Pending");
        assert!(quota["message"].as_str().unwrap().starts_with("couldn't assign flavors"), "{quota}");

        // A client changes the template after creation, then the check turns Ready.
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {"late": "yes"}}}}});
        jobs_api(&api).patch("second", &PatchParams::default(), &merge(patch)).await.unwrap();
        set_check(&api, "second", "Ready").await;
        eventually(&api, "second started", |api| !suspended(api, "second")).await;
        // On its reserved node, not the first free one (h100-0, still reserved for `first`).
        assert_eq!(pods_of(&api, "second"), [("second-main-0".to_owned(), "h100-1".to_owned())]);
        let pod = api.get(PODS, NS, "second-main-0").unwrap();
        assert_eq!(pod["status"]["phase"], "Running");
        assert_eq!(pod["metadata"]["labels"]["app"], "second");
        assert_eq!(pod["metadata"]["annotations"]["late"], "yes", "the template as stored at admission");
        assert_eq!(pod["metadata"]["annotations"]["meridian.io/runtime-estimate-seconds"], "60");
        assert_eq!(api.get(BATCH_JOBS, NS, "second").unwrap()["status"]["active"], 1);
        assert_eq!(condition(&api, "second", "Admitted")["status"], "True");
        assert_eq!(condition(&api, "second", "QuotaReserved")["status"], "True");
        let workload = api.get(WORKLOADS, NS, "job-second").unwrap();
        assert_eq!(workload["status"]["admissionChecks"][0]["message"], "set to Ready", "the client's entry stays");

        // `first` is still held; `third` still waits.
        assert!(suspended(&api, "first") && pods_of(&api, "first").is_empty());
        assert!(reserved(&api, "first") && unreserved(&api, "third"));
        set_check(&api, "first", "Ready").await;
        eventually(&api, "first started", |api| !suspended(api, "first")).await;
        assert_eq!(pods_of(&api, "first"), [("first-main-0".to_owned(), "h100-0".to_owned())]);
        assert!(unreserved(&api, "third") && suspended(&api, "third"), "every GPU is in use");
    }

    #[tokio::test]
    async fn retry_and_rejected_checks_release_the_reservation() {
        let api = two_nodes().await;
        api.set_admission_checks(&["start-lock"]);
        api.run_controller(Duration::from_millis(20));

        // `first` (2 × 8 GPUs) reserves both nodes; `second` (8) waits.
        create_job(&api, "first", 2, 8).await;
        eventually(&api, "first reserved", |api| reserved(api, "first")).await;
        create_job(&api, "second", 1, 8).await;
        eventually(&api, "second not reserved", |api| unreserved(api, "second")).await;

        // Retry: `first` lets go; `second` takes h100-0; `first`'s check is Pending again.
        set_check(&api, "first", "Retry").await;
        eventually(&api, "second reserved", |api| reserved(api, "second")).await;
        assert_eq!(checks(&api, "first"), [pending("start-lock")]);
        eventually(&api, "first not reserved", |api| unreserved(api, "first")).await;
        assert!(suspended(&api, "first") && api.objects(PODS).is_empty());

        // Rejected: `second` lets go for good; `first` reserves both nodes again.
        set_check(&api, "second", "Rejected").await;
        eventually(&api, "first reserved again", |api| reserved(api, "first")).await;
        let quota = condition(&api, "second", "QuotaReserved");
        assert_eq!((quota["status"].as_str(), quota["reason"].as_str()), (Some("False"), Some("AdmissionCheck")));
        assert!(quota["message"].as_str().unwrap().contains("start-lock"), "{quota}");
        assert_eq!(checks(&api, "second"), [("start-lock".to_owned(), "Rejected".to_owned())]);
        assert!(suspended(&api, "second"));

        // Deleting the reserved Job frees its reservation: a new 2 × 8 job reserves both nodes.
        let deleted = jobs_api(&api).delete("first", &Default::default()).await.unwrap();
        assert!(deleted.is_left());
        assert!(api.get(WORKLOADS, NS, "job-first").is_none(), "the GC deleted the Workload");
        create_job(&api, "third", 2, 8).await;
        eventually(&api, "third reserved", |api| reserved(api, "third")).await;
        set_check(&api, "third", "Ready").await;
        eventually(&api, "third started", |api| pods_of(api, "third").len() == 2).await;
        let nodes: Vec<String> = pods_of(&api, "third").into_iter().map(|(_, node)| node).collect();
        assert_eq!(nodes, ["h100-0", "h100-1"]);
        assert!(unreserved(&api, "second"), "a rejected workload is not reserved again");
    }

    #[tokio::test]
    async fn without_admission_checks_a_fitting_job_starts_in_one_step() {
        let api = two_nodes().await;
        api.run_controller(Duration::from_millis(20));
        create_job(&api, "first", 2, 8).await;
        eventually(&api, "first started", |api| !suspended(api, "first")).await;
        assert_eq!(pods_of(&api, "first").len(), 2);
        let workload = api.get(WORKLOADS, NS, "job-first").unwrap();
        assert!(workload["status"].get("admissionChecks").is_none());
        assert_eq!(condition(&api, "first", "Admitted")["status"], "True");
    }
}
