//! Decoration: fitting raw jobs to a fleet. Each tenant gets a home cluster (balancing demand), each
//! job a gang shape its home can run, and some jobs a GPU-type pin and a dataset in a region.
//!
//! The `home-only` baseline runs every job on its tenant's home, so every decorated job must fit
//! there when the home is empty: a gang larger than the home shrinks to what the home holds.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use meridian_proto::gpu::GpuCatalog;

use super::sample;
use crate::{Dataset, RawJob, SimJob, Tenant, Workload};

/// A cluster that can be a tenant's home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeCluster {
    /// Index into the topology's clusters.
    pub cluster: usize,
    /// The cluster's region.
    pub region: String,
    /// Its GPU types, with how many GPUs of each it has.
    pub gpu_types: Vec<HomeGpuType>,
}

/// One GPU type of a home cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeGpuType {
    /// GPU type name, as jobs pin it.
    pub name: String,
    /// All GPUs of this type in the cluster.
    pub gpus: u64,
    /// GPUs of the largest node of this type.
    pub gpus_per_node: u32,
}

/// What decoration needs to know about the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetFacts {
    /// Candidate home clusters (the owned ones); expected non-empty.
    pub homes: Vec<HomeCluster>,
    /// Every region of the topology, sorted.
    pub regions: Vec<String>,
}

/// Mixed into the seed so decoration draws a stream independent of the generator's.
const SEED_MIX: u64 = 0x5EED_DEC0_5EED_DEC0;

/// Chance that a job pins a GPU type.
const PIN_PROBABILITY: f64 = 1.0 / 3.0;

/// Chance that a job reads a dataset.
const DATASET_PROBABILITY: f64 = 0.85;

/// Median dataset size before the job-size scale-up, in GiB.
const DATASET_MEDIAN_GIB: f64 = 40.0;

/// Log-normal sigma of dataset sizes.
const DATASET_SIGMA: f64 = 1.3;

/// Smallest and largest dataset size before the job-size scale-up, in GiB.
const DATASET_GIB_RANGE: (f64, f64) = (1.0, 4_000.0);

/// Chance that a dataset lives in its tenant's home region.
const HOME_REGION_PROBABILITY: f64 = 0.75;

/// A gang shape: `replicas` replicas of `gpus_per_replica` GPUs, each replica on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    replicas: u32,
    gpus_per_replica: u32,
}

impl Shape {
    fn gpus(self) -> u64 {
        u64::from(self.replicas) * u64::from(self.gpus_per_replica)
    }
}

/// Assigns each tenant of `raw` a home: an index into `homes`.
///
/// Longest processing time first: tenants in descending order of GPU-seconds (ties by name) each
/// go to the home with the least GPU-seconds assigned so far per GPU it has (ties: the lower
/// index), which balances demand across homes of different sizes. A home without GPUs is chosen
/// only when no home has any. Empty when `homes` is.
pub fn assign_homes(raw: &[RawJob], homes: &[HomeCluster]) -> BTreeMap<String, usize> {
    let mut demand: BTreeMap<&str, f64> = BTreeMap::new();
    for job in raw {
        *demand.entry(job.tenant.as_str()).or_default() += f64::from(job.gpus) * job.duration_secs as f64;
    }
    // From name order, a stable sort by descending demand leaves ties in name order.
    let mut tenants: Vec<(&str, f64)> = demand.into_iter().collect();
    tenants.sort_by(|a, b| b.1.total_cmp(&a.1));

    let home_gpus: Vec<f64> = homes.iter().map(|home| total_gpus(&home.gpu_types) as f64).collect();
    let mut assigned = vec![0.0_f64; homes.len()];
    let mut homes_of = BTreeMap::new();
    for (tenant, gpu_secs) in tenants {
        let per_gpu = |(assigned, gpus): (&f64, &f64)| if *gpus > 0.0 { assigned / gpus } else { f64::INFINITY };
        // `min_by` returns the first of equal minima: ties go to the lower index.
        let Some(best) = assigned.iter().zip(&home_gpus).map(per_gpu).enumerate().min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            break;
        };
        if let Some(slot) = assigned.get_mut(best.0) {
            *slot += gpu_secs;
        }
        homes_of.insert(tenant.to_string(), best.0);
    }
    homes_of
}

