//! The Kubernetes backend: jobs run as Volcano Jobs (`mode: volcano`) or as suspended
//! `batch/v1` Jobs that Kueue admits (`mode: kueue`); inventory comes from Nodes and Pods.
//!
//! - [`config`]: the `kubernetes:` config section.
//! - [`objects`]: the objects created, with names, labels and the fencing-token annotation.
//! - [`status`]: object status → [`JobPhase`].
//! - [`inventory`]: Nodes + Pods → [`Inventory`].
//! - [`pressure`]: PodGroups / Workloads → [`QueuePressure`].
//! - `quote`: Nodes + Pods → a start quote, from Meridian pods' estimated ends.
//! - `copies`: sibling copies in Kueue mode, held by the agent's own Kueue `AdmissionCheck`.
//!
//! Every object Meridian creates carries the label `app.kubernetes.io/managed-by=meridian`, the
//! job id as a label and annotation, and the fencing token as an annotation, so `list` (and a
//! restarted agent) finds every binding by listing that label. Status comes from watches
//! ([`watch`], `statusUpdates: watch`, the default): the jobs, their pods and the PodGroups or
//! Workloads are listed once and then watched, and each change is reported from the caches. With
//! `statusUpdates: poll` every `pollInterval` lists them again instead (one labelled list of jobs
//! and pods, and one list of PodGroups or Workloads, per round). Every API call has the
//! `requestTimeout` deadline.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, LogParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use meridian_proto::inventory::{BackendKind, Inventory, QueuePressure};
use meridian_proto::protocol::Assignment;
use serde_json::Value;
use tokio::task::JoinHandle;

use super::logs::LogRequest;
use super::{
    Admission, BackendError, CopyEventReceiver, CopyEventSender, HeldJob, JobEvent, JobEventSender, JobPhase, LogChunk,
    Result,
};

pub mod config;
mod copies;
pub mod inventory;
pub mod objects;
pub mod pressure;
mod quote;
mod service;
pub mod status;
mod watch;

#[cfg(test)]
mod copy_tests;
#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod real_tests;
#[cfg(test)]
pub(crate) mod tests;

pub use config::{KubernetesConfig, Mode, StatusUpdates};
use inventory::{GpuTypeMapper, Scan};
use objects::{GpuPlacement, JOB_ID_KEY, MANAGED_LABEL, MANAGED_VALUE, TOKEN_KEY};
use service::Created;

/// Most bytes of job output read back from the API per `logs` call.
const LOG_READ_CAP: usize = 1024 * 1024;

/// Kubernetes (Volcano or Kueue) as a [`LocalBackend`] and an [`InventorySource`].
///
/// Owns the status poll task; dropping the backend stops it.
pub struct KubernetesBackend {
    shared: Arc<Shared>,
    poller: JoinHandle<()>,
    /// The receiving end of the sibling copies' events, until the agent takes it.
    copy_events: Mutex<Option<CopyEventReceiver>>,
}

struct Shared {
    client: kube::Client,
    config: KubernetesConfig,
    /// The member cluster's name (`MERIDIAN_CLUSTER`).
    cluster: String,
    mapper: GpuTypeMapper,
    events: JobEventSender,
    /// Bindings whose changes are reported, by job id.
    tracked: Mutex<BTreeMap<String, Tracked>>,
    /// Sibling copies queued behind the start-lock admission check, by job id ([`copies`]).
    copies: Mutex<BTreeMap<String, copies::KueueCopy>>,
    /// Held across each copy call (queue, drop, grant) and a submit's drop of its job's copy, so
    /// that a drop never overtakes the create of the copy it drops.
    copy_lock: tokio::sync::Mutex<()>,
    /// Where the copies' events go.
    copy_events: CopyEventSender,
}

/// A binding whose changes the poller reports.
struct Tracked {
    fencing_token: u64,
    /// The phase last reported (or answered by `submit`).
    last: JobPhase,
    /// Since when the object surely exists (None while its create is in flight): a poll round
    /// whose listing started earlier may not see it, and must not take that for a deletion.
    since: Option<tokio::time::Instant>,
}

impl Tracked {
    fn new(fencing_token: u64, last: JobPhase) -> Self {
        Self { fencing_token, last, since: Some(tokio::time::Instant::now()) }
    }
}

/// One Meridian object found in the cluster.
struct Binding {
    job_id: String,
    fencing_token: u64,
    name: String,
    uid: String,
    object: Value,
}

