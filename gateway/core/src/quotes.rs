//! Start quotes asked of members: which are in flight, so a round never asks twice for the same
//! thing and never waits for an answer.
//!
//! A round that leaves a job queued asks its best few clusters that cannot start it now
//! (`placement.quoteCandidates`) when their own scheduler would start a gang of its shape,
//! unless a fresh quote (younger than `placement.quoteTtlSecs`) or a request for the same shape
//! is already there. The answer lands in the cluster's registry entry, keyed by
//! [`quote_key`](meridian_placement::quote_key), and later rounds read it through the snapshot.
//! Quotes are kept in memory only: a new leader or a reconnected agent asks again.
//!
//! What keeps this cheap and safe:
//! - at most [`MAX_IN_FLIGHT_PER_CLUSTER`] requests per cluster and [`MAX_ASKS_PER_ROUND`] per
//!   round, so a long queue of distinct shapes cannot flood a member (the agent answers "busy"
//!   past its own limit anyway);
//! - a request unanswered for [`REQUEST_TIMEOUT_MS`] is forgotten, so a lost answer only delays
//!   the next ask;
//! - a failed answer ("this backend gives no quotes", "busy") is kept like a quote with no
//!   start, so the member is not asked again for that shape until it expires; placement then
//!   uses its own estimate.

use std::collections::HashMap;

use meridian_placement::{Decision, PlacementConfig, Quote, QuotedStart, Verdict, quote_key};
use meridian_proto::protocol::{GatewayCommand, StartQuote};
use meridian_proto::spec::JobSpec;

use crate::io::{ConnId, Effects};
use crate::record::JobRecord;
use crate::registry::{ClusterEntry, Registry};

/// Requests one cluster may have unanswered.
pub(crate) const MAX_IN_FLIGHT_PER_CLUSTER: usize = 4;
/// Requests one round may send.
pub(crate) const MAX_ASKS_PER_ROUND: usize = 64;
/// A request unanswered this long (ms) is forgotten.
pub(crate) const REQUEST_TIMEOUT_MS: i64 = 15_000;
/// How long a timed-out request is remembered (ms), for [`QuoteRequests::ask_before_copy`].
pub(crate) const UNANSWERED_KEPT_MS: i64 = 600_000;

/// A request in flight.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The cluster asked.
    pub(crate) cluster: String,
    /// The shape asked about.
    pub(crate) key: u64,
    /// When it was sent (Unix ms).
    sent_ms: i64,
}

/// Start-quote requests in flight.
#[derive(Debug, Default)]
pub(crate) struct QuoteRequests {
    next_id: u64,
    pending: HashMap<u64, Pending>,
    in_flight: HashMap<String, usize>,
    asked_this_round: usize,
    /// When the newest answer arrived (Unix ms; 0 before any): decisions older than that are
    /// placed again, within the round's refresh budget.
    newest_answer_ms: i64,
    /// Requests that timed out, by (cluster, shape), with when (Unix ms): a job does not wait
    /// for such a cluster again before a copy (`ask_before_copy`) until `quoteTtlSecs` passed.
    unanswered: HashMap<(String, u64), i64>,
}

