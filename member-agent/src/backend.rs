//! The seam between the agent and a cluster's local scheduler.
//!
//! [`LocalBackend`] is synchronous: the builtin scheduler is a pure state machine and answers at
//! once. Backends that talk to a real scheduler (Slurm, Kubernetes) will wrap their I/O behind
//! the same calls.

use std::collections::BTreeMap;
use std::time::Duration;

use meridian_proto::inventory::{BackendKind, Inventory, QueuePressure};
use meridian_proto::spec::JobSpec;

use crate::builtin::{BuiltinScheduler, Cancelled, LocalJob};

/// A job that finished on its own (not cancelled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The job.
    pub job_id: String,
    /// Whether it succeeded.
    pub succeeded: bool,
    /// Why it failed, or a short note.
    pub message: String,
}

/// A cluster's local scheduler as the agent drives it.
pub trait LocalBackend: Send {
    /// Which scheduler this is.
    fn kind(&self) -> BackendKind;
    /// Starts the whole gang now or refuses with a reason; nothing changes on refusal.
    /// Returns the node of each replica.
    fn start(&mut self, job_id: &str, spec: &JobSpec, now: Duration) -> Result<Vec<String>, String>;
    /// Stops a job. Returns whether the backend knew it.
    fn cancel(&mut self, job_id: &str) -> bool;
    /// Jobs that finished by `now`.
    fn poll(&mut self, now: Duration) -> Vec<Finished>;
    /// When `poll` next has something to say, if ever.
    fn next_event(&self) -> Option<Duration>;
    /// Node shapes and what is free on each node.
    fn inventory(&self) -> Inventory;
    /// Local queue load and expected GPU releases.
    fn pressure(&self, now: Duration) -> QueuePressure;
}

/// The builtin gang + fair-share scheduler over declared nodes; a job "runs" for its
/// `runtime.estimate × time_scale`, then succeeds.
pub struct BuiltinBackend {
    scheduler: BuiltinScheduler,
    time_scale: f64,
    started: BTreeMap<String, Duration>,
}

impl BuiltinBackend {
    /// Wraps a scheduler. `time_scale` shrinks (or stretches) run times.
    pub fn new(scheduler: BuiltinScheduler, time_scale: f64) -> Self {
        Self { scheduler, time_scale, started: BTreeMap::new() }
    }

    /// How long a job runs here.
    pub fn run_time(&self, spec: &JobSpec) -> Duration {
        Duration::from_secs_f64((spec.runtime.estimate.as_secs_f64() * self.time_scale).max(0.001))
    }
}

impl LocalBackend for BuiltinBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Builtin
    }

    fn start(&mut self, job_id: &str, spec: &JobSpec, now: Duration) -> Result<Vec<String>, String> {
        let queue = self.scheduler.queue_for(&spec.tenant).to_string();
        let job = LocalJob::from_spec(job_id, spec, &queue, self.run_time(spec));
        let started = self.scheduler.start_now(job, now).map_err(|e| e.to_string())?;
        self.started.insert(job_id.to_string(), now);
        Ok(started.nodes)
    }

    fn cancel(&mut self, job_id: &str) -> bool {
        self.started.remove(job_id);
        !matches!(self.scheduler.cancel(job_id), Cancelled::NotFound)
    }

    fn poll(&mut self, now: Duration) -> Vec<Finished> {
        self.scheduler
            .complete_due(now)
            .into_iter()
            .map(|job_id| {
                let ran = self.started.remove(&job_id).map(|at| now.saturating_sub(at)).unwrap_or_default();
                Finished { job_id, succeeded: true, message: format!("completed after {:.1}s", ran.as_secs_f64()) }
            })
            .collect()
    }

    fn next_event(&self) -> Option<Duration> {
        self.scheduler.next_completion()
    }

    fn inventory(&self) -> Inventory {
        self.scheduler.inventory()
    }

    fn pressure(&self, now: Duration) -> QueuePressure {
        // The scheduler counts in shrunk time; the gateway compares waits with job-time rules
        // such as `burst.after`, so report in job time.
        let mut pressure = self.scheduler.pressure(now);
        let unscale = |secs: u64| (secs as f64 / self.time_scale).round() as u64;
        for release in &mut pressure.releases {
            release.after_secs = unscale(release.after_secs);
        }
        pressure.estimated_wait_secs = unscale(pressure.estimated_wait_secs);
        pressure
    }
}