/// Jobs, pods and PodGroups/Workloads, listed once.
struct Snapshot {
    bindings: Vec<Binding>,
    /// The sibling copies' Jobs (Kueue mode), which are no bindings.
    copies: Vec<copies::CopyObject>,
    pods: Vec<Pod>,
    groups: Vec<Value>,
}

impl KubernetesBackend {
    /// Connects with the ambient credentials (in-cluster service account, else `KUBECONFIG`),
    /// checks the nodes' GPU products map to GPU types, and starts polling.
    pub async fn connect(config: KubernetesConfig, cluster: String, events: JobEventSender) -> Result<Self> {
        install_crypto_provider();
        let client = kube::Client::try_default().await.map_err(|e| BackendError::Permanent {
            message: "kubernetes: no usable cluster credentials (in-cluster service account or KUBECONFIG)".into(),
            source: Some(Box::new(e)),
        })?;
        Self::with_client(client, config, cluster, events).await
    }

    /// Builds the backend over `client`: reads the nodes once (an unmappable GPU product is an
    /// error naming it), adopts the bindings already in the namespace, and starts polling.
    pub async fn with_client(
        client: kube::Client,
        config: KubernetesConfig,
        cluster: String,
        events: JobEventSender,
    ) -> Result<Self> {
        let mapper = GpuTypeMapper::new(config.gpu_types.clone());
        let (copy_events_tx, copy_events) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            client,
            config,
            cluster,
            mapper,
            events,
            tracked: Mutex::new(BTreeMap::new()),
            copies: Mutex::new(BTreeMap::new()),
            copy_lock: tokio::sync::Mutex::new(()),
            copy_events: copy_events_tx,
        });
        shared.scan().await?;
        shared.activate_start_lock().await?;
        let snapshot = shared.snapshot().await?;
        shared.cancel_orphan_copies(&snapshot).await?;
        {
            let mut tracked = shared.lock_tracked();
            for binding in &snapshot.bindings {
                let phase = snapshot.phase_of(binding, shared.config.mode);
                if !phase.is_terminal() {
                    tracked.insert(binding.job_id.clone(), Tracked::new(binding.fencing_token, phase));
                }
            }
        }
        let poller = tokio::spawn(run_status_loop(Arc::clone(&shared)));
        Ok(Self { shared, poller, copy_events: Mutex::new(Some(copy_events)) })
    }
}

impl Drop for KubernetesBackend {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

/// Installs rustls' ring provider for the process; kube's client panics when it cannot tell
/// which of two providers to use. A second install is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn job_resource(mode: Mode) -> ApiResource {
    match mode {
        Mode::Volcano => {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("batch.volcano.sh", "v1alpha1", "Job"), "jobs")
        }
        Mode::Kueue => ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("batch", "v1", "Job"), "jobs"),
    }
}

/// PodGroups (Volcano) or Workloads (Kueue): what the scheduler queues.
fn group_resource(mode: Mode) -> ApiResource {
    match mode {
        Mode::Volcano => ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
            "podgroups",
        ),
        Mode::Kueue => ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "Workload"),
            "workloads",
        ),
    }
}

fn managed_selector() -> String {
    format!("{MANAGED_LABEL}={MANAGED_VALUE}")
}

/// A kube error as a backend error: 5xx, 429 and connection failures are transient.
pub(crate) fn api_error(what: &str, error: kube::Error) -> BackendError {
    let transient = match &error {
        kube::Error::Api(status) => status.code >= 500 || status.code == 429,
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => false,
        _ => true,
    };
    let message = match &error {
        kube::Error::Api(status) => {
            format!("kubernetes: {what}: {} {}: {}", status.code, status.reason, status.message)
        }
        other => format!("kubernetes: {what}: {other}"),
    };
    let source = Some(Box::new(error) as Box<dyn std::error::Error + Send + Sync>);
    if transient { BackendError::Transient { message, source } } else { BackendError::Permanent { message, source } }
}

/// The answer to a create the API refused: 400/422 (invalid) → permanent refusal with the
/// API's message; anything else is an error.
pub(crate) fn refusal(error: &kube::Error) -> Option<Admission> {
    match error {
        kube::Error::Api(status) if status.code == 400 || status.code == 422 => Some(Admission::Refused {
            reason: format!("the Kubernetes API refused the job: {}", status.message),
            permanent: true,
        }),
        _ => None,
    }
}

