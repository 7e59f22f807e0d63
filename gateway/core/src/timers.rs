//! What time alone changes: unanswered offers, silent clusters, lost jobs, retention.

use std::collections::HashMap;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::job::JobState;
use meridian_proto::protocol::GatewayCommand;

use crate::Core;
use crate::io::Effects;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Removes and returns, oldest first, the ids whose timer started at least `timeout` before `now_ms`.
fn take_due(timers: &mut HashMap<String, i64>, now_ms: i64, timeout: Duration) -> Vec<String> {
    let timeout = millis(timeout);
    let mut due: Vec<(i64, String)> = timers
        .iter()
        .filter(|(_, since)| now_ms.saturating_sub(**since) >= timeout)
        .map(|(id, since)| (*since, id.clone()))
        .collect();
    due.sort();
    for (_, id) in &due {
        timers.remove(id);
    }
    due.into_iter().map(|(_, id)| id).collect()
}

impl Core {
    pub(crate) fn tick(&mut self, now_ms: i64, effects: &mut Effects) {
        self.expire_offers(now_ms, effects);
        self.expire_silent_clusters(now_ms, effects);
        self.expire_unknown(now_ms, effects);
        self.expire_finished(now_ms, effects);
        self.forget_unused_demands();
    }

    /// An offer unanswered past the timeout is withdrawn, not forgotten: the agent may have
    /// started the job while its answer is late. The gateway tells it to stop that binding and
    /// keeps the job reserved for the cluster until the member confirms (a cancelled report
    /// requeues it, a decline too); the stop is repeated every timeout until then. If the
    /// cluster is lost meanwhile, the lost-cluster rule (the lease) takes over.
    fn expire_offers(&mut self, now_ms: i64, effects: &mut Effects) {
        for id in take_due(&mut self.offered_at, now_ms, self.config.offer_timeout) {
            let Some(mut job) = self.job_mut(&id).filter(|j| j.state == JobState::Offered) else { continue };
            let cluster = job.cluster.clone().unwrap_or_default();
            let Some(conn) = self.registry.conn_of(&cluster) else {
                // Not reached: a lost cluster's offers are `Unknown` already. Kept safe anyway.
                job.state = JobState::Unknown;
                job.message = format!("offer to {cluster} was not answered and {cluster} is away");
                self.save(job, effects);
                self.unknown_since.insert(id, now_ms);
                continue;
            };
            effects.sends.push((conn, GatewayCommand::Cancel { job_id: id.clone(), fencing_token: job.fencing_token }));
            if self.withdrawing.insert(id.clone()) {
                tracing::info!(job = %id, cluster = %cluster, token = job.fencing_token, "offer unanswered; withdrawing it");
                job.message = format!(
                    "offer to {cluster} was not answered within {}; withdrawing it (placed again once {cluster} confirms it does not run it)",
                    HumanDuration(self.config.offer_timeout)
                );
                self.save(job, effects);
            }
            self.offered_at.insert(id, now_ms);
        }
    }

    fn expire_silent_clusters(&mut self, now_ms: i64, effects: &mut Effects) {
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
                self.clusters_version += 1;
                self.cluster_lost(&cluster, last_seen_ms, effects);
            }
        }
    }

    fn expire_unknown(&mut self, now_ms: i64, effects: &mut Effects) {
        for id in take_due(&mut self.unknown_since, now_ms, self.config.lost_job_timeout) {
            let Some(mut job) = self.job_mut(&id).filter(|j| j.state == JobState::Unknown) else { continue };
            // The next offer bumps the fencing token, so the old copy can never report over the
            // new one; the agent's lease stopped it already, and if its cluster returns, the
            // welcome leaves the job out and the agent drops it.
            let cluster = job.cluster.take().unwrap_or_default();
            job.state = JobState::Queued;
            job.gpu_type = None;
            job.nodes.clear();
            job.started_at_ms = None;
            job.message = format!(
                "{cluster} was unreachable for {}; placing the job again",
                HumanDuration(self.config.lost_job_timeout)
            );
            tracing::warn!(job = %id, cluster = %cluster, "job lost with its cluster; placing it again");
            self.save(job, effects);
        }
    }
}
