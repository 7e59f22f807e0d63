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
//!
//! # Parts
//!
//! [`Core`] holds its state in parts, each a type that owns its fields:
//!
//! - the job table (`jobs.rs`: records, indexes, decisions, idempotency keys, ids, and what each
//!   tenant's jobs hold, `held.rs`),
//! - the job timers (`timers.rs`: offers in flight and withdrawn, `Unknown` jobs),
//! - the [`Registry`](registry::Registry) of member clusters and their streams (`registry.rs`),
//! - the snapshots placement reads (`snapshots.rs`: the network table, the never-fits cache),
//! - the demand keys rounds compare (`demand.rs`), the start quotes in flight (`quotes.rs`) and
//!   the sibling copies of queued jobs (`copies.rs`),
//! - running jobs' GPU usage (`usage.rs`), the metrics counters ([`Tally`], `tally.rs`),
//! - what changed since it was last looked at (`Signals` in `ledger.rs`), and the cached cluster
//!   summaries of the read view (`view.rs`).
//!
//! `Core::step` lends the parts a step needs, as borrows of distinct fields, to the file that
//! coordinates that step: `requests.rs` (submit, cancel, logs), `agents.rs` (hellos, reports,
//! heartbeats, lost streams), `expiry.rs` (timers that came due) and `round.rs` (placement).
//! Each changes jobs only through the `Ledger` (`ledger.rs`), which keeps the table, the timers,
//! the counters and the flags in step and asks for every change to be persisted.
//!
//! # Import order
//!
//! No file imports one that imports it. From the leaves up (each file uses only files listed
//! before it):
//!
//! 1. `record`, `demand` (no imports from this crate)
//! 2. `io`, `usage`, `timers`, `held` (record); `config` (usage); `quota` (config, record);
//!    `decision` (quota, record)
//! 3. `registry` (io, record); `jobs` (decision, held, record); `snapshots` (registry); `quotes`,
//!    `copies` (io, record, registry)
//! 4. `tally` (decision, record, registry); `view` (config, decision, jobs, record, registry,
//!    tally, usage); `tenants` (view)
//! 5. `ledger` (decision, io, jobs, record, registry, tally, timers)
//! 6. `requests`, `agents`, `expiry`, `round` (the parts they coordinate, and `ledger`)
//! 7. `lib` (all of them); the tests (`tests/`, `never_twice_tests.rs`) may use everything.

mod agents;
pub mod config;
mod copies;
mod decision;
mod demand;
mod expiry;
mod held;
pub mod io;
mod jobs;
mod ledger;
pub mod quota;
mod quotes;
pub mod record;
pub mod registry;
mod requests;
mod round;
mod snapshots;
pub mod tally;
pub mod tenants;
mod timers;
pub mod usage;
pub mod view;

#[cfg(test)]
mod never_twice_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use agents::Agents;
#[cfg(test)]
use agents::Mutations;
use copies::CopyBook;
use demand::DemandBook;
use expiry::Expiry;
use jobs::JobTable;
use ledger::{Ledger, Signals};
use quotes::QuoteRequests;
use registry::Registry;
use requests::Requests;
use round::Round;
use snapshots::Snapshots;
use timers::Timers;
use usage::UsageBook;
use view::ClusterViewCache;

pub use config::{CoreConfig, TenantQuota};
pub use decision::Decided;
pub use io::{ConnId, Effects, Error, Input, Reply, ReplyTo};
pub use quota::QuotaWait;
pub use record::{JobRecord, KnownCluster, Loaded, Record, StoredDecision};
pub use tally::Tally;
pub use tenants::TenantSummary;
pub use usage::{IdleGpuConfig, JobUsage};
pub use view::{ClusterSummary, CopyView, Explanation, JobFilter, Page, ReadView};

