//! Properties of the whole scheduler under random sequences of calls, checked through its public
//! API only: no node is ever over-committed, every started gang is whole, no job is both
//! pending and running, and (when jobs end at their estimates) backfill never delays the job
//! holding the reservation past the start the reservation promised.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::testkit;
use super::{BuiltinScheduler, LocalJob, NodeSpec, QueuePolicy, QueueSpec, Started};

/// One call on the scheduler, with a random job `J` before it gets an id.
#[derive(Debug, Clone)]
enum Op<J> {
    Submit(J),
    StartNow(J),
    Schedule,
    /// Advance the clock this many seconds, then complete what is due (the backfill property
    /// also completes jobs and schedules at every estimated end on the way, as the agent and
    /// the simulator do).
    Advance(u64),
    /// Cancel the job with this sequence number (it may be pending, running, done or unknown);
    /// the backfill property then schedules.
    Cancel(u32),
}

/// A random job, before it gets an id.
#[derive(Debug, Clone)]
pub(super) struct JobShape {
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

pub(super) fn nodes() -> Vec<NodeSpec> {
    let h100 =
        |i| NodeSpec { shape: "dgx-h100".into(), cpu: 32, memory_gib: 256, ..testkit::node(&format!("h100-{i}"), 8) };
    let a100 = |i| NodeSpec {
        shape: "a100-40".into(),
        gpu_type: "a100".into(),
        gpu_memory_gib: 40,
        cpu: 16,
        memory_gib: 128,
        ..testkit::node(&format!("a100-{i}"), 4)
    };
    (0..3).map(h100).chain((0..3).map(a100)).collect()
}

pub(super) fn job_shape() -> impl Strategy<Value = JobShape> {
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

/// Random calls with jobs from `job`, weighted `[submit, start now, schedule, advance, cancel]`.
fn ops<J, S>(job: impl Fn() -> S, weights: [u32; 5]) -> impl Strategy<Value = Op<J>>
where
    J: Clone + std::fmt::Debug,
    S: Strategy<Value = J> + 'static,
{
    let [submit, start_now, schedule, advance, cancel] = weights;
    prop_oneof![
        submit => job().prop_map(Op::Submit),
        start_now => job().prop_map(Op::StartNow),
        schedule => Just(Op::Schedule),
        advance => (0u64..40).prop_map(Op::Advance),
        cancel => (0u32..60).prop_map(Op::Cancel),
    ]
}

/// The calls of the overcommit property.
fn op() -> impl Strategy<Value = Op<JobShape>> {
    ops(job_shape, [4, 2, 3, 2, 1])
}

impl JobShape {
    pub(super) fn into_job(self, id: u32) -> LocalJob {
        LocalJob {
            priority: self.priority,
            cpu: self.cpu,
            memory_gib: self.memory_gib,
            gpu_types: if self.wants_a100 { vec!["a100".into()] } else { Vec::new() },
            gpu_memory_gib: self.gpu_memory_gib,
            ..testkit::job(&format!("job-{id}"), QUEUES[self.queue], self.replicas, self.gpus, self.run_secs)
        }
    }
}

/// Checks every property that must hold between calls.
pub(super) fn check(scheduler: &BuiltinScheduler, declared: &[NodeSpec]) -> Result<(), TestCaseError> {
    let specs: BTreeMap<String, NodeSpec> = declared.iter().map(|n| (n.name.clone(), n.clone())).collect();
    let specs = &specs;
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
    // The release index agrees with every running job's own expected remaining time, before,
    // at and after each job's expected end.
    for running in scheduler.running() {
        for now in [running.started_at, running.ends_at, running.ends_at + running.ends_at / 2] {
            let mut by_time: Vec<(u64, u32)> = scheduler
                .running()
                .map(|r| (super::releases::ceil_secs(r.expected_remaining(now)), r.job.total_gpus() as u32))
                .collect();
            by_time.sort_unstable();
            let mut expected: Vec<(u64, u32)> = Vec::new();
            for (after, gpus) in by_time {
                match expected.last_mut() {
                    Some(last) if last.0 == after => last.1 += gpus,
                    _ => expected.push((after, gpus)),
                }
            }
            let exact: Vec<(u64, u32)> = scheduler.exact_releases(now).iter().map(|r| (r.after_secs, r.gpus)).collect();
            prop_assert_eq!(exact, expected, "releases at {:?}", now);
        }
    }
    let pressure = scheduler.pressure(Duration::ZERO);
    prop_assert!(pressure.releases.len() <= super::MAX_RELEASE_BUCKETS);
    prop_assert!(pressure.releases.windows(2).all(|w| w[0].after_secs < w[1].after_secs));
    Ok(())
}

pub(super) fn check_started(
    started: &Started,
    scheduler: &BuiltinScheduler,
    now: Duration,
) -> Result<(), TestCaseError> {
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
        let declared = nodes();
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
            check(&scheduler, &declared)?;
        }
    }
}

