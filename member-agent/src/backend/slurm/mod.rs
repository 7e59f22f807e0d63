//! The Slurm backend: Meridian jobs as Slurm batch jobs, driven through Slurm's own tools
//! (`sbatch`, `squeue`, `scontrol`, `scancel`), each run with a deadline.
//!
//! - A job is one `sbatch` (`--nodes=replicas --ntasks-per-node=1 --gres=gpu:TYPE:N`) whose
//!   script runs the payload's command once per replica with `srun` ([`script`]).
//! - The binding lives in Slurm: `--comment=meridian:<job>:<token>`. `submit` looks for it
//!   before submitting (idempotent per binding, also after an `sbatch` that timed out), and
//!   `list` finds every binding again after an agent restart. A cancelled binding's comment is
//!   rewritten to `meridian-cancelled:…` before `scancel`, so nobody adopts or reports it.
//! - Inventory comes from `scontrol -o -d show node` ([`parse`]), grouped into node shapes;
//!   pressure from `squeue`, per partition (and account, when a job has one).
//! - A status loop owned by the backend ([`poll`]) turns `squeue` changes into job events.
//!
//! Node features have no place in [`NodeShape`] yet: each feature `f` becomes part of the shape
//! name (`a100-80gx4-ib`) and is kept as label `f = "true"` in [`SlurmBackend::node_labels`],
//! so nodes with different features never share a shape.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::{BackendKind, GpuRelease, Inventory, NodeFree, NodeShape, QueueLoad, QueuePressure};
use meridian_proto::protocol::Assignment;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::task::JoinHandle;

use super::logs::{LogRequest, log_chunk};
use super::{Admission, BackendError, CopyEventReceiver, CopyEventSender, HeldJob, JobEventSender, JobPhase, LogChunk};

mod command;
mod config;
mod copies;
#[cfg(test)]
mod copy_tests;
mod env_file;
#[cfg(test)]
mod fair_share_tests;
#[cfg(test)]
mod live_tests;
mod parse;
mod poll;
mod quote;
#[cfg(test)]
mod quote_tests;
mod script;

pub use config::{QosRule, SlurmConfig};
pub use env_file::read_env_file;

use command::{Runner, args};
use parse::{SlurmNode, cancelled_comment_for, parse_nodes};

/// Slurm as a [`LocalBackend`] and an [`InventorySource`]. Owns its status loop; dropping the
/// backend stops it (the Slurm jobs keep running, for the next agent to adopt).
pub struct SlurmBackend {
    shared: Arc<Shared>,
    poller: JoinHandle<()>,
    /// The receiving end of the sibling copies' events, until the agent takes it.
    copy_events: Mutex<Option<CopyEventReceiver>>,
}

/// What the backend and its status loop share.
pub(crate) struct Shared {
    config: SlurmConfig,
    /// The member cluster's name (`MERIDIAN_CLUSTER`).
    cluster: String,
    runner: Runner,
    events: JobEventSender,
    /// Bindings whose changes are reported as events, by job id.
    tracked: Mutex<BTreeMap<String, Tracked>>,
    /// One submit or cancel at a time, so "look, then sbatch" cannot race itself.
    submit_lock: tokio::sync::Mutex<()>,
    /// One `sbatch --test-only` at a time, spaced apart ([`quote`]).
    quote_gate: quote::QuoteGate,
    /// Sibling copies queued behind a start gate, by job id ([`copies`]).
    copies: Mutex<BTreeMap<String, copies::SlurmCopy>>,
    /// Where the copies' events go.
    copy_events: CopyEventSender,
}

/// A binding the status loop watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tracked {
    fencing_token: u64,
    slurm_id: String,
    /// What was last reported (by `submit`, `list` or an event).
    phase: JobPhase,
    /// Its coordinator port.
    port: u16,
}

