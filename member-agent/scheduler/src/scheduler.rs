//! The builtin scheduler's state machine: queues, running jobs, and the decisions between them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::fairshare::{PendingKey, QueueState, Usage};
use super::gang::{self, Node};
use super::preempt::{Draining, PreemptionPolicy};
use super::releases::ReleaseIndex;
use super::reservation::Held;
use super::{Cancelled, Error, LocalJob, NodeSpec, PendingJob, QueuePolicy, QueueSpec, Result, RunningJob, Started};

/// Meridian's builtin local scheduler: gang placement with weighted DRF between queues, and per
/// queue strict, best-effort or backfilling order.
///
/// Pure and deterministic: no I/O, no clock (every time-dependent call takes `now`), no hash-map
/// iteration in any decision. Same calls in the same order give the same results.
///
/// Policy choices:
/// - **Gang, all or nothing, best fit, fewest nodes**: see `gang.rs`.
/// - **Between queues**, [`schedule`](Self::schedule) repeatedly offers free capacity to the queue
///   with the smallest weighted dominant share whose head job fits now; tied shares go to the
///   queue with less share accrued over time (see `fairshare.rs`), then to the first declared.
/// - **Inside a queue**, the queue's [`QueuePolicy`]: a `strict` queue's head that does not fit
///   blocks the jobs behind it; a `bestEffort` queue passes over it; a `backfill` queue passes
///   over it too, but the first such job (in the order the pass visits jobs: queues by share,
///   jobs by priority) takes the member's one reservation, which every later start respects
///   (see `pass.rs` for the pass and how the reservation and fair share interact, and
///   `reservation.rs` for the plan and why it is never delayed).
/// - **[`start_now`](Self::start_now)** (the gateway's offer path) respects the reservation, and in
///   a `strict` queue never overtakes a pending job of equal or higher priority, keeping the
///   in-queue order that `schedule` follows; it may start a job while other queues have blocked
///   heads, as `schedule` would.
#[derive(Debug, Clone)]
pub struct BuiltinScheduler {
    /// Managed nodes in declaration order.
    pub(super) nodes: Vec<Node>,
    /// Node indices grouped by shape, shapes in order of first declaration.
    pub(super) shapes: Vec<(String, Vec<usize>)>,
    /// Queues in declaration order.
    pub(super) queues: Vec<QueueState>,
    /// Queue index by name.
    queue_index: BTreeMap<String, usize>,
    /// All resources of the cluster, the denominator of every share.
    pub(super) totals: Usage,
    /// Free GPUs summed over nodes: a cheap test that rejects gangs bigger than what is free
    /// before any node is scanned.
    pub(super) free_gpus: u64,
    /// Where each pending job sits. Only looked up, never iterated, so its order cannot leak.
    pending_index: HashMap<String, (usize, PendingKey)>,
    /// Running jobs by id.
    pub(super) running: BTreeMap<String, Running>,
    /// When the running jobs are expected to give their GPUs back, for pressure reports.
    pub(super) releases: ReleaseIndex,
    /// GPUs of running preemptible jobs by priority (draining or not), for pressure reports.
    pub(super) preemptible: BTreeMap<u32, u64>,
    /// Running jobs by true completion time (`completes_at`), for `complete_due` and
    /// `next_completion` only: it orders by the simulator's hidden truth, so nothing that decides
    /// or reports may read it.
    completions: BTreeSet<(Duration, String)>,
    /// The latest `now` any call passed: `cancel` takes no time, so a cancelled job's queue is
    /// charged its share up to this point.
    clock: Duration,
    /// The pending job holding the member's backfill reservation, and its plan.
    pub(super) reservation: Option<Held>,
    /// A running job ended before its estimate since the plan was made, so the reservation may
    /// start earlier than planned: the next pass plans again.
    pub(super) replan: bool,
    /// When and how the member preempts (see `preempt.rs`).
    pub(super) preemption: PreemptionPolicy,
    /// Victims in their grace period, by id.
    pub(super) draining: BTreeMap<String, Draining>,
    /// Pending jobs the member never preempts for: the gateway's sibling copies (only a granted
    /// copy may take anyone's GPUs, so copies on several members never preempt at once).
    pub(super) copies: BTreeSet<String>,
}

/// A running job with what it holds.
#[derive(Debug, Clone)]
pub(super) struct Running {
    /// The public view.
    pub(super) view: RunningJob,
    /// Queue index whose share the job counts against.
    queue: usize,
    /// Node index per replica.
    pub(super) nodes: Vec<usize>,
}