/// The state machine. See the crate documentation.
pub struct Core {
    /// Shared with every view (readers need the tenants' weights and quotas).
    config: Arc<CoreConfig>,
    /// Every job the gateway remembers, with its indexes and latest decision.
    jobs: JobTable,
    /// Offers in flight and `Unknown` jobs, by when they started.
    timers: Timers,
    /// The member clusters and their streams.
    registry: Registry,
    /// What placement reads of the registry.
    snapshots: Snapshots,
    /// Demand keys of queued jobs.
    demands: DemandBook,
    /// Start quotes asked of members and not yet answered.
    quotes: QuoteRequests,
    /// Sibling copies of queued jobs (in memory).
    copies: CopyBook,
    /// Running jobs' GPU utilisation (in memory only).
    usage: UsageBook,
    /// Counters for metrics (see `tally.rs`), published with each view.
    tally: Arc<Tally>,
    /// Whether a round is wanted; the version of the cluster summaries.
    signals: Signals,
    /// The cluster summaries of the last view.
    cluster_view: ClusterViewCache,
    /// Set once a commit failed: the core then refuses every change.
    failed: Option<String>,
    /// Rules switched off, to show that the property tests catch their absence.
    #[cfg(test)]
    mutations: Mutations,
}

impl Core {
    /// Builds the core from what the store held. Offered, bound and running jobs are `Unknown`
    /// until their cluster reports them, counted from `now_ms`: an offer in flight at the last
    /// stop may have been accepted and started, so it is adopted like a bound job (the welcome
    /// lists it), never voided and placed again while its member may run it. `id_salt` keeps the
    /// ids of two gateway processes apart (the runtime passes a random number; the simulator a
    /// fixed one).
    pub fn new(config: CoreConfig, loaded: Loaded, now_ms: i64, id_salt: u16) -> Self {
        Self::build(config, loaded, now_ms, id_salt, true)
    }

    /// What a standby shows: the store's records as they are (a running job stays `Running`:
    /// the leader still hears its cluster), for [`Core::view`] only; it is never stepped.
    pub fn follower(config: CoreConfig, loaded: Loaded, now_ms: i64) -> Self {
        Self::build(config, loaded, now_ms, 0, false)
    }