impl Shared {
    fn lock_tracked(&self) -> MutexGuard<'_, BTreeMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ns(&self) -> &str {
        &self.config.namespace
    }

    fn jobs(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), self.ns(), &job_resource(self.config.mode))
    }

    /// Runs one API call under the request deadline; the inner result is the API's answer.
    async fn deadline<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>> {
        let limit = self.config.request_timeout.0;
        tokio::time::timeout(limit, call).await.map_err(|_| {
            BackendError::transient(format!("kubernetes: {what}: no answer within {:.1}s", limit.as_secs_f64()))
        })
    }

    async fn call<T>(&self, what: &str, call: impl std::future::Future<Output = kube::Result<T>>) -> Result<T> {
        self.deadline(what, call).await?.map_err(|e| api_error(what, e))
    }

    async fn inventory_now(&self) -> Result<Inventory> {
        Ok(self.scan().await?.inventory)
    }

    /// Nodes and pods of the whole cluster → inventory.
    async fn scan(&self) -> Result<Scan> {
        let (nodes, pods) = self.nodes_and_pods().await?;
        inventory::scan(&nodes, &pods, &self.mapper)
    }

    /// Every node and every unfinished pod of the cluster: what the inventory and start quotes
    /// are made from.
    async fn nodes_and_pods(&self) -> Result<(Vec<Node>, Vec<Pod>)> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let nodes = self.call("list nodes", nodes.list(&ListParams::default())).await?;
        // Finished pods hold nothing; the API filters them out (the scan checks again).
        let unfinished = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let pods = self.call("list pods", pods.list(&unfinished)).await?;
        Ok((nodes.items, pods.items))
    }

    /// Every Meridian binding in the namespace, its pods, and the PodGroups/Workloads.
    async fn snapshot(&self) -> Result<Snapshot> {
        let selector = managed_selector();
        let listed = self.call("list jobs", self.jobs().list(&ListParams::default().labels(&selector))).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pods = self.call("list pods", pods.list(&ListParams::default().labels(&selector))).await?;
        let groups: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), self.ns(), &group_resource(self.config.mode));
        let groups = self.call("list pod groups", groups.list(&ListParams::default())).await?;
        let copies = listed.items.iter().filter_map(copies::copy_object_of).collect();
        let bindings = listed.items.into_iter().filter_map(binding_of).collect();
        let groups = groups.items.into_iter().filter_map(|g| serde_json::to_value(g).ok()).collect();
        Ok(Snapshot { bindings, copies, pods: pods.items, groups })
    }

    async fn submit_now(&self, job: &Assignment) -> Result<Admission> {
        {
            // A member never holds a copy of a job it holds.
            let _copies = self.copy_lock.lock().await;
            self.drop_copies_of(&job.job_id).await?;
        }
        self.submit_binding(job).await
    }

    /// [`Self::submit_now`] once no copy of the job is held.
    async fn submit_binding(&self, job: &Assignment) -> Result<Admission> {
        let spec = &job.spec;
        if let Some(reason) = unfit_spec(job) {
            return Ok(Admission::Refused { reason, permanent: true });
        }
        let snapshot = self.snapshot().await?;
        if let Some(held) = snapshot.bindings.iter().find(|b| b.job_id == job.job_id) {
            if held.fencing_token == job.fencing_token {
                self.ensure_service(job, &held.name, &held.uid, Created::Earlier).await?;
            }
            return Ok(snapshot.admission_of(held, job.fencing_token, self.config.mode));
        }
        let scan = self.scan().await?;
        let gpu_type = spec.gang.resources.gpu_types.first().map(String::as_str);
        if let Some(reason) = never_fits(job, &scan.inventory, gpu_type) {
            return Ok(Admission::Refused { reason, permanent: true });
        }
        let products = gpu_type.and_then(|t| scan.products.get(t)).cloned().unwrap_or_default();
        let object = objects::build(job, &self.config, &GpuPlacement::for_type(gpu_type, products), &self.cluster);
        let object: DynamicObject = serde_json::from_value(object)
            .map_err(|e| BackendError::permanent(format!("kubernetes: building the job object: {e}")))?;
        let name = objects::object_name(&job.job_id, job.fencing_token);
        let queue = self.config.queue_for(&spec.tenant);
        let reason = match self.config.mode {
            Mode::Volcano => {
                format!("created Volcano job `{name}` in queue `{queue}`; waiting for the gang to be scheduled")
            }
            Mode::Kueue => format!("created job `{name}` suspended in Kueue queue `{queue}`; waiting for admission"),
        };
        // Tracked before the call, so the poller reports a start that races the answer.
        let pending = JobPhase::Pending { reason: reason.clone() };
        self.lock_tracked()
            .insert(job.job_id.clone(), Tracked { since: None, ..Tracked::new(job.fencing_token, pending) });
        let created = self.deadline("create job", self.jobs().create(&PostParams::default(), &object)).await;
        if matches!(created, Ok(Ok(_)) | Ok(Err(kube::Error::Api(_))))
            && let Some(entry) =
                self.lock_tracked().get_mut(&job.job_id).filter(|t| t.fencing_token == job.fencing_token)
        {
            entry.since.get_or_insert_with(tokio::time::Instant::now);
        }
        match created {
            Ok(Ok(created)) => {
                let uid = created.metadata.uid.clone().unwrap_or_default();
                Ok(self.ensure_service(job, &name, &uid, Created::Now).await?.unwrap_or(Admission::Queued { reason }))
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                // Created by an earlier try whose answer was lost, or a name clash: the token decides.
                let now = self.snapshot().await?;
                match now.bindings.iter().find(|b| b.name == name) {
                    Some(held) => {
                        if held.fencing_token == job.fencing_token {
                            self.ensure_service(job, &held.name, &held.uid, Created::Earlier).await?;
                        }
                        Ok(now.admission_of(held, job.fencing_token, self.config.mode))
                    }
                    None => {
                        Err(BackendError::transient(format!("kubernetes: job `{name}` exists but is not readable yet")))
                    }
                }
            }
            Ok(Err(error)) => {
                self.untrack(&job.job_id, job.fencing_token);
                refusal(&error).map_or_else(|| Err(api_error("create job", error)), Ok)
            }
            Err(timeout) => Err(timeout),
        }
    }

    fn untrack(&self, job_id: &str, fencing_token: u64) {
        let mut tracked = self.lock_tracked();
        if tracked.get(job_id).is_some_and(|t| t.fencing_token == fencing_token) {
            tracked.remove(job_id);
        }
    }

    async fn cancel_now(&self, job_id: &str, fencing_token: u64) -> Result<()> {
        self.untrack(job_id, fencing_token);
        let Some(binding) = self.find_binding(job_id, fencing_token).await? else { return Ok(()) };
        self.delete_job(&binding.name).await
    }

    /// Binding `fencing_token` of `job_id`, read from the API.
    async fn find_binding(&self, job_id: &str, fencing_token: u64) -> Result<Option<Binding>> {
        Ok(self.bindings_of(job_id).await?.into_iter().find(|b| b.fencing_token == fencing_token))
    }

    /// The bindings of `job_id` in the namespace, read from the API: one labelled list, found by
    /// labels rather than names, as a granted sibling copy keeps its copy's name.
    async fn bindings_of(&self, job_id: &str) -> Result<Vec<Binding>> {
        let selector = format!("{},{JOB_ID_KEY}={}", managed_selector(), objects::label_value(job_id));
        let listed = self.call("list jobs", self.jobs().list(&ListParams::default().labels(&selector))).await?;
        Ok(listed.items.into_iter().filter_map(binding_of).filter(|b| b.job_id == job_id).collect())
    }

    /// Deletes the Job `name` and, through its owner references, what it owns; gone already is
    /// no error.
    async fn delete_job(&self, name: &str) -> Result<()> {
        match self.deadline("delete job", self.jobs().delete(name, &DeleteParams::background())).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(api_error("delete job", error)),
        }
    }

    async fn list_now(&self) -> Result<Vec<HeldJob>> {
        let snapshot = self.snapshot().await?;
        Ok(snapshot
            .bindings
            .iter()
            .map(|b| HeldJob {
                job_id: b.job_id.clone(),
                fencing_token: b.fencing_token,
                phase: snapshot.phase_of(b, self.config.mode),
            })
            .collect())
    }

    async fn logs_now(&self, job_id: &str, fencing_token: u64, request: LogRequest) -> Result<LogChunk> {
        let snapshot = self.snapshot().await?;
        let Some(binding) = snapshot.bindings.iter().find(|b| b.job_id == job_id && b.fencing_token == fencing_token)
        else {
            return Err(BackendError::permanent(format!("job `{job_id}` binding {fencing_token} is not held here")));
        };
        let complete = snapshot.phase_of(binding, self.config.mode).is_terminal();
        let mut pods: Vec<&Pod> = snapshot.pods_of(binding).collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let mut all = String::new();
        for pod in &pods {
            let Some(name) = pod.metadata.name.as_deref() else { continue };
            let left = LOG_READ_CAP.saturating_sub(all.len());
            if left == 0 {
                break;
            }
            let params =
                LogParams { limit_bytes: Some(i64::try_from(left).unwrap_or(i64::MAX)), ..LogParams::default() };
            let text = match self.deadline("read pod log", api.logs(name, &params)).await? {
                Ok(text) => text,
                // A pod not started yet has no log.
                Err(kube::Error::Api(status)) if status.code == 400 || status.code == 404 => String::new(),
                Err(error) => return Err(api_error("read pod log", error)),
            };
            if pods.len() > 1 {
                all.push_str(&format!("==> {name} <==\n"));
            }
            all.push_str(&text);
        }
        Ok(request.window(all.as_bytes(), 0, complete))
    }

    async fn pressure_now(&self) -> Result<QueuePressure> {
        let groups: Api<DynamicObject> = Api::all_with(self.client.clone(), &group_resource(self.config.mode));
        let groups = self.call("list pod groups", groups.list(&ListParams::default())).await?;
        let groups: Vec<Value> = groups.items.into_iter().filter_map(|g| serde_json::to_value(g).ok()).collect();
        self.open_foreign_checks(&groups).await;
        Ok(pressure::pressure_of(&groups, self.config.mode))
    }

    /// One status sync: report every tracked binding whose phase changed.
    async fn sync_status(&self) -> Result<()> {
        let started = tokio::time::Instant::now();
        let snapshot = self.snapshot().await?;
        self.report_changes(&snapshot, |_, entry| entry.since.is_some_and(|since| since < started));
        self.copy_round(&snapshot, started).await
    }

    /// One status round from the watch caches: no API call, except one `get` per tracked binding
    /// the caches lack, to tell a deleted object from one created after the cache last heard.
    async fn sync_from_watch(&self, snapshot: &Snapshot) -> Result<()> {
        let started = tokio::time::Instant::now();
        let missing: Vec<(String, u64)> = self
            .lock_tracked()
            .iter()
            .filter(|(job_id, entry)| {
                entry.since.is_some()
                    && !snapshot.bindings.iter().any(|b| &b.job_id == *job_id && b.fencing_token == entry.fencing_token)
            })
            .map(|(job_id, entry)| (job_id.clone(), entry.fencing_token))
            .collect();
        let mut gone = Vec::new();
        for (job_id, token) in missing {
            if self.find_binding(&job_id, token).await?.is_none() {
                gone.push((job_id, token));
            }
        }
        self.report_changes(snapshot, |job_id, entry| {
            gone.iter().any(|(id, token)| id == job_id && *token == entry.fencing_token)
        });
        self.copy_round(snapshot, started).await
    }

    /// Reports every tracked binding whose phase in `snapshot` differs from the last one
    /// reported, and stops tracking the ended ones and the missing ones `gone` says are gone.
    fn report_changes(&self, snapshot: &Snapshot, gone_if_missing: impl Fn(&str, &Tracked) -> bool) {
        let mut tracked = self.lock_tracked();
        let mut gone = Vec::new();
        for (job_id, entry) in tracked.iter_mut() {
            let token = entry.fencing_token;
            let Some(binding) = snapshot.bindings.iter().find(|b| &b.job_id == job_id && b.fencing_token == token)
            else {
                if gone_if_missing(job_id, entry) {
                    gone.push(job_id.clone());
                }
                continue;
            };
            let phase = snapshot.phase_of(binding, self.config.mode);
            if phase != entry.last {
                // The agent dropping its receiver means it is shutting down.
                let _ =
                    self.events.send(JobEvent { job_id: job_id.clone(), fencing_token: token, phase: phase.clone() });
                if phase.is_terminal() {
                    gone.push(job_id.clone());
                }
                entry.last = phase;
            }
        }
        for job_id in gone {
            tracked.remove(&job_id);
        }
    }
}