impl Running {
    /// When the member expects the job to end: its start plus its estimate (`run_for`).
    pub(super) fn estimated_end(&self) -> Duration {
        self.view.started_at.checked_add(self.view.job.run_for).unwrap_or(Duration::MAX)
    }
}

impl BuiltinScheduler {
    /// Builds a scheduler over `nodes` and `queues`, all nodes free and all queues empty.
    ///
    /// Rejects: no nodes, duplicate node names, nodes with 0 GPUs, nodes that differ from earlier
    /// nodes of the same shape, no queues, duplicate queue names, weights that are not finite
    /// and > 0.
    pub fn new(nodes: Vec<NodeSpec>, queues: Vec<QueueSpec>) -> Result<Self> {
        if nodes.is_empty() {
            return Err(Error::NoNodes);
        }
        if queues.is_empty() {
            return Err(Error::NoQueues);
        }
        let mut names = BTreeSet::new();
        let mut shapes: Vec<(String, Vec<usize>)> = Vec::new();
        let mut totals = Usage::default();
        for (index, node) in nodes.iter().enumerate() {
            if !names.insert(node.name.as_str()) {
                return Err(Error::DuplicateNode { name: node.name.clone() });
            }
            if node.gpus == 0 {
                return Err(Error::NodeWithoutGpus { name: node.name.clone() });
            }
            match shapes.iter_mut().find(|(shape, _)| *shape == node.shape) {
                Some((_, members)) => {
                    let first = members.first().and_then(|&i| nodes.get(i));
                    if first.is_some_and(|first| !same_shape(first, node)) {
                        return Err(Error::InconsistentShape { shape: node.shape.clone(), node: node.name.clone() });
                    }
                    members.push(index);
                }
                None => shapes.push((node.shape.clone(), vec![index])),
            }
            totals.add(Usage {
                gpus: u64::from(node.gpus),
                cpu: u64::from(node.cpu),
                memory_gib: u64::from(node.memory_gib),
            });
        }
        let mut queue_index = BTreeMap::new();
        for (index, queue) in queues.iter().enumerate() {
            if !(queue.weight.is_finite() && queue.weight > 0.0) {
                return Err(Error::InvalidWeight { queue: queue.name.clone(), weight: queue.weight });
            }
            if queue_index.insert(queue.name.clone(), index).is_some() {
                return Err(Error::DuplicateQueue { name: queue.name.clone() });
            }
        }
        Ok(Self {
            nodes: nodes.into_iter().map(Node::new).collect(),
            shapes,
            queues: queues.into_iter().map(|q| QueueState::new(q.name, q.weight, q.policy)).collect(),
            queue_index,
            free_gpus: totals.gpus,
            totals,
            pending_index: HashMap::new(),
            running: BTreeMap::new(),
            releases: ReleaseIndex::default(),
            preemptible: BTreeMap::new(),
            completions: BTreeSet::new(),
            clock: Duration::ZERO,
            reservation: None,
            replan: false,
            preemption: PreemptionPolicy::default(),
            draining: BTreeMap::new(),
            copies: BTreeSet::new(),
        })
    }

    /// The queue a tenant's jobs go to: the queue named like the tenant if there is one, else
    /// `default` if there is one, else the first queue declared.
    pub fn queue_for(&self, tenant: &str) -> &str {
        let index = self.queue_index.get(tenant).or_else(|| self.queue_index.get("default")).copied().unwrap_or(0);
        self.queues.get(index).map_or("", |q| &*q.name)
    }

    /// Whether `job` could start if every node were free (GPU type, GPU memory and gang shape).
    pub fn can_ever_fit(&self, job: &LocalJob) -> bool {
        job.replicas > 0 && job.gpus > 0 && gang::fits_empty(&self.nodes, job)
    }

    /// Queues `job` as pending; it starts on a later [`schedule`](Self::schedule).
    ///
    /// Errors: unknown queue, an id already pending or running, zero replicas or GPUs, or a job
    /// that can never fit ([`Error::NeverFits`]: queueing it would wait forever).
    pub fn submit(&mut self, job: LocalJob, now: Duration) -> Result<()> {
        self.enqueue(job, now)
    }

    /// Queues a sibling copy of a gateway job: planned, reserved for and started like any pending
    /// job, except that the member never preempts for it. Starting it only takes its nodes: the
    /// caller launches nothing until the gateway grants the copy its start lock, and cancels it
    /// (freeing the nodes) when the gateway drops it.
    pub fn submit_copy(&mut self, job: LocalJob, now: Duration) -> Result<()> {
        let id = job.id.clone();
        self.enqueue(job, now)?;
        self.copies.insert(id);
        Ok(())
    }

