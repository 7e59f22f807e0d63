//! The user-facing job spec: what a researcher writes once and submits.
//!
//! Field names are the public contract (`docs/job-spec.md` documents each one). Unknown fields are
//! rejected so a typo never silently changes a job. Parse with [`crate::validate::parse_job_spec`], which accepts
//! YAML or JSON and reports errors with the field path.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::duration::HumanDuration;
use crate::selector::Selector;

/// Default `priority` when a spec leaves it out.
pub const DEFAULT_PRIORITY: u32 = 50;
/// Default `runtime.estimate` when a spec leaves it out.
pub const DEFAULT_ESTIMATE_SECS: u64 = 3_600;
/// Default `placement.burst.after` when a spec leaves it out.
pub const DEFAULT_BURST_AFTER_SECS: u64 = 3_600;
/// What users see instead of a secret `payload.env` value that is set (not empty).
pub const SECRET_SET: &str = "<secret: set>";
/// What users see instead of a secret `payload.env` value that is the empty string.
pub const SECRET_EMPTY: &str = "<secret: empty>";

/// A job as submitted: one gang of identical replicas plus where and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// Human name, unique only for display.
    pub name: String,
    /// Who pays and whose fair share the job counts against.
    pub tenant: String,
    /// 0..=100, higher runs first within a tenant.
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// The job may be stopped on its member to make room for a job of strictly higher priority
    /// (after a grace period, SIGTERM first), and then goes back to the federation queue with its
    /// waited time kept. Default false: never preempted.
    #[serde(default, skip_serializing_if = "is_false")]
    pub preemptible: bool,
    /// Free-form labels used by selectors (`project=llm`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Resubmitting with the same key (per tenant) returns the existing job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The replicas that must start together.
    pub gang: GangSpec,
    /// How long the job is expected to run and may run.
    #[serde(default)]
    pub runtime: RuntimeSpec,
    /// Datasets the job reads, with their home region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<DataRef>,
    /// Residency, cluster and burst rules.
    #[serde(default)]
    pub placement: PlacementRules,
    /// What to run.
    pub payload: Payload,
}

/// All replicas start together or none does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GangSpec {
    /// Number of replicas; each lands on one node.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
    /// What each replica needs on its node.
    pub resources: Resources,
}

/// Per-replica resources. A replica never spans nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// GPUs per replica (at least 1).
    pub gpus: u32,
    /// Acceptable GPU types; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_types: Vec<String>,
    /// Minimum memory per GPU in GiB; 0 means any.
    #[serde(default, rename = "gpuMemoryGiB")]
    pub gpu_memory_gib: u32,
    /// CPU cores per replica.
    #[serde(default)]
    pub cpu: u32,
    /// Host memory per replica in GiB.
    #[serde(default, rename = "memoryGiB")]
    pub memory_gib: u32,
}

/// Expected and maximum run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Expected run time; placement uses it to estimate when GPUs free up and what a job costs.
    #[serde(default = "default_estimate")]
    pub estimate: HumanDuration,
    /// Hard limit; the job is stopped (Failed) when it runs longer. None means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<HumanDuration>,
    /// The job should have finished this long after it was submitted. Placement counts what
    /// missing it would cost: it may burst early (within the burst budget) when owned clusters
    /// are expected to finish the job too late. None means no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<HumanDuration>,
}

/// A dataset the job reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataRef {
    /// Where the data lives (`s3://bucket/prefix`, `gs://…`, `nfs://…`).
    pub uri: String,
    /// Size in GiB; what must move if the job runs in another region.
    #[serde(rename = "sizeGiB")]
    pub size_gib: f64,
    /// The data's home region.
    pub region: String,
}