/// Reports status changes until aborted (the backend aborts it when dropped): from watches, or
/// by polling (`statusUpdates`); a failed round is logged and retried.
async fn run_status_loop(shared: Arc<Shared>) {
    let interval = shared.config.poll_interval.0.max(Duration::from_millis(10));
    if shared.config.status_updates == StatusUpdates::Watch {
        let watched = watch::Watched::start(&shared.client, shared.ns(), shared.config.mode);
        if !watched.ready().await {
            return;
        }
        loop {
            // A change wakes the loop at once; `pollInterval` bounds the time between rounds.
            tokio::select! {
                () = watched.changed() => {}
                () = tokio::time::sleep(interval) => {}
            }
            if let Err(error) = shared.sync_from_watch(&watched.snapshot()).await {
                tracing::warn!(%error, "kubernetes: status round failed");
            }
        }
    }
    loop {
        tokio::time::sleep(interval).await;
        if let Err(error) = shared.sync_status().await {
            tracing::warn!(%error, "kubernetes: status poll failed");
        }
    }
}

/// The binding an object records in its annotations; None for objects without them.
fn binding_of(object: DynamicObject) -> Option<Binding> {
    let annotations = object.metadata.annotations.as_ref()?;
    let job_id = annotations.get(JOB_ID_KEY)?.clone();
    let fencing_token = annotations.get(TOKEN_KEY)?.parse().ok()?;
    let name = object.metadata.name.clone()?;
    let uid = object.metadata.uid.clone().unwrap_or_default();
    let object = serde_json::to_value(object).ok()?;
    Some(Binding { job_id, fencing_token, name, uid, object })
}

