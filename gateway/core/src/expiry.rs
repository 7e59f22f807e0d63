//! What time alone changes about jobs: unanswered offers, jobs lost with their cluster, and
//! finished jobs past retention. (Silent clusters are in `agents.rs`: their streams end.)

use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;

use crate::config::CoreConfig;
use crate::io::Effects;
use crate::ledger::Ledger;
use crate::registry::Registry;
use crate::timers::millis;

/// The parts the timers act on, borrowed from the core for one tick.
pub(crate) struct Expiry<'a> {
    /// The timeouts and retention.
    pub(crate) config: &'a CoreConfig,
    /// Where withdrawals are sent.
    pub(crate) registry: &'a Registry,
    /// The jobs and their timers.
    pub(crate) ledger: Ledger<'a>,
}

impl Expiry<'_> {
    /// An offer unanswered past the timeout is withdrawn, not forgotten: the agent may have
    /// started the job while its answer is late. The gateway tells it to stop that binding and
    /// keeps the job reserved for the cluster until the member confirms (a cancelled report
    /// requeues it, a decline too); the stop is repeated every timeout until then. If the
    /// cluster is lost meanwhile, the lost-cluster rule (the lease) takes over.
    pub(crate) fn expire_offers(&mut self, now_ms: i64, effects: &mut Effects) {
        for id in self.ledger.timers.due_offers(now_ms, self.config.offer_timeout) {
            let Some(mut job) = self.ledger.copy_of(&id).filter(|j| j.state == JobState::Offered) else { continue };
            let cluster = job.cluster.clone().unwrap_or_default();
            let Some(conn) = self.registry.conn_of(&cluster) else {
                // Not reached: a lost cluster's offers are `Unknown` already. Kept safe anyway.
                job.state = JobState::Unknown;
                job.message = format!("offer to {cluster} was not answered and {cluster} is away");
                self.ledger.save(job, self.registry, effects);
                self.ledger.timers.unknown(id, now_ms);
                continue;
            };
            effects.sends.push((conn, GatewayCommand::Cancel { job_id: id.clone(), fencing_token: job.fencing_token }));
            if self.ledger.timers.withdraw(id.clone()) {
                tracing::info!(job = %id, cluster = %cluster, token = job.fencing_token, "offer unanswered; withdrawing it");
                job.message = format!(
                    "offer to {cluster} was not answered within {}; withdrawing it (placed again once {cluster} confirms it does not run it)",
                    HumanDuration(self.config.offer_timeout)
                );
                self.ledger.save(job, self.registry, effects);
            }
            self.ledger.timers.offered(id, now_ms);
        }
    }

    /// A job `Unknown` past the lost-job timeout (counted from when its cluster was last heard)
    /// goes back to the queue.
    pub(crate) fn expire_unknown(&mut self, now_ms: i64, effects: &mut Effects) {
        for id in self.ledger.timers.due_unknown(now_ms, self.config.lost_job_timeout) {
            let Some(mut job) = self.ledger.copy_of(&id).filter(|j| j.state == JobState::Unknown) else { continue };
            // The next offer bumps the fencing token, so the old copy can never report over the
            // new one; the agent's lease stopped it already, and if its cluster returns, the
            // welcome leaves the job out and the agent drops it.
            let cluster = job.cluster.clone().unwrap_or_default();
            job.back_to_queue();
            job.message = format!(
                "{cluster} was unreachable for {}; placing the job again",
                HumanDuration(self.config.lost_job_timeout)
            );
            tracing::warn!(job = %id, cluster = %cluster, "job lost with its cluster; placing it again");
            self.ledger.save(job, self.registry, effects);
        }
    }

    /// Forgets finished jobs whose retention has passed, with their decisions.
    pub(crate) fn expire_finished(&mut self, now_ms: i64, effects: &mut Effects) {
        let cutoff = now_ms.saturating_sub(millis(self.config.retention));
        effects.persist.extend(self.ledger.table.forget_finished(cutoff));
    }
}
