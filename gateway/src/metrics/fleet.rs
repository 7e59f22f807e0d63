//! Per-cluster metrics, computed at scrape time from the published view's cluster summaries
//! (what `GET /v1/clusters` shows): GPUs total, allocated and free, connection, report age,
//! member queue pressure, prices, and GPUs federation jobs hold on cloud clusters.

use std::borrow::Cow;

use meridian_core::{ClusterSummary, ReadView};
use meridian_proto::inventory::Tier;
use meridian_proto::job::JobState;
use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{self, Labels, flag, gauges, safe};

/// Encodes the fleet families from `view` as of `now_ms`.
pub fn encode(view: &ReadView, now_ms: i64, encoder: &mut DescriptorEncoder) -> encode::Result {
    let clusters = view.clusters(now_ms);
    gauges(
        encoder,
        "meridian_cluster_info",
        "Always 1: a member cluster's region, tier (owned|cloud) and backend, for joins and grouping.",
        clusters.iter().map(|c| {
            let labels = vec![
                ("cluster", safe(&c.name)),
                ("region", safe(&c.region)),
                ("tier", Cow::Borrowed(tier_name(c.tier))),
                ("backend", Cow::Owned(backend_name(c))),
            ];
            (labels, 1.0)
        }),
    )?;
    gauges(
        encoder,
        "meridian_cluster_gpus",
        "GPUs of a member cluster by state: total, allocated (in use by any job) and free, as its agent last reported.",
        clusters.iter().flat_map(|c| {
            let allocated = c.gpus_total.saturating_sub(c.gpus_free);
            [("total", c.gpus_total), ("allocated", allocated), ("free", c.gpus_free)].map(|(state, gpus)| {
                let mut labels = by(c);
                labels.push(("state", Cow::Borrowed(state)));
                (labels, f64::from(gpus))
            })
        }),
    )?;
    gauges(
        encoder,
        "meridian_cluster_gpu_allocation_ratio",
        "Allocated GPUs over total GPUs of a member cluster (0..1); 0 for a cluster without GPUs.",
        clusters.iter().map(|c| {
            let allocated = c.gpus_total.saturating_sub(c.gpus_free);
            let ratio = if c.gpus_total == 0 { 0.0 } else { f64::from(allocated) / f64::from(c.gpus_total) };
            (by(c), ratio)
        }),
    )?;
    gauges(
        encoder,
        "meridian_cluster_gpu_type_info",
        "Always 1: a GPU type present in a member cluster.",
        clusters.iter().flat_map(|c| {
            c.gpu_types.iter().map(move |gpu_type| {
                let mut labels = by(c);
                labels.push(("gpu_type", safe(gpu_type)));
                (labels, 1.0)
            })
        }),
    )?;
    gauges(
        encoder,
        "meridian_cluster_gpu_price_usd_per_hour",
        "US$ per GPU-hour of a GPU type on a member cluster (owned clusters: the charge-back rate).",
        clusters.iter().flat_map(|c| {
            c.prices.iter().map(move |(gpu_type, price)| {
                let mut labels = by(c);
                labels.push(("gpu_type", safe(gpu_type)));
                (labels, *price)
            })
        }),
    )?;
    gauges(
        encoder,
        "meridian_cluster_connected",
        "1 while the member cluster's agent stream is connected, 0 otherwise.",
        clusters.iter().map(|c| (by(c), flag(c.connected))),
    )?;
    gauges(
        encoder,
        "meridian_cluster_report_age_seconds",
        "Seconds since the member cluster's agent last said anything (heartbeats arrive every few seconds).",
        clusters.iter().map(|c| (by(c), c.last_seen_secs_ago.unwrap_or(0.0))),
    )?;
    gauges(
        encoder,
        "meridian_cluster_pending_jobs",
        "Jobs waiting in the member cluster's own local queues (its agent's report).",
        clusters.iter().map(|c| (by(c), f64::from(c.pending_jobs))),
    )?;
    gauges(
        encoder,
        "meridian_cluster_pending_gpus",
        "GPUs the jobs waiting in the member cluster's local queues want.",
        clusters.iter().map(|c| (by(c), f64::from(c.pending_gpus))),
    )?;
    gauges(
        encoder,
        "meridian_cluster_estimated_wait_seconds",
        "The member cluster agent's estimate of how long a new job would wait there.",
        clusters.iter().map(|c| (by(c), c.estimated_wait_secs as f64)),
    )?;
    gauges(
        encoder,
        "meridian_cluster_federated_jobs",
        "Federation jobs offered to, bound to or running on the member cluster.",
        clusters.iter().map(|c| (by(c), f64::from(c.federated_jobs))),
    )?;
    // One pass over the jobs, not one per cluster.
    let mut held: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for job in view.jobs().filter(|job| holds_gpus(job.state)) {
        if let Some(cluster) = job.cluster.as_deref() {
            *held.entry(cluster).or_default() += job.spec.total_gpus();
        }
    }
    let burst_gpus = clusters
        .iter()
        .filter(|c| c.tier == Tier::Cloud)
        .map(|c| (by(c), f64::from(held.get(c.name.as_str()).copied().unwrap_or(0))));
    gauges(
        encoder,
        "meridian_burst_gpus",
        "GPUs federation jobs hold now on a cloud (burst) cluster (offered, bound, running or unknown).",
        burst_gpus,
    )?;
    Ok(())
}

/// The labels naming cluster `c`.
fn by(c: &ClusterSummary) -> Labels<'_> {
    vec![("cluster", safe(&c.name))]
}

/// States in which a job holds GPUs on its cluster (as the core counts them).
fn holds_gpus(state: JobState) -> bool {
    matches!(state, JobState::Offered | JobState::Bound | JobState::Running | JobState::Unknown)
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Owned => "owned",
        Tier::Cloud => "cloud",
    }
}

/// The backend's name as the API writes it (`builtin`, `slurm`, `kubernetes`).
fn backend_name(cluster: &ClusterSummary) -> String {
    match serde_json::to_value(cluster.backend) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{:?}", cluster.backend).to_ascii_lowercase(),
    }
}
