//! The job contract: the environment every replica of a job gets, the same on every backend
//! (`docs/job-spec.md#job-environment`).
//!
//! A backend renders each [`Variable`] in its own idiom: the process runner writes values, the
//! Slurm backend's batch script derives the replica index from `SLURM_PROCID` and the
//! coordinator from the allocation's first node, the Kubernetes backend reads the index from the
//! pod's annotation. What the variables are, their names and order, and which a spec opts out of
//! or renames, is decided here once.
//!
//! - The `MERIDIAN_*` variables are always set ([`MERIDIAN`]); a spec cannot set or rename them
//!   (validation refuses those names in `payload.env`, see [`is_contract_name`]).
//! - The launcher's variables ([`launcher_variables`]) follow, under the names
//!   `payload.launcherEnvNames` gives them; `payload.launcherEnv: none` leaves them out.
//! - A name `payload.env` sets is the user's: the launcher variable of that name is left out.
//!
//! Every variable a replica depends on for its own index comes after `MERIDIAN_REPLICA`, so a
//! backend may define the later ones by reference to it (Kubernetes' `$(VAR)`).

use std::collections::BTreeMap;

use crate::spec::{LauncherEnv, Payload};

/// The prefix of the contract's own names; a rename may not take a name with it.
pub const RESERVED_PREFIX: &str = "MERIDIAN_";

/// Whether `name` is one of the `MERIDIAN_*` variables the contract sets, which `payload.env`
/// may not set. Other names with the prefix stay the user's: specs written before the contract
/// use some.
pub fn is_contract_name(name: &str) -> bool {
    MERIDIAN.iter().any(|(own, _)| *own == name)
}

/// Where a variable's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The job's id.
    JobId,
    /// The binding the replica runs under (a job placed again runs under a higher one).
    FencingToken,
    /// The member cluster's name.
    Cluster,
    /// This replica's index, 0 to replicas − 1; replica 0 runs on the coordinator's host.
    Replica,
    /// The gang's replica count.
    Replicas,
    /// GPUs each replica holds.
    GpusPerReplica,
    /// A host name or address every replica can reach, where replica 0 runs.
    CoordinatorHost,
    /// A TCP port reserved for the job on the coordinator's host.
    CoordinatorPort,
    /// `host:port` of the two above.
    Coordinator,
}

impl Source {
    /// Whether the value differs between the replicas of one job.
    pub fn per_replica(self) -> bool {
        self == Source::Replica
    }
}

/// The variables every replica gets, in order.
pub const MERIDIAN: [(&str, Source); 9] = [
    ("MERIDIAN_JOB_ID", Source::JobId),
    ("MERIDIAN_FENCING_TOKEN", Source::FencingToken),
    ("MERIDIAN_CLUSTER", Source::Cluster),
    ("MERIDIAN_REPLICA", Source::Replica),
    ("MERIDIAN_REPLICAS", Source::Replicas),
    ("MERIDIAN_GPUS_PER_REPLICA", Source::GpusPerReplica),
    ("MERIDIAN_COORDINATOR_HOST", Source::CoordinatorHost),
    ("MERIDIAN_COORDINATOR_PORT", Source::CoordinatorPort),
    ("MERIDIAN_COORDINATOR", Source::Coordinator),
];

/// The name of the replica-index variable, which backends may refer to.
pub const REPLICA_VAR: &str = "MERIDIAN_REPLICA";

/// PyTorch's: `init_process_group(init_method="env://")` reads the first four; `torchrun` reads
/// its `--nnodes`, `--node-rank`, `--master-addr` and `--master-port` defaults from `PET_*`.
const TORCH: [(&str, Source); 9] = [
    ("MASTER_ADDR", Source::CoordinatorHost),
    ("MASTER_PORT", Source::CoordinatorPort),
    ("WORLD_SIZE", Source::Replicas),
    ("RANK", Source::Replica),
    ("NODE_RANK", Source::Replica),
    ("PET_NNODES", Source::Replicas),
    ("PET_NODE_RANK", Source::Replica),
    ("PET_MASTER_ADDR", Source::CoordinatorHost),
    ("PET_MASTER_PORT", Source::CoordinatorPort),
];

/// The variables `launcher` sets, under their own names.
pub fn launcher_variables(launcher: LauncherEnv) -> &'static [(&'static str, Source)] {
    match launcher {
        LauncherEnv::Torch => &TORCH,
        LauncherEnv::None => &[],
    }
}

/// One variable of a replica's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Its name.
    pub name: String,
    /// Where its value comes from.
    pub source: Source,
}

