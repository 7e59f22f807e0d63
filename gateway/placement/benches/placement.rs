//! Placement speed: one decision against 100 realistic clusters, and a whole placement cycle of
//! 10,000 queued jobs with reservations; and one decision against 1,000 clusters (the same kind of
//! clusters, ten times as many), the scale of the gateway's 1,000-agent bench.
//!
//! Run with `cargo bench -p meridian-placement --bench placement`. Before criterion's runs it prints
//! per-decision latency percentiles (p50/p99/p99.9) over the 10,000 jobs, which criterion's mean
//! does not show. Inputs come from a fixed seed, so every run measures the same work.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use meridian_placement::{self as placement, ClusterSnapshot, FederationSnapshot, NetworkTable, PlacementConfig};
use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::{
    BackendKind, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure, Tier,
};
use meridian_proto::spec::{BurstPolicy, ClusterRules, DataRef, JobSpec, PlacementRules, Resources};
use meridian_proto::testing;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CLUSTERS: usize = 100;
/// The large federation: ten times as many clusters, drawn the same way.
const MANY_CLUSTERS: usize = 1_000;
const JOBS: usize = 10_000;
const SEED: u64 = 0x6d65_7269_6469_616e; // "meridian"
const REGIONS: [&str; 5] = ["us-east", "us-west", "eu-west", "eu-central", "ap-northeast"];

/// (name, GPU type, GiB per GPU, GPUs, CPUs, host GiB per node, owned US$/GPU-h, cloud US$/GPU-h range)
type ShapeKind = (&'static str, &'static str, u32, u32, u32, u32, f64, (f64, f64));
const SHAPES: [ShapeKind; 3] = [
    ("dgx-h100", "h100", 80, 8, 112, 2048, 2.0, (3.0, 12.0)),
    ("hgx-a100-80g", "a100-80g", 80, 8, 128, 1024, 1.2, (1.3, 4.0)),
    ("l4-x4", "l4", 24, 4, 48, 192, 0.4, (0.7, 1.0)),
];

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

fn federation(rng: &mut StdRng, clusters: usize) -> FederationSnapshot {
    let clusters = (0..clusters).map(|i| cluster(rng, i)).collect();
    FederationSnapshot::new(clusters, NetworkTable::default_seeded())
}

fn cluster(rng: &mut StdRng, index: usize) -> ClusterSnapshot {
    let tier = if rng.random_bool(0.3) { Tier::Cloud } else { Tier::Owned };
    let backend = *pick(rng, &[BackendKind::Builtin, BackendKind::Slurm, BackendKind::Kubernetes]);
    let utilisation = rng.random_range(0.3..0.97);
    let mut shapes = Vec::new();
    let mut prices = BTreeMap::new();
    let first = rng.random_range(0..SHAPES.len());
    for k in 0..rng.random_range(1..=SHAPES.len()) {
        let (name, gpu_type, gib, gpus, cpu, mem, owned, (lo, hi)) = SHAPES[(first + k) % SHAPES.len()];
        let nodes = rng.random_range(4..=256);
        let free = (0..nodes)
            .map(|_| {
                let r: f64 = rng.random();
                let g = if r < utilisation * 0.75 {
                    0
                } else if r < utilisation {
                    rng.random_range(1..gpus)
                } else {
                    gpus
                };
                NodeFree { gpus: g, cpu: cpu * g / gpus, memory_gib: mem * g / gpus }
            })
            .collect();
        shapes.push(NodeShape {
            name: name.to_owned(),
            gpu_type: gpu_type.to_owned(),
            gpu_memory_gib: gib,
            gpus_per_node: gpus,
            cpu_per_node: cpu,
            memory_gib_per_node: mem,
            free,
            labels: Default::default(),
        });
        let price = if tier == Tier::Cloud { rng.random_range(lo..hi) } else { owned };
        prices.insert(gpu_type.to_owned(), price);
    }
    let total: u32 = shapes.iter().map(NodeShape::gpus_total).sum();
    let releases = (1..=rng.random_range(0..6u64))
        .map(|k| GpuRelease { after_secs: k * rng.random_range(300..3600), gpus: rng.random_range(1..=total / 8 + 1) })
        .collect();
    let pressure = QueuePressure {
        queues: vec![QueueLoad {
            queue: "default".into(),
            weight: 1.0,
            pending_jobs: rng.random_range(0..50),
            pending_gpus: rng.random_range(0..=total / 4),
            running_gpus: total / 2,
        }],
        releases,
        estimated_wait_secs: rng.random_range(0..14_400),
        preemptible: Vec::new(),
    };
    let mut info = testing::cluster_info(&format!("{}-{index:03}", if tier == Tier::Cloud { "cloud" } else { "dc" }));
    info.region = (*pick(rng, &REGIONS)).to_owned();
    info.tier = tier;
    info.backend = backend;
    info.prices = prices;
    info.supports_containers = backend != BackendKind::Slurm || rng.random_bool(0.5);
    info.supports_bare_commands = backend != BackendKind::Kubernetes;
    ClusterSnapshot::new(info, Inventory { shapes }, pressure, rng.random_bool(0.97))
}

