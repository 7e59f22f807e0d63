//! What placement reads about the federation for one placement cycle.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use meridian_proto::inventory::{ClusterInfo, Inventory, NodeFree, QueuePressure};

use crate::index::{FreeIndex, clamp};
use crate::name::Name;
use crate::network::NetworkTable;
use crate::quote::{Quote, Quotes};
use crate::statics::{StaticCache, StaticsId};

/// Everything placement knows about one member cluster at one moment: its last report and whether
/// its agent is connected.
///
/// The report (`info` and `inventory`) is read-only once the snapshot is built, because the
/// snapshot keeps what placement derives from it in step: an index of free nodes by free GPUs
/// that [`reserve`](Self::reserve) updates, the name and region as shared [`Name`]s, and each
/// GPU type's price. A change behind their back would make placement pick nodes that are not free
/// or label a decision wrongly; build a new snapshot instead.
///
/// The report and what is derived from it are shared (`Arc`): cloning a snapshot for a new
/// placement cycle copies no inventory, and [`reserve`](Self::reserve) copies a cluster's
/// inventory and index only the first time it changes them in a cycle.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSnapshot {
    info: Arc<ClusterInfo>,
    inventory: Arc<Inventory>,
    /// How busy the cluster's own queues are (shared with the report it came from).
    pub pressure: Arc<QueuePressure>,
    /// Whether the agent is connected; a disconnected cluster is never chosen.
    pub connected: bool,
    index: Arc<FreeIndex>,
    name: Name,
    region: Name,
    /// US$ per GPU-hour of each shape's GPU type (`info.price`), looked up once.
    prices: Arc<[f64]>,
    /// Relative throughput of each shape's GPU type ([`PlacementConfig::gpu_speed`]); empty: all 1.
    ///
    /// [`PlacementConfig::gpu_speed`]: crate::config::PlacementConfig::gpu_speed
    speeds: Arc<[f64]>,
    /// GPUs of federation-queue jobs decided, earlier in this placement cycle, to wait for this
    /// cluster: they are ahead of any job placed later in the cycle.
    waiting_gpus: u64,
    /// The cluster's labels as a cluster selector sees them, as text for rejections; made the
    /// first time a selector rejects the cluster, then shared by every such rejection.
    labels_text: OnceLock<Name>,
    /// The node shapes' labels as text for rejections, made the same way.
    node_labels_text: OnceLock<Name>,
    /// The member's start quotes (shared with the gateway's book; see [`crate::quote`]).
    quotes: Arc<Quotes>,
    /// The gateway's clock for this cycle (Unix ms), against which quoted starts are read.
    now_ms: i64,
    /// Names what the static checks read here (see [`crate::statics`]); a new one whenever
    /// that changes.
    statics: StaticsId,
}

/// The whole federation as placement sees it for one cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FederationSnapshot {
    /// Member clusters; names are unique.
    pub clusters: Vec<ClusterSnapshot>,
    /// Links between regions, for data transfer time and egress cost (shared between cycles).
    pub network: Arc<NetworkTable>,
    /// The clusters' static verdicts by job class, kept between decisions (shared by clones,
    /// and by whoever passes it to [`Self::with_statics`]).
    pub(crate) statics: Arc<StaticCache>,
}

impl ClusterSnapshot {
    /// A snapshot of one cluster's report. Indexes the inventory (linear in its nodes).
    pub fn new(info: ClusterInfo, inventory: Inventory, pressure: QueuePressure, connected: bool) -> Self {
        let index = Arc::new(FreeIndex::new(&inventory.shapes));
        let (name, region) = (Name::from(&info.name), Name::from(&info.region));
        let prices = inventory.shapes.iter().map(|s| info.price(&s.gpu_type)).collect();
        Self {
            info: Arc::new(info),
            inventory: Arc::new(inventory),
            pressure: Arc::new(pressure),
            connected,
            index,
            name,
            region,
            prices,
            speeds: Arc::from([]),
            waiting_gpus: 0,
            labels_text: OnceLock::new(),
            node_labels_text: OnceLock::new(),
            quotes: Arc::default(),
            now_ms: 0,
            statics: StaticsId::fresh(),
        }
    }

