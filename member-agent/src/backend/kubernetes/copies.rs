//! Sibling copies in Kueue mode (see [`crate::backend::copies`]): the agent is the controller
//! of a Kueue `AdmissionCheck`, the start lock.
//!
//! The cluster's admin creates an `AdmissionCheck` with `controllerName: meridian.io/start-lock`
//! ([`START_LOCK_CONTROLLER`]), lists it in the `admissionChecks` of the ClusterQueues that
//! Meridian's LocalQueues point at, and names it in `kubernetes.startLockCheck`. At start the
//! backend checks that the AdmissionCheck exists with that controller and marks it `Active`
//! (Kueue holds every workload of a ClusterQueue whose checks are not active).
//!
//! A copy is the job's own suspended Job ([`objects::kueue_copy`]), named
//! [`objects::copy_name`] and annotated with its copy token instead of a fencing token, so no
//! agent adopts it as a binding. Kueue queues, orders, preempts for and reserves quota for it
//! exactly as for the job; once its Workload holds a quota reservation (and every other check
//! of its ClusterQueue is `Ready`), Kueue would start it, so the status round tells the agent
//! [`CopyEvent::Ready`]. Its start-lock check stays `Pending`: Kueue admits nothing, creates no
//! pod, and the copy holds only its quota reservation.
//!
//! The grant is one write, the Job's own record: a merge patch that replaces the copy token by
//! the binding's fencing token, on the Job and on its pod template (each pod reads
//! `MERIDIAN_FENCING_TOKEN` from that annotation). From that write the Job is the binding for
//! this agent and any restarted one, and the check controller ([`Shared::open_checks`]) sets the
//! check `Ready` for every workload that is not a waiting copy; the grant sets it at once. A copy
//! the grant finds still waiting for quota becomes the binding in place, keeping its place in
//! Kueue's queue. The pods keep the copy's names (the Job keeps its name), and the Job's headless
//! Service takes that name too.
//!
//! A drop deletes the copy's Job (Kubernetes deletes its Workload with it). A ready copy whose
//! reservation Kueue takes back (preemption by higher-priority work) is deleted and reported
//! [`CopyEvent::Dropped`], as is a copy whose Job someone else deleted. Copies die with the
//! agent's stream, so a new backend deletes every copy in its namespace.
//!
//! The check passes every workload that is not a waiting Meridian copy, Meridian's bindings and
//! other users' alike: in the agent's namespace at every status round, in the others at every
//! pressure report (which lists every Workload of the cluster anyway), so a ClusterQueue that
//! lists the check may serve other teams' LocalQueues too (`docs/backends.md#sibling-copies`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use meridian_proto::protocol::Assignment;
use serde_json::{Value, json};

use super::config::{Mode, START_LOCK_CONTROLLER};
use super::objects::{self, COPY_KEY, GpuPlacement, JOB_ID_KEY, TOKEN_KEY};
use super::service::Created;
use super::status::true_condition;
use super::{Shared, Snapshot, Tracked, api_error, group_resource, never_fits, owned_by, refusal, unfit_spec};
use crate::backend::copies::unsupported_reason;
use crate::backend::{Admission, BackendError, CopyAdmission, CopyEvent, JobPhase, Result};

/// A copy the backend holds, by job id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KueueCopy {
    pub(crate) copy_token: u64,
    /// Its Job's name.
    pub(crate) name: String,
    /// Whether it was reported ready (its Workload holds a quota reservation).
    pub(crate) ready: bool,
    /// Since when its Job surely exists (None while its create is in flight): a round whose
    /// listing started earlier may not see it, and must not take that for a deletion.
    pub(crate) since: Option<tokio::time::Instant>,
}

/// A copy's Job as found in the cluster.
pub(crate) struct CopyObject {
    pub(crate) job_id: String,
    pub(crate) copy_token: u64,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// The copy a Job is; None for bindings (a granted copy is one) and objects not Meridian's.
pub(crate) fn copy_object_of(object: &DynamicObject) -> Option<CopyObject> {
    let annotations = object.metadata.annotations.as_ref()?;
    if annotations.contains_key(TOKEN_KEY) {
        return None;
    }
    Some(CopyObject {
        job_id: annotations.get(JOB_ID_KEY)?.clone(),
        copy_token: annotations.get(COPY_KEY)?.parse().ok()?,
        name: object.metadata.name.clone()?,
        uid: object.metadata.uid.clone().unwrap_or_default(),
    })
}

fn admission_checks() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", "AdmissionCheck"),
        "admissionchecks",
    )
}

