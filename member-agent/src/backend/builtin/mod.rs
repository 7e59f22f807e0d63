//! The builtin backend: Meridian's own gang + fair-share scheduler over this cluster's nodes,
//! run in real (tokio) time, with one of two runners:
//!
//! - **simulated** ([`Runner::Simulated`]): a job "runs" for `runtime.estimate × time_scale` and
//!   then succeeds; a job whose `runtime.limit` is shorter than its estimate is stopped at the
//!   limit and fails. For demos and tests; nothing is executed.
//! - **process** ([`Runner::Process`]): a job runs its `payload.command` on this host, one child
//!   process per replica ([`crate::backend::process`]); exit codes decide how it ends, and its
//!   end frees its GPUs for waiting jobs.
//!
//! Jobs queue locally: [`submit`](LocalBackend::submit) hands the job to the scheduler's queue and
//! then runs a scheduling pass, so fair share between queues and priority inside a queue decide
//! what starts, exactly as in the simulator. A driver task owned by the backend wakes when the
//! next simulated job is due or a process run ends, completes it, schedules waiting jobs and
//! reports each change as a [`JobEvent`].
//!
//! Sibling copies (`copies.rs`) wait in the same queues; one the scheduler starts keeps its
//! nodes, launches nothing until the gateway grants it, and is announced as a
//! [`CopyEvent::Ready`](super::CopyEvent::Ready).
//!
//! The scheduler lives behind a `std` mutex that is never held across an `.await`: every call
//! answers at once, so the futures the traits return are ready immediately.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::{BackendKind, Inventory, QueuePressure};
use meridian_proto::protocol::{Assignment, StartQuote};
use meridian_proto::spec::JobSpec;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::logs::{LogRequest, log_chunk};
use super::process::{Exit, ExitReceiver, Outcome, ProcessRunner, ProcessSettings};
use super::{
    Admission, BackendError, BackendFuture, CopyAdmission, CopyEventReceiver, HeldJob, InventorySource, JobEvent,
    JobEventSender, JobPhase, LocalBackend, LogChunk, backend_name,
};
use copies::Copies;
use meridian_scheduler::{BuiltinScheduler, Error as SchedulerError, LocalJob, Started};

/// How the builtin backend runs the jobs its scheduler starts.
#[derive(Debug, Clone)]
pub enum Runner {
    /// Pretend: a job takes `runtime.estimate × time_scale` and succeeds.
    Simulated {
        /// Multiplies every run time (1 = real time).
        time_scale: f64,
    },
    /// Run `payload.command` as processes on this host.
    Process(ProcessSettings),
}

/// The builtin gang + fair-share scheduler as a [`LocalBackend`] and an [`InventorySource`].
///
/// Owns a driver task that advances time; dropping the backend stops it and kills every process
/// the process runner started.
pub struct BuiltinBackend {
    shared: Arc<Shared>,
    driver: JoinHandle<()>,
    /// The receiving end of the sibling copies' events, until the agent takes it.
    copy_events: Mutex<Option<CopyEventReceiver>>,
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
    runner: RunnerState,
    /// Every binding the scheduler holds (pending or running), by job id.
    bindings: BTreeMap<String, Binding>,
    /// Sibling copies: in the scheduler, but no bindings (see `copies.rs`).
    copies: Copies,
}

enum RunnerState {
    Simulated {
        time_scale: f64,
    },
    /// Boxed: the runner is large and the simulated variant tiny.
    Process(Box<ProcessRunner>),
}

/// One binding the scheduler holds.
struct Binding {
    fencing_token: u64,
    /// The job, for the process runner to start it.
    spec: JobSpec,
    /// When it started, in scheduler time; None while it waits.
    started_at: Option<Duration>,
    /// Simulated runner: its runtime limit when that is shorter than its estimate, so it fails
    /// when it ends.
    stopped_at_limit: Option<Duration>,
    /// Process runner: the run started for it.
    run_id: Option<u64>,
    /// The reason last reported while it waits, so the driver reports only changes.
    reason: String,
}

