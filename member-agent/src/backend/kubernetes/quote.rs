//! Start quotes on Kubernetes: the best the backend can honestly say about when a gang would start.
//!
//! Kubernetes has no API that answers "when would this start": the kube-scheduler places pods
//! that exist, and neither Volcano nor Kueue plans ahead in time. So the quote is made here, from
//! the same look at Nodes and Pods the inventory takes ([`inventory::gpu_slots`]): per node and
//! GPU kind, what is free now, and when the pods on it are expected to give back what they hold.
//!
//! Only Meridian's own pods have an expected end: their start time plus the job's
//! `runtime.estimate`, which the agent writes on every pod ([`ESTIMATE_KEY`]). A pod past its
//! estimate is expected to run on as the builtin scheduler expects an overdue job to (half its
//! age, at least [`OVERDUE_FLOOR`]), never to be "done now" while it still holds its GPUs. Every
//! other pod (another team's, a system daemon's, a Meridian pod from before the annotation)
//! keeps what it holds for the whole quote.
//!
//! The gang is then placed one GPU type at a time ([`plan`]): now, and after each expected end
//! in time order, every replica on some node of the type that the job accepts (several replicas
//! may share a node with room). The first moment they all fit is the type's start; a type on
//! which they never fit, even after every known end, is left out.
//!
//! Not counted, because nothing in the cluster says when it would happen: Volcano or Kueue
//! queue order (jobs already waiting, quotas, fair share), preemption, and pods that will be
//! created later. The gateway adds the work queued ahead from the pressure report.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod};
use meridian_proto::gpu;
use meridian_proto::protocol::{Assignment, StartQuote, TypeStart};
use meridian_proto::spec::{JobSpec, Resources};
use meridian_scheduler::{OVERDUE_FLOOR, OVERDUE_RUN_ON_FRACTION};

use super::Shared;
use super::config::Mode;
use super::inventory::{self, Amounts, GpuTypeMapper};
use super::objects::{ESTIMATE_KEY, MANAGED_LABEL, MANAGED_VALUE};
use crate::backend::BackendError;

#[cfg(test)]
mod tests;

/// One GPU kind of one usable node (ready, schedulable) as a quote plans over it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeState {
    /// The node's name.
    pub node: String,
    /// The GPU type of this kind (`h100`, or a MIG type `a100-80g.1g.10gb`).
    pub gpu_type: String,
    /// Memory per GPU (or MIG slice) in GiB.
    pub gpu_memory_gib: u32,
    /// The labels a `placement.nodeSelector` is matched against: the node's, without the ones
    /// that name one node, as the inventory's shapes carry them.
    pub labels: BTreeMap<String, String>,
    /// What is free now.
    pub free: Amounts,
    /// What pods on the node are expected to give back, and when. Pods with no known end are
    /// not here: what they hold stays taken.
    pub releases: Vec<Release>,
}

/// What one pod is expected to give back to a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Release {
    /// Seconds from the quote.
    pub after_secs: u64,
    /// The GPUs (of the node state's kind), CPU and memory it holds.
    pub amounts: Amounts,
}

impl Shared {
    /// When a gang shaped like `job` could start here (see [`LocalBackend::quote`]): one list of
    /// nodes and one of pods, the same two calls an inventory report makes; nothing is created.
    ///
    /// [`LocalBackend::quote`]: crate::backend::LocalBackend::quote
    pub(super) async fn quote_now(&self, job: &Assignment) -> Result<StartQuote, BackendError> {
        let (nodes, pods) = self.nodes_and_pods().await?;
        let states = node_states(&nodes, &pods, &self.mapper, SystemTime::now())?;
        Ok(StartQuote { starts: plan(&job.spec, &states), basis: basis(self.config.mode) })
    }
}

/// What a Kubernetes quote says it is based on, for `explain`.
pub(crate) fn basis(mode: Mode) -> String {
    let ignored = match mode {
        Mode::Volcano => "Volcano queue order and preemption",
        Mode::Kueue => "Kueue queue order, quotas and preemption",
    };
    format!("node scan: Meridian pods' estimated ends; other pods never end; {ignored} not counted")
}