fn owned_by(meta: &Value, uid: &str) -> bool {
    meta["ownerReferences"].as_array().into_iter().flatten().any(|r| r["uid"] == uid)
}

impl Snapshot {
    fn pods_of<'a>(&'a self, binding: &'a Binding) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods.iter().filter(|p| p.metadata.owner_references.iter().flatten().any(|r| r.uid == binding.uid))
    }

    fn phase_of(&self, binding: &Binding, mode: Mode) -> JobPhase {
        let pods: Vec<Pod> = self.pods_of(binding).cloned().collect();
        let group = self.groups.iter().find(|g| owned_by(&g["metadata"], &binding.uid));
        match mode {
            Mode::Volcano => status::volcano_phase(&binding.object, &pods, group),
            Mode::Kueue => status::batch_phase(&binding.object, &pods, group),
        }
    }

    /// The answer to submitting binding `token` while `held` exists.
    fn admission_of(&self, held: &Binding, token: u64, mode: Mode) -> Admission {
        if held.fencing_token != token {
            return Admission::Refused {
                reason: format!(
                    "binding {} of job `{}` is still held here (object `{}`); it must be cancelled first",
                    held.fencing_token, held.job_id, held.name
                ),
                permanent: false,
            };
        }
        match self.phase_of(held, mode) {
            JobPhase::Pending { reason } => Admission::Queued { reason },
            JobPhase::Running { nodes } => Admission::Started { nodes },
            JobPhase::Succeeded { .. } | JobPhase::Failed { .. } | JobPhase::Preempted { .. } => {
                Admission::Started { nodes: Vec::new() }
            }
        }
    }
}

