//! The write path of jobs: every change of a job goes through [`Ledger::save`], which keeps in
//! step what depends on it: the job table and its indexes, the job's timers, the counters, the
//! flags that say what changed, and the record the runtime persists.
//!
//! A ledger borrows those parts from the core for one step; the files that coordinate a step
//! (`requests.rs`, `agents.rs`, `expiry.rs`, `round.rs`) change jobs only through it.

use std::sync::Arc;

use meridian_placement::Decision;
use meridian_proto::job::JobState;

use crate::decision::Decided;
use crate::io::Effects;
use crate::jobs::JobTable;
use crate::record::{DecisionToStore, JobRecord, Record};
use crate::registry::Registry;
use crate::tally::{JobChange, Tally};
use crate::timers::Timers;

/// What changed since it was last looked at: whether a round would see something new, and the
/// version of the cluster summaries.
#[derive(Debug)]
pub(crate) struct Signals {
    /// Something placement depends on changed since the last round.
    round_wanted: bool,
    /// Bumped whenever cluster summaries change, so views rebuild them only then.
    clusters_version: u64,
}

/// The parts a job's change keeps in step, borrowed from the core for one step.
pub(crate) struct Ledger<'a> {
    /// The jobs.
    pub(crate) table: &'a mut JobTable,
    /// Their timers.
    pub(crate) timers: &'a mut Timers,
    /// What changed.
    pub(crate) signals: &'a mut Signals,
    /// The counters (copied on write while a view shares them).
    tally: &'a mut Arc<Tally>,
    /// The time of the step (Unix ms), for counters of changes that carry none.
    now_ms: i64,
}

impl Signals {
    /// A new core's: a round is wanted, and the summaries are not built yet.
    pub(crate) fn new() -> Self {
        Self { round_wanted: true, clusters_version: 1 }
    }

    /// Whether a round would see something new.
    pub(crate) fn round_wanted(&self) -> bool {
        self.round_wanted
    }

    /// Something placement depends on changed (a queued job, freed capacity, a cluster).
    pub(crate) fn want_round(&mut self) {
        self.round_wanted = true;
    }

    /// A round has seen everything so far.
    pub(crate) fn round_done(&mut self) {
        self.round_wanted = false;
    }

    /// Something cluster summaries show changed.
    pub(crate) fn clusters_changed(&mut self) {
        self.clusters_version += 1;
    }

    /// The version of the cluster summaries.
    pub(crate) fn clusters_version(&self) -> u64 {
        self.clusters_version
    }
}

impl<'a> Ledger<'a> {
    /// A ledger over the core's parts for a step at `now_ms`.
    pub(crate) fn new(
        table: &'a mut JobTable,
        timers: &'a mut Timers,
        signals: &'a mut Signals,
        tally: &'a mut Arc<Tally>,
        now_ms: i64,
    ) -> Self {
        Self { table, timers, signals, tally, now_ms }
    }

    /// A copy of job `id` to change and [`save`](Self::save).
    pub(crate) fn copy_of(&self, id: &str) -> Option<JobRecord> {
        self.table.copy_of(id)
    }

    /// The counters, to count something a round or a submit decided.
    pub(crate) fn tally(&mut self) -> &mut Tally {
        Arc::make_mut(self.tally)
    }

    /// Replaces a job's record, keeps the indexes, timers, counters and flags right, and
    /// persists it. `registry` prices GPU time on cloud clusters.
    pub(crate) fn save(&mut self, job: JobRecord, registry: &Registry, effects: &mut Effects) {
        self.timers.settle(&job);
        if job.state == JobState::Queued || job.state.is_terminal() {
            // Capacity or the queue changed.
            self.signals.want_round();
        }
        let job = Arc::new(job);
        effects.persist.push(Record::Job(Arc::clone(&job)));
        let previous = self.table.put(Arc::clone(&job));
        if previous.as_ref().is_none_or(|p| p.cluster != job.cluster || p.state != job.state) {
            // Per-cluster job counts in the summaries may have changed.
            self.signals.clusters_changed();
        }
        if let Some(change) = JobChange::of(previous.as_deref(), &job, registry, self.now_ms) {
            Arc::make_mut(self.tally).count_job_change(change);
        }
    }

    /// Makes `decided` the latest decision of job `id` (not stored: a quota hold, or a decision
    /// that left the job queued).
    pub(crate) fn decide(&mut self, id: &str, decided: Decided) {
        self.table.decide(id, Arc::new(decided));
    }

    /// Records the decision that placed job `id`, durable with the offer; `summary` is the
    /// decision's [`summary`](Decision::summary).
    pub(crate) fn save_decision(
        &mut self,
        id: &str,
        at_ms: i64,
        decision: Decision,
        summary: String,
        effects: &mut Effects,
    ) {
        let decided = Arc::new(Decided::Live { at_ms, decision });
        let to_store = DecisionToStore { decided: Arc::<Decided>::clone(&decided), summary };
        effects.persist.push(Record::Decision(id.to_string(), to_store));
        self.table.decide(id, decided);
    }
}
