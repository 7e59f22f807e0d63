//! Conversions between wire (`pb`) and domain types, done once at the edge.
//!
//! Domain → wire is infallible (`From<&Domain> for pb::Message`). Wire → domain is `TryFrom`:
//! it checks what the wire format cannot express (a required message that is absent, a required
//! string that is empty, an enum number this build does not know, a report that contradicts
//! itself) and returns a [`ConvertError`] naming the field. It does **not** repeat the job-spec
//! rules of [`validate`]: [`spec_from_wire`] converts and then validates.
//!
//! Field paths in errors:
//! - job specs use the user-facing names of the spec (`gang.resources`, `data[1].uri`), the same
//!   paths [`validate`] reports, so a user sees one vocabulary whatever API they used;
//! - agent reports use the message and its protobuf field names (`hello.prices[2].usd_per_gpu_hour`,
//!   `inventory.shapes[0].free[3].gpus`, `pressure.queues[1].weight`), which is what the author of
//!   an agent sees in `meridian.proto`.
//!
//! Mappings that are not one-to-one:
//! - durations travel as whole seconds; sub-second parts of a domain duration are dropped (floor,
//!   which keeps `limit >= estimate` true and matches the whole seconds [`validate`] checks);
//! - `runtime.limit` None ↔ `limit_seconds == 0`, `runtime.deadline` None ↔ `deadline_seconds == 0`,
//!   `idempotencyKey` None ↔ `""`, `payload.image` None ↔ `""`;
//! - `placement.burst` Never ↔ `never: true` (the other fields are then ignored);
//! - an absent `runtime`, `placement` or `placement.burst` message takes the same defaults as a
//!   spec that leaves the field out; scalar fields have no such defaults on the wire (proto3 cannot
//!   tell `0` from "not sent"), so `priority: 0` stays 0 and `replicas: 0` is refused by validation.

use std::collections::{BTreeMap, BTreeSet};

use super::pb;
use crate::duration::HumanDuration;
use crate::gpu::GpuCatalog;
use crate::inventory::{
    BackendKind, ClusterInfo, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure, Tier,
};
use crate::job::JobState;
use crate::selector::Selector;
use crate::spec::{self, BurstPolicy, JobSpec};
use crate::validate::{self, FieldError, SpecError};

/// Why a wire message could not become a domain value. Every variant names the field path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    /// A required message is absent or a required string is empty or blank (proto3 sends an
    /// absent and an empty value the same way: as nothing).
    #[error("{0}: is required but absent or empty")]
    MissingField(String),
    /// An enum field holds 0 (`*_UNSPECIFIED`) where a value is required, or a number this build
    /// does not know (a newer peer).
    #[error("{field}: {value} is not a valid value; expected one of {expected}")]
    InvalidEnum {
        /// Path of the enum field.
        field: String,
        /// The number received.
        value: i32,
        /// The accepted names, for the message.
        expected: &'static str,
    },
    /// A list that is keyed by name holds the same name twice, so it is ambiguous.
    #[error("{field}: `{key}` is listed more than once")]
    Duplicate {
        /// Path of the list.
        field: String,
        /// The repeated name.
        key: String,
    },
    /// A number is NaN, infinite or outside the range its meaning allows.
    #[error("{field}: {value} is out of range; must be {expected}")]
    OutOfRange {
        /// Path of the number.
        field: String,
        /// The number received.
        value: f64,
        /// The accepted range, in words.
        expected: &'static str,
    },
    /// A node reports more of a resource free than every node of its shape has.
    #[error("{field}: {free} free is more than the {capacity} per node the shape declares")]
    FreeExceedsCapacity {
        /// Path of the free count (`inventory.shapes[0].free[3].gpus`).
        field: String,
        /// What the node reports free.
        free: u32,
        /// What the shape declares per node.
        capacity: u32,
    },
    /// A reported label (cluster or node shape) breaks the label rules or uses the reserved
    /// `meridian.io/` prefix.
    #[error("{field}: {reason}")]
    InvalidLabel {
        /// Path of the label (`inventory.shapes[0].labels.gpu-fabric`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The job spec converted, but breaks the spec rules; the source lists every field error.
    #[error("invalid job spec: {0}")]
    InvalidSpec(#[from] SpecError),
}

/// Result of a conversion.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

const JOB_STATES: &str = "JOB_STATE_QUEUED, JOB_STATE_OFFERED, JOB_STATE_BOUND, JOB_STATE_RUNNING, \
                          JOB_STATE_SUCCEEDED, JOB_STATE_FAILED, JOB_STATE_CANCELLED, JOB_STATE_UNKNOWN";
const TIERS: &str = "TIER_OWNED, TIER_CLOUD";
const BACKENDS: &str = "BACKEND_KIND_BUILTIN, BACKEND_KIND_SLURM, BACKEND_KIND_KUBERNETES";

/// Converts a wire job spec and validates it with [`validate::validate`]: the one call an edge
/// needs to turn a received `pb::JobSpec` (an `Offer`, a stored `Job`) into a usable [`JobSpec`].
pub fn spec_from_wire(wire: pb::JobSpec, catalog: &GpuCatalog) -> Result<JobSpec> {
    let spec = JobSpec::try_from(wire)?;
    validate::validate(&spec, catalog)?;
    Ok(spec)
}

/// Reads a `JobState` enum field (`pb::Job.state`, `pb::JobStatus.state`); `field` is its path
/// for the error. 0 (`JOB_STATE_UNSPECIFIED`) is refused.
pub fn job_state_from_wire(field: &str, value: i32) -> Result<JobState> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: JOB_STATES };
    Ok(match pb::JobState::try_from(value).map_err(|_| invalid())? {
        pb::JobState::Unspecified => return Err(invalid()),
        pb::JobState::Queued => JobState::Queued,
        pb::JobState::Offered => JobState::Offered,
        pb::JobState::Bound => JobState::Bound,
        pb::JobState::Running => JobState::Running,
        pb::JobState::Succeeded => JobState::Succeeded,
        pb::JobState::Failed => JobState::Failed,
        pb::JobState::Cancelled => JobState::Cancelled,
        pb::JobState::Unknown => JobState::Unknown,
    })
}

