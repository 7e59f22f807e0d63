//! A placement round: queued jobs in fair-share order, each offered to its best cluster when it
//! can start there now (late binding); otherwise it stays queued and its decision says why.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use meridian_placement::Holds;
use meridian_placement::queue::{FairQueue, QueuedJob, Usage};
use meridian_placement::{Decision, FederationSnapshot, Name};
use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;

use crate::config::CoreConfig;
use crate::copies::{AtCopy, CopyBook};
use crate::decision::Decided;
use crate::demand::DemandBook;
use crate::io::Effects;
use crate::ledger::Ledger;
use crate::quota::{Hold, RoundQuotas};
use crate::quotes::QuoteRequests;
use crate::record::JobRecord;
use crate::registry::Registry;
use crate::snapshots::Snapshots;
use crate::tally::Outcome;

/// A skipped job's explanation is placed again once it is this old (ms)...
const DECISION_REFRESH_MS: i64 = 30_000;
/// ...but at most this many such refreshes per round, so a long queue of jobs that cannot start
/// costs a bounded amount of every round.
const MAX_REFRESHES_PER_ROUND: usize = 16;

/// The parts a round reads and changes, borrowed from the core for one round.
pub(crate) struct Round<'a> {
    /// Placement weights, fair-share weights and quotas.
    pub(crate) config: &'a CoreConfig,
    /// The member clusters (what the round's snapshot is built from; where offers go).
    pub(crate) registry: &'a Registry,
    /// The network table snapshots share.
    pub(crate) snapshots: &'a Snapshots,
    /// Demand keys.
    pub(crate) demands: &'a mut DemandBook,
    /// Start quotes in flight.
    pub(crate) quotes: &'a mut QuoteRequests,
    /// Sibling copies of queued jobs.
    pub(crate) copies: &'a mut CopyBook,
    /// The jobs.
    pub(crate) ledger: Ledger<'a>,
}

/// A queued job in a round, with what earlier rounds kept about it.
struct Queued {
    job: Arc<JobRecord>,
    /// Its tenant's rank in name order this round.
    tenant: u32,
    /// Its demand key's number, if a round worked it out already.
    demand: Option<u32>,
    /// Its latest decision.
    decided: Option<Arc<Decided>>,
}

