//! One member cluster of a test federation: its agent's config (builtin backend, simulated or
//! process runner, or a whole config of its own), how the agent reaches the gateway, and what
//! it has in its environment. [`crate::Federation`] starts agents from these options.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;

use crate::Agent;

/// One 8-GPU H100 node: the nodes of a cluster whose options do not say (YAML list items).
pub const H100_NODE: &str = "  - {shape: h100-node, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";

/// One host with two L4s: a GPU host without a scheduler, for the process runner.
pub const L4_HOST: &str = "  - {shape: l4-host, count: 1, gpuType: l4, gpus: 2, cpu: 8, memoryGiB: 32}\n";

/// How a builtin cluster runs its jobs.
#[derive(Debug, Clone, PartialEq)]
pub enum Runner {
    /// Pretends: a job lasts `runtime.estimate × time_scale` and succeeds (1.0: an hour of job
    /// time lasts an hour; 0.001: 3.6 s).
    Simulated {
        /// `timeScale`.
        time_scale: f64,
    },
    /// Runs each job's command as a child process on the declared GPUs (no GPU discovery).
    Process {
        /// How long a stopped job's processes get between SIGTERM and SIGKILL (`killGrace`).
        kill_grace: String,
    },
}

/// What one cluster of a [`crate::Federation`] runs. The defaults: `us-east`, owned, H100s at
/// US$2 an hour, one [`H100_NODE`], the simulated runner at time scale 1, a report every
/// 300 ms, dialing the gateway directly.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    region: String,
    tier: String,
    prices: String,
    nodes: String,
    runner: Runner,
    report_interval: String,
    extra: String,
    whole_config: Option<String>,
    pub(crate) behind_proxy: bool,
    pub(crate) certificate: Option<String>,
    pub(crate) env: Vec<(String, String)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            region: "us-east".into(),
            tier: "owned".into(),
            prices: "{h100: 2.0}".into(),
            nodes: H100_NODE.into(),
            runner: Runner::Simulated { time_scale: 1.0 },
            report_interval: "300ms".into(),
            extra: String::new(),
            whole_config: None,
            behind_proxy: false,
            certificate: None,
            env: Vec::new(),
        }
    }
}

impl ClusterOptions {
    /// A GPU host without a scheduler: one [`L4_HOST`] in `us-east` with the process runner,
    /// which gives a stopped job `kill_grace` between SIGTERM and SIGKILL.
    pub fn process_host(kill_grace: &str) -> Self {
        Self::default().prices("{}").nodes(L4_HOST).process_runner(kill_grace)
    }

    /// An agent that runs `config` as it is (another backend, say) instead of a builtin
    /// cluster; only the link options ([`ClusterOptions::behind_proxy`], the certificate, the
    /// environment) still apply.
    pub fn whole_config(config: impl Into<String>) -> Self {
        Self { whole_config: Some(config.into()), ..Self::default() }
    }

