//! Choosing nodes for a gang: all replicas or none, best fit, fewest nodes.
//!
//! The choice is greedy and deterministic:
//! 1. If one acceptable node can hold every remaining replica, use the one that leaves the fewest
//!    free GPUs behind (then CPU, memory, then declaration order). Packing the gang on one node
//!    keeps its replicas close, and best fit keeps big holes free for big gangs.
//! 2. Otherwise take the node that holds the most replicas (ties: fewest GPUs left behind, then
//!    declaration order), fill it, and repeat. Taking the largest capacities first uses the fewest
//!    nodes for the gang.
//!
//! Each round scans the candidate list once, so a placement costs O(nodes × nodes used), and a
//! quick capacity sum rejects a gang that cannot fit before any choice is made.

use meridian_proto::inventory::NodeFree;

use super::{LocalJob, NodeSpec};

/// A managed node: what it is and what is free on it now.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// The node as declared.
    pub(super) spec: NodeSpec,
    /// What is free now; never more than the declared capacity.
    pub(super) free: NodeFree,
}

/// A node that can take at least one replica of the job being placed.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    /// Index into the node list.
    index: usize,
    /// Replicas that fit on it now, capped at the gang size.
    capacity: u32,
}

impl Node {
    /// A node with everything free.
    pub(super) fn new(spec: NodeSpec) -> Self {
        let free = Self::capacity_of(&spec);
        Self { spec, free }
    }

    /// Everything the node has, as a [`NodeFree`].
    pub(super) fn capacity(&self) -> NodeFree {
        Self::capacity_of(&self.spec)
    }

    fn capacity_of(spec: &NodeSpec) -> NodeFree {
        NodeFree { gpus: spec.gpus, cpu: spec.cpu, memory_gib: spec.memory_gib }
    }

    /// Whether the node may hold the job's replicas: its labels match the job's nodeSelector
    /// and its GPUs are acceptable (type and memory per GPU).
    pub(super) fn accepts(&self, job: &LocalJob) -> bool {
        job.accepts_gpu(&self.spec.gpu_type, self.spec.gpu_memory_gib) && job.accepts_labels(&self.spec.labels)
    }

    /// Takes one replica's resources. Callers only take what [`place`] found free, so the
    /// saturation never triggers; it keeps a logic slip from wrapping around.
    pub(super) fn take(&mut self, job: &LocalJob) {
        self.free.gpus = self.free.gpus.saturating_sub(job.gpus);
        self.free.cpu = self.free.cpu.saturating_sub(job.cpu);
        self.free.memory_gib = self.free.memory_gib.saturating_sub(job.memory_gib);
    }

    /// Gives one replica's resources back, never above the declared capacity.
    pub(super) fn give_back(&mut self, job: &LocalJob) {
        let capacity = self.capacity();
        self.free.gpus = self.free.gpus.saturating_add(job.gpus).min(capacity.gpus);
        self.free.cpu = self.free.cpu.saturating_add(job.cpu).min(capacity.cpu);
        self.free.memory_gib = self.free.memory_gib.saturating_add(job.memory_gib).min(capacity.memory_gib);
    }
}

/// Chooses a node for every replica of `job` given what is free now, or `None` when the whole
/// gang does not fit. Returns node indices, one per replica, grouped by node.
pub(super) fn place(nodes: &[Node], job: &LocalJob) -> Option<Vec<usize>> {
    place_with(nodes, job, |_, node| node.free)
}

/// Like [`place`], but with `free[i]` free on node `i` instead of what is free now (a projection).
pub(super) fn place_on(nodes: &[Node], job: &LocalJob, free: &[NodeFree]) -> Option<Vec<usize>> {
    place_with(nodes, job, |index, _| free.get(index).copied().unwrap_or_default())
}

/// Whether `job` would fit if every node were empty.
pub(super) fn fits_empty(nodes: &[Node], job: &LocalJob) -> bool {
    place_with(nodes, job, |_, node| node.capacity()).is_some()
}

/// Why `job` would not fit even with every node empty, naming the first rule no node meets:
/// the nodeSelector, then the GPU type and memory, then the gang's size. None when it fits.
pub(super) fn never_fits_reason(nodes: &[Node], job: &LocalJob) -> Option<String> {
    if fits_empty(nodes, job) {
        return None;
    }
    let selected = || nodes.iter().filter(|n| job.accepts_labels(&n.spec.labels));
    if selected().next().is_none() {
        return Some(format!(
            "no node matches nodeSelector `{}` (node labels here: {})",
            job.node_selector,
            node_labels(nodes)
        ));
    }
    let on_selected = if job.node_selector.is_everything() {
        String::new()
    } else {
        format!(" among the nodes matching nodeSelector `{}`", job.node_selector)
    };
    if !selected().any(|n| n.accepts(job)) {
        let types = if job.gpu_types.is_empty() { "any whole GPU".to_string() } else { job.gpu_types.join(", ") };
        return Some(format!(
            "no node has GPUs of type {types} with at least {} GiB each{on_selected}",
            job.gpu_memory_gib
        ));
    }
    Some(format!(
        "{} replicas of {} GPUs, {} CPUs and {} GiB each do not fit on the empty nodes{on_selected}",
        job.replicas, job.gpus, job.cpu, job.memory_gib
    ))
}