impl BuiltinBackend {
    /// Starts the backend over `scheduler` with the simulated runner: job run times are
    /// multiplied by `time_scale`. Job events go to `events`.
    ///
    /// Must be called inside a Tokio runtime (the driver task is spawned on it); outside one it
    /// returns a permanent error.
    pub fn new(scheduler: BuiltinScheduler, time_scale: f64, events: JobEventSender) -> Result<Self, BackendError> {
        Self::with_runner(scheduler, Runner::Simulated { time_scale }, events)
    }

    /// Starts the backend over `scheduler` with `runner`. Job events go to `events`.
    ///
    /// Must be called inside a Tokio runtime (the driver task is spawned on it); outside one it
    /// returns a permanent error.
    pub fn with_runner(
        scheduler: BuiltinScheduler,
        runner: Runner,
        events: JobEventSender,
    ) -> Result<Self, BackendError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| BackendError::Permanent {
            message: "the builtin backend must be started inside a Tokio runtime".into(),
            source: Some(Box::new(e)),
        })?;
        let (runner, exits) = match runner {
            Runner::Simulated { time_scale } => (RunnerState::Simulated { time_scale }, None),
            Runner::Process(settings) => {
                let (runner, exits) = ProcessRunner::new(settings, runtime.clone());
                (RunnerState::Process(Box::new(runner)), Some(exits))
            }
        };
        let (copy_events_tx, copy_events) = tokio::sync::mpsc::unbounded_channel();
        let copies = Copies::new(copy_events_tx);
        let shared = Arc::new(Shared {
            state: Mutex::new(State { scheduler, runner, bindings: BTreeMap::new(), copies }),
            wake: Notify::new(),
            epoch: Instant::now(),
            events,
        });
        let driver = runtime.spawn(drive(Arc::clone(&shared), exits));
        Ok(Self { shared, driver, copy_events: Mutex::new(Some(copy_events)) })
    }

    /// How long `spec` runs here under the simulated runner, and whether it ends at its runtime
    /// limit (and so fails). Under the process runner: its estimate, and whether it has a limit.
    pub fn run_time(&self, spec: &JobSpec) -> (Duration, bool) {
        run_time(spec, self.shared.lock().time_scale())
    }

    /// The devices each running job holds under the process runner (empty when simulated).
    pub fn allocations(&self) -> BTreeMap<String, super::process::Allocation> {
        match &self.shared.lock().runner {
            RunnerState::Process(runner) => runner.allocations(),
            RunnerState::Simulated { .. } => BTreeMap::new(),
        }
    }

    fn submit_now(&self, job: &Assignment) -> Admission {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
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
        // The gateway placed the job here: a copy of it gives way first.
        state.drop_copy_of(&job.job_id);
        let process = matches!(state.runner, RunnerState::Process(_));
        if process && let Some(reason) = ProcessRunner::refuse(&job.spec) {
            return Admission::Refused { reason: format!("job `{}`: {reason}", job.job_id), permanent: true };
        }
        let (mut local, at_limit) = state.local_job(job);
        let run_for = local.run_for;
        local.last_preempted_at = crate::preemption::last_preempted_on_clock(job.last_preempted_at_ms, now);
        if let Err(e) = state.scheduler.submit(local, now) {
            return refused(&e);
        }
        state.bindings.insert(
            job.job_id.clone(),
            Binding {
                fencing_token: job.fencing_token,
                spec: job.spec.clone(),
                started_at: None,
                stopped_at_limit: (at_limit && !process).then_some(run_for),
                run_id: None,
                reason: String::new(),
            },
        );
        // Fair share decides, not arrival: this pass may start other queues' jobs first, or
        // instead.
        let mut admission = None;
        for started in state.scheduler.schedule(now) {
            if !state.start(&started, now) {
                continue;
            }
            if started.job_id == job.job_id {
                admission = Some(Admission::Started { nodes: started.nodes });
            } else if let Some(binding) = state.bindings.get(&started.job_id) {
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
        drop(guard);
        self.shared.wake.notify_one();
        admission
    }

    /// Cancels a binding; returns what turns true once its processes have exited (process
    /// runner), None when nothing of it runs.
    fn cancel_now(&self, job_id: &str, fencing_token: u64) -> Option<tokio::sync::watch::Receiver<bool>> {
        let mut state = self.shared.lock();
        if state.bindings.get(job_id).is_none_or(|b| b.fencing_token != fencing_token) {
            return None;
        }
        state.bindings.remove(job_id);
        state.scheduler.cancel(job_id);
        let ended = match &mut state.runner {
            RunnerState::Process(runner) => runner.cancel(job_id, fencing_token),
            _ => None,
        };
        drop(state);
        // Freed GPUs may let a waiting job start.
        self.shared.wake.notify_one();
        ended
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

    fn inventory_now(&self) -> Inventory {
        self.shared.lock().scheduler.inventory_for_offers()
    }

    fn pressure_now(&self) -> QueuePressure {
        let state = self.shared.lock();
        // The scheduler counts in shrunk time; the gateway compares waits with job-time rules
        // such as `burst.after`, so report in job time.
        let mut pressure = state.scheduler.pressure(self.shared.now());
        for release in &mut pressure.releases {
            release.after_secs = state.job_secs(release.after_secs);
        }
        pressure.estimated_wait_secs = state.job_secs(pressure.estimated_wait_secs);
        pressure
    }

    /// The scheduler's [quote](BuiltinScheduler::quote) for `job`'s shape, in job time (the
    /// scheduler counts in shrunk time, like [`pressure_now`](Self::pressure_now)).
    fn quote_now(&self, job: &Assignment) -> StartQuote {
        let state = self.shared.lock();
        let (local, _) = state.local_job(job);
        let mut quote = state.scheduler.quote(&local, self.shared.now());
        for start in &mut quote.starts {
            start.after_secs = state.job_secs(start.after_secs);
        }
        quote
    }

    fn logs_now(&self, job_id: &str, fencing_token: u64, request: LogRequest) -> Result<LogChunk, BackendError> {
        let state = self.shared.lock();
        let RunnerState::Process(runner) = &state.runner else {
            return Err(BackendError::permanent(format!(
                "job `{job_id}`: the {} backend's simulated runner runs no commands and keeps no job output",
                backend_name(BackendKind::Builtin)
            )));
        };
        let waiting =
            state.bindings.get(job_id).is_some_and(|b| b.fencing_token == fencing_token && b.run_id.is_none());
        if waiting {
            // Held but not started: no output yet, more to come.
            return Ok(log_chunk(&[], 0, 0, false));
        }
        runner.logs(job_id, fencing_token, request.from, request.max_bytes)
    }
}

impl Drop for BuiltinBackend {
    fn drop(&mut self) {
        self.driver.abort();
        // The runner kills its processes when dropped; replace it now rather than when the
        // last reference to the shared state goes, which may be a task that is still winding down.
        let mut state = self.shared.lock();
        state.runner = RunnerState::Simulated { time_scale: 1.0 };
    }
}

impl LocalBackend for BuiltinBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Builtin
    }

    fn devices(&self) -> BTreeMap<String, Vec<(String, Vec<String>)>> {
        self.allocations().into_iter().map(|(job, allocation)| (job, allocation.replicas)).collect()
    }

    fn submit<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, Admission> {
        Box::pin(std::future::ready(Ok(self.submit_now(job))))
    }

    fn cancel<'a>(&'a self, job_id: &'a str, fencing_token: u64) -> BackendFuture<'a, ()> {
        let ended = self.cancel_now(job_id, fencing_token);
        Box::pin(async move {
            // Returns once the processes are gone (at most `killGrace` and the output's drain):
            // the agent reports the job stopped on this, and the gateway may start it elsewhere.
            if let Some(mut ended) = ended {
                let _ = ended.wait_for(|ended| *ended).await;
            }
            Ok(())
        })
    }

    fn list(&self) -> BackendFuture<'_, Vec<HeldJob>> {
        Box::pin(std::future::ready(Ok(self.list_now())))
    }

    fn logs<'a>(
        &'a self,
        job_id: &'a str,
        fencing_token: u64,
        from: Option<u64>,
        max_bytes: usize,
    ) -> BackendFuture<'a, LogChunk> {
        Box::pin(std::future::ready(self.logs_now(job_id, fencing_token, LogRequest { from, max_bytes })))
    }

    fn quote<'a>(&'a self, job: &'a Assignment) -> BackendFuture<'a, StartQuote> {
        Box::pin(std::future::ready(Ok(self.quote_now(job))))
    }

    fn copy<'a>(&'a self, copy_token: u64, job: &'a Assignment) -> BackendFuture<'a, CopyAdmission> {
        Box::pin(std::future::ready(Ok(self.copy_now(copy_token, job))))
    }

    fn drop_copy<'a>(&'a self, job_id: &'a str, copy_token: u64) -> BackendFuture<'a, ()> {
        self.drop_copy_now(job_id, copy_token);
        Box::pin(std::future::ready(Ok(())))
    }

    fn grant<'a>(&'a self, copy_token: u64, job: &'a Assignment) -> BackendFuture<'a, Admission> {
        Box::pin(std::future::ready(Ok(self.grant_now(copy_token, job))))
    }

    fn copy_events(&self) -> Option<CopyEventReceiver> {
        self.copy_events.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Under the process runner, hands the deadline to its lease watchdog; nothing under the
    /// simulated runner, which runs no processes.
    fn lease_changed(&self, deadline: Option<std::time::SystemTime>) {
        if let RunnerState::Process(runner) = &self.shared.lock().runner {
            runner.lease_changed(deadline);
        }
    }
}

