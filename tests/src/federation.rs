//! A gateway and its member clusters, started together for an end-to-end test:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use meridian_e2e::{ClusterOptions, Federation};
//! let federation = Federation::builder()
//!     .cluster("east", ClusterOptions::default().time_scale(0.001))
//!     .cluster("west", ClusterOptions::default().region("eu-west").behind_proxy())
//!     .start()
//!     .await?;
//! let clusters = federation.gateway.client().clusters().await?;
//! # Ok(()) }
//! ```
//!
//! `start` returns once every cluster is connected and has reported its GPUs. Everything lives
//! in one temporary directory (configs, logs, the gateway's data) that goes with the
//! [`Federation`]. Tests with unusual set-ups (a gateway restarted on fixed ports, agents that
//! start before the gateway) use [`Gateway`] and [`Agent`] directly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{Agent, ClusterOptions, GATEWAY_CONFIG, Gateway, Pki, TcpProxy};

/// A running gateway and its clusters' agents (by name), in their directory. Dropping it stops
/// the agents first, then the proxies and the gateway, then removes the directory.
pub struct Federation {
    agents: BTreeMap<String, Agent>,
    options: BTreeMap<String, ClusterOptions>,
    proxies: BTreeMap<String, TcpProxy>,
    /// The gateway.
    pub gateway: Gateway,
    token: Option<String>,
    pki: Option<Pki>,
    dir: tempfile::TempDir,
}

/// How to start a [`Federation`]: the gateway's config, TLS or not, and the clusters.
pub struct FederationBuilder {
    dir: Option<tempfile::TempDir>,
    gateway_config: String,
    tls: bool,
    token: Option<String>,
    clusters: Vec<(String, ClusterOptions)>,
}

impl Federation {
    /// A federation with [`GATEWAY_CONFIG`], plain text, and no clusters yet.
    pub fn builder() -> FederationBuilder {
        FederationBuilder {
            dir: None,
            gateway_config: GATEWAY_CONFIG.to_string(),
            tls: false,
            token: None,
            clusters: Vec::new(),
        }
    }

    /// Where the gateway and the agents keep their files; the test may put its own there too.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The agent of cluster `name`; panics when there is none (a mistake in the test).
    pub fn agent(&self, name: &str) -> &Agent {
        self.agents.get(name).unwrap_or_else(|| panic!("the federation has no cluster {name}"))
    }

    /// The agent of cluster `name`, to stop it; panics when there is none.
    pub fn agent_mut(&mut self, name: &str) -> &mut Agent {
        self.agents.get_mut(name).unwrap_or_else(|| panic!("the federation has no cluster {name}"))
    }

    /// The proxy between cluster `name`'s agent and the gateway; panics when the cluster is not
    /// [`ClusterOptions::behind_proxy`].
    pub fn proxy(&self, name: &str) -> &TcpProxy {
        self.proxies.get(name).unwrap_or_else(|| panic!("cluster {name} is not behind a proxy"))
    }

    /// The certificates of a federation started with [`FederationBuilder::tls`]; panics
    /// otherwise.
    pub fn pki(&self) -> &Pki {
        self.pki.as_ref().unwrap_or_else(|| panic!("the federation was started without TLS"))
    }

    /// Starts cluster `name` too and waits until every cluster is connected.
    pub async fn join(&mut self, name: &str, options: ClusterOptions) -> Result<()> {
        self.spawn(name, options).await?;
        self.wait().await
    }

    /// Stops cluster `name`'s agent if it still runs, starts it again with the same options,
    /// and waits until the new agent was welcomed by the gateway (the gateway may list the old
    /// stream as connected for a while, so the cluster count alone would not tell) and every
    /// cluster is connected.
    pub async fn restart_agent(&mut self, name: &str) -> Result<()> {
        let options = self.options.get(name).cloned().with_context(|| format!("no cluster {name}"))?;
        if let Some(mut agent) = self.agents.remove(name) {
            agent.proc.kill();
        }
        self.join(name, options).await?;
        let agent = self.agent(name);
        crate::poll(Duration::from_secs(30), || async {
            agent.proc.log().contains("welcomed by the gateway").then_some(())
        })
        .await
        .with_context(|| format!("the restarted agent {name} was not welcomed:\n{}", agent.proc.log()))
    }

    /// Starts an agent process `name` that speaks for cluster `cluster`, beside the federation's
    /// own: a second agent for a live cluster, say. It dials the gateway directly (a proxy in the
    /// options is ignored); nobody waits for it, and the test owns it.
    pub fn start_agent(&self, name: &str, cluster: &str, options: &ClusterOptions) -> Result<Agent> {
        self.agent_process(name, cluster, options, self.gateway.grpc)
    }

