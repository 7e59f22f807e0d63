//! Sibling copies in Kueue mode (`copies.rs`) against the fake API server, whose stand-in Kueue
//! reserves quota, waits for admission checks and starts a gang only once every check is
//! `Ready` (see `fake.rs`). The witness that no copy starts before its grant is the pods: Kueue
//! (here, its stand-in) creates none until it admits the Job.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::protocol::Assignment;
use serde_json::{Value, json};

use super::config::START_LOCK_CONTROLLER;
use super::fake::{self, FakeApi};
use super::objects::{self, TOKEN_KEY};
use super::tests::{assignment, backend_with, config, event_for, fixture, subject_with, with_command};
use super::*;
use crate::backend::conformance;
use crate::backend::{CopyAdmission, CopyEvent, CopyEventReceiver, InventorySource, JobPhase, LocalBackend};

const CHECK: &str = "start-lock";
const CHECKS: &str = "kueue.x-k8s.io/v1beta1/admissionchecks";
const NS: &str = "meridian";

fn lock_config() -> KubernetesConfig {
    KubernetesConfig { start_lock_check: Some(CHECK.into()), ..config(Mode::Kueue) }
}

fn check_object(controller: &str) -> Value {
    json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "AdmissionCheck",
        "metadata": {"name": CHECK}, "spec": {"controllerName": controller}})
}

/// Two 8-GPU nodes whose Kueue holds every workload at the `start-lock` check.
async fn kueue_member() -> Arc<FakeApi> {
    let api = FakeApi::start(fixture("member"), Value::Array(Vec::new())).await;
    api.put(CHECKS, check_object(START_LOCK_CONTROLLER));
    api.set_admission_checks(&[CHECK]);
    api.run_controller(Duration::from_millis(20));
    api
}

fn sleeper(job_id: &str, token: u64, replicas: u32) -> Assignment {
    with_command(assignment(job_id, token, "a", replicas, 8), "sleep 600")
}

async fn next_copy_event(events: &mut CopyEventReceiver) -> CopyEvent {
    match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Some(event)) => event,
        other => panic!("no copy event within 10 s: {other:?}"),
    }
}

/// Waits (up to 10 s, looking every 20 ms) until `holds` is true of the fake's store.
async fn until(what: &str, holds: impl Fn() -> bool) {
    for _ in 0..500 {
        if holds() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not within 10 s: {what}");
}

fn job_named(api: &FakeApi, name: &str) -> Option<Value> {
    api.get(fake::BATCH_JOBS, NS, name)
}

fn owned<'a>(objects: &'a [Value], owner: &Value) -> Vec<&'a Value> {
    let uid = &owner["metadata"]["uid"];
    objects.iter().filter(|o| o["metadata"]["ownerReferences"][0]["uid"] == *uid).collect()
}

fn workload_of(api: &FakeApi, name: &str) -> Option<Value> {
    let job = job_named(api, name)?;
    owned(&api.objects(fake::WORKLOADS), &job).first().map(|w| (*w).clone())
}

fn condition(workload: &Value, kind: &str) -> Option<String> {
    let conditions = workload["status"]["conditions"].as_array()?;
    conditions.iter().find(|c| c["type"] == kind)?["status"].as_str().map(String::from)
}