fn job(rng: &mut StdRng, index: usize) -> JobSpec {
    let r: f64 = rng.random();
    let (replicas, gpus) = if r < 0.70 {
        (1, 1)
    } else if r < 0.80 {
        (1, *pick(rng, &[2, 4]))
    } else if r < 0.93 {
        (1, 8)
    } else {
        (rng.random_range(2..=8), 8)
    };
    let gpu_types = match rng.random_range(0..10) {
        0..5 => vec![],
        5..7 => vec!["h100".to_owned()],
        7..9 => vec!["a100-80g".to_owned(), "h100".to_owned()],
        _ => vec!["l4".to_owned()],
    };
    let data = if rng.random_bool(0.5) {
        vec![DataRef {
            uri: format!("s3://datasets/{index}"),
            size_gib: rng.random_range(10.0..5000.0),
            region: (*pick(rng, &REGIONS)).to_owned(),
        }]
    } else {
        vec![]
    };
    let burst = match rng.random_range(0..10) {
        0 => BurstPolicy::Never,
        1 => BurstPolicy::After { after: HumanDuration::from_secs(1800), max_usd_per_hour: Some(40.0) },
        _ => BurstPolicy::default(),
    };
    let regions = if rng.random_bool(0.1) { vec![(*pick(rng, &REGIONS)).to_owned()] } else { vec![] };
    let mut spec = testing::spec(testing::JOB);
    spec.name = format!("job-{index}");
    spec.tenant = format!("tenant-{}", rng.random_range(0..15));
    spec.gang.replicas = replicas;
    spec.gang.resources = Resources { gpus, gpu_types, gpu_memory_gib: 0, cpu: 8 * gpus, memory_gib: 64 * gpus };
    spec.runtime.estimate = HumanDuration::from_secs(rng.random_range(60..36_000));
    spec.data = data;
    spec.placement = PlacementRules { regions, clusters: ClusterRules::default(), burst, ..PlacementRules::default() };
    spec.payload.image = Some("registry.example/train:1".into());
    spec.payload.command.clear();
    spec
}

fn inputs() -> (FederationSnapshot, Vec<JobSpec>) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let fed = federation(&mut rng, CLUSTERS);
    let jobs = (0..JOBS).map(|i| job(&mut rng, i)).collect();
    (fed, jobs)
}

