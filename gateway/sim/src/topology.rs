//! The simulated fleet, read from YAML: clusters with their region, tier, prices and node groups,
//! and the region-pair network on top of [`NetworkTable::default_seeded`].
//!
//! The file is checked as a whole before anything is built, like the gateway and agent configs:
//! every problem is listed at once, each naming its field path (`clusters[2].nodes[0].count`).
//! A valid file always expands into node lists that [`meridian_scheduler::BuiltinScheduler`]
//! accepts: node names are unique per cluster and every node of a shape is identical.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use meridian_proto::config_file;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, ClusterInfo, Tier};
use meridian_scheduler::{NodeSpec, QueuePolicy};
use serde::Deserialize;

use super::SimError;
use meridian_placement::NetworkTable;

/// Most nodes one node group may declare; a guard against a stray extra digit, since every node
/// is simulated individually.
const MAX_NODES_PER_GROUP: u32 = 100_000;

/// Most GPUs one node may have (the largest real systems have 16; 64 leaves room for exotic ones).
const MAX_GPUS_PER_NODE: u32 = 64;

/// A simulated federation: its member clusters and the network between their regions.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Short name, shown in reports (`hybrid-3region`).
    pub name: String,
    /// What the fleet represents, for reports and `--help`-like listings.
    pub description: String,
    /// Member clusters, in file order; indices into this list identify clusters everywhere in the
    /// simulator.
    pub clusters: Vec<SimCluster>,
    /// Region-pair throughput and egress price: the seeded defaults with the file's links on top.
    pub network: NetworkTable,
    /// Relative training throughput per GPU type (`gpuSpeed`): a job's duration is its run time on
    /// a GPU of speed 1.0, and on a type of speed `s` it runs `duration / s` (see
    /// [`Topology::run_secs`]). Empty: every type runs at 1.0. The shipped fleets take A100 as
    /// 1.0 and derive the other ratios from MLPerf Training results (see their YAML comments).
    pub gpu_speed: BTreeMap<String, f64>,
}

/// One simulated member cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct SimCluster {
    /// Identity and terms as an agent would send them: builtin backend, containers and bare
    /// commands both supported, prices from the file.
    pub info: ClusterInfo,
    /// Every node, expanded from the file's node groups and named `{cluster}-{shape}-{i:03}`
    /// (`i` counts from 0 within each shape).
    pub nodes: Vec<NodeSpec>,
    /// The policy of every local queue of the member (`memberPolicy`, per cluster or for the
    /// whole fleet; default `backfill`).
    pub member_policy: QueuePolicy,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TopologyFile {
    name: String,
    #[serde(default)]
    description: String,
    clusters: Vec<ClusterFile>,
    #[serde(default)]
    network: NetworkTable,
    #[serde(default)]
    gpu_speed: BTreeMap<String, f64>,
    /// Queue policy of every member without its own `memberPolicy`.
    #[serde(default)]
    member_policy: QueuePolicy,
}

/// One cluster as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClusterFile {
    name: String,
    region: String,
    // Required on purpose: a forgotten tier would silently make a cloud cluster free.
    tier: Tier,
    // Defaulted so that a missing map is reported per GPU type by `check`, with the rest.
    #[serde(default)]
    prices: BTreeMap<String, f64>,
    nodes: Vec<NodeGroupFile>,
    /// Queue policy of this member's local queues; the file's `memberPolicy` if absent.
    #[serde(default)]
    member_policy: Option<QueuePolicy>,
}

/// `count` identical nodes of one shape, as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeGroupFile {
    shape: String,
    gpu_type: String,
    count: u32,
    gpus_per_node: u32,
    #[serde(default, rename = "gpuMemoryGiB")]
    gpu_memory_gib: Option<u32>,
    cpu_per_node: u32,
    #[serde(rename = "memoryGiBPerNode")]
    memory_gib_per_node: u32,
}

