//! The agent's Prometheus metrics, served as plain HTTP `GET /metrics` on the address of the
//! optional `metrics: {listen: ADDR}` config section.
//!
//! The event loop owns an [`AgentMetrics`] and sets it as things happen (the handles are cheap
//! atomics shared with the registry); the report age is computed at each scrape.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use meridian_proto::inventory::Inventory;
use meridian_proto::job::JobState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::usage::GpuSample;

/// The content type of the text the endpoint serves.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The agent's `metrics:` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where to serve `GET /metrics` (`0.0.0.0:9464`).
    pub listen: std::net::SocketAddr,
}

type Labels = Vec<(&'static str, String)>;

/// What became of a sibling copy, for `meridian_agent_sibling_copies_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyOutcome {
    /// Queued in the local scheduler.
    Queued,
    /// The scheduler would start it: the agent asked for its start lock.
    Ready,
    /// Granted: it started as a binding on the nodes it held.
    Granted,
    /// Dropped (by the gateway, the end of its stream, an offer of the job, or the backend).
    Dropped,
    /// The member would not queue it (its scheduler refused, or it holds the job).
    Refused,
    /// The backend has no start gate for copies.
    Unsupported,
}

impl CopyOutcome {
    fn label(self) -> &'static str {
        match self {
            CopyOutcome::Queued => "queued",
            CopyOutcome::Ready => "ready",
            CopyOutcome::Granted => "granted",
            CopyOutcome::Dropped => "dropped",
            CopyOutcome::Refused => "refused",
            CopyOutcome::Unsupported => "unsupported",
        }
    }
}

/// Every metric the agent serves, as handles the event loop sets. Cloning shares them.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    stream_connected: Gauge,
    stream_reconnects: Counter,
    last_report: Arc<Mutex<Option<Instant>>>,
    gpus: Family<Labels, Gauge>,
    gpu_utilization: Family<Labels, Gauge<f64, AtomicU64>>,
    jobs: Family<Labels, Gauge>,
    results_unacknowledged: Gauge,
    utilization_errors: Counter,
    messages_dropped: Counter,
    gateway_epoch: Gauge,
    stale_epoch_messages: Counter,
    quotes: Family<Labels, Counter>,
    sibling_copies: Family<Labels, Counter>,
}

/// Seconds since the gateway last renewed the lease or welcomed the agent; absent before that.
#[derive(Debug)]
struct ReportAge(Arc<Mutex<Option<Instant>>>);

