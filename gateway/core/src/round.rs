//! A placement round: queued jobs in fair-share order, each offered to its best cluster when it
//! can start there now (late binding); otherwise it stays queued and its decision says why.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use meridian_placement::FederationSnapshot;
use meridian_placement::Holds;
use meridian_placement::queue::{FairQueue, QueuedJob, Usage};
use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;

use crate::agents::assignment;
use crate::io::Effects;
use crate::jobs::holds_gpus;
use crate::record::JobRecord;
use crate::{Core, Decided};

/// A skipped job's explanation is placed again once it is this old (ms)...
const DECISION_REFRESH_MS: i64 = 30_000;
/// ...but at most this many such refreshes per round, so a long queue of jobs that cannot start
/// costs a bounded amount of every round.
const MAX_REFRESHES_PER_ROUND: usize = 16;

/// What decides whether a job's gang could fit somewhere now: its shape and its placement rules
/// (and whether it needs container support). Jobs with equal keys fit the same clusters.
fn demand_key(spec: &meridian_proto::spec::JobSpec) -> String {
    format!("{:?}|{:?}|{}", spec.gang, spec.placement, spec.payload.image.is_some())
}

impl Core {
    /// The canonical copy and number of a demand key: equal keys get one number, so a round
    /// compares numbers, not strings.
    fn intern_demand(&mut self, key: String) -> (Arc<str>, u32) {
        if let Some((canonical, id)) = self.demand_ids.get_key_value(key.as_str()) {
            return (Arc::clone(canonical), *id);
        }
        let id = self.next_demand_id;
        self.next_demand_id = self.next_demand_id.wrapping_add(1);
        let canonical: Arc<str> = key.into();
        self.demand_ids.insert(Arc::clone(&canonical), id);
        (canonical, id)
    }

    /// Forgets demand keys no queued job uses any more (each job holds a clone of its key).
    pub(crate) fn forget_unused_demands(&mut self) {
        self.demand_ids.retain(|key, _| Arc::strong_count(key) > 1);
    }