impl Topology {
    /// Reads and checks a topology file.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        Self::parse(&config_file::read(path)?, path)
    }

    /// Parses and checks topology YAML; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, SimError> {
        let file: TopologyFile = config_file::parse_yaml(text, path)?;
        let catalog = GpuCatalog::default();
        config_file::check(path, file.problems(&catalog))?;
        Ok(file.build(&catalog))
    }

    /// GPUs of every cluster.
    pub fn gpus(&self) -> u64 {
        self.clusters.iter().map(SimCluster::gpus).sum()
    }

    /// GPUs of the owned-tier clusters (the capacity a workload's load is measured against).
    pub fn owned_gpus(&self) -> u64 {
        self.clusters.iter().filter(|c| c.info.tier == Tier::Owned).map(SimCluster::gpus).sum()
    }

    /// GPUs of the owned-tier clusters in reference-GPU equivalents (each GPU counts its type's
    /// `gpuSpeed`; a job's duration is defined on the reference type), rounded, at least 1.
    pub fn owned_reference_gpus(&self) -> u64 {
        self.reference_gpus(|c| c.info.tier == Tier::Owned)
    }

    /// Every cluster's GPUs in reference-GPU equivalents, rounded, at least 1.
    pub fn reference_gpus_all(&self) -> u64 {
        self.reference_gpus(|_| true)
    }

    fn reference_gpus(&self, counted: impl Fn(&SimCluster) -> bool) -> u64 {
        let total: f64 = self
            .clusters
            .iter()
            .filter(|c| counted(c))
            .flat_map(SimCluster::gpu_types)
            .map(|(name, gpus, _)| gpus as f64 * self.speed(&name))
            .sum();
        (total.round() as u64).max(1)
    }

    /// Regions of the clusters, sorted, each once.
    pub fn regions(&self) -> Vec<String> {
        let regions: BTreeSet<&str> = self.clusters.iter().map(|c| c.info.region.as_str()).collect();
        regions.into_iter().map(str::to_owned).collect()
    }

    /// Relative throughput of `gpu_type` (1.0 when the topology lists no speeds; validation
    /// requires a speed for every type in use once it lists any).
    pub fn speed(&self, gpu_type: &str) -> f64 {
        self.gpu_speed.get(gpu_type).copied().filter(|s| s.is_finite() && *s > 0.0).unwrap_or(1.0)
    }

    /// The TRUE run time, in whole seconds (at least 1), of a job whose duration on the reference
    /// GPU (speed 1.0) is `duration_secs` when it runs on `gpu_type`: `duration / speed`, rounded
    /// up. Every run time on a cluster in the simulator comes from here, so cost (GPUs × run
    /// time × price) follows it too.
    pub fn run_secs(&self, duration_secs: u64, gpu_type: &str) -> u64 {
        let speed = self.speed(gpu_type);
        if speed == 1.0 {
            return duration_secs.max(1);
        }
        ((duration_secs as f64 / speed).ceil() as u64).max(1)
    }

    /// The TRUE run time of a gang whose replicas run on `gpu_types`: the run time on the slowest
    /// of them ([`Self::run_secs`]), since a gang's replicas step together and wait for the
    /// slowest. A gang on one type runs as [`Self::run_secs`] says.
    pub fn gang_run_secs<'a>(&self, duration_secs: u64, gpu_types: impl IntoIterator<Item = &'a str>) -> u64 {
        gpu_types.into_iter().map(|t| self.run_secs(duration_secs, t)).max().unwrap_or_else(|| duration_secs.max(1))
    }

    /// Index into [`Self::clusters`] of the cluster named `name`.
    pub fn cluster_index(&self, name: &str) -> Option<usize> {
        self.clusters.iter().position(|c| c.info.name == name)
    }
}

impl SimCluster {
    /// GPUs of all its nodes.
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }

    /// Per GPU type, in first-declared order: (type name, total GPUs, largest GPUs per node).
    pub fn gpu_types(&self) -> Vec<(String, u64, u32)> {
        let mut types: Vec<(String, u64, u32)> = Vec::new();
        for node in &self.nodes {
            match types.iter_mut().find(|(name, _, _)| *name == node.gpu_type) {
                Some((_, total, largest)) => {
                    *total += u64::from(node.gpus);
                    *largest = (*largest).max(node.gpus);
                }
                None => types.push((node.gpu_type.clone(), u64::from(node.gpus), node.gpus)),
            }
        }
        types
    }

    /// US$ per GPU-hour of `gpu_type` here (0 if unpriced — but validation requires a price for
    /// every type used).
    pub fn price(&self, gpu_type: &str) -> f64 {
        self.info.price(gpu_type)
    }
}

