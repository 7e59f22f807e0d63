//! Nodes and pods → [`Inventory`]: GPUs from `nvidia.com/gpu` (and MIG `nvidia.com/mig-*`)
//! allocatable, the GPU model from NVIDIA GPU feature discovery labels, minus what bound,
//! non-terminal pods request. Unschedulable or NotReady nodes have nothing free.
//!
//! Each node's GPU kinds (its full GPUs, each MIG profile) are read once as [`GpuSlot`]s; nodes are
//! grouped into shapes by (GPU type, GPUs, CPU, memory). The labels every node of a shape shares
//! are kept by [`Scan::shape_labels`], ready for `NodeShape` to carry them. Start quotes plan
//! over the same slots node by node (`quote.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{Inventory, NodeFree, NodeShape};

use crate::backend::BackendError;

/// The full-GPU extended resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// GPU feature discovery: the GPU model (`NVIDIA-A100-SXM4-80GB`).
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// GPU feature discovery: memory per GPU in MiB.
pub const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// GPU feature discovery: GPUs on the node.
pub const COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// Prefix of MIG extended resources (`nvidia.com/mig-1g.10gb`).
pub const MIG_PREFIX: &str = "nvidia.com/mig-";

/// Maps a GPU product label to a Meridian GPU type: `kubernetes.gpuTypes` first, then the
/// model name found among the label's `-`-separated words.
#[derive(Debug, Clone, Default)]
pub struct GpuTypeMapper {
    overrides: BTreeMap<String, String>,
}

/// What one look at the cluster's nodes found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Node shapes with what is free.
    pub inventory: Inventory,
    /// Labels every node of a shape carries, by shape name.
    pub shape_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Product labels seen, by the GPU type they map to (for node selectors).
    pub products: BTreeMap<String, Vec<String>>,
}

/// One GPU kind of one node: its full GPUs, or one MIG profile. Inventory groups these into
/// shapes; a start quote plans over them one by one.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSlot {
    /// The node's name.
    pub node: String,
    /// The node's GPU product label.
    pub product: String,
    /// The Meridian GPU type (`a100-80g`, or a MIG type `a100-80g.1g.10gb`).
    pub gpu_type: String,
    /// Memory per GPU (or per MIG slice) in GiB.
    pub gpu_memory_gib: u32,
    /// The extended resource pods ask for (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
    pub resource: String,
    /// What the node can hold: GPUs of this kind, and the node's CPU and memory.
    pub allocatable: Amounts,
    /// What bound, unfinished pods leave of it (counted whether or not the node is usable).
    pub free: Amounts,
    /// Ready and schedulable: new pods may land on it.
    pub usable: bool,
    /// All the node's labels.
    pub labels: BTreeMap<String, String>,
}

/// GPUs of one kind, CPU and memory of one node, unrounded as the API's quantities give them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Amounts {
    /// GPUs (or MIG slices).
    pub gpus: f64,
    /// CPU cores.
    pub cpu: f64,
    /// Memory in GiB.
    pub memory_gib: f64,
}

impl GpuTypeMapper {
    /// A mapper with `overrides` (product label → GPU type).
    pub fn new(overrides: BTreeMap<String, String>) -> Self {
        Self { overrides }
    }

    /// The GPU type of a product label; `memory_mib` (the memory label) splits A100 40/80 GB.
    pub fn gpu_type(&self, product: &str, memory_mib: Option<u64>) -> Result<String, BackendError> {
        if let Some(gpu_type) = self.overrides.get(product) {
            return Ok(gpu_type.clone());
        }
        let lower = product.to_ascii_lowercase();
        let words: Vec<&str> = lower.split(['-', '_', ' ']).collect();
        let has = |w: &str| words.contains(&w);
        let known = ["gh200", "b200", "h200", "h100", "l40s", "l4", "a10g", "v100", "t4", "mi300x", "mi250x"];
        if let Some(name) = known.iter().find(|name| has(name)) {
            return Ok((*name).to_string());
        }
        if has("a100") {
            let big = has("80gb") || memory_mib.is_some_and(|mib| mib >= 60 * 1024);
            return Ok(if big { "a100-80g" } else { "a100-40g" }.into());
        }
        Err(BackendError::permanent(format!(
            "node GPU product `{product}` (label {PRODUCT_LABEL}) maps to no Meridian GPU type; \
             add it to kubernetes.gpuTypes, e.g. `{product}: h100`"
        )))
    }
}