/// Reads a `Tier` enum field; `field` is its path for the error. 0 (`TIER_UNSPECIFIED`) is refused.
pub fn tier_from_wire(field: &str, value: i32) -> Result<Tier> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: TIERS };
    match pb::Tier::try_from(value).map_err(|_| invalid())? {
        pb::Tier::Unspecified => Err(invalid()),
        pb::Tier::Owned => Ok(Tier::Owned),
        pb::Tier::Cloud => Ok(Tier::Cloud),
    }
}

/// Reads a `BackendKind` enum field; `field` is its path for the error. 0
/// (`BACKEND_KIND_UNSPECIFIED`) is refused.
pub fn backend_from_wire(field: &str, value: i32) -> Result<BackendKind> {
    let invalid = || ConvertError::InvalidEnum { field: field.to_string(), value, expected: BACKENDS };
    match pb::BackendKind::try_from(value).map_err(|_| invalid())? {
        pb::BackendKind::Unspecified => Err(invalid()),
        pb::BackendKind::Builtin => Ok(BackendKind::Builtin),
        pb::BackendKind::Slurm => Ok(BackendKind::Slurm),
        pb::BackendKind::Kubernetes => Ok(BackendKind::Kubernetes),
    }
}

// ---------------------------------------------------------------- enums

impl From<JobState> for pb::JobState {
    fn from(state: JobState) -> Self {
        match state {
            JobState::Queued => pb::JobState::Queued,
            JobState::Offered => pb::JobState::Offered,
            JobState::Bound => pb::JobState::Bound,
            JobState::Running => pb::JobState::Running,
            JobState::Succeeded => pb::JobState::Succeeded,
            JobState::Failed => pb::JobState::Failed,
            JobState::Cancelled => pb::JobState::Cancelled,
            JobState::Unknown => pb::JobState::Unknown,
        }
    }
}

impl TryFrom<pb::JobState> for JobState {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `state`).
    fn try_from(state: pb::JobState) -> Result<Self> {
        job_state_from_wire("state", state.into())
    }
}

impl From<Tier> for pb::Tier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Owned => pb::Tier::Owned,
            Tier::Cloud => pb::Tier::Cloud,
        }
    }
}

impl TryFrom<pb::Tier> for Tier {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `tier`).
    fn try_from(tier: pb::Tier) -> Result<Self> {
        tier_from_wire("tier", tier.into())
    }
}

impl From<BackendKind> for pb::BackendKind {
    fn from(backend: BackendKind) -> Self {
        match backend {
            BackendKind::Builtin => pb::BackendKind::Builtin,
            BackendKind::Slurm => pb::BackendKind::Slurm,
            BackendKind::Kubernetes => pb::BackendKind::Kubernetes,
        }
    }
}

impl TryFrom<pb::BackendKind> for BackendKind {
    type Error = ConvertError;
    /// `Unspecified` is refused (field path `backend`).
    fn try_from(backend: pb::BackendKind) -> Result<Self> {
        backend_from_wire("backend", backend.into())
    }
}

// ---------------------------------------------------------------- job spec: domain → wire

impl From<&spec::Resources> for pb::Resources {
    fn from(r: &spec::Resources) -> Self {
        pb::Resources {
            gpus: r.gpus,
            gpu_types: r.gpu_types.clone(),
            gpu_memory_gib: r.gpu_memory_gib,
            cpu: r.cpu,
            memory_gib: r.memory_gib,
        }
    }
}

impl From<&spec::GangSpec> for pb::GangSpec {
    fn from(gang: &spec::GangSpec) -> Self {
        pb::GangSpec { replicas: gang.replicas, resources: Some((&gang.resources).into()) }
    }
}

impl From<&spec::RuntimeSpec> for pb::RuntimeSpec {
    /// Sub-second parts are dropped; a limit of `0s` travels as "no limit" (validation refuses
    /// such a limit anyway, as it is shorter than any valid estimate).
    fn from(runtime: &spec::RuntimeSpec) -> Self {
        pb::RuntimeSpec {
            estimate_seconds: runtime.estimate.as_secs(),
            limit_seconds: runtime.limit.map_or(0, |limit| limit.as_secs()),
            deadline_seconds: runtime.deadline.map_or(0, |deadline| deadline.as_secs()),
        }
    }
}

impl From<&spec::DataRef> for pb::DataRef {
    fn from(data: &spec::DataRef) -> Self {
        pb::DataRef { uri: data.uri.clone(), size_gib: data.size_gib, region: data.region.clone() }
    }
}

impl From<&BurstPolicy> for pb::BurstPolicy {
    fn from(burst: &BurstPolicy) -> Self {
        match *burst {
            BurstPolicy::Never => pb::BurstPolicy { never: true, after_seconds: 0, max_usd_per_hour: None },
            BurstPolicy::After { after, max_usd_per_hour } => {
                pb::BurstPolicy { never: false, after_seconds: after.as_secs(), max_usd_per_hour }
            }
        }
    }
}

impl From<&spec::PlacementRules> for pb::PlacementRules {
    fn from(placement: &spec::PlacementRules) -> Self {
        pb::PlacementRules {
            regions: placement.regions.clone(),
            include_clusters: placement.clusters.include.clone(),
            exclude_clusters: placement.clusters.exclude.clone(),
            burst: Some((&placement.burst).into()),
            cluster_selector: placement.cluster_selector.to_string(),
            node_selector: placement.node_selector.to_string(),
        }
    }
}

impl From<&spec::Payload> for pb::Payload {
    fn from(payload: &spec::Payload) -> Self {
        pb::Payload {
            image: payload.image.clone().unwrap_or_default(),
            command: payload.command.clone(),
            env: payload.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            secret_env: payload.secret_env.iter().cloned().collect(),
        }
    }
}

impl From<&JobSpec> for pb::JobSpec {
    fn from(spec: &JobSpec) -> Self {
        pb::JobSpec {
            name: spec.name.clone(),
            tenant: spec.tenant.clone(),
            priority: spec.priority,
            preemptible: spec.preemptible,
            labels: spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            idempotency_key: spec.idempotency_key.clone().unwrap_or_default(),
            gang: Some((&spec.gang).into()),
            runtime: Some((&spec.runtime).into()),
            data: spec.data.iter().map(pb::DataRef::from).collect(),
            placement: Some((&spec.placement).into()),
            payload: Some((&spec.payload).into()),
        }
    }
}

