//! The builtin backend: Meridian's own gang + fair-share scheduler over the nodes declared in the
//! agent's config, run in real (tokio) time.
//!
//! Jobs queue locally: [`submit`](LocalBackend::submit) hands the job to the scheduler's queue and
//! then runs a scheduling pass, so fair share between queues and priority inside a queue decide
//! what starts, exactly as in the simulator. A driver task owned by the backend wakes when the
//! next running job is due, completes it, schedules waiting jobs and reports each change as a
//! [`JobEvent`]. A job "runs" for `runtime.estimate × time_scale` and then succeeds; a job whose
//! `runtime.limit` is shorter than its estimate is stopped at the limit and fails.
//!
//! The scheduler lives behind a `std` mutex that is never held across an `.await`: every call
//! answers at once, so the futures the traits return are ready immediately.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::{BackendKind, Inventory, QueuePressure};
use meridian_proto::protocol::Assignment;
use meridian_proto::spec::JobSpec;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    Admission, BackendError, BackendFuture, HeldJob, InventorySource, JobEvent, JobEventSender, JobPhase, LocalBackend,
};
use crate::builtin::{BuiltinScheduler, Error as SchedulerError, LocalJob};

/// The builtin gang + fair-share scheduler as a [`LocalBackend`] and an [`InventorySource`].
///
/// Owns a driver task that advances time; dropping the backend stops it.
pub struct BuiltinBackend {
    shared: Arc<Shared>,
    driver: JoinHandle<()>,
}

/// What the backend and its driver share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the driver after a submit or cancel changed what is due or what may start.
    wake: Notify,
    /// Time zero of the scheduler's clock.
    epoch: Instant,
    events: JobEventSender,
}

struct State {
    scheduler: BuiltinScheduler,
    time_scale: f64,
    /// Every binding the scheduler holds (pending or running), by job id.
    bindings: BTreeMap<String, Binding>,
}

/// One binding the scheduler holds.
struct Binding {
    fencing_token: u64,
    /// When it started, in scheduler time; None while it waits.
    started_at: Option<Duration>,
    /// Its runtime limit when that is shorter than its estimate: it fails when it ends.
    stopped_at_limit: Option<Duration>,
    /// The reason last reported while it waits, so the driver reports only changes.
    reason: String,
}

