//! The `kubernetes:` section of the agent config: which batch system runs the jobs (Volcano or
//! Kueue), where, and how Meridian's tenants, priorities and GPU types map onto the cluster.

use std::collections::BTreeMap;

use meridian_proto::duration::HumanDuration;
use meridian_proto::gpu::GpuCatalog;
use serde::{Deserialize, Serialize};

/// Which batch system the agent hands jobs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A Volcano `batch.volcano.sh/v1alpha1` Job, gang-scheduled by Volcano.
    #[default]
    Volcano,
    /// A suspended `batch/v1` Job that Kueue admits and resumes.
    Kueue,
}

/// A priority class used for jobs whose Meridian priority is at least `minPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityClassRule {
    /// Lowest Meridian priority (0..=100) that gets this class.
    pub min_priority: u32,
    /// The `PriorityClass` name.
    pub name: String,
}

/// The Kubernetes backend's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `volcano` or `kueue`.
    #[serde(default)]
    pub mode: Mode,
    /// Namespace the jobs are created in (and whose jobs are adopted).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Volcano queue (volcano mode) or Kueue LocalQueue (kueue mode) by Meridian tenant.
    #[serde(default)]
    pub queues: BTreeMap<String, String>,
    /// Queue for tenants not named in `queues`.
    #[serde(default = "default_queue")]
    pub default_queue: String,
    /// GPU type by the node label `nvidia.com/gpu.product`; overrides the built-in mapping.
    #[serde(default)]
    pub gpu_types: BTreeMap<String, String>,
    /// Priority classes by Meridian priority; the rule with the highest `minPriority` not above
    /// the job's priority wins. Empty: no priority class is set.
    #[serde(default)]
    pub priority_classes: Vec<PriorityClassRule>,
    /// Priority class for jobs whose spec says `preemptible: true`, in place of the rules above:
    /// a low class that Volcano's or Kueue's preemption may evict. A job evicted by preemption
    /// is reported preempted and queued again by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible_priority_class: Option<String>,
    /// Deadline of every API call.
    #[serde(default = "default_request_timeout")]
    pub request_timeout: HumanDuration,
    /// Where job status comes from: `watch` (the default) or `poll`.
    #[serde(default)]
    pub status_updates: StatusUpdates,
    /// `poll`: how often job status is read. `watch`: the longest time between two status rounds
    /// without a change (they read the watch caches, not the API).
    #[serde(default = "default_poll_interval")]
    pub poll_interval: HumanDuration,
    /// The coordinator port of every job (`MERIDIAN_COORDINATOR_PORT`, `MASTER_PORT`): each pod
    /// has its own address, so one port serves every job.
    #[serde(default = "default_coordinator_port")]
    pub coordinator_port: u16,
    /// Kueue mode: the name of the Kueue `AdmissionCheck` (controller
    /// [`START_LOCK_CONTROLLER`]) that holds sibling copies until the gateway grants one of them
    /// the job's start lock. Unset: the backend queues no copies. Every ClusterQueue that
    /// Meridian's LocalQueues point at must list it; the agent passes it for every workload that
    /// is not a waiting copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_lock_check: Option<String>,
}

/// The `spec.controllerName` of the Kueue `AdmissionCheck` that `startLockCheck` names: the
/// agent is that check's controller.
pub const START_LOCK_CONTROLLER: &str = "meridian.io/start-lock";

/// Where the Kubernetes backend learns job status from (`kubernetes.statusUpdates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusUpdates {
    /// List once, then watch jobs, pods and PodGroups/Workloads; relist on `410 Gone`.
    #[default]
    Watch,
    /// List them every `pollInterval`.
    Poll,
}

fn default_namespace() -> String {
    "meridian".into()
}
fn default_queue() -> String {
    "default".into()
}
fn default_request_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_poll_interval() -> HumanDuration {
    HumanDuration::from_secs(2)
}
fn default_coordinator_port() -> u16 {
    29_500
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            mode: Mode::default(),
            namespace: default_namespace(),
            queues: BTreeMap::new(),
            default_queue: default_queue(),
            gpu_types: BTreeMap::new(),
            priority_classes: Vec::new(),
            preemptible_priority_class: None,
            request_timeout: default_request_timeout(),
            status_updates: StatusUpdates::default(),
            poll_interval: default_poll_interval(),
            coordinator_port: default_coordinator_port(),
            start_lock_check: None,
        }
    }
}