    /// This snapshot for a new placement cycle: the same report with `pressure` and `connected`
    /// as they are now and nothing expected to wait. Shares the inventory and its index (see the
    /// type's doc), so a caller can keep one snapshot per cluster and renew only its pressure.
    pub fn renewed(&self, pressure: Arc<QueuePressure>, connected: bool) -> Self {
        Self { pressure, connected, waiting_gpus: 0, ..self.clone() }
    }

    /// This snapshot with the member's start quotes, read at `now_ms` on the gateway's clock.
    pub fn with_quotes(mut self, quotes: Arc<Quotes>, now_ms: i64) -> Self {
        self.quotes = quotes;
        self.now_ms = now_ms;
        self
    }

    /// Forgets the member's quotes for the rest of this cycle: an offer that will make it preempt
    /// changes its plan, and no later decision in the cycle may count on the same victims.
    pub fn forget_quotes(&mut self) {
        self.quotes = Arc::default();
    }

    /// The member's quotes.
    pub fn quotes(&self) -> &Quotes {
        &self.quotes
    }

    /// The member's quote for shape `key`, if it has one (see [`crate::quote_key`]).
    pub(crate) fn quote(&self, key: u64) -> Option<&Quote> {
        self.quotes.get(key)
    }

    /// Seconds from this cycle until `start_at_ms` (0 if past).
    pub(crate) fn secs_until(&self, start_at_ms: i64) -> f64 {
        (start_at_ms.saturating_sub(self.now_ms).max(0)) as f64 / 1000.0
    }

    /// Records that a job of `gpus` GPUs from the federation queue will wait for this cluster, so
    /// later decisions in the same cycle expect to queue behind it. Local queues report their own
    /// backlog; this adds the federation's, which no agent can see.
    pub fn expect_waiting(&mut self, gpus: u64) {
        self.waiting_gpus = self.waiting_gpus.saturating_add(gpus);
    }

    /// Forgets [`expect_waiting`](Self::expect_waiting) jobs (a new placement cycle decides again).
    pub fn clear_waiting(&mut self) {
        self.waiting_gpus = 0;
    }

    /// GPUs of federation-queue jobs expected to wait for this cluster in this cycle.
    pub fn waiting_gpus(&self) -> u64 {
        self.waiting_gpus
    }

    /// Identity, region, tier, backend and prices, as reported.
    pub fn info(&self) -> &ClusterInfo {
        &self.info
    }

    /// Node shapes with what is free on each node, less anything [`reserve`](Self::reserve)d.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The cluster's name, shared with the decisions that name it.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The cluster's region, shared with the decisions that name it.
    pub fn region(&self) -> &Name {
        &self.region
    }

    /// US$ per GPU-hour of the GPU type of shape `shape`.
    pub(crate) fn price(&self, shape: usize) -> f64 {
        self.prices.get(shape).copied().unwrap_or(0.0)
    }

    /// Relative throughput of the GPU type of shape `shape` (1 when not known).
    pub(crate) fn speed(&self, shape: usize) -> f64 {
        self.known_speed(shape).unwrap_or(1.0)
    }

    /// Relative throughput of the GPU type of shape `shape`, if the speed table lists it: only
    /// then may it share a span with another type (`options.rs`).
    pub(crate) fn known_speed(&self, shape: usize) -> Option<f64> {
        self.speeds.get(shape).copied().filter(|v| *v > 0.0)
    }

    /// Sets each GPU type's relative throughput from `table` (type → speed; a type it does not
    /// list, and a speed that is not a positive number, count as 1 and are not known).
    pub fn set_gpu_speed(&mut self, table: &BTreeMap<String, f64>) {
        self.statics = StaticsId::fresh();
        self.speeds = self
            .inventory
            .shapes
            .iter()
            .map(|s| table.get(&s.gpu_type).copied().filter(|v| v.is_finite() && *v > 0.0).unwrap_or(0.0))
            .collect::<Vec<_>>()
            .into();
    }