impl Round<'_> {
    /// The number of job `id`'s demand key, worked out at its first round and kept.
    fn demand_of(&mut self, id: &str, spec: &meridian_proto::spec::JobSpec) -> u32 {
        if let Some(number) = self.ledger.table.demand(id) {
            return number;
        }
        let key = self.demands.key_of(spec);
        let number = key.1;
        self.ledger.table.set_demand(id, key);
        number
    }

    /// Saves queued `job` with `message` (why it waits, for `meridian job`).
    fn tell(&mut self, job: &JobRecord, message: String, effects: &mut Effects) {
        let mut waiting = JobRecord::clone(job);
        waiting.message = message;
        self.ledger.save(waiting, self.registry, effects);
    }

    /// Makes `hold` the explanation of queued job `id`, unless it already is (`previous`).
    fn wait_for_quota(&mut self, id: &str, previous: Option<&Decided>, hold: Hold<'_>, now_ms: i64) {
        if let Some(decided) = Decided::held(previous, hold, now_ms) {
            self.ledger.decide(id, decided);
        }
    }

    /// The round's queue without the jobs past their tenant's `maxQueuedJobs`; those wait, and
    /// say why.
    fn hold_back_beyond_queue_limits(&mut self, quotas: &RoundQuotas, queued: Vec<Queued>, now_ms: i64) -> Vec<Queued> {
        if quotas.is_empty() {
            return queued;
        }
        let holds = {
            let jobs: Vec<&JobRecord> = queued.iter().map(|q| q.job.as_ref()).collect();
            quotas.beyond_queue_limits(&jobs)
        };
        if holds.is_empty() {
            return queued;
        }
        let mut kept = Vec::with_capacity(queued.len());
        for (entry, hold) in queued.into_iter().zip(holds) {
            match hold {
                Some(hold) => self.wait_for_quota(&entry.job.id, entry.decided.as_deref(), hold, now_ms),
                None => kept.push(entry),
            }
        }
        kept
    }

    /// Places the queue: each job, in fair-share order, is offered to its best cluster if it
    /// can start there now (or granted its ready sibling copy), or stays queued with its
    /// decision saying why (and may wait as copies). Then drops the copies of jobs no longer
    /// queued and every ready copy not granted.
    pub(crate) fn run(mut self, now_ms: i64, effects: &mut Effects) {
        self.place_queue(now_ms, effects);
        let table = &*self.ledger.table;
        let queued = |id: &str| table.get(id).is_some_and(|j| j.state == JobState::Queued);
        self.copies.sweep(queued, self.registry, effects);
    }

    fn place_queue(&mut self, now_ms: i64, effects: &mut Effects) {
        self.ledger.signals.round_done();
        self.quotes.new_round(now_ms);
        let mut snapshot = self.snapshots.for_round(self.registry, &self.config.placement.gpu_speed, now_ms);
        // The queued jobs, oldest first (active ids sort by submission: ids start with the submit
        // time), with what earlier rounds kept about them. The round refers to a job by its
        // position here, which sorts like its id, so ordering and lookups compare no text; and
        // to its tenant by the tenant's rank in name order.
        let tenants = self.ledger.table.tenant_ranks();
        let mut queued: Vec<Queued> = Vec::new();
        for active in self.ledger.table.active() {
            match active.state {
                JobState::Offered => {
                    // The member's inventory does not show an offer until the agent accepts it.
                    let job = &active.record;
                    if let Some(cluster) =
                        snapshot.clusters.iter_mut().find(|c| Some(c.info().name.as_str()) == job.cluster.as_deref())
                    {
                        cluster.reserve(&job.spec);
                    }
                }
                JobState::Queued => queued.push(Queued {
                    job: Arc::clone(&active.record),
                    tenant: tenants.rank(active.tenant),
                    demand: active.demand.as_ref().map(|(_, number)| *number),
                    decided: active.decided.clone(),
                }),
                _ => {}
            }
        }
        let mut quotas = RoundQuotas::default();
        if self.config.has_quotas() {
            let held_gpus: HashMap<String, u32> =
                tenants.held_gpus().map(|(tenant, gpus)| (tenant.to_string(), gpus)).collect();
            quotas = RoundQuotas::new(self.config, queued.iter().map(|q| q.job.as_ref()), &held_gpus);
            queued = self.hold_back_beyond_queue_limits(&quotas, queued, now_ms);
        }
        if queued.is_empty() {
            return;
        }
        let now_secs = now_ms as f64 / 1000.0;
        let waited = |submitted_at_ms: i64| (now_ms.saturating_sub(submitted_at_ms) as f64 / 1000.0).max(0.0);
        let config = self.config.placement.clone();
        let mut holds = {
            // A job over its tenant's GPU quota cannot be offered this round (the tenant's count
            // only grows within a round), so it must not hold a cluster against other tenants.
            let oldest_first = queued
                .iter()
                .enumerate()
                .filter(|(_, q)| quotas.gpu_hold(&q.job).is_none())
                // A job waiting as copies is reserved for by the members themselves.
                .filter(|(_, q)| !self.copies.has_copies(&q.job.id))
                .map(|(at, q)| (at, &q.job.spec, waited(q.job.submitted_at_ms)));
            Holds::for_round(oldest_first, &snapshot, &config, now_secs)
        };
        let order = queued.iter().enumerate().map(|(at, q)| QueuedJob {
            id: at,
            tenant: q.tenant,
            priority: q.job.spec.priority,
            submitted_at_ms: q.job.submitted_at_ms,
            gpus: q.job.spec.total_gpus(),
            cpu: gang_total(q.job.spec.gang.replicas, q.job.spec.gang.resources.cpu),
            memory_gib: gang_total(q.job.spec.gang.replicas, q.job.spec.gang.resources.memory_gib),
        });
        let mut queue = FairQueue::new(
            order.collect(),
            |&rank| tenants.usage(rank),
            capacity(&snapshot),
            |&rank| self.config.tenant_weight(tenants.name(rank)),
        );
        let cluster_index: HashMap<Name, usize> =
            snapshot.clusters.iter().enumerate().map(|(i, c)| (c.name().clone(), i)).collect();
        // Demands (gang shape and placement rules) that fit on no cluster now. Within a round
        // capacity only shrinks (offers reserve it), so a "no" stays true for the round.
        let mut fits_nowhere: HashSet<u32> = HashSet::new();
        // Demands known to fit somewhere now; only an offer's reservation can change that, so the
        // set is emptied at each one.
        let mut fits_somewhere_now: HashSet<u32> = HashSet::new();
        let mut refreshed = 0;
        while let Some(next) = queue.pop_next() {
            let Some(entry) = queued.get(next.id) else { continue };
            let job = &entry.job;
            // Over its tenant's GPU quota: it waits, and says so (a cheap check, before any
            // placement work).
            if let Some(hold) = quotas.gpu_hold(job) {
                self.ledger.tally().count_decision(Outcome::HeldByQuota, None);
                self.wait_for_quota(&job.id, entry.decided.as_deref(), hold, now_ms);
                continue;
            }
            // A member is ready to start its copy: the job takes it, in its fair-share turn.
            if let Some(copy) = self.copies.ready_copy(&job.id).cloned()
                && let Some(conn) = self.registry.conn_of(&copy.cluster)
            {
                queue.placed(&next);
                quotas.offered(job);
                holds.release(&next.id);
                self.grant(job, entry.decided.as_deref(), &copy, conn, now_ms, effects);
                continue;
            }
            // A job whose gang fits on no cluster now cannot be offered, whatever placement
            // would score: skip it (the expensive part of a round over a long queue) unless its
            // explanation is missing or old. It still counts as waiting where it last chose to.
            let demand = match entry.demand {
                Some(number) => number,
                None => self.demand_of(&job.id, &job.spec),
            };
            let fits_somewhere = fits_somewhere_now.contains(&demand)
                || (!fits_nowhere.contains(&demand) && {
                    let fits = snapshot.clusters.iter().any(|c| c.fits_now(&job.spec));
                    if fits {
                        fits_somewhere_now.insert(demand);
                    } else {
                        fits_nowhere.insert(demand);
                    }
                    fits
                });
            if !fits_somewhere {
                let previous = entry.decided.as_deref();
                // A member's quote that arrived after the decision may change it: not fresh.
                let max_age = DECISION_REFRESH_MS.min(now_ms.saturating_sub(self.quotes.newest_answer_ms()) + 1);
                let fresh = previous.is_some_and(|d| d.is_fresh(now_ms, max_age));
                let first = previous.is_none();
                if fresh || (!first && refreshed >= MAX_REFRESHES_PER_ROUND) {
                    if let Some(Decided::Live { decision, .. }) = previous
                        && let Some(choice) = decision.chosen.as_ref()
                        && let Some(&index) = cluster_index.get(choice.cluster.as_str())
                        && let Some(target) = snapshot.clusters.get_mut(index)
                    {
                        target.expect_waiting(u64::from(job.spec.total_gpus()));
                    }
                    continue;
                }
                if !first {
                    refreshed += 1;
                }
            }
            let decision =
                holds.place(&mut snapshot, &next.id, &job.spec, waited(job.submitted_at_ms), &config, now_secs);
            let chosen =
                decision.chosen.as_ref().filter(|c| c.starts_now).map(|c| (c.cluster.clone(), c.gpu_type.clone()));
            let Some((cluster, gpu_type)) = chosen else {
                self.ledger.tally().count_decision(Outcome::Waiting, Some(&decision));
                // Where the job waits, ask the members' own plans when it could start, and let it
                // wait as copies on the best of them.
                self.quotes.ask_for(self.registry, job, &decision, &config, now_ms, effects);
                let copies = self.copies.place(self.registry, job, &decision, config.sibling_copies, effects);
                if !copies.is_empty() {
                    // Where it waits, for `meridian job` (a job gets copies once per wait).
                    self.tell(
                        job,
                        format!(
                            "waiting as sibling copies on {}: the first whose own scheduler is ready starts it",
                            copies.join(", ")
                        ),
                        effects,
                    );
                }
                self.ledger.decide(&job.id, Decided::waiting(now_ms, decision));
                continue;
            };
            let Some(conn) = self.registry.conn_of(&cluster) else {
                self.ledger.tally().count_decision(Outcome::Waiting, Some(&decision));
                self.ledger.decide(&job.id, Decided::waiting(now_ms, decision));
                continue;
            };
            let preempts = decision.chosen_candidate().and_then(|c| c.score()).is_some_and(|s| s.preempts);
            // About to copy its data to start elsewhere, while a cluster nearer the data has not
            // said when its own plan (or a preemption) would start it: ask it first.
            let before_copy = if preempts {
                None
            } else {
                self.quotes.ask_before_copy(self.registry, job, &decision, &config, now_ms, effects)
            };
            if let Some(asked) = before_copy {
                self.ledger.tally().count_decision(Outcome::Waiting, Some(&decision));
                if !asked.is_empty() {
                    // Why a job that could start now waits, for `meridian job`.
                    self.tell(
                        job,
                        format!(
                            "{cluster} can start it now after copying its data; asking {} first, nearer its data, when \
                             its own plan would start it",
                            asked.join(", ")
                        ),
                        effects,
                    );
                }
                self.ledger.decide(&job.id, Decided::waiting(now_ms, decision));
                continue;
            }
            let grace_ms = (config.copy_start_grace_secs * 1000.0) as i64;
            if !preempts && let AtCopy::Wait { first } = self.copies.at_copy(&job.id, &cluster, now_ms, grace_ms) {
                // Its copy there starts at the member's next pass: keep the GPUs for it.
                self.ledger.tally().count_decision(Outcome::Waiting, Some(&decision));
                if let Some(target) = snapshot.clusters.iter_mut().find(|c| *c.name() == cluster) {
                    target.reserve(&job.spec);
                    fits_somewhere_now.clear();
                }
                if first {
                    self.tell(
                        job,
                        format!(
                            "{cluster} can start it now and holds its sibling copy: waiting for its scheduler to start \
                             the copy and ask for the start lock"
                        ),
                        effects,
                    );
                }
                self.ledger.decide(&job.id, Decided::waiting(now_ms, decision));
                continue;
            }
            self.ledger.tally().count_decision(Outcome::Placed, Some(&decision));
            if let Some(region) = decision.candidates.iter().find(|c| c.cluster == cluster).map(|c| c.region.clone()) {
                self.ledger.tally().count_data_moved(job, &region);
            }
            if let Some(target) = snapshot.clusters.iter_mut().find(|c| *c.name() == cluster) {
                target.reserve(&job.spec);
                if preempts {
                    target.forget_quotes();
                }
                fits_somewhere_now.clear();
            }
            queue.placed(&next);
            quotas.offered(job);
            // Its hold (if it had one) has served: the cluster is open to the jobs after it.
            holds.release(&next.id);
            let mut offered = JobRecord::clone(job);
            offered.state = JobState::Offered;
            offered.cluster = Some(cluster.to_string());
            offered.gpu_type = (!gpu_type.is_empty()).then(|| gpu_type.to_string());
            offered.fencing_token += 1;
            offered.message = format!("offered to {cluster}");
            let summary = decision.summary();
            offered.placement = Some(summary.clone());
            tracing::info!(job = %offered.id, cluster = %cluster, token = offered.fencing_token, "offered");
            // Its copies go first: a member holding one drops it before it sees the offer.
            self.copies.drop_all(&offered.id, None, self.registry, effects);
            // The offer goes out only after the Offered record (with its new token) and the
            // decision are durable.
            effects.sends.push((conn, GatewayCommand::Offer(offered.assignment())));
            let id = offered.id.clone();
            self.ledger.save(offered, self.registry, effects);
            self.ledger.timers.offered(id.clone(), now_ms);
            self.ledger.save_decision(&id, now_ms, decision, summary, effects);
        }
        // Offers changed the snapshot only for this round; reports will confirm them.
        self.ledger.signals.round_done();
    }

    /// Grants `job` the start lock for its ready `copy`: an offer like any other (a new fencing
    /// token, `Offered` and durable before the grant goes out, under the offer timeout), made
    /// on the decision that placed the copies. Every other copy is dropped first.
    fn grant(
        &mut self,
        job: &JobRecord,
        decided: Option<&Decided>,
        copy: &crate::copies::SiblingCopy,
        conn: crate::io::ConnId,
        now_ms: i64,
        effects: &mut Effects,
    ) {
        let decision = match decided {
            Some(Decided::Live { decision, .. }) => Some(decision.clone()),
            _ => None,
        };
        self.ledger.tally().count_decision(Outcome::Placed, decision.as_ref());
        let cluster = copy.cluster.as_str();
        let mut offered = job.clone();
        offered.state = JobState::Offered;
        offered.cluster = Some(cluster.to_string());
        offered.gpu_type = (!copy.gpu_type.is_empty()).then(|| copy.gpu_type.clone());
        offered.fencing_token += 1;
        offered.message = format!("its sibling copy on {cluster} was ready first: granted the start lock");
        let summary = decision.as_ref().map(Decision::summary);
        if let Some(decision) = &decision {
            offered.placement = summary.clone();
            if let Some(region) = decision.candidates.iter().find(|c| c.cluster == cluster).map(|c| c.region.clone()) {
                self.ledger.tally().count_data_moved(job, &region);
            }
        }
        tracing::info!(job = %offered.id, cluster, token = offered.fencing_token, copy = copy.token, "copy granted");
        self.copies.drop_all(&offered.id, Some(copy.token), self.registry, effects);
        effects.sends.push((conn, GatewayCommand::Grant { copy_token: copy.token, assignment: offered.assignment() }));
        let id = offered.id.clone();
        self.ledger.save(offered, self.registry, effects);
        self.ledger.timers.offered(id.clone(), now_ms);
        if let (Some(decision), Some(summary)) = (decision, summary) {
            self.ledger.save_decision(&id, now_ms, decision, summary, effects);
        }
    }
}

/// `per_replica` × `replicas`, saturating.
fn gang_total(replicas: u32, per_replica: u32) -> u32 {
    replicas.saturating_mul(per_replica)
}

/// GPUs, CPU cores and memory of the connected clusters: the denominators of each tenant's
/// dominant share.
fn capacity(snapshot: &FederationSnapshot) -> Usage {
    let mut total = Usage::default();
    for cluster in snapshot.clusters.iter().filter(|c| c.connected) {
        for shape in &cluster.inventory().shapes {
            let nodes = f64::from(shape.node_count());
            total.add(Usage {
                gpus: f64::from(shape.gpus_per_node) * nodes,
                cpu: f64::from(shape.cpu_per_node) * nodes,
                memory_gib: f64::from(shape.memory_gib_per_node) * nodes,
            });
        }
    }
    total
}