/// Where the job may run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementRules {
    /// Residency: only clusters in these regions. Empty means any region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Cluster include/exclude lists.
    #[serde(default)]
    pub clusters: ClusterRules,
    /// When cloud-tier clusters may be used.
    #[serde(default)]
    pub burst: BurstPolicy,
    /// Only clusters whose labels match, the implicit `meridian.io/cluster`, `meridian.io/region`,
    /// `meridian.io/tier` and `meridian.io/backend` included. Parsed when the spec is read and
    /// written back in canonical form; empty matches every cluster.
    #[serde(default, skip_serializing_if = "Selector::is_everything")]
    pub cluster_selector: Selector,
    /// Only nodes whose labels match may hold a replica. Parsed when the spec is read and written
    /// back in canonical form; empty matches every node.
    #[serde(default, skip_serializing_if = "Selector::is_everything")]
    pub node_selector: Selector,
}

impl PlacementRules {
    /// The parsed `placement.nodeSelector`: backends translate it with [`Selector::iter`]
    /// (`(key, operator, value)` per requirement) or test node labels with [`Selector::matches`].
    pub fn node_selector(&self) -> &Selector {
        &self.node_selector
    }

    /// The parsed `placement.clusterSelector` (see [`ClusterInfo::label`] for what it matches).
    ///
    /// [`ClusterInfo::label`]: crate::inventory::ClusterInfo::label
    pub fn cluster_selector(&self) -> &Selector {
        &self.cluster_selector
    }
}

/// Cluster allow and deny lists.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterRules {
    /// Only these clusters (empty means all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Never these clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

/// When a job may burst to cloud-tier clusters. Written `burst: never` or
/// `burst: {after: 30m, maxUsdPerHour: 80}`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BurstPolicy {
    /// Never use cloud-tier clusters.
    Never,
    /// Use cloud-tier clusters once the expected wait on owned clusters exceeds `after`, and only
    /// where the whole gang costs at most `max_usd_per_hour` (None: no cap).
    After {
        /// Expected owned-cluster wait that justifies paying for cloud GPUs.
        after: HumanDuration,
        /// Budget for the whole gang, in US$ per hour.
        max_usd_per_hour: Option<f64>,
    },
}

impl Default for BurstPolicy {
    fn default() -> Self {
        BurstPolicy::After { after: HumanDuration::from_secs(DEFAULT_BURST_AFTER_SECS), max_usd_per_hour: None }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BurstRule {
    #[serde(default = "default_burst_after")]
    after: HumanDuration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_usd_per_hour: Option<f64>,
}

impl Serialize for BurstPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            BurstPolicy::Never => serializer.serialize_str("never"),
            BurstPolicy::After { after, max_usd_per_hour } => {
                BurstRule { after, max_usd_per_hour }.serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for BurstPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BurstVisitor;
        impl<'de> Visitor<'de> for BurstVisitor {
            type Value = BurstPolicy;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`never` or a map such as `{after: 30m, maxUsdPerHour: 80}`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<BurstPolicy, E> {
                if v == "never" { Ok(BurstPolicy::Never) } else { Err(E::invalid_value(de::Unexpected::Str(v), &self)) }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BurstPolicy, A::Error> {
                let rule = BurstRule::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(BurstPolicy::After { after: rule.after, max_usd_per_hour: rule.max_usd_per_hour })
            }
        }
        deserializer.deserialize_any(BurstVisitor)
    }
}

/// What runs: a container image, a command, or both. Its `Debug` hides secret env values, so
/// a `{:?}` in a log line cannot leak them.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Payload {
    /// Container image; needs a backend that runs containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Command and arguments; without an image it runs on the bare node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of `env` entries whose values are secret: the member gets them, but no answer to a
    /// user ever shows them (see [`Payload::redacted`]).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub secret_env: BTreeSet<String>,
    /// Which launcher's variables each replica gets besides the `MERIDIAN_*` ones (see
    /// [`crate::job_env`]): `torch` (the default) or `none`.
    #[serde(default, skip_serializing_if = "LauncherEnv::is_default")]
    pub launcher_env: LauncherEnv,
    /// Launcher variables set under another name: `{MASTER_PORT: TRAINER_PORT}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub launcher_env_names: BTreeMap<String, String>,
}

/// The launcher variables a job's replicas get (`payload.launcherEnv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LauncherEnv {
    /// What PyTorch (`env://`, `torchrun`), and launchers that read the same names, need to find
    /// the other replicas: `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK`, `NODE_RANK` and
    /// torchrun's `PET_*` defaults.
    #[default]
    Torch,
    /// Only the `MERIDIAN_*` variables.
    None,
}