/// Why a job's spec can never run on Kubernetes; None when it may.
fn unfit_spec(job: &Assignment) -> Option<String> {
    let spec = &job.spec;
    if spec.payload.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        return Some(format!("job `{}`: Kubernetes runs containers; payload.image is required", job.job_id));
    }
    if spec.gang.replicas == 0 || spec.gang.resources.gpus == 0 {
        return Some(format!("job `{}`: gang.replicas and gang.resources.gpus must be at least 1", job.job_id));
    }
    None
}

/// Why `job` can never run on these nodes, even all free; None when it can.
fn never_fits(job: &Assignment, inventory: &Inventory, gpu_type: Option<&str>) -> Option<String> {
    let need = &job.spec.gang.resources;
    let mut replicas = 0u32;
    for shape in inventory.shapes.iter().filter(|s| gpu_type.is_none_or(|t| t == s.gpu_type)) {
        let empty = meridian_proto::inventory::NodeFree {
            gpus: shape.gpus_per_node,
            cpu: shape.cpu_per_node,
            memory_gib: shape.memory_gib_per_node,
        };
        let per_node = empty.replicas_fitting(need.gpus, need.cpu, need.memory_gib);
        replicas = replicas.saturating_add(per_node.saturating_mul(shape.node_count()));
    }
    (replicas < job.spec.gang.replicas).then(|| {
        format!(
            "job `{}` never fits: {} replica(s) of {} GPU(s), {} CPU, {} GiB{} but the nodes hold at most {replicas}",
            job.job_id,
            job.spec.gang.replicas,
            need.gpus,
            need.cpu,
            need.memory_gib,
            gpu_type.map(|t| format!(" on {t}")).unwrap_or_default(),
        )
    })
}

super::delegate_to_shared_state!(KubernetesBackend, BackendKind::Kubernetes, copies);