/// Times each of the 10,000 decisions on its own (against the unreserved snapshot) and prints
/// percentiles, plus one full cycle with reservations.
fn latency_report(fed: &FederationSnapshot, jobs: &[JobSpec], config: &PlacementConfig) {
    let nodes: usize = fed.clusters.iter().flat_map(|c| &c.inventory().shapes).map(|s| s.free.len()).sum();
    let gpus: u32 = fed.clusters.iter().map(|c| c.inventory().gpus_total()).sum();
    println!("federation: {} clusters, {nodes} nodes, {gpus} GPUs; {} jobs", fed.clusters.len(), jobs.len());
    // What the gateway pays once per placement cycle to build the snapshot (and its index).
    let start = Instant::now();
    let rebuilt: Vec<ClusterSnapshot> = fed
        .clusters
        .iter()
        .map(|c| ClusterSnapshot::new(c.info().clone(), c.inventory().clone(), (*c.pressure).clone(), c.connected))
        .collect();
    println!("building the snapshot of {} clusters: {:?}", black_box(rebuilt).len(), start.elapsed());
    for job in jobs.iter().take(1000) {
        black_box(placement::place(job, fed, config)); // warm caches and branch predictors
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(jobs.len());
    let mut starts_now = 0;
    for job in jobs {
        let start = Instant::now();
        let decision = black_box(placement::place(job, fed, config));
        starts_now += usize::from(decision.chosen.as_ref().is_some_and(|c| c.starts_now));
        drop(decision); // freeing the decision is part of its cost, as in criterion's loop
        samples.push(start.elapsed());
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let total: Duration = samples.iter().sum();
    println!(
        "per decision (no reserve): mean {:?}, p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?} => {:.0} decisions/s; \
         {starts_now} could start now",
        total / samples.len() as u32,
        at(0.50),
        at(0.99),
        at(0.999),
        samples[samples.len() - 1],
        samples.len() as f64 / total.as_secs_f64()
    );

    kept_report(fed, jobs, config);

    let mut cycle = fed.clone();
    let start = Instant::now();
    let placed = place_all(&mut cycle, jobs, config);
    let elapsed = start.elapsed();
    println!(
        "cycle with reserve: {} decisions in {elapsed:?} => {:.0} decisions/s; {placed} placed now",
        jobs.len(),
        jobs.len() as f64 / elapsed.as_secs_f64()
    );
}

/// What a queued job's kept decision holds, full and compacted as the gateway keeps it (names
/// are shared with the snapshot, not counted), over the first 1,000 jobs.
fn kept_report(fed: &FederationSnapshot, jobs: &[JobSpec], config: &PlacementConfig) {
    let (mut full, mut compact) = ((0usize, 0usize), (0usize, 0usize));
    let sample = jobs.len().min(1000);
    for job in &jobs[..sample] {
        let decision = placement::place(job, fed, config);
        full = (full.0 + decision.candidates.len(), full.1 + held_bytes(&decision));
        let kept = decision.compact(placement::KEPT_FEASIBLE);
        compact = (compact.0 + kept.candidates.len(), compact.1 + held_bytes(&kept));
    }
    println!(
        "a kept decision, mean of {sample}: {} candidates, {} bytes; compacted ({} feasible kept): \
         {} candidates, {} bytes",
        full.0 / sample,
        full.1 / sample,
        placement::KEPT_FEASIBLE,
        compact.0 / sample,
        compact.1 / sample
    );
}

/// Heap and inline bytes a decision holds of its own: the struct, its candidate list, and the
/// reason lists of clusters with more than one reason.
fn held_bytes(decision: &placement::Decision) -> usize {
    let reasons: usize = decision
        .candidates
        .iter()
        .map(|c| c.reasons().len())
        .filter(|&n| n > 1)
        .map(|n| n * std::mem::size_of::<placement::Rejection>())
        .sum();
    let omitted = decision.omitted.as_ref().map_or(0, |o| {
        std::mem::size_of::<placement::Omitted>()
            + o.rejected.capacity() * std::mem::size_of::<placement::OmittedRejections>()
    });
    std::mem::size_of::<placement::Decision>()
        + decision.candidates.capacity() * std::mem::size_of::<placement::Candidate>()
        + reasons
        + omitted
}

/// One placement cycle: place each job, reserve where it starts now.
fn place_all(fed: &mut FederationSnapshot, jobs: &[JobSpec], config: &PlacementConfig) -> usize {
    let mut placed = 0;
    for job in jobs {
        let decision = placement::place(job, fed, config);
        if let Some(choice) = decision.chosen.filter(|c| c.starts_now)
            && let Some(cluster) = fed.cluster_mut(&choice.cluster)
            && cluster.reserve(job)
        {
            placed += 1;
        }
    }
    placed
}

fn bench_placement(c: &mut Criterion) {
    let (fed, jobs) = inputs();
    let config = PlacementConfig::default();
    if std::env::args().any(|a| a == "--bench") {
        latency_report(&fed, &jobs, &config);
    }
    let mut next = 0;
    c.bench_function("place/one_decision_100_clusters", |b| {
        b.iter(|| {
            next = (next + 1) % jobs.len();
            black_box(placement::place(&jobs[next], &fed, &config))
        })
    });
    let mut group = c.benchmark_group("place");
    group.sample_size(10);
    group.bench_function("cycle_10000_jobs_with_reserve", |b| {
        b.iter_batched(|| fed.clone(), |mut cycle| place_all(&mut cycle, &jobs, &config), BatchSize::LargeInput)
    });
    group.finish();

    // 1,000 clusters: one decision, as above. Its own seed, so the 100-cluster inputs stay as
    // they were.
    let many = federation(&mut StdRng::seed_from_u64(SEED ^ 1), MANY_CLUSTERS);
    if std::env::args().any(|a| a == "--bench") {
        many_report(&many, &jobs, &config);
    }
    let mut next = 0;
    let mut group = c.benchmark_group("place");
    group.sample_size(20);
    group.bench_function("one_decision_1000_clusters", |b| {
        b.iter(|| {
            next = (next + 1) % jobs.len();
            black_box(placement::place(&jobs[next], &many, &config))
        })
    });
    group.finish();
}

/// Per-decision percentiles against the 1,000-cluster federation, over the first 2,000 jobs.
fn many_report(fed: &FederationSnapshot, jobs: &[JobSpec], config: &PlacementConfig) {
    let nodes: usize = fed.clusters.iter().flat_map(|c| &c.inventory().shapes).map(|s| s.free.len()).sum();
    println!("federation: {} clusters, {nodes} nodes", fed.clusters.len());
    let jobs = &jobs[..jobs.len().min(2_000)];
    for job in jobs.iter().take(200) {
        black_box(placement::place(job, fed, config));
    }
    let mut samples: Vec<Duration> = jobs
        .iter()
        .map(|job| {
            let start = Instant::now();
            drop(black_box(placement::place(job, fed, config)));
            start.elapsed()
        })
        .collect();
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let total: Duration = samples.iter().sum();
    println!(
        "per decision at 1,000 clusters: mean {:?}, p50 {:?}, p99 {:?} => {:.0} decisions/s",
        total / samples.len() as u32,
        at(0.50),
        at(0.99),
        samples.len() as f64 / total.as_secs_f64()
    );
    kept_report(fed, jobs, config);
}

fn main() {
    // What `criterion_group!`/`criterion_main!` would write, without their undocumented `pub fn`.
    let mut criterion = Criterion::default().configure_from_args();
    bench_placement(&mut criterion);
    criterion.final_summary();
}