    /// Starts cluster `name`'s agent, behind its proxy if the options say so.
    async fn spawn(&mut self, name: &str, options: ClusterOptions) -> Result<()> {
        let grpc = if options.behind_proxy {
            if !self.proxies.contains_key(name) {
                self.proxies.insert(name.to_string(), TcpProxy::start(self.gateway.grpc).await?);
            }
            self.proxy(name).addr
        } else {
            self.gateway.grpc
        };
        let agent = self.agent_process(name, name, &options, grpc)?;
        self.agents.insert(name.to_string(), agent);
        self.options.insert(name.to_string(), options);
        Ok(())
    }

    fn agent_process(&self, name: &str, cluster: &str, options: &ClusterOptions, grpc: SocketAddr) -> Result<Agent> {
        let mut config = options.config(cluster);
        if let Some(pki) = &self.pki {
            config.push_str(&pki.agent_tls(options.certificate.as_deref().unwrap_or(cluster))?);
        }
        Agent::start_with_env(self.dir.path(), name, &config, grpc, &options.env)
    }

    /// Waits until every cluster is connected; asks nothing of a gateway without clusters (one
    /// with `auth:` and no [`FederationBuilder::token`] would refuse to answer).
    async fn wait(&self) -> Result<()> {
        if self.agents.is_empty() {
            return Ok(());
        }
        self.gateway.wait_for_clusters_as(self.token.as_deref(), self.agents.len()).await.map(drop).map_err(|error| {
            // Which agent did not connect, and why, is in its own log.
            let agents: Vec<String> =
                self.agents.iter().map(|(name, agent)| format!("agent {name} log:\n{}", agent.proc.log())).collect();
            error.context(agents.join("\n"))
        })
    }
}

impl FederationBuilder {
    /// Keeps everything in `dir` (where the test has already written files the configs name)
    /// instead of a fresh temporary directory.
    pub fn in_dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// The gateway's config (YAML) instead of [`GATEWAY_CONFIG`].
    pub fn gateway_config(mut self, config: impl Into<String>) -> Self {
        self.gateway_config = config.into();
        self
    }

    /// Serves TLS: a [`Pki`] in the directory, its `tls:` section before the gateway's config,
    /// and each agent presenting a certificate for its cluster.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// The bearer token with which the harness asks whether the clusters are connected, for a
    /// gateway with `auth:`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Adds cluster `name` (also its agent's file names in the directory).
    pub fn cluster(mut self, name: impl Into<String>, options: ClusterOptions) -> Self {
        self.clusters.push((name.into(), options));
        self
    }

    /// Starts the gateway, then every cluster's proxy and agent in the order added, and waits
    /// until all clusters are connected.
    pub async fn start(self) -> Result<Federation> {
        let dir = match self.dir {
            Some(dir) => dir,
            None => tempfile::tempdir()?,
        };
        let (gateway, pki) = if self.tls {
            let pki = Pki::new(dir.path())?;
            let config = format!("{}{}", pki.gateway_tls(), self.gateway_config);
            (Gateway::start_tls(dir.path(), &config, &pki.ca_file()).await?, Some(pki))
        } else {
            (Gateway::start(dir.path(), &self.gateway_config).await?, None)
        };
        let mut federation = Federation {
            agents: BTreeMap::new(),
            options: BTreeMap::new(),
            proxies: BTreeMap::new(),
            gateway,
            token: self.token,
            pki,
            dir,
        };
        for (name, options) in self.clusters {
            federation.spawn(&name, options).await?;
        }
        federation.wait().await?;
        Ok(federation)
    }
}

/// A gateway and one agent, `gpu-host` ([`ClusterOptions::process_host`]: the builtin backend
/// with the process runner on one node of two L4s, no GPU discovery), in a temporary directory
/// that the tests may use too.
pub struct ProcessHost {
    /// The gateway.
    pub gateway: Gateway,
    /// The agent.
    pub agent: Agent,
    /// Where both keep their files.
    pub dir: tempfile::TempDir,
}

impl ProcessHost {
    /// Starts the gateway with `gateway_config` and the agent with `killGrace: kill_grace`, and
    /// waits until the cluster is connected.
    pub async fn start(gateway_config: &str, kill_grace: &str) -> Result<Self> {
        let federation = Federation::builder()
            .gateway_config(gateway_config)
            .cluster("gpu-host", ClusterOptions::process_host(kill_grace))
            .start()
            .await?;
        let Federation { mut agents, gateway, dir, .. } = federation;
        let agent = agents.remove("gpu-host").context("the process host's agent")?;
        Ok(Self { gateway, agent, dir })
    }
}
