//! Why a cluster may not take a job: one [`Rejection`] per reason, the [`Reasons`] of one cluster,
//! and the sentences people read. Shared by the stages that reject (filter, burst gate, holds) and
//! the decision summary that names a reason.

use std::fmt;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::BackendKind;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::name::{Name, Names};
use crate::need::PayloadKind;

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
    /// The cluster's free GPUs are held for a long-waiting gang (first by priority, then age) that
    /// is expected to start there first, and this job would still be running then (see
    /// [`crate::Holds`]). The metric label keeps its first name, `held_for_older_gang`.
    HeldForOlderGang {
        /// Seconds until the holding gang is expected to start.
        in_secs: f64,
    },
    /// A cloud (burst) cluster, and the job says `burst: never`.
    BurstNever,
    /// A cloud (burst) cluster, and owned clusters are expected to start the job soon enough.
    BurstNotYet {
        /// Best expected start on an owned cluster, seconds: the queue wait or the data copy,
        /// whichever is longer (the field keeps its old name for stored decisions).
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

impl Rejection {
    /// The reason's kind as one snake-case word (`gpu_type_unavailable`), without its numbers:
    /// the metrics' `reason` label, and how a compacted decision counts the rejections it no
    /// longer lists.
    pub fn kind(&self) -> &'static str {
        match self {
            Rejection::Disconnected => "disconnected",
            Rejection::GpuTypeUnavailable { .. } => "gpu_type_unavailable",
            Rejection::GpuMemoryTooSmall { .. } => "gpu_memory_too_small",
            Rejection::GangNeverFits { .. } => "gang_never_fits",
            Rejection::RegionNotAllowed { .. } => "region_not_allowed",
            Rejection::ClusterSelectorUnmatched { .. } => "cluster_selector_unmatched",
            Rejection::NodeSelectorUnmatched { .. } => "node_selector_unmatched",
            Rejection::ClusterExcluded => "cluster_excluded",
            Rejection::ClusterNotIncluded => "cluster_not_included",
            Rejection::PayloadUnsupported { .. } => "payload_unsupported",
            Rejection::HeldForOlderGang { .. } => "held_for_older_gang",
            Rejection::BurstNever => "burst_never",
            Rejection::BurstNotYet { .. } => "burst_not_yet",
            Rejection::OverBudget { .. } => "over_budget",
        }
    }
}

/// Every reason one cluster was rejected, in the order found. Reads like a slice and serializes
/// as a JSON array. Most rejected clusters have exactly one reason, which is kept inline: a
/// decision rejects dozens of clusters and a `Vec` each was one allocation apiece.
#[derive(Clone, Default)]
pub struct Reasons(ReasonsRepr);

#[derive(Clone)]
enum ReasonsRepr {
    One(Rejection),
    Many(Vec<Rejection>),
}

/// Seconds shown the human way (`1h5m`), for messages.
pub(crate) struct Secs(pub(crate) f64);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_finite() {
            return f.write_str("never");
        }
        // Seconds are enough precision for a person; the cast saturates on huge values.
        let whole = self.0.max(0.0).round() as u64;
        write!(f, "{}", HumanDuration::from_secs(whole))
    }
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
                "free GPUs here are held for a long-waiting gang expected to start in {}, and this job would \
                 still be running then",
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
                 it has waited {} and the best owned cluster is expected to start it in {} (queue wait or data copy)",
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

impl Default for ReasonsRepr {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl Reasons {
    /// Adds a reason.
    pub fn push(&mut self, reason: Rejection) {
        match &mut self.0 {
            ReasonsRepr::Many(list) if !list.is_empty() => list.push(reason),
            ReasonsRepr::Many(_) => self.0 = ReasonsRepr::One(reason),
            ReasonsRepr::One(_) => {
                if let ReasonsRepr::One(first) = std::mem::take(&mut self.0) {
                    self.0 = ReasonsRepr::Many(vec![first, reason]);
                }
            }
        }
    }

    /// Adds each of `more`, in order.
    pub fn extend(&mut self, more: &[Rejection]) {
        for reason in more {
            self.push(reason.clone());
        }
    }

    /// Replaces the first reason equal to `old` with `new`.
    pub fn replace(&mut self, old: &Rejection, new: Rejection) {
        match &mut self.0 {
            ReasonsRepr::One(reason) if reason == old => *reason = new,
            ReasonsRepr::Many(list) => {
                if let Some(reason) = list.iter_mut().find(|r| *r == old) {
                    *reason = new;
                }
            }
            ReasonsRepr::One(_) => {}
        }
    }

    /// The reasons as a `Vec`.
    pub fn into_vec(self) -> Vec<Rejection> {
        match self.0 {
            ReasonsRepr::One(reason) => vec![reason],
            ReasonsRepr::Many(list) => list,
        }
    }
}

impl std::ops::Deref for Reasons {
    type Target = [Rejection];

    fn deref(&self) -> &[Rejection] {
        match &self.0 {
            ReasonsRepr::One(reason) => std::slice::from_ref(reason),
            ReasonsRepr::Many(list) => list,
        }
    }
}

impl From<Rejection> for Reasons {
    fn from(reason: Rejection) -> Self {
        Self(ReasonsRepr::One(reason))
    }
}

impl From<Vec<Rejection>> for Reasons {
    fn from(list: Vec<Rejection>) -> Self {
        Self(ReasonsRepr::Many(list))
    }
}

impl PartialEq for Reasons {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Reasons {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Reasons {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Rejection>::deserialize(deserializer).map(Self::from)
    }
}
