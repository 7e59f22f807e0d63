//! Agent streams: hello, reports, heartbeats, and a stream's end.
//!
//! Every binding of a job to a cluster carries a fencing token that grows with each offer. A
//! report or reply with an older token (or from another cluster) describes a stale copy: it is
//! answered with a cancel (or, for a result, an acknowledgement that drops it) instead of being
//! applied, so a job never runs twice knowingly.

use std::collections::HashSet;
use std::sync::Arc;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::Inventory;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, Assignment, GatewayCommand, GpuUsage, JobReport};

use crate::config::CoreConfig;
use crate::copies::CopyBook;
use crate::io::{ConnId, Effects, Error, Reply};
use crate::ledger::Ledger;
use crate::quotes::{self, QuoteRequests};
use crate::record::{KnownCluster, Record};
use crate::registry::{Link, Registry};
use crate::snapshots::Snapshots;
use crate::timers::millis;
use crate::usage::UsageBook;

/// The parts an agent's words (and its silence) change, borrowed from the core for one step.
pub(crate) struct Agents<'a> {
    /// Timeouts and the lease.
    pub(crate) config: &'a CoreConfig,
    /// The member clusters and their streams.
    pub(crate) registry: &'a mut Registry,
    /// What placement reads (a cluster's new shape invalidates the never-fits snapshot).
    pub(crate) snapshots: &'a mut Snapshots,
    /// Running jobs' GPU utilisation.
    pub(crate) usage: &'a mut UsageBook,
    /// Start quotes in flight.
    pub(crate) quotes: &'a mut QuoteRequests,
    /// Sibling copies of queued jobs.
    pub(crate) copies: &'a mut CopyBook,
    /// The jobs.
    pub(crate) ledger: Ledger<'a>,
    /// Rules a test switched off.
    #[cfg(test)]
    pub(crate) mutations: Mutations,
}

/// Safety rules a test may switch off (see `never_twice_tests.rs`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Mutations {
    /// Rule 1 removed: a lost cluster's offers in flight go straight back to the queue.
    pub(crate) requeue_offers_on_loss: bool,
}

/// How a member answered an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OfferAnswer {
    /// It took the job (running or queued locally).
    Accepted,
    /// Not now (full, busy, another binding held): the job is placed again.
    Declined,
    /// Never, as specified: the job fails with the member's words.
    Refused,
}

/// Whether any node of `new` has more of something free than the same node of `old` (same
/// shapes assumed).
fn capacity_grew(old: &Inventory, new: &Inventory) -> bool {
    old.shapes.iter().zip(&new.shapes).any(|(before, after)| {
        before
            .free
            .iter()
            .zip(&after.free)
            .any(|(b, a)| a.gpus > b.gpus || a.cpu > b.cpu || a.memory_gib > b.memory_gib)
    })
}

/// Whether two inventories have the same node shapes (ignoring what is free).
fn same_shapes(a: &Inventory, b: &Inventory) -> bool {
    a.shapes.len() == b.shapes.len()
        && a.shapes.iter().zip(&b.shapes).all(|(x, y)| {
            x.name == y.name
                && x.gpu_type == y.gpu_type
                && x.gpus_per_node == y.gpus_per_node
                && x.cpu_per_node == y.cpu_per_node
                && x.memory_gib_per_node == y.memory_gib_per_node
                && x.free.len() == y.free.len()
        })
}