    /// `region`.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = region.into();
        self
    }

    /// `tier` (`owned` or `cloud`).
    pub fn tier(mut self, tier: impl Into<String>) -> Self {
        self.tier = tier.into();
        self
    }

    /// `prices`, a YAML map of GPU type to US$ per GPU-hour (`{h100: 2.0}`).
    pub fn prices(mut self, prices: impl Into<String>) -> Self {
        self.prices = prices.into();
        self
    }

    /// `nodes`, as YAML list items (without the `nodes:` key).
    pub fn nodes(mut self, nodes: impl Into<String>) -> Self {
        self.nodes = nodes.into();
        self
    }

    /// The simulated runner at `time_scale`.
    pub fn time_scale(mut self, time_scale: f64) -> Self {
        self.runner = Runner::Simulated { time_scale };
        self
    }

    /// The process runner with `killGrace: kill_grace`.
    pub fn process_runner(mut self, kill_grace: impl Into<String>) -> Self {
        self.runner = Runner::Process { kill_grace: kill_grace.into() };
        self
    }

    /// `reportInterval` (300 ms unless set).
    pub fn report_interval(mut self, interval: impl Into<String>) -> Self {
        self.report_interval = interval.into();
        self
    }

    /// More top-level YAML for the agent's config (`labels:`, `metrics:`, `utilization:`...),
    /// each line ending in a newline; added after what came before.
    pub fn extra(mut self, yaml: impl AsRef<str>) -> Self {
        self.extra.push_str(yaml.as_ref());
        self
    }

    /// The agent dials the gateway through a [`crate::TcpProxy`] of its own, which the test
    /// reaches with [`crate::Federation::proxy`].
    pub fn behind_proxy(mut self) -> Self {
        self.behind_proxy = true;
        self
    }

    /// In a federation with TLS, the agent presents the certificate issued for `cluster`
    /// instead of its own cluster's.
    pub fn certificate(mut self, cluster: impl Into<String>) -> Self {
        self.certificate = Some(cluster.into());
        self
    }

    /// Sets `key` to `value` in the agent's environment (and so in its jobs' under the
    /// process runner).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts cluster `cluster`'s agent from these options, outside a [`crate::Federation`]
    /// (for agents that start before their gateway): its files in `dir`, dialing `grpc`
    /// directly (no proxy, no TLS).
    pub fn start_agent(&self, dir: &Path, cluster: &str, grpc: SocketAddr) -> Result<Agent> {
        Agent::start_with_env(dir, cluster, &self.config(cluster), grpc, &self.env)
    }

    /// The agent's config (YAML) for cluster `cluster`.
    pub fn config(&self, cluster: &str) -> String {
        if let Some(config) = &self.whole_config {
            return config.clone();
        }
        let (runner, time_scale) = match &self.runner {
            Runner::Simulated { time_scale } => {
                ("runner: simulated\n".to_string(), format!("timeScale: {time_scale}\n"))
            }
            Runner::Process { kill_grace } => {
                (format!("runner: process\nprocess: {{gpuDiscovery: none, killGrace: {kill_grace}}}\n"), String::new())
            }
        };
        format!(
            "cluster: {cluster}\nregion: {}\ntier: {}\nprices: {}\nbackend: builtin\n{runner}\
             queues: [{{name: default, weight: 1}}]\nnodes:\n{}\n{time_scale}reportInterval: {}\n{}",
            self.region, self.tier, self.prices, self.nodes, self.report_interval, self.extra
        )
    }
}

/// An agent config for a builtin cluster with the simulated runner. `nodes` is YAML list items (without the `nodes:` key).
pub fn agent_config(cluster: &str, region: &str, tier: &str, prices: &str, nodes: &str, time_scale: f64) -> String {
    ClusterOptions::default()
        .region(region)
        .tier(tier)
        .prices(prices)
        .nodes(nodes)
        .time_scale(time_scale)
        .config(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_config_is_the_one_the_tests_always_used() {
        let nodes = "  - {shape: a, count: 1, gpuType: l4, gpus: 1, cpu: 1, memoryGiB: 1}\n";
        assert_eq!(
            agent_config("east", "eu-west", "cloud", "{l4: 0.4}", nodes, 0.001),
            format!(
                "cluster: east\nregion: eu-west\ntier: cloud\nprices: {{l4: 0.4}}\nbackend: builtin\nrunner: simulated\n\
                 queues: [{{name: default, weight: 1}}]\nnodes:\n{nodes}\ntimeScale: 0.001\nreportInterval: 300ms\n"
            )
        );
    }

    #[test]
    fn a_process_host_declares_its_gpus_and_has_no_time_scale() {
        let config = ClusterOptions::process_host("2s").extra("labels: {a: b}\n").config("gpu-host");
        assert!(config.contains("runner: process\nprocess: {gpuDiscovery: none, killGrace: 2s}\n"), "{config}");
        assert!(config.contains(L4_HOST) && config.ends_with("reportInterval: 300ms\nlabels: {a: b}\n"), "{config}");
        assert!(!config.contains("timeScale"), "{config}");
    }
}