    fn build(config: CoreConfig, loaded: Loaded, now_ms: i64, id_salt: u16, restart: bool) -> Self {
        let mut jobs = JobTable::new(id_salt);
        let mut timers = Timers::default();
        for (id, decision) in loaded.decisions {
            // Before the jobs, so each active job's index entry finds its decision.
            jobs.decide(&id, Arc::new(Decided::Stored(decision)));
        }
        for mut job in loaded.jobs {
            if restart {
                job.after_restart();
            }
            if job.state == meridian_proto::job::JobState::Unknown {
                timers.unknown(job.id.clone(), now_ms);
            }
            jobs.remember_key(&job);
            jobs.put(Arc::new(job));
        }
        Core {
            snapshots: Snapshots::new(config.network.clone()),
            usage: UsageBook::new(config.idle_gpu),
            config: Arc::new(config),
            jobs,
            timers,
            registry: Registry::from_known(loaded.clusters, now_ms),
            demands: DemandBook::default(),
            quotes: QuoteRequests::default(),
            copies: CopyBook::default(),
            tally: Arc::default(),
            signals: Signals::new(),
            cluster_view: ClusterViewCache::new(),
            failed: None,
            #[cfg(test)]
            mutations: Mutations::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Applies one input at `now_ms` (Unix ms, never decreasing), appending what must happen to
    /// `effects`.
    pub fn step(&mut self, input: Input, now_ms: i64, effects: &mut Effects) {
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
                    let answer =
                        requests::logs(&self.jobs, &self.registry, &job_id, request_id, from, max_bytes, effects);
                    effects.replies.push((reply, answer));
                }
                Input::Agent { .. } | Input::AgentGone { .. } | Input::Tick | Input::Round => {}
            }
            return;
        }
        match input {
            Input::Submit { spec, reply } => {
                let answer = self.requests(now_ms).submit(spec, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::Cancel { job_id, reply } => {
                let answer = self.requests(now_ms).cancel(&job_id, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::AgentHello { conn, hello, reply } => {
                let answer = self.agents(now_ms).hello(conn, hello, now_ms, effects);
                effects.replies.push((reply, answer));
            }
            Input::Agent { conn, event } => self.agents(now_ms).agent_event(conn, event, now_ms, effects),
            Input::AgentGone { conn } => self.agents(now_ms).agent_gone(conn, now_ms, effects),
            Input::Logs { job_id, request_id, from, max_bytes, reply } => {
                let answer = requests::logs(&self.jobs, &self.registry, &job_id, request_id, from, max_bytes, effects);
                effects.replies.push((reply, answer));
            }
            Input::Tick => self.tick(now_ms, effects),
            Input::Round => self.round(now_ms).run(now_ms, effects),
        }
    }

    /// What time alone changes, in this order: unanswered offers are withdrawn, silent clusters
    /// dropped (their jobs become `Unknown`), jobs lost too long placed again, finished jobs
    /// past retention forgotten; then the demand keys and usage samples no job needs go.
    fn tick(&mut self, now_ms: i64, effects: &mut Effects) {
        self.expiry(now_ms).expire_offers(now_ms, effects);
        self.agents(now_ms).expire_silent_clusters(now_ms, effects);
        let mut expiry = self.expiry(now_ms);
        expiry.expire_unknown(now_ms, effects);
        expiry.expire_finished(now_ms, effects);
        self.demands.forget_unused();
        let ttl_ms = (self.config.placement.quote_ttl_secs * 1000.0) as i64;
        self.registry.expire_quotes(now_ms.saturating_sub(ttl_ms));
        self.usage.forget_stale(|id| self.jobs.get(id).map(Arc::as_ref));
    }

    /// The parts a submit or a cancel at `now_ms` needs.
    fn requests(&mut self, now_ms: i64) -> Requests<'_> {
        Requests {
            config: &self.config,
            registry: &self.registry,
            snapshots: &mut self.snapshots,
            ledger: Ledger::new(&mut self.jobs, &mut self.timers, &mut self.signals, &mut self.tally, now_ms),
        }
    }

    /// The parts an agent's words (or silence) at `now_ms` change.
    fn agents(&mut self, now_ms: i64) -> Agents<'_> {
        Agents {
            config: &self.config,
            registry: &mut self.registry,
            snapshots: &mut self.snapshots,
            usage: &mut self.usage,
            quotes: &mut self.quotes,
            copies: &mut self.copies,
            ledger: Ledger::new(&mut self.jobs, &mut self.timers, &mut self.signals, &mut self.tally, now_ms),
            #[cfg(test)]
            mutations: self.mutations,
        }
    }

    /// The parts the job timers act on at `now_ms`.
    fn expiry(&mut self, now_ms: i64) -> Expiry<'_> {
        Expiry {
            config: &self.config,
            registry: &self.registry,
            ledger: Ledger::new(&mut self.jobs, &mut self.timers, &mut self.signals, &mut self.tally, now_ms),
        }
    }

    /// The parts a round at `now_ms` reads and changes.
    fn round(&mut self, now_ms: i64) -> Round<'_> {
        Round {
            config: &self.config,
            registry: &self.registry,
            snapshots: &self.snapshots,
            demands: &mut self.demands,
            quotes: &mut self.quotes,
            copies: &mut self.copies,
            ledger: Ledger::new(&mut self.jobs, &mut self.timers, &mut self.signals, &mut self.tally, now_ms),
        }
    }

    /// Whether a placement round would see something new (a submit, a report, a freed GPU).
    pub fn wants_round(&self) -> bool {
        self.signals.round_wanted() && self.failed.is_none()
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
        self.jobs.active_len()
    }

    /// A job by id.
    pub fn job(&self, id: &str) -> Option<&Arc<JobRecord>> {
        self.jobs.get(id)
    }

    /// A consistent, immutable snapshot for readers; cheap (shares structure with the core).
    pub fn view(&mut self) -> ReadView {
        let clusters = self.cluster_view.current(self.signals.clusters_version(), || {
            ClusterSummary::all(&self.registry, self.jobs.active().map(|active| active.record.as_ref()))
        });
        ReadView::new(
            &self.jobs,
            clusters,
            Arc::clone(&self.config),
            Arc::clone(&self.tally),
            self.failed.clone(),
            self.usage.clone(),
            self.copies.snapshot(),
        )
    }

    /// Panics if an index of the job table disagrees with a full scan of the jobs (tests).
    #[cfg(test)]
    pub(crate) fn check_indexes(&self) {
        self.jobs.check_indexes();
    }
}