/// Turns raw jobs (in submit order) into a workload the fleet can run.
///
/// Tenants are the distinct tenant names, sorted, each homed by [`assign_homes`]. Each job gets a
/// gang shape that fits its tenant's home when empty (a gang larger than the home shrinks to fit),
/// with probability 1/3 a pinned GPU type of the home (weighted by GPU count, among types that hold
/// the gang), and with probability 0.85 a dataset (log-normal size, median 40 GiB, larger for
/// larger jobs) in the home region three times out of four, else in another region. Job `i` of
/// `raw` becomes job `i`, with its submit and run time unchanged. Decoration draws from its own
/// stream of `seed`, so the same arguments give the same workload.
///
/// `facts.homes` should not be empty: without homes, every tenant's home is cluster 0 and jobs keep
/// a one-replica shape of their raw GPUs, which nothing guarantees to fit.
pub fn decorate(raw: Vec<RawJob>, facts: &FleetFacts, seed: u64, source: String) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed ^ SEED_MIX);
    let homes_of = assign_homes(&raw, &facts.homes);
    let names: BTreeSet<&str> = raw.iter().map(|job| job.tenant.as_str()).collect();
    let home_of = |name: &str| homes_of.get(name).and_then(|&index| facts.homes.get(index));

    let tenants: Vec<Tenant> = names
        .iter()
        .map(|&name| Tenant { name: name.to_string(), home: home_of(name).map_or(0, |home| home.cluster) })
        .collect();
    let tenant_index: BTreeMap<&str, u32> =
        names.iter().enumerate().map(|(index, &name)| (name, u32::try_from(index).unwrap_or(u32::MAX))).collect();

    let jobs = raw
        .iter()
        .enumerate()
        .map(|(index, job)| {
            let home = home_of(&job.tenant);
            let (shape, gpu_type) = match home {
                Some(home) => shape_at_home(&mut rng, job.gpus, home),
                None => (Shape { replicas: 1, gpus_per_replica: job.gpus.max(1) }, None),
            };
            let home_region = home.map(|home| home.region.as_str());
            let dataset = draw_dataset(&mut rng, shape.gpus(), home_region, &facts.regions);
            let gpu_memory_gib = home.map_or(job.gpu_memory_gib, |home| {
                job.gpu_memory_gib.min(home_memory_gib(home, shape, gpu_type.as_deref()))
            });
            SimJob {
                id: u32::try_from(index).unwrap_or(u32::MAX),
                submit_secs: job.submit_secs,
                duration_secs: job.duration_secs,
                estimate_secs: job.duration_secs,
                replicas: shape.replicas,
                gpus_per_replica: shape.gpus_per_replica,
                tenant: tenant_index.get(job.tenant.as_str()).copied().unwrap_or(0),
                gpu_type,
                gpu_memory_gib,
                dataset,
                deadline_secs: None,
            }
        })
        .collect();
    Workload { source, tenants, jobs }
}

/// The most GPU memory (GiB, from the GPU catalog; unknown types count as unlimited) of a GPU
/// type of `home` that can hold `shape` on its own (only `pinned` when pinned), so that a job's
/// memory need can be lowered to what its home can meet.
fn home_memory_gib(home: &HomeCluster, shape: Shape, pinned: Option<&str>) -> u32 {
    let catalog = GpuCatalog::default();
    home.gpu_types
        .iter()
        .filter(|t| pinned.is_none_or(|p| p == t.name))
        .filter(|t| t.gpus >= shape.gpus() && t.gpus_per_node >= shape.gpus_per_replica)
        .map(|t| catalog.memory_gib(&t.name).unwrap_or(u32::MAX))
        .max()
        .unwrap_or(0)
}