/// The contract's variables for a replica of a job with `payload`, in order: the `MERIDIAN_*`
/// ones, then the launcher's (renamed as the payload says, without those `payload.env` sets).
/// `payload.env` itself is not included: each backend adds it after these.
pub fn variables(payload: &Payload) -> Vec<Variable> {
    let own = MERIDIAN.iter().map(|&(name, source)| Variable { name: name.to_owned(), source });
    let launcher = launcher_variables(payload.launcher_env).iter().filter_map(|&(name, source)| {
        let name = payload.launcher_env_names.get(name).map_or(name, String::as_str);
        (!payload.env.contains_key(name)).then(|| Variable { name: name.to_owned(), source })
    });
    own.chain(launcher).collect()
}

/// The facts a backend knows when it starts a job, to render values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The job's id.
    pub job_id: String,
    /// Its binding.
    pub fencing_token: u64,
    /// The member cluster's name.
    pub cluster: String,
    /// The gang's replica count.
    pub replicas: u32,
    /// GPUs per replica.
    pub gpus_per_replica: u32,
    /// The coordinator's host.
    pub coordinator_host: String,
    /// The coordinator's port.
    pub coordinator_port: u16,
}

impl Facts {
    /// The value of `source` for replica `replica`.
    pub fn value(&self, source: Source, replica: u32) -> String {
        match source {
            Source::JobId => self.job_id.clone(),
            Source::FencingToken => self.fencing_token.to_string(),
            Source::Cluster => self.cluster.clone(),
            Source::Replica => replica.to_string(),
            Source::Replicas => self.replicas.to_string(),
            Source::GpusPerReplica => self.gpus_per_replica.to_string(),
            Source::CoordinatorHost => self.coordinator_host.clone(),
            Source::CoordinatorPort => self.coordinator_port.to_string(),
            Source::Coordinator => coordinator(&self.coordinator_host, self.coordinator_port),
        }
    }

    /// The whole environment of replica `replica`: the contract's variables, then
    /// `payload.env`.
    pub fn environment(&self, payload: &Payload, replica: u32) -> Vec<(String, String)> {
        let contract = variables(payload).into_iter().map(|v| (v.name, self.value(v.source, replica)));
        contract.chain(payload.env.iter().map(|(k, v)| (k.clone(), v.clone()))).collect()
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub fn coordinator(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Why `payload`'s `launcherEnv`/`launcherEnvNames` cannot be used, by field, if they cannot.
pub fn problems(payload: &Payload) -> BTreeMap<String, String> {
    let mut problems = BTreeMap::new();
    let launcher = launcher_variables(payload.launcher_env);
    let mut targets: BTreeMap<&str, &str> = BTreeMap::new();
    for (from, to) in &payload.launcher_env_names {
        let field = format!("payload.launcherEnvNames.{}", from.escape_debug());
        if payload.launcher_env == LauncherEnv::None {
            problems.insert(field, "renames a launcher variable, but `launcherEnv: none` sets none".to_owned());
            continue;
        }
        if !launcher.iter().any(|(name, _)| name == from) {
            let names: Vec<&str> = launcher.iter().map(|(name, _)| *name).collect();
            problems.insert(
                field,
                format!(
                    "`{}` is not a variable of `launcherEnv: {}`; it sets {}",
                    from.escape_debug(),
                    payload.launcher_env.as_str(),
                    names.join(", ")
                ),
            );
            continue;
        }
        let reason = if !is_env_name(to) {
            Some("the new name must be letters, digits and `_`, not starting with a digit".to_owned())
        } else if to.starts_with(RESERVED_PREFIX) {
            Some(format!("names starting with `{RESERVED_PREFIX}` belong to Meridian's job environment"))
        } else if launcher.iter().any(|(name, _)| *name == to.as_str()) && !payload.launcher_env_names.contains_key(to)
        {
            Some(format!("`{to}` is already a launcher variable; rename that one too, or pick another name"))
        } else {
            targets
                .insert(to.as_str(), from.as_str())
                .map(|other| format!("`{other}` is renamed to `{to}` too; two variables cannot share a name"))
        };
        if let Some(reason) = reason {
            problems.insert(field, reason);
        }
    }
    problems
}

/// Whether a shell can export `name`: ASCII letters, digits and `_`, not starting with a digit.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(json: serde_json::Value) -> Payload {
        serde_json::from_value(json).unwrap()
    }

    fn facts() -> Facts {
        Facts {
            job_id: "j-1".into(),
            fencing_token: 4,
            cluster: "east".into(),
            replicas: 2,
            gpus_per_replica: 8,
            coordinator_host: "10.0.0.7".into(),
            coordinator_port: 29_500,
        }
    }

    fn names(payload: &Payload) -> Vec<String> {
        variables(payload).into_iter().map(|v| v.name).collect()
    }

    #[test]
    fn every_replica_gets_the_meridian_variables_then_torchs() {
        let env: BTreeMap<String, String> =
            facts().environment(&payload(serde_json::json!({})), 1).into_iter().collect();
        for (name, value) in [
            ("MERIDIAN_JOB_ID", "j-1"),
            ("MERIDIAN_FENCING_TOKEN", "4"),
            ("MERIDIAN_CLUSTER", "east"),
            ("MERIDIAN_REPLICA", "1"),
            ("MERIDIAN_REPLICAS", "2"),
            ("MERIDIAN_GPUS_PER_REPLICA", "8"),
            ("MERIDIAN_COORDINATOR_HOST", "10.0.0.7"),
            ("MERIDIAN_COORDINATOR_PORT", "29500"),
            ("MERIDIAN_COORDINATOR", "10.0.0.7:29500"),
            ("MASTER_ADDR", "10.0.0.7"),
            ("MASTER_PORT", "29500"),
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("NODE_RANK", "1"),
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "10.0.0.7"),
            ("PET_MASTER_PORT", "29500"),
        ] {
            assert_eq!(env.get(name).map(String::as_str), Some(value), "{name} in {env:?}");
        }
        assert_eq!(env.len(), 18, "{env:?}");
    }

