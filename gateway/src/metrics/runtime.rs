//! The gateway process's own health: store commit latency, placement round time, agent streams
//! ended and dropped, and whether the store has failed.

use meridian_core::ReadView;
use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{self, HistogramSeries, counters, flag, gauges, histograms};
use crate::runtime::Role;
use crate::runtime::stats::Stats;

/// Encodes the runtime families from the driver's `stats` and `view`.
pub fn encode(stats: &Stats, view: &ReadView, role: &Role, encoder: &mut DescriptorEncoder) -> encode::Result {
    histograms(
        encoder,
        "meridian_store_commit_seconds",
        "Seconds per group commit to the store (one durable transaction for a batch of changes).",
        [HistogramSeries::of(Vec::new(), &stats.commit_histogram)],
    )?;
    histograms(
        encoder,
        "meridian_placement_round_seconds",
        "Seconds per placement round (the federation queue placed once).",
        [HistogramSeries::of(Vec::new(), &stats.round_histogram)],
    )?;
    counters(
        encoder,
        "meridian_agent_streams_ended",
        "Agent streams that ended at the gateway (the agent went away or its connection broke).",
        [(Vec::new(), stats.agent_streams_ended as f64)],
    )?;
    counters(
        encoder,
        "meridian_agent_streams_dropped",
        "Agent streams the gateway dropped because their task had ended (closed under the gateway).",
        [(Vec::new(), stats.agent_streams_dropped as f64)],
    )?;
    counters(
        encoder,
        "meridian_agent_messages_dropped",
        "Messages for an agent dropped because its stream's buffer was full (each is repeated when it matters).",
        [(Vec::new(), stats.agent_messages_dropped as f64)],
    )?;
    gauges(
        encoder,
        "meridian_gateway_store_failed",
        "1 once a commit to the store failed: the gateway then refuses changes until it is restarted.",
        [(Vec::new(), flag(view.failure().is_some()))],
    )?;
    gauges(
        encoder,
        "meridian_gateway_leader",
        "1 while this gateway leads (it steps the core and talks to agents); 0 on a standby or while stopping.",
        [(Vec::new(), flag(matches!(role, Role::Leader { .. })))],
    )?;
    gauges(
        encoder,
        "meridian_gateway_epoch",
        "The epoch this gateway leads in (its etcd election revision; 0 for a gateway without election or a standby).",
        [(
            Vec::new(),
            match role {
                Role::Leader { epoch } => *epoch as f64,
                _ => 0.0,
            },
        )],
    )?;
    Ok(())
}