fn check_of(workload: &Value) -> (String, String) {
    let check = workload["status"]["admissionChecks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == CHECK))
        .unwrap_or_else(|| panic!("no start-lock check on {workload}"));
    (check["state"].as_str().unwrap_or_default().into(), check["message"].as_str().unwrap_or_default().into())
}

#[tokio::test]
async fn a_copy_waits_for_quota_then_for_its_grant_and_runs_once_under_the_grants_token() {
    let api = kueue_member().await;
    let (backend, mut events) = backend_with(&api, lock_config()).await;
    let mut copies = backend.copy_events().expect("the copy events, once");
    let check = api.get(CHECKS, "", CHECK).expect("the check");
    assert_eq!(check["status"]["conditions"][0]["type"], "Active", "{check}");
    assert_eq!(check["status"]["conditions"][0]["status"], "True", "{check}");

    // A binding passes the check once Kueue reserves its quota.
    let blocker = sleeper("blocker", 2, 2);
    backend.submit(&blocker).await.unwrap();
    event_for(&mut events, "blocker", |p| matches!(p, JobPhase::Running { .. })).await;
    let (state, message) = check_of(&workload_of(&api, "m-blocker-t2").unwrap());
    assert_eq!(state, "Ready");
    assert!(message.contains("binding 2 of job `blocker`"), "{message}");

    // A copy on the full member: queued, without quota, not ready, no binding.
    let job = sleeper("j-1", 5, 1);
    assert_eq!(backend.copy(7, &job).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(backend.copy(7, &job).await.unwrap(), CopyAdmission::Queued, "the same copy again");
    let name = objects::copy_name("j-1", 7);
    assert_eq!(api.objects(fake::BATCH_JOBS).len(), 2, "one Job for the copy");
    until("the copy's Workload waits for quota", || {
        workload_of(&api, &name).is_some_and(|w| condition(&w, "QuotaReserved").as_deref() == Some("False"))
    })
    .await;
    assert!(copies.try_recv().is_err(), "a copy without quota is not ready");
    assert!(backend.list().await.unwrap().iter().all(|h| h.job_id != "j-1"), "a copy is no binding");

    // The blocker ends: Kueue reserves quota for the copy, which waits at the check.
    backend.cancel("blocker", 2).await.unwrap();
    let ready = next_copy_event(&mut copies).await;
    assert_eq!(ready, CopyEvent::Ready { job_id: "j-1".into(), copy_token: 7 });
    let copy = job_named(&api, &name).expect("the copy's Job");
    assert_eq!(copy["spec"]["suspend"], true, "{copy}");
    assert!(owned(&api.objects(fake::PODS), &copy).is_empty(), "a ready copy runs nothing");
    assert_eq!(check_of(&workload_of(&api, &name).unwrap()).0, "Pending");

    // The grant: one write makes the copy binding 9; Kueue admits it; its pod runs under 9.
    let granted = Assignment { fencing_token: 9, ..job.clone() };
    let answer = backend.grant(7, &granted).await.unwrap();
    assert!(matches!(&answer, Admission::Queued { reason } if reason.contains("binding 9")), "{answer:?}");
    let running = event_for(&mut events, "j-1", |p| matches!(p, JobPhase::Running { .. })).await;
    assert_eq!(running.fencing_token, 9);
    let bound = job_named(&api, &name).expect("the Job keeps the copy's name");
    let pods = owned(&api.objects(fake::PODS), &bound).into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(pods.len(), 1, "{pods:?}");
    assert_eq!(pods[0]["metadata"]["annotations"][TOKEN_KEY], "9", "{}", pods[0]);
    let env = &pods[0]["spec"]["containers"][0]["env"];
    let token_var = env.as_array().unwrap().iter().find(|v| v["name"] == "MERIDIAN_FENCING_TOKEN").unwrap();
    assert_eq!(token_var["valueFrom"]["fieldRef"]["fieldPath"], format!("metadata.annotations['{TOKEN_KEY}']"));
    assert!(api.objects(fake::SERVICES).iter().any(|s| s["metadata"]["name"] == name.as_str()), "its Service");
    let held = backend.list().await.unwrap();
    assert_eq!(held.iter().map(|h| (h.job_id.as_str(), h.fencing_token)).collect::<Vec<_>>(), [("j-1", 9)]);
    assert!(copies.try_recv().is_err(), "a granted copy is not dropped");

    // A restarted backend adopts it as binding 9 (a copy it would have deleted).
    drop(backend);
    let (again, _events) = backend_with(&api, lock_config()).await;
    let held = again.list().await.unwrap();
    assert!(held.iter().any(|h| h.job_id == "j-1" && h.fencing_token == 9), "{held:?}");
    assert!(job_named(&api, &name).is_some());
}

#[tokio::test]
async fn a_copy_granted_while_it_waits_for_quota_becomes_the_binding_in_its_place() {
    let api = kueue_member().await;
    let (backend, mut events) = backend_with(&api, lock_config()).await;
    let _copies = backend.copy_events();
    backend.submit(&sleeper("blocker", 2, 2)).await.unwrap();
    event_for(&mut events, "blocker", |p| matches!(p, JobPhase::Running { .. })).await;
    let job = sleeper("j-3", 5, 1);
    assert_eq!(backend.copy(4, &job).await.unwrap(), CopyAdmission::Queued);
    let granted = Assignment { fencing_token: 6, ..job };
    assert!(matches!(backend.grant(4, &granted).await.unwrap(), Admission::Queued { .. }));
    assert_eq!(api.objects(fake::BATCH_JOBS).len(), 2, "no second Job: the copy is the binding");
    backend.cancel("blocker", 2).await.unwrap();
    let running = event_for(&mut events, "j-3", |p| matches!(p, JobPhase::Running { .. })).await;
    assert_eq!(running.fencing_token, 6);
}

#[tokio::test]
async fn dropped_taken_back_and_orphaned_copies_are_deleted() {
    let api = kueue_member().await;
    let (backend, _events) = backend_with(&api, lock_config()).await;
    let mut copies = backend.copy_events().expect("the copy events");
    let job = sleeper("j-2", 5, 1);

    assert_eq!(backend.copy(7, &job).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(next_copy_event(&mut copies).await, CopyEvent::Ready { job_id: "j-2".into(), copy_token: 7 });
    backend.drop_copy("j-2", 8).await.unwrap();
    assert!(job_named(&api, &objects::copy_name("j-2", 7)).is_some(), "dropping another copy changes nothing");
    backend.drop_copy("j-2", 7).await.unwrap();
    backend.drop_copy("j-2", 7).await.unwrap();
    assert!(job_named(&api, &objects::copy_name("j-2", 7)).is_none(), "a dropped copy's Job is deleted");

    // Kueue takes back a ready copy's reservation (here: another check of its ClusterQueue
    // rejects it): the copy is deleted and reported dropped.
    assert_eq!(backend.copy(8, &job).await.unwrap(), CopyAdmission::Queued);
    assert_eq!(next_copy_event(&mut copies).await, CopyEvent::Ready { job_id: "j-2".into(), copy_token: 8 });
    let name = objects::copy_name("j-2", 8);
    let mut workload = workload_of(&api, &name).unwrap();
    workload["status"]["admissionChecks"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "provisioning", "state": "Rejected", "message": "no capacity", "lastTransitionTime": "2026-12-04T00:00:00Z"}));
    api.put(fake::WORKLOADS, workload);
    let CopyEvent::Dropped { job_id, copy_token, reason } = next_copy_event(&mut copies).await else {
        panic!("a copy Kueue took the reservation back from is dropped")
    };
    assert_eq!((job_id.as_str(), copy_token), ("j-2", 8));
    assert!(reason.contains("took back the quota"), "{reason}");
    assert!(job_named(&api, &name).is_none(), "and deleted");

    // A copy left by a stopped backend is deleted by the next one.
    assert_eq!(backend.copy(9, &job).await.unwrap(), CopyAdmission::Queued);
    drop(backend);
    let (_again, _events) = backend_with(&api, lock_config()).await;
    assert!(job_named(&api, &objects::copy_name("j-2", 9)).is_none(), "the orphan copy is gone");
}

/// Another team's workload in a ClusterQueue that lists the check is let through at the next
/// pressure report; one still waiting for quota is left for Kueue.
#[tokio::test]
async fn other_namespaces_workloads_pass_the_check_once_kueue_reserves_their_quota() {
    let api = kueue_member().await;
    let (backend, _events) = backend_with(&api, lock_config()).await;
    let workload = |name: &str, reserved: &str| {
        json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": "team-b"},
            "spec": {"queueName": "team-b-lq", "podSets": [{"name": "main", "count": 1}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": reserved, "reason": "r", "message": "m"}],
                "admissionChecks": [{"name": CHECK, "state": "Pending", "message": "",
                    "lastTransitionTime": "2026-12-04T00:00:00Z"}]}})
    };
    api.put(fake::WORKLOADS, workload("reserved", "True"));
    api.put(fake::WORKLOADS, workload("waiting", "False"));
    backend.pressure().await.unwrap();
    let state = |name: &str| check_of(&api.get(fake::WORKLOADS, "team-b", name).unwrap());
    let (ready, message) = state("reserved");
    assert_eq!((ready.as_str(), message.as_str()), ("Ready", "not a Meridian sibling copy"));
    assert_eq!(state("waiting").0, "Pending", "not reserved yet: Kueue has not asked");
}