impl LauncherEnv {
    /// Whether this is the default (`torch`), which a spec need not write.
    pub fn is_default(&self) -> bool {
        *self == LauncherEnv::Torch
    }

    /// The name a spec writes.
    pub fn as_str(&self) -> &'static str {
        match self {
            LauncherEnv::Torch => "torch",
            LauncherEnv::None => "none",
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.redacted();
        f.debug_struct("Payload")
            .field("image", &shown.image)
            .field("command", &shown.command)
            .field("env", &shown.env)
            .field("secret_env", &shown.secret_env)
            .field("launcher_env", &shown.launcher_env)
            .field("launcher_env_names", &shown.launcher_env_names)
            .finish()
    }
}

impl Payload {
    /// Whether any `env` value is marked secret.
    pub fn has_secrets(&self) -> bool {
        !self.secret_env.is_empty()
    }

    /// The payload as users may see it: every secret `env` value replaced by [`SECRET_SET`] (or
    /// [`SECRET_EMPTY`] for an empty value).
    pub fn redacted(&self) -> Payload {
        let mut payload = self.clone();
        for name in &self.secret_env {
            if let Some(value) = payload.env.get_mut(name) {
                *value = if value.is_empty() { SECRET_EMPTY } else { SECRET_SET }.to_owned();
            }
        }
        payload
    }
}

impl Default for RuntimeSpec {
    fn default() -> Self {
        Self { estimate: default_estimate(), limit: None, deadline: None }
    }
}

impl JobSpec {
    /// GPUs of the whole gang (replicas × GPUs per replica), saturating.
    pub fn total_gpus(&self) -> u32 {
        self.gang.replicas.saturating_mul(self.gang.resources.gpus)
    }

    /// Total size of the job's datasets in GiB.
    pub fn data_gib(&self) -> f64 {
        self.data.iter().map(|d| d.size_gib).sum()
    }

    /// The spec as users may see it: secret `payload.env` values hidden (see
    /// [`Payload::redacted`]).
    pub fn redacted(&self) -> JobSpec {
        JobSpec { payload: self.payload.redacted(), ..self.clone() }
    }
}

// serde's `skip_serializing_if` takes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(value: &bool) -> bool {
    !*value
}
fn default_priority() -> u32 {
    DEFAULT_PRIORITY
}
fn default_replicas() -> u32 {
    1
}
fn default_estimate() -> HumanDuration {
    HumanDuration::from_secs(DEFAULT_ESTIMATE_SECS)
}
fn default_burst_after() -> HumanDuration {
    HumanDuration::from_secs(DEFAULT_BURST_AFTER_SECS)
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"{"name":"n","tenant":"t","gang":{"resources":{"gpus":1}},"payload":{"command":["true"]}}"#;

    #[test]
    fn debug_output_hides_secret_env_values() {
        let payload = Payload {
            command: vec!["x".into()],
            env: [("API_KEY".to_string(), "hunter2".to_string()), ("LR".to_string(), "1".to_string())].into(),
            secret_env: ["API_KEY".to_string()].into(),
            ..Payload::default()
        };
        let shown = format!("{payload:?}");
        assert!(!shown.contains("hunter2") && shown.contains(SECRET_SET) && shown.contains("\"LR\": \"1\""), "{shown}");
    }

    #[test]
    fn preemptible_defaults_to_false_and_is_written_only_when_set() {
        let spec: JobSpec = serde_json::from_str(MINIMAL).unwrap();
        assert!(!spec.preemptible);
        assert!(!serde_json::to_string(&spec).unwrap().contains("preemptible"));
        let marked = JobSpec { preemptible: true, ..spec };
        let text = serde_json::to_string(&marked).unwrap();
        assert!(text.contains("\"preemptible\":true"), "{text}");
        assert_eq!(serde_json::from_str::<JobSpec>(&text).unwrap(), marked);
    }
}
