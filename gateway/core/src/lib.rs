//! The gateway's core: one sans-IO state machine that owns jobs, member clusters (by stream),
//! offers, fencing tokens, timers, idempotency keys and placement decisions.
//!
//! `Core::step(input, now_ms, &mut effects)` is the only way in. It does no I/O, reads no clock
//! and spawns nothing: the production runtime (in the gateway crate) and the simulator drive the
//! same code, the first in real time, the second in virtual time.
//!
//! The rule that makes crashes harmless: every record a step asks to persist is committed (and
//! fsynced) by the runtime before any send or reply of that step is delivered. So a reply or an
//! offer never describes state that a crash could take back, and an agent's result is
//! acknowledged only once it is durable.
//!
//! Reads never go through `step`: [`Core::view`] returns a cheap, immutable [`ReadView`]
//! (persistent maps shared with the core) that the runtime publishes after each commit.

mod agents;
pub mod config;
pub mod io;
mod jobs;
pub mod quota;
pub mod record;
pub mod registry;
mod round;
pub mod tally;
pub mod tenants;
mod timers;
pub mod usage;
pub mod view;

#[cfg(test)]
mod never_twice_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use meridian_placement::Decision;

pub use config::CoreConfig;
pub use io::{ConnId, Effects, Error, Input, Reply, ReplyTo};
pub use quota::{QuotaWait, TenantQuota};
pub use record::{JobRecord, KnownCluster, Loaded, Record, StoredDecision};
pub use tally::Tally;
pub use tenants::TenantSummary;
pub use usage::{IdleGpuConfig, JobUsage};
pub use view::{ClusterSummary, Explanation, JobFilter, Page, ReadView};

use registry::Registry;

/// The latest placement decision of a job: made this run (full detail) or read back from the
/// store (as stored).
#[derive(Debug, Clone)]
pub enum Decided {
    /// Made by a round of this process.
    Live {
        /// When (Unix ms).
        at_ms: i64,
        /// The decision with every cluster's verdict.
        decision: Decision,
    },
    /// Read from the store (the decision that placed the job).
    Stored(StoredDecision),
    /// A round held the job back for its tenant's quota before placing it. Not stored: rounds
    /// work it out again after a restart.
    Quota {
        /// When the job began waiting for this (Unix ms).
        at_ms: i64,
        /// Which limit, with the numbers.
        wait: QuotaWait,
    },
}

/// An active job as rounds read it: its record, and what rounds keep about it between rounds.
struct ActiveJob {
    record: Arc<JobRecord>,
    /// Its demand key (see `round.rs`) and the key's number, computed at its first round.
    demand: Option<(Arc<str>, u32)>,
    /// Its latest decision: the one `decisions` holds for it.
    decided: Option<Arc<Decided>>,
}

/// The state machine. See the crate documentation.
pub struct Core {
    /// Shared with every view (readers need the tenants' weights and quotas).
    config: Arc<CoreConfig>,
    /// Every job the gateway remembers: active ones and finished ones within retention.
    jobs: imbl::OrdMap<String, Arc<JobRecord>>,
    /// Jobs not in a terminal state, with their current records, by id: what rounds and the
    /// cluster summaries read, without looking every active job up in `jobs`.
    active: BTreeMap<String, ActiveJob>,
    /// Active jobs by the cluster they are offered to, bound to or ran on: what heartbeats,
    /// welcomes and lost clusters look at, without scanning every active job.
    by_cluster: HashMap<String, BTreeSet<String>>,
    /// Finished jobs by finish time, for retention.
    finished: BTreeSet<(i64, String)>,
    /// (tenant, idempotency key) → job id.
    idempotency: HashMap<(String, String), String>,
    decisions: imbl::HashMap<String, Arc<Decided>>,
    registry: Registry,
    /// The snapshot submits are checked against ("could this ever run anywhere?"); rebuilt
    /// only when a cluster joins or changes shape.
    never_fits_snapshot: Option<Arc<meridian_placement::FederationSnapshot>>,
    /// `config.network`, shared by every snapshot instead of copied into each round's.
    network: Arc<meridian_placement::NetworkTable>,
    /// Demand keys in use, by their canonical copy, with their numbers.
    demand_ids: HashMap<Arc<str>, u32>,
    next_demand_id: u32,
    /// Offers in flight: since when (Unix ms), or since the last withdrawal was sent.
    offered_at: HashMap<String, i64>,
    /// Offers withdrawn after the offer timeout, waiting for the member to confirm that it does
    /// not run them (in memory: after a restart, an offer in flight is `Unknown` anyway).
    withdrawing: HashSet<String>,
    /// `Unknown` jobs: since when their cluster was last heard (Unix ms).
    unknown_since: HashMap<String, i64>,
    id_salt: u16,
    id_sequence: u64,
    /// Something placement depends on changed since the last round.
    round_wanted: bool,
    /// Set once a commit failed: the core then refuses every change.
    failed: Option<String>,
    /// Bumped whenever cluster summaries change, so views rebuild them only then.
    clusters_version: u64,
    cluster_view: Arc<Vec<ClusterSummary>>,
    cluster_view_version: u64,
    /// Running jobs' GPU utilisation (in memory only).
    usage: usage::UsageBook,
    /// Counters for metrics (see `tally.rs`), published with each view.
    tally: Arc<Tally>,
    /// The time of the step being applied (Unix ms), for counters of changes that carry none.
    now_ms: i64,
    /// Rules switched off, to show that the property tests catch their absence.
    #[cfg(test)]
    mutations: Mutations,
}