/// A random job for a random member, before it gets an id.
#[derive(Debug, Clone)]
pub(super) struct BackfillJob {
    pub(super) queue: usize,
    pub(super) priority: u32,
    pub(super) replicas: u32,
    pub(super) gpus: u32,
    pub(super) cpu: u32,
    pub(super) memory_gib: u32,
    pub(super) run_secs: u64,
}

impl BackfillJob {
    pub(super) fn into_job(self, id: u32, queues: &[QueueSpec]) -> LocalJob {
        let queue = &queues[self.queue % queues.len()].name;
        LocalJob {
            priority: self.priority,
            cpu: self.cpu,
            memory_gib: self.memory_gib,
            ..testkit::job(&format!("job-{id}"), queue, self.replicas, self.gpus, self.run_secs)
        }
    }
}

/// 1 to 5 nodes of different sizes, each its own shape.
pub(super) fn node_set() -> impl Strategy<Value = Vec<NodeSpec>> {
    prop::collection::vec((1u32..=8, 4u32..=32, 32u32..=256), 1..6).prop_map(|sizes| {
        sizes
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, cpu, memory_gib))| NodeSpec {
                shape: format!("s{i}"),
                cpu,
                memory_gib,
                ..testkit::node(&format!("n{i}"), gpus)
            })
            .collect()
    })
}

/// 1 to 3 queues with random weights and policies, at least one of them `backfill`.
pub(super) fn queue_set() -> impl Strategy<Value = Vec<QueueSpec>> {
    let policy = prop_oneof![Just(QueuePolicy::Strict), Just(QueuePolicy::BestEffort), Just(QueuePolicy::Backfill)];
    prop::collection::vec((policy, prop_oneof![Just(0.5), Just(1.0), Just(2.0)]), 0..3).prop_map(|rest| {
        let mut queues = vec![QueueSpec::new("q0", 1.0)];
        queues.extend(
            rest.into_iter()
                .enumerate()
                .map(|(i, (policy, weight))| QueueSpec { policy, ..QueueSpec::new(format!("q{}", i + 1), weight) }),
        );
        queues
    })
}

pub(super) fn backfill_job() -> impl Strategy<Value = BackfillJob> {
    (0usize..3, 0u32..3, 1u32..4, 1u32..9, 0u32..12, 0u32..96, 0u64..60).prop_map(
        |(queue, priority, replicas, gpus, cpu, memory_gib, run_secs)| BackfillJob {
            queue,
            priority: priority * 25,
            replicas,
            gpus,
            cpu,
            memory_gib,
            run_secs,
        },
    )
}

/// The calls of the backfill property, over a random member.
fn backfill_op() -> impl Strategy<Value = Op<BackfillJob>> {
    ops(backfill_job, [5, 2, 2, 3, 1])
}

/// Drives a scheduler and checks the reservation promises as it goes.
pub(super) struct Driver {
    pub(super) scheduler: BuiltinScheduler,
    pub(super) declared: Vec<NodeSpec>,
    pub(super) now: Duration,
    /// Every job that held the reservation and has not started or left, with the earliest start
    /// any reservation promised it.
    pub(super) promised: BTreeMap<String, Duration>,
    /// How many jobs started while holding a promise.
    pub(super) kept: u32,
}

impl Driver {
    /// Checks a pass's starts against the promises, then the invariants and the new reservation.
    pub(super) fn after_starts(&mut self, started: Vec<Started>) -> Result<(), TestCaseError> {
        for job in started {
            check_started(&job, &self.scheduler, self.now)?;
            if let Some(promise) = self.promised.remove(&job.job_id) {
                prop_assert!(
                    self.now <= promise,
                    "{} started at {:?}, after its reservation promised {:?}",
                    job.job_id,
                    self.now,
                    promise
                );
                self.kept += 1;
            }
        }
        self.observe()
    }

    /// Checks the invariants and records the reservation's promise.
    pub(super) fn observe(&mut self) -> Result<(), TestCaseError> {
        check(&self.scheduler, &self.declared)?;
        // A holder keeps the reservation until it starts or is cancelled.
        let holder = self.scheduler.reservation();
        for id in self.promised.keys() {
            prop_assert_eq!(Some(id), holder.as_ref().map(|r| &r.job_id), "{} lost its reservation", id);
        }
        if let Some(reservation) = holder {
            prop_assert!(reservation.starts_at >= self.now, "a reservation in the past");
            prop_assert!(self.scheduler.pending().any(|p| p.job.id == reservation.job_id), "the holder is not pending");
            let promise = self.promised.entry(reservation.job_id).or_insert(reservation.starts_at);
            *promise = (*promise).min(reservation.starts_at);
        }
        Ok(())
    }

