//! The gateway stream as the event loop sees it: dialing, losing it and dialing again with
//! backoff, reading each message (the lease check, the epoch gate, then dispatch to the handlers
//! here, in `offers.rs` and in `siblings.rs`), and sending on it.

use std::sync::Arc;

use meridian_proto::protocol::{AgentEvent, GatewayCommand};
use meridian_scheduler::offer;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use super::event_loop::EventLoop;
use super::lease::Renewal;
use super::link::{FromGateway, Inbound, Link, LinkError, LinkEvent, jittered};
use super::tasks::{self, TaskLabel};

impl EventLoop {
    /// Moves the link on: a retry dials, a dial's answer opens the stream (which waits for the
    /// welcome) or loses it, and a received message is handled.
    pub(super) fn on_link(&mut self, event: LinkEvent) {
        match event {
            LinkEvent::Retry => self.dial(),
            LinkEvent::Dialed(Ok(connection)) => {
                let hello_sent = connection.hello_sent;
                self.sessions += 1;
                tracing::debug!(cluster = %self.cluster, gateway = %connection.gateway, session = self.sessions, "stream open; waiting for the welcome");
                self.link = Link::Up { connection, session: self.sessions, hello_sent, welcomed: false };
            }
            LinkEvent::Dialed(Err(error)) | LinkEvent::Received(Err(error)) => self.link_lost(error),
            LinkEvent::Received(Ok(inbound)) => self.on_inbound(inbound),
        }
    }

    /// Starts dialing the gateways (with this agent's hello).
    pub(super) fn dial(&mut self) {
        let attempt = self.dialer.dial(self.hello.clone());
        self.link = Link::Dialing { attempt };
    }

    /// Gives up the stream, if one is open (the next dial tries the other gateways first), and
    /// dials again at `retry_at`.
    pub(super) fn redial_at(&mut self, retry_at: Instant) {
        if let Some(gateway) = self.link.gateway() {
            self.dialer.lost(gateway);
        }
        // Nobody else can grant this stream's copies; a new leader knows nothing of them.
        self.drop_all_copies();
        self.link = Link::BackingOff { retry_at };
    }

    /// The stream is gone (or never came up) because of `error`: logs it and dials again after
    /// the jittered backoff, which doubles up to its maximum.
    pub(super) fn link_lost(&mut self, error: LinkError) {
        let retry_in = jittered(self.backoff);
        match &error {
            LinkError::Refused(message) => tracing::error!(
                cluster = %self.cluster,
                gateway_said = %message,
                retry_in = ?retry_in,
                "the gateway refused this agent: another live agent holds cluster `{}` (perhaps an old process still shutting down); retrying",
                self.cluster
            ),
            _ => tracing::warn!(cluster = %self.cluster, error = %error, retry_in = ?retry_in, "no gateway stream"),
        }
        self.redial_at(Instant::now() + retry_in);
        self.backoff = (self.backoff * 2).min(self.backoff_max);
    }

    /// Handles one gateway message: after the lease check and the epoch gate, a command is
    /// acted on (only the welcome before the welcome).
    fn on_inbound(&mut self, received: FromGateway) {
        // A message read after the lease's deadline must not act first: `select!` may pick the
        // stream before the deadline's timer (after a pause, both are ready at once).
        if self.enforce_lease() {
            return;
        }
        let FromGateway { epoch, message } = received;
        if self.last_heard.is_some() {
            self.last_heard = Some(Instant::now());
        }
        let newest = self.epochs.newest();
        if !self.epochs.admit(epoch) {
            return self.refuse_stale(epoch, newest, &message);
        }
        self.metrics.epoch(self.epochs.newest());
        let command = match message {
            Inbound::Command(command) => *command,
            Inbound::InvalidOffer { job_id, fencing_token, reason } => {
                tracing::warn!(cluster = %self.cluster, job = %job_id, %reason, "invalid offer refused");
                self.send(offer::refused_for_good(&job_id, fencing_token, format!("invalid offer: {reason}")));
                return;
            }
            Inbound::Invalid(reason) => {
                tracing::warn!(cluster = %self.cluster, %reason, "invalid gateway message ignored");
                return;
            }
        };
        match command {
            GatewayCommand::Welcome { bound, lease } => self.on_welcome(&bound, lease),
            _ if self.link.welcomed_session().is_none() => {
                tracing::warn!(cluster = %self.cluster, "gateway command before the welcome ignored");
            }
            GatewayCommand::Offer(assignment) => self.on_offer(assignment),
            GatewayCommand::Cancel { job_id, fencing_token } => self.on_cancel(&job_id, fencing_token),
            GatewayCommand::Ack { job_id, fencing_token } => {
                if self.ledger.ack(&job_id, fencing_token) {
                    tracing::debug!(cluster = %self.cluster, job = %job_id, fencing_token, "result acknowledged");
                }
            }
            GatewayCommand::Lease { heartbeat_seq, lease } => {
                let session = self.link.welcomed_session().unwrap_or_default();
                match self.lease.renew(heartbeat_seq, lease, session, Instant::now()) {
                    Renewal::Applied(_) => {
                        self.metrics.report_accepted();
                        self.lease_changed();
                    }
                    Renewal::Stale => {
                        tracing::warn!(cluster = %self.cluster, heartbeat_seq, "a lease renewal arrived after the lease it grants had run out; it counts for nothing");
                    }
                    other => {
                        tracing::debug!(cluster = %self.cluster, heartbeat_seq, ?other, "lease renewal not applied");
                    }
                }
            }
            GatewayCommand::Logs { request_id, job_id, fencing_token, from, max_bytes } => {
                let task = tasks::logs(Arc::clone(&self.backend), request_id, job_id, fencing_token, from, max_bytes);
                self.spawn(TaskLabel::Logs { request_id }, task);
            }
            GatewayCommand::Quote { request_id, job_id, spec } => self.on_quote(request_id, job_id, spec),
            GatewayCommand::Copy { copy_token, assignment } => self.on_copy(copy_token, assignment),
            GatewayCommand::Grant { copy_token, assignment } => self.on_grant(copy_token, assignment),
            GatewayCommand::DropCopy { job_id, copy_token } => self.on_drop_copy(job_id, copy_token),
        }
    }

