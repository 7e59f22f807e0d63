//! What a member cluster reports about itself: identity, node shapes with their free resources,
//! and queue pressure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Owned clusters are paid for already; cloud clusters cost money per GPU-hour and are burst
/// targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// On-prem or reserved capacity.
    Owned,
    /// Pay-as-you-go capacity used only for bursting.
    Cloud,
}

/// The local scheduler a member cluster runs jobs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Meridian's own gang + fair-share scheduler over declared nodes.
    Builtin,
    /// A Slurm controller (sbatch/squeue/scancel).
    Slurm,
    /// Kubernetes with Volcano or Kueue.
    Kubernetes,
}

/// Prefix of the labels Meridian gives every cluster itself; agents may not set labels with it.
pub const IMPLICIT_LABEL_PREFIX: &str = "meridian.io/";
/// Implicit cluster label: the cluster's name.
pub const LABEL_CLUSTER: &str = "meridian.io/cluster";
/// Implicit cluster label: the cluster's region.
pub const LABEL_REGION: &str = "meridian.io/region";
/// Implicit cluster label: `owned` or `cloud`.
pub const LABEL_TIER: &str = "meridian.io/tier";
/// Implicit cluster label: `builtin`, `slurm` or `kubernetes`.
pub const LABEL_BACKEND: &str = "meridian.io/backend";

impl Tier {
    /// The name used in configs, specs and labels (`owned`, `cloud`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Owned => "owned",
            Tier::Cloud => "cloud",
        }
    }
}

impl BackendKind {
    /// The name used in configs and labels (`builtin`, `slurm`, `kubernetes`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Builtin => "builtin",
            BackendKind::Slurm => "slurm",
            BackendKind::Kubernetes => "kubernetes",
        }
    }
}

/// A member cluster's identity and terms, sent once per connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// Unique cluster name.
    pub name: String,
    /// Region the cluster sits in (matches region names in the gateway's network table).
    pub region: String,
    /// Owned or cloud.
    pub tier: Tier,
    /// Local scheduler.
    pub backend: BackendKind,
    /// US$ per GPU-hour by GPU type (owned clusters: the internal charge-back rate).
    pub prices: BTreeMap<String, f64>,
    /// Whether payloads with a container image can run.
    pub supports_containers: bool,
    /// Whether payloads with only a command (no image) can run.
    pub supports_bare_commands: bool,
    /// Labels the cluster's config gives it (`gpu-fabric: ib`), for `placement.clusterSelector`.
    /// Never holds the implicit `meridian.io/*` labels: [`label`](Self::label) adds those.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl ClusterInfo {
    /// The value of label `key` as `placement.clusterSelector` sees it: one of the implicit labels
    /// (`meridian.io/cluster`, `meridian.io/region`, `meridian.io/tier`, `meridian.io/backend`,
    /// derived from the identity and never stored), else a configured label.
    pub fn label(&self, key: &str) -> Option<&str> {
        match key {
            LABEL_CLUSTER => Some(&self.name),
            LABEL_REGION => Some(&self.region),
            LABEL_TIER => Some(self.tier.as_str()),
            LABEL_BACKEND => Some(self.backend.as_str()),
            _ => self.labels.get(key).map(String::as_str),
        }
    }

    /// Every label a cluster selector sees: the configured ones plus the implicit ones (for
    /// display; matching uses [`label`](Self::label) and builds no map).
    pub fn selectable_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        for key in [LABEL_CLUSTER, LABEL_REGION, LABEL_TIER, LABEL_BACKEND] {
            if let Some(value) = self.label(key) {
                labels.insert(key.to_string(), value.to_string());
            }
        }
        labels
    }

    /// Price of one GPU-hour of `gpu_type`, 0 when the cluster names none.
    pub fn price(&self, gpu_type: &str) -> f64 {
        self.prices.get(gpu_type).copied().unwrap_or(0.0)
    }
}

/// Free resources of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFree {
    /// Free GPUs.
    pub gpus: u32,
    /// Free CPU cores.
    pub cpu: u32,
    /// Free host memory in GiB.
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
}

impl NodeFree {
    /// How many replicas needing `gpus`/`cpu`/`memory_gib` each fit on this node at once.
    /// A replica never spans nodes; a request of 0 of a resource does not limit the count.
    pub fn replicas_fitting(&self, gpus: u32, cpu: u32, memory_gib: u32) -> u32 {
        let by = |free: u32, need: u32| free.checked_div(need).unwrap_or(u32::MAX);
        by(self.gpus, gpus).min(by(self.cpu, cpu)).min(by(self.memory_gib, memory_gib))
    }
}