    /// The next estimated end or end of a preemption grace.
    fn next_event(&self) -> Option<Duration> {
        [self.scheduler.next_completion(), self.scheduler.next_preemption_stop()].into_iter().flatten().min()
    }

    /// Completes, stops victims and schedules at every event until nothing runs.
    pub(super) fn drain(&mut self) -> Result<(), TestCaseError> {
        self.advance(self.now)?;
        while let Some(next) = self.next_event() {
            self.advance(next)?;
        }
        Ok(())
    }

    /// Completes, stops victims whose grace ended (starting the jobs they made room for) and
    /// schedules at every event up to `until`, then schedules at `until`, as the agent and the
    /// simulator do.
    pub(super) fn advance(&mut self, until: Duration) -> Result<(), TestCaseError> {
        while let Some(next) = self.next_event().filter(|next| *next <= until) {
            self.now = next;
            self.scheduler.complete_due(next);
            let stops = self.scheduler.stop_preempted(next);
            // A victim is gone for good here (the gateway would place it again elsewhere).
            for id in &stops.stopped {
                self.promised.remove(id);
            }
            self.after_starts(stops.started)?;
            let started = self.scheduler.schedule(next);
            self.after_starts(started)?;
        }
        self.now = until;
        let started = self.scheduler.schedule(until);
        self.after_starts(started)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn backfill_never_delays_the_reserved_head(
        declared in node_set(),
        queues in queue_set(),
        ops in prop::collection::vec(backfill_op(), 1..100),
    ) {
        let scheduler = BuiltinScheduler::new(declared.clone(), queues.clone())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut driver = Driver { scheduler, declared, now: Duration::ZERO, promised: BTreeMap::new(), kept: 0 };
        let mut next_id = 0u32;
        for op in ops {
            match op {
                Op::Submit(shape) => {
                    let job = shape.into_job(next_id, &queues);
                    next_id += 1;
                    // Jobs that can never fit are refused; the rest queue.
                    let _ = driver.scheduler.submit(job, driver.now);
                    driver.observe()?;
                }
                Op::StartNow(shape) => {
                    let job = shape.into_job(next_id, &queues);
                    next_id += 1;
                    if let Ok(started) = driver.scheduler.start_now(job, driver.now) {
                        driver.after_starts(vec![started])?;
                    }
                }
                Op::Schedule => {
                    let started = driver.scheduler.schedule(driver.now);
                    driver.after_starts(started)?;
                }
                Op::Advance(secs) => driver.advance(driver.now + Duration::from_secs(secs))?,
                Op::Cancel(id) => {
                    let id = format!("job-{id}");
                    driver.scheduler.cancel(&id);
                    driver.promised.remove(&id);
                    driver.observe()?;
                    // Freed resources are offered at once, as the agent's next pass does.
                    let started = driver.scheduler.schedule(driver.now);
                    driver.after_starts(started)?;
                }
            }
        }
        // Run everything out: each holder starts in time, and nothing stays reserved.
        driver.drain()?;
        prop_assert!(driver.promised.is_empty(), "never started: {:?}", driver.promised);
        prop_assert!(driver.scheduler.reservation().is_none());
        prop_assert_eq!(driver.scheduler.pending().count(), 0, "jobs left pending on an idle member");
    }
}

/// The backfill property is not vacuous: over many random runs, reservations are made and kept.
#[test]
fn random_runs_do_make_and_keep_reservations() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut kept = 0;
    for _ in 0..64 {
        let declared = node_set().new_tree(&mut runner).map(|t| t.current()).unwrap_or_default();
        let queues = vec![QueueSpec::new("q0", 1.0)];
        let Ok(scheduler) = BuiltinScheduler::new(declared.clone(), queues.clone()) else { continue };
        let mut driver = Driver { scheduler, declared, now: Duration::ZERO, promised: BTreeMap::new(), kept: 0 };
        let ops =
            prop::collection::vec(backfill_op(), 60).new_tree(&mut runner).map(|t| t.current()).unwrap_or_default();
        let mut next_id = 0u32;
        for op in ops {
            match op {
                Op::Submit(shape) | Op::StartNow(shape) => {
                    let _ = driver.scheduler.submit(shape.into_job(next_id, &queues), driver.now);
                    next_id += 1;
                }
                Op::Advance(secs) => driver.advance(driver.now + Duration::from_secs(secs)).unwrap(),
                Op::Schedule | Op::Cancel(_) => driver.advance(driver.now).unwrap(),
            }
        }
        driver.drain().unwrap();
        kept += driver.kept;
    }
    assert!(kept >= 20, "only {kept} reservations were kept over 64 runs; the property would be vacuous");
}