impl SlurmBackend {
    /// Starts the backend for the member cluster named `cluster`: checks that Slurm answers and that every GRES type of its nodes maps
    /// to a Meridian GPU type (a permanent error names the type and `slurm.gpuTypes`), then
    /// starts the status loop. Job events go to `events`.
    pub async fn new(config: SlurmConfig, cluster: String, events: JobEventSender) -> Result<Self, BackendError> {
        let runner = Runner {
            bin_dir: config.bin_dir.clone(),
            slurm_conf: config.slurm_conf.clone(),
            timeout: config.command_timeout.0,
        };
        tokio::fs::create_dir_all(&config.work_dir).await.map_err(|e| BackendError::Permanent {
            message: format!("slurm.workDir: cannot create `{}`", config.work_dir.display()),
            source: Some(Box::new(e)),
        })?;
        let (copy_events_tx, copy_events) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            config,
            cluster,
            runner,
            events,
            tracked: Mutex::new(BTreeMap::new()),
            submit_lock: tokio::sync::Mutex::new(()),
            quote_gate: quote::QuoteGate::default(),
            copies: Mutex::new(BTreeMap::new()),
            copy_events: copy_events_tx,
        });
        shared.inventory_now().await?;
        shared.cancel_orphan_copies().await?;
        let poller = tokio::spawn(poll::run_status_loop(Arc::downgrade(&shared)));
        Ok(Self { shared, poller, copy_events: Mutex::new(Some(copy_events)) })
    }

    /// Labels of each node (by name): every Slurm feature `f` as `f = "true"`.
    pub async fn node_labels(&self) -> Result<BTreeMap<String, BTreeMap<String, String>>, BackendError> {
        let nodes = self.shared.nodes().await?;
        Ok(nodes
            .into_iter()
            .map(|n| (n.name, n.features.into_iter().map(|f| (f, "true".to_string())).collect()))
            .collect())
    }

    /// Runs one status sync now (what the loop does every `pollInterval`); returns how many
    /// events it sent. For benchmarks and tests.
    pub async fn sync_status(&self) -> Result<usize, BackendError> {
        poll::sync_status(&self.shared).await
    }
}

impl Drop for SlurmBackend {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

impl Shared {
    fn lock_tracked(&self) -> MutexGuard<'_, BTreeMap<String, Tracked>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tracks a binding; `port` is its coordinator port, None for one submitted before (or by
    /// another agent): the port tracked for it, else the one it hashes to.
    fn track(&self, job_id: &str, fencing_token: u64, slurm_id: &str, phase: &JobPhase, port: Option<u16>) {
        if phase.is_terminal() {
            return;
        }
        let mut tracked = self.lock_tracked();
        let port = port
            .or_else(|| tracked.get(job_id).filter(|t| t.fencing_token == fencing_token).map(|t| t.port))
            .unwrap_or_else(|| self.config.coordinator_ports.nth(hashed_offset(job_id, fencing_token)));
        tracked.insert(
            job_id.to_string(),
            Tracked { fencing_token, slurm_id: slurm_id.to_string(), phase: phase.clone(), port },
        );
    }

    /// The coordinator port of a new binding: the one `coordinatorPorts` hashes it to, or the
    /// next one that no binding the agent tracks holds (a restarted agent takes its adopted
    /// bindings' ports to be the ones they hash to).
    fn coordinator_port(&self, job_id: &str, fencing_token: u64) -> u16 {
        let range = self.config.coordinator_ports;
        let mut taken: std::collections::BTreeSet<u16> = self
            .lock_tracked()
            .iter()
            .filter(|(id, t)| !(id.as_str() == job_id && t.fencing_token == fencing_token))
            .map(|(_, t)| t.port)
            .collect();
        // A copy's script already exports its port, which its grant keeps.
        taken.extend(self.lock_copies().values().map(|copy| copy.port));
        let start = hashed_offset(job_id, fencing_token);
        (0..range.len().min(4096))
            .map(|step| range.nth(start.wrapping_add(step)))
            .find(|port| !taken.contains(port))
            .unwrap_or_else(|| range.nth(start))
    }

    fn untrack(&self, job_id: &str, fencing_token: u64) {
        let mut tracked = self.lock_tracked();
        if tracked.get(job_id).is_some_and(|t| t.fencing_token == fencing_token) {
            tracked.remove(job_id);
        }
    }

    async fn nodes(&self) -> Result<Vec<SlurmNode>, BackendError> {
        let text = self.runner.query("scontrol", &args(&["-o", "-d", "show", "node"])).await?;
        let partition = self.config.partition.as_deref();
        Ok(parse_nodes(&text)
            .into_iter()
            .filter(|n| partition.is_none_or(|p| n.partitions.iter().any(|q| q == p)))
            .collect())
    }