    pub(crate) fn round(&mut self, now_ms: i64, effects: &mut Effects) {
        self.round_wanted = false;
        let mut snapshot = self.registry.snapshot(&self.config.network);
        snapshot.set_gpu_speed(&self.config.placement.gpu_speed);
        let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
        let mut queued = Vec::new();
        for job in self.active.values() {
            if job.state == JobState::Offered {
                // The member's inventory does not show an offer until the agent accepts it.
                if let Some(cluster) =
                    snapshot.clusters.iter_mut().find(|c| Some(c.info().name.as_str()) == job.cluster.as_deref())
                {
                    cluster.reserve(&job.spec);
                }
            }
            if holds_gpus(job.state) {
                let held = Usage::of(&queued_job(job));
                match usage.get_mut(job.spec.tenant.as_str()) {
                    Some(tenant) => tenant.add(held),
                    None => {
                        usage.insert(job.spec.tenant.clone(), held);
                    }
                }
            }
            if job.state == JobState::Queued {
                queued.push(queued_job(job));
            }
        }
        if queued.is_empty() {
            return;
        }
        let now_secs = now_ms as f64 / 1000.0;
        let waited = |submitted_at_ms: i64| (now_ms.saturating_sub(submitted_at_ms) as f64 / 1000.0).max(0.0);
        let config = self.config.placement.clone();
        // Active ids sort by submission (ids start with the submit time), so this is oldest first.
        let mut holds = {
            let oldest_first = queued.iter().filter_map(|next| {
                let job = self.jobs.get(&next.id)?;
                Some((next.id.clone(), &job.spec, waited(next.submitted_at_ms)))
            });
            Holds::for_round(oldest_first, &snapshot, &config, now_secs)
        };
        let mut queue = FairQueue::new(queued, &usage, capacity(&snapshot), |t| self.config.tenant_weight(t));
        let cluster_index: HashMap<String, usize> =
            snapshot.clusters.iter().enumerate().map(|(i, c)| (c.name().to_string(), i)).collect();
        // Demands (gang shape and placement rules) that fit on no cluster now. Within a round
        // capacity only shrinks (offers reserve it), so a "no" stays true for the round.
        let mut fits_nowhere: HashSet<u32> = HashSet::new();
        let mut refreshed = 0;
        while let Some(next) = queue.pop_next() {
            let Some(job) = self.jobs.get(&next.id).map(Arc::clone) else { continue };
            // A job whose gang fits on no cluster now cannot be offered, whatever placement
            // would score: skip it (the expensive part of a round over a long queue) unless its
            // explanation is missing or old. It still counts as waiting where it last chose to.
            let demand = match self.demand_keys.get(&next.id) {
                Some((_, id)) => *id,
                None => {
                    let key = self.intern_demand(demand_key(&job.spec));
                    self.demand_keys.insert(next.id.clone(), key.clone());
                    key.1
                }
            };
            let fits_somewhere = !fits_nowhere.contains(&demand) && {
                let fits = snapshot.clusters.iter().any(|c| c.fits_now(&job.spec));
                if !fits {
                    fits_nowhere.insert(demand);
                }
                fits
            };
            if !fits_somewhere {
                let previous = self.decisions.get(&next.id).map(Arc::clone);
                let fresh = match previous.as_deref() {
                    Some(Decided::Live { at_ms, .. }) => now_ms.saturating_sub(*at_ms) < DECISION_REFRESH_MS,
                    Some(Decided::Stored(_)) | None => false,
                };
                let first = previous.is_none();
                if fresh || (!first && refreshed >= MAX_REFRESHES_PER_ROUND) {
                    if let Some(Decided::Live { decision, .. }) = previous.as_deref()
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
                holds.place(&mut snapshot, &next.id, &job.spec, waited(next.submitted_at_ms), &config, now_secs);
            let chosen =
                decision.chosen.as_ref().filter(|c| c.starts_now).map(|c| (c.cluster.clone(), c.gpu_type.clone()));
            let Some((cluster, gpu_type)) = chosen else {
                self.decisions.insert(next.id.clone(), Arc::new(Decided::Live { at_ms: now_ms, decision }));
                continue;
            };
            let Some(conn) = self.registry.conn_of(&cluster) else {
                self.decisions.insert(next.id.clone(), Arc::new(Decided::Live { at_ms: now_ms, decision }));
                continue;
            };
            if let Some(target) = snapshot.clusters.iter_mut().find(|c| *c.name() == cluster) {
                target.reserve(&job.spec);
            }
            queue.placed(&next);
            // Its hold (if it had one) has served: the cluster is open to the jobs after it.
            holds.release(&next.id);
            let mut offered = JobRecord::clone(&job);
            offered.state = JobState::Offered;
            offered.cluster = Some(cluster.to_string());
            offered.gpu_type = (!gpu_type.is_empty()).then(|| gpu_type.to_string());
            offered.fencing_token += 1;
            offered.message = format!("offered to {cluster}");
            offered.placement = Some(decision.summary.clone());
            tracing::info!(job = %offered.id, cluster = %cluster, token = offered.fencing_token, "offered");
            // The offer goes out only after the Offered record (with its new token) and the
            // decision are durable.
            effects.sends.push((conn, GatewayCommand::Offer(assignment(&offered))));
            let id = offered.id.clone();
            self.save(offered, effects);
            self.offered_at.insert(id.clone(), now_ms);
            self.save_decision(&id, now_ms, decision, effects);
        }
        // Offers changed the snapshot only for this round; reports will confirm them.
        self.round_wanted = false;
    }
}

/// The federation queue's view of `job`: its tenant, order and the whole gang's resources.
fn queued_job(job: &JobRecord) -> QueuedJob {
    let (replicas, resources) = (job.spec.gang.replicas, &job.spec.gang.resources);
    QueuedJob {
        id: job.id.clone(),
        tenant: job.spec.tenant.clone(),
        priority: job.spec.priority,
        submitted_at_ms: job.submitted_at_ms,
        gpus: job.spec.total_gpus(),
        cpu: replicas.saturating_mul(resources.cpu),
        memory_gib: replicas.saturating_mul(resources.memory_gib),
    }
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
