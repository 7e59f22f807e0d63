//! Offers, fencing and the job state changes that agents report.
//!
//! Every binding of a job to a cluster carries a fencing token that grows with each offer. An
//! agent report or reply with an older token (or from another cluster) describes a stale copy:
//! the gateway answers it with a cancel instead of applying it, so a job never runs twice
//! knowingly.

use meridian_proto::inventory::{ClusterInfo, Inventory, QueuePressure};
use meridian_proto::job::JobState;
use meridian_proto::pb;
use tokio::time::Instant;

use crate::server::{ApiError, Inner, State, now_ms};
use crate::store::{self, JobRecord, KnownCluster};

/// The message that tells an agent to stop `job_id` (binding `fencing_token`).
pub fn cancel_message(job_id: &str, fencing_token: u64) -> pb::GatewayMessage {
    pb::GatewayMessage {
        body: Some(pb::gateway_message::Body::Cancel(pb::Cancel { job_id: job_id.to_string(), fencing_token })),
    }
}

/// The offer for `job`'s current binding. The spec sent is pinned to the GPU type placement
/// chose, so the member's scheduler cannot pick another type than the one that was costed (and
/// that the gateway reserved in its snapshot).
fn offer_message(job: &JobRecord) -> pb::Offer {
    let mut spec = pb::JobSpec::from(&job.spec);
    if let (Some(gpu_type), Some(resources)) = (&job.gpu_type, spec.gang.as_mut().and_then(|g| g.resources.as_mut())) {
        resources.gpu_types = vec![gpu_type.clone()];
    }
    pb::Offer { job_id: job.id.clone(), fencing_token: job.fencing_token, spec: Some(spec) }
}

/// The first message on a new agent stream: the jobs the gateway believes the cluster runs.
/// The agent keeps exactly those (matching tokens) and stops everything else.
pub fn welcome_message<'a>(jobs: impl Iterator<Item = &'a JobRecord>) -> pb::GatewayMessage {
    pb::GatewayMessage {
        body: Some(pb::gateway_message::Body::Welcome(pb::Welcome {
            gateway_version: env!("CARGO_PKG_VERSION").to_string(),
            bound_jobs: jobs.map(offer_message).collect(),
            lease_ms: 0,
        })),
    }
}

fn persist(inner: &Inner, job: &JobRecord) {
    if let Err(e) = store::save_job(inner.store.as_ref(), job) {
        // The in-memory state stays authoritative for this run; the next change retries.
        tracing::error!(job = %job.id, error = %e, "could not save job");
    }
}

fn send(state: &State, cluster: &str, message: pb::GatewayMessage) -> bool {
    state.registry.get(cluster).and_then(|c| c.link.as_ref()).is_some_and(|link| link.tx.try_send(Ok(message)).is_ok())
}

/// Offers a queued job to `cluster` with a new fencing token.
pub(crate) fn offer(inner: &Inner, state: &mut State, job_id: &str, cluster: &str, gpu_type: &str, summary: &str) {
    let Some(job) = state.jobs.get_mut(job_id) else { return };
    job.state = JobState::Offered;
    job.cluster = Some(cluster.to_string());
    job.gpu_type = (!gpu_type.is_empty()).then(|| gpu_type.to_string());
    job.fencing_token += 1;
    job.message = format!("offered to {cluster}");
    job.placement = Some(summary.to_string());
    let message = pb::GatewayMessage { body: Some(pb::gateway_message::Body::Offer(offer_message(job))) };
    let job = job.clone();
    persist(inner, &job);
    state.offered_at.insert(job_id.to_string(), Instant::now());
    if !send(state, cluster, message) {
        // The link died between the snapshot and now; the offer expires and the job is placed again.
        tracing::warn!(job = %job_id, cluster, "offer could not be sent");
    }
    tracing::info!(job = %job_id, cluster, token = job.fencing_token, "offered");
}