impl TopologyFile {
    /// Everything types cannot express, one line per problem, each naming its field path.
    fn problems(&self, catalog: &GpuCatalog) -> Vec<String> {
        let mut problems = Vec::new();
        if self.name.trim().is_empty() {
            problems.push("name: must name the topology".to_string());
        }
        if self.clusters.is_empty() {
            problems.push("clusters: at least one cluster is needed".to_string());
        }
        let mut first_with_name: BTreeMap<&str, usize> = BTreeMap::new();
        for (c, cluster) in self.clusters.iter().enumerate() {
            let at = format!("clusters[{c}]");
            if cluster.name.trim().is_empty() {
                problems.push(format!("{at}.name: must name the cluster"));
            } else if let Some(&first) = first_with_name.get(cluster.name.as_str()) {
                problems.push(format!("{at}.name: `{}` is already the name of clusters[{first}]", cluster.name));
            } else {
                first_with_name.insert(&cluster.name, c);
            }
            if cluster.region.trim().is_empty() {
                problems.push(format!("{at}.region: must name the cluster's region"));
            }
            cluster.problems(&at, catalog, &mut problems);
        }
        for (gpu, speed) in &self.gpu_speed {
            if !(speed.is_finite() && *speed > 0.0) {
                problems.push(format!("gpuSpeed.{gpu}: {speed} must be a positive relative throughput"));
            }
        }
        if !self.gpu_speed.is_empty() {
            let mut missing = BTreeSet::new();
            for cluster in &self.clusters {
                for group in &cluster.nodes {
                    if !self.gpu_speed.contains_key(&group.gpu_type) {
                        missing.insert(group.gpu_type.as_str());
                    }
                }
            }
            for gpu in missing {
                problems.push(format!(
                    "gpuSpeed.{gpu}: missing; nodes of type `{gpu}` need a relative throughput once gpuSpeed lists any"
                ));
            }
        }
        problems
    }

    /// The checked file as a topology; call only when [`Self::problems`] found none.
    fn build(self, catalog: &GpuCatalog) -> Topology {
        let mut network = NetworkTable::default_seeded();
        network.extend(&self.network);
        let fleet_policy = self.member_policy;
        let clusters = self.clusters.into_iter().map(|cluster| cluster.build(catalog, fleet_policy)).collect();
        Topology { name: self.name, description: self.description, clusters, network, gpu_speed: self.gpu_speed }
    }
}