/// A group of identical nodes with identical labels, with each node's free resources.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeShape {
    /// Shape name (`dgx-h100`).
    pub name: String,
    /// GPU type of every node of the shape.
    pub gpu_type: String,
    /// Memory per GPU in GiB.
    #[serde(rename = "gpuMemoryGiB")]
    pub gpu_memory_gib: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// CPU cores per node.
    pub cpu_per_node: u32,
    /// Host memory per node in GiB.
    #[serde(rename = "memoryGiBPerNode")]
    pub memory_gib_per_node: u32,
    /// One entry per node: what is free on it now.
    pub free: Vec<NodeFree>,
    /// Labels of every node of the shape (`gpu-fabric: ib`), for `placement.nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl NodeShape {
    /// Number of nodes of this shape.
    pub fn node_count(&self) -> u32 {
        u32::try_from(self.free.len()).unwrap_or(u32::MAX)
    }

    /// All GPUs of the shape.
    pub fn gpus_total(&self) -> u32 {
        self.gpus_per_node.saturating_mul(self.node_count())
    }

    /// Free GPUs summed over nodes (for display; placement counts per node).
    pub fn gpus_free(&self) -> u32 {
        self.free.iter().fold(0u32, |sum, n| sum.saturating_add(n.gpus))
    }
}

/// Everything a cluster has, by node shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Node shapes.
    pub shapes: Vec<NodeShape>,
}

impl Inventory {
    /// All GPUs of the cluster.
    pub fn gpus_total(&self) -> u32 {
        self.shapes.iter().fold(0u32, |sum, s| sum.saturating_add(s.gpus_total()))
    }

    /// Free GPUs summed over nodes.
    pub fn gpus_free(&self) -> u32 {
        self.shapes.iter().fold(0u32, |sum, s| sum.saturating_add(s.gpus_free()))
    }
}

/// Load of one local queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueLoad {
    /// Queue name (shared: a member reports the same names in every pressure report).
    pub queue: std::sync::Arc<str>,
    /// Fair-share weight.
    pub weight: f64,
    /// Jobs waiting.
    pub pending_jobs: u32,
    /// GPUs the waiting jobs need.
    pub pending_gpus: u32,
    /// GPUs held by running jobs.
    pub running_gpus: u32,
}

/// GPUs that running jobs are expected to give back `after_secs` from the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRelease {
    /// Seconds from the report.
    pub after_secs: u64,
    /// GPUs freed then.
    pub gpus: u32,
}

/// How busy the cluster's own queues are.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePressure {
    /// Per local queue.
    pub queues: Vec<QueueLoad>,
    /// Expected GPU releases of running jobs, ascending by time.
    pub releases: Vec<GpuRelease>,
    /// The agent's own estimate of how long a newly queued job waits.
    pub estimated_wait_secs: u64,
    /// GPUs held by running preemptible jobs, by their priority (ascending): a job of higher
    /// priority could have them by preemption. Empty where the member does not preempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preemptible: Vec<PreemptibleGpus>,
}

/// GPUs held by running preemptible jobs of one priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptibleGpus {
    /// The jobs' priority.
    pub priority: u32,
    /// GPUs they hold.
    pub gpus: u32,
}

impl QueuePressure {
    /// GPUs wanted by jobs already waiting in the cluster's local queues.
    pub fn pending_gpus(&self) -> u32 {
        self.queues.iter().fold(0u32, |sum, q| sum.saturating_add(q.pending_gpus))
    }

    /// GPUs a job of `priority` could have by preemption: those of preemptible jobs of strictly
    /// lower priority.
    pub fn preemptible_below(&self, priority: u32) -> u64 {
        self.preemptible.iter().filter(|p| p.priority < priority).map(|p| u64::from(p.gpus)).sum()
    }

    /// Jobs waiting in the cluster's local queues.
    pub fn pending_jobs(&self) -> u32 {
        self.queues.iter().fold(0u32, |sum, q| sum.saturating_add(q.pending_jobs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ClusterInfo {
        ClusterInfo {
            name: "east".into(),
            region: "us-east".into(),
            tier: Tier::Cloud,
            backend: BackendKind::Slurm,
            prices: BTreeMap::new(),
            supports_containers: true,
            supports_bare_commands: true,
            labels: BTreeMap::from([("gpu-fabric".to_string(), "ib".to_string())]),
        }
    }

    #[test]
    fn every_cluster_has_implicit_labels_besides_its_own() {
        let info = info();
        assert_eq!(info.label(LABEL_CLUSTER), Some("east"));
        assert_eq!(info.label(LABEL_REGION), Some("us-east"));
        assert_eq!(info.label(LABEL_TIER), Some("cloud"));
        assert_eq!(info.label(LABEL_BACKEND), Some("slurm"));
        assert_eq!(info.label("gpu-fabric"), Some("ib"));
        assert_eq!(info.label("rack"), None);
        let all = info.selectable_labels();
        assert_eq!(all.len(), 5);
        assert_eq!(all.get(LABEL_TIER).map(String::as_str), Some("cloud"));
        assert!(!info.labels.contains_key(LABEL_CLUSTER), "implicit labels are never stored");
    }

    #[test]
    fn tier_and_backend_names_match_their_serde_names() {
        for tier in [Tier::Owned, Tier::Cloud] {
            assert_eq!(serde_json::to_value(tier).unwrap(), serde_json::json!(tier.as_str()));
        }
        for backend in [BackendKind::Builtin, BackendKind::Slurm, BackendKind::Kubernetes] {
            assert_eq!(serde_json::to_value(backend).unwrap(), serde_json::json!(backend.as_str()));
        }
    }
}
