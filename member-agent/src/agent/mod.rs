//! The member agent: it dials out to the gateway, says hello, reports inventory, queue pressure
//! and job status, and runs the offers it accepts on its [`LocalBackend`].
//!
//! One event loop owns all state; the gateway stream is a state inside it (waiting, backing off,
//! dialing, up), so the heartbeat and lease timers and the backend's job events run whether or not
//! a stream is up. Backend calls run as tasks and answer the loop with messages, so a scheduler
//! that hangs never stops the heartbeats.
//!
//! The rules that keep a job from being lost or doubled:
//! - **Outbox.** Every terminal result (succeeded, failed, cancelled) is kept, keyed by
//!   (job, fencing token), sent at once and in every heartbeat until the gateway acknowledges it,
//!   across reconnects.
//! - **Reconcile.** The gateway's welcome lists the bindings it expects here; the agent keeps
//!   exactly those, stops every other, drops results of bindings no longer listed, and reports a
//!   listed binding it does not hold as lost (failed, for requeue).
//! - **Lease.** With a lease, the agent stops every job the gateway placed here when no renewal
//!   came in time (counted from the send instant of the heartbeat a renewal answers), and reports
//!   them failed for requeue, before the gateway may place them elsewhere.
//!
//! - **Epochs.** With several gateways, only the leader talks to agents, and every message
//!   carries its epoch. The agent remembers the newest epoch it has seen (across reconnects) and
//!   acts on no message from an older one: its sender has been deposed.
//!
//! Files: `event_loop.rs` (the loop, backend answers, timers), `stream.rs` (the loop's side of
//! the gateway stream), `offers.rs` (offers, cancels and the welcome's reconcile), `link.rs` (the
//! stream and the wire edge), `dial.rs` (dialing, finding the leader among several gateways),
//! `epoch.rs` (the epoch gate), `ledger.rs` (bindings and outbox), `lease.rs` (the lease clock),
//! `tasks.rs` (backend calls as tasks), `siblings.rs` (the gateway's sibling copies and their
//! start lock).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use meridian_proto::inventory::ClusterInfo;
use meridian_proto::protocol::AgentHello;
use tokio::task::JoinSet;

use crate::backend::{InventorySource, JobEventReceiver, LocalBackend};
use crate::metrics::AgentMetrics;
use crate::usage::{Sampling, UsageWindow};

mod dial;
mod epoch;
#[cfg(test)]
mod epoch_tests;
mod event_loop;
mod lease;
mod ledger;
mod link;
mod offers;
mod siblings;
#[cfg(test)]
mod siblings_tests;
mod stream;
mod tasks;
#[cfg(test)]
mod tests;

pub use link::LinkError;

/// The shortest heartbeat interval the agent accepts (a zero interval would spin).
const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(10);

/// What an agent needs to know besides its backend.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The cluster it speaks for, sent in the hello.
    pub info: ClusterInfo,
    /// The gateways' gRPC addresses, `https://host:port` (or `http://` when insecure), in the
    /// order they are tried; the agent finds the leader among them.
    pub gateways: Vec<String>,
    /// The CA and this agent's certificate and key, read at each dial; `None` for plain text.
    pub tls: Option<crate::config::TlsFiles>,
    /// How often it sends a heartbeat (with inventory and pressure).
    pub report_interval: Duration,
}

/// One member agent.
pub struct Agent {
    settings: Settings,
    hello: AgentHello,
    dialer: Box<dyn link::Dial>,
    backend: Arc<dyn LocalBackend>,
    inventory: Arc<dyn InventorySource>,
    events: JobEventReceiver,
    metrics: AgentMetrics,
    metrics_listener: Option<tokio::net::TcpListener>,
    sampling: Option<Sampling>,
}

impl Agent {
    /// An agent that dials the leader among `settings.gateways` over gRPC and runs jobs on
    /// `backend`; `events` is the receiving end of the channel the backend reports job events on.
    pub fn new(
        settings: Settings,
        backend: Arc<dyn LocalBackend>,
        inventory: Arc<dyn InventorySource>,
        events: JobEventReceiver,
    ) -> Self {
        let dialer = Box::new(dial::GrpcDialer::new(settings.gateways.clone(), settings.tls.clone()));
        Self::with_dialer(settings, dialer, backend, inventory, events)
    }

    fn with_dialer(
        settings: Settings,
        dialer: Box<dyn link::Dial>,
        backend: Arc<dyn LocalBackend>,
        inventory: Arc<dyn InventorySource>,
        events: JobEventReceiver,
    ) -> Self {
        let hello = AgentHello {
            info: settings.info.clone(),
            instance_id: link::new_instance_id(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        Self {
            settings,
            hello,
            dialer,
            backend,
            inventory,
            events,
            metrics: AgentMetrics::new(),
            metrics_listener: None,
            sampling: None,
        }
    }

    /// Samples GPU utilisation as `sampling` says and sends each running job's mean in the
    /// heartbeat.
    pub fn with_sampling(mut self, sampling: Sampling) -> Self {
        self.sampling = Some(sampling);
        self
    }

    /// Serves the agent's metrics (`GET /metrics`) on `listener` while it runs.
    pub fn with_metrics_listener(mut self, listener: tokio::net::TcpListener) -> Self {
        self.metrics_listener = Some(listener);
        self
    }

    /// The agent's metrics (shared with the running agent).
    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// This process's random instance id, sent in every hello.
    pub fn instance_id(&self) -> &str {
        &self.hello.instance_id
    }

    /// Runs the agent until `shutdown` resolves: adopts the jobs the backend still holds, then
    /// connects, serves and reconnects with backoff. Stops every task it started before
    /// returning.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        let server = self.metrics_listener.map(|listener| {
            let metrics = self.metrics.clone();
            tokio::spawn(async move {
                if let Err(error) = crate::metrics::serve(listener, metrics, async {
                    let _ = metrics_stopped.await;
                })
                .await
                {
                    tracing::error!(%error, "the metrics endpoint stopped");
                }
            })
        });
        let window = self.sampling.as_ref().map_or(Duration::from_secs(60), |s| s.window);
        let event_loop = event_loop::EventLoop {
            cluster: self.settings.info.name.clone(),
            hello: self.hello,
            report_interval: self.settings.report_interval.max(MIN_REPORT_INTERVAL),
            dialer: self.dialer,
            backend: self.backend,
            inventory: self.inventory,
            events: self.events,
            events_open: true,
            link: link::Link::Waiting,
            backoff: link::BACKOFF_MIN,
            backoff_max: if self.settings.gateways.len() > 1 { link::BACKOFF_MAX_SEVERAL } else { link::BACKOFF_MAX },
            epochs: epoch::EpochGate::default(),
            last_heard: None,
            sessions: 0,
            ledger: ledger::Ledger::default(),
            lease: lease::Lease::new(),
            heartbeat_seq: 0,
            tasks: JoinSet::new(),
            labels: HashMap::new(),
            report_in_flight: false,
            report_wanted: false,
            metrics: self.metrics,
            sampling: self.sampling,
            usage: UsageWindow::new(window),
            sample_in_flight: false,
            quotes_in_flight: 0,
            copies: siblings::Copies::default(),
            copy_events: None,
        };
        event_loop.run(shutdown).await;
        let _ = stop_metrics.send(());
        if let Some(server) = server {
            let _ = server.await;
        }
    }
}
