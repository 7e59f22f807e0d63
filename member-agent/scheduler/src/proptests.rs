//! Properties of the whole scheduler under random sequences of calls, checked through its public
//! API only: no node is ever over-committed, every started gang is whole, and no job is both
//! pending and running.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::{BuiltinScheduler, LocalJob, NodeSpec, QueuePolicy, QueueSpec, Started};

/// One call on the scheduler.
#[derive(Debug, Clone)]
enum Op {
    Submit(JobShape),
    StartNow(JobShape),
    Schedule,
    /// Advance the clock this many seconds, then complete what is due.
    Advance(u64),
    /// Cancel the job with this sequence number (it may be pending, running, done or unknown).
    Cancel(u32),
}

/// A random job, before it gets an id.
#[derive(Debug, Clone)]
struct JobShape {
    queue: usize,
    priority: u32,
    replicas: u32,
    gpus: u32,
    cpu: u32,
    memory_gib: u32,
    wants_a100: bool,
    gpu_memory_gib: u32,
    run_secs: u64,
}

const QUEUES: [&str; 3] = ["default", "research", "prod"];

fn nodes() -> Vec<NodeSpec> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(NodeSpec {
            name: format!("h100-{i}"),
            shape: "dgx-h100".into(),
            gpu_type: "h100".into(),
            gpu_memory_gib: 80,
            gpus: 8,
            cpu: 32,
            memory_gib: 256,
            labels: Default::default(),
        });
    }
    for i in 0..3 {
        nodes.push(NodeSpec {
            name: format!("a100-{i}"),
            shape: "a100-40".into(),
            gpu_type: "a100".into(),
            gpu_memory_gib: 40,
            gpus: 4,
            cpu: 16,
            memory_gib: 128,
            labels: Default::default(),
        });
    }
    nodes
}