impl Collector for ReportAge {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(at) = *self.0.lock().unwrap_or_else(PoisonError::into_inner) else { return Ok(()) };
        let age = Instant::now().saturating_duration_since(at).as_secs_f64();
        let mut metric = encoder.encode_descriptor(
            "meridian_agent_last_report_age_seconds",
            "Seconds since the gateway last accepted a heartbeat of this agent (lease renewal) or welcomed it",
            None,
            MetricType::Gauge,
        )?;
        metric.encode_gauge(&age)
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Fresh metrics in their own registry.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let stream_connected = Gauge::default();
        let stream_reconnects = Counter::default();
        let last_report = Arc::new(Mutex::new(None));
        let gpus = Family::<Labels, Gauge>::default();
        let gpu_utilization = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let jobs = Family::<Labels, Gauge>::default();
        let results_unacknowledged = Gauge::default();
        let utilization_errors = Counter::default();
        let messages_dropped = Counter::default();
        let gateway_epoch = Gauge::default();
        let stale_epoch_messages = Counter::default();
        let quotes = Family::<Labels, Counter>::default();
        let sibling_copies = Family::<Labels, Counter>::default();
        registry.register(
            "meridian_agent_stream_connected",
            "1 while a gateway stream is up and welcomed, else 0",
            stream_connected.clone(),
        );
        registry.register(
            "meridian_agent_stream_reconnects",
            "Gateway streams welcomed after the first one (each is a reconnect)",
            stream_reconnects.clone(),
        );
        registry.register_collector(Box::new(ReportAge(Arc::clone(&last_report))));
        registry.register(
            "meridian_agent_gpus",
            "GPUs of the cluster by state (total, allocated) and GPU type, as last reported",
            gpus.clone(),
        );
        registry.register(
            "meridian_agent_gpu_utilization_ratio",
            "Utilisation of each sampled GPU, 0..1 (NVML or the utilisation file; absent without a source)",
            gpu_utilization.clone(),
        );
        registry.register("meridian_agent_jobs", "Jobs this agent holds, by state", jobs.clone());
        registry.register(
            "meridian_agent_results_unacknowledged",
            "Finished jobs whose result the gateway has not yet acknowledged",
            results_unacknowledged.clone(),
        );
        registry.register(
            "meridian_agent_utilization_errors",
            "Utilisation samples that failed (unreadable file, NVML error)",
            utilization_errors.clone(),
        );
        registry.register(
            "meridian_agent_outbound_messages_dropped",
            "Messages for the gateway dropped because the stream's outbound queue was full (the next heartbeat repeats what matters)",
            messages_dropped.clone(),
        );
        registry.register(
            "meridian_agent_gateway_epoch",
            "The newest leader epoch heard from a gateway (0 without leader election)",
            gateway_epoch.clone(),
        );
        registry.register(
            "meridian_agent_stale_epoch_messages",
            "Gateway messages refused because they came from an older epoch than the newest seen (a deposed leader)",
            stale_epoch_messages.clone(),
        );
        registry.register(
            "meridian_agent_start_quotes",
            "Start quotes answered to the gateway, by outcome (quoted, or failed: the backend could not say, or was busy)",
            quotes.clone(),
        );
        registry.register(
            "meridian_agent_sibling_copies",
            "Sibling copies of gateway jobs, by outcome (queued, ready, granted, dropped, refused, unsupported)",
            sibling_copies.clone(),
        );
        Self {
            registry: Arc::new(registry),
            stream_connected,
            stream_reconnects,
            last_report,
            gpus,
            gpu_utilization,
            jobs,
            results_unacknowledged,
            utilization_errors,
            messages_dropped,
            gateway_epoch,
            stale_epoch_messages,
            quotes,
            sibling_copies,
        }
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// A stream was welcomed; `session` numbers it (1 for the first).
    pub(crate) fn welcomed(&self, session: u64) {
        self.stream_connected.set(1);
        if session > 1 {
            self.stream_reconnects.inc();
        }
        self.report_accepted();
    }

    /// The newest leader epoch seen.
    pub(crate) fn epoch(&self, epoch: u64) {
        self.gateway_epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
    }

    /// A message from an older epoch was refused.
    pub(crate) fn stale_epoch_refused(&self) {
        self.stale_epoch_messages.inc();
    }

    /// A start quote was answered: with a quote, or with why not.
    pub(crate) fn quote_answered(&self, quoted: bool) {
        let outcome = if quoted { "quoted" } else { "failed" };
        self.quotes.get_or_create(&vec![("outcome", outcome.to_string())]).inc();
    }

    /// A sibling copy reached `outcome`: queued in the local scheduler, ready (the agent asked
    /// for its start lock), granted (it started as a binding), dropped, refused by the local
    /// scheduler, or unsupported by the backend.
    pub(crate) fn sibling_copy(&self, outcome: CopyOutcome) {
        self.sibling_copies.get_or_create(&vec![("outcome", outcome.label().to_string())]).inc();
    }

    /// Whether a welcomed stream is up now.
    pub(crate) fn set_connected(&self, connected: bool) {
        self.stream_connected.set(i64::from(connected));
    }