/// Applies one agent message. Returns whether placement should run again.
pub(crate) fn handle_agent_message(
    inner: &Inner,
    state: &mut State,
    cluster: &str,
    connection: u64,
    message: pb::AgentMessage,
) -> Result<bool, ApiError> {
    let Some(entry) = state.registry.get_mut(cluster) else { return Ok(false) };
    if entry.link.as_ref().is_none_or(|l| l.connection != connection) {
        // A message from a replaced stream; the new one is authoritative.
        return Ok(false);
    }
    entry.last_seen = Instant::now();
    let Some(body) = message.body else { return Ok(false) };
    match body {
        pb::agent_message::Body::Hello(_) | pb::agent_message::Body::Heartbeat(_) => Ok(false),
        pb::agent_message::Body::Inventory(inv) => {
            let inventory = match Inventory::try_from(inv) {
                Ok(inventory) => inventory,
                Err(e) => {
                    tracing::warn!(cluster, error = %e, "ignoring invalid inventory");
                    return Ok(false);
                }
            };
            let shapes_changed = !same_shapes(&entry.inventory, &inventory);
            entry.inventory = inventory;
            if shapes_changed {
                let known = KnownCluster { info: entry.info.clone(), inventory: entry.inventory.clone() };
                if let Err(e) = store::save_cluster(inner.store.as_ref(), &known) {
                    tracing::warn!(cluster, error = %e, "could not save cluster");
                }
            }
            Ok(true)
        }
        pb::agent_message::Body::Pressure(p) => {
            match QueuePressure::try_from(p) {
                Ok(pressure) => entry.pressure = pressure,
                Err(e) => tracing::warn!(cluster, error = %e, "ignoring invalid queue pressure"),
            }
            Ok(true)
        }
        pb::agent_message::Body::OfferReply(reply) => Ok(offer_reply(inner, state, cluster, reply)),
        pb::agent_message::Body::Status(status) => Ok(job_status(inner, state, cluster, status)),
    }
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

/// Whether `job` is currently bound to `cluster` under `token`.
fn is_current(job: &JobRecord, cluster: &str, token: u64) -> bool {
    job.cluster.as_deref() == Some(cluster) && job.fencing_token == token
}

fn offer_reply(inner: &Inner, state: &mut State, cluster: &str, reply: pb::OfferReply) -> bool {
    let current = state
        .jobs
        .get(&reply.job_id)
        .is_some_and(|j| is_current(j, cluster, reply.fencing_token) && j.state == JobState::Offered);
    if !current {
        if reply.accepted {
            // Accepted too late (cancelled, timed out, re-offered elsewhere): stop that copy.
            send(state, cluster, cancel_message(&reply.job_id, reply.fencing_token));
        }
        return false;
    }
    state.offered_at.remove(&reply.job_id);
    let Some(job) = state.jobs.get_mut(&reply.job_id) else { return false };
    if reply.accepted {
        job.state = JobState::Bound;
    } else {
        job.state = JobState::Queued;
        job.cluster = None;
        job.gpu_type = None;
        job.message = format!("{cluster} declined the offer: {}", reply.reason);
        tracing::info!(job = %job.id, cluster, reason = %reply.reason, "offer declined");
    }
    let job = job.clone();
    persist(inner, &job);
    true
}

fn job_status(inner: &Inner, state: &mut State, cluster: &str, status: pb::JobStatus) -> bool {
    let reported = pb::JobState::try_from(status.state).ok().and_then(|s| JobState::try_from(s).ok());
    let Some(reported) = reported else {
        tracing::warn!(cluster, job = %status.job_id, state = status.state, "ignoring status with an invalid state");
        return false;
    };
    let current = state.jobs.get(&status.job_id).is_some_and(|j| is_current(j, cluster, status.fencing_token));
    if !current {
        if !reported.is_terminal() {
            tracing::warn!(job = %status.job_id, cluster, token = status.fencing_token, "stale copy reported; cancelling it");
            send(state, cluster, cancel_message(&status.job_id, status.fencing_token));
        }
        return false;
    }
    let Some(job) = state.jobs.get_mut(&status.job_id) else { return false };
    if job.state.is_terminal() {
        if !reported.is_terminal() {
            // The user cancelled while the stop was in flight or the cluster was away.
            let message = cancel_message(&job.id, job.fencing_token);
            send(state, cluster, message);
        } else if job.state == JobState::Cancelled && reported == JobState::Cancelled {
            job.message = format!("cancelled by user; stopped on {cluster}");
            let job = job.clone();
            persist(inner, &job);
        }
        return false;
    }
    let previous = job.state;
    match reported {
        JobState::Bound | JobState::Offered => job.state = JobState::Bound,
        JobState::Running => {
            job.state = JobState::Running;
            if job.started_at_ms.is_none() {
                job.started_at_ms = Some(now_ms());
            }
            if !status.nodes.is_empty() {
                job.nodes = status.nodes.clone();
            }
            job.message = format!("running on {cluster}");
        }
        JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
            job.state = reported;
            job.finished_at_ms = Some(now_ms());
            job.message = if status.message.is_empty() {
                format!("{} on {cluster}", reported.as_str().to_lowercase())
            } else {
                status.message.clone()
            };
        }
        JobState::Queued | JobState::Unknown => return false,
    }
    state.offered_at.remove(&status.job_id);
    state.unknown_since.remove(&status.job_id);
    let job = job.clone();
    if job.state != previous {
        tracing::info!(job = %job.id, cluster, from = %previous, to = %job.state, "job state");
    }
    persist(inner, &job);
    job.state.is_terminal() || previous == JobState::Offered
}

