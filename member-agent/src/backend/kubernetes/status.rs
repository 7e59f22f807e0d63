//! Object status → [`JobPhase`]: Volcano Job `status.state.phase`, batch Job conditions (a
//! suspended Job waits for Kueue), with the reasons a gang waits (PodGroup conditions, Kueue
//! Workload conditions, pods' `PodScheduled=False`) and the exit codes of failed pods.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::backend::JobPhase;

/// The phase of a Volcano Job, given its pods and PodGroup.
pub fn volcano_phase(job: &Value, pods: &[Pod], pod_group: Option<&Value>) -> JobPhase {
    let state = &job["status"]["state"];
    let phase = state["phase"].as_str().unwrap_or("Pending");
    let said = |default: &str| {
        let message = state["message"].as_str().or_else(|| state["reason"].as_str()).unwrap_or_default();
        if message.is_empty() { default.to_string() } else { format!("{default}: {message}") }
    };
    if !matches!(phase, "Completing" | "Completed")
        && let Some(message) = preempted_pod(pods)
    {
        return JobPhase::Preempted { message };
    }
    match phase {
        "Running" => JobPhase::Running { nodes: nodes_of(pods) },
        "Completing" | "Completed" => JobPhase::Succeeded { message: "Volcano job completed".into() },
        "Aborting" | "Aborted" | "Terminating" | "Terminated" | "Failed" => {
            JobPhase::Failed { message: failure_message(&said(&format!("Volcano job {}", phase.to_lowercase())), pods) }
        }
        "Restarting" => JobPhase::Pending { reason: said("Volcano is restarting the job") },
        _ => {
            let queue = job["spec"]["queue"].as_str().unwrap_or("default");
            JobPhase::Pending { reason: volcano_wait_reason(queue, pods, pod_group) }
        }
    }
}

/// Why a Volcano gang waits: the PodGroup's `Unschedulable` condition, else a pod's scheduling
/// failure, else that it is queued.
fn volcano_wait_reason(queue: &str, pods: &[Pod], pod_group: Option<&Value>) -> String {
    if let Some(group) = pod_group {
        let unschedulable = conditions(group).find(|c| c["type"] == "Unschedulable" && c["status"] == "True");
        if let Some(condition) = unschedulable {
            return format!("waiting in Volcano queue `{queue}`: {}", condition_text(condition));
        }
    }
    if let Some(reason) = pod_wait_reason(pods) {
        return format!("waiting in Volcano queue `{queue}`: {reason}");
    }
    format!("waiting in Volcano queue `{queue}` for the gang to be scheduled")
}

/// The phase of a `batch/v1` Job run through Kueue, given its pods and Workload.
pub fn batch_phase(job: &Value, pods: &[Pod], workload: Option<&Value>) -> JobPhase {
    let condition_true = |kind: &str| true_condition(job, kind);
    if condition_true("Complete").is_some() || condition_true("SuccessCriteriaMet").is_some() {
        return JobPhase::Succeeded { message: "Kubernetes job completed".into() };
    }
    if let Some(failed) = condition_true("Failed").or_else(|| condition_true("FailureTarget")) {
        let base = format!("Kubernetes job failed: {}", condition_text(failed));
        return JobPhase::Failed { message: failure_message(&base, pods) };
    }
    let evicted = workload.and_then(|w| {
        conditions(w).find(|c| c["type"] == "Evicted" && c["status"] == "True" && c["reason"] == "Preempted")
    });
    if let Some(condition) = evicted {
        return JobPhase::Preempted { message: format!("preempted by Kueue: {}", condition_text(condition)) };
    }
    let queue = job["metadata"]["labels"][super::objects::KUEUE_QUEUE_LABEL].as_str().unwrap_or("default");
    if job["spec"]["suspend"] == Value::Bool(true) {
        let reason = workload
            .and_then(|w| {
                conditions(w)
                    .find(|c| (c["type"] == "QuotaReserved" || c["type"] == "Admitted") && c["status"] == "False")
                    .map(condition_text)
            })
            .unwrap_or_else(|| "waiting for Kueue admission".into());
        return JobPhase::Pending { reason: format!("suspended in Kueue queue `{queue}`: {reason}") };
    }
    let wanted = job["spec"]["parallelism"].as_u64().unwrap_or(1);
    let running = pods.iter().filter(|p| pod_phase(p) == "Running").count() as u64;
    if running >= wanted {
        return JobPhase::Running { nodes: nodes_of(pods) };
    }
    let reason = pod_wait_reason(pods).unwrap_or_else(|| format!("{running} of {wanted} pods running"));
    JobPhase::Pending { reason: format!("admitted by Kueue queue `{queue}`; starting: {reason}") }
}

