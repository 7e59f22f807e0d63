//! Properties over random federations: placement never over-commits, a choice that starts now
//! really fits, and the order of clusters does not matter.

use meridian_proto::gpu::span_types;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::*;

pub(super) const TYPES: [&str; 3] = ["h100", "a100-80g", "l4"];

/// Node labels a random shape may carry, and node selectors a random job may have.
const FABRICS: [Option<&str>; 3] = [None, Some("ib"), Some("roce")];
const NODE_SELECTORS: [&str; 5] = ["", "", "fabric=ib", "fabric!=ib", "fabric"];

fn arb_shape() -> impl Strategy<Value = NodeShape> {
    (0..TYPES.len(), prop::sample::select(vec![1u32, 2, 4, 8]), 0usize..6, 0..FABRICS.len()).prop_flat_map(
        |(t, per_node, nodes, fabric)| {
            // Free CPUs vary independently of free GPUs, so some nodes have GPUs but not the CPUs.
            prop::collection::vec((0..=per_node, 0..=16 * per_node), nodes).prop_map(move |free| {
                let mut s = shape(TYPES[t], per_node, &[]);
                s.free = free.into_iter().map(|(g, cpu)| NodeFree { gpus: g, cpu, memory_gib: 128 * g }).collect();
                s.labels = FABRICS[fabric].map(|f| ("fabric".to_owned(), f.to_owned())).into_iter().collect();
                s
            })
        },
    )
}

fn arb_cluster(index: usize) -> impl Strategy<Value = ClusterSnapshot> {
    (prop::collection::vec(arb_shape(), 0..3), any::<bool>(), 0u64..7200, 0u32..16).prop_map(
        move |(shapes, cloud, release_after, pending)| {
            let tier = if cloud { Tier::Cloud } else { Tier::Owned };
            let pressure = QueuePressure {
                queues: vec![QueueLoad {
                    queue: "q".into(),
                    weight: 1.0,
                    pending_jobs: 1,
                    pending_gpus: pending,
                    running_gpus: 0,
                }],
                releases: vec![GpuRelease { after_secs: release_after, gpus: 8 }],
                estimated_wait_secs: release_after,
                preemptible: Vec::new(),
            };
            ClusterSnapshot::new(info(&format!("c{index:02}"), "us-east", tier), Inventory { shapes }, pressure, true)
        },
    )
}

pub(super) fn arb_federation() -> impl Strategy<Value = FederationSnapshot> {
    (1usize..6).prop_flat_map(|n| (0..n).map(arb_cluster).collect::<Vec<_>>().prop_map(federation))
}

pub(super) fn arb_job() -> impl Strategy<Value = JobSpec> {
    (1u32..5, 1u32..9, prop::collection::vec(0..TYPES.len(), 0..2), any::<bool>(), 0..NODE_SELECTORS.len()).prop_map(
        |(replicas, gpus, types, burst_never, selector)| {
            let mut spec = job(replicas, gpus);
            spec.gang.resources.gpu_types = types.into_iter().map(|t| TYPES[t].to_owned()).collect();
            if burst_never {
                spec.placement.burst = BurstPolicy::Never;
            }
            spec.placement.node_selector = NODE_SELECTORS[selector].parse().unwrap();
            spec
        },
    )
}

fn acceptable<'a>(spec: &'a JobSpec, cluster: &'a ClusterSnapshot) -> impl Iterator<Item = &'a NodeShape> + 'a {
    let r = &spec.gang.resources;
    cluster.inventory().shapes.iter().filter(move |s| {
        (r.gpu_types.is_empty() || r.gpu_types.contains(&s.gpu_type))
            && s.gpu_memory_gib >= r.gpu_memory_gib
            && spec.placement.node_selector.matches(&s.labels)
    })
}

/// Independent per-node count: replicas of `spec` that fit on `nodes` (each replica on one node).
fn replicas_on(spec: &JobSpec, nodes: impl Iterator<Item = NodeFree>) -> u64 {
    let r = &spec.gang.resources;
    nodes.map(|n| u64::from(n.replicas_fitting(r.gpus, r.cpu, r.memory_gib))).sum()
}

