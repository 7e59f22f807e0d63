//! What quotas cost a placement round, and what `maxQueuedJobs` saves: rounds over 10,000 queued
//! 8-GPU jobs of one tenant, driven through `Core::step` as the runtime drives it.
//!
//! `cargo bench -p meridian-core --bench quota_round` (release). Prints the first round (which
//! writes every job's explanation) and the median of the next 50 (steady state) per case. Under
//! `cargo test --bench '*'` (the test suite) it makes one short pass: 200 jobs, 3 steady rounds.

use std::collections::BTreeMap;
use std::time::Instant;

use meridian_core::{Core, CoreConfig, Effects, Input, Loaded, TenantQuota};
use meridian_proto::protocol::AgentHello;
use meridian_proto::testing::{JOB, hello, inventory_event, spec};

const NODES: usize = 64;

/// The sizes of one run: the full bench (`cargo bench` passes `--bench`) or the short pass.
#[derive(Clone, Copy)]
struct Scale {
    /// Jobs queued before the measured rounds.
    queued: usize,
    /// Steady rounds measured after the first.
    steady_rounds: i64,
}

/// Builds a core with `scale.queued` queued jobs (plus `held` jobs offered first), runs rounds,
/// and returns the first round, the fastest and the median of the steady ones (ms), and the
/// offers made.
fn measure(scale: Scale, config: CoreConfig, free_gpus: u32, held: usize) -> (f64, f64, f64, usize) {
    let mut now_ms = 1_800_000_000_000;
    let mut core = Core::new(config, Loaded::default(), now_ms, 1);
    let mut fx = Effects::default();
    // One owned cluster `east` of `NODES` 8-GPU nodes, each with `free_gpus` free.
    let agent = AgentHello { agent_version: "bench".into(), ..hello("east", "a1") };
    core.step(Input::AgentHello { conn: 1, hello: agent, reply: 0 }, now_ms, &mut fx);
    core.step(Input::Agent { conn: 1, event: inventory_event(&[free_gpus; NODES]) }, now_ms, &mut fx);
    // The fixture's 8-GPU job, in tenant `nlp`.
    let spec = spec(&JOB.replace("tenant: t", "tenant: nlp"));
    for reply in 0..held {
        core.step(Input::Submit { spec: spec.clone(), reply: reply as u64 }, now_ms, &mut fx);
    }
    core.step(Input::Round, now_ms, &mut fx);
    for reply in 0..scale.queued {
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
    let mut steady: Vec<f64> = (0..scale.steady_rounds).map(|i| round(now_ms + 1 + i).0).collect();
    steady.sort_by(f64::total_cmp);
    (first, steady[0], steady[steady.len() / 2], offers)
}

fn with(quota: TenantQuota) -> CoreConfig {
    CoreConfig { quotas: BTreeMap::from([("nlp".to_string(), quota)]), ..Default::default() }
}

fn main() {
    let scale = if std::env::args().any(|a| a == "--bench") {
        Scale { queued: 10_000, steady_rounds: 50 }
    } else {
        println!("(short pass: `cargo bench` runs the full bench; these figures are no result)\n");
        Scale { queued: 200, steady_rounds: 3 }
    };
    println!("{} queued 8-GPU jobs of one tenant, one cluster of {NODES} 8-GPU nodes", scale.queued);
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
        let (first, fastest, median, offers) = measure(scale, config, free, held);
        println!("{name:<62} {first:>9.2} {fastest:>11.3} {median:>13.3} {offers:>7}");
    }
}