/// A pod the scheduler evicted to make room (its `DisruptionTarget` condition says
/// `PreemptionByScheduler`, which kube-scheduler and Volcano's preemption set), as a message.
fn preempted_pod(pods: &[Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let conditions = pod.status.as_ref()?.conditions.as_ref()?;
        let condition = conditions.iter().find(|c| {
            c.type_ == "DisruptionTarget" && c.status == "True" && c.reason.as_deref() == Some("PreemptionByScheduler")
        })?;
        let name = pod.metadata.name.as_deref().unwrap_or("a pod");
        Some(format!(
            "pod {name} was preempted by the scheduler{}",
            condition.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
        ))
    })
}

fn conditions(object: &Value) -> impl Iterator<Item = &Value> {
    object["status"]["conditions"].as_array().into_iter().flatten()
}

/// The condition of type `kind` of an object's status, when it is `True`.
pub(super) fn true_condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    conditions(object).find(|c| c["type"] == kind && c["status"] == "True")
}

/// `Reason: message` of a condition, whichever parts it has.
fn condition_text(condition: &Value) -> String {
    let reason = condition["reason"].as_str().unwrap_or_default();
    let message = condition["message"].as_str().unwrap_or_default();
    match (reason.is_empty(), message.is_empty()) {
        (false, false) => format!("{reason}: {message}"),
        (true, false) => message.into(),
        (false, true) => reason.into(),
        (true, true) => "no reason given".into(),
    }
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// The first pod's `PodScheduled=False` reason and message.
fn pod_wait_reason(pods: &[Pod]) -> Option<String> {
    pods.iter().find_map(|pod| {
        let conditions = pod.status.as_ref()?.conditions.as_ref()?;
        let c = conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        Some(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("no message")
        ))
    })
}

/// Pod annotations that carry a replica's index: Volcano's, and an Indexed Job's.
pub const INDEX_ANNOTATIONS: [&str; 2] = ["volcano.sh/task-index", "batch.kubernetes.io/job-completion-index"];

/// Nodes of the job's pods, one entry per replica, in replica order: `nodes[i]` runs the
/// replica whose `MERIDIAN_REPLICA` is `i` (the job contract). The index is the pod's
/// [`INDEX_ANNOTATIONS`] value, else the number its name ends with (`<job>-main-3`, `<job>-3`);
/// pods without either come last, by name.
pub fn nodes_of(pods: &[Pod]) -> Vec<String> {
    let mut nodes: Vec<(Option<u32>, String, String)> = pods
        .iter()
        .filter(|p| pod_phase(p) != "Pending" || p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let name = p.metadata.name.clone().unwrap_or_default();
            Some((replica_index(p), name, node))
        })
        .collect();
    nodes.sort_by(|a, b| (a.0.is_none(), a.0, &a.1).cmp(&(b.0.is_none(), b.0, &b.1)));
    nodes.into_iter().map(|(_, _, node)| node).collect()
}

/// A pod's replica index: its index annotation, else the number after the last `-` of its name.
fn replica_index(pod: &Pod) -> Option<u32> {
    let annotations = pod.metadata.annotations.as_ref();
    INDEX_ANNOTATIONS
        .iter()
        .find_map(|key| annotations?.get(*key)?.parse().ok())
        .or_else(|| pod.metadata.name.as_deref()?.rsplit_once('-')?.1.parse().ok())
}