    /// Every label a cluster selector sees here, implicit ones included (`gpu-fabric=ib,
    /// meridian.io/cluster=east, ...`), for rejections.
    pub(crate) fn labels_text(&self) -> Name {
        self.labels_text
            .get_or_init(|| {
                let labels = self.info.selectable_labels();
                Name::from(labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "))
            })
            .clone()
    }

    /// Each node shape with its labels (`dgx-h100: gpu-fabric=roce; l4-box: none`), for
    /// rejections.
    pub(crate) fn node_labels_text(&self) -> Name {
        self.node_labels_text
            .get_or_init(|| {
                let mut text = String::new();
                for (i, shape) in self.inventory.shapes.iter().enumerate() {
                    let separator = if i == 0 { "" } else { "; " };
                    let _ = write!(text, "{separator}{}: ", shape.name);
                    if shape.labels.is_empty() {
                        text.push_str("none");
                    }
                    for (j, (key, value)) in shape.labels.iter().enumerate() {
                        let _ = write!(text, "{}{key}={value}", if j == 0 { "" } else { "," });
                    }
                }
                Name::from(text)
            })
            .clone()
    }

    /// What names this snapshot's statics (see [`crate::statics`]).
    pub(crate) fn statics_id(&self) -> StaticsId {
        self.statics
    }

    /// The free-GPU index of the inventory.
    pub(crate) fn index(&self) -> &FreeIndex {
        &self.index
    }

    /// Takes `used` off node `node` of shape `shape` (off what it has free, clamped to the
    /// shape), keeping the index in step. [`reserve`](Self::reserve) calls this for each node of
    /// the gang's plan; the inventory and index are copied only the first time in a cycle.
    pub(crate) fn take(&mut self, shape: usize, node: usize, used: &NodeFree) {
        let inventory = Arc::make_mut(&mut self.inventory);
        let Some(nodes) = inventory.shapes.get_mut(shape) else { return };
        let Some(reported) = nodes.free.get(node).copied() else { return };
        let before = clamp(&reported, nodes);
        if let Some(free) = nodes.free.get_mut(node) {
            *free = NodeFree {
                gpus: before.gpus.saturating_sub(used.gpus),
                cpu: before.cpu.saturating_sub(used.cpu),
                memory_gib: before.memory_gib.saturating_sub(used.memory_gib),
            };
        }
        Arc::make_mut(&mut self.index).moved(&inventory.shapes, shape, node, &reported);
    }
}

impl FederationSnapshot {
    /// A snapshot of `clusters` with the given network table.
    pub fn new(clusters: Vec<ClusterSnapshot>, network: NetworkTable) -> Self {
        Self { clusters, network: Arc::new(network), statics: Arc::default() }
    }

    /// A snapshot of `clusters` with a network table shared between snapshots.
    pub fn shared(clusters: Vec<ClusterSnapshot>, network: Arc<NetworkTable>) -> Self {
        Self { clusters, network, statics: Arc::default() }
    }

    /// This snapshot keeping its static verdicts in `statics`: a caller that builds a snapshot
    /// per placement cycle passes the same cache each time, so verdicts outlive the cycle (each
    /// is checked against its cluster before use).
    pub fn with_statics(self, statics: Arc<StaticCache>) -> Self {
        Self { statics, ..self }
    }

    /// Sets every cluster's GPU speeds ([`ClusterSnapshot::set_gpu_speed`]); an empty table
    /// changes nothing.
    pub fn set_gpu_speed(&mut self, table: &BTreeMap<String, f64>) {
        if table.is_empty() {
            return;
        }
        for cluster in &mut self.clusters {
            cluster.set_gpu_speed(table);
        }
    }

    /// The cluster named `name`.
    pub fn cluster(&self, name: &str) -> Option<&ClusterSnapshot> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// The cluster named `name`, to [`reserve`](ClusterSnapshot::reserve) on it.
    pub fn cluster_mut(&mut self, name: &str) -> Option<&mut ClusterSnapshot> {
        self.clusters.iter_mut().find(|c| c.name == name)
    }
}
