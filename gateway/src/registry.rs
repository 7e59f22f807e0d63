//! Member clusters: who they are, what they last reported, and the link to their agent.

use std::collections::BTreeMap;

use meridian_proto::inventory::{ClusterInfo, Inventory, QueuePressure};
use meridian_proto::pb;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::placement::{ClusterSnapshot, FederationSnapshot, NetworkTable};
use crate::store::KnownCluster;

/// The gateway's side of one agent stream.
#[derive(Debug, Clone)]
pub struct AgentLink {
    /// Distinguishes this connection from a later one of the same cluster.
    pub connection: u64,
    /// Messages to the agent.
    pub tx: mpsc::Sender<Result<pb::GatewayMessage, tonic::Status>>,
}

/// One member cluster as the gateway knows it.
#[derive(Debug, Clone)]
pub struct ClusterEntry {
    /// Identity and prices from the agent's hello.
    pub info: ClusterInfo,
    /// Last reported inventory.
    pub inventory: Inventory,
    /// Last reported queue pressure.
    pub pressure: QueuePressure,
    /// When the agent last said anything.
    pub last_seen: Instant,
    /// The live stream, if connected.
    pub link: Option<AgentLink>,
}

impl ClusterEntry {
    /// Whether an agent stream is open.
    pub fn connected(&self) -> bool {
        self.link.is_some()
    }
}

/// All member clusters, by name.
#[derive(Debug, Default)]
pub struct Registry {
    clusters: BTreeMap<String, ClusterEntry>,
}

/// A cluster summary for `GET /v1/clusters` and `meridian clusters`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Cluster name.
    pub name: String,
    /// Region.
    pub region: String,
    /// `owned` or `cloud`.
    pub tier: meridian_proto::inventory::Tier,
    /// Local scheduler kind.
    pub backend: meridian_proto::inventory::BackendKind,
    /// Whether its agent is connected.
    pub connected: bool,
    /// Seconds since the agent last reported (null if never this run).
    pub last_seen_secs_ago: Option<f64>,
    /// GPUs in the cluster.
    pub gpus_total: u32,
    /// GPUs free now (summed over nodes).
    pub gpus_free: u32,
    /// GPU types present.
    pub gpu_types: Vec<String>,
    /// Jobs waiting in the cluster's local queues.
    pub pending_jobs: u32,
    /// GPUs those jobs want.
    pub pending_gpus: u32,
    /// The agent's estimate of a new job's wait.
    pub estimated_wait_secs: u64,
    /// Federation jobs offered to, bound to or running on the cluster.
    pub federated_jobs: u32,
    /// US$ per GPU-hour by type.
    pub prices: BTreeMap<String, f64>,
}

impl Registry {
    /// Seeds the registry with clusters remembered from the store; they start disconnected.
    pub fn from_known(known: Vec<KnownCluster>, now: Instant) -> Self {
        let clusters = known
            .into_iter()
            .map(|k| {
                let entry = ClusterEntry {
                    info: k.info,
                    inventory: k.inventory,
                    pressure: QueuePressure::default(),
                    last_seen: now,
                    link: None,
                };
                (entry.info.name.clone(), entry)
            })
            .collect();
        Self { clusters }
    }

    /// A cluster by name.
    pub fn get(&self, name: &str) -> Option<&ClusterEntry> {
        self.clusters.get(name)
    }

    /// A cluster by name, for updates.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut ClusterEntry> {
        self.clusters.get_mut(name)
    }

    /// Every cluster, by name.
    pub fn iter(&self) -> impl Iterator<Item = &ClusterEntry> {
        self.clusters.values()
    }

    /// Every cluster, for updates.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ClusterEntry> {
        self.clusters.values_mut()
    }

    /// Registers a (re)connecting agent; a previous link of the same cluster is replaced.
    pub fn connect(&mut self, info: ClusterInfo, link: AgentLink, now: Instant) {
        match self.clusters.get_mut(&info.name) {
            Some(entry) => {
                entry.info = info;
                entry.link = Some(link);
                entry.last_seen = now;
            }
            None => {
                let entry = ClusterEntry {
                    info,
                    inventory: Inventory::default(),
                    pressure: QueuePressure::default(),
                    last_seen: now,
                    link: Some(link),
                };
                self.clusters.insert(entry.info.name.clone(), entry);
            }
        }
    }

    /// Drops the link of `cluster` if it is still `connection`. Returns whether it was dropped.
    pub fn disconnect(&mut self, cluster: &str, connection: u64) -> bool {
        match self.clusters.get_mut(cluster) {
            Some(entry) if entry.link.as_ref().is_some_and(|l| l.connection == connection) => {
                entry.link = None;
                true
            }
            _ => false,
        }
    }

    /// The snapshot placement reads: every known cluster with its last report.
    pub fn snapshot(&self, network: &NetworkTable) -> FederationSnapshot {
        FederationSnapshot {
            clusters: self
                .clusters
                .values()
                .map(|c| ClusterSnapshot::new(c.info.clone(), c.inventory.clone(), c.pressure.clone(), c.connected()))
                .collect(),
            network: network.clone(),
        }
    }

    /// Summaries for the API; `federated_jobs` counts per cluster come from the caller.
    pub fn summaries(&self, now: Instant, federated_jobs: &BTreeMap<String, u32>) -> Vec<ClusterSummary> {
        self.clusters
            .values()
            .map(|c| {
                let mut gpu_types: Vec<String> = c.inventory.shapes.iter().map(|s| s.gpu_type.clone()).collect();
                gpu_types.sort();
                gpu_types.dedup();
                ClusterSummary {
                    name: c.info.name.clone(),
                    region: c.info.region.clone(),
                    tier: c.info.tier,
                    backend: c.info.backend,
                    connected: c.connected(),
                    last_seen_secs_ago: Some(now.saturating_duration_since(c.last_seen).as_secs_f64()),
                    gpus_total: c.inventory.gpus_total(),
                    gpus_free: c.inventory.gpus_free(),
                    gpu_types,
                    pending_jobs: c.pressure.pending_jobs(),
                    pending_gpus: c.pressure.pending_gpus(),
                    estimated_wait_secs: c.pressure.estimated_wait_secs,
                    federated_jobs: federated_jobs.get(&c.info.name).copied().unwrap_or(0),
                    prices: c.info.prices.clone(),
                }
            })
            .collect()
    }
}