/// `base`, plus the exit codes of containers that ended with one other than 0.
fn failure_message(base: &str, pods: &[Pod]) -> String {
    let mut exits = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.as_deref().unwrap_or("pod");
        for status in pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()) {
            let Some(terminated) = status.state.as_ref().and_then(|s| s.terminated.as_ref()) else { continue };
            if terminated.exit_code != 0 {
                let why = terminated.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                exits.push(format!("pod `{name}` exited with code {}{why}", terminated.exit_code));
            }
        }
        let reason = pod.status.as_ref().and_then(|s| s.reason.as_deref());
        if let Some(reason) = reason.filter(|_| exits.is_empty() && pod_phase(pod) == "Failed") {
            exits.push(format!("pod `{name}` failed: {reason}"));
        }
    }
    if exits.is_empty() { base.to_string() } else { format!("{base}; {}", exits.join("; ")) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn running_pod(name: &str, node: &str) -> Pod {
        pod(
            json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running"}}),
        )
    }

    fn failed_pod(name: &str, code: i32) -> Pod {
        pod(json!({"metadata": {"name": name}, "spec": {"nodeName": "n1", "containers": []}, "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]
        }}))
    }

    fn vcjob(phase: &str) -> Value {
        json!({"spec": {"queue": "team"}, "status": {"state": {"phase": phase}}})
    }

    #[test]
    fn nodes_are_listed_in_replica_order_by_annotation_then_name() {
        let with_index = |name: &str, node: &str, key: &str, index: &str| {
            let mut pod = running_pod(name, node);
            pod.metadata.annotations = Some([(key.to_string(), index.to_string())].into());
            pod
        };
        // Names alone: replica 10 after replica 2 (not string order), on nodes whose names sort
        // the other way.
        let pods = [running_pod("j-main-10", "a"), running_pod("j-main-2", "z"), running_pod("j-main-0", "m")];
        assert_eq!(nodes_of(&pods), ["m", "z", "a"]);
        // The annotation wins over the name.
        let volcano = [
            with_index("x-first", "n2", INDEX_ANNOTATIONS[0], "1"),
            with_index("x-second", "n1", INDEX_ANNOTATIONS[0], "0"),
        ];
        assert_eq!(nodes_of(&volcano), ["n1", "n2"]);
        let indexed = [
            with_index("k-1-abcde", "n9", INDEX_ANNOTATIONS[1], "1"),
            with_index("k-0-fghij", "n8", INDEX_ANNOTATIONS[1], "0"),
        ];
        assert_eq!(nodes_of(&indexed), ["n8", "n9"]);
    }

    #[test]
    fn volcano_phases_map_to_job_phases() {
        let pods = [running_pod("p-1", "gpu-b"), running_pod("p-0", "gpu-a")];
        assert_eq!(
            volcano_phase(&vcjob("Running"), &pods, None),
            JobPhase::Running { nodes: vec!["gpu-a".into(), "gpu-b".into()] }
        );
        assert!(matches!(volcano_phase(&vcjob("Completed"), &[], None), JobPhase::Succeeded { .. }));
        for phase in ["Aborted", "Terminated", "Failed", "Terminating"] {
            assert!(matches!(volcano_phase(&vcjob(phase), &[], None), JobPhase::Failed { .. }), "{phase}");
        }
        assert!(matches!(volcano_phase(&json!({}), &[], None), JobPhase::Pending { .. }));
    }

    #[test]
    fn a_failed_volcano_job_names_the_exit_code() {
        let JobPhase::Failed { message } = volcano_phase(&vcjob("Terminated"), &[failed_pod("p-0", 3)], None) else {
            panic!("expected failed")
        };
        assert!(message.contains("exited with code 3"), "{message}");
        assert!(message.contains("p-0"), "{message}");
    }

    #[test]
    fn a_pending_gang_says_why_from_the_pod_group_or_its_pods() {
        let group = json!({"status": {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True",
            "reason": "NotEnoughResources", "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}});
        let JobPhase::Pending { reason } = volcano_phase(&vcjob("Pending"), &[], Some(&group)) else { panic!() };
        assert!(reason.contains("queue `team`") && reason.contains("2 Insufficient nvidia.com/gpu"), "{reason}");
        let waiting = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "node(s) didn't match selector"}]}}));
        let JobPhase::Pending { reason } = volcano_phase(&vcjob("Pending"), &[waiting], None) else { panic!() };
        assert!(reason.contains("Unschedulable: node(s) didn't match selector"), "{reason}");
    }

    #[test]
    fn batch_job_conditions_and_suspension_map_to_job_phases() {
        let complete = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert!(matches!(batch_phase(&complete, &[], None), JobPhase::Succeeded { .. }));
        let failed =
            json!({"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}});
        let JobPhase::Failed { message } = batch_phase(&failed, &[failed_pod("p", 3)], None) else { panic!() };
        assert!(message.contains("BackoffLimitExceeded") && message.contains("code 3"), "{message}");

        let suspended = json!({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq"}}, "spec": {"suspend": true, "parallelism": 2}});
        let workload = json!({"status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
            "message": "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"}]}});
        let JobPhase::Pending { reason } = batch_phase(&suspended, &[], Some(&workload)) else { panic!() };
        assert!(reason.contains("`lq`") && reason.contains("insufficient quota"), "{reason}");

        let resumed = json!({"spec": {"suspend": false, "parallelism": 2}});
        assert!(matches!(batch_phase(&resumed, &[running_pod("a", "n1")], None), JobPhase::Pending { .. }));
        assert_eq!(
            batch_phase(&resumed, &[running_pod("a", "n1"), running_pod("b", "n2")], None),
            JobPhase::Running { nodes: vec!["n1".into(), "n2".into()] }
        );
    }

    #[test]
    fn preemption_by_the_scheduler_or_kueue_maps_to_preempted() {
        let evicted = pod(json!({"metadata": {"name": "p-0"}, "status": {"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "for vip"}]}}));
        let JobPhase::Preempted { message } = volcano_phase(&vcjob("Restarting"), std::slice::from_ref(&evicted), None)
        else {
            panic!("a preempted pod makes the Volcano job preempted")
        };
        assert_eq!(message, "pod p-0 was preempted by the scheduler: for vip");
        assert!(matches!(volcano_phase(&vcjob("Completed"), &[evicted], None), JobPhase::Succeeded { .. }));

        let job = json!({"spec": {"suspend": true, "parallelism": 1}});
        let workload = json!({"status": {"conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a higher priority Workload"}]}});
        assert!(matches!(batch_phase(&job, &[], Some(&workload)), JobPhase::Preempted { .. }));
    }
}