/// A cluster's stream is gone: offers return to the queue, bound and running jobs become Unknown.
pub(crate) fn cluster_lost(inner: &Inner, state: &mut State, cluster: &str) {
    let ids: Vec<String> = state
        .jobs
        .values()
        .filter(|j| j.cluster.as_deref() == Some(cluster) && crate::server::holds_gpus(j.state))
        .map(|j| j.id.clone())
        .collect();
    for id in ids {
        let Some(job) = state.jobs.get_mut(&id) else { continue };
        if job.state == JobState::Offered {
            job.state = JobState::Queued;
            job.cluster = None;
            job.gpu_type = None;
            job.message = format!("{cluster} disconnected before answering the offer");
            state.offered_at.remove(&id);
        } else {
            job.state = JobState::Unknown;
            job.message = format!(
                "{cluster} stopped reporting; the job is placed again elsewhere if it stays away for {}",
                inner.config.lost_job_timeout
            );
            state.unknown_since.insert(id.clone(), Instant::now());
        }
        let job = job.clone();
        persist(inner, &job);
    }
}

/// Expires unanswered offers and silent clusters.
pub(crate) fn expire(inner: &Inner, state: &mut State, now: Instant) {
    for id in take_due(&mut state.offered_at, now, inner.config.offer_timeout.0) {
        let Some(job) = state.jobs.get_mut(&id) else { continue };
        if job.state != JobState::Offered {
            continue;
        }
        let cluster = job.cluster.take().unwrap_or_default();
        job.gpu_type = None;
        let message = cancel_message(&job.id, job.fencing_token);
        job.state = JobState::Queued;
        job.message = format!("offer to {cluster} was not answered within {}", inner.config.offer_timeout);
        let job = job.clone();
        persist(inner, &job);
        send(state, &cluster, message);
    }
    for id in take_due(&mut state.unknown_since, now, inner.config.lost_job_timeout.0) {
        let Some(job) = state.jobs.get_mut(&id) else { continue };
        if job.state != JobState::Unknown {
            continue;
        }
        // The next offer bumps the fencing token, so the old copy can never report over the new
        // one; if its cluster returns, the welcome leaves the job out and the agent stops it.
        let cluster = job.cluster.take().unwrap_or_default();
        job.state = JobState::Queued;
        job.gpu_type = None;
        job.nodes.clear();
        job.started_at_ms = None;
        job.message = format!("{cluster} was unreachable for {}; placing the job again", inner.config.lost_job_timeout);
        tracing::warn!(job = %id, cluster = %cluster, "job lost with its cluster; placing it again");
        let job = job.clone();
        persist(inner, &job);
    }
    let cluster_timeout = inner.config.cluster_timeout.0;
    let silent: Vec<(String, u64)> = state
        .registry
        .iter()
        .filter(|c| now.saturating_duration_since(c.last_seen) > cluster_timeout)
        .filter_map(|c| c.link.as_ref().map(|l| (c.info.name.clone(), l.connection)))
        .collect();
    for (cluster, connection) in silent {
        tracing::warn!(cluster = %cluster, "cluster silent past the timeout; marking it disconnected");
        if state.registry.disconnect(&cluster, connection) {
            cluster_lost(inner, state, &cluster);
        }
    }
}

