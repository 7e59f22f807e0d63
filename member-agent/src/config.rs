//! The agent's configuration: which cluster it speaks for, where the gateway is, and (for the
//! builtin backend) the nodes and queues it schedules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use meridian_proto::config_file;
use meridian_proto::duration::HumanDuration;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, ClusterInfo, Tier};
use meridian_proto::names::check_cluster_name;
use meridian_proto::validate::member_label_errors;
use serde::{Deserialize, Serialize};

use crate::backend::kubernetes::KubernetesConfig;
use crate::backend::process::{GpuDiscovery, ProcessConfig};
use crate::preemption::PreemptionConfig;
use meridian_scheduler::{NodeSpec, QueuePolicy, QueueSpec};

pub use meridian_proto::config_file::ConfigError as Error;

mod gateways;

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything an agent needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// Unique cluster name.
    pub cluster: String,
    /// Region (as named in the gateway's network table).
    pub region: String,
    /// `owned` or `cloud`.
    #[serde(default = "default_tier")]
    pub tier: Tier,
    /// Gateway gRPC address: `https://HOST:7071` (with `tls`), or `http://` with `insecure`.
    /// Several gateways (one leader, standbys) are a YAML list, or one string with the addresses
    /// separated by commas (as `--gateway` takes them); the agent tries them in order and follows
    /// a standby to the leader. Kept as that comma-separated text so a config or caller that sets
    /// one address keeps working; [`AgentConfig::gateways`] splits it.
    #[serde(
        default = "default_gateway",
        deserialize_with = "gateways::deserialize",
        serialize_with = "gateways::serialize"
    )]
    pub gateway: String,
    /// The CA the gateway's certificate must chain to, and this agent's client certificate
    /// (naming the cluster: URI SAN `urn:meridian:cluster:NAME`) with its key. Read again at
    /// every connection, so rotated files are used without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    /// Speak plain text to an `http://` gateway (tests, local experiments): nothing
    /// authenticates either side.
    #[serde(default)]
    pub insecure: bool,
    /// US$ per GPU-hour by GPU type.
    #[serde(default)]
    pub prices: BTreeMap<String, f64>,
    /// Local scheduler: `builtin` (this host or declared nodes), `slurm` or `kubernetes`.
    #[serde(default = "default_backend")]
    pub backend: BackendKind,
    /// Whether payloads with container images can run here. Default: true, except with the
    /// process runner, which runs no containers (setting it true there is an error).
    #[serde(default)]
    pub supports_containers: Option<bool>,
    /// Whether payloads with only a command can run here.
    #[serde(default = "yes")]
    pub supports_bare_commands: bool,
    /// Local queues and their fair-share weights (builtin backend). A job goes to the queue named
    /// like its tenant, else `default`.
    #[serde(default = "default_queues")]
    pub queues: Vec<QueueConfig>,
    /// Node groups (builtin backend).
    #[serde(default)]
    pub nodes: Vec<NodeGroup>,
    /// Builtin backend: how jobs run. `process` (the default) runs `payload.command` on this
    /// host, one process per replica; `simulated` runs nothing and ends each job after
    /// `runtime.estimate × timeScale` (demos, tests). `process` is the default because an agent
    /// on a GPU host without a scheduler should run jobs; configs written for the simulation set
    /// `timeScale`, which the process runner refuses, so they fail loudly instead of running
    /// commands by surprise.
    #[serde(default)]
    pub runner: RunnerKind,
    /// Builtin backend, simulated runner: a job runs for `runtime.estimate × timeScale`
    /// (1 = real time). Any other value with the process runner is an error (processes run in
    /// real time).
    #[serde(default = "one")]
    pub time_scale: f64,
    /// Builtin backend, process runner: signals, output and GPU discovery (see
    /// [`ProcessConfig`]; all defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    /// Inventory and queue pressure are sent on change and at least this often.
    #[serde(default = "default_report_interval")]
    pub report_interval: HumanDuration,
    /// The Kubernetes backend (`backend: kubernetes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
    /// Slurm backend settings (`backend: slurm`); defaults when left out.
    #[serde(default)]
    pub slurm: Option<crate::backend::SlurmConfig>,
    /// Labels of the cluster (`gpu-fabric: ib`), matched by jobs' `placement.clusterSelector`.
    /// The `meridian.io/` prefix is reserved: every cluster has `meridian.io/cluster`, `/region`,
    /// `/tier` and `/backend` without configuring them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Builtin backend: whether and how the member preempts (see [`PreemptionConfig`]).
    #[serde(default)]
    pub preemption: PreemptionConfig,
    /// Where running jobs' GPU utilisation comes from (a file or NVML), sent with each job in
    /// the heartbeat; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<crate::usage::UtilizationConfig>,
    /// Serve Prometheus metrics at `GET /metrics` on `listen`; not served when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<crate::metrics::MetricsConfig>,
}