    /// The nodes whose features break `job`'s `placement.nodeSelector` (none without one).
    async fn excluded_by_selector(&self, job: &Assignment) -> Result<Vec<String>, BackendError> {
        let selector = job.spec.placement.node_selector();
        if selector.is_everything() {
            return Ok(Vec::new());
        }
        let nodes = self.nodes().await?;
        Ok(nodes
            .into_iter()
            .filter(|node| {
                let labels: BTreeMap<String, String> =
                    node.features.iter().map(|f| (f.clone(), "true".to_string())).collect();
                !selector.matches(&labels)
            })
            .map(|node| node.name)
            .collect())
    }

    async fn submit_now(&self, job: &Assignment) -> Result<Admission, BackendError> {
        let _one_at_a_time = self.submit_lock.lock().await;
        let rows = poll::squeue_all(&self.runner).await?;
        if let Some((token, row)) = poll::meridian_rows(&rows, &self.config.job_tag).remove(&job.job_id) {
            if token == job.fencing_token {
                let phase = poll::phase_of(&self.runner, &row).await;
                self.track(&job.job_id, token, &row.slurm_id, &phase, None);
                return Ok(admission_of(phase));
            }
            if poll::is_live(&row.state) {
                return Ok(Admission::Refused {
                    reason: format!(
                        "binding {token} of job `{}` is still held here (Slurm job {}); it must be cancelled first",
                        job.job_id, row.slurm_id
                    ),
                    permanent: false,
                });
            }
        }
        let excluded = self.excluded_by_selector(job).await?;
        let port = self.coordinator_port(&job.job_id, job.fencing_token);
        let contract = script::Contract { cluster: &self.cluster, port };
        let batch = match script::batch_job(job, &self.config, &excluded, &contract) {
            Ok(batch) => batch,
            Err(e) => return Ok(Admission::Refused { reason: e.to_string(), permanent: true }),
        };
        let slurm_id = match self.sbatch(&batch).await? {
            Ok(slurm_id) => slurm_id,
            Err(reason) => return Ok(Admission::Refused { reason, permanent: true }),
        };
        let phase = match self.runner.query("squeue", &args(&["-h", "-j", &slurm_id, "-o", parse::SQUEUE_FORMAT])).await
        {
            Ok(text) => match parse::parse_squeue(&text).into_iter().next() {
                Some(row) => poll::phase_of(&self.runner, &row).await,
                None => JobPhase::Pending { reason: format!("Slurm: submitted as job {slurm_id}") },
            },
            Err(_) => JobPhase::Pending { reason: format!("Slurm: submitted as job {slurm_id}") },
        };
        if phase.is_terminal() {
            // Over before we looked: nothing will track it, so report its end now.
            let _ = self.events.send(super::JobEvent {
                job_id: job.job_id.clone(),
                fencing_token: job.fencing_token,
                phase: phase.clone(),
            });
        }
        self.track(&job.job_id, job.fencing_token, &slurm_id, &phase, Some(port));
        Ok(admission_of(phase))
    }

    /// Submits `batch`: Slurm's job id, or Slurm's refusal (a transient failure is an error).
    async fn sbatch(&self, batch: &script::BatchJob) -> Result<Result<String, String>, BackendError> {
        let out = self.runner.run("sbatch", &batch.args, Some(&batch.script)).await?;
        if !out.success() {
            if out.is_transient() {
                return Err(BackendError::transient(format!("sbatch: {}", out.message())));
            }
            return Ok(Err(format!("Slurm: {}", out.message())));
        }
        let slurm_id = out.stdout.trim().split(';').next().unwrap_or("").trim().to_string();
        if slurm_id.is_empty() {
            return Err(BackendError::transient(format!("sbatch printed no job id: {:?}", out.stdout)));
        }
        Ok(Ok(slurm_id))
    }

    /// Rewrites Slurm job `id`'s comment to `cancelled` (first: a restarted agent must not adopt
    /// or report it), then `scancel`s it.
    async fn cancel_in_slurm(&self, id: &str, cancelled: &str) -> Result<(), BackendError> {
        let comment = format!("Comment={cancelled}");
        let _ = self.runner.run("scontrol", &args(&["update", &format!("JobId={id}"), &comment]), None).await?;
        let out = self.runner.run("scancel", &args(&[id]), None).await?;
        if !out.success() {
            return Err(BackendError::transient(format!("scancel {id}: {}", out.message())));
        }
        Ok(())
    }