    /// Whether `job_id` is a pending sibling copy (see [`submit_copy`](Self::submit_copy)).
    pub fn is_pending_copy(&self, job_id: &str) -> bool {
        self.copies.contains(job_id)
    }

    fn enqueue(&mut self, job: LocalJob, now: Duration) -> Result<()> {
        let queue = self.admit(&job)?;
        self.clock = self.clock.max(now);
        let key = PendingKey::new(&job, now);
        self.pending_index.insert(job.id.clone(), (queue, key.clone()));
        self.queues[queue].push(key, PendingJob { job, submitted_at: now });
        Ok(())
    }

    /// The gateway's offer path: starts `job` at once if its whole gang fits on the free nodes
    /// now without delaying the member's reservation, else returns an error and changes nothing.
    ///
    /// In a `strict` queue, refuses with [`Error::WouldOvertake`] when a pending job of equal or
    /// higher priority waits in the same queue, since `schedule` would run that one first.
    /// Lower-priority pending jobs do not block it: the job would be ordered ahead of them
    /// anyway. In `bestEffort` and `backfill` queues a job that fits may start past waiting ones,
    /// as `schedule` would let it.
    pub fn start_now(&mut self, job: LocalJob, now: Duration) -> Result<Started> {
        let queue = self.admit(&job)?;
        if self.queues[queue].policy == QueuePolicy::Strict
            && let Some((_, head)) = self.queues[queue].head()
            && head.job.priority >= job.priority
        {
            return Err(Error::WouldOvertake {
                job_id: job.id,
                queue: self.queues[queue].name.to_string(),
                ahead: head.job.id.clone(),
            });
        }
        match self.place_now(&job, now) {
            Some(placement) => Ok(self.start(job, queue, placement, now)),
            None => Err(Error::DoesNotFitNow { job_id: job.id }),
        }
    }

    /// Completes every running job whose true end ([`RunningJob::completes_at`]) is at or before
    /// `now`: frees its nodes and returns its id (the jobs succeeded), earliest end first.
    pub fn complete_due(&mut self, now: Duration) -> Vec<String> {
        let mut done = Vec::new();
        while let Some((ends_at, id)) = self.completions.first().cloned() {
            if ends_at > now {
                break;
            }
            // Charge the queue's share up to the job's end, not up to `now`: in virtual time a
            // caller may jump far past it.
            self.clock = self.clock.max(ends_at);
            self.release(&id);
            self.forget_draining(&id);
            done.push(id);
        }
        self.advance_to(now);
        done
    }

    /// When the next running job really completes (by [`RunningJob::completes_at`]), if any is
    /// running.
    pub fn next_completion(&self) -> Option<Duration> {
        self.completions.first().map(|(ends_at, _)| *ends_at)
    }

    /// Sets when a running job really completes (the simulator learns it only once it knows the
    /// GPU type the job got, since run time follows GPU speed, and when its data landed). Its
    /// estimate, and so everything the member reports and decides, is unchanged. Returns false
    /// when the job does not run here.
    pub fn set_true_end(&mut self, job_id: &str, completes_at: Duration) -> bool {
        let Some(running) = self.running.get_mut(job_id) else { return false };
        let view = &mut running.view;
        self.completions.remove(&(view.completes_at, job_id.to_string()));
        view.job.actual = Some(completes_at.saturating_sub(view.started_at));
        view.completes_at = completes_at;
        self.completions.insert((completes_at, job_id.to_string()));
        true
    }

    /// Removes a job, pending or running; a running job's nodes are freed at once.
    pub fn cancel(&mut self, job_id: &str) -> Cancelled {
        if let Some((queue, key)) = self.pending_index.remove(job_id) {
            self.queues[queue].remove(&key);
            self.copies.remove(job_id);
            if self.reservation.as_ref().is_some_and(|held| held.job_id == job_id) {
                self.reservation = None;
            }
            return Cancelled::WasPending;
        }
        if self.release(job_id).is_some() {
            self.forget_draining(job_id);
            return Cancelled::WasRunning;
        }
        Cancelled::NotFound
    }

    /// GPUs free now, summed over nodes.
    pub fn free_gpus(&self) -> u64 {
        self.free_gpus
    }

