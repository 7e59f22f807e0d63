//! What quotas cost a placement round, and what `maxQueuedJobs` saves: rounds over 10,000 queued
//! 8-GPU jobs of one tenant, driven through `Core::step` as the runtime drives it.
//!
//! `cargo bench -p meridian-core --bench quota_round` (release). Prints the first round (which
//! writes every job's explanation) and the median of the next 20 (steady state) per case.

use std::collections::BTreeMap;
use std::time::Instant;

use meridian_core::{Core, CoreConfig, Effects, Input, Loaded, TenantQuota};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, ClusterInfo, Inventory, NodeFree, NodeShape, Tier};
use meridian_proto::protocol::{AgentEvent, AgentHello};
use meridian_proto::validate::parse_job_spec;

const QUEUED: usize = 10_000;
const NODES: usize = 64;
const JOB: &str = "name: j\ntenant: nlp\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n";

fn cluster(free_gpus: u32) -> (AgentHello, AgentEvent) {
    let info = ClusterInfo {
        name: "east".into(),
        region: "us-east".into(),
        tier: Tier::Owned,
        backend: BackendKind::Builtin,
        prices: BTreeMap::from([("h100".to_string(), 2.0)]),
        supports_containers: true,
        supports_bare_commands: true,
        labels: Default::default(),
    };
    let hello = AgentHello { info, instance_id: "a1".into(), agent_version: "bench".into() };
    let inventory = AgentEvent::Inventory(Inventory {
        shapes: vec![NodeShape {
            name: "dgx".into(),
            gpu_type: "h100".into(),
            gpu_memory_gib: 80,
            gpus_per_node: 8,
            cpu_per_node: 96,
            memory_gib_per_node: 1024,
            free: vec![NodeFree { gpus: free_gpus, cpu: 96, memory_gib: 1024 }; NODES],
            labels: Default::default(),
        }],
    });
    (hello, inventory)
}

/// Builds a core with `QUEUED` queued jobs (plus `held` jobs offered first), runs rounds, and
/// returns the first round, the fastest and the median of the next 50 (ms), and the offers made.
fn measure(config: CoreConfig, free_gpus: u32, held: usize) -> (f64, f64, f64, usize) {
    let mut now_ms = 1_800_000_000_000;
    let mut core = Core::new(config, Loaded::default(), now_ms, 1);
    let mut fx = Effects::default();
    let (hello, inventory) = cluster(free_gpus);
    core.step(Input::AgentHello { conn: 1, hello, reply: 0 }, now_ms, &mut fx);
    core.step(Input::Agent { conn: 1, event: inventory }, now_ms, &mut fx);
    let spec = parse_job_spec(JOB, &GpuCatalog::default()).unwrap_or_else(|e| panic!("{e}"));
    for reply in 0..held {
        core.step(Input::Submit { spec: spec.clone(), reply: reply as u64 }, now_ms, &mut fx);
    }
    core.step(Input::Round, now_ms, &mut fx);
    for reply in 0..QUEUED {
        now_ms += 1;
        core.step(Input::Submit { spec: spec.clone(), reply: reply as u64 }, now_ms, &mut fx);
    }
    let mut round = |now_ms: i64| {
        let mut fx = Effects::default();
        let started = Instant::now();
        core.step(Input::Round, now_ms, &mut fx);
        let took = started.elapsed().as_secs_f64() * 1000.0;
        (took, fx.sends.len())
    };
    let (first, offers) = round(now_ms);
    let mut steady: Vec<f64> = (0..50).map(|i| round(now_ms + 1 + i).0).collect();
    steady.sort_by(f64::total_cmp);
    (first, steady[0], steady[steady.len() / 2], offers)
}

fn with(quota: TenantQuota) -> CoreConfig {
    CoreConfig { quotas: BTreeMap::from([("nlp".to_string(), quota)]), ..Default::default() }
}

fn main() {
    println!("{QUEUED} queued 8-GPU jobs of one tenant, one cluster of {NODES} 8-GPU nodes");
    println!("{:<62} {:>9} {:>11} {:>13} {:>7}", "case", "first ms", "fastest ms", "median ms", "offers");
    let cases: Vec<(&str, CoreConfig, u32, usize)> = vec![
        ("no quota, cluster full", CoreConfig::default(), 0, 0),
        ("maxQueuedJobs 100, cluster full", with(TenantQuota { max_queued_jobs: Some(100), max_gpus: None }), 0, 0),
        (
            "maxGpus 8 reached (1 job offered), GPUs free",
            with(TenantQuota { max_gpus: Some(8), max_queued_jobs: None }),
            8,
            1,
        ),
        (
            "maxGpus 8 + maxQueuedJobs 100, limit reached, GPUs free",
            with(TenantQuota { max_gpus: Some(8), max_queued_jobs: Some(100) }),
            8,
            1,
        ),
        (
            "another tenant has a quota; nlp has none, cluster full",
            CoreConfig {
                quotas: BTreeMap::from([(
                    "vision".to_string(),
                    TenantQuota { max_gpus: Some(8), max_queued_jobs: Some(100) },
                )]),
                ..Default::default()
            },
            0,
            0,
        ),
    ];
    for (name, config, free, held) in cases {
        let (first, fastest, median, offers) = measure(config, free, held);
        println!("{name:<62} {first:>9.2} {fastest:>11.3} {median:>13.3} {offers:>7}");
    }
}