    async fn cancel_now(&self, job_id: &str, fencing_token: u64) -> Result<(), BackendError> {
        let _one_at_a_time = self.submit_lock.lock().await;
        let rows = poll::squeue_all(&self.runner).await?;
        let targets: Vec<String> = rows
            .iter()
            .filter(|r| {
                r.binding(&self.config.job_tag) == Some((job_id.to_string(), fencing_token)) && poll::is_live(&r.state)
            })
            .map(|r| r.slurm_id.clone())
            .collect();
        self.untrack(job_id, fencing_token);
        for id in &targets {
            self.cancel_in_slurm(id, &cancelled_comment_for(&self.config.job_tag, job_id, fencing_token)).await?;
            // scancel exits 0 for ids it does not know: check that the job really stops.
            let state = self.runner.query("squeue", &args(&["-h", "-j", id, "-o", "%T"])).await.unwrap_or_default();
            let state = state.trim();
            if state == "PENDING" || state == "RUNNING" {
                return Err(BackendError::transient(format!("scancel {id}: the job is still {state}")));
            }
        }
        Ok(())
    }

    async fn list_now(&self) -> Result<Vec<HeldJob>, BackendError> {
        let rows = poll::squeue_all(&self.runner).await?;
        let mut held = Vec::new();
        for (job_id, (token, row)) in poll::meridian_rows(&rows, &self.config.job_tag) {
            let phase = poll::phase_of(&self.runner, &row).await;
            self.track(&job_id, token, &row.slurm_id, &phase, None);
            held.push(HeldJob { job_id, fencing_token: token, phase });
        }
        Ok(held)
    }

    async fn inventory_now(&self) -> Result<Inventory, BackendError> {
        let nodes = self.nodes().await?;
        let catalog = GpuCatalog::default();
        let mut shapes: BTreeMap<String, NodeShape> = BTreeMap::new();
        for node in nodes {
            // A node without GPUs cannot run a Meridian job; it is not reported.
            let Some((gres_type, &gpus)) = node.gpus.iter().max_by_key(|(_, count)| **count) else { continue };
            let key = if gres_type.is_empty() { "gpu" } else { gres_type.as_str() };
            let gpu_type = self.config.meridian_gpu_type(key).ok_or_else(|| {
                BackendError::permanent(format!(
                    "Slurm node `{}` has GRES type `{key}`, which is no known Meridian GPU type; map it in \
                     slurm.gpuTypes (e.g. `{key}: a100-80g`)",
                    node.name
                ))
            })?;
            let cpu = node.cpu_total;
            let memory_gib = u32::try_from(node.memory_mb / 1024).unwrap_or(u32::MAX);
            let mut features = node.features.clone();
            features.sort();
            let mut name = format!("{gpu_type}x{gpus}-{cpu}c-{memory_gib}g");
            for feature in &features {
                name.push('-');
                name.push_str(feature);
            }
            let free = if node.usable() {
                let used = node.gpus_used.get(gres_type).copied().unwrap_or(0);
                NodeFree {
                    gpus: gpus.saturating_sub(used),
                    cpu: cpu.saturating_sub(node.cpu_alloc),
                    memory_gib: u32::try_from(node.memory_mb.saturating_sub(node.alloc_memory_mb) / 1024)
                        .unwrap_or(u32::MAX),
                }
            } else {
                NodeFree::default()
            };
            let gpu_memory_gib = catalog.memory_gib(&gpu_type).unwrap_or(0);
            shapes
                .entry(name.clone())
                .or_insert_with(|| NodeShape {
                    name,
                    gpu_type,
                    gpu_memory_gib,
                    gpus_per_node: gpus,
                    cpu_per_node: cpu,
                    memory_gib_per_node: memory_gib,
                    free: Vec::new(),
                    // Each Slurm feature is a label set to "true"; the features are part of the
                    // shape's name, so every node of a shape has the same ones.
                    labels: features.iter().map(|f| (f.clone(), "true".to_string())).collect(),
                })
                .free
                .push(free);
        }
        Ok(Inventory { shapes: shapes.into_values().collect() })
    }

