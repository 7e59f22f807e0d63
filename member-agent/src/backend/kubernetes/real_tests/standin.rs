//! The stand-in for Volcano's controller and scheduler and the kubelet that the real-API-server
//! tests run against (see [`StandIn`]).

use super::*;

/// Plays Volcano's job controller and scheduler and the kubelet against the real API server:
/// every `tick` it gives each new Volcano Job a PodGroup; starts a gang whose pods all fit on
/// the nodes' free GPUs (pods named `<job>-<task>-<index>` from the task template, bound to
/// nodes, with Volcano's `volcano.sh/task-index` annotation, marked Running through
/// `pods/status`; the Job Running through `jobs/status`; the PodGroup Running), else marks the
/// PodGroup unschedulable with a reason; ends a `sh -c '…; exit N'` job one tick after it
/// started (pods Succeeded or Failed with exit code N, the Job Completed or Failed); and deletes
/// the pods and PodGroups whose Job is gone, as the garbage collector would.
pub(super) struct StandIn {
    task: JoinHandle<()>,
}

impl StandIn {
    pub(super) fn start(admin: kube::Client) -> Self {
        let task = tokio::spawn(async move {
            let mut started: BTreeMap<String, u32> = BTreeMap::new();
            loop {
                if let Err(error) = stand_in_tick(&admin, &mut started).await {
                    eprintln!("stand-in: {error}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { task }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn gpus_of(pod: &Pod) -> f64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get(inventory::GPU_RESOURCE).map(inventory::quantity))
        .unwrap_or(0.0)
}

fn phase_of_pod(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

async fn stand_in_tick(admin: &kube::Client, started: &mut BTreeMap<String, u32>) -> kube::Result<()> {
    let jobs_api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &job_resource(Mode::Volcano));
    let groups_api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &group_resource(Mode::Volcano));
    let pods_api: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let nodes_api: Api<Node> = Api::all(admin.clone());
    let jobs: Vec<Value> = jobs_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|j| serde_json::to_value(j).unwrap())
        .collect();
    let groups: Vec<Value> = groups_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|g| serde_json::to_value(g).unwrap())
        .collect();
    let pods = pods_api.list(&ListParams::default()).await?.items;
    let uids: Vec<&str> = jobs.iter().filter_map(|j| j["metadata"]["uid"].as_str()).collect();
    let owner = |meta: &Value| -> Option<String> { meta["ownerReferences"][0]["uid"].as_str().map(String::from) };

    // Garbage collection of what a deleted Job owned.
    for group in &groups {
        if owner(&group["metadata"]).is_some_and(|uid| !uids.contains(&uid.as_str())) {
            let _ = groups_api
                .delete(group["metadata"]["name"].as_str().unwrap_or_default(), &DeleteParams::default())
                .await;
        }
    }
    for pod in &pods {
        let owned_by = pod.metadata.owner_references.iter().flatten().next().map(|r| r.uid.clone());
        if owned_by.is_some_and(|uid| !uids.contains(&uid.as_str())) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = pods_api
                .delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
                .await;
        }
    }

    // Free GPUs per node: allocatable minus the pods bound there that have not finished.
    let mut free: BTreeMap<String, f64> = BTreeMap::new();
    for node in nodes_api.list(&ListParams::default()).await?.items {
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref()?.get(inventory::GPU_RESOURCE).map(inventory::quantity))
            .unwrap_or(0.0);
        free.insert(node.metadata.name.unwrap_or_default(), allocatable);
    }
    let all_pods: Api<Pod> = Api::all(admin.clone());
    for pod in all_pods.list(&ListParams::default()).await?.items {
        if matches!(phase_of_pod(&pod), "Succeeded" | "Failed") {
            continue;
        }
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *free.entry(node).or_default() -= gpus_of(&pod);
        }
    }