impl BuiltinBackend {
    /// Starts the backend over `scheduler`; job run times are multiplied by `time_scale`. Job
    /// events go to `events`.
    ///
    /// Must be called inside a Tokio runtime (the driver task is spawned on it); outside one it
    /// returns a permanent error.
    pub fn new(scheduler: BuiltinScheduler, time_scale: f64, events: JobEventSender) -> Result<Self, BackendError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| BackendError::Permanent {
            message: "the builtin backend must be started inside a Tokio runtime".into(),
            source: Some(Box::new(e)),
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { scheduler, time_scale, bindings: BTreeMap::new() }),
            wake: Notify::new(),
            epoch: Instant::now(),
            events,
        });
        let driver = runtime.spawn(drive(Arc::clone(&shared)));
        Ok(Self { shared, driver })
    }

    /// How long `spec` runs here, and whether it ends at its runtime limit (and so fails).
    pub fn run_time(&self, spec: &JobSpec) -> (Duration, bool) {
        run_time(spec, self.shared.lock().time_scale)
    }

    fn submit_now(&self, job: &Assignment) -> Admission {
        let mut state = self.shared.lock();
        let now = self.shared.now();
        if let Some(binding) = state.bindings.get(&job.job_id) {
            if binding.fencing_token != job.fencing_token {
                return Admission::Refused {
                    reason: format!(
                        "binding {} of job `{}` is still held here; it must be cancelled first",
                        binding.fencing_token, job.job_id
                    ),
                    permanent: false,
                };
            }
            return state.admission_of(&job.job_id);
        }
        let queue = state.scheduler.queue_for(&job.spec.tenant).to_string();
        let (run_for, at_limit) = run_time(&job.spec, state.time_scale);
        let local = LocalJob::from_spec(&job.job_id, &job.spec, queue, run_for);
        if let Err(e) = state.scheduler.submit(local, now) {
            return refused(&e);
        }
        state.bindings.insert(
            job.job_id.clone(),
            Binding {
                fencing_token: job.fencing_token,
                started_at: None,
                stopped_at_limit: at_limit.then_some(run_for),
                reason: String::new(),
            },
        );
        // Fair share decides, not arrival: this pass may start other queues' jobs first, or
        // instead.
        let mut admission = None;
        for started in state.scheduler.schedule(now) {
            let Some(binding) = state.bindings.get_mut(&started.job_id) else { continue };
            binding.started_at = Some(now);
            if started.job_id == job.job_id {
                admission = Some(Admission::Started { nodes: started.nodes });
            } else {
                self.shared.emit(&started.job_id, binding.fencing_token, JobPhase::Running { nodes: started.nodes });
            }
        }
        let admission = admission.unwrap_or_else(|| {
            let reason = state.pending_reason(&job.job_id);
            if let Some(binding) = state.bindings.get_mut(&job.job_id) {
                binding.reason.clone_from(&reason);
            }
            Admission::Queued { reason }
        });
        drop(state);
        self.shared.wake.notify_one();
        admission
    }

    fn cancel_now(&self, job_id: &str, fencing_token: u64) {
        let mut state = self.shared.lock();
        if state.bindings.get(job_id).is_none_or(|b| b.fencing_token != fencing_token) {
            return;
        }
        state.bindings.remove(job_id);
        state.scheduler.cancel(job_id);
        drop(state);
        // Freed GPUs may let a waiting job start.
        self.shared.wake.notify_one();
    }

    fn list_now(&self) -> Vec<HeldJob> {
        let state = self.shared.lock();
        let nodes: BTreeMap<&str, &Vec<String>> =
            state.scheduler.running().map(|r| (r.job.id.as_str(), &r.nodes)).collect();
        state
            .bindings
            .iter()
            .map(|(job_id, binding)| HeldJob {
                job_id: job_id.clone(),
                fencing_token: binding.fencing_token,
                phase: match nodes.get(job_id.as_str()) {
                    Some(nodes) => JobPhase::Running { nodes: (*nodes).clone() },
                    None => JobPhase::Pending { reason: state.pending_reason(job_id) },
                },
            })
            .collect()
    }

    fn pressure_now(&self) -> QueuePressure {
        let state = self.shared.lock();
        // The scheduler counts in shrunk time; the gateway compares waits with job-time rules
        // such as `burst.after`, so report in job time.
        let mut pressure = state.scheduler.pressure(self.shared.now());
        let unscale = |secs: u64| (secs as f64 / state.time_scale).round() as u64;
        for release in &mut pressure.releases {
            release.after_secs = unscale(release.after_secs);
        }
        pressure.estimated_wait_secs = unscale(pressure.estimated_wait_secs);
        pressure
    }
}

impl Drop for BuiltinBackend {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl LocalBackend for BuiltinBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Builtin
    }

    fn submit<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, Admission> {
        Box::pin(std::future::ready(Ok(self.submit_now(job))))
    }

    fn cancel<'a>(&'a self, job_id: &'a str, fencing_token: u64) -> BackendFuture<'a, ()> {
        self.cancel_now(job_id, fencing_token);
        Box::pin(std::future::ready(Ok(())))
    }

    fn list(&self) -> BackendFuture<'_, Vec<HeldJob>> {
        Box::pin(std::future::ready(Ok(self.list_now())))
    }
}

