//! The free-GPU index and best fit against a scan of every node, over random shapes and demands.

use proptest::prelude::*;

use super::properties::{TYPES, arb_job};
use super::*;
use crate::fit::{self, Nodes};
use crate::index::FreeIndex;
use crate::need::Demand;
use crate::options::Span;

/// Shapes with up to 150 nodes (several 64-node words) and, rarely, nodes past the level cap;
/// agents may report more free than a node has, which placement must clamp.
fn arb_indexed_shape() -> impl Strategy<Value = NodeShape> {
    let per_node = prop::sample::select(vec![1u32, 2, 4, 8, 8, 8, 300]);
    (0..TYPES.len(), per_node, 0usize..150).prop_flat_map(|(t, per_node, nodes)| {
        let node = (0..=per_node + 1, 0..=16 * per_node + 4, 0..=128 * per_node + 8);
        prop::collection::vec(node, nodes).prop_map(move |free| {
            let mut s = shape(TYPES[t], per_node, &[]);
            s.free = free.into_iter().map(|(gpus, cpu, memory_gib)| NodeFree { gpus, cpu, memory_gib }).collect();
            s
        })
    })
}

/// Every node of `cluster` and its index, no nodeSelector.
fn every_node(cluster: &ClusterSnapshot) -> Nodes<'_> {
    Nodes { shapes: &cluster.inventory().shapes, index: cluster.index(), selector: None }
}

fn arb_demand() -> impl Strategy<Value = Demand> {
    let gpus = prop_oneof![8 => 0u32..=9, 1 => 250u32..=301];
    (0u32..=6, gpus, 0u32..=80, 0u32..=600, prop::sample::select(vec![0u32, 24, 80])).prop_map(
        |(replicas, gpus, cpu, memory_gib, min_gpu_memory_gib)| Demand {
            replicas,
            gpus,
            cpu,
            memory_gib,
            min_gpu_memory_gib,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn indexed_best_fit_equals_a_scan_of_every_node(
        shapes in prop::collection::vec(arb_indexed_shape(), 1..4),
        reservations in prop::collection::vec(arb_job(), 0..4),
        demand in arb_demand(),
    ) {
        let mut c = cluster("c", "us-east", Tier::Owned, shapes);
        // Reservations move nodes between levels and loosen the bounds; the index must keep up.
        for spec in &reservations {
            c.reserve(spec);
        }
        prop_assert!(c.index().agrees_with(&FreeIndex::new(&c.inventory().shapes)));

        let shapes = &c.inventory().shapes;
        for s in shapes {
            let empty = NodeFree { gpus: s.gpus_per_node, cpu: s.cpu_per_node, memory_gib: s.memory_gib_per_node };
            let expected = empty.replicas_fitting(demand.gpus, demand.cpu, demand.memory_gib);
            prop_assert_eq!(demand.per_empty_node(s), expected);
        }
        for (type_id, first) in shapes.iter().enumerate().filter(|(i, _)| c.index().type_id(*i) == *i) {
            let indexed = fit::survey(every_node(&c), Span::one(type_id), &demand);
            let scanned = fit::scan::Fitter::default().survey(shapes, &first.gpu_type, &demand);
            prop_assert_eq!(indexed, scanned);
            if let fit::Survey::Fits(plan) = indexed {
                let by_index = plan.fragmentation(every_node(&c), Span::one(type_id), &demand);
                let by_scan = fit::scan::fragmentation(&plan, shapes, &first.gpu_type, &demand);
                prop_assert_eq!(by_index.to_bits(), by_scan.to_bits());
                let (mut taken_by_index, mut taken_by_scan) = (Vec::new(), Vec::new());
                plan.for_each_node(every_node(&c), Span::one(type_id), &demand, |s, n, r| taken_by_index.push((s, n, r)));
                fit::scan::for_each_node(&plan, shapes, &first.gpu_type, &demand, |s, n, r| {
                    taken_by_scan.push((s, n, r));
                });
                taken_by_index.sort_unstable();
                taken_by_scan.sort_unstable();
                prop_assert_eq!(taken_by_index, taken_by_scan);
            }
        }
    }
}