    /// The gateway accepted a heartbeat (renewed the lease).
    pub(crate) fn report_accepted(&self) {
        *self.last_report.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// GPUs total and allocated by type, from an inventory report.
    pub(crate) fn inventory(&self, inventory: &Inventory) {
        self.gpus.clear();
        for shape in &inventory.shapes {
            let total = u64::from(shape.gpus_per_node) * shape.free.len() as u64;
            let free: u64 = shape.free.iter().map(|n| u64::from(n.gpus)).sum();
            for (state, value) in [("total", total), ("allocated", total.saturating_sub(free))] {
                let labels = vec![("state", state.to_string()), ("gpu_type", shape.gpu_type.clone())];
                self.gpus.get_or_create(&labels).inc_by(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
    }

    /// Jobs held by state, and results waiting for an acknowledgement.
    pub(crate) fn jobs(&self, states: impl IntoIterator<Item = JobState>, unacknowledged: usize) {
        self.jobs.clear();
        for state in states {
            self.jobs.get_or_create(&vec![("state", state.to_string())]).inc();
        }
        self.results_unacknowledged.set(i64::try_from(unacknowledged).unwrap_or(i64::MAX));
    }

    /// The latest utilisation sample of every GPU.
    pub(crate) fn gpu_samples(&self, samples: &[GpuSample]) {
        self.gpu_utilization.clear();
        for sample in samples {
            let labels = vec![("node", sample.node.clone()), ("gpu", sample.gpu.clone())];
            self.gpu_utilization.get_or_create(&labels).set(sample.utilization);
        }
    }

    /// A utilisation sample failed.
    pub(crate) fn utilization_failed(&self) {
        self.utilization_errors.inc();
    }

    /// A message for the gateway was dropped: the stream's outbound queue was full.
    pub(crate) fn message_dropped(&self) {
        self.messages_dropped.inc();
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: AgentMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS)], metrics.render()).into_response() }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use meridian_proto::inventory::{NodeFree, NodeShape};

    use super::*;

    #[tokio::test]
    async fn every_metric_is_rendered_with_its_labels() {
        let metrics = AgentMetrics::new();
        let before = metrics.render();
        assert!(before.contains("meridian_agent_stream_connected 0"), "{before}");
        assert!(!before.contains("meridian_agent_last_report_age_seconds "), "absent before a welcome: {before}");
        metrics.welcomed(1);
        metrics.welcomed(2);
        let shape = NodeShape {
            name: "l4x4".into(),
            gpu_type: "l4".into(),
            gpu_memory_gib: 24,
            gpus_per_node: 4,
            cpu_per_node: 32,
            memory_gib_per_node: 128,
            free: vec![NodeFree { gpus: 1, cpu: 8, memory_gib: 32 }, NodeFree { gpus: 4, cpu: 32, memory_gib: 128 }],
            labels: Default::default(),
        };
        metrics.inventory(&Inventory { shapes: vec![shape] });
        metrics.jobs([JobState::Running, JobState::Running, JobState::Bound], 2);
        metrics.gpu_samples(&[GpuSample { node: "n0".into(), gpu: "0".into(), utilization: 0.25 }]);
        metrics.epoch(12);
        metrics.stale_epoch_refused();
        metrics.sibling_copy(CopyOutcome::Dropped);
        let text = metrics.render();
        for line in [
            "meridian_agent_stream_connected 1",
            "meridian_agent_stream_reconnects_total 1",
            "meridian_agent_gpus{state=\"total\",gpu_type=\"l4\"} 8",
            "meridian_agent_gpus{state=\"allocated\",gpu_type=\"l4\"} 3",
            "meridian_agent_gpu_utilization_ratio{node=\"n0\",gpu=\"0\"} 0.25",
            "meridian_agent_jobs{state=\"Running\"} 2",
            "meridian_agent_jobs{state=\"Bound\"} 1",
            "meridian_agent_results_unacknowledged 2",
            "meridian_agent_utilization_errors_total 0",
            "meridian_agent_gateway_epoch 12",
            "meridian_agent_stale_epoch_messages_total 1",
            "meridian_agent_sibling_copies_total{outcome=\"dropped\"} 1",
        ] {
            assert!(text.contains(line), "missing `{line}` in\n{text}");
        }
        assert!(text.contains("meridian_agent_last_report_age_seconds "), "{text}");
        metrics.set_connected(false);
        assert!(metrics.render().contains("meridian_agent_stream_connected 0"));
    }
}