impl InventorySource for BuiltinBackend {
    fn inventory(&self) -> BackendFuture<'_, Inventory> {
        Box::pin(std::future::ready(Ok(self.shared.lock().scheduler.inventory())))
    }

    fn pressure(&self) -> BackendFuture<'_, QueuePressure> {
        Box::pin(std::future::ready(Ok(self.pressure_now())))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the scheduler as consistent as any other
        // moment between calls; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.epoch)
    }

    fn emit(&self, job_id: &str, fencing_token: u64, phase: JobPhase) {
        // The agent dropping its receiver means it is shutting down; nobody needs the event.
        let _ = self.events.send(JobEvent { job_id: job_id.to_string(), fencing_token, phase });
    }

    /// When the next running job is due, as an instant.
    fn next_due(&self) -> Option<Instant> {
        let due = self.lock().scheduler.next_completion()?;
        self.epoch.checked_add(due)
    }

    /// Completes due jobs, starts what may start, and reports every change.
    fn advance(&self) {
        let mut state = self.lock();
        let now = self.now();
        for job_id in state.scheduler.complete_due(now) {
            let Some(binding) = state.bindings.remove(&job_id) else { continue };
            let ran = binding.started_at.map(|at| now.saturating_sub(at)).unwrap_or_default();
            let phase = match binding.stopped_at_limit {
                Some(limit) => JobPhase::Failed {
                    message: format!("stopped at its runtime limit after {:.1}s", limit.as_secs_f64()),
                },
                None => JobPhase::Succeeded { message: format!("completed after {:.1}s", ran.as_secs_f64()) },
            };
            self.emit(&job_id, binding.fencing_token, phase);
        }
        for started in state.scheduler.schedule(now) {
            let Some(binding) = state.bindings.get_mut(&started.job_id) else { continue };
            binding.started_at = Some(now);
            self.emit(&started.job_id, binding.fencing_token, JobPhase::Running { nodes: started.nodes });
        }
        let waiting: Vec<String> = state.scheduler.pending().map(|p| p.job.id.clone()).collect();
        for job_id in waiting {
            let reason = state.pending_reason(&job_id);
            let Some(binding) = state.bindings.get_mut(&job_id) else { continue };
            if binding.reason != reason {
                binding.reason.clone_from(&reason);
                self.emit(&job_id, binding.fencing_token, JobPhase::Pending { reason });
            }
        }
    }
}

impl State {
    /// The current admission of a binding the scheduler holds.
    fn admission_of(&self, job_id: &str) -> Admission {
        match self.scheduler.running().find(|r| r.job.id == job_id) {
            Some(running) => Admission::Started { nodes: running.nodes.clone() },
            None => Admission::Queued { reason: self.pending_reason(job_id) },
        }
    }

    /// Why a pending job waits, with numbers.
    fn pending_reason(&self, job_id: &str) -> String {
        let Some(pending) = self.scheduler.pending().find(|p| p.job.id == job_id) else {
            return String::new();
        };
        let queue = &pending.job.queue;
        let in_queue: Vec<&str> =
            self.scheduler.pending().filter(|p| &p.job.queue == queue).map(|p| p.job.id.as_str()).collect();
        let position = in_queue.iter().position(|id| *id == job_id).map_or(0, |i| i + 1);
        format!(
            "waiting in local queue `{queue}` ({position} of {}); needs {} GPUs, {} of {} free",
            in_queue.len(),
            pending.job.total_gpus(),
            self.scheduler.free_gpus(),
            self.scheduler.total_gpus(),
        )
    }
}

/// Sleeps until the next job is due or a submit/cancel wakes it, then advances; forever (the
/// backend aborts it when dropped).
async fn drive(shared: Arc<Shared>) {
    loop {
        let due = shared.next_due();
        tokio::select! {
            () = crate::sleep_until_opt(due) => {}
            () = shared.wake.notified() => {}
        }
        shared.advance();
    }
}

/// How long a job runs at `time_scale`, and whether it is cut at its runtime limit.
fn run_time(spec: &JobSpec, time_scale: f64) -> (Duration, bool) {
    let estimate = spec.runtime.estimate.0;
    let (length, at_limit) = match spec.runtime.limit {
        Some(HumanDuration(limit)) if limit < estimate => (limit, true),
        _ => (estimate, false),
    };
    (Duration::from_secs_f64((length.as_secs_f64() * time_scale).max(0.001)), at_limit)
}