/// The gang shape of a `gpus`-GPU job at `home`, and the GPU type it pins, if any.
fn shape_at_home(rng: &mut impl Rng, gpus: u32, home: &HomeCluster) -> (Shape, Option<String>) {
    // Placement runs a gang on one GPU type (the type its offer pins), so even an unpinned gang
    // must fit the nodes of a single type: the type that keeps the most of its GPUs.
    let unpinned = home
        .gpu_types
        .iter()
        .map(|t| fit_gang(gpus, std::slice::from_ref(t)))
        .fold(None::<Shape>, |best, shape| match best {
            Some(b) if b.gpus() >= shape.gpus() => Some(b),
            _ => Some(shape),
        })
        .unwrap_or(Shape { replicas: 1, gpus_per_replica: 1 });
    if !sample::chance(rng, PIN_PROBABILITY) {
        return (unpinned, None);
    }
    // Types that can hold the whole gang on their own.
    let candidates: Vec<&HomeGpuType> = home
        .gpu_types
        .iter()
        .filter(|t| t.gpus >= unpinned.gpus() && t.gpus_per_node >= unpinned.gpus_per_replica)
        .collect();
    let weights: Vec<f64> = candidates.iter().map(|t| t.gpus as f64).collect();
    match sample::weighted_index(rng, &weights).and_then(|index| candidates.get(index)) {
        Some(&pinned) => (fit_gang(gpus, std::slice::from_ref(pinned)), Some(pinned.name.clone())),
        None => (unpinned, None),
    }
}

/// The largest gang of up to `gpus` GPUs that `types` can run when empty, one replica per node
/// slot.
///
/// For a node size n: a job that fits one node is one replica; a larger one is spread over
/// ceil(gpus / n) replicas of equal size. Replicas then drop until the type's nodes can hold them.
/// The facts give only each type's GPU total and largest node, so a type is taken to be
/// `gpus / gpus_per_node` nodes of its largest size. With one node size this is exactly the rule
/// for a single type; with several (say one 8-GPU node and many 4-GPU nodes) each size is tried
/// and the shape keeping the most GPUs wins (ties: fewer, larger replicas), so a 16-GPU job
/// becomes 4 × 4 rather than 2 × 8 on the lone big node. Without any usable GPU type the job
/// becomes one 1-GPU replica.
fn fit_gang(gpus: u32, types: &[HomeGpuType]) -> Shape {
    let gpus = gpus.max(1);
    let node_sizes: BTreeSet<u32> = types
        .iter()
        .filter(|t| t.gpus_per_node > 0 && t.gpus >= u64::from(t.gpus_per_node))
        .map(|t| t.gpus_per_node)
        .collect();
    let mut best: Option<Shape> = None;
    for &node_gpus in node_sizes.iter().rev() {
        let (replicas, gpus_per_replica) = if gpus <= node_gpus {
            (1, gpus)
        } else {
            let replicas = gpus.div_ceil(node_gpus);
            (replicas, gpus.div_ceil(replicas))
        };
        let slots = replica_slots(types, gpus_per_replica);
        let replicas = u32::try_from(slots).map_or(replicas, |slots| replicas.min(slots));
        if replicas == 0 {
            continue;
        }
        let shape = Shape { replicas, gpus_per_replica };
        if best.is_none_or(|b| shape.gpus() > b.gpus()) {
            best = Some(shape);
        }
    }
    best.unwrap_or(Shape { replicas: 1, gpus_per_replica: 1 })
}