/// Removes and returns the ids whose timer started more than `timeout` before `now`.
fn take_due(
    timers: &mut std::collections::HashMap<String, Instant>,
    now: Instant,
    timeout: std::time::Duration,
) -> Vec<String> {
    let due: Vec<String> = timers
        .iter()
        .filter(|(_, since)| now.saturating_duration_since(**since) > timeout)
        .map(|(id, _)| id.clone())
        .collect();
    for id in &due {
        timers.remove(id);
    }
    due
}

/// Turns a hello into cluster identity, or says what is wrong with it.
pub(crate) fn hello_info(hello: pb::Hello) -> Result<ClusterInfo, String> {
    ClusterInfo::try_from(hello).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use meridian_proto::inventory::{BackendKind, NodeFree, NodeShape, Tier};
    use tokio::sync::mpsc;

    use super::*;
    use crate::config::GatewayConfig;
    use crate::server::Gateway;
    use crate::store::MemoryStore;

    type Rx = mpsc::Receiver<Result<pb::GatewayMessage, tonic::Status>>;

    const JOB: &str = "name: j\ntenant: t\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n";

    fn info() -> ClusterInfo {
        ClusterInfo {
            name: "east".into(),
            region: "us-east".into(),
            tier: Tier::Owned,
            backend: BackendKind::Builtin,
            prices: BTreeMap::from([("h100".to_string(), 2.0)]),
            supports_containers: true,
            supports_bare_commands: true,
        }
    }

    fn inventory(free_gpus: &[u32]) -> pb::AgentMessage {
        let inventory = Inventory {
            shapes: vec![NodeShape {
                name: "dgx".into(),
                gpu_type: "h100".into(),
                gpu_memory_gib: 80,
                gpus_per_node: 8,
                cpu_per_node: 96,
                memory_gib_per_node: 1024,
                free: free_gpus.iter().map(|&gpus| NodeFree { gpus, cpu: 96, memory_gib: 1024 }).collect(),
            }],
        };
        pb::AgentMessage { body: Some(pb::agent_message::Body::Inventory(pb::Inventory::from(&inventory))) }
    }

    fn status(job: &str, token: u64, state: JobState) -> pb::AgentMessage {
        pb::AgentMessage {
            body: Some(pb::agent_message::Body::Status(pb::JobStatus {
                job_id: job.into(),
                fencing_token: token,
                state: pb::JobState::from(state) as i32,
                message: String::new(),
                nodes: vec!["dgx-0".into()],
                requeue: false,
            })),
        }
    }

    fn reply(job: &str, token: u64, accepted: bool) -> pb::AgentMessage {
        pb::AgentMessage {
            body: Some(pb::agent_message::Body::OfferReply(pb::OfferReply {
                job_id: job.into(),
                fencing_token: token,
                accepted,
                reason: if accepted { String::new() } else { "node dgx-0 is draining".into() },
            })),
        }
    }

    fn gateway(config: GatewayConfig) -> Gateway {
        Gateway::new(config, Arc::new(MemoryStore::default())).unwrap()
    }

    fn connect(gateway: &Gateway) -> (u64, Rx) {
        let (tx, rx) = mpsc::channel(64);
        let connection = gateway.connect_agent(info(), tx).unwrap();
        (connection, rx)
    }

    fn next(rx: &mut Rx) -> pb::gateway_message::Body {
        rx.try_recv().unwrap().unwrap().body.unwrap()
    }

    /// Connects a one-node cluster, submits a job and places it: returns the job id.
    fn offered(gateway: &Gateway) -> (String, u64, Rx) {
        let (connection, mut rx) = connect(gateway);
        assert!(matches!(next(&mut rx), pb::gateway_message::Body::Welcome(_)));
        gateway.agent_message("east", connection, inventory(&[8])).unwrap();
        let (job, _) = gateway.submit(JOB).unwrap();
        gateway.placement_round().unwrap();
        match next(&mut rx) {
            pb::gateway_message::Body::Offer(offer) => {
                assert_eq!((offer.job_id.as_str(), offer.fencing_token), (job.id.as_str(), 1));
            }
            other => panic!("expected an offer, got {other:?}"),
        }
        let offered = gateway.get(&job.id).unwrap();
        assert_eq!((offered.state, offered.gpu_type.as_deref()), (JobState::Offered, Some("h100")));
        (job.id, connection, rx)
    }

    #[tokio::test]
    async fn a_long_waiting_gang_holds_its_cluster_and_only_shorter_jobs_backfill() {
        // holdAfterSecs 0: any queued job that cannot start holds its cluster at once.
        let mut config = GatewayConfig::default();
        config.placement.hold_after_secs = 0.0;
        let gateway = gateway(config);
        let (connection, mut rx) = connect(&gateway);
        assert!(matches!(next(&mut rx), pb::gateway_message::Body::Welcome(_)));
        gateway.agent_message("east", connection, inventory(&[8, 0])).unwrap();
        let gang = "name: gang\ntenant: t\ngang: {replicas: 2, resources: {gpus: 8}}\npayload: {command: [x]}\n";
        let (gang, _) = gateway.submit(gang).unwrap();
        gateway.placement_round().unwrap();
        assert_eq!(gateway.get(&gang.id).unwrap().state, JobState::Queued, "2×8 does not fit on one free node");

        // Its expected start is unknown (no release profile): the default 6 h. A 10-hour job would
        // delay it, so it may not take the free node; a 1-hour job may.
        let job = |name: &str, hours: u32| {
            format!(
                "name: {name}\ntenant: u\ngang: {{replicas: 1, resources: {{gpus: 8}}}}\nruntime: {{estimate: {hours}h}}\npayload: {{command: [x]}}\n"
            )
        };
        let (long, _) = gateway.submit(&job("long", 10)).unwrap();
        gateway.placement_round().unwrap();
        assert_eq!(gateway.get(&long.id).unwrap().state, JobState::Queued);
        let explained = gateway.explain(&long.id).unwrap();
        let reasons = explained.candidates.iter().flat_map(|c| c.reasons.iter()).cloned().collect::<Vec<_>>();
        assert!(reasons.iter().any(|r| r.contains("held for an older gang")), "{reasons:?}");

        let (short, _) = gateway.submit(&job("short", 1)).unwrap();
        gateway.placement_round().unwrap();
        assert_eq!(gateway.get(&short.id).unwrap().state, JobState::Offered, "backfill ends before the gang");
        assert_eq!(gateway.get(&long.id).unwrap().state, JobState::Queued);
    }

    #[tokio::test]
    async fn an_accepted_offer_binds_and_a_running_report_runs() {
        let gateway = gateway(GatewayConfig::default());
        let (id, connection, _rx) = offered(&gateway);
        gateway.agent_message("east", connection, reply(&id, 1, true)).unwrap();
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Bound);
        gateway.agent_message("east", connection, status(&id, 1, JobState::Running)).unwrap();
        let job = gateway.get(&id).unwrap();
        assert_eq!((job.state, job.nodes.clone()), (JobState::Running, vec!["dgx-0".to_string()]));
        assert!(job.placement.is_some_and(|p| p.contains("east")));
    }

    #[tokio::test]
    async fn a_declined_offer_returns_the_job_to_the_queue_with_the_reason() {
        let gateway = gateway(GatewayConfig::default());
        let (id, connection, _rx) = offered(&gateway);
        gateway.agent_message("east", connection, reply(&id, 1, false)).unwrap();
        let job = gateway.get(&id).unwrap();
        assert_eq!((job.state, job.cluster.clone()), (JobState::Queued, None));
        assert!(job.message.contains("draining"), "{}", job.message);
    }

    #[tokio::test]
    async fn a_report_with_a_stale_token_is_cancelled_not_applied() {
        let gateway = gateway(GatewayConfig::default());
        let (id, connection, mut rx) = offered(&gateway);
        gateway.agent_message("east", connection, reply(&id, 1, true)).unwrap();
        gateway.agent_message("east", connection, status(&id, 0, JobState::Succeeded)).unwrap();
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Bound, "a terminal stale report changes nothing");
        gateway.agent_message("east", connection, status(&id, 0, JobState::Running)).unwrap();
        match next(&mut rx) {
            pb::gateway_message::Body::Cancel(cancel) => assert_eq!((cancel.job_id, cancel.fencing_token), (id, 0)),
            other => panic!("expected a cancel, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_late_acceptance_of_a_cancelled_job_is_stopped() {
        let gateway = gateway(GatewayConfig::default());
        let (id, connection, mut rx) = offered(&gateway);
        gateway.cancel(&id).unwrap();
        assert!(matches!(next(&mut rx), pb::gateway_message::Body::Cancel(_)));
        gateway.agent_message("east", connection, reply(&id, 1, true)).unwrap();
        assert!(matches!(next(&mut rx), pb::gateway_message::Body::Cancel(_)));
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Cancelled);
    }

    #[tokio::test]
    async fn losing_a_cluster_makes_its_jobs_unknown_until_it_reports_again() {
        let gateway = gateway(GatewayConfig::default());
        let (id, connection, _rx) = offered(&gateway);
        gateway.agent_message("east", connection, reply(&id, 1, true)).unwrap();
        gateway.agent_message("east", connection, status(&id, 1, JobState::Running)).unwrap();
        gateway.disconnect_agent("east", connection);
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Unknown);

        let (again, mut rx) = connect(&gateway);
        match next(&mut rx) {
            pb::gateway_message::Body::Welcome(welcome) => {
                let expected: Vec<(String, u64)> =
                    welcome.bound_jobs.iter().map(|o| (o.job_id.clone(), o.fencing_token)).collect();
                assert_eq!(expected, vec![(id.clone(), 1)]);
            }
            other => panic!("expected a welcome, got {other:?}"),
        }
        gateway.agent_message("east", again, status(&id, 1, JobState::Running)).unwrap();
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Running);
        // Messages still arriving on the old stream are ignored.
        gateway.agent_message("east", connection, status(&id, 1, JobState::Failed)).unwrap();
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Running);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_offer_expires_and_the_job_is_placed_again() {
        let config = GatewayConfig {
            offer_timeout: meridian_proto::duration::HumanDuration::from_secs(5),
            ..Default::default()
        };
        let gateway = gateway(config);
        let (id, connection, mut rx) = offered(&gateway);
        tokio::time::advance(Duration::from_secs(6)).await;
        // Keep the cluster alive, then let a round expire the offer and place the job again.
        gateway.agent_message("east", connection, inventory(&[8])).unwrap();
        gateway.placement_round().unwrap();
        match next(&mut rx) {
            pb::gateway_message::Body::Cancel(cancel) => assert_eq!(cancel.fencing_token, 1),
            other => panic!("expected a cancel of the expired offer, got {other:?}"),
        }
        match next(&mut rx) {
            pb::gateway_message::Body::Offer(offer) => assert_eq!((offer.job_id, offer.fencing_token), (id, 2)),
            other => panic!("expected a new offer, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_lost_with_its_cluster_is_placed_again_and_the_old_copy_is_fenced_off() {
        let config = GatewayConfig {
            lost_job_timeout: meridian_proto::duration::HumanDuration::from_secs(60),
            cluster_timeout: meridian_proto::duration::HumanDuration::from_secs(3600),
            ..Default::default()
        };
        let gateway = gateway(config);
        let (id, east, mut east_rx) = offered(&gateway);
        gateway.agent_message("east", east, reply(&id, 1, true)).unwrap();
        gateway.agent_message("east", east, status(&id, 1, JobState::Running)).unwrap();
        gateway.disconnect_agent("east", east);
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Unknown);

        // A second cluster joins; after the timeout the job moves there with a new token.
        let (tx, mut west_rx) = mpsc::channel(64);
        let west = gateway.connect_agent(ClusterInfo { name: "west".into(), ..info() }, tx).unwrap();
        gateway.agent_message("west", west, inventory(&[8])).unwrap();
        let _welcome = next(&mut west_rx);
        gateway.placement_round().unwrap();
        assert_eq!(gateway.get(&id).unwrap().state, JobState::Unknown, "not before the timeout");
        tokio::time::advance(Duration::from_secs(61)).await;
        gateway.agent_message("west", west, inventory(&[8])).unwrap();
        gateway.placement_round().unwrap();
        match next(&mut west_rx) {
            pb::gateway_message::Body::Offer(offer) => {
                assert_eq!((offer.job_id.as_str(), offer.fencing_token), (id.as_str(), 2))
            }
            other => panic!("expected an offer on west, got {other:?}"),
        }
        let job = gateway.get(&id).unwrap();
        assert_eq!((job.state, job.cluster.as_deref()), (JobState::Offered, Some("west")));

        // East comes back: its welcome no longer lists the job, and its stale report is cancelled.
        while east_rx.try_recv().is_ok() {}
        let (tx, mut east_rx) = mpsc::channel(64);
        let east_again = gateway.connect_agent(info(), tx).unwrap();
        match next(&mut east_rx) {
            pb::gateway_message::Body::Welcome(welcome) => assert!(welcome.bound_jobs.is_empty()),
            other => panic!("expected a welcome, got {other:?}"),
        }
        gateway.agent_message("east", east_again, status(&id, 1, JobState::Running)).unwrap();
        match next(&mut east_rx) {
            pb::gateway_message::Body::Cancel(cancel) => assert_eq!(cancel.fencing_token, 1),
            other => panic!("expected a cancel of the stale copy, got {other:?}"),
        }
        assert_eq!(gateway.get(&id).unwrap().cluster.as_deref(), Some("west"));
    }

    #[tokio::test]
    async fn one_round_never_offers_the_same_free_gpus_twice() {
        let gateway = gateway(GatewayConfig::default());
        let (connection, mut rx) = connect(&gateway);
        let _welcome = next(&mut rx);
        gateway.agent_message("east", connection, inventory(&[8])).unwrap();
        let (first, _) = gateway.submit(JOB).unwrap();
        let (second, _) = gateway.submit(&JOB.replace("name: j", "name: k")).unwrap();
        gateway.placement_round().unwrap();
        gateway.placement_round().unwrap();
        let states = [gateway.get(&first.id).unwrap().state, gateway.get(&second.id).unwrap().state];
        assert_eq!(states.iter().filter(|s| **s == JobState::Offered).count(), 1, "{states:?}");
        assert_eq!(states.iter().filter(|s| **s == JobState::Queued).count(), 1, "{states:?}");
    }
}
