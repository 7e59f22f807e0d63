//! Counters and histograms of what happened, from the core's [`Tally`] published with the view:
//! placement decisions and rejections, queueing delay and completion time, finished jobs, burst
//! GPU time and cost, data moved between regions.

use std::borrow::Cow;

use meridian_core::Tally;
use meridian_core::tally::Outcome;
use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{self, HistogramSeries, counters, histograms, safe};

/// Encodes the history families from `tally`.
pub fn encode(tally: &Tally, encoder: &mut DescriptorEncoder) -> encode::Result {
    counters(
        encoder,
        "meridian_placement_decisions",
        "Placement decisions by outcome: placed (offered where it starts now), waiting (no cluster can start it now), \
         held_by_quota (its tenant's quota held it back), refused_never_fits (refused at submit: no cluster could ever \
         run it). A queued job is decided again in later rounds, so waiting counts attempts, not jobs.",
        Outcome::ALL
            .map(|outcome| (vec![("outcome", Cow::Borrowed(outcome.as_str()))], tally.decisions(outcome) as f64)),
    )?;
    counters(
        encoder,
        "meridian_placement_rejections",
        "Clusters rejected in placement decisions, by reason (one count per cluster and reason of each decision).",
        tally.rejections().iter().map(|(reason, count)| (vec![("reason", Cow::Borrowed(*reason))], *count as f64)),
    )?;
    histograms(
        encoder,
        "meridian_queueing_delay_seconds",
        "Seconds from submit to start (all replicas running), by tenant and priority band (low 0-29, normal 30-69, \
         high 70-100); a job started again after a preemption counts again.",
        tally.queueing_delay().iter().map(|((tenant, band), histogram)| {
            HistogramSeries::of(vec![("tenant", safe(tenant)), ("priority", Cow::Borrowed(band.as_str()))], histogram)
        }),
    )?;
    histograms(
        encoder,
        "meridian_completion_time_seconds",
        "Seconds from submit to a terminal state (succeeded, failed or cancelled), by tenant and priority band.",
        tally.completion_time().iter().map(|((tenant, band), histogram)| {
            HistogramSeries::of(vec![("tenant", safe(tenant)), ("priority", Cow::Borrowed(band.as_str()))], histogram)
        }),
    )?;
    counters(
        encoder,
        "meridian_jobs_finished",
        "Jobs that reached a terminal state, by tenant and state (succeeded, failed, cancelled).",
        tally.finished().iter().map(|((tenant, state), count)| {
            (vec![("tenant", safe(tenant)), ("state", Cow::Borrowed(*state))], *count as f64)
        }),
    )?;
    counters(
        encoder,
        "meridian_burst_gpu_seconds",
        "GPU-seconds federation jobs ran on a cloud (burst) cluster, counted when each run stops.",
        tally.burst().iter().map(|(cluster, used)| (vec![("cluster", safe(cluster))], used.gpu_seconds)),
    )?;
    counters(
        encoder,
        "meridian_burst_cost_usd",
        "US$ of those GPU-seconds at the cluster's price for the GPU type the job ran on.",
        tally.burst().iter().map(|(cluster, used)| (vec![("cluster", safe(cluster))], used.usd)),
    )?;
    counters(
        encoder,
        "meridian_data_moved_bytes",
        "Bytes of job data to copy between regions (from the dataset's home region to the cluster's), estimated when \
         a job is placed away from its data.",
        tally
            .moved_bytes()
            .iter()
            .map(|((from, to), bytes)| (vec![("from_region", safe(from)), ("to_region", safe(to))], *bytes)),
    )?;
    Ok(())
}
