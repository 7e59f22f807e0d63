//! The agent's connection to the gateway: it dials out, says hello, reports inventory, queue
//! pressure and job status, and runs the offers it accepts on its [`LocalBackend`].
//!
//! The backend outlives connections: jobs keep running while the gateway is away, and on
//! reconnect the gateway's welcome says which jobs it still believes are here (with their
//! fencing tokens); the agent stops every other job so nothing runs twice.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use meridian_proto::inventory::ClusterInfo;
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::spec::JobSpec;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::backend::LocalBackend;

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a session with the gateway ended.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gateway address is not a valid URI.
    #[error("gateway address `{0}` is invalid: {1}")]
    BadAddress(String, String),
    /// Could not connect.
    #[error("cannot connect to the gateway: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// The stream failed or the gateway refused it.
    #[error("gateway stream: {0}")]
    Stream(#[from] tonic::Status),
    /// The gateway closed the stream.
    #[error("the gateway closed the stream")]
    Closed,
}

/// A job this agent runs for the federation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tracked {
    fencing_token: u64,
    state: JobState,
}

/// One member agent.
pub struct Agent {
    info: ClusterInfo,
    gateway: String,
    report_interval: Duration,
    backend: Box<dyn LocalBackend>,
    jobs: BTreeMap<String, Tracked>,
    /// Jobs that finished while the gateway was away: (token, final state, message).
    unreported: BTreeMap<String, (u64, JobState, String)>,
    epoch: Instant,
}

