//! The builtin backend's process runner: runs each started job's `payload.command` on this host,
//! one child process per replica, and ends the job by their exit codes.
//!
//! - Each replica runs `payload.command` directly (no shell) in a process group of its own, with
//!   the agent's environment, the job contract's variables ([`job_env`]: the coordinator is
//!   `127.0.0.1` and a loopback port free when the job starts), the payload's `env`, and
//!   `CUDA_VISIBLE_DEVICES` (the devices [`DeviceTable`] gave it).
//! - All replicas exit 0: Succeeded. One exits non-zero or is killed: Failed with the code or
//!   signal, and the others are stopped (gang). The runtime limit stops the job: Failed.
//! - Stopping is SIGTERM to each process group, then SIGKILL after `killGrace`. Dropping the
//!   runner kills every group at once, so no job outlives the agent.
//! - A [`watchdog`] process, when the runner is given the agent binary to run it, kills the
//!   groups when the agent cannot: `killGrace` after its lease ran out while it is frozen, and
//!   at once when it died without dropping the runner (SIGKILL, a crash).
//! - stdout and stderr go to a bounded ring per job ([`output`]); the terminal message repeats
//!   the last lines.
//!
//! Known limit: a cancelled job's devices are handed out again at once (the scheduler's
//! inventory must reflect a cancel when it returns), while its processes may take up to
//! `killGrace` to exit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use meridian_proto::job_env;
use meridian_proto::spec::JobSpec;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::backend::{BackendError, LogChunk};

pub mod config;
pub mod devices;
pub mod discovery;
pub mod group;
pub mod output;
pub mod supervisor;
pub mod watchdog;

pub use config::{GpuDiscovery, ProcessConfig};
pub use devices::{Allocation, DeviceTable};
use group::ProcessGroup;
use output::LogStore;
pub use supervisor::Outcome;
use supervisor::{Launch, supervise};
use watchdog::Watchdog;

/// How the process runner runs jobs.
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Output bytes kept per job.
    pub log_bytes: usize,
    /// This host's devices per scheduler node.
    pub devices: DeviceTable,
    /// The agent binary, to run the [`watchdog`] (`meridian-agent lease-watchdog`) that enforces
    /// the lease when the agent cannot. None: no watchdog (tests, agents embedded in another
    /// program); jobs then stop only when the agent stops them.
    pub lease_watchdog: Option<PathBuf>,
    /// The member cluster's name (`MERIDIAN_CLUSTER`).
    pub cluster: String,
}

/// Every replica of a job runs on this host, so they meet on loopback.
const LOOPBACK: &str = "127.0.0.1";

/// A run that ended, as the supervisor reports it to the backend's driver.
#[derive(Debug)]
pub struct Exit {
    /// Which run.
    pub run_id: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// The receiving half of run endings; the backend's driver owns it.
pub type ExitReceiver = mpsc::UnboundedReceiver<Exit>;

/// The running jobs' processes, devices and output.
pub struct ProcessRunner {
    settings: ProcessSettings,
    logs: LogStore,
    runs: BTreeMap<u64, Run>,
    next_run: u64,
    exits: mpsc::UnboundedSender<Exit>,
    runtime: tokio::runtime::Handle,
    watchdog: Option<Watchdog>,
}

/// One run of a job: its supervisor task and what it holds.
struct Run {
    job_id: String,
    fencing_token: u64,
    /// The coordinator port handed to its replicas (`MERIDIAN_COORDINATOR_PORT`).
    port: u16,
    /// Devices held; empty once given back.
    allocation: Allocation,
    /// Fires to cancel; None once cancelled.
    stop: Option<oneshot::Sender<()>>,
    groups: Arc<Mutex<Vec<ProcessGroup>>>,
    task: JoinHandle<()>,
    /// True once the run's supervisor has returned: every process of the run has exited.
    ended: watch::Receiver<bool>,
}

impl ProcessRunner {
    /// A runner with nothing running, and the receiver of its run endings. Supervisor tasks are
    /// spawned on `runtime`.
    ///
    /// With `settings.lease_watchdog` it starts the watchdog process; when that fails it logs an
    /// error and runs without one: the watchdog only narrows what a frozen or killed agent
    /// leaves running, and a host that runs no jobs at all (for a full `TMPDIR`, say) would be
    /// worse.
    pub fn new(settings: ProcessSettings, runtime: tokio::runtime::Handle) -> (Self, ExitReceiver) {
        let (exits, receiver) = mpsc::unbounded_channel();
        let watchdog = settings.lease_watchdog.as_deref().and_then(|exe| {
            match Watchdog::start(exe, settings.kill_grace) {
                Ok(watchdog) => {
                    tracing::info!(state = %watchdog.state_file().display(), "lease watchdog started");
                    Some(watchdog)
                }
                Err(error) => {
                    tracing::error!(%error, "running without a lease watchdog: jobs of a frozen or killed agent keep running");
                    None
                }
            }
        });
        let runner =
            Self { settings, logs: LogStore::default(), runs: BTreeMap::new(), next_run: 0, exits, runtime, watchdog };
        (runner, receiver)
    }