impl QuoteRequests {
    /// A new round may send [`MAX_ASKS_PER_ROUND`] again; requests past their timeout are
    /// forgotten.
    pub(crate) fn new_round(&mut self, now_ms: i64) {
        self.asked_this_round = 0;
        if !self.unanswered.is_empty() {
            // Forgotten after 10 minutes, well past the usual quote ttl (60 s).
            self.unanswered.retain(|_, at| now_ms.saturating_sub(*at) <= UNANSWERED_KEPT_MS);
        }
        if self.pending.is_empty() {
            return;
        }
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now_ms.saturating_sub(p.sent_ms) > REQUEST_TIMEOUT_MS)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(lost) = self.take(id) {
                self.unanswered.insert((lost.cluster, lost.key), now_ms);
            }
        }
    }

    /// Asks the best clusters of `decision` (a job left queued) that cannot start it now for a
    /// quote for its shape, where none is fresh or in flight: the best `quoteCandidates` by
    /// score, and any other whose preemptible GPUs of lower priority could hold the gang.
    pub(crate) fn ask_for(
        &mut self,
        registry: &Registry,
        job: &JobRecord,
        decision: &Decision,
        config: &PlacementConfig,
        now_ms: i64,
        effects: &mut Effects,
    ) {
        let (job_id, spec) = (job.id.as_str(), &job.spec);
        let candidates = config.quote_candidates;
        let ttl_ms = ttl_ms(config);
        if candidates == 0 || self.asked_this_round >= MAX_ASKS_PER_ROUND {
            return;
        }
        let mut waiting: Vec<(&str, f64)> = decision
            .candidates
            .iter()
            .filter_map(|c| match &c.verdict {
                Verdict::Scored(score) if !score.fits_now => Some((c.cluster.as_ref(), score.total)),
                _ => None,
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        waiting.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        let key = quote_key(spec);
        let gpus = u64::from(spec.total_gpus());
        for (rank, (cluster, _)) in waiting.into_iter().enumerate() {
            let Some(entry) = registry.get(cluster) else { continue };
            // Past the best few, a cluster is still asked where lower-priority preemptible jobs
            // hold enough GPUs: its member may start the job by preempting them.
            if rank >= candidates as usize && entry.pressure.preemptible_below(spec.priority) < gpus {
                continue;
            }
            let Some(conn) = entry.link.as_ref().map(|l| l.conn) else { continue };
            if has_fresh_quote(entry, key, now_ms, ttl_ms) || self.is_asked(cluster, key) {
                continue;
            }
            if !self.ask(cluster, conn, key, job_id, spec, now_ms, effects) {
                return;
            }
        }
    }

    /// For a job about to be offered where it starts now only after copying its data (for more
    /// than `placement.quoteBeforeCopySecs`): asks every other feasible cluster nearer its data
    /// (a copy more than that much shorter) that cannot start it now and has no fresh quote for
    /// the shape when its own plan would start it: there the wait was only the release
    /// profile's guess, and the member may free the GPUs, or preempt lower-priority jobs, sooner
    /// than the copy ends. Returns `Some` when such a quote is asked now or still in flight: the
    /// caller then leaves the job queued for a round trip and decides on the answer. The
    /// clusters it returns are those asked now (none when only earlier requests are awaited).
    /// None: nothing to wait for, offer the job.
    pub(crate) fn ask_before_copy(
        &mut self,
        registry: &Registry,
        job: &JobRecord,
        decision: &Decision,
        config: &PlacementConfig,
        now_ms: i64,
        effects: &mut Effects,
    ) -> Option<Vec<String>> {
        let copy_secs = decision.chosen_candidate().and_then(|c| c.score()).map(|s| s.expected_start_secs)?;
        let worth_asking = config.quote_before_copy_secs;
        if config.quote_candidates == 0 || copy_secs <= worth_asking {
            return None;
        }
        let (spec, key) = (&job.spec, quote_key(&job.spec));
        let ttl_ms = ttl_ms(config);
        let (mut waits, mut asked) = (false, Vec::new());
        for candidate in &decision.candidates {
            let Verdict::Scored(score) = &candidate.verdict else { continue };
            let cluster = candidate.cluster.as_str();
            if score.fits_now || score.transfer_secs + worth_asking >= copy_secs {
                continue;
            }
            let Some(entry) = registry.get(cluster) else { continue };
            if has_fresh_quote(entry, key, now_ms, ttl_ms) {
                continue; // the decision read its answer already
            }
            // A member that let this question time out is not waited for again soon: the job
            // would otherwise wait for it forever.
            let timed_out = !self.unanswered.is_empty()
                && self
                    .unanswered
                    .get(&(cluster.to_string(), key))
                    .is_some_and(|at| now_ms.saturating_sub(*at) < ttl_ms);
            if timed_out {
                continue;
            }
            if self.is_asked(cluster, key) {
                waits = true;
                continue;
            }
            let Some(conn) = entry.link.as_ref().map(|l| l.conn) else { continue };
            if !self.ask(cluster, conn, key, &job.id, spec, now_ms, effects) {
                break;
            }
            if self.is_asked(cluster, key) {
                waits = true;
                asked.push(cluster.to_string());
            }
        }
        waits.then_some(asked)
    }

    fn is_asked(&self, cluster: &str, key: u64) -> bool {
        self.in_flight.get(cluster).is_some_and(|n| *n > 0)
            && self.pending.values().any(|p| p.key == key && p.cluster == cluster)
    }

    /// Sends one request, unless the cluster or the round is at its limit; false when the round
    /// is.
    #[allow(clippy::too_many_arguments)]
    fn ask(
        &mut self,
        cluster: &str,
        conn: ConnId,
        key: u64,
        job_id: &str,
        spec: &JobSpec,
        now_ms: i64,
        effects: &mut Effects,
    ) -> bool {
        if self.asked_this_round >= MAX_ASKS_PER_ROUND {
            return false;
        }
        let in_flight = self.in_flight.entry(cluster.to_string()).or_default();
        if *in_flight >= MAX_IN_FLIGHT_PER_CLUSTER {
            return true;
        }
        *in_flight += 1;
        self.asked_this_round += 1;
        self.next_id += 1;
        let request_id = self.next_id;
        self.pending.insert(request_id, Pending { cluster: cluster.to_string(), key, sent_ms: now_ms });
        let command = GatewayCommand::Quote { request_id, job_id: job_id.to_string(), spec: spec.clone() };
        effects.sends.push((conn, command));
        true
    }

    /// An answer to a request was kept at `now_ms`.
    pub(crate) fn answered(&mut self, now_ms: i64) {
        self.newest_answer_ms = self.newest_answer_ms.max(now_ms);
    }

    /// When the newest answer was kept (Unix ms; 0 before any).
    pub(crate) fn newest_answer_ms(&self) -> i64 {
        self.newest_answer_ms
    }

    /// The request `request_id` answers, if it is still in flight (it is then no longer).
    pub(crate) fn take(&mut self, request_id: u64) -> Option<Pending> {
        let pending = self.pending.remove(&request_id)?;
        if let Some(n) = self.in_flight.get_mut(&pending.cluster) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.in_flight.remove(&pending.cluster);
            }
        }
        Some(pending)
    }

    /// Requests in flight (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

/// How long a quote is used before it is asked again, in ms (`placement.quoteTtlSecs`).
fn ttl_ms(config: &PlacementConfig) -> i64 {
    (config.quote_ttl_secs * 1000.0) as i64
}

/// Whether `entry` holds a quote for shape `key` younger than `ttl_ms`.
fn has_fresh_quote(entry: &ClusterEntry, key: u64, now_ms: i64, ttl_ms: i64) -> bool {
    entry.quotes.get(key).is_some_and(|q| now_ms.saturating_sub(q.received_at_ms) < ttl_ms)
}

/// What a member's answer keeps: per quoted GPU type its start on the gateway's clock; an error
/// keeps no start (placement then estimates, and the shape is not asked again until it expires).
pub(crate) fn kept(result: Result<StartQuote, String>, now_ms: i64) -> Quote {
    let starts = match result {
        Ok(quote) => quote
            .starts
            .into_iter()
            .map(|s| {
                let after_ms = i64::try_from(s.after_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
                QuotedStart {
                    gpu_type: s.gpu_type.into(),
                    start_at_ms: now_ms.saturating_add(after_ms),
                    preempts: s.preempts,
                }
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    Quote { starts, received_at_ms: now_ms }
}
