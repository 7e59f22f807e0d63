//! Which clusters may run a job at all, and why the others may not.
//!
//! The checks here depend only on the job and on what a cluster *is* (shapes, region, backend,
//! tier, prices, labels), never on what is free now, so the same code answers both "can it go there now"
//! (with [`Rejection::Disconnected`] and [`Rejection::BurstNotYet`] added by the caller) and
//! "could it ever go anywhere" at submit time.

use std::cell::OnceCell;
use std::fmt;

use meridian_proto::inventory::{BackendKind, NodeShape, Tier};
use meridian_proto::selector::Selector;
use meridian_proto::spec::{BurstPolicy, JobSpec};
use serde::{Deserialize, Serialize};

use super::decision::{Reasons, Secs};
use super::fit::{Demand, TypeOption, TypeOptions};
use super::name::{Name, Names};
use super::snapshot::ClusterSnapshot;

/// Why one cluster cannot take a job. Built as data while placing (no text is formatted on the hot
/// path); [`Display`](fmt::Display) turns it into a sentence for people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Rejection {
    /// The cluster's agent is not connected, so nothing can be offered to it.
    Disconnected,
    /// None of the cluster's GPU types is among the job's `gpuTypes` (which the spec shows; not
    /// copied here because this is the most common rejection and copies cost on the hot path).
    GpuTypeUnavailable {
        /// GPU types the cluster has.
        available: Names,
    },
    /// The acceptable GPUs have less memory than the job needs.
    GpuMemoryTooSmall {
        /// Minimum memory per GPU the job asks for, GiB.
        wanted_gib: u32,
        /// Most memory of any acceptable GPU here, GiB.
        largest_gib: u32,
    },
    /// Even with every node empty, the cluster's nodes cannot hold all replicas (each replica must
    /// fit on one node; capacity is counted per node, not summed over the cluster).
    GangNeverFits {
        /// Replicas in the gang.
        replicas: u32,
        /// GPUs per replica.
        gpus_per_replica: u32,
        /// Most replicas the cluster could hold at once on one GPU type, all nodes empty.
        max_replicas: u64,
        /// GPUs of the largest acceptable node.
        largest_node_gpus: u32,
    },
    /// Residency: the job may only run in other regions.
    RegionNotAllowed {
        /// The cluster's region.
        region: Name,
        /// Regions the job allows.
        allowed: Names,
    },
    /// The job's `placement.clusterSelector` does not match the cluster's labels (its configured
    /// labels plus the implicit `meridian.io/*` ones).
    ClusterSelectorUnmatched {
        /// The job's cluster selector, in canonical form.
        selector: Name,
        /// The cluster's labels as the selector sees them (`k=v,k=v`).
        labels: Name,
    },
    /// No node of a GPU type the job accepts has labels matching the job's
    /// `placement.nodeSelector`, so no replica could ever be placed here.
    NodeSelectorUnmatched {
        /// The job's node selector, in canonical form.
        selector: Name,
        /// The node shapes' labels (`dgx-h100: gpu-fabric=roce; l4-box: none`).
        node_labels: Name,
    },
    /// The job's `placement.clusters.exclude` names this cluster.
    ClusterExcluded,
    /// The job's `placement.clusters.include` does not name this cluster.
    ClusterNotIncluded,
    /// The cluster's backend cannot run this kind of payload.
    PayloadUnsupported {
        /// What the payload needs.
        needs: PayloadKind,
        /// The cluster's backend.
        backend: BackendKind,
    },
    /// The cluster's free GPUs are held for an older gang that is expected to start there first,
    /// and this job would still be running then (see [`crate::Holds`]).
    HeldForOlderGang {
        /// Seconds until the holding gang is expected to start.
        in_secs: f64,
    },
    /// A cloud (burst) cluster, and the job says `burst: never`.
    BurstNever,
    /// A cloud (burst) cluster, and owned clusters are expected to start the job soon enough.
    BurstNotYet {
        /// Best expected wait on an owned cluster, seconds.
        owned_wait_secs: f64,
        /// How long the job has already waited in the federation queue, seconds.
        #[serde(default)]
        waited_secs: f64,
        /// The job's `burst.after`, seconds.
        after_secs: u64,
    },
    /// A cloud (burst) cluster whose GPUs would cost more per hour than the job's burst budget.
    OverBudget {
        /// What the whole gang would cost here per hour, US$ (cheapest acceptable GPU type).
        usd_per_hour: f64,
        /// The job's `burst.maxUsdPerHour`.
        max_usd_per_hour: f64,
    },
}