/// The agent's `tls:` section: PEM files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that signed the gateway's certificate.
    pub ca: PathBuf,
    /// This agent's certificate (made by `meridian certs issue --cluster NAME`).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// How the builtin backend runs jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// Run `payload.command` on this host.
    #[default]
    Process,
    /// Pretend: each job ends after `runtime.estimate × timeScale`.
    Simulated,
}

/// A local queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueConfig {
    /// Queue name.
    pub name: String,
    /// Fair-share weight.
    #[serde(default = "one")]
    pub weight: f64,
    /// What a job that cannot start does to the jobs behind it: `strict`, `bestEffort` or
    /// `backfill` (the default; see [`QueuePolicy`]).
    #[serde(default)]
    pub policy: QueuePolicy,
}

/// `count` identical nodes named `{shape}-{index}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroup {
    /// Shape name, also the node name prefix.
    pub shape: String,
    /// How many nodes.
    pub count: u32,
    /// GPU type of every node.
    pub gpu_type: String,
    /// Memory per GPU; defaults to the GPU type's known memory.
    #[serde(default, rename = "gpuMemoryGiB")]
    pub gpu_memory_gib: Option<u32>,
    /// GPUs per node.
    pub gpus: u32,
    /// CPU cores per node.
    pub cpu: u32,
    /// Host memory per node in GiB.
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
    /// Labels of every node of the group, matched by jobs' `placement.nodeSelector`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_tier() -> Tier {
    Tier::Owned
}
fn default_gateway() -> String {
    "http://127.0.0.1:7071".into()
}
fn default_backend() -> BackendKind {
    BackendKind::Builtin
}
fn yes() -> bool {
    true
}
fn one() -> f64 {
    1.0
}
fn default_queues() -> Vec<QueueConfig> {
    vec![QueueConfig { name: "default".into(), weight: 1.0, policy: QueuePolicy::default() }]
}
fn default_report_interval() -> HumanDuration {
    HumanDuration::from_secs(2)
}

impl AgentConfig {
    /// Reads and checks a YAML config file.
    pub fn load(path: &Path) -> Result<Self> {
        Self::parse(&config_file::read(path)?, path)
    }

    /// Reads a YAML config file without checking it, for a caller that overrides fields
    /// (`--gateway`) and then calls [`AgentConfig::check`].
    pub fn load_unchecked(path: &Path) -> Result<Self> {
        config_file::parse_yaml(&config_file::read(path)?, path)
    }