impl InventorySource for BuiltinBackend {
    fn inventory(&self) -> BackendFuture<'_, Inventory> {
        Box::pin(std::future::ready(Ok(self.inventory_now())))
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

    /// When the next simulated job is due (never under the process runner: processes end when
    /// they exit) or the next preemption victim's grace ends, as an instant.
    fn next_due(&self) -> Option<Instant> {
        let state = self.lock();
        let completion = match state.runner {
            RunnerState::Simulated { .. } => state.scheduler.next_completion(),
            RunnerState::Process(_) => None,
        };
        let due = [completion, state.scheduler.next_preemption_stop()].into_iter().flatten().min()?;
        self.epoch.checked_add(due)
    }

    /// Records the end of a process run, frees what it held and reports it.
    fn finish(&self, exit: Exit) {
        let mut state = self.lock();
        let RunnerState::Process(runner) = &mut state.runner else { return };
        let Some((job_id, fencing_token, outcome)) = runner.finished(exit) else { return };
        if state.bindings.get(&job_id).is_none_or(|b| b.fencing_token != fencing_token) {
            return;
        }
        if state.scheduler.end_grace_now(&job_id, self.now()) {
            // A preemption victim that exited on its SIGTERM: the next advance stops it and
            // reports it preempted, whatever its exit code.
            return;
        }
        state.bindings.remove(&job_id);
        state.scheduler.cancel(&job_id);
        let phase = match outcome {
            Outcome::Succeeded(message) => JobPhase::Succeeded { message },
            Outcome::Failed(message) => JobPhase::Failed { message },
            Outcome::Cancelled => return,
        };
        self.emit(&job_id, fencing_token, phase);
    }