/// What a payload needs from a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PayloadKind {
    /// It has a container image.
    ContainerImage,
    /// It has only a command, run on the bare node.
    BareCommand,
}

/// What placement derives from a job once per decision, so per-cluster work is arithmetic.
#[derive(Debug, Clone)]
pub(crate) struct Need<'a> {
    pub(crate) job: &'a JobSpec,
    pub(crate) demand: Demand,
    pub(crate) total_gpus: u64,
    pub(crate) payload: PayloadKind,
    /// The job's `placement.regions`, shared by every cluster rejected for residency; None when
    /// the job may run anywhere.
    pub(crate) allowed_regions: Option<Names>,
    /// The job's `placement.clusterSelector`, None when it matches every cluster. Parsed when the
    /// spec was read, so matching is lookups only.
    pub(crate) cluster_selector: Option<&'a Selector>,
    /// The job's `placement.nodeSelector`, None when it matches every node.
    pub(crate) node_selector: Option<&'a Selector>,
    /// The selectors' text for rejections, made at the first rejection that needs it and then
    /// shared by every cluster the selector rejects.
    selector_text: [OnceCell<Name>; 2],
}

impl<'a> Need<'a> {
    pub(crate) fn of(job: &'a JobSpec) -> Self {
        let demand = Demand::of(job);
        let payload = if job.payload.image.is_some() { PayloadKind::ContainerImage } else { PayloadKind::BareCommand };
        let regions = &job.placement.regions;
        let allowed_regions = (!regions.is_empty()).then(|| Names::from(regions.as_slice()));
        let selector = |s: &'a Selector| (!s.is_everything()).then_some(s);
        Self {
            job,
            demand,
            total_gpus: u64::from(demand.replicas) * u64::from(demand.gpus),
            payload,
            allowed_regions,
            cluster_selector: selector(job.placement.cluster_selector()),
            node_selector: selector(job.placement.node_selector()),
            selector_text: Default::default(),
        }
    }

    /// Whether the job's nodeSelector accepts the nodes of `shape`.
    pub(crate) fn selects(&self, shape: &NodeShape) -> bool {
        self.node_selector.is_none_or(|selector| selector.matches(&shape.labels))
    }

    fn cluster_selector_text(&self) -> Name {
        let selector = self.job.placement.cluster_selector();
        self.selector_text[0].get_or_init(|| Name::from(selector.to_string())).clone()
    }

    fn node_selector_text(&self) -> Name {
        let selector = self.job.placement.node_selector();
        self.selector_text[1].get_or_init(|| Name::from(selector.to_string())).clone()
    }
}

