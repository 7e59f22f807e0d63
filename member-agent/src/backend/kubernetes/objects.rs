//! The objects the agent creates: a Volcano Job (volcano mode) or a suspended `batch/v1` Job
//! for Kueue (kueue mode), built as JSON from an [`Assignment`], with the names, labels and
//! annotations that let a restarted agent find them again.

use meridian_proto::selector::Operator;
use std::collections::BTreeMap;

use meridian_proto::job_env::{self, Source};
use meridian_proto::protocol::Assignment;
use serde_json::{Value, json};

use super::config::{KubernetesConfig, Mode};
use super::inventory::{GPU_RESOURCE, MIG_PREFIX, PRODUCT_LABEL};
use super::status::INDEX_ANNOTATIONS;
use crate::backend::fnv32;

/// Label on every object Meridian creates, to list them all.
pub const MANAGED_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_LABEL`].
pub const MANAGED_VALUE: &str = "meridian";
/// Label: the job id (label-safe form; the exact id is in the annotation of the same name).
pub const JOB_ID_KEY: &str = "meridian.io/job-id";
/// Annotation: the binding's fencing token. In Kueue mode the pod template carries it too, and
/// each pod reads `MERIDIAN_FENCING_TOKEN` from it (the grant of a sibling copy writes it).
pub const TOKEN_KEY: &str = "meridian.io/fencing-token";
/// Annotation of a sibling copy (in place of [`TOKEN_KEY`], so no agent adopts it as a
/// binding): the copy's token.
pub const COPY_KEY: &str = "meridian.io/copy-token";
/// Label Kueue reads to pick the LocalQueue of a Job.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Name of the single task / container.
pub const TASK_NAME: &str = "main";
/// Pod label: the object name of the binding, which a Kueue job's headless Service selects.
pub const BINDING_LABEL: &str = "meridian.io/binding";
/// Pod annotation: the job's `runtime.estimate` in whole seconds, from which a start quote
/// expects the pod's resources back (its start time + the estimate).
pub const ESTIMATE_KEY: &str = "meridian.io/runtime-estimate-seconds";

/// Where the job's replicas must land: the GPU resource to ask for, and the product labels
/// of nodes with the job's GPU type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPlacement {
    /// `nvidia.com/gpu`, or the MIG resource (`nvidia.com/mig-1g.10gb`).
    pub resource: String,
    /// Product label values to select; empty: any node.
    pub products: Vec<String>,
}

impl GpuPlacement {
    /// The resource a GPU type is asked for with: MIG types (`a100-80g.1g.10gb`) use their
    /// profile's resource.
    pub fn for_type(gpu_type: Option<&str>, products: Vec<String>) -> Self {
        let resource = match gpu_type.and_then(|t| t.split_once('.')) {
            Some((_, profile)) => format!("{MIG_PREFIX}{profile}"),
            None => GPU_RESOURCE.to_string(),
        };
        Self { resource, products }
    }
}

/// The label-safe form of a job id: lowercase letters, digits, `-` and `.`, at most 28.
pub fn label_value(job_id: &str) -> String {
    let mut safe: String = job_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    if safe != job_id || safe.len() > 28 {
        // Two ids that differ only in what was replaced must not collide.
        safe.truncate(19);
        safe = format!("{}-{:08x}", safe.trim_matches(['-', '.']), fnv32(job_id));
    }
    safe
}

/// The object name of a binding: DNS-safe, from the job id and token, at most 52 characters so
/// pod names derived from it (`<name>-main-<index>`) stay valid labels.
pub fn object_name(job_id: &str, fencing_token: u64) -> String {
    name_for(job_id, 't', fencing_token)
}

/// `m-<job>-<kind><token>`, with the job id in its DNS-safe form.
fn name_for(job_id: &str, kind: char, token: u64) -> String {
    let id = label_value(job_id).replace('.', "-");
    let id = id.trim_matches('-');
    format!("m-{id}-{kind}{token}")
}

/// The object name of sibling copy `copy_token` of a job (Kueue mode): it keeps this name
/// when its grant makes it a binding.
pub fn copy_name(job_id: &str, copy_token: u64) -> String {
    name_for(job_id, 'c', copy_token)
}

/// What an object is to Meridian, and its object name: a binding (its fencing token) or a
/// sibling copy (no fencing token; [`kueue_copy`] adds its copy token).
#[derive(Debug, Clone, Copy)]
struct Role<'a> {
    name: &'a str,
    /// The binding's fencing token; None for a copy.
    binding: Option<u64>,
}

impl<'a> Role<'a> {
    /// Binding `token`, named `name`.
    fn binding(name: &'a str, token: u64) -> Self {
        Self { name, binding: Some(token) }
    }

    /// A sibling copy (its token is in its name and [`COPY_KEY`]), named `name`.
    fn copy(name: &'a str) -> Self {
        Self { name, binding: None }
    }
}

/// Builds the object for `job` in the configured mode, on the member cluster named `cluster`.
pub fn build(job: &Assignment, config: &KubernetesConfig, gpu: &GpuPlacement, cluster: &str) -> Value {
    match config.mode {
        Mode::Volcano => volcano_job(job, config, gpu, cluster),
        Mode::Kueue => kueue_job(job, config, gpu, cluster),
    }
}

/// Sibling copy `copy_token` of `job` (Kueue mode): the job's own suspended Job, named
/// [`copy_name`], annotated [`COPY_KEY`] and without a fencing token; its pods (none until its
/// grant) read the token from the annotation the grant writes.
pub fn kueue_copy(
    job: &Assignment,
    copy_token: u64,
    config: &KubernetesConfig,
    gpu: &GpuPlacement,
    cluster: &str,
) -> Value {
    let name = copy_name(&job.job_id, copy_token);
    let mut object = kueue_job_as(job, Role::copy(&name), config, gpu, cluster);
    object["metadata"]["annotations"][COPY_KEY] = json!(copy_token.to_string());
    object
}

/// The host every replica reaches replica 0 at: its pod's DNS name under the job's headless
/// Service (Volcano's `svc` plugin names pods `<job>-<task>-<index>`; an Indexed Job's pods have
/// host name `<job>-<index>`), in the configured namespace.
pub fn coordinator_host(job: &Assignment, config: &KubernetesConfig) -> String {
    coordinator_host_of(&object_name(&job.job_id, job.fencing_token), config)
}

fn coordinator_host_of(name: &str, config: &KubernetesConfig) -> String {
    let pod = match config.mode {
        Mode::Volcano => format!("{name}-{TASK_NAME}-0"),
        Mode::Kueue => format!("{name}-0"),
    };
    format!("{pod}.{name}.{}.svc", config.namespace)
}

/// The pod annotation that holds a replica's index in `mode`.
fn index_annotation(mode: Mode) -> &'static str {
    match mode {
        Mode::Volcano => INDEX_ANNOTATIONS[0],
        Mode::Kueue => INDEX_ANNOTATIONS[1],
    }
}

/// The container's environment: the job contract's variables ([`job_env`]), then the payload's
/// `env`. The replica index comes from the pod's index annotation (downward API); every other
/// per-replica variable refers to it as `$(MERIDIAN_REPLICA)`, which Kubernetes expands because
/// it is defined earlier in the list.
fn container_env(job: &Assignment, role: Role<'_>, config: &KubernetesConfig, cluster: &str) -> Vec<Value> {
    let facts = job_env::Facts {
        job_id: job.job_id.clone(),
        fencing_token: role.binding.unwrap_or_default(),
        cluster: cluster.to_owned(),
        replicas: job.spec.gang.replicas,
        gpus_per_replica: job.spec.gang.resources.gpus,
        coordinator_host: coordinator_host_of(role.name, config),
        coordinator_port: config.coordinator_port,
    };
    let annotation = index_annotation(config.mode);
    let contract = job_env::variables(&job.spec.payload).into_iter().map(|variable| match variable.source {
        Source::Replica if variable.name == job_env::REPLICA_VAR => json!({
            "name": variable.name,
            "valueFrom": {"fieldRef": {"fieldPath": format!("metadata.annotations['{annotation}']")}},
        }),
        Source::Replica => json!({"name": variable.name, "value": format!("$({})", job_env::REPLICA_VAR)}),
        // Kueue: from the pod's annotation, which a sibling copy's grant writes before Kueue
        // creates any pod.
        Source::FencingToken if config.mode == Mode::Kueue => json!({
            "name": variable.name,
            "valueFrom": {"fieldRef": {"fieldPath": format!("metadata.annotations['{TOKEN_KEY}']")}},
        }),
        other => json!({"name": variable.name, "value": facts.value(other, 0)}),
    });
    let own = job.spec.payload.env.iter().map(|(k, v)| json!({"name": k, "value": v}));
    contract.chain(own).collect()
}

/// The headless Service that gives a Kueue job's pods their DNS names (`<job>-<index>.<job>`),
/// owned by the Job (uid `job_uid`) so that deleting the Job deletes it. Volcano's `svc` plugin
/// makes its own.
pub fn headless_service(job: &Assignment, name: &str, config: &KubernetesConfig, job_uid: &str) -> Value {
    let mut meta = metadata(job, Role::binding(name, job.fencing_token), config, &[]);
    meta["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid,
        "controller": false, "blockOwnerDeletion": false,
    }]);
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": {BINDING_LABEL: name},
            "ports": [{"name": "coordinator", "port": config.coordinator_port, "protocol": "TCP"}],
        },
    })
}

fn metadata(job: &Assignment, role: Role<'_>, config: &KubernetesConfig, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = BTreeMap::from([
        (MANAGED_LABEL.to_string(), MANAGED_VALUE.to_string()),
        (JOB_ID_KEY.to_string(), label_value(&job.job_id)),
    ]);
    for (k, v) in extra_labels {
        labels.insert((*k).to_string(), (*v).to_string());
    }
    let mut annotations = serde_json::Map::from_iter([(JOB_ID_KEY.to_string(), json!(job.job_id))]);
    if let Some(token) = role.binding {
        annotations.insert(TOKEN_KEY.into(), json!(token.to_string()));
    }
    json!({
        "name": role.name,
        "namespace": config.namespace,
        "labels": labels,
        "annotations": annotations,
    })
}

/// The pod template every replica runs.
fn pod_template(
    job: &Assignment,
    role: Role<'_>,
    config: &KubernetesConfig,
    gpu: &GpuPlacement,
    cluster: &str,
) -> Value {
    let spec = &job.spec;
    let resources = &spec.gang.resources;
    let mut requests = serde_json::Map::new();
    if resources.cpu > 0 {
        requests.insert("cpu".into(), json!(resources.cpu.to_string()));
    }
    if resources.memory_gib > 0 {
        requests.insert("memory".into(), json!(format!("{}Gi", resources.memory_gib)));
    }
    let env = container_env(job, role, config, cluster);
    let mut container = json!({
        "name": TASK_NAME,
        "image": spec.payload.image.clone().unwrap_or_default(),
        "resources": {
            "limits": { gpu.resource.clone(): resources.gpus.to_string() },
            "requests": requests,
        },
    });
    if !spec.payload.command.is_empty() {
        container["command"] = json!(spec.payload.command);
    }
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    let mut pod = json!({
        "restartPolicy": "Never",
        "containers": [container],
    });
    if let Some(limit) = spec.runtime.limit {
        pod["activeDeadlineSeconds"] = json!(limit.0.as_secs().max(1));
    }
    if let Some(class) = config.priority_class_of(spec) {
        pod["priorityClassName"] = json!(class);
    }
    // The GPU product and the job's own `placement.nodeSelector`: exact matches as a
    // nodeSelector, everything else as required node affinity (all must hold).
    let mut selector = serde_json::Map::new();
    let mut expressions = Vec::new();
    match gpu.products.as_slice() {
        [] => {}
        [one] => {
            selector.insert(PRODUCT_LABEL.to_string(), json!(one));
        }
        many => expressions.push(json!({"key": PRODUCT_LABEL, "operator": "In", "values": many})),
    }
    for (key, operator, value) in spec.placement.node_selector().iter() {
        let value = value.unwrap_or_default();
        match operator {
            Operator::Equals if !selector.contains_key(key) => {
                selector.insert(key.to_string(), json!(value));
            }
            Operator::Equals => expressions.push(json!({"key": key, "operator": "In", "values": [value]})),
            Operator::NotEquals => expressions.push(json!({"key": key, "operator": "NotIn", "values": [value]})),
            Operator::Exists => expressions.push(json!({"key": key, "operator": "Exists"})),
            Operator::DoesNotExist => expressions.push(json!({"key": key, "operator": "DoesNotExist"})),
        }
    }
    if !selector.is_empty() {
        pod["nodeSelector"] = Value::Object(selector);
    }
    if !expressions.is_empty() {
        pod["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]
        }}});
    }
    if config.mode == Mode::Kueue {
        // Indexed Job pods are named `<job>-<index>` as hosts; the Service of that name makes
        // them resolvable.
        pod["subdomain"] = json!(role.name);
    }
    let mut annotations =
        serde_json::Map::from_iter([(ESTIMATE_KEY.to_string(), json!(spec.runtime.estimate.0.as_secs().to_string()))]);
    if let (Mode::Kueue, Some(token)) = (config.mode, role.binding) {
        annotations.insert(TOKEN_KEY.into(), json!(token.to_string()));
    }
    json!({
        "metadata": {
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                JOB_ID_KEY: label_value(&job.job_id),
                BINDING_LABEL: role.name,
            },
            "annotations": annotations,
        },
        "spec": pod,
    })
}

/// A Volcano Job: one task of `replicas` pods, gang-scheduled (`minAvailable` = replicas);
/// a failed pod terminates the whole job. Its `svc` plugin makes the headless Service and the
/// pods' host names the coordinator address needs, its `env` plugin `VC_TASK_INDEX`.
pub fn volcano_job(job: &Assignment, config: &KubernetesConfig, gpu: &GpuPlacement, cluster: &str) -> Value {
    let name = object_name(&job.job_id, job.fencing_token);
    let role = Role::binding(&name, job.fencing_token);
    let replicas = job.spec.gang.replicas;
    let mut spec = json!({
        "schedulerName": "volcano",
        "minAvailable": replicas,
        "queue": config.queue_for(&job.spec.tenant),
        "maxRetry": 0,
        "policies": [{"event": "PodFailed", "action": "TerminateJob"}],
        "plugins": {"svc": [], "env": []},
        "tasks": [{
            "name": TASK_NAME,
            "replicas": replicas,
            "template": pod_template(job, role, config, gpu, cluster),
        }],
    });
    if let Some(class) = config.priority_class_of(&job.spec) {
        spec["priorityClassName"] = json!(class);
    }
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": metadata(job, role, config, &[]),
        "spec": spec,
    })
}

/// A `batch/v1` Job for Kueue: created suspended in the tenant's LocalQueue; Kueue resumes it
/// when the whole gang (parallelism = completions = replicas) is admitted. It is an Indexed Job,
/// so each pod knows its replica index (annotation `batch.kubernetes.io/job-completion-index`)
/// and has host name `<job>-<index>`. Kubernetes 1.20 has no Indexed Jobs (alpha in 1.21, beta
/// and on by default in 1.22), but Kueue needs `Job.spec.suspend` (1.21, on by default in 1.22)
/// anyway, so every cluster that runs Kueue has them.
pub fn kueue_job(job: &Assignment, config: &KubernetesConfig, gpu: &GpuPlacement, cluster: &str) -> Value {
    let name = object_name(&job.job_id, job.fencing_token);
    kueue_job_as(job, Role::binding(&name, job.fencing_token), config, gpu, cluster)
}

fn kueue_job_as(
    job: &Assignment,
    role: Role<'_>,
    config: &KubernetesConfig,
    gpu: &GpuPlacement,
    cluster: &str,
) -> Value {
    let replicas = job.spec.gang.replicas;
    let queue = config.queue_for(&job.spec.tenant);
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(job, role, config, &[(KUEUE_QUEUE_LABEL, queue)]),
        "spec": {
            "parallelism": replicas,
            "completions": replicas,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "suspend": true,
            "template": pod_template(job, role, config, gpu, cluster),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use meridian_proto::duration::HumanDuration;

    use super::*;
    use crate::backend::kubernetes::config::PriorityClassRule;
    use crate::backend::kubernetes::tests::assignment;

    fn config(mode: Mode) -> KubernetesConfig {
        KubernetesConfig {
            mode,
            namespace: "ml".into(),
            queues: BTreeMap::from([("vision".into(), "q-vision".into())]),
            priority_classes: vec![PriorityClassRule { min_priority: 70, name: "meridian-high".into() }],
            ..KubernetesConfig::default()
        }
    }

    fn job() -> Assignment {
        let mut job = assignment("j-00000abc", 7, "vision", 2, 4);
        job.spec.priority = 80;
        job.spec.gang.resources.cpu = 16;
        job.spec.gang.resources.memory_gib = 128;
        job.spec.runtime.limit = Some(HumanDuration::from_secs(7200));
        job.spec.payload.command = vec!["python".into(), "train.py".into()];
        job.spec.payload.env = BTreeMap::from([("EPOCHS".into(), "3".into())]);
        job
    }

    fn a100() -> GpuPlacement {
        GpuPlacement::for_type(Some("a100-80g"), vec!["NVIDIA-A100-SXM4-80GB".into()])
    }

    #[test]
    fn a_volcano_job_carries_every_field_the_gang_needs() {
        let object = volcano_job(&job(), &config(Mode::Volcano), &a100(), "k8s-west");
        assert_eq!(object["apiVersion"], "batch.volcano.sh/v1alpha1");
        assert_eq!(object["kind"], "Job");
        let meta = &object["metadata"];
        assert_eq!(meta["name"], "m-j-00000abc-t7");
        assert_eq!(meta["namespace"], "ml");
        assert_eq!(meta["labels"][JOB_ID_KEY], "j-00000abc");
        assert_eq!(meta["labels"][MANAGED_LABEL], "meridian");
        assert_eq!(meta["annotations"][TOKEN_KEY], "7");
        assert_eq!(meta["annotations"][JOB_ID_KEY], "j-00000abc");
        let spec = &object["spec"];
        assert_eq!(spec["schedulerName"], "volcano");
        assert_eq!(spec["minAvailable"], 2);
        assert_eq!(spec["queue"], "q-vision");
        assert_eq!(spec["priorityClassName"], "meridian-high");
        assert_eq!(spec["tasks"].as_array().unwrap().len(), 1);
        let task = &spec["tasks"][0];
        assert_eq!(task["replicas"], 2);
        let pod = &task["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["activeDeadlineSeconds"], 7200);
        assert_eq!(pod["priorityClassName"], "meridian-high");
        assert_eq!(pod["nodeSelector"][PRODUCT_LABEL], "NVIDIA-A100-SXM4-80GB");
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "registry.example/train:1");
        assert_eq!(container["command"], json!(["python", "train.py"]));
        let env = container["env"].as_array().unwrap();
        assert_eq!(env.last(), Some(&json!({"name": "EPOCHS", "value": "3"})), "the payload's env comes last");
        assert_eq!(spec["plugins"], json!({"svc": [], "env": []}));
        assert_eq!(task["template"]["metadata"]["labels"][BINDING_LABEL], "m-j-00000abc-t7");
        assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "4");
        assert_eq!(container["resources"]["requests"]["cpu"], "16");
        assert_eq!(container["resources"]["requests"]["memory"], "128Gi");
    }

    #[test]
    fn a_kueue_job_is_suspended_in_the_tenants_local_queue() {
        let mut job = job();
        job.spec.tenant = "nlp".into();
        let object = kueue_job(&job, &config(Mode::Kueue), &a100(), "k8s-west");
        assert_eq!(object["apiVersion"], "batch/v1");
        assert_eq!(object["kind"], "Job");
        assert_eq!(object["metadata"]["labels"][KUEUE_QUEUE_LABEL], "default");
        assert_eq!(object["metadata"]["annotations"][TOKEN_KEY], "7");
        let spec = &object["spec"];
        assert_eq!(spec["suspend"], true);
        assert_eq!(spec["parallelism"], 2);
        assert_eq!(spec["completions"], 2);
        assert_eq!(spec["backoffLimit"], 0);
        assert_eq!(spec["completionMode"], "Indexed");
        let pod = &spec["template"]["spec"];
        assert_eq!(pod["subdomain"], "m-j-00000abc-t7");
        assert_eq!(spec["template"]["metadata"]["labels"][BINDING_LABEL], "m-j-00000abc-t7");
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "4");
        assert_eq!(pod["nodeSelector"][PRODUCT_LABEL], "NVIDIA-A100-SXM4-80GB");
    }

    #[test]
    fn every_pod_carries_the_jobs_runtime_estimate_in_seconds() {
        let mut job = job();
        job.spec.runtime.estimate = HumanDuration::from_secs(5400);
        for mode in [Mode::Volcano, Mode::Kueue] {
            let object = build(&job, &config(mode), &a100(), "k8s-west");
            let template = match mode {
                Mode::Volcano => &object["spec"]["tasks"][0]["template"],
                Mode::Kueue => &object["spec"]["template"],
            };
            let annotations = match mode {
                Mode::Volcano => json!({ESTIMATE_KEY: "5400"}),
                // Kueue pods read their fencing token from the annotation (a copy's grant writes it).
                Mode::Kueue => json!({ESTIMATE_KEY: "5400", TOKEN_KEY: "7"}),
            };
            assert_eq!(template["metadata"]["annotations"], annotations, "{mode:?}");
            assert!(object["metadata"]["annotations"].get(ESTIMATE_KEY).is_none(), "on the pods only: {mode:?}");
        }
    }

    #[test]
    fn a_mig_type_asks_for_its_profile_and_several_products_use_affinity() {
        let gpu = GpuPlacement::for_type(Some("a100-80g.1g.10gb"), vec!["A".into(), "B".into()]);
        assert_eq!(gpu.resource, "nvidia.com/mig-1g.10gb");
        let object = volcano_job(&job(), &config(Mode::Volcano), &gpu, "k8s-west");
        let pod = &object["spec"]["tasks"][0]["template"]["spec"];
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"], "4");
        assert!(pod.get("nodeSelector").is_none());
        let term =
            &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
        assert_eq!(term["matchExpressions"][0]["values"], json!(["A", "B"]));
    }

    #[test]
    fn the_jobs_node_selector_reaches_the_pods_as_selector_and_affinity() {
        let mut job = job();
        job.spec.placement.node_selector =
            "topology.kubernetes.io/zone=us-east-1a, !spot, rack!=r7, nvidia.com/gpu.present".parse().unwrap();
        let gpu = GpuPlacement::for_type(Some("a100-80g"), vec!["NVIDIA-A100-SXM4-80GB".into()]);
        let object = volcano_job(&job, &config(Mode::Volcano), &gpu, "k8s-west");
        let pod = &object["spec"]["tasks"][0]["template"]["spec"];
        assert_eq!(
            pod["nodeSelector"],
            json!({PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB", "topology.kubernetes.io/zone": "us-east-1a"})
        );
        let term =
            &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
        let mut expressions = term["matchExpressions"].as_array().unwrap().clone();
        expressions.sort_by_key(|e| e["key"].as_str().unwrap_or_default().to_string());
        assert_eq!(
            Value::Array(expressions),
            json!([
                {"key": "nvidia.com/gpu.present", "operator": "Exists"},
                {"key": "rack", "operator": "NotIn", "values": ["r7"]},
                {"key": "spot", "operator": "DoesNotExist"},
            ])
        );
    }

    #[test]
    fn a_kueue_copy_is_the_jobs_own_job_named_for_the_copy_and_without_a_fencing_token() {
        let job = job();
        let copy = kueue_copy(&job, 12, &config(Mode::Kueue), &a100(), "k8s-west");
        let binding = kueue_job(&job, &config(Mode::Kueue), &a100(), "k8s-west");
        assert_eq!(copy["metadata"]["name"], "m-j-00000abc-c12");
        assert_eq!(copy["metadata"]["annotations"], json!({JOB_ID_KEY: "j-00000abc", COPY_KEY: "12"}));
        let template = &copy["spec"]["template"];
        assert_eq!(template["metadata"]["annotations"], json!({ESTIMATE_KEY: "600"}), "no token until the grant");
        assert_eq!(template["metadata"]["labels"][BINDING_LABEL], "m-j-00000abc-c12");
        assert_eq!(template["spec"]["subdomain"], "m-j-00000abc-c12");
        let host = "m-j-00000abc-c12-0.m-j-00000abc-c12.ml.svc";
        let env = env_of(&copy);
        assert!(env.contains(&("MERIDIAN_COORDINATOR_HOST".into(), json!(host))), "{env:?}");
        // Everything else is the job's: queue, gang, resources, suspension.
        assert_eq!(copy["metadata"]["labels"], binding["metadata"]["labels"]);
        for field in ["parallelism", "completions", "completionMode", "backoffLimit", "suspend"] {
            assert_eq!(copy["spec"][field], binding["spec"][field], "{field}");
        }
        assert_eq!(
            template["spec"]["containers"][0]["resources"],
            binding["spec"]["template"]["spec"]["containers"][0]["resources"]
        );
    }

    /// The container env of `object`'s pods, by name, in order.
    fn env_of(object: &Value) -> Vec<(String, Value)> {
        let template = match object["kind"].as_str() {
            Some("Job") if object["apiVersion"] == "batch/v1" => &object["spec"]["template"],
            _ => &object["spec"]["tasks"][0]["template"],
        };
        template["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let value = e.get("value").cloned().unwrap_or_else(|| e["valueFrom"].clone());
                (e["name"].as_str().unwrap().to_owned(), value)
            })
            .collect()
    }

    #[test]
    fn every_pod_gets_the_job_contract_in_order_with_its_index_from_the_annotation() {
        for (mode, annotation, host) in [
            (Mode::Volcano, "volcano.sh/task-index", "m-j-00000abc-t7-main-0.m-j-00000abc-t7.ml.svc"),
            (Mode::Kueue, "batch.kubernetes.io/job-completion-index", "m-j-00000abc-t7-0.m-j-00000abc-t7.ml.svc"),
        ] {
            let object = build(&job(), &config(mode), &a100(), "k8s-west");
            let index = json!({"fieldRef": {"fieldPath": format!("metadata.annotations['{annotation}']")}});
            let token = match mode {
                Mode::Volcano => json!("7"),
                Mode::Kueue => json!({"fieldRef": {"fieldPath": format!("metadata.annotations['{TOKEN_KEY}']")}}),
            };
            let coordinator = format!("{host}:29500");
            let expected: Vec<(&str, Value)> = vec![
                ("MERIDIAN_JOB_ID", json!("j-00000abc")),
                ("MERIDIAN_FENCING_TOKEN", token),
                ("MERIDIAN_CLUSTER", json!("k8s-west")),
                ("MERIDIAN_REPLICA", index),
                ("MERIDIAN_REPLICAS", json!("2")),
                ("MERIDIAN_GPUS_PER_REPLICA", json!("4")),
                ("MERIDIAN_COORDINATOR_HOST", json!(host)),
                ("MERIDIAN_COORDINATOR_PORT", json!("29500")),
                ("MERIDIAN_COORDINATOR", json!(coordinator)),
                ("MASTER_ADDR", json!(host)),
                ("MASTER_PORT", json!("29500")),
                ("WORLD_SIZE", json!("2")),
                ("RANK", json!("$(MERIDIAN_REPLICA)")),
                ("NODE_RANK", json!("$(MERIDIAN_REPLICA)")),
                ("PET_NNODES", json!("2")),
                ("PET_NODE_RANK", json!("$(MERIDIAN_REPLICA)")),
                ("PET_MASTER_ADDR", json!(host)),
                ("PET_MASTER_PORT", json!("29500")),
                ("EPOCHS", json!("3")),
            ];
            let expected: Vec<(String, Value)> = expected.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            assert_eq!(env_of(&object), expected, "{mode:?}");
        }
    }

    #[test]
    fn opting_out_renaming_and_a_port_of_ones_own_show_in_the_pod_env() {
        let mut job = job();
        job.spec.payload.launcher_env_names.insert("NODE_RANK".into(), "TRAINER_NODE_RANK".into());
        job.spec.payload.env.insert("MASTER_PORT".into(), "23456".into());
        let config = KubernetesConfig { coordinator_port: 31_000, ..config(Mode::Volcano) };
        let env = env_of(&build(&job, &config, &a100(), "k8s-west"));
        let get = |name: &str| env.iter().filter(|(k, _)| k == name).map(|(_, v)| v.clone()).collect::<Vec<_>>();
        assert_eq!(get("TRAINER_NODE_RANK"), [json!("$(MERIDIAN_REPLICA)")]);
        assert!(get("NODE_RANK").is_empty());
        assert_eq!(get("MASTER_PORT"), [json!("23456")], "the payload's value, once");
        assert_eq!(get("MERIDIAN_COORDINATOR_PORT"), [json!("31000")]);
        job.spec.payload.launcher_env = meridian_proto::spec::LauncherEnv::None;
        job.spec.payload.launcher_env_names.clear();
        let names: Vec<String> =
            env_of(&build(&job, &config, &a100(), "k8s-west")).into_iter().map(|(k, _)| k).collect();
        assert!(names.iter().all(|n| n.starts_with("MERIDIAN_") || n == "EPOCHS" || n == "MASTER_PORT"), "{names:?}");
    }

    #[test]
    fn a_kueue_jobs_headless_service_selects_its_pods_and_is_owned_by_the_job() {
        let job = job();
        let service =
            headless_service(&job, &object_name(&job.job_id, job.fencing_token), &config(Mode::Kueue), "uid-42");
        assert_eq!(service["kind"], "Service");
        assert_eq!(service["metadata"]["name"], "m-j-00000abc-t7");
        assert_eq!(service["metadata"]["namespace"], "ml");
        assert_eq!(service["metadata"]["ownerReferences"][0]["uid"], "uid-42");
        assert_eq!(service["metadata"]["ownerReferences"][0]["kind"], "Job");
        assert_eq!(service["spec"]["clusterIP"], "None");
        assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
        assert_eq!(service["spec"]["selector"], json!({BINDING_LABEL: "m-j-00000abc-t7"}));
        assert_eq!(service["spec"]["ports"][0]["port"], 29500);
    }

    #[test]
    fn names_are_dns_safe_and_distinct_for_ids_that_sanitize_alike() {
        let a = object_name("Job_1/x", 3);
        let b = object_name("job-1-x", 3);
        assert_ne!(a, b);
        for name in [&a, &b, &object_name(&"x".repeat(200), u64::MAX)] {
            assert!(super::super::config::is_dns_label(name), "{name}");
            assert!(name.len() <= 52, "{name}");
        }
    }
}
