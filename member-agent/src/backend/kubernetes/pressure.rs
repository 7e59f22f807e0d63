//! Queue pressure: pending and running PodGroups (Volcano) or Workloads (Kueue), per queue.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use meridian_proto::inventory::{QueueLoad, QueuePressure};
use serde_json::Value;

use super::config::Mode;
use super::inventory;

/// Queue load from PodGroups (Volcano) or Workloads (Kueue). Weights are not read from the
/// cluster's queue objects: every queue reports weight 1.
pub fn pressure_of(groups: &[Value], mode: Mode) -> QueuePressure {
    let mut queues = BTreeMap::<String, QueueLoad>::new();
    for group in groups {
        let (queue, gpus, pending, running) = match mode {
            Mode::Volcano => {
                let phase = group["status"]["phase"].as_str().unwrap_or("Pending");
                let gpus = group["spec"]["minResources"][inventory::GPU_RESOURCE]
                    .as_str()
                    .map(|q| inventory::quantity(&Quantity(q.into())))
                    .or_else(|| group["spec"]["minResources"][inventory::GPU_RESOURCE].as_f64())
                    .unwrap_or(0.0);
                let queue = group["spec"]["queue"].as_str().unwrap_or("default").to_string();
                (queue, gpus, matches!(phase, "Pending" | "Inqueue"), phase == "Running")
            }
            Mode::Kueue => {
                let has = |kind: &str| {
                    group["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == kind && c["status"] == "True")
                };
                let finished = has("Finished");
                let admitted = has("Admitted") || has("QuotaReserved");
                let queue = group["spec"]["queueName"].as_str().unwrap_or("default").to_string();
                (queue, workload_gpus(group), !finished && !admitted, !finished && admitted)
            }
        };
        if !pending && !running {
            continue;
        }
        let load = queues.entry(queue.clone()).or_insert_with(|| QueueLoad {
            queue: queue.into(),
            weight: 1.0,
            pending_jobs: 0,
            pending_gpus: 0,
            running_gpus: 0,
        });
        let gpus = gpus.clamp(0.0, f64::from(u32::MAX)) as u32;
        if pending {
            load.pending_jobs += 1;
            load.pending_gpus = load.pending_gpus.saturating_add(gpus);
        } else {
            load.running_gpus = load.running_gpus.saturating_add(gpus);
        }
    }
    QueuePressure {
        queues: queues.into_values().collect(),
        releases: Vec::new(),
        estimated_wait_secs: 0,
        preemptible: Vec::new(),
    }
}

/// GPUs a Workload asks for: count × GPUs of each pod set's containers.
fn workload_gpus(workload: &Value) -> f64 {
    let mut total = 0.0;
    for set in workload["spec"]["podSets"].as_array().into_iter().flatten() {
        let count = set["count"].as_f64().unwrap_or(1.0);
        let pod: Pod =
            serde_json::from_value(serde_json::json!({ "spec": set["template"]["spec"].clone() })).unwrap_or_default();
        total += count * inventory::pod_requests(&pod).get(inventory::GPU_RESOURCE).copied().unwrap_or(0.0);
    }
    total
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pending_and_running_pod_groups_count_per_queue() {
        let groups = [
            json!({"spec": {"queue": "a", "minResources": {"nvidia.com/gpu": "16"}}, "status": {"phase": "Running"}}),
            json!({"spec": {"queue": "a", "minResources": {"nvidia.com/gpu": "4"}}, "status": {"phase": "Inqueue"}}),
            json!({"spec": {"queue": "b", "minResources": {"nvidia.com/gpu": "8"}}, "status": {"phase": "Pending"}}),
            json!({"spec": {"queue": "b", "minResources": {"nvidia.com/gpu": "8"}}, "status": {"phase": "Completed"}}),
        ];
        let pressure = pressure_of(&groups, Mode::Volcano);
        let loads: Vec<(&str, u32, u32, u32)> =
            pressure.queues.iter().map(|q| (&*q.queue, q.pending_jobs, q.pending_gpus, q.running_gpus)).collect();
        assert_eq!(loads, [("a", 1, 4, 16), ("b", 1, 8, 0)]);
    }

    #[test]
    fn unadmitted_workloads_are_pending_and_finished_ones_do_not_count() {
        let pod_set = |count: u32, gpus: &str| {
            json!([{"name": "main", "count": count, "template": {"spec": {"containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}}])
        };
        let workloads = [
            json!({"spec": {"queueName": "lq", "podSets": pod_set(2, "8")}, "status": {"conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending"}]}}),
            json!({"spec": {"queueName": "lq", "podSets": pod_set(1, "4")}, "status": {"conditions": [
                {"type": "Admitted", "status": "True"}]}}),
            json!({"spec": {"queueName": "lq", "podSets": pod_set(1, "4")}, "status": {"conditions": [
                {"type": "Admitted", "status": "True"}, {"type": "Finished", "status": "True"}]}}),
        ];
        let pressure = pressure_of(&workloads, Mode::Kueue);
        assert_eq!(pressure.queues.len(), 1);
        let lq = &pressure.queues[0];
        assert_eq!((lq.pending_jobs, lq.pending_gpus, lq.running_gpus), (1, 16, 4));
    }
}