    /// A message from an older epoch than `newest`: its sender is no longer the leader. Nothing
    /// of it is acted on. A stale welcome leaves the stream useless (nothing else may be acted on
    /// before a welcome), so the agent gives it up and tries the other gateways.
    fn refuse_stale(&mut self, epoch: u64, newest: u64, message: &Inbound) {
        self.metrics.stale_epoch_refused();
        let (kind, job_id) = describe(message);
        let gateway = self.link.gateway().unwrap_or_default().to_string();
        tracing::warn!(
            cluster = %self.cluster,
            %gateway,
            message = kind,
            job = job_id.unwrap_or("none"),
            epoch,
            newest_epoch = newest,
            "refused a gateway message from an older epoch than the newest seen: its sender is no longer the leader"
        );
        let welcome =
            matches!(message, Inbound::Command(command) if matches!(**command, GatewayCommand::Welcome { .. }));
        if welcome && matches!(self.link, Link::Up { welcomed: false, .. }) {
            self.link_lost(LinkError::Deposed { gateway, epoch, newest });
        }
    }

    /// Queues `event` on the welcomed stream; without one it is dropped (the outbox and the next
    /// heartbeat carry everything that matters).
    pub(super) fn send(&mut self, event: AgentEvent) {
        let Link::Up { connection, welcomed: true, .. } = &self.link else { return };
        match connection.outbound.try_send(event) {
            Ok(()) => {}
            // The gateway reads slower than this agent writes: dropping the stream would cost
            // a reconnect and a reconcile. The message is dropped instead; the next heartbeat
            // lists every binding's state and result, and the lease bounds a gateway that has
            // stopped reading altogether.
            Err(TrySendError::Full(_)) => {
                tracing::debug!(cluster = %self.cluster, "the gateway stream's outbound queue is full; message dropped");
                self.metrics.message_dropped();
            }
            Err(TrySendError::Closed(_)) => self.link_lost(LinkError::Closed),
        }
    }
}

/// What a gateway message is, for logs: its kind and the job it is about, if any.
fn describe(message: &Inbound) -> (&'static str, Option<&str>) {
    match message {
        Inbound::Command(command) => match command.as_ref() {
            GatewayCommand::Welcome { .. } => ("welcome", None),
            GatewayCommand::Offer(assignment) => ("offer", Some(&assignment.job_id)),
            GatewayCommand::Cancel { job_id, .. } => ("cancel", Some(job_id)),
            GatewayCommand::Ack { job_id, .. } => ("ack", Some(job_id)),
            GatewayCommand::Lease { .. } => ("lease", None),
            GatewayCommand::Logs { job_id, .. } => ("logs", Some(job_id)),
            GatewayCommand::Quote { job_id, .. } => ("quote", Some(job_id)),
            GatewayCommand::Copy { assignment, .. } => ("copy", Some(&assignment.job_id)),
            GatewayCommand::Grant { assignment, .. } => ("grant", Some(&assignment.job_id)),
            GatewayCommand::DropCopy { job_id, .. } => ("drop copy", Some(job_id)),
        },
        Inbound::InvalidOffer { job_id, .. } => ("offer", Some(job_id)),
        Inbound::Invalid(_) => ("invalid", None),
    }
}