impl Agents<'_> {
    /// Accepts an agent's stream for its cluster (unless another live agent holds the cluster)
    /// and welcomes it with the jobs the gateway has bound to the cluster.
    pub(crate) fn hello(
        &mut self,
        conn: ConnId,
        hello: AgentHello,
        now_ms: i64,
        effects: &mut Effects,
    ) -> Result<Reply, Error> {
        let name = hello.info.name.clone();
        if let Some(link) = self.registry.get(&name).and_then(|c| c.link.as_ref())
            && link.instance != hello.instance_id
        {
            tracing::warn!(
                cluster = %name,
                live = %link.instance,
                refused = %hello.instance_id,
                "refused a second agent for a connected cluster"
            );
            return Err(Error::DuplicateAgent { cluster: name, instance: link.instance.clone() });
        }
        let link = Link { conn, instance: hello.instance_id.clone() };
        self.snapshots.shapes_changed();
        // A new stream: the agent dropped every copy it held on the old one.
        self.copies.cluster_gone(&name);
        if let Some(old) = self.registry.connect(hello.info, link, now_ms) {
            // The same agent process reconnected before its old stream was noticed dead.
            effects.close.push(old);
        }
        self.ledger.signals.clusters_changed();
        self.ledger.signals.want_round();
        // Offers in flight are listed too: the agent keeps one it is submitting or already runs
        // (its answer then comes on this stream), and reports one it never saw as lost.
        let bound: Vec<Assignment> =
            self.ledger.table.on_cluster(&name).filter(|j| j.holds_gpus()).map(|j| j.assignment()).collect();
        effects.sends.push((conn, GatewayCommand::Welcome { bound, lease: self.config.agent_lease() }));
        tracing::info!(cluster = %name, conn, instance = %hello.instance_id, "agent connected");
        Ok(Reply::Attached)
    }

    /// Applies what an agent said on an accepted stream.
    pub(crate) fn agent_event(&mut self, conn: ConnId, event: AgentEvent, now_ms: i64, effects: &mut Effects) {
        let Some(entry) = self.registry.entry_of_mut(conn) else {
            // A stream that was replaced or dropped; its successor is authoritative.
            return;
        };
        entry.last_seen_ms = now_ms;
        let cluster = entry.info.name.clone();
        match event {
            AgentEvent::Inventory(inventory) => {
                if entry.inventory == inventory {
                    // Agents repeat their report every heartbeat; an unchanged one changes nothing.
                    return;
                }
                let shapes_changed = !same_shapes(&entry.inventory, &inventory);
                // Only more free capacity can let a queued job start now; less is seen by the next
                // round that runs for another reason (or the periodic one).
                let grew = shapes_changed || capacity_grew(&entry.inventory, &inventory);
                entry.set_inventory(inventory);
                if shapes_changed {
                    let known = KnownCluster { info: entry.info.clone(), inventory: entry.inventory.clone() };
                    effects.persist.push(Record::Cluster(known));
                    self.snapshots.shapes_changed();
                }
                self.ledger.signals.clusters_changed();
                if grew {
                    self.ledger.signals.want_round();
                }
            }
            AgentEvent::Pressure(pressure) => {
                // Pressure moves expected waits, never what can start now: the periodic round
                // refreshes decisions with it.
                if *entry.pressure != pressure {
                    entry.pressure = Arc::new(pressure);
                    self.ledger.signals.clusters_changed();
                }
            }
            AgentEvent::OfferReply { job_id, fencing_token, accepted, reason, permanent } => {
                let answer = match (accepted, permanent) {
                    (true, _) => OfferAnswer::Accepted,
                    (false, false) => OfferAnswer::Declined,
                    (false, true) => OfferAnswer::Refused,
                };
                self.offer_reply(conn, &cluster, &job_id, fencing_token, answer, &reason, now_ms, effects);
            }
            AgentEvent::Status(report) => {
                let (job_id, token, usage) = (report.job_id.clone(), report.fencing_token, report.usage);
                self.apply_report(conn, &cluster, report, now_ms, effects);
                self.note_usage(&job_id, token, usage, now_ms);
            }
            AgentEvent::Heartbeat { seq, jobs } => {
                let held: HashSet<String> = jobs.iter().map(|r| r.job_id.clone()).collect();
                for report in jobs {
                    let (job_id, token, usage) = (report.job_id.clone(), report.fencing_token, report.usage);
                    self.apply_report(conn, &cluster, report, now_ms, effects);
                    self.note_usage(&job_id, token, usage, now_ms);
                }
                self.missing_from_heartbeat(&cluster, &held, effects);
                if let Some(lease) = self.config.agent_lease() {
                    effects.sends.push((conn, GatewayCommand::Lease { heartbeat_seq: seq, lease }));
                }
            }
            // Output goes to whoever asked, around the core (the runtime routes it); it changes
            // no state.
            AgentEvent::Logs { .. } => {}
            AgentEvent::Quote { request_id, result } => {
                // Only the cluster asked may answer.
                let Some(pending) = self.quotes.take(request_id) else { return };
                if pending.cluster != cluster {
                    return;
                }
                if let Err(reason) = &result {
                    tracing::debug!(cluster = %cluster, %reason, "no start quote");
                }
                let quoted = result.is_ok();
                let quote = quotes::kept(result, now_ms);
                Arc::make_mut(&mut entry.quotes).insert(pending.key, quote);
                if quoted {
                    // Jobs waiting on an estimate are decided again at the next round.
                    self.quotes.answered(now_ms);
                    self.ledger.signals.want_round();
                }
            }
            AgentEvent::CopyReady { job_id, copy_token } => {
                let queued = self.ledger.table.get(&job_id).is_some_and(|j| j.state == JobState::Queued);
                if queued && self.copies.mark_ready(&job_id, &cluster, copy_token) {
                    // The next round grants it, in the job's fair-share turn.
                    self.ledger.signals.want_round();
                } else {
                    // Another copy started, the job was placed or cancelled, or the copy is
                    // stale: this one never starts.
                    tracing::debug!(cluster = %cluster, job = %job_id, copy_token, "stale copy ready; dropping it");
                    effects.sends.push((conn, GatewayCommand::DropCopy { job_id, copy_token }));
                }
            }
            AgentEvent::CopyDropped { job_id, copy_token, reason, unsupported } => {
                tracing::debug!(cluster = %cluster, job = %job_id, copy_token, %reason, unsupported, "copy dropped by its member");
                self.copies.dropped(&job_id, &cluster, copy_token, unsupported);
            }
        }
    }

    /// Applies a member's answer to an offer.
    #[allow(clippy::too_many_arguments)]
    fn offer_reply(
        &mut self,
        conn: ConnId,
        cluster: &str,
        job_id: &str,
        token: u64,
        answer: OfferAnswer,
        reason: &str,
        now_ms: i64,
        effects: &mut Effects,
    ) {
        let accepted = answer == OfferAnswer::Accepted;
        let current = self
            .ledger
            .table
            .get(job_id)
            .is_some_and(|j| j.is_bound_to(cluster, token) && j.state == JobState::Offered);
        if !current {
            if accepted {
                // Accepted too late (cancelled, timed out, offered elsewhere): stop that copy.
                effects.sends.push((conn, GatewayCommand::Cancel { job_id: job_id.to_string(), fencing_token: token }));
            }
            return;
        }
        let Some(mut job) = self.ledger.copy_of(job_id) else { return };
        if accepted && self.ledger.timers.is_withdrawing(job_id) {
            // Accepted before the agent saw the withdrawal that follows on the same stream: it
            // stops the job and confirms with a cancelled report, which requeues it.
            tracing::info!(job = %job.id, cluster, "a withdrawn offer was accepted; waiting for the member to stop it");
            return;
        }
        if accepted {
            job.state = JobState::Bound;
            job.message = if reason.is_empty() {
                format!("accepted by {cluster}")
            } else {
                format!("queued on {cluster}: {reason}")
            };
        } else if answer == OfferAnswer::Refused {
            // The member's scheduler judged the job itself (an account it does not know, a
            // request its nodes cannot satisfy): its words are the answer, offering again would
            // only repeat them.
            job.state = JobState::Failed;
            job.finished_at_ms = Some(now_ms);
            job.message = format!("refused by {cluster}: {reason}");
            tracing::info!(job = %job.id, cluster, reason, "offer refused for good; the job fails");
        } else {
            job.state = JobState::Queued;
            job.cluster = None;
            job.gpu_type = None;
            job.message = format!("{cluster} declined the offer: {reason}");
            tracing::info!(job = %job.id, cluster, reason, "offer declined");
        }
        self.ledger.save(job, self.registry, effects);
    }

    /// Applies what an agent says about one job (a status message or a heartbeat entry).
    fn apply_report(&mut self, conn: ConnId, cluster: &str, report: JobReport, now_ms: i64, effects: &mut Effects) {
        let terminal = report.state.is_terminal();
        let ack = |effects: &mut Effects| {
            effects.sends.push((
                conn,
                GatewayCommand::Ack { job_id: report.job_id.clone(), fencing_token: report.fencing_token },
            ));
        };
        let cancel = |effects: &mut Effects| {
            effects.sends.push((
                conn,
                GatewayCommand::Cancel { job_id: report.job_id.clone(), fencing_token: report.fencing_token },
            ));
        };
        let Some(mut job) =
            self.ledger.copy_of(&report.job_id).filter(|j| j.is_bound_to(cluster, report.fencing_token))
        else {
            // A stale binding (or a job forgotten after retention): drop its result, stop its copy.
            if terminal {
                ack(effects);
            } else {
                tracing::warn!(job = %report.job_id, cluster, token = report.fencing_token, "stale copy reported; cancelling it");
                cancel(effects);
            }
            return;
        };
        if job.state.is_terminal() {
            if !terminal {
                // The user cancelled while the stop was in flight or the cluster was away.
                cancel(effects);
                return;
            }
            if job.state == JobState::Cancelled && report.state == JobState::Cancelled {
                let message = format!("cancelled by user; stopped on {cluster}");
                if job.message != message {
                    job.message = message;
                    self.ledger.save(job, self.registry, effects);
                }
            }
            ack(effects);
            return;
        }
        let previous = job.state;
        if terminal {
            // The job is not terminal here, so a cancelled report answers the gateway's own
            // withdrawal of an unanswered offer, not a user's cancel: the member confirms that
            // its copy has stopped, and only now may the job run elsewhere.
            let withdrawn = report.state == JobState::Cancelled;
            if report.requeue || withdrawn {
                // Back to the federation queue; `submitted_at_ms` is kept, so the time it
                // already waited still counts for its place in line.
                job.back_to_queue();
                job.message = if withdrawn {
                    format!("the offer to {cluster} was withdrawn and its copy there has stopped; placing it again")
                } else if report.message.is_empty() {
                    format!("{cluster} stopped the job; placing it again")
                } else {
                    format!("{}; placing it again", report.message)
                };
                if report.preempted {
                    job.preemptions = job.preemptions.saturating_add(1);
                    job.last_preempted_at_ms = Some(now_ms);
                    job.message = format!("preempted on {cluster} ({}); placing it again", report.message);
                }
            } else {
                job.state = report.state;
                job.finished_at_ms = Some(now_ms);
                job.message = if report.message.is_empty() {
                    format!("{} on {cluster}", report.state.as_str().to_lowercase())
                } else {
                    report.message.clone()
                };
            }
            tracing::info!(job = %job.id, cluster, from = %previous, to = %job.state, "job state");
            self.ledger.save(job, self.registry, effects);
            // Delivered after the record above is durable: only then may the agent forget it.
            ack(effects);
            return;
        }
        if self.ledger.timers.is_withdrawing(&job.id) {
            // Being withdrawn: only the member's word that its copy stopped changes the job.
            return;
        }
        match report.state {
            JobState::Running => {
                let nodes_changed = !report.nodes.is_empty() && report.nodes != job.nodes;
                if previous == JobState::Running && !nodes_changed {
                    return;
                }
                job.state = JobState::Running;
                if job.started_at_ms.is_none() {
                    job.started_at_ms = Some(now_ms);
                }
                if nodes_changed {
                    job.nodes = report.nodes;
                }
                job.message = format!("running on {cluster}");
            }
            JobState::Offered => {
                // The agent is still submitting the offer. Only news after a lost stream (the
                // job is `Unknown`): the offer is in flight again, under the offer timeout.
                if previous != JobState::Unknown {
                    return;
                }
                job.state = JobState::Offered;
                job.message = format!("offered to {cluster}; its agent is still submitting it");
                self.ledger.timers.offered(job.id.clone(), now_ms);
            }
            JobState::Bound => {
                // Held by the member, waiting in its local queue.
                let message = if report.message.is_empty() {
                    format!("accepted by {cluster}")
                } else {
                    format!("queued on {cluster}: {}", report.message)
                };
                if previous == JobState::Bound && job.message == message {
                    return;
                }
                if previous == JobState::Running {
                    // A member may requeue a started job locally (preemption); say so.
                    job.started_at_ms = None;
                }
                job.state = JobState::Bound;
                job.message = message;
            }
            JobState::Queued | JobState::Unknown | JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
                return;
            }
        }
        if job.state != previous {
            tracing::info!(job = %job.id, cluster, from = %previous, to = %job.state, "job state");
        }
        self.ledger.save(job, self.registry, effects);
    }

    /// Jobs the gateway has bound to `cluster` that the agent's heartbeat does not list: the
    /// member no longer holds them (its agent restarted with a backend that cannot adopt them,
    /// or the member lost them). Nothing runs them, so they are placed again.
    fn missing_from_heartbeat(&mut self, cluster: &str, held: &HashSet<String>, effects: &mut Effects) {
        let missing: Vec<String> = self
            .ledger
            .table
            .on_cluster(cluster)
            .filter(|j| !held.contains(&j.id))
            .filter(|j| matches!(j.state, JobState::Bound | JobState::Running | JobState::Unknown))
            .map(|j| j.id.clone())
            .collect();
        for id in missing {
            let Some(mut job) = self.ledger.copy_of(&id) else { continue };
            tracing::warn!(job = %id, cluster, "member no longer holds the job; placing it again");
            job.back_to_queue();
            job.message = format!(
                "{cluster} no longer holds the job (its agent restarted or the member lost it); placing it again"
            );
            self.ledger.save(job, self.registry, effects);
        }
    }

    /// Notes a job's GPU usage from a report just applied (see [`UsageBook::note`]).
    fn note_usage(&mut self, job_id: &str, fencing_token: u64, usage: Option<GpuUsage>, now_ms: i64) {
        let job = self.ledger.table.get(job_id).map(Arc::as_ref);
        self.usage.note(job, job_id, fencing_token, usage, now_ms);
    }

    /// A stream ended (closed, broken, or dropped by the runtime).
    pub(crate) fn agent_gone(&mut self, conn: ConnId, now_ms: i64, effects: &mut Effects) {
        let last_seen = self.registry.entry_of_mut(conn).map(|e| e.last_seen_ms);
        if let Some(cluster) = self.registry.disconnect(conn) {
            tracing::warn!(cluster = %cluster, conn, "agent disconnected");
            self.copies.cluster_gone(&cluster);
            self.ledger.signals.clusters_changed();
            self.cluster_lost(&cluster, last_seen.unwrap_or(now_ms), effects);
        }
    }

    /// Drops the streams of clusters silent past the cluster timeout; their jobs are lost
    /// with them (see [`Self::cluster_lost`]).
    pub(crate) fn expire_silent_clusters(&mut self, now_ms: i64, effects: &mut Effects) {
        let timeout = millis(self.config.cluster_timeout);
        let silent: Vec<(String, u64, i64)> = self
            .registry
            .iter()
            .filter(|c| now_ms.saturating_sub(c.last_seen_ms) > timeout)
            .filter_map(|c| c.link.as_ref().map(|l| (c.info.name.clone(), l.conn, c.last_seen_ms)))
            .collect();
        for (cluster, conn, last_seen_ms) in silent {
            tracing::warn!(cluster = %cluster, "cluster silent past the timeout; dropping its stream");
            if self.registry.disconnect(conn).is_some() {
                effects.close.push(conn);
                self.copies.cluster_gone(&cluster);
                self.ledger.signals.clusters_changed();
                self.cluster_lost(&cluster, last_seen_ms, effects);
            }
        }
    }

    /// A cluster's stream is gone: offered, bound and running jobs become `Unknown`, counted
    /// from when the cluster was last heard (the agent's lease runs from no later than then, so
    /// the agent stops its copies before the gateway places them again).
    ///
    /// An offer in flight counts as a job that may be running: the agent may have accepted and
    /// started it while its answer was lost with the stream. It is placed again only under the
    /// lease rule, like a bound job; if the cluster returns first, the welcome lists it and the
    /// agent either keeps it (and reports it) or reports it lost.
    fn cluster_lost(&mut self, cluster: &str, last_seen_ms: i64, effects: &mut Effects) {
        let ids: Vec<String> =
            self.ledger.table.on_cluster(cluster).filter(|j| j.holds_gpus()).map(|j| j.id.clone()).collect();
        for id in ids {
            let Some(mut job) = self.ledger.copy_of(&id) else { continue };
            match job.state {
                JobState::Unknown => {}
                #[cfg(test)]
                JobState::Offered if self.mutations.requeue_offers_on_loss => {
                    job.state = JobState::Queued;
                    job.cluster = None;
                    job.gpu_type = None;
                    self.ledger.save(job, self.registry, effects);
                }
                state => {
                    // An offer in flight may have been accepted and started: it is treated like
                    // a bound job, and the message says so.
                    let in_flight = if state == JobState::Offered {
                        " with the offer in flight (it may have started the job)"
                    } else {
                        ""
                    };
                    job.state = JobState::Unknown;
                    job.message = format!(
                        "{cluster} stopped reporting{in_flight}; the job is placed again elsewhere if it stays away for {}",
                        HumanDuration(self.config.lost_job_timeout)
                    );
                    self.ledger.save(job, self.registry, effects);
                    self.ledger.timers.unknown(id, last_seen_ms);
                }
            }
        }
        self.ledger.signals.want_round();
    }
}