/// Reference best fit, the slow obvious way: sort nodes by free GPUs (then shape, node) and fill,
/// over the nodes of the chosen type (or of each type of a span).
fn reference_reserve(cluster: &ClusterSnapshot, spec: &JobSpec, gpu_type: &str) -> Inventory {
    let r = &spec.gang.resources;
    let mut inventory = cluster.inventory().clone();
    let mut nodes: Vec<(u32, usize, usize)> = Vec::new();
    for (si, s) in inventory.shapes.iter().enumerate() {
        if span_types(gpu_type).any(|t| t == s.gpu_type)
            && s.gpu_memory_gib >= r.gpu_memory_gib
            && spec.placement.node_selector.matches(&s.labels)
        {
            nodes.extend(s.free.iter().enumerate().map(|(ni, n)| (n.gpus, si, ni)));
        }
    }
    nodes.sort();
    let mut remaining = spec.gang.replicas;
    for (_, si, ni) in nodes {
        let node = &mut inventory.shapes[si].free[ni];
        let used = node.replicas_fitting(r.gpus, r.cpu, r.memory_gib).min(remaining);
        node.gpus -= used * r.gpus;
        node.cpu -= used * r.cpu;
        node.memory_gib -= used * r.memory_gib;
        remaining -= used;
    }
    inventory
}

proptest! {
    #[test]
    fn never_picks_a_cluster_whose_shapes_cannot_hold_the_gang(fed in arb_federation(), spec in arb_job()) {
        let d = place(&spec, &fed, &PlacementConfig::default());
        if let Some(choice) = &d.chosen {
            let c = fed.cluster(&choice.cluster).unwrap();
            let empty = acceptable(&spec, c).flat_map(|s| {
                let node = NodeFree { gpus: s.gpus_per_node, cpu: s.cpu_per_node, memory_gib: s.memory_gib_per_node };
                std::iter::repeat_n(node, s.free.len())
            });
            prop_assert!(replicas_on(&spec, empty) >= u64::from(spec.gang.replicas));
            prop_assert!(spec.placement.burst != BurstPolicy::Never || c.info().tier == Tier::Owned);
        }
    }

    #[test]
    fn a_starts_now_choice_really_has_free_nodes_and_reserve_takes_exactly_the_gang(
        fed in arb_federation(), spec in arb_job()
    ) {
        starts_now_means_free_nodes_and_reserve_takes_the_gang(&fed, &spec)?;
    }

    #[test]
    fn the_same_holds_where_two_types_run_alike_and_gangs_may_span_them(
        mut fed in arb_federation(), spec in arb_job()
    ) {
        let alike = [("h100", 1.0), ("a100-80g", 1.0), ("l4", 0.25)];
        fed.set_gpu_speed(&alike.iter().map(|(t, v)| ((*t).to_owned(), *v)).collect());
        starts_now_means_free_nodes_and_reserve_takes_the_gang(&fed, &spec)?;
        // A job that waits could not have started over the span either: where the H100 and
        // A100 nodes it accepts could hold it empty, they do not hold it now.
        let d = place(&spec, &fed, &PlacementConfig::default());
        if let Some(choice) = d.chosen.as_ref().filter(|c| !c.starts_now) {
            let c = fed.cluster(&choice.cluster).unwrap();
            let alike = |s: &&NodeShape| s.gpu_type == "h100" || s.gpu_type == "a100-80g";
            let empty = acceptable(&spec, c).filter(alike).flat_map(|s| {
                let node = NodeFree { gpus: s.gpus_per_node, cpu: s.cpu_per_node, memory_gib: s.memory_gib_per_node };
                std::iter::repeat_n(node, s.free.len())
            });
            if replicas_on(&spec, empty) >= u64::from(spec.gang.replicas) {
                let now = acceptable(&spec, c).filter(alike).flat_map(|s| s.free.iter().copied());
                prop_assert!(replicas_on(&spec, now) < u64::from(spec.gang.replicas));
            }
        }
    }

    #[test]
    fn the_choice_does_not_depend_on_cluster_order(fed in arb_federation(), spec in arb_job()) {
        let config = PlacementConfig::default();
        let mut reversed = fed.clone();
        reversed.clusters.reverse();
        let a = place(&spec, &fed, &config).chosen;
        let b = place(&spec, &reversed, &config).chosen;
        prop_assert_eq!(a, b);
    }

    #[test]
    fn the_choice_alone_is_the_full_decisions_choice(
        fed in arb_federation(),
        spec in arb_job(),
        waited_secs in 0.0f64..20_000.0,
        down in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let config = PlacementConfig::default();
        let mut fed = fed;
        if let Some(down) = down {
            let at = down.index(fed.clusters.len());
            fed.clusters[at].connected = false;
        }
        let full = place_waited(&spec, &fed, &config, waited_secs).chosen;
        prop_assert_eq!(crate::place::choose_waited(&spec, &fed, &config, waited_secs), full);
    }
}