    /// The agent's lease now runs until `deadline` (None: no lease); see
    /// [`crate::backend::LocalBackend::lease_changed`]. Only the watchdog acts on it: it kills
    /// every job's processes `killGrace` after the deadline unless they ended before.
    pub fn lease_changed(&self, deadline: Option<SystemTime>) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.set_deadline(deadline);
        }
    }

    /// The watchdog's state file, when a watchdog runs (for diagnostics and tests).
    pub fn watchdog_state(&self) -> Option<PathBuf> {
        self.watchdog.as_ref().map(Watchdog::state_file)
    }

    /// Why this runner can never run `spec`, if it cannot.
    pub fn refuse(spec: &JobSpec) -> Option<String> {
        if spec.payload.image.is_some() {
            return Some(
                "payload.image: this cluster runs commands as plain processes, not containers (runner: process)".into(),
            );
        }
        if spec.payload.command.first().is_none_or(|program| program.is_empty()) {
            return Some("payload.command: the process runner needs a command to run; this payload has none".into());
        }
        None
    }

    /// Starts `spec` with one replica on each of `nodes`; returns the run's id. Every ending
    /// (including a failure to start) arrives later as an [`Exit`].
    pub fn start(&mut self, job_id: &str, fencing_token: u64, spec: &JobSpec, nodes: &[String]) -> u64 {
        let run_id = self.next_run;
        self.next_run += 1;
        let log = self.logs.open(job_id, fencing_token, self.settings.log_bytes);
        let groups = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = oneshot::channel();
        let replicas = nodes.len();
        let port = self.coordinator_port();
        let allocation = match port {
            Ok(_) => self.settings.devices.allocate(nodes, spec.gang.resources.gpus),
            Err(ref reason) => Err(reason.clone()),
        };
        let port = port.unwrap_or_default();
        let exits = self.exits.clone();
        let (ended_tx, ended) = watch::channel(false);
        let task = match &allocation {
            Ok(allocation) => {
                let facts = job_env::Facts {
                    job_id: job_id.to_string(),
                    fencing_token,
                    cluster: self.settings.cluster.clone(),
                    replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
                    gpus_per_replica: spec.gang.resources.gpus,
                    coordinator_host: LOOPBACK.to_string(),
                    coordinator_port: port,
                };
                let envs = (0u32..)
                    .zip(&allocation.replicas)
                    .map(|(index, (_, devices))| {
                        let mut env = facts.environment(&spec.payload, index);
                        env.push(("CUDA_VISIBLE_DEVICES".into(), devices.join(",")));
                        env
                    })
                    .collect();
                let launch = Launch {
                    argv: spec.payload.command.clone(),
                    replicas: envs,
                    limit: spec.runtime.limit.map(|limit| limit.0),
                    kill_grace: self.settings.kill_grace,
                    log,
                    groups: Arc::clone(&groups),
                    watchdog: self.watchdog.clone(),
                    run_id,
                };
                self.runtime.spawn(async move {
                    let outcome = supervise(launch, stopped).await;
                    let _ = ended_tx.send(true);
                    let _ = exits.send(Exit { run_id, outcome });
                })
            }
            Err(reason) => {
                let message = format!("could not start: {reason}");
                log.append(format!("{message}\n").as_bytes());
                log.end();
                let _ = ended_tx.send(true);
                self.runtime.spawn(async move {
                    let _ = exits.send(Exit { run_id, outcome: Outcome::Failed(message) });
                })
            }
        };
        let run = Run {
            job_id: job_id.to_string(),
            fencing_token,
            port,
            allocation: allocation.unwrap_or_default(),
            stop: Some(stop),
            groups,
            task,
            ended,
        };
        self.runs.insert(run_id, run);
        run_id
    }

    /// A loopback port for a new run's coordinator: one the kernel says is free now and that no
    /// live run was given. The port is released before the job binds it, so another program
    /// on the host could take it in between; that race is the same one every launcher that
    /// picks a free port has, and the job then fails to bind and says so.
    fn coordinator_port(&self) -> Result<u16, String> {
        let mut error = None;
        for _ in 0..16 {
            match std::net::TcpListener::bind((LOOPBACK, 0)).and_then(|listener| listener.local_addr()) {
                Ok(address) if !self.runs.values().any(|run| run.port == address.port()) => return Ok(address.port()),
                Ok(_) => {}
                Err(e) => error = Some(e),
            }
        }
        Err(match error {
            Some(e) => format!("no free loopback port for the job's coordinator: {e}"),
            None => "no free loopback port for the job's coordinator: every one offered is in use by a job".into(),
        })
    }

    /// Stops the live run of a binding: SIGTERM now, SIGKILL after the grace; its devices are
    /// free at once. Its ending is not reported. Returns what turns true once every process of
    /// the run has exited (None: no run of that binding was live): the agent reports a stopped
    /// job only then, since the gateway may start it elsewhere on that report.
    pub fn cancel(&mut self, job_id: &str, fencing_token: u64) -> Option<watch::Receiver<bool>> {
        let run = self
            .runs
            .values_mut()
            .find(|r| r.job_id == job_id && r.fencing_token == fencing_token && r.stop.is_some())?;
        if let Some(stop) = run.stop.take() {
            let _ = stop.send(());
        }
        self.settings.devices.release(&std::mem::take(&mut run.allocation));
        self.logs.ended(job_id, fencing_token);
        Some(run.ended.clone())
    }

    /// Asks the live run of a binding to stop (SIGTERM to every replica's process group) without
    /// ending it: it keeps its devices, and its exit is reported as usual. Preemption uses this
    /// so the job may checkpoint during its grace.
    pub fn terminate(&self, job_id: &str, fencing_token: u64) {
        let live =
            self.runs.values().find(|r| r.job_id == job_id && r.fencing_token == fencing_token && r.stop.is_some());
        if let Some(run) = live {
            let groups = run.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for group in groups.iter() {
                group.terminate();
            }
        }
    }

    /// Records the end of a run. Returns the binding and outcome when the run was live (not
    /// cancelled), so the backend reports it.
    pub fn finished(&mut self, exit: Exit) -> Option<(String, u64, Outcome)> {
        let run = self.runs.remove(&exit.run_id)?;
        if let Some(watchdog) = &self.watchdog {
            watchdog.remove_run(exit.run_id);
        }
        self.settings.devices.release(&run.allocation);
        self.logs.ended(&run.job_id, run.fencing_token);
        run.stop.is_some().then_some((run.job_id, run.fencing_token, exit.outcome))
    }

    /// Output of a binding this runner ran; see [`crate::backend::LocalBackend::logs`].
    pub fn logs(
        &self,
        job_id: &str,
        fencing_token: u64,
        from: Option<u64>,
        max_bytes: usize,
    ) -> Result<LogChunk, BackendError> {
        match self.logs.get(job_id, fencing_token) {
            Some(log) => Ok(log.read(from, max_bytes)),
            None => Err(BackendError::permanent(format!(
                "job `{job_id}` (binding {fencing_token}): no output kept here; it never started on this agent or ended long ago"
            ))),
        }
    }

    /// The devices each live run holds, by job id (for tests and diagnostics).
    pub fn allocations(&self) -> BTreeMap<String, Allocation> {
        self.runs.values().filter(|r| r.stop.is_some()).map(|r| (r.job_id.clone(), r.allocation.clone())).collect()
    }
}

impl Drop for ProcessRunner {
    /// Kills every process group at once (no orphans), stops the supervisors, then the
    /// watchdog (nothing is left for it to kill).
    fn drop(&mut self) {
        for run in self.runs.values() {
            for group in run.groups.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                group.kill();
            }
            run.task.abort();
        }
        if let Some(watchdog) = &self.watchdog {
            watchdog.stop();
        }
    }
}