#[tokio::test]
async fn copies_need_the_start_lock_check_of_meridians_controller() {
    let api = FakeApi::start(fixture("member"), Value::Array(Vec::new())).await;
    let (plain, _events) = backend_with(&api, config(Mode::Kueue)).await;
    let refused = plain.copy(1, &sleeper("j-4", 1, 1)).await.unwrap();
    let CopyAdmission::Refused { reason, unsupported: true } = refused else { panic!("{refused:?}") };
    assert!(reason.contains("kubernetes.startLockCheck"), "{reason}");
    assert!(api.objects(fake::BATCH_JOBS).is_empty(), "nothing of it was created");

    let start = || async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        match KubernetesBackend::with_client(api.client(), lock_config(), "k8s-test".into(), tx).await {
            Ok(_) => panic!("a start-up error"),
            Err(error) => error.to_string(),
        }
    };
    let missing = start().await;
    assert!(
        missing.contains("kubernetes.startLockCheck") && missing.contains("no Kueue AdmissionCheck `start-lock`"),
        "{missing}"
    );
    api.put(CHECKS, check_object("kueue.x-k8s.io/provisioning-request"));
    let foreign = start().await;
    assert!(foreign.contains("belongs to controller `kueue.x-k8s.io/provisioning-request`"), "{foreign}");
}

/// The shared suite with the start lock on: bindings pass the check, copies queue behind it.
#[tokio::test]
async fn the_kueue_mode_with_the_start_lock_passes_the_conformance_suite() {
    let api = kueue_member().await;
    conformance::run(subject_with(api, lock_config()).await.1).await;
}