    for job in &jobs {
        let name = job["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let phase = job["status"]["state"]["phase"].as_str().unwrap_or("Pending").to_owned();
        let task = &job["spec"]["tasks"][0];
        let replicas = task["replicas"].as_u64().unwrap_or(1) as u32;
        let template = &task["template"];
        let per_pod = per_pod_gpus(template);
        let group_name = format!("{name}-{}", &uid[..8.min(uid.len())]);
        let owner_ref = json!([{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": name, "uid": uid,
                                "controller": true, "blockOwnerDeletion": true}]);
        if !groups.iter().any(|g| owner(&g["metadata"]).as_deref() == Some(uid.as_str())) {
            let group = json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": group_name, "namespace": NS, "ownerReferences": owner_ref},
                "spec": {"minMember": replicas, "queue": job["spec"]["queue"],
                         "minResources": {inventory::GPU_RESOURCE: format!("{}", per_pod * f64::from(replicas))}},
                "status": {"phase": "Pending"},
            });
            groups_api.create(&PostParams::default(), &serde_json::from_value(group).unwrap()).await?;
        }
        match phase.as_str() {
            "Pending" => {
                // Place the gang: each replica on a node with room, or none at all.
                let mut room = free.clone();
                let mut placed = Vec::new();
                for _ in 0..replicas {
                    let Some((node, left)) = room.iter_mut().find(|(_, left)| **left >= per_pod) else { break };
                    *left -= per_pod;
                    placed.push(node.clone());
                }
                if placed.len() < replicas as usize {
                    let condition = json!({"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                        "message": format!("{}/{replicas} tasks in gang unschedulable: insufficient {}",
                                           replicas as usize - placed.len(), inventory::GPU_RESOURCE)});
                    let patch = json!({"status": {"phase": "Pending", "conditions": [condition]}});
                    groups_api.patch(&group_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    continue;
                }
                free = room;
                for (index, node) in placed.iter().enumerate() {
                    let pod_name = format!("{name}-{}-{index}", task["name"].as_str().unwrap_or("main"));
                    let mut meta = template["metadata"].clone();
                    meta["name"] = json!(pod_name);
                    meta["namespace"] = json!(NS);
                    meta["ownerReferences"] = owner_ref.clone();
                    meta["annotations"]["volcano.sh/task-index"] = json!(index.to_string());
                    meta["annotations"]["scheduling.k8s.io/group-name"] = json!(group_name);
                    let mut spec = template["spec"].clone();
                    spec["nodeName"] = json!(node);
                    // No token controller runs here to give the namespace's ServiceAccount a
                    // token to mount.
                    spec["automountServiceAccountToken"] = json!(false);
                    spec["hostname"] = json!(pod_name);
                    spec["subdomain"] = json!(name);
                    let pod: Pod = serde_json::from_value(
                        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}),
                    )
                    .unwrap();
                    pods_api.create(&PostParams::default(), &pod).await?;
                    let running = json!({"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}});
                    pods_api.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(&running)).await?;
                }
                let patch = json!({"status": {"phase": "Running", "running": replicas, "conditions": []}});
                groups_api.patch(&group_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                let patch = json!({"status": {"state": {"phase": "Running"}, "running": replicas}});
                jobs_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                started.insert(uid, 0);
            }
            "Running" => {
                let ticks = started.entry(uid.clone()).or_insert(0);
                *ticks += 1;
                let Some((_, code)) = script_of(template).filter(|_| *ticks > 1) else { continue };
                let (pod_phase, job_phase) = if code == 0 { ("Succeeded", "Completed") } else { ("Failed", "Failed") };
                for pod in pods.iter().filter(|p| p.metadata.owner_references.iter().flatten().any(|r| r.uid == uid)) {
                    let terminated = json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }});
                    let status = json!({"status": {"phase": pod_phase, "containerStatuses": [{
                        "name": objects::TASK_NAME, "image": template["spec"]["containers"][0]["image"], "imageID": "",
                        "ready": false, "restartCount": 0, "state": {"terminated": terminated}}]}});
                    let pod_name = pod.metadata.name.clone().unwrap_or_default();
                    pods_api.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(&status)).await?;
                }
                let patch = json!({"status": {"state": {"phase": job_phase}}});
                jobs_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                started.remove(&uid);
            }
            _ => {}
        }
    }
    Ok(())
}