impl Agent {
    /// An agent for `info`'s cluster that dials `gateway` and drives `backend`.
    pub fn new(info: ClusterInfo, gateway: String, report_interval: Duration, backend: Box<dyn LocalBackend>) -> Self {
        Self {
            info,
            gateway,
            report_interval,
            backend,
            jobs: BTreeMap::new(),
            unreported: BTreeMap::new(),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Connects, serves the stream, and reconnects with backoff until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = BACKOFF_MIN;
        loop {
            let session = self.session();
            tokio::select! {
                result = session => match result {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(cluster = %self.info.name, error = %e, retry_in = ?backoff, "gateway session ended"),
                },
                _ = &mut shutdown => return,
            }
            // While disconnected jobs still finish; their status is reported after reconnecting.
            let wait = jittered(backoff);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = &mut shutdown => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            if self.backend.next_event().is_some_and(|t| t <= self.now()) {
                self.finish_due(None);
            }
        }
    }

    /// One connection: returns Ok only if the gateway asked us to stop (never today).
    async fn session(&mut self) -> Result<(), Error> {
        let endpoint = tonic::transport::Endpoint::from_shared(self.gateway.clone())
            .map_err(|e| Error::BadAddress(self.gateway.clone(), e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        let channel = endpoint.connect().await?;
        let mut client = pb::federation_client::FederationClient::new(channel);
        let (tx, rx) = mpsc::channel(1024);
        let hello = pb::Hello::from(&self.info);
        send(&tx, pb::agent_message::Body::Hello(hello));
        let mut inbound = client.attach(ReceiverStream::new(rx)).await?.into_inner();
        tracing::info!(cluster = %self.info.name, gateway = %self.gateway, "connected to the gateway");
        self.report(&tx);
        let mut heartbeat = tokio::time::interval(self.report_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_event = self.backend.next_event().map(|t| self.epoch + t);
            tokio::select! {
                message = inbound.message() => match message? {
                    Some(message) => self.on_gateway_message(message, &tx),
                    None => return Err(Error::Closed),
                },
                _ = sleep_until_opt(next_event) => self.finish_due(Some(&tx)),
                _ = heartbeat.tick() => self.report(&tx),
            }
        }
    }

    fn on_gateway_message(&mut self, message: pb::GatewayMessage, tx: &Outbound) {
        let Some(body) = message.body else { return };
        match body {
            pb::gateway_message::Body::Welcome(welcome) => self.reconcile(welcome, tx),
            pb::gateway_message::Body::Offer(offer) => self.on_offer(offer, tx),
            pb::gateway_message::Body::Cancel(cancel) => self.on_cancel(cancel, tx),
        }
    }

    /// Keeps exactly the jobs the gateway lists with matching tokens; stops the rest.
    fn reconcile(&mut self, welcome: pb::Welcome, tx: &Outbound) {
        let expected: BTreeMap<String, u64> =
            welcome.bound_jobs.iter().map(|o| (o.job_id.clone(), o.fencing_token)).collect();
        let stale: Vec<String> = self
            .jobs
            .iter()
            .filter(|(id, t)| expected.get(*id) != Some(&t.fencing_token))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            tracing::warn!(cluster = %self.info.name, job = %id, "gateway no longer expects this job here; stopping it");
            self.backend.cancel(&id);
            self.jobs.remove(&id);
        }
        for (id, token) in &expected {
            let finished = self.unreported.remove(id).filter(|(t, _, _)| t == token);
            match (self.jobs.get(id), finished) {
                (Some(t), _) => send_status(tx, id, t.fencing_token, t.state, String::new(), Vec::new()),
                (None, Some((t, state, message))) => send_status(tx, id, t, state, message, Vec::new()),
                (None, None) => send_status(
                    tx,
                    id,
                    *token,
                    JobState::Failed,
                    format!(
                        "{} lost the job (the agent restarted or the job ended while disconnected)",
                        self.info.name
                    ),
                    Vec::new(),
                ),
            }
        }
        // Results the gateway no longer expects belong to stale bindings; drop them.
        self.unreported.clear();
        self.report(tx);
    }

    fn on_offer(&mut self, offer: pb::Offer, tx: &Outbound) {
        let job_id = offer.job_id.clone();
        if let Some(t) = self.jobs.get(&job_id).copied() {
            if t.fencing_token == offer.fencing_token {
                reply(tx, &offer, true, String::new());
                return;
            }
            if t.fencing_token > offer.fencing_token {
                reply(tx, &offer, false, "a newer binding of this job already runs here".into());
                return;
            }
            // A newer binding replaces the old copy.
            self.backend.cancel(&job_id);
            self.jobs.remove(&job_id);
        }
        let spec = match offer.spec.clone().map(JobSpec::try_from) {
            Some(Ok(spec)) => spec,
            Some(Err(e)) => return reply(tx, &offer, false, format!("invalid spec: {e}")),
            None => return reply(tx, &offer, false, "offer without a spec".into()),
        };
        let now = self.now();
        match self.backend.start(&job_id, &spec, now) {
            Ok(nodes) => {
                self.jobs
                    .insert(job_id.clone(), Tracked { fencing_token: offer.fencing_token, state: JobState::Running });
                // Inventory first: by the time the gateway reads the acceptance, it already sees
                // the GPUs taken, so it never places into them twice.
                self.report(tx);
                reply(tx, &offer, true, String::new());
                tracing::info!(cluster = %self.info.name, job = %job_id, nodes = ?nodes, "gang started");
                send_status(tx, &job_id, offer.fencing_token, JobState::Running, String::new(), nodes);
            }
            Err(reason) => {
                tracing::info!(cluster = %self.info.name, job = %job_id, %reason, "offer declined");
                reply(tx, &offer, false, reason);
            }
        }
    }

    fn on_cancel(&mut self, cancel: pb::Cancel, tx: &Outbound) {
        let Some(t) = self.jobs.get(&cancel.job_id).copied() else {
            // Already gone; a stale cancel for an older binding is simply ignored.
            return;
        };
        if t.fencing_token > cancel.fencing_token {
            return;
        }
        self.backend.cancel(&cancel.job_id);
        self.jobs.remove(&cancel.job_id);
        tracing::info!(cluster = %self.info.name, job = %cancel.job_id, "job cancelled");
        send_status(
            tx,
            &cancel.job_id,
            t.fencing_token,
            JobState::Cancelled,
            "stopped by the gateway".into(),
            Vec::new(),
        );
        self.report(tx);
    }

    /// Reports finished jobs (when connected) and forgets them.
    fn finish_due(&mut self, tx: Option<&Outbound>) {
        let finished = self.backend.poll(self.now());
        if finished.is_empty() {
            return;
        }
        for done in finished {
            let Some(t) = self.jobs.remove(&done.job_id) else { continue };
            let state = if done.succeeded { JobState::Succeeded } else { JobState::Failed };
            tracing::info!(cluster = %self.info.name, job = %done.job_id, %state, "job finished");
            match tx {
                Some(tx) => send_status(tx, &done.job_id, t.fencing_token, state, done.message, Vec::new()),
                // Disconnected: reported when the welcome on reconnect asks about the job.
                None => {
                    self.unreported.insert(done.job_id, (t.fencing_token, state, done.message));
                }
            }
        }
        if let Some(tx) = tx {
            self.report(tx);
        }
    }

    fn report(&self, tx: &Outbound) {
        send(tx, pb::agent_message::Body::Inventory(pb::Inventory::from(&self.backend.inventory())));
        send(tx, pb::agent_message::Body::Pressure(pb::QueuePressure::from(&self.backend.pressure(self.now()))));
    }
}

type Outbound = mpsc::Sender<pb::AgentMessage>;

fn send(tx: &Outbound, body: pb::agent_message::Body) {
    // A full or closed channel means the session is ending; the next session re-reports all.
    let _ = tx.try_send(pb::AgentMessage { body: Some(body) });
}

fn reply(tx: &Outbound, offer: &pb::Offer, accepted: bool, reason: String) {
    send(
        tx,
        pb::agent_message::Body::OfferReply(pb::OfferReply {
            job_id: offer.job_id.clone(),
            fencing_token: offer.fencing_token,
            accepted,
            reason,
        }),
    );
}

fn send_status(tx: &Outbound, job_id: &str, fencing_token: u64, state: JobState, message: String, nodes: Vec<String>) {
    send(
        tx,
        pb::agent_message::Body::Status(pb::JobStatus {
            job_id: job_id.to_string(),
            fencing_token,
            state: pb::JobState::from(state) as i32,
            message,
            nodes,
        }),
    );
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Backoff with ±25 % jitter so many agents do not reconnect in lockstep.
fn jittered(base: Duration) -> Duration {
    // RandomState is randomly seeded per instance: a cheap source of jitter without a RNG crate.
    let noise = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), base);
    let factor = 0.75 + (noise % 1000) as f64 / 2000.0;
    base.mul_f64(factor)
}
