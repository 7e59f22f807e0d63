//! Job specs on the wire, both ways: domain → wire is infallible, wire → domain checks what the
//! wire cannot express (see the parent module for the rules).

use super::super::pb;
use super::*;
use crate::duration::HumanDuration;
use crate::selector::Selector;
use crate::spec::{self, BurstPolicy, JobSpec};
use crate::validate::{FieldError, SpecError};

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
            launcher_env: if payload.launcher_env.is_default() {
                String::new()
            } else {
                payload.launcher_env.as_str().to_owned()
            },
            launcher_env_names: payload.launcher_env_names.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
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

impl TryFrom<pb::Payload> for spec::Payload {
    type Error = ConvertError;
    /// An empty `image` means none; an empty `launcher_env` means the default (`torch`).
    fn try_from(payload: pb::Payload) -> Result<Self> {
        let launcher_env = match payload.launcher_env.as_str() {
            "" | "torch" => spec::LauncherEnv::Torch,
            "none" => spec::LauncherEnv::None,
            other => {
                return Err(ConvertError::InvalidName {
                    field: "payload.launcher_env".into(),
                    value: other.to_owned(),
                    expected: "torch, none",
                });
            }
        };
        Ok(spec::Payload {
            image: non_empty(payload.image),
            command: payload.command,
            env: payload.env.into_iter().collect(),
            secret_env: payload.secret_env.into_iter().collect(),
            launcher_env,
            launcher_env_names: payload.launcher_env_names.into_iter().collect(),
        })
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
        let payload = wire.payload.ok_or_else(|| missing("payload"))?.try_into()?;
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

fn data_ref_from_wire(data: pb::DataRef, path: &str) -> Result<spec::DataRef> {
    Ok(spec::DataRef {
        uri: required(data.uri, || format!("{path}.uri"))?,
        size_gib: data.size_gib,
        region: required(data.region, || format!("{path}.region"))?,
    })
}