impl ClusterFile {
    /// Problems of the cluster's node groups and prices; `at` is the cluster's field path.
    fn problems(&self, at: &str, catalog: &GpuCatalog, problems: &mut Vec<String>) {
        if self.nodes.is_empty() {
            problems.push(format!("{at}.nodes: at least one node group is needed"));
        }
        let mut first_with_shape: BTreeMap<&str, usize> = BTreeMap::new();
        for (g, group) in self.nodes.iter().enumerate() {
            let at = format!("{at}.nodes[{g}]");
            if group.shape.trim().is_empty() {
                problems.push(format!("{at}.shape: must name the node shape"));
            } else if let Some(&first) = first_with_shape.get(group.shape.as_str()) {
                problems.push(format!(
                    "{at}.shape: `{}` is already declared by nodes[{first}]; shapes must be unique in a cluster",
                    group.shape
                ));
            } else {
                first_with_shape.insert(&group.shape, g);
            }
            if !(1..=MAX_NODES_PER_GROUP).contains(&group.count) {
                problems.push(format!("{at}.count: {} must be between 1 and {MAX_NODES_PER_GROUP}", group.count));
            }
            if !(1..=MAX_GPUS_PER_NODE).contains(&group.gpus_per_node) {
                problems.push(format!(
                    "{at}.gpusPerNode: {} must be between 1 and {MAX_GPUS_PER_NODE}",
                    group.gpus_per_node
                ));
            }
            match group.gpu_memory_gib {
                Some(0) => problems.push(format!("{at}.gpuMemoryGiB: must be at least 1")),
                Some(_) => {}
                None if !catalog.contains(&group.gpu_type) => problems.push(format!(
                    "{at}.gpuType: unknown GPU type `{}`; set gpuMemoryGiB or use one of {}",
                    group.gpu_type,
                    catalog.names().collect::<Vec<_>>().join(", ")
                )),
                None => {}
            }
            if group.cpu_per_node == 0 {
                problems.push(format!("{at}.cpuPerNode: must be at least 1"));
            }
            if group.memory_gib_per_node == 0 {
                problems.push(format!("{at}.memoryGiBPerNode: must be at least 1"));
            }
        }

        // Every GPU type in use needs a price (else it would run for free), and every price needs
        // a GPU type in use (else `a100-80gb` would quietly leave `a100-80g` unpriced).
        let mut used: Vec<(&str, usize)> = Vec::new();
        for (g, group) in self.nodes.iter().enumerate() {
            if !used.iter().any(|(gpu, _)| *gpu == group.gpu_type) {
                used.push((&group.gpu_type, g));
            }
        }
        for (gpu, g) in &used {
            if !self.prices.contains_key(*gpu) {
                problems.push(format!(
                    "{at}.prices.{gpu}: missing; the GPUs of nodes[{g}] need a price in US$ per GPU-hour"
                ));
            }
        }
        for (gpu, price) in &self.prices {
            if !used.iter().any(|(used, _)| used == gpu) {
                let types = used.iter().map(|(gpu, _)| *gpu).collect::<Vec<_>>().join(", ");
                problems.push(format!(
                    "{at}.prices.{gpu}: the cluster has no `{gpu}` nodes (it has {types}); fix the name or remove it"
                ));
            } else if !(price.is_finite() && *price >= 0.0) {
                problems.push(format!("{at}.prices.{gpu}: {price} must be a non-negative number of US$ per GPU-hour"));
            }
        }
    }

    /// The checked cluster, nodes expanded; `fleet_policy` unless it names its own policy.
    fn build(self, catalog: &GpuCatalog, fleet_policy: QueuePolicy) -> SimCluster {
        let member_policy = self.member_policy.unwrap_or(fleet_policy);
        let mut nodes = Vec::with_capacity(self.nodes.iter().map(|g| g.count as usize).sum());
        for group in &self.nodes {
            // `problems` guarantees a memory for every group; 0 is unreachable.
            let memory = group.gpu_memory_gib.or_else(|| catalog.memory_gib(&group.gpu_type)).unwrap_or(0);
            nodes.extend((0..group.count).map(|i| NodeSpec {
                name: format!("{}-{}-{i:03}", self.name, group.shape),
                shape: group.shape.clone(),
                gpu_type: group.gpu_type.clone(),
                gpu_memory_gib: memory,
                gpus: group.gpus_per_node,
                cpu: group.cpu_per_node,
                memory_gib: group.memory_gib_per_node,
                labels: Default::default(),
            }));
        }
        let info = ClusterInfo {
            name: self.name,
            region: self.region,
            tier: self.tier,
            backend: BackendKind::Builtin,
            prices: self.prices,
            supports_containers: true,
            supports_bare_commands: true,
            labels: Default::default(),
        };
        SimCluster { info, nodes, member_policy }
    }
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use meridian_proto::config_file::ConfigError;
    use meridian_scheduler::{BuiltinScheduler, QueueSpec};

    use super::*;

    const HYBRID: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/sim/hybrid-3region.yaml");
    const FLEET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/sim/fleet-12.yaml");

    const SMALL: &str = "name: t
clusters:
  - name: a
    region: r1
    tier: owned
    prices: {v100: 0.8}
    nodes:
      - {shape: dgx, gpuType: v100, count: 2, gpusPerNode: 8, cpuPerNode: 40, memoryGiBPerNode: 512}
";

    fn parse(text: &str) -> Result<Topology, SimError> {
        Topology::parse(text, Path::new("t.yaml"))
    }