/// Checks everything about `cluster` that does not change with load, pushing each reason it may
/// not run the job onto `reasons`. Returns the GPU types the gang may use, cheapest first;
/// meaningful only when no reason was pushed.
pub(crate) fn static_rejections(need: &Need<'_>, cluster: &ClusterSnapshot, reasons: &mut Reasons) -> TypeOptions {
    let job = need.job;
    let demand = &need.demand;
    let info = cluster.info();
    let shapes = &cluster.inventory().shapes;
    let cloud = info.tier == Tier::Cloud;
    let budget = match job.placement.burst {
        BurstPolicy::After { max_usd_per_hour: Some(max), .. } if cloud => Some(max),
        _ => None,
    };
    let wanted = &job.gang.resources.gpu_types;

    let (mut any_type, mut any_selected, mut any_memory) = (false, false, false);
    let (mut largest_gib, mut largest_node_gpus, mut max_replicas) = (0u32, 0u32, 0u64);
    let mut cheapest_over_budget = f64::INFINITY;
    let mut options = TypeOptions::default();
    let index = cluster.index();
    for (type_id, first) in shapes.iter().enumerate() {
        // Visit each GPU type once, at its first shape (whose index is the type's id).
        if index.type_id(type_id) != type_id || !accepts_type(wanted, &first.gpu_type, index.is_slice(type_id)) {
            continue;
        }
        any_type = true;
        let mut capacity = 0u64;
        let same_type = |(offset, _): &(usize, &NodeShape)| index.type_id(type_id + offset) == type_id;
        for (_, shape) in shapes[type_id..].iter().enumerate().filter(same_type) {
            // Nodes the nodeSelector rules out count for nothing here.
            if !need.selects(shape) {
                continue;
            }
            any_selected = true;
            largest_gib = largest_gib.max(shape.gpu_memory_gib);
            if shape.gpu_memory_gib < demand.min_gpu_memory_gib {
                continue;
            }
            any_memory = true;
            largest_node_gpus = largest_node_gpus.max(shape.gpus_per_node);
            let per_node = u64::from(demand.per_empty_node(shape));
            capacity = capacity.saturating_add(per_node.saturating_mul(u64::from(shape.node_count())));
        }
        max_replicas = max_replicas.max(capacity);
        if capacity < u64::from(demand.replicas) {
            continue;
        }
        let price = cluster.price(type_id);
        if let Some(max) = budget {
            let hourly = need.total_gpus as f64 * price;
            if hourly > max {
                cheapest_over_budget = cheapest_over_budget.min(hourly);
                continue;
            }
        }
        // Options compete on the price of work: a type twice as fast does an hour's work in half
        // an hour.
        options.insert(TypeOption { type_id, price: price / cluster.speed(type_id) }, shapes);
    }

    if !any_type {
        reasons.push(Rejection::GpuTypeUnavailable { available: index.gpu_types().clone() });
    } else if !any_selected {
        reasons.push(Rejection::NodeSelectorUnmatched {
            selector: need.node_selector_text(),
            node_labels: cluster.node_labels_text(),
        });
    } else if !any_memory {
        reasons.push(Rejection::GpuMemoryTooSmall { wanted_gib: demand.min_gpu_memory_gib, largest_gib });
    } else if max_replicas < u64::from(demand.replicas) {
        reasons.push(Rejection::GangNeverFits {
            replicas: demand.replicas,
            gpus_per_replica: demand.gpus,
            max_replicas,
            largest_node_gpus,
        });
    } else if options.is_empty()
        && let Some(max) = budget
    {
        reasons.push(Rejection::OverBudget { usd_per_hour: cheapest_over_budget, max_usd_per_hour: max });
    }

    let rules = &job.placement;
    if let Some(allowed) = &need.allowed_regions
        && !rules.regions.contains(&info.region)
    {
        reasons.push(Rejection::RegionNotAllowed { region: cluster.region().clone(), allowed: allowed.clone() });
    }
    if let Some(selector) = need.cluster_selector
        && !selector.matches_by(|key| info.label(key))
    {
        reasons.push(Rejection::ClusterSelectorUnmatched {
            selector: need.cluster_selector_text(),
            labels: cluster.labels_text(),
        });
    }
    if !rules.clusters.include.is_empty() && !rules.clusters.include.contains(&info.name) {
        reasons.push(Rejection::ClusterNotIncluded);
    }
    if rules.clusters.exclude.contains(&info.name) {
        reasons.push(Rejection::ClusterExcluded);
    }
    let payload_ok = match need.payload {
        PayloadKind::ContainerImage => info.supports_containers,
        PayloadKind::BareCommand => info.supports_bare_commands,
    };
    if !payload_ok {
        reasons.push(Rejection::PayloadUnsupported { needs: need.payload, backend: info.backend });
    }
    if cloud && rules.burst == BurstPolicy::Never {
        reasons.push(Rejection::BurstNever);
    }
    options
}