    #[test]
    fn the_replica_index_comes_before_everything_that_depends_on_it() {
        let all = variables(&payload(serde_json::json!({})));
        let index = all.iter().position(|v| v.name == REPLICA_VAR).unwrap();
        for (at, variable) in all.iter().enumerate() {
            if variable.source.per_replica() && variable.name != REPLICA_VAR {
                assert!(at > index, "{variable:?} comes before {REPLICA_VAR}");
            }
        }
    }

    #[test]
    fn a_spec_opts_out_renames_or_overrides() {
        let none = payload(serde_json::json!({"launcherEnv": "none"}));
        assert_eq!(names(&none), MERIDIAN.map(|(n, _)| n.to_owned()).to_vec());

        let renamed = payload(serde_json::json!({"launcherEnvNames": {"MASTER_PORT": "TRAINER_PORT"}}));
        let got = names(&renamed);
        assert!(got.contains(&"TRAINER_PORT".to_owned()) && !got.contains(&"MASTER_PORT".to_owned()), "{got:?}");
        assert!(problems(&renamed).is_empty());

        // A name the user sets is the user's.
        let own = payload(serde_json::json!({"env": {"MASTER_PORT": "1234"}}));
        let env = facts().environment(&own, 0);
        let ports: Vec<&str> = env.iter().filter(|(k, _)| k == "MASTER_PORT").map(|(_, v)| v.as_str()).collect();
        assert_eq!(ports, ["1234"]);
    }

    #[test]
    fn a_bad_rename_names_its_field_and_why() {
        let cases = [
            (
                serde_json::json!({"launcherEnvNames": {"RANKK": "R"}}),
                "payload.launcherEnvNames.RANKK",
                "not a variable",
            ),
            (
                serde_json::json!({"launcherEnvNames": {"RANK": "1R"}}),
                "payload.launcherEnvNames.RANK",
                "letters, digits",
            ),
            (
                serde_json::json!({"launcherEnvNames": {"RANK": "MERIDIAN_RANK"}}),
                "payload.launcherEnvNames.RANK",
                "belong to Meridian",
            ),
            (
                serde_json::json!({"launcherEnvNames": {"RANK": "WORLD_SIZE"}}),
                "payload.launcherEnvNames.RANK",
                "already",
            ),
            (
                serde_json::json!({"launcherEnvNames": {"NODE_RANK": "R", "RANK": "R"}}),
                "payload.launcherEnvNames.RANK",
                "share a name",
            ),
            (
                serde_json::json!({"launcherEnv": "none", "launcherEnvNames": {"RANK": "R"}}),
                "payload.launcherEnvNames.RANK",
                "sets none",
            ),
        ];
        for (json, field, words) in cases {
            let found = problems(&payload(json.clone()));
            let reason = found.get(field).unwrap_or_else(|| panic!("{json}: {found:?}"));
            assert!(reason.contains(words), "{json}: {reason}");
        }
        // Swapping two names is fine.
        assert!(
            problems(&payload(serde_json::json!({"launcherEnvNames": {"RANK": "NODE_RANK", "NODE_RANK": "RANK"}})))
                .is_empty()
        );
    }

    #[test]
    fn an_ipv6_coordinator_is_bracketed() {
        assert_eq!(coordinator("::1", 80), "[::1]:80");
        assert_eq!(coordinator("n1", 80), "n1:80");
    }
}