/// Now, as Kubernetes writes times (RFC 3339, whole seconds).
fn now() -> Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null)
}

fn reserved(workload: &Value) -> bool {
    true_condition(workload, "QuotaReserved").is_some()
}

/// The state of check `name` on a Workload (`Pending`, `Ready`, `Retry`, `Rejected`), if listed.
fn check_state<'a>(workload: &'a Value, name: &str) -> Option<&'a str> {
    workload["status"]["admissionChecks"].as_array()?.iter().find(|c| c["name"] == name)?["state"].as_str()
}

/// Whether Kueue would start the Workload but for check `name`: it holds a quota reservation and
/// every other check is `Ready`.
fn waits_only_for(workload: &Value, name: &str) -> bool {
    reserved(workload)
        && workload["status"]["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|c| c["name"] == name || c["state"] == "Ready")
}

impl Shared {
    /// The start-lock check's name, when sibling copies are on (Kueue mode).
    fn start_lock(&self) -> Option<&str> {
        self.config.start_lock_check.as_deref().filter(|_| self.config.mode == Mode::Kueue)
    }

    /// With `startLockCheck` set: checks the AdmissionCheck exists with Meridian's controller
    /// name, and marks it `Active`. A missing or foreign check is an error naming the field.
    pub(super) async fn activate_start_lock(&self) -> Result<()> {
        let Some(name) = self.start_lock() else { return Ok(()) };
        let checks: Api<DynamicObject> = Api::all_with(self.client.clone(), &admission_checks());
        let Some(check) = self.call("get the start-lock AdmissionCheck", checks.get_opt(name)).await? else {
            return Err(BackendError::permanent(format!(
                "kubernetes.startLockCheck: there is no Kueue AdmissionCheck `{name}`; create one with \
                 `spec.controllerName: {START_LOCK_CONTROLLER}` and list it in the ClusterQueues of Meridian's LocalQueues"
            )));
        };
        let controller = check.data["spec"]["controllerName"].as_str().unwrap_or_default();
        if controller != START_LOCK_CONTROLLER {
            return Err(BackendError::permanent(format!(
                "kubernetes.startLockCheck: AdmissionCheck `{name}` belongs to controller `{controller}`, not `{START_LOCK_CONTROLLER}`"
            )));
        }
        let status = json!({"status": {"conditions": [{
            "type": "Active", "status": "True", "reason": "Active", "lastTransitionTime": now(),
            "message": "the Meridian agent holds sibling copies until the gateway grants one the job's start lock",
        }]}});
        self.call(
            "mark the start-lock AdmissionCheck active",
            checks.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)),
        )
        .await?;
        Ok(())
    }

    /// Queues copy `copy_token` of `job` as a suspended Job held by the start-lock check.
    pub(crate) async fn copy_now(&self, copy_token: u64, job: &Assignment) -> Result<CopyAdmission> {
        let refused = |reason: String| Ok(CopyAdmission::Refused { reason, unsupported: false });
        if self.start_lock().is_none() {
            let reason = match self.config.mode {
                Mode::Volcano => unsupported_reason("kubernetes in volcano mode"),
                Mode::Kueue => unsupported_reason("kubernetes without `kubernetes.startLockCheck`"),
            };
            return Ok(CopyAdmission::Refused { reason, unsupported: true });
        }
        if let Some(reason) = unfit_spec(job) {
            return refused(reason);
        }
        let _one_at_a_time = self.copy_lock.lock().await;
        if let Some(held) = self.bindings_of(&job.job_id).await?.first() {
            return refused(format!(
                "binding {} of job `{}` is held here (Job `{}`); a member never holds a copy of a job it holds",
                held.fencing_token, held.job_id, held.name
            ));
        }
        match self.copy_of_job(&job.job_id) {
            Some(held) if held.copy_token == copy_token => return Ok(CopyAdmission::Queued),
            // A newer copy of the same job replaces the one held.
            Some(held) => self.delete_copy(&job.job_id, &held).await?,
            None => {}
        }
        let scan = self.scan().await?;
        let gpu_type = job.spec.gang.resources.gpu_types.first().map(String::as_str);
        if let Some(reason) = never_fits(job, &scan.inventory, gpu_type) {
            return refused(reason);
        }
        let products = gpu_type.and_then(|t| scan.products.get(t)).cloned().unwrap_or_default();
        let placement = GpuPlacement::for_type(gpu_type, products);
        let object = objects::kueue_copy(job, copy_token, &self.config, &placement, &self.cluster);
        let object: DynamicObject = serde_json::from_value(object)
            .map_err(|e| BackendError::permanent(format!("kubernetes: building the copy's Job: {e}")))?;
        let name = objects::copy_name(&job.job_id, copy_token);
        // Held before the call: a create whose answer is lost is still dropped, or reported gone.
        let copy = KueueCopy { copy_token, name: name.clone(), ready: false, since: None };
        self.lock_copies().insert(job.job_id.clone(), copy);
        let created = self.deadline("create copy job", self.jobs().create(&PostParams::default(), &object)).await;
        let answer = match created {
            // 409: an earlier try made it (the name is the job's and the copy's).
            Ok(Ok(_)) => Ok(CopyAdmission::Queued),
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => Ok(CopyAdmission::Queued),
            Ok(Err(error)) => match refusal(&error) {
                Some(Admission::Refused { reason, .. }) => {
                    self.forget_copy(&job.job_id, &name);
                    return refused(reason);
                }
                _ => Err(api_error("create copy job", error)),
            },
            Err(timeout) => Err(timeout),
        };
        if let Some(held) = self.lock_copies().get_mut(&job.job_id).filter(|c| c.name == name) {
            held.since.get_or_insert_with(tokio::time::Instant::now);
        }
        if answer.is_ok() {
            tracing::info!(job = %job.job_id, copy_token, job_name = %name, "sibling copy queued in Kueue behind the start-lock check");
        }
        answer
    }

    /// Drops copy `copy_token` of `job_id`, if held.
    pub(crate) async fn drop_copy_now(&self, job_id: &str, copy_token: u64) -> Result<()> {
        let _one_at_a_time = self.copy_lock.lock().await;
        match self.copy_of_job(job_id) {
            Some(held) if held.copy_token == copy_token => self.delete_copy(job_id, &held).await,
            _ => Ok(()),
        }
    }

    /// Drops whatever copy of `job_id` is held (the caller holds the copy lock).
    pub(super) async fn drop_copies_of(&self, job_id: &str) -> Result<()> {
        match self.copy_of_job(job_id) {
            Some(held) => self.delete_copy(job_id, &held).await,
            None => Ok(()),
        }
    }

    /// Grants copy `copy_token` the start of binding `job` (see the module's order); a copy not
    /// held makes it a submit.
    pub(crate) async fn grant_now(&self, copy_token: u64, job: &Assignment) -> Result<Admission> {
        let _one_at_a_time = self.copy_lock.lock().await;
        let Some(held) = self.copy_of_job(&job.job_id).filter(|c| c.copy_token == copy_token) else {
            self.drop_copies_of(&job.job_id).await?;
            return self.submit_binding(job).await;
        };
        let token = job.fencing_token.to_string();
        let patch = json!({
            "metadata": {"annotations": {TOKEN_KEY: token, COPY_KEY: null}},
            "spec": {"template": {"metadata": {"annotations": {TOKEN_KEY: token}}}},
        });
        let reason = format!("granted the start lock as binding {token}; Kueue admits Job `{}`", held.name);
        // Tracked before the write, so the status round reports a start that races the answer.
        let pending = JobPhase::Pending { reason: reason.clone() };
        self.lock_tracked()
            .insert(job.job_id.clone(), Tracked { since: None, ..Tracked::new(job.fencing_token, pending) });
        let patched = self
            .deadline("grant: patch job", self.jobs().patch(&held.name, &PatchParams::default(), &Patch::Merge(&patch)))
            .await;
        let granted = match patched {
            Ok(Ok(object)) => object,
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                // Deleted meanwhile (the status round reports the drop): the grant is a submit.
                tracing::warn!(job = %job.job_id, copy_token, job_name = %held.name, "granted copy is gone; submitting the job instead");
                self.forget_copy(&job.job_id, &held.name);
                self.untrack(&job.job_id, job.fencing_token);
                return self.submit_binding(job).await;
            }
            Ok(Err(error)) => {
                self.untrack(&job.job_id, job.fencing_token);
                return Err(api_error("grant: patch job", error));
            }
            Err(timeout) => {
                self.untrack(&job.job_id, job.fencing_token);
                return Err(timeout);
            }
        };
        self.forget_copy(&job.job_id, &held.name);
        if let Some(entry) = self.lock_tracked().get_mut(&job.job_id).filter(|t| t.fencing_token == job.fencing_token) {
            entry.since.get_or_insert_with(tokio::time::Instant::now);
        }
        let uid = granted.metadata.uid.clone().unwrap_or_default();
        if let Some(refused) = self.ensure_service(job, &held.name, &uid, Created::Now).await? {
            return Ok(refused);
        }
        // Open the check now rather than at the next round.
        let workloads: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), self.ns(), &group_resource(Mode::Kueue));
        let listed = self.call("list workloads", workloads.list(&ListParams::default())).await?;
        let workload = listed
            .items
            .into_iter()
            .filter_map(|w| serde_json::to_value(w).ok())
            .find(|w| owned_by(&w["metadata"], &uid));
        if let (Some(workload), Some(check)) = (workload, self.start_lock()) {
            let message = format!("granted the start lock of job `{}` as binding {token}", job.job_id);
            self.open_check(&workload, check, &message).await?;
        }
        tracing::info!(job = %job.job_id, copy_token, fencing_token = job.fencing_token, job_name = %held.name, "sibling copy granted; its start-lock check is ready");
        Ok(Admission::Queued { reason })
    }

    /// One status round's look at the copies and the start-lock checks: a copy whose Workload
    /// holds a quota reservation is ready; one Kueue took it back from, or whose Job is gone, is
    /// dropped; every other workload waiting only for the check is let through. `started` is
    /// when the round's snapshot was taken.
    pub(super) async fn copy_round(&self, snapshot: &Snapshot, started: tokio::time::Instant) -> Result<()> {
        let Some(check) = self.start_lock() else { return Ok(()) };
        self.watch_copies(snapshot, check, started).await?;
        self.open_checks(snapshot, check).await
    }

    async fn watch_copies(&self, snapshot: &Snapshot, check: &str, started: tokio::time::Instant) -> Result<()> {
        let held: Vec<(String, KueueCopy)> = self.lock_copies().iter().map(|(j, c)| (j.clone(), c.clone())).collect();
        for (job_id, copy) in held {
            let found = snapshot.copies.iter().find(|c| c.name == copy.name && c.copy_token == copy.copy_token);
            let event = match found {
                None => {
                    if copy.since.is_none_or(|since| since >= started)
                        || self.call("get job", self.jobs().get_opt(&copy.name)).await?.is_some()
                    {
                        continue;
                    }
                    let reason = format!("its Job `{}` was deleted", copy.name);
                    CopyEvent::Dropped { job_id: job_id.clone(), copy_token: copy.copy_token, reason }
                }
                Some(object) => {
                    let workload = snapshot.groups.iter().find(|g| owned_by(&g["metadata"], &object.uid));
                    let waits = workload.is_some_and(|w| waits_only_for(w, check));
                    match (copy.ready, waits) {
                        (false, true) => CopyEvent::Ready { job_id: job_id.clone(), copy_token: copy.copy_token },
                        (true, false) => {
                            // Not while a grant may be rewriting it into a binding.
                            let _one_at_a_time = self.copy_lock.lock().await;
                            if self.copy_of_job(&job_id).as_ref() != Some(&copy) {
                                continue;
                            }
                            self.delete_job(&copy.name).await?;
                            let reason = format!("Kueue took back the quota reserved for its Job `{}`", copy.name);
                            CopyEvent::Dropped { job_id: job_id.clone(), copy_token: copy.copy_token, reason }
                        }
                        _ => continue,
                    }
                }
            };
            let mut copies = self.lock_copies();
            // A grant, drop or newer copy may have taken the entry while we looked.
            let Some(now) = copies.get_mut(&job_id).filter(|now| **now == copy) else { continue };
            match &event {
                CopyEvent::Ready { .. } => now.ready = true,
                CopyEvent::Dropped { .. } => {
                    copies.remove(&job_id);
                }
            }
            drop(copies);
            let _ = self.copy_events.send(event);
        }
        Ok(())
    }

    /// The check controller: sets the start-lock check `Ready` on every Workload in the
    /// namespace that holds a quota reservation and is not a waiting copy (bindings, granted
    /// copies, other users' jobs).
    async fn open_checks(&self, snapshot: &Snapshot, check: &str) -> Result<()> {
        for workload in &snapshot.groups {
            let meta = &workload["metadata"];
            if snapshot.copies.iter().any(|c| owned_by(meta, &c.uid)) {
                continue;
            }
            let message = match snapshot.bindings.iter().find(|b| owned_by(meta, &b.uid)) {
                Some(binding) => {
                    format!("binding {} of job `{}`: no copy of it waits", binding.fencing_token, binding.job_id)
                }
                None => "not a Meridian sibling copy".to_owned(),
            };
            self.open_check(workload, check, &message).await?;
        }
        Ok(())
    }

    /// The check controller outside the agent's namespace, from the cluster-wide Workloads a
    /// pressure report lists: a ClusterQueue that lists the check may also serve other teams'
    /// LocalQueues, whose workloads are never Meridian's copies and must not wait for a grant.
    /// A failed write is logged and left to the next report.
    pub(super) async fn open_foreign_checks(&self, workloads: &[Value]) {
        let Some(check) = self.start_lock() else { return };
        for workload in workloads {
            let namespace = workload["metadata"]["namespace"].as_str().unwrap_or_default();
            if namespace == self.ns() {
                continue;
            }
            if let Err(error) = self.open_check(workload, check, "not a Meridian sibling copy").await {
                tracing::warn!(%error, namespace, "kubernetes: could not let a workload through the start-lock check");
            }
        }
    }

    /// Sets check `check` of `workload` (in its own namespace) `Ready` with `message`, when the
    /// check is `Pending` and Kueue has reserved the Workload's quota (Kueue asks its checks only
    /// then); otherwise does nothing. The other checks are kept as they are; the write is
    /// conditional on the Workload's resource version, and a conflict (someone wrote it
    /// meanwhile) is left to the next round.
    async fn open_check(&self, workload: &Value, check: &str, message: &str) -> Result<()> {
        if check_state(workload, check) != Some("Pending") || !reserved(workload) {
            return Ok(());
        }
        let name = workload["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = workload["metadata"]["namespace"].as_str().filter(|ns| !ns.is_empty()).unwrap_or(self.ns());
        let checks: Vec<Value> = workload["status"]["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                if c["name"] != check {
                    return c.clone();
                }
                let mut mine = c.clone();
                mine["state"] = json!("Ready");
                mine["message"] = json!(message);
                mine["lastTransitionTime"] = now();
                mine
            })
            .collect();
        let patch = json!({
            "metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
            "status": {"admissionChecks": checks},
        });
        let workloads: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &group_resource(Mode::Kueue));
        match self
            .deadline(
                "set the start-lock check",
                workloads.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?
        {
            Ok(_) => {
                tracing::debug!(workload = name, check, message, "start-lock check set ready");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(()),
            Err(error) => Err(api_error("set the start-lock check", error)),
        }
    }

    /// Deletes every copy in the namespace: copies belong to the stream of the agent that queued
    /// them, and a new backend is a new agent.
    pub(super) async fn cancel_orphan_copies(&self, snapshot: &Snapshot) -> Result<usize> {
        for copy in &snapshot.copies {
            self.delete_job(&copy.name).await?;
            tracing::info!(job = %copy.job_id, copy_token = copy.copy_token, job_name = %copy.name, "deleted a sibling copy a previous agent left");
        }
        Ok(snapshot.copies.len())
    }

    fn copy_of_job(&self, job_id: &str) -> Option<KueueCopy> {
        self.lock_copies().get(job_id).cloned()
    }

    fn forget_copy(&self, job_id: &str, name: &str) {
        let mut copies = self.lock_copies();
        if copies.get(job_id).is_some_and(|held| held.name == name) {
            copies.remove(job_id);
        }
    }

    /// Deletes `copy`'s Job (its Workload goes with it) and forgets it.
    async fn delete_copy(&self, job_id: &str, copy: &KueueCopy) -> Result<()> {
        self.delete_job(&copy.name).await?;
        self.forget_copy(job_id, &copy.name);
        tracing::info!(job = %job_id, copy_token = copy.copy_token, job_name = %copy.name, "sibling copy deleted");
        Ok(())
    }

    fn lock_copies(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, KueueCopy>> {
        self.copies.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