/// Safety rules a test may switch off (see `never_twice_tests.rs`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Mutations {
    /// Rule 1 removed: a lost cluster's offers in flight go straight back to the queue.
    pub(crate) requeue_offers_on_loss: bool,
}

impl Core {
    /// Builds the core from what the store held. Offered, bound and running jobs are `Unknown`
    /// until their cluster reports them, counted from `now_ms`: an offer in flight at the last
    /// stop may have been accepted and started, so it is adopted like a bound job (the welcome
    /// lists it), never voided and placed again while its member may run it. `id_salt` keeps the ids of two gateway
    /// processes apart (the runtime passes a random number; the simulator a fixed one).
    pub fn new(config: CoreConfig, loaded: Loaded, now_ms: i64, id_salt: u16) -> Self {
        let mut core = Core {
            network: Arc::new(config.network.clone()),
            usage: usage::UsageBook { entries: imbl::OrdMap::new(), idle: config.idle_gpu },
            config: Arc::new(config),
            jobs: imbl::OrdMap::new(),
            active: BTreeMap::new(),
            by_cluster: HashMap::new(),
            finished: BTreeSet::new(),
            idempotency: HashMap::new(),
            decisions: imbl::HashMap::new(),
            registry: Registry::from_known(loaded.clusters, now_ms),
            never_fits_snapshot: None,
            demand_ids: HashMap::new(),
            next_demand_id: 0,
            offered_at: HashMap::new(),
            withdrawing: HashSet::new(),
            unknown_since: HashMap::new(),
            id_salt,
            id_sequence: 0,
            round_wanted: true,
            failed: None,
            clusters_version: 1,
            cluster_view: Arc::new(Vec::new()),
            cluster_view_version: 0,
            tally: Arc::default(),
            now_ms,
            #[cfg(test)]
            mutations: Mutations::default(),
        };
        for (id, decision) in loaded.decisions {
            // Before the jobs, so each active job's index entry finds its decision.
            core.decisions.insert(id, Arc::new(Decided::Stored(decision)));
        }
        for mut job in loaded.jobs {
            match job.state {
                meridian_proto::job::JobState::Offered => {
                    job.state = meridian_proto::job::JobState::Unknown;
                    job.message = format!(
                        "the gateway restarted with this offer in flight; waiting for {} to report it",
                        job.cluster.as_deref().unwrap_or("its cluster")
                    );
                }
                meridian_proto::job::JobState::Bound | meridian_proto::job::JobState::Running => {
                    job.state = meridian_proto::job::JobState::Unknown;
                }
                _ => {}
            }
            if job.state == meridian_proto::job::JobState::Unknown {
                core.unknown_since.insert(job.id.clone(), now_ms);
            }
            if let Some(key) = &job.spec.idempotency_key {
                core.idempotency.insert((job.spec.tenant.clone(), key.clone()), job.id.clone());
            }
            let job = Arc::new(job);
            core.index(None, &job);
            core.jobs.insert(job.id.clone(), job);
        }
        core
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Applies one input at `now_ms` (Unix ms, never decreasing), appending what must happen to
    /// `effects`.
    pub fn step(&mut self, input: Input, now_ms: i64, effects: &mut Effects) {
        self.now_ms = now_ms;
        if let Some(reason) = &self.failed {
            // A failed store means in-memory state may be ahead of what is durable: refuse every
            // change, answer every caller, and let agents keep their results for later.
            let error = Error::Unavailable(reason.clone());
            match input {
                Input::Submit { reply, .. } | Input::Cancel { reply, .. } | Input::AgentHello { reply, .. } => {
                    effects.replies.push((reply, Err(error)));
                }
                // Reading output changes nothing: it works while writes are refused.
                Input::Logs { job_id, request_id, from, max_bytes, reply } => {
                    let answer = self.logs(&job_id, request_id, from, max_bytes, effects);
                    effects.replies.push((reply, answer));
                }
                Input::Agent { .. } | Input::AgentGone { .. } | Input::Tick | Input::Round => {}
            }
            return;
        }
        match input {
            Input::Submit { spec, reply } => {
                let answer = self.submit(spec, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::Cancel { job_id, reply } => {
                let answer = self.cancel(&job_id, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::AgentHello { conn, hello, reply } => {
                let answer = self.hello(conn, hello, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::Agent { conn, event } => self.agent_event(conn, event, now_ms, effects),
            Input::AgentGone { conn } => self.agent_gone(conn, now_ms, effects),
            Input::Logs { job_id, request_id, from, max_bytes, reply } => {
                let answer = self.logs(&job_id, request_id, from, max_bytes, effects);
                effects.replies.push((reply, answer));
            }
            Input::Tick => {
                self.tick(now_ms, effects);
                self.forget_stale_usage();
            }
            Input::Round => self.round(now_ms, effects),
        }
    }

    /// Sends a logs request for `job_id` to the stream of the cluster that holds its current
    /// binding, and names that stream.
    fn logs(
        &self,
        job_id: &str,
        request_id: u64,
        from: Option<u64>,
        max_bytes: u32,
        effects: &mut Effects,
    ) -> Result<Reply, Error> {
        let job = self.jobs.get(job_id).ok_or_else(|| Error::NotFound(job_id.to_string()))?;
        let Some(cluster) = job.cluster.as_deref().filter(|_| job.fencing_token > 0) else {
            return Err(Error::NotStarted(job_id.to_string()));
        };
        let conn = self
            .registry
            .conn_of(cluster)
            .ok_or_else(|| Error::ClusterUnreachable { cluster: cluster.to_string(), job: job_id.to_string() })?;
        let command = meridian_proto::protocol::GatewayCommand::Logs {
            request_id,
            job_id: job_id.to_string(),
            fencing_token: job.fencing_token,
            from,
            max_bytes,
        };
        effects.sends.push((conn, command));
        Ok(Reply::LogsAsked { conn })
    }

    /// Whether a placement round would see something new (a submit, a report, a freed GPU).
    pub fn wants_round(&self) -> bool {
        self.round_wanted && self.failed.is_none()
    }

    /// Marks the core failed after a commit error: from now on it refuses every change with
    /// `reason` (the public message; the operator's detail goes to the log).
    pub fn fail(&mut self, reason: impl Into<String>) {
        if self.failed.is_none() {
            self.failed = Some(reason.into());
        }
    }

    /// Why the core refuses changes, if it does.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Number of jobs remembered (active and within retention).
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// Number of jobs not yet finished.
    pub fn active_count(&self) -> usize {
        self.active.len()
    }

    /// A job by id.
    pub fn job(&self, id: &str) -> Option<&Arc<JobRecord>> {
        self.jobs.get(id)
    }

    /// A consistent, immutable snapshot for readers; cheap (shares structure with the core).
    pub fn view(&mut self) -> ReadView {
        if self.cluster_view_version != self.clusters_version {
            self.cluster_view = Arc::new(self.cluster_summaries());
            self.cluster_view_version = self.clusters_version;
        }
        ReadView::new(
            self.jobs.clone(),
            self.decisions.clone(),
            Arc::clone(&self.cluster_view),
            Arc::clone(&self.config),
            self.tally(),
            self.failed.clone(),
        )
        .with_usage(self.usage.clone())
    }
}