/// The distinct label sets of the nodes, by shape, for messages (`dgx: gpu-fabric=ib; l4: none`).
fn node_labels(nodes: &[Node]) -> String {
    let mut shapes: Vec<(&str, String)> = Vec::new();
    for node in nodes {
        if shapes.iter().any(|(shape, _)| *shape == node.spec.shape) {
            continue;
        }
        let labels: Vec<String> = node.spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = if labels.is_empty() { "none".to_string() } else { labels.join(",") };
        shapes.push((&node.spec.shape, labels));
    }
    shapes.iter().map(|(shape, labels)| format!("{shape}: {labels}")).collect::<Vec<_>>().join("; ")
}

/// The placement rules of this module, with `free_of(index, node)` saying what is free on a node.
pub(super) fn place_with(
    nodes: &[Node],
    job: &LocalJob,
    free_of: impl Fn(usize, &Node) -> NodeFree,
) -> Option<Vec<usize>> {
    let mut remaining = job.replicas;
    if remaining == 0 {
        return None;
    }
    let mut candidates: Vec<Candidate> = nodes
        .iter()
        .enumerate()
        .filter(|(_, node)| node.accepts(job))
        .map(|(index, node)| Candidate {
            index,
            capacity: free_of(index, node).replicas_fitting(job.gpus, job.cpu, job.memory_gib).min(remaining),
        })
        .filter(|c| c.capacity > 0)
        .collect();
    let fitting: u64 = candidates.iter().map(|c| u64::from(c.capacity)).sum();
    if fitting < u64::from(remaining) {
        return None;
    }

    // Leftover after placing `count` replicas: what best fit minimises (GPUs first, since they
    // are what big gangs need whole).
    let leftover = |c: &Candidate, count: u32| {
        let free = free_of(c.index, &nodes[c.index]);
        (
            free.gpus.saturating_sub(count.saturating_mul(job.gpus)),
            free.cpu.saturating_sub(count.saturating_mul(job.cpu)),
            free.memory_gib.saturating_sub(count.saturating_mul(job.memory_gib)),
        )
    };

    let mut chosen = Vec::with_capacity(usize::try_from(remaining).unwrap_or(0));
    while remaining > 0 {
        let whole = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.capacity >= remaining)
            .min_by_key(|(_, c)| (leftover(c, remaining), c.index))
            .map(|(pos, _)| pos);
        let (pos, count) = match whole {
            Some(pos) => (pos, remaining),
            None => {
                let pos = candidates
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, c)| (std::cmp::Reverse(c.capacity), leftover(c, c.capacity), c.index))
                    .map(|(pos, _)| pos)?;
                (pos, candidates[pos].capacity)
            }
        };
        let candidate = candidates.swap_remove(pos);
        chosen.extend(std::iter::repeat_n(candidate.index, usize::try_from(count).unwrap_or(0)));
        remaining -= count;
    }
    Some(chosen)
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn node(name: &str, gpu_type: &str, gpu_memory_gib: u32, gpus: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            shape: format!("{gpu_type}-{gpus}"),
            gpu_type: gpu_type.into(),
            gpu_memory_gib,
            gpus,
            cpu: 64,
            memory_gib: 512,
            labels: Default::default(),
        }
    }

    fn job(replicas: u32, gpus: u32) -> LocalJob {
        LocalJob {
            id: "j".into(),
            queue: "default".into(),
            priority: 50,
            replicas,
            gpus,
            cpu: 1,
            memory_gib: 1,
            gpu_types: Vec::new(),
            gpu_memory_gib: 0,
            node_selector: Default::default(),
            run_for: Duration::from_secs(60),
            actual: None,
            preemptible: false,
            last_preempted_at: None,
        }
    }

    /// Nodes whose free GPUs are `free[i]` out of 8.
    fn cluster(free: &[u32]) -> Vec<Node> {
        free.iter()
            .enumerate()
            .map(|(i, &f)| {
                let mut n = Node::new(node(&format!("n{i}"), "h100", 80, 8));
                n.free.gpus = f;
                n
            })
            .collect()
    }

    #[test]
    fn two_by_eight_gang_lands_only_on_nodes_with_eight_free_gpus() {
        let nodes = cluster(&[4, 8, 7, 8, 6]);
        assert_eq!(place(&nodes, &job(2, 8)), Some(vec![1, 3]));
    }

    #[test]
    fn gang_that_does_not_fit_whole_gets_no_nodes() {
        // 3×8 needs three empty nodes; two empty ones plus scattered GPUs are not enough.
        let nodes = cluster(&[8, 4, 8, 4]);
        assert_eq!(place(&nodes, &job(3, 8)), None);
    }

    #[test]
    fn replicas_are_packed_on_one_node_when_they_fit() {
        let nodes = cluster(&[1, 1, 8, 4]);
        // Two 2-GPU replicas fit on the 4-free node (leaving 0) and on the 8-free node (leaving
        // 4): best fit picks the tighter one, and never splits across the 1-free nodes.
        assert_eq!(place(&nodes, &job(2, 2)), Some(vec![3, 3]));
    }

    #[test]
    fn single_replica_goes_to_the_node_with_least_gpus_left() {
        let nodes = cluster(&[8, 3, 2, 5]);
        assert_eq!(place(&nodes, &job(1, 2)), Some(vec![2]));
    }

    #[test]
    fn gang_spanning_nodes_uses_the_fewest_nodes() {
        // Six 2-GPU replicas: the 8-free node takes 4, then the 4-free node takes 2 (best fit for
        // the rest), rather than three smaller holes.
        let nodes = cluster(&[2, 8, 2, 4, 6]);
        assert_eq!(place(&nodes, &job(6, 2)), Some(vec![1, 1, 1, 1, 3, 3]));
    }

    #[test]
    fn a_gang_pinned_to_a_span_of_types_spreads_over_them_and_no_other() {
        // What the gateway offers a gang too large for either A100: both types pinned.
        let nodes = vec![
            Node::new(node("a40-0", "a100-40g", 40, 8)),
            Node::new(node("h100-0", "h100", 80, 8)),
            Node::new(node("a80-0", "a100-80g", 80, 8)),
            Node::new(node("a80-1", "a100-80g", 80, 8)),
        ];
        let mut span = job(3, 8);
        span.gpu_types = vec!["a100-40g".into(), "a100-80g".into()];
        assert_eq!(place(&nodes, &span), Some(vec![0, 2, 3]));
        span.replicas = 4;
        assert_eq!(place(&nodes, &span), None, "the H100 is not in the span");
    }

    #[test]
    fn gpu_type_and_memory_filters_exclude_nodes() {
        let nodes = vec![
            Node::new(node("a100-40", "a100", 40, 8)),
            Node::new(node("a100-80", "a100", 80, 8)),
            Node::new(node("h100", "h100", 80, 8)),
        ];
        let mut wants_a100 = job(1, 8);
        wants_a100.gpu_types = vec!["a100".into()];
        wants_a100.gpu_memory_gib = 80;
        assert_eq!(place(&nodes, &wants_a100), Some(vec![1]));

        let mut wants_l4 = job(1, 1);
        wants_l4.gpu_types = vec!["l4".into()];
        assert_eq!(place(&nodes, &wants_l4), None);
        assert!(!fits_empty(&nodes, &wants_l4));
    }

    #[test]
    fn cpu_and_memory_limit_replicas_per_node() {
        let mut nodes = cluster(&[8]);
        nodes[0].free.cpu = 10;
        let mut cpu_heavy = job(3, 1);
        cpu_heavy.cpu = 4;
        assert_eq!(place(&nodes, &cpu_heavy), None, "10 cores hold only two 4-core replicas");
        cpu_heavy.replicas = 2;
        assert_eq!(place(&nodes, &cpu_heavy), Some(vec![0, 0]));
    }

    #[test]
    fn fits_empty_ignores_current_use() {
        let nodes = cluster(&[0, 0]);
        assert!(fits_empty(&nodes, &job(2, 8)));
        assert!(!fits_empty(&nodes, &job(3, 8)));
        assert_eq!(place(&nodes, &job(1, 1)), None);
    }

    #[test]
    fn take_and_give_back_round_trip_and_never_exceed_capacity() {
        let mut n = Node::new(node("n", "h100", 80, 8));
        let j = job(1, 3);
        n.take(&j);
        assert_eq!(n.free, NodeFree { gpus: 5, cpu: 63, memory_gib: 511 });
        n.give_back(&j);
        n.give_back(&j);
        assert_eq!(n.free, n.capacity());
    }
}