fn job_shape() -> impl Strategy<Value = JobShape> {
    (
        0..QUEUES.len(),
        0u32..3,
        1u32..5,
        1u32..9,
        0u32..20,
        0u32..150,
        any::<bool>(),
        prop_oneof![Just(0u32), Just(60)],
        0u64..50,
    )
        .prop_map(|(queue, priority, replicas, gpus, cpu, memory_gib, wants_a100, gpu_memory_gib, run_secs)| {
            JobShape {
                queue,
                priority: priority * 25,
                replicas,
                gpus,
                cpu,
                memory_gib,
                wants_a100,
                gpu_memory_gib,
                run_secs,
            }
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => job_shape().prop_map(Op::Submit),
        2 => job_shape().prop_map(Op::StartNow),
        3 => Just(Op::Schedule),
        2 => (0u64..40).prop_map(Op::Advance),
        1 => (0u32..60).prop_map(Op::Cancel),
    ]
}

impl JobShape {
    fn into_job(self, id: u32) -> LocalJob {
        LocalJob {
            id: format!("job-{id}"),
            queue: QUEUES[self.queue].into(),
            priority: self.priority,
            replicas: self.replicas,
            gpus: self.gpus,
            cpu: self.cpu,
            memory_gib: self.memory_gib,
            gpu_types: if self.wants_a100 { vec!["a100".into()] } else { Vec::new() },
            gpu_memory_gib: self.gpu_memory_gib,
            node_selector: Default::default(),
            run_for: Duration::from_secs(self.run_secs),
        }
    }
}

/// Checks every property that must hold between calls.
fn check(scheduler: &BuiltinScheduler, specs: &BTreeMap<String, NodeSpec>) -> Result<(), TestCaseError> {
    // Recompute what running jobs hold on each node from their assignments.
    let mut held: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for running in scheduler.running() {
        let job = &running.job;
        prop_assert_eq!(running.nodes.len() as u64, u64::from(job.replicas), "gang of {} is not whole", job.id);
        for name in &running.nodes {
            let spec = specs.get(name).ok_or_else(|| TestCaseError::fail(format!("unknown node {name}")))?;
            prop_assert!(
                job.accepts_gpu(&spec.gpu_type, spec.gpu_memory_gib),
                "{} on unacceptable node {}",
                job.id,
                name
            );
            let entry = held.entry(name.as_str()).or_default();
            entry.0 += u64::from(job.gpus);
            entry.1 += u64::from(job.cpu);
            entry.2 += u64::from(job.memory_gib);
        }
    }
    let inventory = scheduler.inventory();
    let mut reported = 0;
    for shape in &inventory.shapes {
        let members: Vec<&NodeSpec> = specs.values().filter(|s| s.shape == shape.name).collect();
        prop_assert_eq!(members.len(), shape.free.len());
        reported += shape.free.len();
    }
    prop_assert_eq!(reported, specs.len());
    // Inventory lists nodes in declaration order within each shape.
    let declared = nodes();
    let mut free_by_name = BTreeMap::new();
    for shape in &inventory.shapes {
        let names = declared.iter().filter(|n| n.shape == shape.name).map(|n| n.name.as_str());
        for (name, free) in names.zip(&shape.free) {
            free_by_name.insert(name, *free);
        }
    }
    for (name, spec) in specs {
        let (gpus, cpu, memory) = held.get(name.as_str()).copied().unwrap_or_default();
        prop_assert!(gpus <= u64::from(spec.gpus), "{name}: {gpus} GPUs held of {}", spec.gpus);
        prop_assert!(cpu <= u64::from(spec.cpu), "{name}: {cpu} CPU held of {}", spec.cpu);
        prop_assert!(memory <= u64::from(spec.memory_gib), "{name}: {memory} GiB held of {}", spec.memory_gib);
        let free = free_by_name[name.as_str()];
        prop_assert_eq!(u64::from(free.gpus), u64::from(spec.gpus) - gpus, "{} free GPUs disagree", name);
        prop_assert_eq!(u64::from(free.cpu), u64::from(spec.cpu) - cpu, "{} free CPU disagrees", name);
        prop_assert_eq!(
            u64::from(free.memory_gib),
            u64::from(spec.memory_gib) - memory,
            "{} free memory disagrees",
            name
        );
    }
    let running: BTreeSet<&str> = scheduler.running().map(|r| r.job.id.as_str()).collect();
    let pending: Vec<&str> = scheduler.pending().map(|p| p.job.id.as_str()).collect();
    let pending_set: BTreeSet<&str> = pending.iter().copied().collect();
    prop_assert_eq!(pending.len(), pending_set.len(), "a job is pending twice");
    prop_assert!(running.is_disjoint(&pending_set), "a job is both pending and running");
    let pressure = scheduler.pressure(Duration::ZERO);
    prop_assert!(pressure.releases.len() <= super::MAX_RELEASE_BUCKETS);
    prop_assert!(pressure.releases.windows(2).all(|w| w[0].after_secs < w[1].after_secs));
    Ok(())
}

fn check_started(started: &Started, scheduler: &BuiltinScheduler, now: Duration) -> Result<(), TestCaseError> {
    let running = scheduler
        .running()
        .find(|r| r.job.id == started.job_id)
        .ok_or_else(|| TestCaseError::fail(format!("started {} is not running", started.job_id)))?;
    prop_assert_eq!(&started.nodes, &running.nodes);
    prop_assert_eq!(started.nodes.len() as u64, u64::from(running.job.replicas));
    prop_assert_eq!(started.ends_at, now + running.job.run_for);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_calls_never_overcommit_a_node_or_split_a_gang(ops in prop::collection::vec(op(), 1..120)) {
        let queues = vec![
            QueueSpec { policy: QueuePolicy::Strict, ..QueueSpec::new("default", 1.0) },
            QueueSpec { policy: QueuePolicy::BestEffort, ..QueueSpec::new("research", 2.0) },
            QueueSpec { policy: QueuePolicy::Backfill, ..QueueSpec::new("prod", 0.5) },
        ];
        let mut scheduler = BuiltinScheduler::new(nodes(), queues).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let specs: BTreeMap<String, NodeSpec> = nodes().into_iter().map(|n| (n.name.clone(), n)).collect();
        let mut now = Duration::ZERO;
        let mut next_id = 0u32;
        for op in ops {
            match op {
                Op::Submit(shape) => {
                    let job = shape.into_job(next_id);
                    next_id += 1;
                    let fits = scheduler.can_ever_fit(&job);
                    let id = job.id.clone();
                    let result = scheduler.submit(job, now);
                    prop_assert_eq!(result.is_ok(), fits, "submit of {} disagrees with can_ever_fit", id);
                }
                Op::StartNow(shape) => {
                    let job = shape.into_job(next_id);
                    next_id += 1;
                    let before = scheduler.inventory();
                    match scheduler.start_now(job, now) {
                        Ok(started) => check_started(&started, &scheduler, now)?,
                        Err(_) => prop_assert_eq!(scheduler.inventory(), before, "a refused offer changed state"),
                    }
                }
                Op::Schedule => {
                    for started in scheduler.schedule(now) {
                        check_started(&started, &scheduler, now)?;
                    }
                }
                Op::Advance(secs) => {
                    now += Duration::from_secs(secs);
                    let due: BTreeSet<String> =
                        scheduler.running().filter(|r| r.ends_at <= now).map(|r| r.job.id.clone()).collect();
                    let done: BTreeSet<String> = scheduler.complete_due(now).into_iter().collect();
                    prop_assert_eq!(done, due);
                    prop_assert!(scheduler.next_completion().is_none_or(|next| next > now));
                }
                Op::Cancel(id) => {
                    scheduler.cancel(&format!("job-{id}"));
                }
            }
            check(&scheduler, &specs)?;
        }
    }
}