    /// Completes due simulated jobs, starts what may start, and reports every change.
    fn advance(&self) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let now = self.now();
        let due = match state.runner {
            RunnerState::Simulated { .. } => state.scheduler.complete_due(now),
            RunnerState::Process(_) => Vec::new(),
        };
        for job_id in due {
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
        // Victims whose grace has ended stop now; the jobs they made room for start first.
        let stops = state.scheduler.stop_preempted(now);
        for job_id in stops.stopped {
            let Some(binding) = state.bindings.remove(&job_id) else { continue };
            if let RunnerState::Process(runner) = &mut state.runner {
                // Signalled at the start of the grace; SIGKILL follows after `killGrace` if it
                // has not exited.
                runner.cancel(&job_id, binding.fencing_token);
            }
            let ran = binding.started_at.map(|at| now.saturating_sub(at)).unwrap_or_default();
            let message = format!("preempted for higher-priority work after {:.1}s", ran.as_secs_f64());
            self.emit(&job_id, binding.fencing_token, JobPhase::Preempted { message });
        }
        for started in stops.started.into_iter().chain(state.scheduler.schedule(now)) {
            if !state.start(&started, now) {
                continue;
            }
            let Some(binding) = state.bindings.get(&started.job_id) else { continue };
            self.emit(&started.job_id, binding.fencing_token, JobPhase::Running { nodes: started.nodes });
        }
        let mut copies_dropped = false;
        for preemption in state.scheduler.preempt(now) {
            if state.copy_preempted(&preemption.victim, &preemption.for_job) {
                copies_dropped = true;
                continue;
            }
            let Some(binding) = state.bindings.get(&preemption.victim) else { continue };
            tracing::info!(job = %preemption.victim, for_job = %preemption.for_job, "preempting");
            if let RunnerState::Process(runner) = &state.runner {
                // SIGTERM now, so it may checkpoint; it keeps its GPUs and devices until it exits
                // or its grace ends (then SIGKILL after `killGrace`).
                runner.terminate(&preemption.victim, binding.fencing_token);
            }
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
        if copies_dropped {
            // The room the dropped copies left is for their preemptors: another pass at once.
            self.wake.notify_one();
        }
    }
}

impl State {
    /// Run times are scaled by this (1 under the process runner).
    fn time_scale(&self) -> f64 {
        match self.runner {
            RunnerState::Simulated { time_scale } => time_scale,
            RunnerState::Process(_) => 1.0,
        }
    }