// ---------------------------------------------------------------- job spec: wire → domain

impl From<pb::Resources> for spec::Resources {
    fn from(r: pb::Resources) -> Self {
        spec::Resources {
            gpus: r.gpus,
            gpu_types: r.gpu_types,
            gpu_memory_gib: r.gpu_memory_gib,
            cpu: r.cpu,
            memory_gib: r.memory_gib,
        }
    }
}

impl TryFrom<pb::GangSpec> for spec::GangSpec {
    type Error = ConvertError;
    /// Refuses a gang without `resources` (`gang.resources`).
    fn try_from(gang: pb::GangSpec) -> Result<Self> {
        let resources = gang.resources.ok_or_else(|| missing("gang.resources"))?;
        Ok(spec::GangSpec { replicas: gang.replicas, resources: resources.into() })
    }
}

impl From<pb::RuntimeSpec> for spec::RuntimeSpec {
    /// `limit_seconds == 0` means no limit, `deadline_seconds == 0` no deadline.
    fn from(runtime: pb::RuntimeSpec) -> Self {
        spec::RuntimeSpec {
            estimate: HumanDuration::from_secs(runtime.estimate_seconds),
            limit: (runtime.limit_seconds != 0).then(|| HumanDuration::from_secs(runtime.limit_seconds)),
            deadline: (runtime.deadline_seconds != 0).then(|| HumanDuration::from_secs(runtime.deadline_seconds)),
        }
    }
}

impl TryFrom<pb::DataRef> for spec::DataRef {
    type Error = ConvertError;
    /// Refuses an empty `uri` or `region`. Out of context the element has no index, so the paths
    /// read `data[].uri`; inside a [`JobSpec`] they carry it (`data[1].uri`).
    fn try_from(data: pb::DataRef) -> Result<Self> {
        data_ref_from_wire(data, "data[]")
    }
}

impl From<pb::BurstPolicy> for BurstPolicy {
    /// `never: true` wins over the other fields, as the protocol documents.
    fn from(burst: pb::BurstPolicy) -> Self {
        if burst.never {
            BurstPolicy::Never
        } else {
            BurstPolicy::After {
                after: HumanDuration::from_secs(burst.after_seconds),
                max_usd_per_hour: burst.max_usd_per_hour,
            }
        }
    }
}

impl TryFrom<pb::PlacementRules> for spec::PlacementRules {
    type Error = ConvertError;
    /// An absent `burst` takes the spec default (burst after 1h, no cap); an empty selector
    /// matches everything. A selector that does not parse is refused as an invalid spec with the
    /// field `placement.clusterSelector` or `placement.nodeSelector`, both listed when both fail.
    fn try_from(placement: pb::PlacementRules) -> Result<Self> {
        let mut errors = Vec::new();
        let mut selector = |field: &str, text: &str| {
            text.parse::<Selector>().unwrap_or_else(|e| {
                errors.push(FieldError { field: field.to_string(), reason: e.to_string() });
                Selector::everything()
            })
        };
        let cluster_selector = selector("placement.clusterSelector", &placement.cluster_selector);
        let node_selector = selector("placement.nodeSelector", &placement.node_selector);
        if !errors.is_empty() {
            return Err(ConvertError::InvalidSpec(SpecError::Invalid(errors)));
        }
        Ok(spec::PlacementRules {
            regions: placement.regions,
            clusters: spec::ClusterRules { include: placement.include_clusters, exclude: placement.exclude_clusters },
            burst: placement.burst.map(BurstPolicy::from).unwrap_or_default(),
            cluster_selector,
            node_selector,
        })
    }
}

impl From<pb::Payload> for spec::Payload {
    /// An empty `image` means none.
    fn from(payload: pb::Payload) -> Self {
        spec::Payload {
            image: non_empty(payload.image),
            command: payload.command,
            env: payload.env.into_iter().collect(),
            secret_env: payload.secret_env.into_iter().collect(),
        }
    }
}