impl KubernetesConfig {
    /// Pushes every problem as `kubernetes.<field>: <reason>`.
    pub fn check(&self, problems: &mut Vec<String>) {
        if !is_dns_label(&self.namespace) {
            problems.push(format!(
                "kubernetes.namespace: `{}` is not a DNS label (lowercase letters, digits and `-`, at most 63)",
                self.namespace
            ));
        }
        if self.default_queue.trim().is_empty() {
            problems.push("kubernetes.defaultQueue: must name a queue".into());
        }
        for (tenant, queue) in &self.queues {
            if queue.trim().is_empty() {
                problems.push(format!("kubernetes.queues.{tenant}: must name a queue"));
            }
        }
        let catalog = GpuCatalog::default();
        for (product, gpu_type) in &self.gpu_types {
            if !catalog.contains(gpu_type) {
                problems.push(format!(
                    "kubernetes.gpuTypes.{product}: unknown GPU type `{gpu_type}`; use one of {}",
                    catalog.names().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        for (i, rule) in self.priority_classes.iter().enumerate() {
            if rule.min_priority > 100 {
                problems
                    .push(format!("kubernetes.priorityClasses[{i}].minPriority: {} is above 100", rule.min_priority));
            }
            if !is_dns_subdomain(&rule.name) {
                problems.push(format!("kubernetes.priorityClasses[{i}].name: `{}` is not a valid name", rule.name));
            }
        }
        if let Some(name) = &self.preemptible_priority_class
            && !is_dns_subdomain(name)
        {
            problems.push(format!("kubernetes.preemptiblePriorityClass: `{name}` is not a valid name"));
        }
        if self.request_timeout.0.is_zero() {
            problems.push("kubernetes.requestTimeout: must be longer than 0s".into());
        }
        if self.coordinator_port == 0 {
            problems.push("kubernetes.coordinatorPort: must be a port from 1 to 65535".into());
        }
        if self.poll_interval.0.is_zero() {
            problems.push("kubernetes.pollInterval: must be longer than 0s".into());
        }
        if let Some(check) = &self.start_lock_check {
            if self.mode != Mode::Kueue {
                problems.push(
                    "kubernetes.startLockCheck: only kueue mode has admission checks; remove it or set `mode: kueue`"
                        .into(),
                );
            } else if !is_dns_subdomain(check) {
                problems.push(format!("kubernetes.startLockCheck: `{check}` is not a valid AdmissionCheck name"));
            }
        }
    }

    /// The queue a tenant's jobs go to.
    pub fn queue_for(&self, tenant: &str) -> &str {
        self.queues.get(tenant).map_or(self.default_queue.as_str(), String::as_str)
    }

    /// The priority class of a job: `preemptiblePriorityClass` for a preemptible job when set,
    /// else the rule for its priority.
    pub fn priority_class_of(&self, spec: &meridian_proto::spec::JobSpec) -> Option<&str> {
        match &self.preemptible_priority_class {
            Some(class) if spec.preemptible => Some(class),
            _ => self.priority_class_for(spec.priority),
        }
    }

    /// The priority class for a Meridian priority, if any rule applies.
    pub fn priority_class_for(&self, priority: u32) -> Option<&str> {
        self.priority_classes
            .iter()
            .filter(|rule| rule.min_priority <= priority)
            .max_by_key(|rule| rule.min_priority)
            .map(|rule| rule.name.as_str())
    }
}

/// RFC 1123 label: what namespaces and most object names must be.
pub(crate) fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_volcano_in_namespace_meridian_with_ten_second_calls() {
        let config: KubernetesConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, KubernetesConfig::default());
        assert_eq!(config.mode, Mode::Volcano);
        assert_eq!(config.request_timeout.0.as_secs(), 10);
        assert_eq!(config.poll_interval.0.as_secs(), 2);
        let mut problems = Vec::new();
        config.check(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn every_problem_is_listed_with_its_field_path() {
        let config: KubernetesConfig = serde_json::from_value(serde_json::json!({
            "namespace": "Bad_NS",
            "defaultQueue": " ",
            "queues": {"team-a": ""},
            "gpuTypes": {"NVIDIA-Foo": "foo"},
            "priorityClasses": [{"minPriority": 101, "name": "Hi!"}],
            "requestTimeout": "0s",
            "pollInterval": "0s",
            "startLockCheck": "start-lock",
        }))
        .unwrap();
        let mut problems = Vec::new();
        config.check(&mut problems);
        let fields: Vec<&str> = problems.iter().map(|p| p.split(':').next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "kubernetes.namespace",
                "kubernetes.defaultQueue",
                "kubernetes.queues.team-a",
                "kubernetes.gpuTypes.NVIDIA-Foo",
                "kubernetes.priorityClasses[0].minPriority",
                "kubernetes.priorityClasses[0].name",
                "kubernetes.requestTimeout",
                "kubernetes.pollInterval",
                "kubernetes.startLockCheck",
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<KubernetesConfig>(r#"{"namespce": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("namespce"), "{err}");
    }

    #[test]
    fn queues_and_priority_classes_follow_the_tenant_and_thresholds() {
        let config = KubernetesConfig {
            queues: BTreeMap::from([("vision".into(), "gpu-vision".into())]),
            priority_classes: vec![
                PriorityClassRule { min_priority: 80, name: "high".into() },
                PriorityClassRule { min_priority: 0, name: "low".into() },
            ],
            ..KubernetesConfig::default()
        };
        assert_eq!(config.queue_for("vision"), "gpu-vision");
        assert_eq!(config.queue_for("nlp"), "default");
        assert_eq!(config.priority_class_for(90), Some("high"));
        assert_eq!(config.priority_class_for(50), Some("low"));
        assert_eq!(KubernetesConfig::default().priority_class_for(50), None);
    }
}