    /// GPUs of all nodes.
    pub fn total_gpus(&self) -> u64 {
        self.totals.gpus
    }

    /// Running jobs, ordered by id.
    pub fn running(&self) -> impl Iterator<Item = &RunningJob> {
        self.running.values().map(|r| &r.view)
    }

    /// Pending jobs, queue by queue in declaration order, each queue in its start order.
    pub fn pending(&self) -> impl Iterator<Item = &PendingJob> {
        self.queues.iter().flat_map(|q| q.pending.values())
    }

    /// Moves the clock to `now` (never back) and brings every queue's accrued share up to it.
    pub(super) fn advance_to(&mut self, now: Duration) {
        self.clock = self.clock.max(now);
        for queue in &mut self.queues {
            queue.accrue(&self.totals, self.clock);
        }
    }

    /// Checks what `submit` and `start_now` both require and returns the job's queue index.
    fn admit(&self, job: &LocalJob) -> Result<usize> {
        if job.replicas == 0 {
            return Err(Error::InvalidJob { job_id: job.id.clone(), reason: "replicas must be at least 1" });
        }
        if job.gpus == 0 {
            return Err(Error::InvalidJob { job_id: job.id.clone(), reason: "gpus per replica must be at least 1" });
        }
        let queue = *self
            .queue_index
            .get(&job.queue)
            .ok_or_else(|| Error::UnknownQueue { job_id: job.id.clone(), queue: job.queue.clone() })?;
        if self.pending_index.contains_key(&job.id) || self.running.contains_key(&job.id) {
            return Err(Error::DuplicateJob { job_id: job.id.clone() });
        }
        if let Some(reason) = gang::never_fits_reason(&self.nodes, job) {
            return Err(Error::NeverFits { job_id: job.id.clone(), reason });
        }
        Ok(queue)
    }

    /// A placement on the free nodes now for `job` started at `now`, if the whole gang fits
    /// without delaying the reservation: a job that would still run at the reservation's start
    /// may use only the spare of the reserved nodes.
    pub(super) fn place_now(&self, job: &LocalJob, now: Duration) -> Option<Vec<usize>> {
        if job.total_gpus() > self.free_gpus {
            return None;
        }
        match &self.reservation {
            Some(held) if !held.plan.ends_in_time(now, job.run_for) => {
                gang::place_with(&self.nodes, job, |index, node| held.plan.usable(index, node.free))
            }
            _ => gang::place(&self.nodes, job),
        }
    }

    /// Removes the pending job at `key` of `queue` and starts it on `placement`.
    pub(super) fn start_pending(
        &mut self,
        queue: usize,
        key: &PendingKey,
        placement: Vec<usize>,
        now: Duration,
    ) -> Option<Started> {
        let pending = self.queues[queue].remove(key)?;
        self.pending_index.remove(&pending.job.id);
        self.copies.remove(&pending.job.id);
        Some(self.start(pending.job, queue, placement, now))
    }

    /// Takes the nodes of `placement` for `job` and records it as running.
    fn start(&mut self, job: LocalJob, queue: usize, placement: Vec<usize>, now: Duration) -> Started {
        for &index in &placement {
            self.nodes[index].take(&job);
        }
        if let Some(held) = &mut self.reservation
            && !held.plan.ends_in_time(now, job.run_for)
        {
            for &index in &placement {
                held.plan.take(index, &job);
            }
        }
        self.clock = self.clock.max(now);
        let usage = Usage::of_job(&job);
        self.queues[queue].accrue(&self.totals, self.clock);
        self.queues[queue].used.add(usage);
        self.free_gpus = self.free_gpus.saturating_sub(usage.gpus);
        let ends_at = now.checked_add(job.run_for).unwrap_or(Duration::MAX);
        let completes_at = now.checked_add(job.true_run_time()).unwrap_or(Duration::MAX);
        let names: Vec<String> = placement.iter().map(|&i| self.nodes[i].spec.name.clone()).collect();
        let started = Started { job_id: job.id.clone(), nodes: names.clone(), ends_at, completes_at };
        self.completions.insert((completes_at, job.id.clone()));
        self.releases.add(now, ends_at, gang_gpus(&job));
        if job.preemptible {
            *self.preemptible.entry(job.priority).or_default() += job.total_gpus();
        }
        let view = RunningJob { job, nodes: names, started_at: now, ends_at, completes_at };
        self.running.insert(started.job_id.clone(), Running { view, queue, nodes: placement });
        started
    }