/// The admission for a job the scheduler would not queue.
fn refused(error: &SchedulerError) -> Admission {
    let permanent = matches!(
        error,
        SchedulerError::NeverFits { .. } | SchedulerError::InvalidJob { .. } | SchedulerError::UnknownQueue { .. }
    );
    Admission::Refused { reason: error.to_string(), permanent }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use meridian_proto::spec::{GangSpec, Payload, PlacementRules, Resources, RuntimeSpec};
    use tokio::sync::mpsc;

    use super::*;
    use crate::backend::JobEventReceiver;
    use crate::builtin::{NodeSpec, QueueSpec};

    fn node(name: &str, gpus: u32) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            shape: "h100x8".into(),
            gpu_type: "h100".into(),
            gpu_memory_gib: 80,
            gpus,
            cpu: 64,
            memory_gib: 512,
            labels: Default::default(),
        }
    }

    fn spec(tenant: &str, gpus: u32, estimate_secs: u64) -> JobSpec {
        JobSpec {
            name: "train".into(),
            tenant: tenant.into(),
            priority: 50,
            labels: BTreeMap::new(),
            idempotency_key: None,
            gang: GangSpec {
                replicas: 1,
                resources: Resources { gpus, gpu_types: Vec::new(), gpu_memory_gib: 0, cpu: 1, memory_gib: 1 },
            },
            runtime: RuntimeSpec { estimate: HumanDuration::from_secs(estimate_secs), limit: None },
            data: Vec::new(),
            placement: PlacementRules::default(),
            payload: Payload { image: Some("img".into()), command: Vec::new(), env: BTreeMap::new() },
        }
    }

    fn assignment(job_id: &str, token: u64, spec: JobSpec) -> Assignment {
        Assignment { job_id: job_id.into(), fencing_token: token, spec }
    }

    /// One 8-GPU node and two equal queues, `a` and `b`; jobs run for their estimate.
    fn backend() -> (BuiltinBackend, JobEventReceiver) {
        let scheduler = BuiltinScheduler::new(
            vec![node("n-0", 8)],
            vec![QueueSpec { name: "a".into(), weight: 1.0 }, QueueSpec { name: "b".into(), weight: 1.0 }],
        )
        .unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        (BuiltinBackend::new(scheduler, 1.0, tx).unwrap(), rx)
    }

    async fn next_event(events: &mut JobEventReceiver) -> JobEvent {
        tokio::time::timeout(Duration::from_secs(3600), events.recv()).await.unwrap().unwrap()
    }

    /// The next event that is not a pending job's new reason.
    async fn next_change(events: &mut JobEventReceiver) -> JobEvent {
        loop {
            let event = next_event(events).await;
            if !matches!(event.phase, JobPhase::Pending { .. }) {
                return event;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_that_fits_starts_at_once_and_succeeds_after_its_estimate() {
        let (backend, mut events) = backend();
        let started = Instant::now();
        let admission = backend.submit(&assignment("j-1", 7, spec("a", 4, 60))).await.unwrap();
        assert_eq!(admission, Admission::Started { nodes: vec!["n-0".into()] });
        assert_eq!(backend.inventory().await.unwrap().gpus_free(), 4, "inventory shows the GPUs taken at once");
        let event = next_event(&mut events).await;
        assert_eq!(event.job_id, "j-1");
        assert_eq!(event.fencing_token, 7);
        assert!(matches!(event.phase, JobPhase::Succeeded { .. }), "{event:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert_eq!(backend.inventory().await.unwrap().gpus_free(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_queues_locally_when_the_cluster_is_busy_and_starts_when_capacity_frees() {
        let (backend, mut events) = backend();
        backend.submit(&assignment("big", 1, spec("a", 8, 100))).await.unwrap();
        let admission = backend.submit(&assignment("next", 2, spec("a", 8, 10))).await.unwrap();
        let Admission::Queued { reason } = admission else { panic!("expected queued, got {admission:?}") };
        assert!(reason.contains("local queue `a`") && reason.contains("0 of 8 free"), "{reason}");
        assert_eq!(backend.pressure().await.unwrap().pending_gpus(), 8);

        let done = next_change(&mut events).await;
        assert_eq!((done.job_id.as_str(), done.phase.is_terminal()), ("big", true));
        let started = next_change(&mut events).await;
        assert_eq!(
            started,
            JobEvent {
                job_id: "next".into(),
                fencing_token: 2,
                phase: JobPhase::Running { nodes: vec!["n-0".into()] }
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fair_share_between_two_queues_decides_who_starts_when_capacity_frees() {
        let (backend, mut events) = backend();
        // Queue `a` holds the whole node; `a` and then `b` queue one job each behind it.
        backend.submit(&assignment("a-1", 1, spec("a", 8, 100))).await.unwrap();
        assert!(matches!(
            backend.submit(&assignment("a-2", 1, spec("a", 8, 100))).await.unwrap(),
            Admission::Queued { .. }
        ));
        assert!(matches!(
            backend.submit(&assignment("b-1", 1, spec("b", 8, 100))).await.unwrap(),
            Admission::Queued { .. }
        ));
        assert_eq!(next_change(&mut events).await.job_id, "a-1");
        // `a` has used the cluster for 100 s, `b` not at all: `b` goes first though it came later.
        let started = next_change(&mut events).await;
        assert_eq!(
            (started.job_id.as_str(), &started.phase),
            ("b-1", &JobPhase::Running { nodes: vec!["n-0".into()] })
        );
        assert_eq!(next_change(&mut events).await.job_id, "b-1");
        assert_eq!(next_change(&mut events).await.job_id, "a-2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_that_can_never_fit_is_refused_permanently() {
        let (backend, _events) = backend();
        let admission = backend.submit(&assignment("huge", 1, spec("a", 16, 10))).await.unwrap();
        assert!(matches!(admission, Admission::Refused { permanent: true, .. }), "{admission:?}");
        assert!(backend.list().await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_binding_of_a_held_job_is_refused_until_the_first_is_cancelled() {
        let (backend, _events) = backend();
        backend.submit(&assignment("j", 1, spec("a", 1, 100))).await.unwrap();
        let admission = backend.submit(&assignment("j", 2, spec("a", 1, 100))).await.unwrap();
        assert!(matches!(admission, Admission::Refused { permanent: false, .. }), "{admission:?}");
        backend.cancel("j", 1).await.unwrap();
        assert!(matches!(
            backend.submit(&assignment("j", 2, spec("a", 1, 100))).await.unwrap(),
            Admission::Started { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_cut_at_its_runtime_limit_fails() {
        let (backend, mut events) = backend();
        let mut limited = spec("a", 1, 100);
        limited.runtime.limit = Some(HumanDuration::from_secs(30));
        backend.submit(&assignment("j", 1, limited)).await.unwrap();
        let event = next_event(&mut events).await;
        assert!(matches!(&event.phase, JobPhase::Failed { message } if message.contains("runtime limit")), "{event:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_backend_stops_its_driver() {
        let (backend, mut events) = backend();
        backend.submit(&assignment("j", 1, spec("a", 1, 100))).await.unwrap();
        drop(backend);
        // The driver held the only other sender; once it is stopped the channel closes.
        assert_eq!(tokio::time::timeout(Duration::from_secs(1000), events.recv()).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_builtin_backend_passes_the_conformance_suite() {
        let (backend, events) = backend();
        let backend = Arc::new(backend);
        crate::backend::conformance::run(crate::backend::conformance::Subject {
            backend: backend.clone(),
            inventory: backend,
            events,
            fits: assignment("fits", 3, spec("a", 2, 60)),
            never_fits: assignment("never", 3, spec("a", 64, 60)),
        })
        .await;
    }
}