/// Whether a job listing `wanted` GPU types may use `gpu_type` (`slice`: whether it is a slice
/// type). A job that lists none takes any whole GPU but never a slice (`a100-80g.1g.10gb`):
/// slices go only to jobs that name them.
fn accepts_type(wanted: &[String], gpu_type: &str, slice: bool) -> bool {
    if wanted.is_empty() { !slice } else { wanted.iter().any(|t| t == gpu_type) }
}

/// The GPU types the job may use on `cluster`, or None when the cluster may never run it.
pub(crate) fn eligible_options(need: &Need<'_>, cluster: &ClusterSnapshot) -> Option<TypeOptions> {
    let mut reasons = Reasons::default();
    let options = static_rejections(need, cluster, &mut reasons);
    reasons.is_empty().then_some(options)
}

/// Comma-separated list for messages.
struct List<'a>(&'a [Name]);

impl fmt::Display for List<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(item)?;
        }
        Ok(())
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::HeldForOlderGang { in_secs } => write!(
                f,
                "free GPUs here are held for an older gang expected to start in {}, and this job would still be \
                 running then",
                Secs(*in_secs)
            ),
            Rejection::Disconnected => {
                f.write_str("the cluster's agent is disconnected, so no job can be offered to it")
            }
            Rejection::GpuTypeUnavailable { available } if available.is_empty() => {
                f.write_str("the cluster reports no GPUs")
            }
            Rejection::GpuTypeUnavailable { available } => {
                write!(
                    f,
                    "the cluster only has GPU types {}, none of which the job's gpuTypes accepts",
                    List(available)
                )
            }
            Rejection::GpuMemoryTooSmall { wanted_gib, largest_gib } => write!(
                f,
                "the job needs {wanted_gib} GiB per GPU but the acceptable GPUs here have at most {largest_gib} GiB"
            ),
            Rejection::GangNeverFits { replicas, gpus_per_replica, max_replicas, largest_node_gpus } => write!(
                f,
                "the gang needs {replicas} replicas of {gpus_per_replica} GPUs, each on a single node, but even with \
                 every node empty this cluster holds at most {max_replicas} (largest node: {largest_node_gpus} GPUs)"
            ),
            Rejection::RegionNotAllowed { region, allowed } => {
                write!(f, "the cluster is in {region} but the job may only run in {}", List(allowed))
            }
            Rejection::ClusterSelectorUnmatched { selector, labels } => {
                write!(f, "clusterSelector {selector} does not match the cluster's labels ({labels})")
            }
            Rejection::NodeSelectorUnmatched { selector, node_labels } => write!(
                f,
                "no node with an acceptable GPU type matches nodeSelector {selector} (node labels here: {node_labels})"
            ),
            Rejection::ClusterExcluded => f.write_str("the job's placement.clusters.exclude lists this cluster"),
            Rejection::ClusterNotIncluded => {
                f.write_str("the job's placement.clusters.include does not list this cluster")
            }
            Rejection::PayloadUnsupported { needs: PayloadKind::ContainerImage, backend } => {
                write!(f, "the job has a container image but this {backend:?} backend does not run containers")
            }
            Rejection::PayloadUnsupported { needs: PayloadKind::BareCommand, backend } => write!(
                f,
                "the job has a command without an image but this {backend:?} backend does not run bare commands"
            ),
            Rejection::BurstNever => f.write_str("the cluster is cloud (burst) capacity and the job says burst: never"),
            Rejection::BurstNotYet { owned_wait_secs, waited_secs, after_secs } => write!(
                f,
                "cloud (burst) capacity is used only when owned clusters would make the job wait more than {} in all; \
                 it has waited {} and the best owned cluster is expected to start it in {}",
                Secs(*after_secs as f64),
                Secs(*waited_secs),
                Secs(*owned_wait_secs)
            ),
            Rejection::OverBudget { usd_per_hour, max_usd_per_hour } => write!(
                f,
                "the gang would cost ${usd_per_hour:.2}/h here, over the job's burst budget of ${max_usd_per_hour:.2}/h"
            ),
        }
    }
}