    /// Where the pending job `job_id` waits: its queue index and key.
    pub(super) fn pending_key(&self, job_id: &str) -> Option<(usize, PendingKey)> {
        self.pending_index.get(job_id).cloned()
    }

    /// Removes a running job and gives back everything it held.
    pub(super) fn release(&mut self, job_id: &str) -> Option<RunningJob> {
        let running = self.running.remove(job_id)?;
        if self.clock < running.estimated_end() {
            self.replan = true;
        }
        let job = &running.view.job;
        self.releases.remove(running.view.started_at, running.view.ends_at, gang_gpus(job));
        if job.preemptible
            && let Some(gpus) = self.preemptible.get_mut(&job.priority)
        {
            *gpus = gpus.saturating_sub(job.total_gpus());
            if *gpus == 0 {
                self.preemptible.remove(&job.priority);
            }
        }
        for &index in &running.nodes {
            self.nodes[index].give_back(job);
        }
        let usage = Usage::of_job(job);
        self.queues[running.queue].accrue(&self.totals, self.clock);
        self.queues[running.queue].used.remove(usage);
        self.free_gpus = self.free_gpus.saturating_add(usage.gpus).min(self.totals.gpus);
        self.completions.remove(&(running.view.completes_at, job.id.clone()));
        Some(running.view)
    }
}

/// Whether two nodes are interchangeable (everything but the name matches, labels included).
/// The GPUs a whole gang holds, as the release index counts them.
fn gang_gpus(job: &LocalJob) -> u32 {
    u32::try_from(job.total_gpus()).unwrap_or(u32::MAX)
}