    /// Parses and checks YAML text; `path` is used in messages only.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let config: AgentConfig = config_file::parse_yaml(text, path)?;
        config.check(path)?;
        Ok(config)
    }

    /// Checks what types cannot; lists every problem.
    pub fn check(&self, path: &Path) -> Result<()> {
        let mut problems = Vec::new();
        let catalog = GpuCatalog::default();
        // The gateway refuses a hello whose name breaks the grammar: fail here, at start.
        if let Err(reason) = check_cluster_name(&self.cluster) {
            problems.push(format!("cluster: {reason}"));
        }
        if self.region.trim().is_empty() {
            problems.push("region: must name the region".to_string());
        }
        self.check_transport(&mut problems);
        for (gpu, price) in &self.prices {
            if !price.is_finite() || *price < 0.0 {
                problems.push(format!("prices.{gpu}: {price} must be a non-negative number of US$ per GPU-hour"));
            }
        }
        match (self.backend, &self.kubernetes) {
            (BackendKind::Builtin, _) => {}
            (BackendKind::Kubernetes, Some(kubernetes)) => kubernetes.check(&mut problems),
            (BackendKind::Kubernetes, None) => problems.push(
                "kubernetes: the kubernetes backend needs this section (at least `mode: volcano` or `mode: kueue`)"
                    .into(),
            ),
            (BackendKind::Slurm, _) => self.slurm.clone().unwrap_or_default().check(&mut problems),
        }
        if self.queues.is_empty() {
            problems.push("queues: at least one queue is needed".to_string());
        }
        for (i, q) in self.queues.iter().enumerate() {
            if !q.weight.is_finite() || q.weight <= 0.0 {
                problems.push(format!("queues[{i}].weight: {} must be a positive number", q.weight));
            }
        }
        let discovers = self.runner == RunnerKind::Process
            && self.process.as_ref().is_none_or(|p| p.gpu_discovery == GpuDiscovery::Nvml);
        if self.backend == BackendKind::Builtin && self.nodes.is_empty() && !discovers {
            problems.push("nodes: the builtin backend needs at least one node group".to_string());
        }
        match self.runner {
            // The runner belongs to the builtin backend; other schedulers run jobs themselves.
            _ if self.backend != BackendKind::Builtin => {
                if self.process.is_some() {
                    problems.push("process: only applies to `backend: builtin`".to_string());
                }
            }
            RunnerKind::Process => {
                if self.supports_containers == Some(true) {
                    problems.push(
                        "supportsContainers: the process runner runs commands as plain processes, not containers; remove it or set `runner: simulated`".to_string(),
                    );
                }
                if self.time_scale != 1.0 {
                    problems.push(format!(
                        "timeScale: {} only applies to `runner: simulated`; the process runner runs commands in real time (set `runner: simulated` or remove timeScale)",
                        self.time_scale
                    ));
                }
                if let Some(process) = &self.process {
                    process.check(&mut problems);
                }
            }
            RunnerKind::Simulated => {
                if self.process.is_some() {
                    problems.push("process: only applies to `runner: process`".to_string());
                }
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.count == 0 {
                problems.push(format!("nodes[{i}].count: must be at least 1"));
            }
            if n.gpus == 0 {
                problems.push(format!("nodes[{i}].gpus: must be at least 1"));
            }
            if n.gpu_memory_gib.is_none() && !catalog.contains(&n.gpu_type) {
                problems.push(format!(
                    "nodes[{i}].gpuType: {}; or set gpuMemoryGiB for a type the catalog does not know",
                    catalog.unknown_reason(&n.gpu_type)
                ));
            }
        }
        problems.extend(member_label_errors("labels", &self.labels).iter().map(ToString::to_string));
        for (i, n) in self.nodes.iter().enumerate() {
            problems
                .extend(member_label_errors(&format!("nodes[{i}].labels"), &n.labels).iter().map(ToString::to_string));
        }
        if !self.time_scale.is_finite() || self.time_scale <= 0.0 {
            problems.push(format!("timeScale: {} must be a positive number", self.time_scale));
        }
        if self.report_interval.0.is_zero() {
            problems.push("reportInterval: must be longer than 0s".to_string());
        }
        self.preemption.check(&mut problems);
        if let Some(utilization) = &self.utilization {
            utilization.check(&mut problems);
            let process = self.backend == BackendKind::Builtin && self.runner == RunnerKind::Process;
            if utilization.nvml && !process {
                problems.push(
                    "utilization.nvml: NVML reads this host's GPUs, which only the builtin backend's process runner schedules; use `utilization.file` for other backends".to_string(),
                );
            }
        }
        config_file::check(path, problems)
    }

    /// Every `gateway` address is valid, and they, `tls` and `insecure` agree: https with
    /// `tls`, http only with `insecure`.
    fn check_transport(&self, problems: &mut Vec<String>) {
        gateways::check(&self.gateways(), self.tls.as_ref(), self.insecure, &self.cluster, problems);
    }

    /// The gateway addresses, in the order they are tried.
    pub fn gateways(&self) -> Vec<String> {
        gateways::split(&self.gateway)
    }

    /// The cluster identity sent in the hello.
    pub fn cluster_info(&self) -> ClusterInfo {
        ClusterInfo {
            name: self.cluster.clone(),
            region: self.region.clone(),
            tier: self.tier,
            backend: self.backend,
            prices: self.prices.clone(),
            supports_containers: self.supports_containers(),
            // Kubernetes runs containers only.
            supports_bare_commands: self.supports_bare_commands && self.backend != BackendKind::Kubernetes,
            labels: self.labels.clone(),
        }
    }

    /// Whether container payloads can run here: as configured, else true except with the
    /// builtin backend's process runner.
    pub fn supports_containers(&self) -> bool {
        let process_runner = self.backend == BackendKind::Builtin && self.runner == RunnerKind::Process;
        self.supports_containers.unwrap_or(!process_runner)
    }

    /// The process runner's settings (defaults when the section is absent).
    pub fn process_config(&self) -> ProcessConfig {
        self.process.clone().unwrap_or_default()
    }

    /// Declared nodes, expanded from their groups.
    pub fn node_specs(&self) -> Vec<NodeSpec> {
        let catalog = GpuCatalog::default();
        self.nodes
            .iter()
            .flat_map(|group| {
                let memory = group.gpu_memory_gib.or_else(|| catalog.memory_gib(&group.gpu_type)).unwrap_or(0);
                (0..group.count).map(move |i| NodeSpec {
                    name: format!("{}-{i}", group.shape),
                    shape: group.shape.clone(),
                    gpu_type: group.gpu_type.clone(),
                    gpu_memory_gib: memory,
                    gpus: group.gpus,
                    cpu: group.cpu,
                    memory_gib: group.memory_gib,
                    labels: group.labels.clone(),
                })
            })
            .collect()
    }

    /// Declared queues.
    pub fn queue_specs(&self) -> Vec<QueueSpec> {
        self.queues.iter().map(|q| QueueSpec { name: q.name.clone(), weight: q.weight, policy: q.policy }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "cluster: east\nregion: us-east\ninsecure: true\nrunner: simulated\nnodes:\n  - {shape: dgx, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";

    #[test]
    fn a_minimal_config_gets_defaults_and_expands_nodes() {
        let config = AgentConfig::parse(GOOD, Path::new("a.yaml")).unwrap();
        assert_eq!(config.tier, Tier::Owned);
        let nodes = config.node_specs();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].name, "dgx-1");
        assert_eq!(nodes[0].gpu_memory_gib, 80);
    }

    #[test]
    fn utilization_and_metrics_sections_are_read_and_nvml_needs_the_process_runner() {
        let text =
            format!("{GOOD}utilization: {{file: /run/gpu.prom, interval: 5s}}\nmetrics: {{listen: 127.0.0.1:9464}}\n");
        let config = AgentConfig::parse(&text, Path::new("a.yaml")).unwrap();
        let utilization = config.utilization.unwrap();
        assert_eq!(utilization.file.as_deref(), Some(Path::new("/run/gpu.prom")));
        assert_eq!((utilization.interval.0.as_secs(), utilization.window.0.as_secs()), (5, 60));
        assert_eq!(config.metrics.unwrap().listen.port(), 9464);
        let text = "cluster: c\nregion: r\ninsecure: true\nrunner: simulated\nutilization: {nvml: true}\n\
                    nodes:\n  - {shape: x, count: 1, gpuType: h100, gpus: 8, cpu: 1, memoryGiB: 1}\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                assert!(problems.iter().any(|p| p.starts_with("utilization.nvml")), "{problems:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_problem_is_listed() {
        let text = "cluster: ''\nregion: r\ninsecure: true\nrunner: simulated\ntimeScale: 0\nnodes:\n  - {shape: x, count: 0, gpuType: h10, gpus: 0, cpu: 1, memoryGiB: 1}\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => assert_eq!(problems.len(), 5, "{problems:?}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_cluster_name_outside_the_grammar_is_a_config_problem_with_the_reason() {
        for (name, reason) in [
            ("'a b'", "has U+0020 at character 2"),
            ("'../../etc'", "has `.` at character 1"),
            ("West", "has `W` at character 1 (use lowercase)"),
            ("east-", "ends with `-`"),
        ] {
            let text = GOOD.replace("cluster: east", &format!("cluster: {name}"));
            match AgentConfig::parse(&text, Path::new("a.yaml")) {
                Err(Error::Invalid { problems, .. }) => {
                    assert_eq!(problems.len(), 1, "{problems:?}");
                    assert!(problems[0].starts_with(&format!("cluster: {reason};")), "{problems:?}");
                }
                other => panic!("{name}: expected invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_kubernetes_agent_needs_its_section_and_no_nodes() {
        let text = "cluster: c\nregion: r\ninsecure: true\nbackend: kubernetes\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(problems[0].starts_with("kubernetes:"), "{problems:?}");
            }
            other => panic!("expected invalid, got {other:?}"),
        }
        let text = "cluster: c\nregion: r\ninsecure: true\nbackend: kubernetes\nkubernetes:\n  mode: kueue\n  namespace: Bad\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                assert!(problems[0].starts_with("kubernetes.namespace:"), "{problems:?}")
            }
            other => panic!("expected invalid, got {other:?}"),
        }
        let config = AgentConfig::parse(
            "cluster: c\nregion: r\ninsecure: true\nbackend: kubernetes\nkubernetes: {mode: volcano}\n",
            Path::new("a.yaml"),
        )
        .unwrap();
        assert!(!config.cluster_info().supports_bare_commands);
    }

    #[test]
    fn the_process_runner_is_the_default_and_needs_no_nodes_when_it_discovers_gpus() {
        let config =
            AgentConfig::parse("cluster: east\nregion: us-east\ninsecure: true\n", Path::new("a.yaml")).unwrap();
        assert_eq!(config.runner, RunnerKind::Process);
        assert!(!config.supports_containers(), "the process runner runs no containers");
        assert_eq!(config.process_config().kill_grace, HumanDuration::from_secs(10));
        assert_eq!(config.process_config().log_bytes, 1 << 20);

        let without_discovery = "cluster: east\nregion: us-east\ninsecure: true\nprocess: {gpuDiscovery: none}\n";
        let err = AgentConfig::parse(without_discovery, Path::new("a.yaml")).unwrap_err();
        assert!(err.to_string().contains("nodes:"), "{err}");
    }

    #[test]
    fn the_process_runner_refuses_containers_and_a_time_scale() {
        let text = "cluster: east\nregion: us-east\ninsecure: true\nsupportsContainers: true\ntimeScale: 0.001\nprocess: {logBytes: 0}\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                assert_eq!(problems.len(), 3, "{problems:?}");
                assert!(problems[0].starts_with("supportsContainers:"), "{problems:?}");
                assert!(problems[1].starts_with("timeScale:") && problems[1].contains("runner: simulated"));
                assert!(problems[2].starts_with("process.logBytes:"), "{problems:?}");
            }
            other => panic!("expected invalid, got {other:?}"),
        }
        let simulated = format!("{GOOD}process: {{killGrace: 1s}}\n");
        let err = AgentConfig::parse(&simulated, Path::new("a.yaml")).unwrap_err();
        assert!(err.to_string().contains("process: only applies to `runner: process`"), "{err}");
        assert!(AgentConfig::parse(GOOD, Path::new("a.yaml")).unwrap().supports_containers());
    }

    #[test]
    fn the_example_configs_parse_and_simulate() {
        for (file, text) in [
            ("onprem-east.yaml", include_str!("../../deploy/examples/local/onprem-east.yaml")),
            ("onprem-west.yaml", include_str!("../../deploy/examples/local/onprem-west.yaml")),
            ("cloud-burst.yaml", include_str!("../../deploy/examples/local/cloud-burst.yaml")),
        ] {
            let config = AgentConfig::parse(text, Path::new(file)).unwrap();
            assert_eq!(config.runner, RunnerKind::Simulated, "{file}");
        }
    }

    #[test]
    fn queue_policies_parse_in_camel_case_and_default_to_backfill() {
        let text = format!(
            "{GOOD}queues:\n  - {{name: prod, weight: 2, policy: strict}}\n  - {{name: batch, policy: bestEffort}}\n  - {{name: default}}\n"
        );
        let config = AgentConfig::parse(&text, Path::new("a.yaml")).unwrap();
        let policies: Vec<QueuePolicy> = config.queue_specs().iter().map(|q| q.policy).collect();
        assert_eq!(policies, [QueuePolicy::Strict, QueuePolicy::BestEffort, QueuePolicy::Backfill]);
        let bad = format!("{GOOD}queues:\n  - {{name: prod, policy: fifo}}\n");
        let err = AgentConfig::parse(&bad, Path::new("a.yaml")).unwrap_err().to_string();
        assert!(err.contains("queues[0].policy") && err.contains("bestEffort"), "{err}");
    }

    #[test]
    fn the_gateway_address_tls_and_insecure_must_agree() {
        let base = "cluster: east\nregion: us-east\nrunner: simulated\nnodes:\n  - {shape: dgx, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
        let tls = "tls: {ca: ca.pem, cert: east.pem, key: east.key}\n";
        let parse = |extra: &str| AgentConfig::parse(&format!("{base}{extra}"), Path::new("a.yaml"));
        let err = parse("").unwrap_err().to_string();
        assert!(
            err.contains("gateway: `http://127.0.0.1:7071` is plain text") && err.contains("insecure: true"),
            "{err}"
        );
        let err = parse("gateway: https://gw:7071\n").unwrap_err().to_string();
        assert!(
            err.contains("tls: the gateway `https://gw:7071` is https") && err.contains("certs issue --cluster east")
        );
        let err = parse(&format!("gateway: http://gw:7071\n{tls}")).unwrap_err().to_string();
        assert!(err.contains("gateway: `http://gw:7071` is http://") && err.contains("use https://"), "{err}");
        let err = parse(&format!("gateway: https://gw:7071\ninsecure: true\n{tls}")).unwrap_err().to_string();
        assert!(err.contains("insecure: true contradicts"), "{err}");
        let config = parse(&format!("gateway: https://gw:7071\n{tls}")).unwrap();
        assert_eq!(config.tls.unwrap().cert, Path::new("east.pem"));
        assert!(parse("insecure: true\n").is_ok());
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = AgentConfig::parse(&format!("{GOOD}colour: red\n"), Path::new("a.yaml")).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn cluster_and_node_labels_reach_the_hello_and_the_nodes() {
        let text = "cluster: east\nregion: us-east\ninsecure: true\nlabels: {gpu-fabric: ib}\nnodes:\n  - {shape: dgx, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, labels: {rack: r1}}\n  - {shape: mig, count: 1, gpuType: a100-80g.1g.10gb, gpus: 56, cpu: 96, memoryGiB: 1024}\n";
        let config = AgentConfig::parse(text, Path::new("a.yaml")).unwrap();
        assert_eq!(config.cluster_info().labels.get("gpu-fabric").map(String::as_str), Some("ib"));
        let nodes = config.node_specs();
        assert_eq!(nodes[0].labels.get("rack").map(String::as_str), Some("r1"));
        assert!(nodes[1].labels.is_empty());
        assert_eq!(nodes[1].gpu_memory_gib, 10, "a slice type's memory comes from its profile");
    }

    #[test]
    fn bad_labels_are_each_named_by_path() {
        let text = "cluster: east\nregion: us-east\ninsecure: true\nlabels: {meridian.io/tier: gold, ok: 'a b'}\nnodes:\n  - {shape: dgx, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, labels: {'bad key': x}}\n";
        match AgentConfig::parse(text, Path::new("a.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                assert_eq!(problems.len(), 3, "{problems:?}");
                assert!(problems.iter().any(|p| p.starts_with("labels.ok: label values")), "{problems:?}");
                assert!(
                    problems
                        .iter()
                        .any(|p| p.starts_with("labels.meridian.io/tier: the `meridian.io/` prefix is reserved")),
                    "{problems:?}"
                );
                assert!(problems.iter().any(|p| p.starts_with("nodes[0].labels.bad key: label keys")), "{problems:?}");
            }
            other => panic!("expected invalid, got {other:?}"),
        }
    }
}