impl Amounts {
    /// What `requests` (resource name → amount, as [`pod_requests`] gives) hold of a node whose
    /// GPUs of this kind are `gpu_resource`.
    pub fn of_requests(requests: &BTreeMap<String, f64>, gpu_resource: &str) -> Self {
        let amount = |name: &str| requests.get(name).copied().unwrap_or(0.0);
        Self { gpus: amount(gpu_resource), cpu: amount("cpu"), memory_gib: amount("memory") / GIB }
    }

    /// Rounded down to what whole replicas can use, as the inventory reports it.
    pub fn whole(&self) -> NodeFree {
        NodeFree { gpus: whole(self.gpus), cpu: whole(self.cpu), memory_gib: whole(self.memory_gib) }
    }
}

impl std::ops::Add for Amounts {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self { gpus: self.gpus + other.gpus, cpu: self.cpu + other.cpu, memory_gib: self.memory_gib + other.memory_gib }
    }
}

impl std::ops::Sub for Amounts {
    type Output = Self;

    fn sub(self, other: Self) -> Self {
        Self { gpus: self.gpus - other.gpus, cpu: self.cpu - other.cpu, memory_gib: self.memory_gib - other.memory_gib }
    }
}

/// Reads a Kubernetes quantity (`96`, `500m`, `512Gi`, `1e3`, `64G`) as a number of base units.
pub fn quantity(q: &Quantity) -> f64 {
    let text = q.0.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        _ => return 0.0,
    };
    number.parse::<f64>().map_or(0.0, |n| n * factor)
}

/// Bytes in a GiB.
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn whole(value: f64) -> u32 {
    value.floor().clamp(0.0, f64::from(u32::MAX)) as u32
}

/// What one pod requests, by resource name (containers summed; an init container counts when
/// it asks for more). Extended resources given only as limits count as requests.
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::<String, f64>::new();
    let Some(spec) = &pod.spec else { return total };
    let container_requests = |c: &k8s_openapi::api::core::v1::Container| {
        let mut wants = BTreeMap::<String, f64>::new();
        if let Some(resources) = &c.resources {
            for (name, q) in resources.limits.iter().flatten() {
                wants.insert(name.clone(), quantity(q));
            }
            for (name, q) in resources.requests.iter().flatten() {
                wants.insert(name.clone(), quantity(q));
            }
        }
        wants
    };
    for container in &spec.containers {
        for (name, amount) in container_requests(container) {
            *total.entry(name).or_default() += amount;
        }
    }
    for init in spec.init_containers.iter().flatten() {
        for (name, amount) in container_requests(init) {
            let entry = total.entry(name).or_default();
            *entry = entry.max(amount);
        }
    }
    total
}

/// Whether a pod holds node resources: bound to a node and not finished.
pub fn pod_holds_resources(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    bound && phase != "Succeeded" && phase != "Failed"
}

/// The memory of a MIG profile (`1g.10gb` → 10).
fn mig_memory_gib(profile: &str) -> Option<u32> {
    profile.split('.').nth(1)?.strip_suffix("gb")?.parse().ok()
}

/// What bound, unfinished `pods` request, by node, then resource name.
fn used_by_node(pods: &[Pod]) -> BTreeMap<&str, BTreeMap<String, f64>> {
    let mut used = BTreeMap::<&str, BTreeMap<String, f64>>::new();
    for pod in pods.iter().filter(|p| pod_holds_resources(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let per_node = used.entry(node).or_default();
        for (name, amount) in pod_requests(pod) {
            *per_node.entry(name).or_default() += amount;
        }
    }
    used
}

/// The GPU kinds of the GPU nodes among `nodes` (by node name, full GPUs before MIG profiles),
/// with what `pods` hold taken off. A node with GPUs but no product label, or a product that maps
/// to no GPU type, is an error naming it.
pub fn gpu_slots(nodes: &[Node], pods: &[Pod], mapper: &GpuTypeMapper) -> Result<Vec<GpuSlot>, BackendError> {
    let catalog = GpuCatalog::default();
    let used = used_by_node(pods);
    let empty_labels = BTreeMap::new();
    let mut slots = Vec::new();
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for node in sorted {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty_labels);
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let amount = |resource: &str| allocatable.and_then(|a| a.get(resource)).map_or(0.0, quantity);
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let schedulable = !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        let mig: Vec<(String, f64)> = allocatable
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with(MIG_PREFIX))
            .map(|(k, q)| (k.clone(), quantity(q)))
            .filter(|(_, n)| *n >= 1.0)
            .collect();
        let full_gpus = whole(amount(GPU_RESOURCE));
        if full_gpus == 0 && mig.is_empty() {
            continue;
        }
        let Some(product) = labels.get(PRODUCT_LABEL) else {
            return Err(BackendError::permanent(format!(
                "node `{name}` has GPUs but no {PRODUCT_LABEL} label; is NVIDIA GPU feature discovery running?"
            )));
        };
        let memory_mib = labels.get(MEMORY_LABEL).and_then(|m| m.parse::<u64>().ok());
        let base = mapper.gpu_type(product, memory_mib)?;
        let base_memory = memory_mib
            .map(|mib| u32::try_from(mib / 1024).unwrap_or(u32::MAX))
            .or_else(|| catalog.memory_gib(&base))
            .unwrap_or(0);
        let node_used = used.get(name);
        let usable = ready && schedulable;
        let mut add = |gpu_type: String, gpu_memory_gib: u32, resource: String, gpus: u32| {
            let allocatable = Amounts { gpus: f64::from(gpus), cpu: amount("cpu"), memory_gib: amount("memory") / GIB };
            let held = node_used.map(|u| Amounts::of_requests(u, &resource)).unwrap_or_default();
            slots.push(GpuSlot {
                node: name.to_owned(),
                product: product.clone(),
                gpu_type,
                gpu_memory_gib,
                resource,
                allocatable,
                free: allocatable - held,
                usable,
                labels: labels.clone(),
            });
        };
        if full_gpus > 0 {
            add(base.clone(), base_memory, GPU_RESOURCE.into(), full_gpus);
        }
        for (resource, count) in &mig {
            let profile = &resource[MIG_PREFIX.len()..];
            let memory = mig_memory_gib(profile).unwrap_or(0);
            add(format!("{base}.{profile}"), memory, resource.clone(), whole(*count));
        }
    }
    Ok(slots)
}

