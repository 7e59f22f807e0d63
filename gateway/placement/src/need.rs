//! A job as placement reads it: derived once per decision, so the work per cluster is
//! arithmetic and lookups. Every stage reads the [`Need`]; best fit reads its [`Demand`].

use std::cell::OnceCell;

use meridian_proto::inventory::{NodeFree, NodeShape};
use meridian_proto::selector::Selector;
use meridian_proto::spec::JobSpec;
use serde::{Deserialize, Serialize};

use crate::name::{Name, Names};

/// What a payload needs from a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PayloadKind {
    /// It has a container image.
    ContainerImage,
    /// It has only a command, run on the bare node.
    BareCommand,
}

/// What one replica needs, and how many replicas there are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    pub(crate) replicas: u32,
    pub(crate) gpus: u32,
    pub(crate) cpu: u32,
    pub(crate) memory_gib: u32,
    pub(crate) min_gpu_memory_gib: u32,
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
    /// The job's [`quote_key`](crate::quote_key), worked out the first time a cluster has quotes.
    quote_key: OnceCell<u64>,
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
            quote_key: OnceCell::new(),
        }
    }

    /// The key members' quotes for this job's shape are kept under.
    pub(crate) fn quote_key(&self) -> u64 {
        *self.quote_key.get_or_init(|| crate::quote::quote_key(self.job))
    }

    /// Whether the job's nodeSelector accepts the nodes of `shape`.
    pub(crate) fn selects(&self, shape: &NodeShape) -> bool {
        self.node_selector.is_none_or(|selector| selector.matches(&shape.labels))
    }

    /// The job's cluster selector as text, for rejections.
    pub(crate) fn cluster_selector_text(&self) -> Name {
        let selector = self.job.placement.cluster_selector();
        self.selector_text[0].get_or_init(|| Name::from(selector.to_string())).clone()
    }

    /// The job's node selector as text, for rejections.
    pub(crate) fn node_selector_text(&self) -> Name {
        let selector = self.job.placement.node_selector();
        self.selector_text[1].get_or_init(|| Name::from(selector.to_string())).clone()
    }
}

impl Demand {
    /// Per-replica needs of `job`.
    pub(crate) fn of(job: &JobSpec) -> Self {
        let r = &job.gang.resources;
        Self {
            replicas: job.gang.replicas,
            gpus: r.gpus,
            cpu: r.cpu,
            memory_gib: r.memory_gib,
            min_gpu_memory_gib: r.gpu_memory_gib,
        }
    }

    /// Replicas that fit on one empty node of `shape`.
    pub(crate) fn per_empty_node(&self, shape: &NodeShape) -> u32 {
        let empty =
            NodeFree { gpus: shape.gpus_per_node, cpu: shape.cpu_per_node, memory_gib: shape.memory_gib_per_node };
        self.fitting(&empty, shape.gpus_per_node.checked_div(self.gpus).unwrap_or(u32::MAX))
    }

    /// Replicas that fit on `free`, given that its GPUs alone hold `by_gpus`. Same result as
    /// [`NodeFree::replicas_fitting`], which the property tests check against, but divides only
    /// when CPU or memory is the tighter limit: this runs for every node of every decision.
    pub(crate) fn fitting(&self, free: &NodeFree, by_gpus: u32) -> u32 {
        let limit = |have: u32, need: u32, fits: u32| {
            if need == 0 || u64::from(have) >= u64::from(fits) * u64::from(need) { fits } else { have / need }
        };
        let fits = limit(free.cpu, self.cpu, by_gpus);
        limit(free.memory_gib, self.memory_gib, fits)
    }
}