impl TryFrom<pb::JobSpec> for JobSpec {
    type Error = ConvertError;
    /// Refuses an absent `gang`, `gang.resources` or `payload`, an empty `name` or `tenant`, and
    /// an empty `data[i].uri` or `data[i].region`. Does not validate: see [`spec_from_wire`].
    fn try_from(wire: pb::JobSpec) -> Result<Self> {
        let name = required(wire.name, || "name".into())?;
        let tenant = required(wire.tenant, || "tenant".into())?;
        let gang = wire.gang.ok_or_else(|| missing("gang"))?.try_into()?;
        let data = wire
            .data
            .into_iter()
            .enumerate()
            .map(|(i, data)| data_ref_from_wire(data, &format!("data[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let payload = wire.payload.ok_or_else(|| missing("payload"))?.into();
        Ok(JobSpec {
            name,
            tenant,
            priority: wire.priority,
            preemptible: wire.preemptible,
            labels: wire.labels.into_iter().collect(),
            idempotency_key: non_empty(wire.idempotency_key),
            gang,
            runtime: wire.runtime.map(spec::RuntimeSpec::from).unwrap_or_default(),
            data,
            placement: wire.placement.map(spec::PlacementRules::try_from).transpose()?.unwrap_or_default(),
            payload,
        })
    }
}

/// Labels a member reports (its own or a shape's): the label rules of the job spec, and no key
/// with the reserved `meridian.io/` prefix. The first bad entry is refused with its path
/// (`hello.labels.gpu fabric`).
fn labels_from_wire(labels: std::collections::HashMap<String, String>, path: &str) -> Result<BTreeMap<String, String>> {
    let labels: BTreeMap<String, String> = labels.into_iter().collect();
    match validate::member_label_errors(path, &labels).into_iter().next() {
        Some(error) => Err(ConvertError::InvalidLabel { field: error.field, reason: error.reason }),
        None => Ok(labels),
    }
}

fn data_ref_from_wire(data: pb::DataRef, path: &str) -> Result<spec::DataRef> {
    Ok(spec::DataRef {
        uri: required(data.uri, || format!("{path}.uri"))?,
        size_gib: data.size_gib,
        region: required(data.region, || format!("{path}.region"))?,
    })
}

// ---------------------------------------------------------------- cluster identity

impl From<&ClusterInfo> for pb::Hello {
    /// `agent_version` is left empty: it is not part of [`ClusterInfo`]; the agent fills it in.
    fn from(info: &ClusterInfo) -> Self {
        pb::Hello {
            cluster: info.name.clone(),
            region: info.region.clone(),
            tier: pb::Tier::from(info.tier).into(),
            backend: pb::BackendKind::from(info.backend).into(),
            prices: info
                .prices
                .iter()
                .map(|(gpu_type, &usd_per_gpu_hour)| pb::GpuPrice { gpu_type: gpu_type.clone(), usd_per_gpu_hour })
                .collect(),
            supports_containers: info.supports_containers,
            supports_bare_commands: info.supports_bare_commands,
            agent_version: String::new(),
            instance_id: String::new(),
            labels: info.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

impl TryFrom<pb::Hello> for ClusterInfo {
    type Error = ConvertError;
    /// Refuses an empty cluster name or region, an unspecified or unknown tier or backend, a
    /// price without a GPU type, a GPU type priced twice, and a price that is not a finite
    /// number ≥ 0. `agent_version` is dropped (the caller logs it if it wants).
    fn try_from(hello: pb::Hello) -> Result<Self> {
        let name = required(hello.cluster, || "hello.cluster".into())?;
        let region = required(hello.region, || "hello.region".into())?;
        let tier = tier_from_wire("hello.tier", hello.tier)?;
        let backend = backend_from_wire("hello.backend", hello.backend)?;
        let mut prices = BTreeMap::new();
        for (i, price) in hello.prices.into_iter().enumerate() {
            let gpu_type = required(price.gpu_type, || format!("hello.prices[{i}].gpu_type"))?;
            let usd = price.usd_per_gpu_hour;
            if !usd.is_finite() || usd < 0.0 {
                return Err(ConvertError::OutOfRange {
                    field: format!("hello.prices[{i}].usd_per_gpu_hour"),
                    value: usd,
                    expected: "a finite number of US$ per GPU-hour, 0 or more",
                });
            }
            if prices.contains_key(&gpu_type) {
                return Err(ConvertError::Duplicate { field: "hello.prices".into(), key: gpu_type });
            }
            prices.insert(gpu_type, usd);
        }
        let labels = labels_from_wire(hello.labels, "hello.labels")?;
        Ok(ClusterInfo {
            name,
            region,
            tier,
            backend,
            prices,
            supports_containers: hello.supports_containers,
            supports_bare_commands: hello.supports_bare_commands,
            labels,
        })
    }
}

// ---------------------------------------------------------------- inventory

impl From<&Inventory> for pb::Inventory {
    fn from(inventory: &Inventory) -> Self {
        let shapes = inventory
            .shapes
            .iter()
            .map(|shape| pb::NodeShape {
                name: shape.name.clone(),
                gpu_type: shape.gpu_type.clone(),
                gpu_memory_gib: shape.gpu_memory_gib,
                gpus_per_node: shape.gpus_per_node,
                cpu_per_node: shape.cpu_per_node,
                memory_gib_per_node: shape.memory_gib_per_node,
                free: shape
                    .free
                    .iter()
                    .map(|node| pb::NodeFree { gpus: node.gpus, cpu: node.cpu, memory_gib: node.memory_gib })
                    .collect(),
                labels: shape.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect();
        pb::Inventory { shapes }
    }
}

impl TryFrom<pb::Inventory> for Inventory {
    type Error = ConvertError;
    /// Refuses a shape without a name, two shapes with the same name, a shape with GPUs but no
    /// GPU type, and a node reporting more GPUs, CPU or memory free than its shape has per node.
    ///
    /// A shape with `gpus_per_node == 0` is accepted: a cluster whose scheduler also manages
    /// CPU-only nodes may report them, and since every replica needs at least one GPU, placement
    /// can never use them anyway. Refusing them would refuse the whole report.
    fn try_from(inventory: pb::Inventory) -> Result<Self> {
        let mut names = BTreeSet::new();
        let mut shapes = Vec::with_capacity(inventory.shapes.len());
        for (i, shape) in inventory.shapes.into_iter().enumerate() {
            let path = format!("inventory.shapes[{i}]");
            let name = required(shape.name, || format!("{path}.name"))?;
            if !names.insert(name.clone()) {
                return Err(ConvertError::Duplicate { field: "inventory.shapes".into(), key: name });
            }
            if shape.gpus_per_node > 0 && shape.gpu_type.is_empty() {
                return Err(missing(&format!("{path}.gpu_type")));
            }
            let mut free = Vec::with_capacity(shape.free.len());
            for (j, node) in shape.free.into_iter().enumerate() {
                let check = |resource: &str, free: u32, capacity: u32| {
                    if free > capacity {
                        Err(ConvertError::FreeExceedsCapacity {
                            field: format!("{path}.free[{j}].{resource}"),
                            free,
                            capacity,
                        })
                    } else {
                        Ok(())
                    }
                };
                check("gpus", node.gpus, shape.gpus_per_node)?;
                check("cpu", node.cpu, shape.cpu_per_node)?;
                check("memory_gib", node.memory_gib, shape.memory_gib_per_node)?;
                free.push(NodeFree { gpus: node.gpus, cpu: node.cpu, memory_gib: node.memory_gib });
            }
            let labels = labels_from_wire(shape.labels, &format!("{path}.labels"))?;
            shapes.push(NodeShape {
                labels,
                name,
                gpu_type: shape.gpu_type,
                gpu_memory_gib: shape.gpu_memory_gib,
                gpus_per_node: shape.gpus_per_node,
                cpu_per_node: shape.cpu_per_node,
                memory_gib_per_node: shape.memory_gib_per_node,
                free,
            });
        }
        Ok(Inventory { shapes })
    }
}

// ---------------------------------------------------------------- queue pressure

impl From<&QueuePressure> for pb::QueuePressure {
    fn from(pressure: &QueuePressure) -> Self {
        pb::QueuePressure {
            queues: pressure
                .queues
                .iter()
                .map(|q| pb::QueueLoad {
                    queue: q.queue.to_string(),
                    weight: q.weight,
                    pending_jobs: q.pending_jobs,
                    pending_gpus: q.pending_gpus,
                    running_gpus: q.running_gpus,
                })
                .collect(),
            releases: pressure
                .releases
                .iter()
                .map(|r| pb::GpuRelease { after_seconds: r.after_secs, gpus: r.gpus })
                .collect(),
            estimated_wait_seconds: pressure.estimated_wait_secs,
        }
    }
}

impl TryFrom<pb::QueuePressure> for QueuePressure {
    type Error = ConvertError;
    /// Refuses a queue without a name, a queue named twice, and a weight that is not a finite
    /// number > 0.
    ///
    /// Releases are **sorted** ascending by `after_seconds` (stable) rather than refused when out
    /// of order: their order carries no information beyond the times themselves, so sorting loses
    /// nothing, while refusing would throw away an otherwise good report from an agent that merges
    /// several sources.
    fn try_from(pressure: pb::QueuePressure) -> Result<Self> {
        let mut names = BTreeSet::new();
        let mut queues = Vec::with_capacity(pressure.queues.len());
        for (i, q) in pressure.queues.into_iter().enumerate() {
            let queue = required(q.queue, || format!("pressure.queues[{i}].queue"))?;
            if !names.insert(queue.clone()) {
                return Err(ConvertError::Duplicate { field: "pressure.queues".into(), key: queue });
            }
            if !q.weight.is_finite() || q.weight <= 0.0 {
                return Err(ConvertError::OutOfRange {
                    field: format!("pressure.queues[{i}].weight"),
                    value: q.weight,
                    expected: "a finite number greater than 0",
                });
            }
            queues.push(QueueLoad {
                queue: queue.into(),
                weight: q.weight,
                pending_jobs: q.pending_jobs,
                pending_gpus: q.pending_gpus,
                running_gpus: q.running_gpus,
            });
        }
        let mut releases: Vec<GpuRelease> =
            pressure.releases.into_iter().map(|r| GpuRelease { after_secs: r.after_seconds, gpus: r.gpus }).collect();
        releases.sort_by_key(|r| r.after_secs);
        Ok(QueuePressure { queues, releases, estimated_wait_secs: pressure.estimated_wait_seconds })
    }
}

// ---------------------------------------------------------------- helpers

fn missing(field: &str) -> ConvertError {
    ConvertError::MissingField(field.to_string())
}

/// `value` itself, or `MissingField` when it is empty or only whitespace.
fn required(value: String, field: impl FnOnce() -> String) -> Result<String> {
    if value.trim().is_empty() { Err(ConvertError::MissingField(field())) } else { Ok(value) }
}

fn non_empty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

#[cfg(test)]
// Panicking on an unexpected result is how a test fails; the workspace lint targets library code.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::validate::parse_job_spec;

    use crate::validate::EXAMPLE_SPEC as EXAMPLE;

    fn example() -> JobSpec {
        parse_job_spec(EXAMPLE, &GpuCatalog::default()).unwrap()
    }

    fn round_trip(spec: &JobSpec) -> JobSpec {
        JobSpec::try_from(pb::JobSpec::from(spec)).unwrap()
    }

    fn cluster_info() -> ClusterInfo {
        ClusterInfo {
            name: "hpc-east".into(),
            region: "us-east".into(),
            tier: Tier::Cloud,
            backend: BackendKind::Slurm,
            prices: BTreeMap::from([("h100".to_string(), 2.5), ("a100-80g".to_string(), 0.0)]),
            supports_containers: true,
            supports_bare_commands: false,
            labels: BTreeMap::from([("gpu-fabric".to_string(), "ib".to_string())]),
        }
    }

    fn inventory() -> Inventory {
        Inventory {
            shapes: vec![
                NodeShape {
                    name: "dgx-h100".into(),
                    gpu_type: "h100".into(),
                    gpu_memory_gib: 80,
                    gpus_per_node: 8,
                    cpu_per_node: 112,
                    memory_gib_per_node: 2048,
                    free: vec![
                        NodeFree { gpus: 8, cpu: 112, memory_gib: 2048 },
                        NodeFree { gpus: 3, cpu: 40, memory_gib: 512 },
                    ],
                    labels: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
                },
                NodeShape {
                    name: "l4-box".into(),
                    gpu_type: "l4".into(),
                    gpu_memory_gib: 24,
                    gpus_per_node: 4,
                    cpu_per_node: 32,
                    memory_gib_per_node: 256,
                    free: vec![NodeFree::default()],
                    labels: BTreeMap::new(),
                },
            ],
        }
    }

    fn pressure() -> QueuePressure {
        QueuePressure {
            queues: vec![
                QueueLoad { queue: "default".into(), weight: 1.0, pending_jobs: 3, pending_gpus: 24, running_gpus: 16 },
                QueueLoad { queue: "nlp".into(), weight: 2.5, pending_jobs: 0, pending_gpus: 0, running_gpus: 8 },
            ],
            releases: vec![GpuRelease { after_secs: 60, gpus: 8 }, GpuRelease { after_secs: 3600, gpus: 16 }],
            estimated_wait_secs: 900,
        }
    }

    fn missing_field(err: ConvertError) -> String {
        match err {
            ConvertError::MissingField(field) => field,
            other => panic!("expected MissingField, got {other:?}"),
        }
    }

    #[test]
    fn the_documented_example_round_trips_through_the_wire() {
        let spec = example();
        assert_eq!(round_trip(&spec), spec);
        assert_eq!(spec_from_wire(pb::JobSpec::from(&spec), &GpuCatalog::default()).unwrap(), spec);
    }

    #[test]
    fn secret_env_values_reach_the_member_over_the_wire() {
        let text = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n\
                    payload: {command: [x], env: {API_KEY: real-value, LR: '1'}, secretEnv: [API_KEY]}\n";
        let spec = parse_job_spec(text, &GpuCatalog::default()).unwrap();
        let wire = pb::JobSpec::from(&spec);
        let payload = wire.payload.as_ref().unwrap();
        assert_eq!(payload.env["API_KEY"], "real-value");
        assert_eq!(payload.secret_env, vec!["API_KEY".to_string()]);
        assert_eq!(round_trip(&spec), spec);
        // What users see keeps the marking but not the value.
        let shown = pb::JobSpec::from(&spec.redacted());
        assert_eq!(shown.payload.unwrap().env["API_KEY"], crate::spec::SECRET_SET);
    }

    /// The fenced code blocks of `docs/job-spec.md` tagged `lang`, in order.
    fn doc_blocks(lang: &str) -> Vec<String> {
        let doc = include_str!("../../../docs/job-spec.md");
        let fence = format!("```{lang}\n");
        doc.split(fence.as_str())
            .skip(1)
            .filter_map(|rest| rest.split_once("```").map(|(block, _)| block.to_string()))
            .collect()
    }

    #[test]
    fn the_reference_examples_are_the_example_in_both_forms() {
        let catalog = GpuCatalog::default();
        let yaml = doc_blocks("yaml");
        let json = doc_blocks("json");
        assert_eq!(parse_job_spec(&yaml[0], &catalog).unwrap(), example());
        assert_eq!(parse_job_spec(&json[0], &catalog).unwrap(), example());
        let smallest = parse_job_spec(&yaml[1], &catalog).unwrap();
        assert_eq!(round_trip(&smallest), smallest);
    }

    #[test]
    fn the_slice_and_selector_examples_parse_and_round_trip() {
        let catalog = GpuCatalog::default();
        let yaml = doc_blocks("yaml");
        let slice = yaml.iter().find(|b| b.contains("name: notebook-eval")).unwrap();
        let spec = parse_job_spec(slice, &catalog).unwrap();
        assert_eq!(spec.gang.resources.gpu_types, vec!["a100-80g.1g.10gb".to_string()]);
        assert_eq!(round_trip(&spec), spec);
        let selectors = yaml.iter().find(|b| b.contains("name: allreduce-bench")).unwrap();
        let spec = parse_job_spec(selectors, &catalog).unwrap();
        assert_eq!(spec.placement.node_selector().to_string(), "rack,!preemptible");
        assert_eq!(round_trip(&spec), spec);
        let snippet = yaml.iter().find(|b| b.starts_with("placement:\n  clusterSelector")).unwrap();
        let spec = parse_job_spec(&format!("{}{snippet}", yaml[1]), &catalog).unwrap();
        assert_eq!(spec.placement.cluster_selector().to_string(), "gpu-fabric=ib,meridian.io/tier!=cloud");
        assert_eq!(spec.placement.node_selector().to_string(), "rack=r1");
    }

    #[test]
    fn optional_fields_round_trip_as_empty_values() {
        let mut spec = example();
        spec.idempotency_key = None;
        spec.runtime.limit = None;
        spec.payload.image = None;
        spec.placement.burst = BurstPolicy::Never;
        let wire = pb::JobSpec::from(&spec);
        assert_eq!(wire.idempotency_key, "");
        assert_eq!(wire.runtime.as_ref().map(|r| r.limit_seconds), Some(0));
        assert_eq!(wire.payload.as_ref().map(|p| p.image.as_str()), Some(""));
        assert!(wire.placement.as_ref().and_then(|p| p.burst).is_some_and(|b| b.never));
        assert_eq!(JobSpec::try_from(wire).unwrap(), spec);
    }

    #[test]
    fn burst_without_a_cap_and_burst_at_once_round_trip() {
        let mut spec = example();
        spec.placement.burst = BurstPolicy::After { after: HumanDuration::from_secs(0), max_usd_per_hour: None };
        assert_eq!(round_trip(&spec), spec);
    }

    #[test]
    fn a_deadline_round_trips_and_none_travels_as_zero() {
        let mut spec = example();
        spec.runtime.deadline = Some(HumanDuration::from_secs(12 * 3600));
        assert_eq!(pb::JobSpec::from(&spec).runtime.map(|r| r.deadline_seconds), Some(12 * 3600));
        assert_eq!(round_trip(&spec), spec);
        spec.runtime.deadline = None;
        assert_eq!(pb::JobSpec::from(&spec).runtime.map(|r| r.deadline_seconds), Some(0));
        assert_eq!(round_trip(&spec), spec);
    }

    #[test]
    fn never_wins_over_the_other_burst_fields() {
        let wire = pb::BurstPolicy { never: true, after_seconds: 60, max_usd_per_hour: Some(10.0) };
        assert_eq!(BurstPolicy::from(wire), BurstPolicy::Never);
    }

    #[test]
    fn sub_second_durations_are_floored_on_the_wire() {
        let runtime = spec::RuntimeSpec {
            estimate: "1s500ms".parse().unwrap(),
            limit: Some("2s999ms".parse().unwrap()),
            deadline: None,
        };
        let wire = pb::RuntimeSpec::from(&runtime);
        assert_eq!((wire.estimate_seconds, wire.limit_seconds), (1, 2));
    }

    #[test]
    fn absent_optional_messages_take_the_spec_defaults() {
        let mut wire = pb::JobSpec::from(&example());
        wire.runtime = None;
        wire.placement = None;
        let spec = JobSpec::try_from(wire.clone()).unwrap();
        assert_eq!(spec.runtime, spec::RuntimeSpec::default());
        assert_eq!(spec.placement, spec::PlacementRules::default());

        wire.placement = Some(pb::PlacementRules { burst: None, ..Default::default() });
        assert_eq!(JobSpec::try_from(wire).unwrap().placement.burst, BurstPolicy::default());
    }

    #[test]
    fn absent_required_messages_are_named() {
        let full = pb::JobSpec::from(&example());

        let mut wire = full.clone();
        wire.gang = None;
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "gang");

        let mut wire = full.clone();
        wire.gang = Some(pb::GangSpec { replicas: 2, resources: None });
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "gang.resources");

        let mut wire = full;
        wire.payload = None;
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "payload");
    }

    #[test]
    fn empty_required_strings_are_named() {
        let full = pb::JobSpec::from(&example());

        let mut wire = full.clone();
        wire.name.clear();
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "name");

        let mut wire = full.clone();
        wire.tenant = "  ".into();
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "tenant");

        let mut wire = full.clone();
        wire.data.push(pb::DataRef { uri: String::new(), size_gib: 1.0, region: "eu-west".into() });
        assert_eq!(missing_field(JobSpec::try_from(wire).unwrap_err()), "data[1].uri");

        let mut wire = full;
        wire.data[0].region.clear();
        let err = JobSpec::try_from(wire).unwrap_err();
        assert!(err.to_string().starts_with("data[0].region:"), "{err}");
        assert_eq!(missing_field(err), "data[0].region");
    }

    #[test]
    fn a_standalone_data_ref_names_its_field_without_an_index() {
        let err = spec::DataRef::try_from(pb::DataRef { uri: "s3://x/y".into(), ..Default::default() }).unwrap_err();
        assert_eq!(missing_field(err), "data[].region");
    }

    #[test]
    fn spec_from_wire_validates_and_keeps_every_field_error() {
        let mut wire = pb::JobSpec::from(&example());
        wire.priority = 150;
        if let Some(gang) = wire.gang.as_mut() {
            gang.replicas = 0;
        }
        let err = spec_from_wire(wire, &GpuCatalog::default()).unwrap_err();
        let ConvertError::InvalidSpec(spec_error) = &err else { panic!("expected InvalidSpec, got {err:?}") };
        let fields: Vec<String> = spec_error.field_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, vec!["priority", "gang.replicas"]);
        assert!(std::error::Error::source(&err).is_some());
        assert!(err.to_string().contains("gang.replicas"), "{err}");
    }

    #[test]
    fn every_job_state_round_trips_and_unspecified_is_refused() {
        for state in JobState::ALL {
            let wire = pb::JobState::from(state);
            assert_eq!(JobState::try_from(wire).unwrap(), state);
            assert_eq!(job_state_from_wire("job.state", wire.into()).unwrap(), state);
        }
        assert!(matches!(
            JobState::try_from(pb::JobState::Unspecified),
            Err(ConvertError::InvalidEnum { value: 0, ref field, .. }) if field == "state"
        ));
        let err = job_state_from_wire("job.state", 42).unwrap_err();
        assert!(matches!(err, ConvertError::InvalidEnum { value: 42, .. }));
        assert!(err.to_string().starts_with("job.state: 42 is not a valid value"), "{err}");
    }

    #[test]
    fn tiers_and_backends_round_trip_and_unspecified_is_refused() {
        for tier in [Tier::Owned, Tier::Cloud] {
            assert_eq!(Tier::try_from(pb::Tier::from(tier)).unwrap(), tier);
        }
        for backend in [BackendKind::Builtin, BackendKind::Slurm, BackendKind::Kubernetes] {
            assert_eq!(BackendKind::try_from(pb::BackendKind::from(backend)).unwrap(), backend);
        }
        assert!(matches!(Tier::try_from(pb::Tier::Unspecified), Err(ConvertError::InvalidEnum { value: 0, .. })));
        assert!(matches!(
            BackendKind::try_from(pb::BackendKind::Unspecified),
            Err(ConvertError::InvalidEnum { value: 0, .. })
        ));
        assert!(matches!(tier_from_wire("tier", 7), Err(ConvertError::InvalidEnum { value: 7, .. })));
        assert!(matches!(backend_from_wire("backend", -1), Err(ConvertError::InvalidEnum { value: -1, .. })));
    }

    #[test]
    fn cluster_info_round_trips_through_hello() {
        let info = cluster_info();
        let hello = pb::Hello::from(&info);
        assert_eq!(hello.agent_version, "");
        assert_eq!(ClusterInfo::try_from(hello).unwrap(), info);
    }

    #[test]
    fn hello_without_identity_is_refused() {
        let full = pb::Hello::from(&cluster_info());

        let mut hello = full.clone();
        hello.cluster.clear();
        assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.cluster");

        let mut hello = full.clone();
        hello.region.clear();
        assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.region");

        let mut hello = full.clone();
        hello.tier = pb::Tier::Unspecified.into();
        assert!(matches!(
            ClusterInfo::try_from(hello),
            Err(ConvertError::InvalidEnum { ref field, value: 0, .. }) if field == "hello.tier"
        ));

        let mut hello = full;
        hello.backend = 9;
        assert!(matches!(
            ClusterInfo::try_from(hello),
            Err(ConvertError::InvalidEnum { ref field, value: 9, .. }) if field == "hello.backend"
        ));
    }

    #[test]
    fn hello_with_bad_prices_is_refused() {
        let full = pb::Hello::from(&cluster_info());
        for bad in [f64::NAN, f64::INFINITY, -0.5] {
            let mut hello = full.clone();
            hello.prices[1].usd_per_gpu_hour = bad;
            let err = ClusterInfo::try_from(hello).unwrap_err();
            assert!(
                matches!(err, ConvertError::OutOfRange { ref field, .. } if field == "hello.prices[1].usd_per_gpu_hour"),
                "{err:?}"
            );
        }

        let mut hello = full.clone();
        hello.prices.push(pb::GpuPrice { gpu_type: "h100".into(), usd_per_gpu_hour: 3.0 });
        assert_eq!(
            ClusterInfo::try_from(hello).unwrap_err(),
            ConvertError::Duplicate { field: "hello.prices".into(), key: "h100".into() }
        );

        let mut hello = full;
        hello.prices[0].gpu_type.clear();
        assert_eq!(missing_field(ClusterInfo::try_from(hello).unwrap_err()), "hello.prices[0].gpu_type");
    }

    #[test]
    fn inventory_round_trips() {
        let inventory = inventory();
        assert_eq!(Inventory::try_from(pb::Inventory::from(&inventory)).unwrap(), inventory);
        assert_eq!(Inventory::try_from(pb::Inventory::default()).unwrap(), Inventory::default());
    }

    #[test]
    fn a_node_with_more_free_than_its_shape_is_refused() {
        let full = pb::Inventory::from(&inventory());
        let cases = [
            (pb::NodeFree { gpus: 9, cpu: 0, memory_gib: 0 }, "gpus", 9, 8),
            (pb::NodeFree { gpus: 0, cpu: 113, memory_gib: 0 }, "cpu", 113, 112),
            (pb::NodeFree { gpus: 0, cpu: 0, memory_gib: 4096 }, "memory_gib", 4096, 2048),
        ];
        for (node, resource, free, capacity) in cases {
            let mut wire = full.clone();
            wire.shapes[0].free[1] = node;
            assert_eq!(
                Inventory::try_from(wire).unwrap_err(),
                ConvertError::FreeExceedsCapacity {
                    field: format!("inventory.shapes[0].free[1].{resource}"),
                    free,
                    capacity
                }
            );
        }
    }

    #[test]
    fn a_cpu_only_shape_is_accepted() {
        let mut wire = pb::Inventory::from(&inventory());
        wire.shapes.push(pb::NodeShape {
            name: "cpu-only".into(),
            cpu_per_node: 64,
            memory_gib_per_node: 512,
            free: vec![pb::NodeFree { gpus: 0, cpu: 64, memory_gib: 512 }],
            ..Default::default()
        });
        let inventory = Inventory::try_from(wire).unwrap();
        assert_eq!(inventory.shapes[2].gpus_total(), 0);
    }

    #[test]
    fn inventory_shapes_need_a_unique_name_and_a_gpu_type() {
        let full = pb::Inventory::from(&inventory());

        let mut wire = full.clone();
        wire.shapes[1].name.clear();
        assert_eq!(missing_field(Inventory::try_from(wire).unwrap_err()), "inventory.shapes[1].name");

        let mut wire = full.clone();
        wire.shapes[1].name = "dgx-h100".into();
        assert_eq!(
            Inventory::try_from(wire).unwrap_err(),
            ConvertError::Duplicate { field: "inventory.shapes".into(), key: "dgx-h100".into() }
        );

        let mut wire = full;
        wire.shapes[0].gpu_type.clear();
        assert_eq!(missing_field(Inventory::try_from(wire).unwrap_err()), "inventory.shapes[0].gpu_type");
    }

    #[test]
    fn queue_pressure_round_trips() {
        let pressure = pressure();
        assert_eq!(QueuePressure::try_from(pb::QueuePressure::from(&pressure)).unwrap(), pressure);
    }

    #[test]
    fn releases_out_of_order_are_sorted() {
        let mut wire = pb::QueuePressure::from(&pressure());
        wire.releases.reverse();
        wire.releases.push(pb::GpuRelease { after_seconds: 60, gpus: 1 });
        let releases = QueuePressure::try_from(wire).unwrap().releases;
        assert_eq!(
            releases,
            vec![
                GpuRelease { after_secs: 60, gpus: 8 },
                GpuRelease { after_secs: 60, gpus: 1 },
                GpuRelease { after_secs: 3600, gpus: 16 },
            ]
        );
    }

    #[test]
    fn queue_weights_must_be_finite_and_positive() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut wire = pb::QueuePressure::from(&pressure());
            wire.queues[1].weight = bad;
            let err = QueuePressure::try_from(wire).unwrap_err();
            assert!(
                matches!(err, ConvertError::OutOfRange { ref field, .. } if field == "pressure.queues[1].weight"),
                "{err:?}"
            );
            assert!(err.to_string().starts_with("pressure.queues[1].weight:"), "{err}");
        }
    }

    #[test]
    fn queues_need_a_unique_name() {
        let full = pb::QueuePressure::from(&pressure());

        let mut wire = full.clone();
        wire.queues[0].queue.clear();
        assert_eq!(missing_field(QueuePressure::try_from(wire).unwrap_err()), "pressure.queues[0].queue");

        let mut wire = full;
        wire.queues[1].queue = "default".into();
        assert_eq!(
            QueuePressure::try_from(wire).unwrap_err(),
            ConvertError::Duplicate { field: "pressure.queues".into(), key: "default".into() }
        );
    }

    #[test]
    fn selectors_round_trip_through_the_wire() {
        let mut spec = example();
        spec.placement.cluster_selector = "gpu-fabric=ib,meridian.io/tier!=cloud".parse().unwrap();
        spec.placement.node_selector = "rack,!preemptible".parse().unwrap();
        let wire = pb::JobSpec::from(&spec);
        let placement = wire.placement.as_ref().unwrap();
        assert_eq!(placement.cluster_selector, "gpu-fabric=ib,meridian.io/tier!=cloud");
        assert_eq!(placement.node_selector, "rack,!preemptible");
        assert_eq!(spec_from_wire(wire, &GpuCatalog::default()).unwrap(), spec);
    }

    #[test]
    fn bad_selectors_on_the_wire_name_their_fields() {
        let mut wire = pb::JobSpec::from(&example());
        if let Some(placement) = wire.placement.as_mut() {
            placement.cluster_selector = "a=1,=x".into();
            placement.node_selector = "rack=r 1".into();
        }
        let err = JobSpec::try_from(wire).unwrap_err();
        let ConvertError::InvalidSpec(spec_error) = &err else { panic!("expected InvalidSpec, got {err:?}") };
        let fields: Vec<String> = spec_error.field_errors().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, vec!["placement.clusterSelector", "placement.nodeSelector"]);
        assert!(err.to_string().contains("placement.nodeSelector: requirement 1 `rack=r 1`"), "{err}");
    }

    #[test]
    fn cluster_and_node_labels_travel_and_bad_ones_are_refused() {
        let hello = pb::Hello::from(&cluster_info());
        assert_eq!(hello.labels.get("gpu-fabric").map(String::as_str), Some("ib"));

        let mut bad = hello.clone();
        bad.labels.insert("meridian.io/region".into(), "x".into());
        let err = ClusterInfo::try_from(bad).unwrap_err();
        assert!(
            matches!(err, ConvertError::InvalidLabel { ref field, .. } if field == "hello.labels.meridian.io/region"),
            "{err:?}"
        );

        let mut wire = pb::Inventory::from(&inventory());
        assert_eq!(wire.shapes[0].labels.get("rack").map(String::as_str), Some("r1"));
        wire.shapes[1].labels.insert("rack".into(), "r 1".into());
        let err = Inventory::try_from(wire).unwrap_err();
        assert!(err.to_string().starts_with("inventory.shapes[1].labels.rack: label values are"), "{err}");
    }
}