    /// The problems of an invalid file; fails the test on anything else.
    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Err(SimError::Topology(ConfigError::Invalid { problems, .. })) => problems,
            other => panic!("expected an invalid topology, got {other:?}"),
        }
    }

    /// The message of a file that does not parse; fails the test on anything else.
    fn parse_error(text: &str) -> String {
        match parse(text) {
            Err(SimError::Topology(ConfigError::Parse { message, .. })) => message,
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    fn every_cluster_is_schedulable(topology: &Topology) {
        for cluster in &topology.clusters {
            let queues = vec![QueueSpec::new("default", 1.0)];
            if let Err(e) = BuiltinScheduler::new(cluster.nodes.clone(), queues) {
                panic!("cluster {}: {e}", cluster.info.name);
            }
        }
    }

    fn tier_gpus(topology: &Topology, tier: Tier) -> u64 {
        topology.clusters.iter().filter(|c| c.info.tier == tier).map(SimCluster::gpus).sum()
    }

    #[test]
    fn a_small_file_expands_nodes_and_fills_in_the_cluster_info() {
        let topology = parse(SMALL).unwrap();
        let cluster = &topology.clusters[0];
        assert_eq!(cluster.nodes.len(), 2);
        assert_eq!(cluster.nodes[1].name, "a-dgx-001");
        assert_eq!(cluster.nodes[0].gpu_memory_gib, 32, "memory comes from the GPU catalog");
        assert_eq!(cluster.info.backend, BackendKind::Builtin);
        assert!(cluster.info.supports_containers && cluster.info.supports_bare_commands);
        assert_eq!(cluster.price("v100"), 0.8);
        assert_eq!(cluster.gpu_types(), vec![("v100".to_string(), 16, 8)]);
        assert_eq!(topology.description, "");
        assert_eq!(topology.network, NetworkTable::default_seeded(), "no links: the seeded table");
        assert_eq!(topology.cluster_index("a"), Some(0));
        assert_eq!(topology.cluster_index("b"), None);
    }

    #[test]
    fn gpu_types_keep_declared_order_and_the_largest_node() {
        let text = SMALL.replace("prices: {v100: 0.8}", "prices: {v100: 0.8, l4: 0.5}")
            + "      - {shape: box, gpuType: l4, count: 3, gpusPerNode: 1, cpuPerNode: 8, memoryGiBPerNode: 32}\n"
            + "      - {shape: big, gpuType: v100, count: 1, gpusPerNode: 16, cpuPerNode: 96, memoryGiBPerNode: 1536}\n";
        let topology = parse(&text).unwrap();
        let types = topology.clusters[0].gpu_types();
        assert_eq!(types, vec![("v100".to_string(), 32, 16), ("l4".to_string(), 3, 1)]);
        every_cluster_is_schedulable(&topology);
    }

    #[test]
    fn the_hybrid_fleet_loads_with_its_capacity_and_network() {
        let topology = Topology::load(Path::new(HYBRID)).unwrap();
        assert_eq!(topology.name, "hybrid-3region");
        assert!(topology.description.starts_with("3 owned clusters (448 GPUs"), "{}", topology.description);
        assert_eq!(topology.clusters.len(), 5);
        assert_eq!(topology.owned_gpus(), 448);
        assert_eq!(tier_gpus(&topology, Tier::Cloud), 384);
        assert_eq!(topology.gpus(), 832);
        assert_eq!(topology.clusters.iter().map(|c| c.nodes.len()).sum::<usize>(), 104);
        assert_eq!(topology.regions(), ["ap-northeast", "eu-west", "us-east"]);
        for (name, gpus) in [("east-onprem", 256), ("eu-onprem", 128), ("ap-onprem", 64), ("aws-east", 256)] {
            let index = topology.cluster_index(name).unwrap();
            assert_eq!(topology.clusters[index].gpus(), gpus, "{name}");
        }
        every_cluster_is_schedulable(&topology);
        let listed =
            topology.network.links().find(|l| (l.from.as_str(), l.to.as_str()) == ("us-east", "eu-west")).unwrap();
        assert_eq!(listed.gbps, 4.318, "from the file, not the seeded 4.32");
        assert_eq!(topology.network.usd_per_gb("ap-northeast", "us-east"), 0.09);
        assert_eq!(topology.network.usd_per_gb("us-east", "ap-northeast"), 0.02);
    }

    #[test]
    fn the_twelve_cluster_fleet_loads_with_its_capacity() {
        let topology = Topology::load(Path::new(FLEET)).unwrap();
        assert_eq!(topology.name, "fleet-12");
        assert_eq!(topology.clusters.len(), 12);
        let owned: Vec<&SimCluster> = topology.clusters.iter().filter(|c| c.info.tier == Tier::Owned).collect();
        assert_eq!(owned.len(), 8);
        assert_eq!(topology.owned_gpus(), 1024);
        assert_eq!(tier_gpus(&topology, Tier::Cloud), 640);
        assert_eq!(topology.gpus(), 1664);
        assert_eq!(topology.clusters.iter().map(|c| c.nodes.len()).sum::<usize>(), 216);
        assert_eq!(topology.regions(), ["ap-northeast", "ap-southeast", "eu-central", "eu-west", "us-east", "us-west"]);
        for cluster in &topology.clusters {
            let gpus = cluster.gpus();
            let expected = if cluster.info.tier == Tier::Owned { 64..=256 } else { 128..=256 };
            assert!(expected.contains(&gpus), "{}: {gpus} GPUs", cluster.info.name);
        }
        // A 128-GPU gang needs 128 GPUs of one node shape in one cluster.
        let fits_big_gang = |c: &SimCluster| {
            let mut per_shape: BTreeMap<&str, u64> = BTreeMap::new();
            for node in &c.nodes {
                *per_shape.entry(node.shape.as_str()).or_default() += u64::from(node.gpus);
            }
            per_shape.values().any(|&gpus| gpus >= 128)
        };
        assert!(owned.iter().filter(|c| fits_big_gang(c)).count() >= 2);
        every_cluster_is_schedulable(&topology);
        assert_eq!(topology.network.gbps("ap-southeast", "ap-northeast"), 4.289);
    }

    #[test]
    fn a_missing_file_is_a_read_error() {
        let err = Topology::load(Path::new("/nonexistent/topology.yaml")).unwrap_err();
        assert!(matches!(err, SimError::Topology(ConfigError::Read { .. })), "{err:?}");
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let message = parse_error(&SMALL.replace("tier: owned", "tier: owned\n    colour: red"));
        assert!(message.contains("clusters[0]") && message.contains("colour"), "{message}");
    }

    #[test]
    fn a_bad_tier_is_named_with_its_path() {
        let message = parse_error(&SMALL.replace("tier: owned", "tier: onprem"));
        assert!(message.contains("clusters[0].tier") && message.contains("onprem"), "{message}");
    }

    #[test]
    fn duplicate_cluster_names_are_refused() {
        let twice = SMALL.to_string() + &SMALL.lines().skip(2).map(|l| format!("{l}\n")).collect::<String>();
        let problems = problems(&twice);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("clusters[1].name:") && problems[0].contains("clusters[0]"), "{problems:?}");
    }

    #[test]
    fn a_zero_count_is_refused() {
        let problems = problems(&SMALL.replace("count: 2", "count: 0"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("clusters[0].nodes[0].count:"), "{problems:?}");
    }

    #[test]
    fn a_gpu_type_without_a_price_is_refused() {
        let problems = problems(&SMALL.replace("    prices: {v100: 0.8}\n", ""));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("clusters[0].prices.v100: missing"), "{problems:?}");
    }

    #[test]
    fn a_price_for_a_gpu_type_the_cluster_lacks_is_refused() {
        let problems = problems(&SMALL.replace("{v100: 0.8}", "{v100: 0.8, a100-80gb: 1.2}"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("clusters[0].prices.a100-80gb:"), "{problems:?}");
    }

    #[test]
    fn an_unknown_gpu_type_needs_its_memory() {
        let text = SMALL.replace("v100", "mystery");
        let problems = problems(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("clusters[0].nodes[0].gpuType: unknown GPU type `mystery`"), "{problems:?}");

        let with_memory = text.replace("count: 2,", "count: 2, gpuMemoryGiB: 96,");
        let topology = parse(&with_memory).unwrap();
        assert_eq!(topology.clusters[0].nodes[0].gpu_memory_gib, 96);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "name: ''
clusters:
  - name: a
    region: ''
    tier: cloud
    prices: {v100: -1, h100: 3}
    nodes:
      - {shape: x, gpuType: v100, count: 100001, gpusPerNode: 0, cpuPerNode: 0, memoryGiBPerNode: 0}
      - {shape: x, gpuType: v100, count: 1, gpusPerNode: 8, cpuPerNode: 1, memoryGiBPerNode: 1}
  - name: b
    region: r
    tier: owned
    nodes: []
";
        let problems = problems(text);
        let fields: Vec<&str> = problems.iter().map(|p| p.split(':').next().unwrap_or_default()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "clusters[0].region",
                "clusters[0].nodes[0].count",
                "clusters[0].nodes[0].gpusPerNode",
                "clusters[0].nodes[0].cpuPerNode",
                "clusters[0].nodes[0].memoryGiBPerNode",
                "clusters[0].nodes[1].shape",
                "clusters[0].prices.h100",
                "clusters[0].prices.v100",
                "clusters[1].nodes",
            ],
            "{problems:#?}"
        );
    }

    #[test]
    fn an_empty_cluster_list_is_refused() {
        let problems = problems("name: t\nclusters: []\n");
        assert_eq!(problems, ["clusters: at least one cluster is needed"]);
    }

    #[test]
    fn bad_network_links_are_refused() {
        let message = parse_error(&format!("{SMALL}network:\n  - {{from: r1, to: r2, gbps: 0, usdPerGb: 0.02}}\n"));
        assert!(message.contains("network") && message.contains("r1 -> r2"), "{message}");
    }

    #[test]
    fn gpu_speeds_scale_run_time_and_must_cover_every_type() {
        let topology = parse(SMALL).unwrap();
        assert_eq!(topology.run_secs(1000, "v100"), 1000, "no table: every type runs at 1.0");
        let topology = parse(&format!("{SMALL}gpuSpeed: {{v100: 0.4, h100: 2.5}}\n")).unwrap();
        assert_eq!(topology.run_secs(1000, "v100"), 2500);
        assert_eq!(topology.run_secs(1000, "h100"), 400);
        assert_eq!(topology.run_secs(1001, "h100"), 401, "rounded up to whole seconds");
        // A gang over both types steps at the slower one's pace, whichever node is listed first.
        assert_eq!(topology.gang_run_secs(1000, ["h100", "v100"]), 2500);
        assert_eq!(topology.gang_run_secs(1000, ["v100", "h100"]), 2500);
        assert_eq!(topology.gang_run_secs(1000, ["h100", "h100"]), 400);
        let missing = problems(&format!("{SMALL}gpuSpeed: {{h100: 2.5}}\n"));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].starts_with("gpuSpeed.v100: missing"), "{missing:?}");
        let zero = problems(&format!("{SMALL}gpuSpeed: {{v100: 0}}\n"));
        assert!(zero[0].starts_with("gpuSpeed.v100: 0 must be"), "{zero:?}");
    }

    #[test]
    fn the_shipped_fleets_list_a_speed_for_every_gpu_type() {
        for path in [HYBRID, FLEET] {
            let topology = Topology::load(Path::new(path)).unwrap();
            assert_eq!(topology.speed("a100-80g"), 1.0, "A100 is the reference");
            assert!(topology.speed("h100") > 2.0 && topology.speed("v100") < 0.5, "{path}");
        }
    }

    #[test]
    fn member_policy_defaults_to_backfill_and_a_cluster_may_override_the_fleet() {
        assert_eq!(parse(SMALL).unwrap().clusters[0].member_policy, QueuePolicy::Backfill);
        let two = format!(
            "{SMALL}  - name: b\n    region: r1\n    tier: owned\n    memberPolicy: bestEffort\n    prices: {{v100: 0.8}}\n    nodes:\n      - {{shape: dgx, gpuType: v100, count: 1, gpusPerNode: 8, cpuPerNode: 40, memoryGiBPerNode: 512}}\nmemberPolicy: strict\n"
        );
        let policies: Vec<QueuePolicy> = parse(&two).unwrap().clusters.iter().map(|c| c.member_policy).collect();
        assert_eq!(policies, [QueuePolicy::Strict, QueuePolicy::BestEffort]);
        let message = parse_error(&format!("{SMALL}memberPolicy: fifo\n"));
        assert!(message.contains("memberPolicy") && message.contains("bestEffort"), "{message}");
    }
}