/// The usable nodes' GPU kinds with what is free at `now` and what the pods on them are expected
/// to give back (see the module docs). Errors as the inventory's scan does.
pub(crate) fn node_states(
    nodes: &[Node],
    pods: &[Pod],
    mapper: &GpuTypeMapper,
    now: SystemTime,
) -> Result<Vec<NodeState>, BackendError> {
    let mut ends = BTreeMap::<&str, Vec<(u64, BTreeMap<String, f64>)>>::new();
    for pod in pods.iter().filter(|p| inventory::pod_holds_resources(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { continue };
        let Some(remaining) = expected_remaining(pod, now) else { continue };
        ends.entry(node).or_default().push((ceil_secs(remaining), inventory::pod_requests(pod)));
    }
    let slots = inventory::gpu_slots(nodes, pods, mapper)?;
    Ok(slots
        .into_iter()
        .filter(|slot| slot.usable)
        .map(|slot| {
            let releases = ends
                .get(slot.node.as_str())
                .into_iter()
                .flatten()
                .map(|(after_secs, requests)| Release {
                    after_secs: *after_secs,
                    amounts: Amounts::of_requests(requests, &slot.resource),
                })
                .collect();
            NodeState {
                labels: inventory::without_per_node_labels(&slot.labels),
                node: slot.node,
                gpu_type: slot.gpu_type,
                gpu_memory_gib: slot.gpu_memory_gib,
                free: slot.free,
                releases,
            }
        })
        .collect())
}

/// How much longer a pod of a Meridian job is expected to hold its resources at `now`: the rest
/// of its estimate from its start time (all of it when it has not started), and once past it the
/// builtin scheduler's overdue model. None for every other pod, and for a Meridian pod that
/// carries no estimate: nothing says when those end.
pub(crate) fn expected_remaining(pod: &Pod, now: SystemTime) -> Option<Duration> {
    let meta = &pod.metadata;
    let ours = meta.labels.as_ref().and_then(|l| l.get(MANAGED_LABEL)).is_some_and(|v| v == MANAGED_VALUE);
    if !ours {
        return None;
    }
    let estimate = Duration::from_secs(meta.annotations.as_ref()?.get(ESTIMATE_KEY)?.trim().parse().ok()?);
    let started = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| SystemTime::from(t.0));
    let age = started.and_then(|s| now.duration_since(s).ok()).unwrap_or_default();
    // Overdue as the builtin scheduler counts it (`remaining.rs`): at or past the estimate, and
    // running at all.
    if age < estimate || age.is_zero() {
        Some(estimate - age)
    } else {
        Some(age.mul_f64(OVERDUE_RUN_ON_FRACTION).max(OVERDUE_FLOOR))
    }
}

/// When every replica of `spec`'s gang fits on `nodes`, per GPU type the job accepts (in the order
/// the types first appear among `nodes`), if the releases come when expected. A type on which the
/// gang never fits is left out.
pub(crate) fn plan(spec: &JobSpec, nodes: &[NodeState]) -> Vec<TypeStart> {
    let need = &spec.gang.resources;
    let selector = spec.placement.node_selector();
    let mut types: Vec<&str> = Vec::new();
    for node in nodes {
        if accepts_gpu(need, &node.gpu_type, node.gpu_memory_gib) && !types.contains(&node.gpu_type.as_str()) {
            types.push(&node.gpu_type);
        }
    }
    types
        .into_iter()
        .filter_map(|gpu_type| {
            let candidates: Vec<&NodeState> =
                nodes.iter().filter(|n| n.gpu_type == gpu_type && selector.matches(&n.labels)).collect();
            let after_secs = earliest_fit(&candidates, spec.gang.replicas, need)?;
            Some(TypeStart { gpu_type: gpu_type.to_owned(), after_secs, preempts: false })
        })
        .collect()
}

/// Whether a job needing `need` takes GPUs of `gpu_type` with `gpu_memory_gib` each: one of its
/// `gpuTypes` (any whole-GPU type when it lists none; a MIG slice only when named), with enough
/// memory. The same rule as the builtin scheduler's and the gateway's.
fn accepts_gpu(need: &Resources, gpu_type: &str, gpu_memory_gib: u32) -> bool {
    let type_ok =
        if need.gpu_types.is_empty() { !gpu::is_slice(gpu_type) } else { need.gpu_types.iter().any(|t| t == gpu_type) };
    type_ok && gpu_memory_gib >= need.gpu_memory_gib
}

/// Seconds until `replicas` replicas needing `need` each fit on `nodes` at once: 0 when they fit
/// now, else the first release after which they do; None when they never do. Replays the
/// releases in time order and recounts only the nodes each one changes.
fn earliest_fit(nodes: &[&NodeState], replicas: u32, need: &Resources) -> Option<u64> {
    let fitting = |free: &Amounts| u64::from(free.whole().replicas_fitting(need.gpus, need.cpu, need.memory_gib));
    let wanted = u64::from(replicas);
    let mut free: Vec<Amounts> = nodes.iter().map(|n| n.free).collect();
    let mut per_node: Vec<u64> = free.iter().map(fitting).collect();
    let mut total: u64 = per_node.iter().sum();
    if total >= wanted {
        return Some(0);
    }
    let mut releases: Vec<(u64, usize, Amounts)> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.releases.iter().map(move |r| (r.after_secs, i, r.amounts)))
        .collect();
    releases.sort_by_key(|(after, i, _)| (*after, *i));
    let mut pending = releases.into_iter().peekable();
    while let Some((at, i, amounts)) = pending.next() {
        free[i] = free[i] + amounts;
        total -= per_node[i];
        per_node[i] = fitting(&free[i]);
        total += per_node[i];
        // Everything released at the same moment counts before the gang is tried.
        let more_now = pending.peek().is_some_and(|(next, _, _)| *next == at);
        if !more_now && total >= wanted {
            return Some(at);
        }
    }
    None
}

/// Whole seconds, rounded up, so a quote never promises a start earlier than the plan.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