    /// `secs` on the scheduler's (shrunk) clock in job time, as the gateway reads waits.
    fn job_secs(&self, secs: u64) -> u64 {
        (secs as f64 / self.time_scale()).round() as u64
    }

    /// The scheduler's view of `job` in its tenant's queue, and whether its run here ends at its
    /// runtime limit.
    fn local_job(&self, job: &Assignment) -> (LocalJob, bool) {
        let queue = self.scheduler.queue_for(&job.spec.tenant).to_string();
        let (run_for, at_limit) = run_time(&job.spec, self.time_scale());
        (LocalJob::from_spec(&job.job_id, &job.spec, queue, run_for), at_limit)
    }

    /// Records that the scheduler started a job and, under the process runner, starts its
    /// processes. False when the job has no binding (nothing to report; a copy is ready).
    fn start(&mut self, started: &Started, now: Duration) -> bool {
        let Some(binding) = self.bindings.get_mut(&started.job_id) else {
            self.copy_started(started);
            return false;
        };
        binding.started_at = Some(now);
        if let RunnerState::Process(runner) = &mut self.runner {
            binding.run_id = Some(runner.start(&started.job_id, binding.fencing_token, &binding.spec, &started.nodes));
        }
        true
    }

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

/// Sleeps until the next simulated job is due, a process run ends, or a submit/cancel wakes it,
/// then advances; forever (the backend aborts it when dropped).
async fn drive(shared: Arc<Shared>, mut exits: Option<ExitReceiver>) {
    loop {
        let due = shared.next_due();
        tokio::select! {
            () = meridian_process::sleep_until_opt(due) => {}
            () = shared.wake.notified() => {}
            Some(exit) = next_exit(&mut exits) => shared.finish(exit),
        }
        shared.advance();
    }
}

/// The next process run ending; never when there is no process runner.
async fn next_exit(exits: &mut Option<ExitReceiver>) -> Option<Exit> {
    match exits {
        Some(exits) => exits.recv().await,
        None => std::future::pending().await,
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

mod copies;
#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod fixture;
#[cfg(test)]
mod process_tests;
#[cfg(test)]
mod tests;