/// The labels of a node that its shape keeps: all but those that name one node (its hostname),
/// which would split every node into a shape of its own. A `placement.nodeSelector` is matched
/// against these.
pub fn without_per_node_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.iter().filter(|(k, _)| !is_per_node_label(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Builds the inventory of the GPU nodes among `nodes`, with what `pods` hold taken off.
pub fn scan(nodes: &[Node], pods: &[Pod], mapper: &GpuTypeMapper) -> Result<Scan, BackendError> {
    let slots = gpu_slots(nodes, pods, mapper)?;
    let mut scan = Scan::default();
    let mut products = BTreeMap::<String, Vec<String>>::new();
    let mut shapes: BTreeMap<ShapeKey, NodeShape> = BTreeMap::new();
    let mut labels_by_shape: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for slot in &slots {
        products.entry(slot.gpu_type.clone()).or_default().push(slot.product.clone());
        let size = slot.allocatable.whole();
        let free = if slot.usable { slot.free.whole() } else { NodeFree::default() };
        // Labels that name one node would split every node into a shape of its own; the rest
        // are part of the shape, so a nodeSelector matches whole shapes exactly.
        let shared_labels = without_per_node_labels(&slot.labels);
        let key = (slot.gpu_type.clone(), size.gpus, size.cpu, size.memory_gib, shared_labels.clone());
        let base = format!("{}x{}-{}c-{}g", slot.gpu_type, size.gpus, size.cpu, size.memory_gib);
        let same_base = shapes.keys().filter(|k| (&k.0, k.1, k.2, k.3) == (&key.0, key.1, key.2, key.3)).count();
        let name = if shapes.contains_key(&key) || same_base == 0 { base } else { format!("{base}-{}", same_base + 1) };
        let shape = shapes.entry(key).or_insert_with(|| NodeShape {
            name: name.clone(),
            gpu_type: slot.gpu_type.clone(),
            gpu_memory_gib: slot.gpu_memory_gib,
            gpus_per_node: size.gpus,
            cpu_per_node: size.cpu,
            memory_gib_per_node: size.memory_gib,
            free: Vec::new(),
            labels: shared_labels,
        });
        let name = shape.name.clone();
        shape.free.push(free);
        match labels_by_shape.get_mut(&name) {
            Some(common) => common.retain(|k, v| slot.labels.get(k) == Some(v)),
            None => {
                labels_by_shape.insert(name, slot.labels.clone());
            }
        }
    }
    for list in products.values_mut() {
        list.sort();
        list.dedup();
    }
    scan.inventory.shapes = shapes.into_values().collect();
    scan.shape_labels = labels_by_shape;
    scan.products = products;
    Ok(scan)
}

/// Shapes group nodes by GPU type, GPUs, CPU, memory and the labels they share.
type ShapeKey = (String, u32, u32, u32, BTreeMap<String, String>);

/// Labels that differ on every node by design (its hostname), left out of a shape's labels.
fn is_per_node_label(key: &str) -> bool {
    key == "kubernetes.io/hostname" || key.ends_with("/hostname")
}
