//! Member clusters: who they are, what they last reported, and which stream speaks for them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use meridian_placement::{ClusterSnapshot, FederationSnapshot, NetworkTable, Quotes};
use meridian_proto::inventory::{ClusterInfo, Inventory, QueuePressure};

use crate::io::ConnId;
use crate::record::KnownCluster;

/// The stream that speaks for a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The stream.
    pub conn: ConnId,
    /// The agent process behind it.
    pub instance: String,
}

/// One member cluster as the core knows it.
#[derive(Debug, Clone)]
pub struct ClusterEntry {
    /// Identity and prices from the agent's hello.
    pub info: ClusterInfo,
    /// Last reported inventory.
    pub inventory: Inventory,
    /// Last reported queue pressure (shared with the snapshots placement reads).
    pub pressure: Arc<QueuePressure>,
    /// When the agent last said anything (Unix ms; the load time for remembered clusters).
    pub last_seen_ms: i64,
    /// The live stream, if connected.
    pub link: Option<Link>,
    /// The member's start quotes (in memory only; see `quotes.rs`), shared with the snapshots.
    pub quotes: Arc<Quotes>,
    /// Placement's view of `info` and `inventory` (indexed, priced), built at the first round
    /// after either changes; each round renews only its pressure and connection state.
    cached: OnceLock<ClusterSnapshot>,
}

impl ClusterEntry {
    fn new(info: ClusterInfo, inventory: Inventory, last_seen_ms: i64, link: Option<Link>) -> Self {
        Self {
            info,
            inventory,
            pressure: Arc::default(),
            last_seen_ms,
            link,
            quotes: Arc::default(),
            cached: OnceLock::new(),
        }
    }

    /// Replaces the reported inventory.
    pub fn set_inventory(&mut self, inventory: Inventory) {
        self.inventory = inventory;
        self.cached = OnceLock::new();
    }
}

/// All member clusters by name, and streams by id.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    clusters: BTreeMap<String, ClusterEntry>,
    streams: HashMap<ConnId, String>,
}

impl Registry {
    /// Seeds the registry with remembered clusters; they start disconnected.
    pub fn from_known(known: Vec<KnownCluster>, now_ms: i64) -> Self {
        let clusters = known
            .into_iter()
            .map(|k| {
                let entry = ClusterEntry::new(k.info, k.inventory, now_ms, None);
                (entry.info.name.clone(), entry)
            })
            .collect();
        Self { clusters, streams: HashMap::new() }
    }

    /// A cluster by name.
    pub fn get(&self, name: &str) -> Option<&ClusterEntry> {
        self.clusters.get(name)
    }

    /// Every cluster, by name.
    pub fn iter(&self) -> impl Iterator<Item = &ClusterEntry> {
        self.clusters.values()
    }

    /// The cluster a live stream speaks for.
    pub fn cluster_of(&self, conn: ConnId) -> Option<&str> {
        self.streams.get(&conn).map(String::as_str)
    }

    /// The cluster a live stream speaks for, for updates.
    pub fn entry_of_mut(&mut self, conn: ConnId) -> Option<&mut ClusterEntry> {
        let name = self.streams.get(&conn)?;
        self.clusters.get_mut(name)
    }

    /// The live stream of `cluster`.
    pub fn conn_of(&self, cluster: &str) -> Option<ConnId> {
        self.clusters.get(cluster).and_then(|c| c.link.as_ref()).map(|l| l.conn)
    }

    /// Binds `conn` to the cluster of `info`; returns the stream it replaces, if any. The caller
    /// has checked that the replaced stream (if any) belongs to the same agent instance.
    pub fn connect(&mut self, info: ClusterInfo, link: Link, now_ms: i64) -> Option<ConnId> {
        let conn = link.conn;
        let name = info.name.clone();
        let replaced = match self.clusters.get_mut(&name) {
            Some(entry) => {
                entry.info = info;
                entry.cached = OnceLock::new();
                entry.last_seen_ms = now_ms;
                entry.link.replace(link).map(|old| old.conn)
            }
            None => {
                let entry = ClusterEntry::new(info, Inventory::default(), now_ms, Some(link));
                self.clusters.insert(name.clone(), entry);
                None
            }
        };
        if let Some(old) = replaced {
            self.streams.remove(&old);
        }
        self.streams.insert(conn, name);
        replaced
    }

    /// Unbinds a stream; returns its cluster's name if the stream was live.
    pub fn disconnect(&mut self, conn: ConnId) -> Option<String> {
        let name = self.streams.remove(&conn)?;
        if let Some(entry) = self.clusters.get_mut(&name)
            && entry.link.as_ref().is_some_and(|l| l.conn == conn)
        {
            entry.link = None;
            // A new agent plans afresh; the old one's quotes say nothing about it.
            entry.quotes = Arc::default();
        }
        Some(name)
    }

    /// Drops every quote that arrived before `oldest_ms`.
    pub fn expire_quotes(&mut self, oldest_ms: i64) {
        for entry in self.clusters.values_mut() {
            // Copied (the snapshots may share it) only when something expires.
            if entry.quotes.oldest_received_ms().is_some_and(|at| at < oldest_ms) {
                Arc::make_mut(&mut entry.quotes).expire(oldest_ms);
            }
        }
    }

    /// The snapshot placement reads: every known cluster with its last report and quotes, read
    /// at `now_ms`. `gpu_speed` is placement's GPU-type throughput table
    /// (`PlacementConfig::gpu_speed`).
    pub fn snapshot(
        &self,
        network: &Arc<NetworkTable>,
        gpu_speed: &BTreeMap<String, f64>,
        now_ms: i64,
    ) -> FederationSnapshot {
        FederationSnapshot::shared(
            self.clusters
                .values()
                .map(|c| {
                    let cached = c.cached.get_or_init(|| {
                        let mut snapshot =
                            ClusterSnapshot::new(c.info.clone(), c.inventory.clone(), QueuePressure::default(), false);
                        if !gpu_speed.is_empty() {
                            snapshot.set_gpu_speed(gpu_speed);
                        }
                        snapshot
                    });
                    cached.renewed(Arc::clone(&c.pressure), c.link.is_some()).with_quotes(Arc::clone(&c.quotes), now_ms)
                })
                .collect(),
            Arc::clone(network),
        )
    }
}