/// Replicas of `gpus_per_replica` GPUs that `types` hold, each type taken as nodes of its largest
/// size.
fn replica_slots(types: &[HomeGpuType], gpus_per_replica: u32) -> u64 {
    types
        .iter()
        .filter(|t| t.gpus_per_node > 0)
        .map(|t| {
            let nodes = t.gpus / u64::from(t.gpus_per_node);
            nodes.saturating_mul(u64::from(t.gpus_per_node / gpus_per_replica.max(1)))
        })
        .fold(0, u64::saturating_add)
}

/// All GPUs of `types`.
fn total_gpus(types: &[HomeGpuType]) -> u64 {
    types.iter().map(|t| t.gpus).fold(0, u64::saturating_add)
}

/// A dataset for a job of `gpus` GPUs, or none. Lives in `home_region` with probability 3/4,
/// else in another region of `regions` (uniformly); without other regions, at home.
fn draw_dataset(rng: &mut impl Rng, gpus: u64, home_region: Option<&str>, regions: &[String]) -> Option<Dataset> {
    if !sample::chance(rng, DATASET_PROBABILITY) {
        return None;
    }
    let base_gib =
        sample::log_normal(rng, DATASET_MEDIAN_GIB, DATASET_SIGMA).clamp(DATASET_GIB_RANGE.0, DATASET_GIB_RANGE.1);
    // Bigger jobs read more data: ×1 for 1 GPU, ×2 for 4, ×3 for 16, ×5 for 256.
    let size_gib = base_gib * (1.0 + (gpus.max(1) as f64).log2() / 2.0);

    let at_home = sample::chance(rng, HOME_REGION_PROBABILITY);
    let others = || regions.iter().map(String::as_str).filter(move |&region| Some(region) != home_region);
    let elsewhere = match others().count() {
        0 => None,
        count => others().nth(rng.random_range(0..count)),
    };
    let region = match (at_home, home_region) {
        (true, Some(home)) => home,
        _ => elsewhere.or(home_region).unwrap_or_default(),
    };
    Some(Dataset { size_gib, region: region.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_type(name: &str, gpus: u64, gpus_per_node: u32) -> HomeGpuType {
        HomeGpuType { name: name.to_string(), gpus, gpus_per_node }
    }

    fn home(cluster: usize, region: &str, gpu_types: Vec<HomeGpuType>) -> HomeCluster {
        HomeCluster { cluster, region: region.to_string(), gpu_types }
    }

    fn raw(tenant: &str, gpus: u32, duration_secs: u64) -> RawJob {
        RawJob { submit_secs: 0, duration_secs, gpus, tenant: tenant.to_string(), gpu_memory_gib: 0 }
    }

    fn fleet() -> FleetFacts {
        FleetFacts {
            homes: vec![
                home(
                    0,
                    "aws:us-east-1",
                    vec![gpu_type("h100", 64, 8), gpu_type("a100", 128, 8), gpu_type("l4", 32, 4)],
                ),
                home(2, "gcp:europe-west4", vec![gpu_type("h100", 256, 8)]),
                home(3, "aws:us-east-1", vec![gpu_type("h100", 8, 8), gpu_type("l4", 256, 4)]),
            ],
            regions: vec!["aws:us-east-1".into(), "aws:us-west-2".into(), "gcp:europe-west4".into()],
        }
    }

    /// Whether `job` fits `home` when empty on the nodes of one GPU type, each type taken as
    /// nodes of its largest size.
    fn fits(job: &SimJob, home: &HomeCluster) -> bool {
        home.gpu_types
            .iter()
            .filter(|t| job.gpu_type.as_ref().is_none_or(|name| &t.name == name))
            .any(|t| fits_type(job, std::slice::from_ref(t)))
    }

    fn fits_type(job: &SimJob, types: &[HomeGpuType]) -> bool {
        let gpus: u64 = types.iter().map(|t| t.gpus).sum();
        let largest_node = types.iter().map(|t| t.gpus_per_node).max().unwrap_or(0);
        let slots: u64 = types
            .iter()
            .map(|t| t.gpus / u64::from(t.gpus_per_node) * u64::from(t.gpus_per_node / job.gpus_per_replica))
            .sum();
        !types.is_empty()
            && job.replicas >= 1
            && job.gpus_per_replica >= 1
            && job.gpus() <= gpus
            && job.gpus_per_replica <= largest_node
            && u64::from(job.replicas) <= slots
    }

    #[test]
    fn assign_homes_balances_demand_longest_first() {
        let homes = vec![home(0, "r", vec![gpu_type("h100", 8, 8)]), home(1, "r", vec![gpu_type("h100", 8, 8)])];
        let jobs = vec![raw("b", 1, 60), raw("a", 1, 100), raw("c", 2, 20)];
        let homes_of = assign_homes(&jobs, &homes);
        let expected: BTreeMap<String, usize> = [("a".into(), 0), ("b".into(), 1), ("c".into(), 1)].into();
        assert_eq!(homes_of, expected);
    }

    #[test]
    fn assign_homes_weighs_homes_by_their_gpus() {
        let homes = vec![home(0, "r", vec![gpu_type("h100", 8, 8)]), home(1, "r", vec![gpu_type("h100", 24, 8)])];
        let jobs: Vec<RawJob> = ["a", "b", "c", "d"].iter().map(|t| raw(t, 1, 100)).collect();
        let homes_of = assign_homes(&jobs, &homes);
        // Equal demands go in name order: a → 0 (tie), b → 1, c → 1 (100/24 < 100/8), d → 1 (200/24 < 100/8).
        let expected: BTreeMap<String, usize> =
            [("a".into(), 0), ("b".into(), 1), ("c".into(), 1), ("d".into(), 1)].into();
        assert_eq!(homes_of, expected);
        assert!(assign_homes(&jobs, &[]).is_empty());
        let empty = vec![home(0, "r", vec![]), home(1, "r", vec![gpu_type("h100", 8, 8)])];
        assert!(assign_homes(&jobs, &empty).values().all(|&h| h == 1));
    }

    #[test]
    fn gangs_spread_over_nodes_and_shrink_to_fit() {
        let one = [gpu_type("h100", 64, 8)];
        let shape = |gpus| {
            let s = fit_gang(gpus, &one);
            (s.replicas, s.gpus_per_replica)
        };
        assert_eq!(shape(1), (1, 1));
        assert_eq!(shape(8), (1, 8));
        assert_eq!(shape(9), (2, 5));
        assert_eq!(shape(12), (2, 6));
        assert_eq!(shape(32), (4, 8));
        assert_eq!(shape(128), (8, 8));
        assert_eq!(shape(0), (1, 1));
        // One 8-GPU node and many 4-GPU nodes: 16 GPUs run as 4 × 4, not on one node twice.
        let mixed = [gpu_type("h100", 8, 8), gpu_type("l4", 256, 4)];
        assert_eq!(fit_gang(16, &mixed), Shape { replicas: 4, gpus_per_replica: 4 });
        assert_eq!(fit_gang(8, &mixed), Shape { replicas: 1, gpus_per_replica: 8 });
        assert_eq!(fit_gang(1_000, &mixed).gpus(), 264);
        assert_eq!(fit_gang(4, &[]), Shape { replicas: 1, gpus_per_replica: 1 });
    }

    #[test]
    fn every_job_fits_its_home_and_about_a_third_are_pinned() {
        let facts = fleet();
        let sizes = [1, 1, 1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 256, 512, 1_000];
        let jobs: Vec<RawJob> = (0..3_000)
            .map(|i| RawJob {
                submit_secs: i,
                duration_secs: 100 + i * 7 % 5_000,
                gpus: sizes[i as usize % sizes.len()],
                tenant: format!("t{:02}", i % 7),
                gpu_memory_gib: 0,
            })
            .collect();
        let workload = decorate(jobs.clone(), &facts, 42, "test".into());
        assert_eq!(workload.source, "test");
        assert_eq!(workload.tenants.len(), 7);
        assert!(workload.tenants.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(workload.jobs.len(), jobs.len());

        let mut pinned = 0;
        let mut with_data = 0;
        let mut at_home = 0;
        for (index, (job, raw)) in workload.jobs.iter().zip(&jobs).enumerate() {
            assert_eq!(job.id as usize, index);
            assert_eq!((job.submit_secs, job.duration_secs), (raw.submit_secs, raw.duration_secs));
            let tenant = &workload.tenants[job.tenant as usize];
            assert_eq!(tenant.name, raw.tenant);
            let home = facts.homes.iter().find(|h| h.cluster == tenant.home).unwrap();
            assert!(fits(job, home), "{job:?} does not fit {home:?}");
            if job.gpus() < u64::from(raw.gpus) {
                let capacity: u64 = home.gpu_types.iter().map(|t| t.gpus).sum();
                assert!(u64::from(raw.gpus) > capacity || job.gpu_type.is_some(), "{job:?} shrank from {raw:?}");
            }
            if let Some(name) = &job.gpu_type {
                pinned += 1;
                assert!(home.gpu_types.iter().any(|t| &t.name == name));
            }
            if let Some(dataset) = &job.dataset {
                with_data += 1;
                assert!(facts.regions.contains(&dataset.region));
                let scale = 1.0 + (job.gpus() as f64).log2() / 2.0;
                assert!(dataset.size_gib >= scale - 1e-9 && dataset.size_gib <= 4_000.0 * scale + 1e-9);
                if dataset.region == home.region {
                    at_home += 1;
                }
            }
        }
        let share = |count: usize, of: usize| count as f64 / of as f64;
        assert!((0.25..=0.42).contains(&share(pinned, jobs.len())), "pinned {pinned}");
        assert!((0.80..=0.90).contains(&share(with_data, jobs.len())), "with data {with_data}");
        assert!((0.70..=0.80).contains(&share(at_home, with_data)), "at home {at_home} of {with_data}");

        assert_eq!(workload, decorate(jobs.clone(), &facts, 42, "test".into()));
        assert_ne!(workload, decorate(jobs, &facts, 43, "test".into()));
    }

    #[test]
    fn dataset_sizes_center_on_40_gib_for_one_gpu() {
        let facts = fleet();
        let jobs: Vec<RawJob> = (0..4_000).map(|i| raw("a", 1, 60 + i)).collect();
        let workload = decorate(jobs, &facts, 1, String::new());
        let mut sizes: Vec<f64> = workload.jobs.iter().filter_map(|j| j.dataset.as_ref()).map(|d| d.size_gib).collect();
        sizes.sort_by(f64::total_cmp);
        let median = sizes[sizes.len() / 2];
        assert!((32.0..50.0).contains(&median), "{median}");
    }

    #[test]
    fn a_single_region_fleet_keeps_data_at_home() {
        let facts =
            FleetFacts { homes: vec![home(5, "only", vec![gpu_type("a100", 16, 8)])], regions: vec!["only".into()] };
        let workload = decorate((0..200).map(|i| raw("a", 4, 60 + i)).collect(), &facts, 3, String::new());
        assert_eq!(workload.tenants, vec![Tenant { name: "a".into(), home: 5 }]);
        assert!(workload.jobs.iter().filter_map(|j| j.dataset.as_ref()).all(|d| d.region == "only"));
    }

    #[test]
    fn no_homes_does_not_panic() {
        let facts = FleetFacts { homes: Vec::new(), regions: Vec::new() };
        let workload = decorate(vec![raw("a", 4, 60)], &facts, 3, String::new());
        assert_eq!(workload.tenants[0].home, 0);
        assert_eq!(workload.jobs[0].gpus(), 4);
        assert!(decorate(Vec::new(), &facts, 3, String::new()).jobs.is_empty());
    }
}