fn same_shape(a: &NodeSpec, b: &NodeSpec) -> bool {
    (&a.gpu_type, a.gpu_memory_gib, a.gpus, a.cpu, a.memory_gib, &a.labels)
        == (&b.gpu_type, b.gpu_memory_gib, b.gpus, b.cpu, b.memory_gib, &b.labels)
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::testkit::{self, node};
    use super::*;

    fn queue(name: &str, weight: f64) -> QueueSpec {
        QueueSpec::new(name, weight)
    }

    fn strict(name: &str) -> QueueSpec {
        QueueSpec { policy: QueuePolicy::Strict, ..QueueSpec::new(name, 1.0) }
    }

    /// Two 8-GPU nodes and two strict queues, `default` and `team`.
    fn two_nodes_strict() -> BuiltinScheduler {
        BuiltinScheduler::new(vec![node("a", 8), node("b", 8)], vec![strict("default"), strict("team")]).unwrap()
    }

    /// A job estimated (and running) 100 s.
    fn job(id: &str, queue: &str, replicas: u32, gpus: u32) -> LocalJob {
        testkit::job(id, queue, replicas, gpus, 100)
    }

    fn two_nodes() -> BuiltinScheduler {
        BuiltinScheduler::new(vec![node("a", 8), node("b", 8)], vec![queue("default", 1.0), queue("team", 1.0)])
            .unwrap()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn bad_configs_are_rejected_with_the_reason() {
        let q = || vec![queue("default", 1.0)];
        assert_eq!(BuiltinScheduler::new(vec![], q()).unwrap_err(), Error::NoNodes);
        assert_eq!(BuiltinScheduler::new(vec![node("a", 8)], vec![]).unwrap_err(), Error::NoQueues);
        assert_eq!(
            BuiltinScheduler::new(vec![node("a", 8), node("a", 8)], q()).unwrap_err(),
            Error::DuplicateNode { name: "a".into() }
        );
        assert_eq!(
            BuiltinScheduler::new(vec![node("a", 0)], q()).unwrap_err(),
            Error::NodeWithoutGpus { name: "a".into() }
        );
        let mut odd = node("b", 8);
        odd.cpu = 32;
        assert_eq!(
            BuiltinScheduler::new(vec![node("a", 8), odd], q()).unwrap_err(),
            Error::InconsistentShape { shape: "h100x8".into(), node: "b".into() }
        );
        assert_eq!(
            BuiltinScheduler::new(vec![node("a", 8)], vec![queue("x", 1.0), queue("x", 2.0)]).unwrap_err(),
            Error::DuplicateQueue { name: "x".into() }
        );
        for weight in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                BuiltinScheduler::new(vec![node("a", 8)], vec![queue("x", weight)]),
                Err(Error::InvalidWeight { .. })
            ));
        }
    }

    #[test]
    fn bad_jobs_are_rejected_and_change_nothing() {
        let mut s = two_nodes();
        assert!(matches!(s.submit(job("j", "nope", 1, 1), secs(0)), Err(Error::UnknownQueue { .. })));
        assert!(matches!(s.submit(job("j", "default", 0, 1), secs(0)), Err(Error::InvalidJob { .. })));
        assert!(matches!(s.submit(job("j", "default", 1, 0), secs(0)), Err(Error::InvalidJob { .. })));
        assert_eq!(
            s.submit(job("j", "default", 3, 8), secs(0)),
            Err(Error::NeverFits {
                job_id: "j".into(),
                reason: "3 replicas of 8 GPUs, 4 CPUs and 32 GiB each do not fit on the empty nodes".into()
            })
        );
        let mut wrong_type = job("j", "default", 1, 1);
        wrong_type.gpu_types = vec!["a100".into()];
        assert!(!s.can_ever_fit(&wrong_type));
        assert_eq!(
            s.submit(wrong_type, secs(0)),
            Err(Error::NeverFits {
                job_id: "j".into(),
                reason: "no node has GPUs of type a100 with at least 0 GiB each".into()
            })
        );
        s.submit(job("j", "default", 1, 1), secs(0)).unwrap();
        assert_eq!(s.submit(job("j", "team", 1, 1), secs(0)), Err(Error::DuplicateJob { job_id: "j".into() }));
        assert_eq!(s.pending().count(), 1);
    }

    #[test]
    fn queue_for_prefers_the_tenant_queue_then_default_then_the_first() {
        let s = two_nodes();
        assert_eq!(s.queue_for("team"), "team");
        assert_eq!(s.queue_for("other"), "default");
        let first = BuiltinScheduler::new(vec![node("a", 8)], vec![queue("x", 1.0), queue("y", 1.0)]).unwrap();
        assert_eq!(first.queue_for("other"), "x");
    }

    #[test]
    fn two_by_eight_gang_starts_only_when_two_nodes_are_empty() {
        let mut s = two_nodes();
        s.start_now(job("small", "default", 1, 1), secs(0)).unwrap();
        s.submit(job("gang", "team", 2, 8), secs(0)).unwrap();
        assert!(s.schedule(secs(1)).is_empty(), "15 free GPUs over two nodes must not start a 2×8 gang");
        assert_eq!(s.running().count(), 1);
        assert_eq!(s.complete_due(secs(100)), vec!["small".to_string()]);
        let started = s.schedule(secs(100));
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].nodes, ["a", "b"]);
        assert_eq!(started[0].ends_at, secs(200));
    }

    #[test]
    fn start_now_starts_only_a_whole_gang_that_fits_now() {
        let mut s = two_nodes();
        let started = s.start_now(job("x", "default", 4, 2), secs(5)).unwrap();
        assert_eq!(started.nodes, ["a", "a", "a", "a"]);
        let before = s.inventory();
        assert_eq!(s.start_now(job("y", "default", 2, 8), secs(5)), Err(Error::DoesNotFitNow { job_id: "y".into() }));
        assert_eq!(s.inventory(), before, "a refused offer changes nothing");
        assert_eq!(s.pending().count(), 0);
    }

    #[test]
    fn start_now_in_a_strict_queue_does_not_overtake_equal_or_higher_priority() {
        let mut s = two_nodes_strict();
        s.start_now(job("hog", "default", 1, 8), secs(0)).unwrap();
        s.submit(job("gang", "default", 2, 8), secs(0)).unwrap();
        assert!(matches!(s.start_now(job("same", "default", 1, 1), secs(1)), Err(Error::WouldOvertake { .. })));
        let mut urgent = job("urgent", "default", 1, 1);
        urgent.priority = 90;
        assert!(s.start_now(urgent, secs(1)).is_ok(), "a higher-priority job would be ahead of the gang anyway");
        assert!(s.start_now(job("other-queue", "team", 1, 1), secs(1)).is_ok(), "other queues are not blocked");
    }

    #[test]
    fn strict_blocked_head_blocks_its_queue_but_not_other_queues() {
        let mut s = two_nodes_strict();
        s.start_now(job("hog", "default", 1, 8), secs(0)).unwrap();
        s.submit(job("gang", "default", 2, 8), secs(1)).unwrap();
        s.submit(job("behind", "default", 1, 1), secs(2)).unwrap();
        s.submit(job("elsewhere", "team", 1, 1), secs(3)).unwrap();
        let started: Vec<String> = s.schedule(secs(4)).into_iter().map(|s| s.job_id).collect();
        assert_eq!(started, ["elsewhere"]);
    }

    #[test]
    fn within_a_queue_higher_priority_starts_first() {
        let mut s = BuiltinScheduler::new(vec![node("a", 1)], vec![queue("default", 1.0)]).unwrap();
        s.submit(job("early", "default", 1, 1), secs(0)).unwrap();
        let mut urgent = job("urgent", "default", 1, 1);
        urgent.priority = 90;
        s.submit(urgent, secs(1)).unwrap();
        let started: Vec<String> = s.schedule(secs(2)).into_iter().map(|s| s.job_id).collect();
        assert_eq!(started, ["urgent"]);
    }

    #[test]
    fn schedule_serves_the_queue_with_the_smallest_weighted_share() {
        let mut s = BuiltinScheduler::new(vec![node("a", 4)], vec![queue("heavy", 3.0), queue("light", 1.0)]).unwrap();
        for i in 0..4 {
            s.submit(job(&format!("h{i}"), "heavy", 1, 1), secs(0)).unwrap();
            s.submit(job(&format!("l{i}"), "light", 1, 1), secs(0)).unwrap();
        }
        let started: Vec<String> = s.schedule(secs(0)).into_iter().map(|s| s.job_id).collect();
        // Shares after each start: h0 → heavy 1/12, l0 → light 1/4, h1 → 2/12, h2 → 3/12, then
        // the 4 GPUs are gone.
        assert_eq!(started, ["h0", "l0", "h1", "h2"]);
    }

    #[test]
    fn cancelling_pending_and_running_jobs_releases_them() {
        let mut s = two_nodes();
        s.start_now(job("run", "default", 2, 8), secs(0)).unwrap();
        s.submit(job("wait", "team", 1, 8), secs(0)).unwrap();
        assert_eq!(s.cancel("wait"), Cancelled::WasPending);
        assert_eq!(s.pending().count(), 0);
        assert_eq!(s.pressure(secs(0)).pending_gpus(), 0);
        assert_eq!(s.cancel("run"), Cancelled::WasRunning);
        assert_eq!(s.inventory().gpus_free(), 16);
        assert_eq!(s.next_completion(), None);
        assert_eq!(s.cancel("run"), Cancelled::NotFound);
        assert_eq!(s.pressure(secs(0)).queues[0].running_gpus, 0);
    }

    #[test]
    fn complete_due_releases_jobs_whose_end_has_come_in_end_order() {
        let mut s = two_nodes();
        let mut long = job("long", "default", 1, 4);
        long.run_for = secs(50);
        s.start_now(long, secs(0)).unwrap();
        s.start_now(job("short", "team", 1, 4), secs(0)).unwrap();
        assert_eq!(s.next_completion(), Some(secs(50)));
        assert!(s.complete_due(secs(49)).is_empty());
        assert_eq!(s.complete_due(secs(100)), ["long", "short"]);
        assert_eq!(s.inventory().gpus_free(), 16);
        assert_eq!(s.running().count(), 0);
        // The id is free again once the job is done.
        assert!(s.submit(job("long", "default", 1, 1), secs(100)).is_ok());
    }

    #[test]
    fn same_calls_give_the_same_decisions() {
        let run = || {
            let mut s = BuiltinScheduler::new(
                (0..6).map(|i| node(&format!("n{i}"), 8)).collect(),
                vec![queue("a", 1.0), queue("b", 2.0)],
            )
            .unwrap();
            let mut log = Vec::new();
            for i in 0..40u32 {
                let q = if i % 3 == 0 { "a" } else { "b" };
                let mut j = job(&format!("j{i}"), q, 1 + i % 3, 1 + i % 4);
                j.run_for = secs(u64::from(10 + i * 7 % 30));
                s.submit(j, secs(u64::from(i))).unwrap();
            }
            let mut now = secs(40);
            for _ in 0..100 {
                log.extend(s.schedule(now));
                let Some(next) = s.next_completion() else { break };
                now = next;
                s.complete_due(now);
            }
            log
        };
        assert_eq!(run(), run());
    }

    fn labelled(name: &str, shape: &str, fabric: &str) -> NodeSpec {
        NodeSpec {
            shape: shape.into(),
            labels: [("gpu-fabric".to_string(), fabric.to_string())].into(),
            ..node(name, 8)
        }
    }

    #[test]
    fn a_gang_lands_only_on_nodes_matching_its_node_selector() {
        let nodes = vec![labelled("e0", "eth", "roce"), labelled("i0", "ib", "ib"), labelled("i1", "ib", "ib")];
        let mut s = BuiltinScheduler::new(nodes, vec![queue("default", 1.0)]).unwrap();
        let mut gang = job("g", "default", 2, 8);
        gang.node_selector = "gpu-fabric=ib".parse().unwrap();
        let started = s.start_now(gang, secs(0)).unwrap();
        assert_eq!(started.nodes, vec!["i0".to_string(), "i1".to_string()]);

        // Only the non-matching node is free now: the next ib job waits rather than landing there.
        let mut next = job("n", "default", 1, 8);
        next.node_selector = "gpu-fabric=ib".parse().unwrap();
        assert_eq!(s.start_now(next.clone(), secs(0)), Err(Error::DoesNotFitNow { job_id: "n".into() }));
        s.submit(next, secs(0)).unwrap();
        assert!(s.schedule(secs(1)).is_empty());
        s.cancel("g");
        let started = s.schedule(secs(2));
        assert_eq!(started.len(), 1);
        assert_eq!(started[0].nodes, vec!["i0".to_string()]);
    }

    #[test]
    fn a_job_no_node_matches_never_fits_with_the_selector_named() {
        let nodes = vec![labelled("e0", "eth", "roce"), labelled("e1", "eth", "roce")];
        let mut s = BuiltinScheduler::new(nodes, vec![queue("default", 1.0)]).unwrap();
        let mut wants_ib = job("j", "default", 1, 1);
        wants_ib.node_selector = "gpu-fabric=ib".parse().unwrap();
        assert!(!s.can_ever_fit(&wants_ib));
        let err = s.submit(wants_ib, secs(0)).unwrap_err();
        assert!(matches!(err, Error::NeverFits { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "job `j` can never fit this cluster's nodes, even when all are free: no node matches nodeSelector \
             `gpu-fabric=ib` (node labels here: eth: gpu-fabric=roce)"
        );

        // Matching nodes that are too small are named as such, with the selector.
        let mut too_big = job("k", "default", 3, 8);
        too_big.node_selector = "gpu-fabric=roce".parse().unwrap();
        let err = s.submit(too_big, secs(0)).unwrap_err();
        assert!(err.to_string().ends_with("among the nodes matching nodeSelector `gpu-fabric=roce`"), "{err}");
    }

    #[test]
    fn nodes_of_one_shape_must_share_their_labels() {
        let nodes = vec![labelled("a", "dgx", "ib"), labelled("b", "dgx", "roce")];
        assert_eq!(
            BuiltinScheduler::new(nodes, vec![queue("default", 1.0)]).unwrap_err(),
            Error::InconsistentShape { shape: "dgx".into(), node: "b".into() }
        );
    }

    #[test]
    fn the_inventory_reports_each_shape_with_its_labels() {
        let nodes = vec![labelled("e0", "eth", "roce"), labelled("i0", "ib", "ib")];
        let s = BuiltinScheduler::new(nodes, vec![queue("default", 1.0)]).unwrap();
        let shapes = s.inventory().shapes;
        assert_eq!(shapes.len(), 2);
        assert_eq!(shapes[1].labels.get("gpu-fabric").map(String::as_str), Some("ib"));
    }

    #[test]
    fn gpu_slices_are_used_only_by_jobs_that_name_them() {
        let slice = NodeSpec {
            shape: "a100-mig".into(),
            gpu_type: "a100-80g.1g.10gb".into(),
            gpu_memory_gib: 10,
            gpus: 7,
            ..node("m0", 7)
        };
        let whole = NodeSpec { shape: "a100".into(), gpu_type: "a100-80g".into(), ..node("w0", 8) };
        let s = BuiltinScheduler::new(vec![slice, whole], vec![queue("default", 1.0)]).unwrap();
        let mut small = job("s", "default", 1, 1);
        small.gpu_types = vec!["a100-80g.1g.10gb".into()];
        let mut s2 = s.clone();
        assert_eq!(s2.start_now(small, secs(0)).unwrap().nodes, vec!["m0".to_string()]);

        let mut whole_a100 = job("w", "default", 1, 1);
        whole_a100.gpu_types = vec!["a100-80g".into()];
        let mut s3 = s.clone();
        assert_eq!(s3.start_now(whole_a100, secs(0)).unwrap().nodes, vec!["w0".to_string()]);

        // No type named: whole GPUs only, so 8 one-GPU replicas cannot spill onto the slices.
        let any = job("a", "default", 9, 1);
        assert!(!s.can_ever_fit(&any));
    }
}