proptest! {
    /// A compacted decision says what the full one says, lists the best feasible clusters and one
    /// example of each kind of rejection, and counts every cluster it drops.
    #[test]
    fn a_compacted_decision_keeps_the_choice_the_summary_and_every_clusters_count(
        fed in arb_federation(), spec in arb_job(), keep in 0usize..4
    ) {
        let full = place(&spec, &fed, &PlacementConfig::default());
        let compact = full.clone().compact(keep);
        prop_assert_eq!(&compact.chosen, &full.chosen);
        prop_assert_eq!(compact.summary(), full.summary());

        // Listed: a subsequence of the full list, in snapshot order.
        let mut rest = full.candidates.iter();
        for kept in &compact.candidates {
            prop_assert!(rest.any(|c| c == kept), "{} is not from the full decision", kept.cluster);
        }
        // The best feasible ones, by rank.
        let mut feasible: Vec<&Candidate> = full.candidates.iter().filter(|c| c.score().is_some()).collect();
        feasible.sort_by(|a, b| crate::verdict::rank(a, b));
        let best: Vec<&str> = feasible.iter().take(keep.max(1)).map(|c| c.cluster.as_str()).collect();
        let mut listed: Vec<&str> =
            compact.candidates.iter().filter(|c| c.score().is_some()).map(|c| c.cluster.as_str()).collect();
        if compact.omitted.is_some() {
            listed.sort_by_key(|name| best.iter().position(|b| b == name));
            prop_assert_eq!(listed, best);
        }
        // One example per kind of rejection: the first by name.
        let kinds: std::collections::BTreeSet<&str> =
            full.candidates.iter().filter_map(|c| c.reasons().first().map(Rejection::kind)).collect();
        for kind in kinds {
            let of_kind = |d: &Decision| -> Vec<String> {
                let mut names: Vec<String> = d
                    .candidates
                    .iter()
                    .filter(|c| c.reasons().first().map(Rejection::kind) == Some(kind))
                    .map(|c| c.cluster.to_string())
                    .collect();
                names.sort();
                names
            };
            let all = of_kind(&full);
            let kept = of_kind(&compact);
            prop_assert_eq!(kept.len(), 1, "{}", kind);
            prop_assert_eq!(&kept[0], &all[0]);
            let counted = compact.omitted.as_ref().and_then(|o| o.rejected.iter().find(|r| r.reason == kind));
            prop_assert_eq!(counted.map_or(0, |r| r.clusters as usize), all.len() - 1, "{}", kind);
        }
        // Every cluster is listed or counted, and compacting again changes nothing.
        let counted = compact.omitted.as_ref().map_or(0, |o| (o.feasible + o.rejected_clusters()) as usize);
        prop_assert_eq!(compact.candidates.len() + counted, full.candidates.len());
        prop_assert_eq!(compact.clone().compact(keep), compact.clone());
        // A decision with nothing to drop is left as it is.
        prop_assert_eq!(full.clone().compact(full.candidates.len()).omitted.is_none(),
            full.candidates.iter().filter(|c| !c.reasons().is_empty()).count()
                == full.candidates.iter().filter_map(|c| c.reasons().first().map(Rejection::kind)).collect::<std::collections::BTreeSet<_>>().len());
    }
}

/// A choice that starts now has the free nodes for the whole gang on its type (or span), and
/// reserving takes exactly the gang, on the nodes reference best fit picks.
fn starts_now_means_free_nodes_and_reserve_takes_the_gang(
    fed: &FederationSnapshot,
    spec: &JobSpec,
) -> Result<(), TestCaseError> {
    let d = place(spec, fed, &PlacementConfig::default());
    let Some(choice) = d.chosen.clone() else { return Ok(()) };
    let c = fed.cluster(&choice.cluster).unwrap();
    let same_type = |s: &&NodeShape| span_types(&choice.gpu_type).any(|t| t == s.gpu_type);
    let now = replicas_on(spec, acceptable(spec, c).filter(same_type).flat_map(|s| s.free.iter().copied()));
    prop_assert_eq!(choice.starts_now, now >= u64::from(spec.gang.replicas));

    let mut reserved = c.clone();
    prop_assert_eq!(reserved.reserve(spec), choice.starts_now);
    if choice.starts_now {
        prop_assert_eq!(reserved.inventory(), &reference_reserve(c, spec, &choice.gpu_type));
        let before = c.inventory().gpus_free();
        prop_assert_eq!(before - reserved.inventory().gpus_free(), spec.total_gpus());
        for (s0, s1) in c.inventory().shapes.iter().zip(&reserved.inventory().shapes) {
            for (n0, n1) in s0.free.iter().zip(&s1.free) {
                prop_assert!(n1.gpus <= n0.gpus && n1.cpu <= n0.cpu && n1.memory_gib <= n0.memory_gib);
            }
        }
    }
    Ok(())
}