    async fn pressure_now(&self) -> Result<QueuePressure, BackendError> {
        let rows = poll::squeue_all(&self.runner).await?;
        let partition = self.config.partition.as_deref();
        let mut queues: BTreeMap<String, QueueLoad> = BTreeMap::new();
        let mut releases: BTreeMap<u64, u32> = BTreeMap::new();
        for row in rows.iter().filter(|r| poll::is_live(&r.state)) {
            if partition.is_some_and(|p| p != row.partition) {
                continue;
            }
            let queue = match &row.account {
                Some(account) => format!("{}/{account}", row.partition),
                None => row.partition.clone(),
            };
            let load = queues.entry(queue.clone()).or_insert(QueueLoad {
                queue: queue.into(),
                weight: 1.0,
                pending_jobs: 0,
                pending_gpus: 0,
                running_gpus: 0,
            });
            let gpus = row.gpus_per_node.saturating_mul(row.nodes);
            if row.state == "PENDING" {
                load.pending_jobs += 1;
                load.pending_gpus = load.pending_gpus.saturating_add(gpus);
            } else {
                load.running_gpus = load.running_gpus.saturating_add(gpus);
                if let Some(left) = row.time_left_secs.filter(|_| gpus > 0) {
                    *releases.entry(left).or_insert(0) += gpus;
                }
            }
        }
        let queues: Vec<QueueLoad> = queues.into_values().collect();
        let waiting = queues.iter().any(|q| q.pending_jobs > 0);
        let releases: Vec<GpuRelease> =
            releases.into_iter().map(|(after_secs, gpus)| GpuRelease { after_secs, gpus }).collect();
        let estimated_wait_secs = if waiting { releases.first().map_or(0, |r| r.after_secs) } else { 0 };
        // Slurm preempts by QOS; which running jobs a QOS may preempt is not read here.
        Ok(QueuePressure { queues, releases, estimated_wait_secs, preemptible: Vec::new() })
    }

    async fn logs_now(&self, job_id: &str, fencing_token: u64, request: LogRequest) -> Result<LogChunk, BackendError> {
        let rows = poll::squeue_all(&self.runner).await?;
        let row = rows.iter().find(|r| r.binding(&self.config.job_tag) == Some((job_id.to_string(), fencing_token)));
        let path: PathBuf = script::output_path(&self.config.work_dir, job_id, fencing_token);
        let file = match tokio::fs::File::open(&path).await {
            Ok(file) => file,
            Err(_) if row.is_some() => {
                // Submitted, but it has not written anything yet.
                let live = row.is_some_and(|r| poll::is_live(&r.state));
                return Ok(log_chunk(&[], 0, 0, !live));
            }
            Err(e) => {
                return Err(BackendError::Permanent {
                    message: format!(
                        "job `{job_id}` (binding {fencing_token}) is not held here: no output at `{}`",
                        path.display()
                    ),
                    source: Some(Box::new(e)),
                });
            }
        };
        read_chunk(file, request, row.is_none_or(|r| !poll::is_live(&r.state))).await.map_err(|e| {
            BackendError::Transient { message: format!("reading `{}`", path.display()), source: Some(Box::new(e)) }
        })
    }
}

async fn read_chunk(mut file: tokio::fs::File, request: LogRequest, ended: bool) -> std::io::Result<LogChunk> {
    let len = file.metadata().await?.len();
    // Slurm's output file holds everything the job wrote.
    let range = request.range(0..len);
    file.seek(std::io::SeekFrom::Start(range.start)).await?;
    let mut bytes = Vec::new();
    file.take(u64::try_from(request.max_bytes).unwrap_or(u64::MAX)).read_to_end(&mut bytes).await?;
    Ok(log_chunk(&bytes, range.start, len, ended))
}

/// Where a binding's coordinator port search starts: FNV-1a of `job:token`, the same on every
/// agent build.
fn hashed_offset(job_id: &str, fencing_token: u64) -> u32 {
    super::fnv32(&format!("{job_id}:{fencing_token}"))
}

fn admission_of(phase: JobPhase) -> Admission {
    match phase {
        JobPhase::Pending { reason } => Admission::Queued { reason },
        JobPhase::Running { nodes } => Admission::Started { nodes },
        // Already over: it did start; its end was or will be reported.
        JobPhase::Succeeded { .. } | JobPhase::Failed { .. } | JobPhase::Preempted { .. } => {
            Admission::Started { nodes: Vec::new() }
        }
    }
}

super::delegate_to_shared_state!(SlurmBackend, BackendKind::Slurm, copies);
