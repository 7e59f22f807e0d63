//! Per-tenant queue metrics and waiting jobs by reason, computed at scrape time from the
//! published view (what `GET /v1/tenants` shows, and each waiting job's latest decision).

use std::borrow::Cow;
use std::collections::BTreeMap;

use meridian_core::ReadView;
use meridian_core::tally::PendingReason;
use meridian_proto::job::JobState;
use prometheus_client::encoding::DescriptorEncoder;

use super::encode::{self, Labels, gauges, safe};

/// Encodes the queue families from `view` as of `now_ms`.
pub fn encode(view: &ReadView, now_ms: i64, encoder: &mut DescriptorEncoder) -> encode::Result {
    let tenants = view.tenants();
    type Field = fn(&meridian_core::TenantSummary) -> f64;
    let families: [(&str, &str, Field); 7] = [
        ("meridian_tenant_queued_jobs", "Jobs of the tenant waiting in the federation queue (queue depth).", |t| {
            f64::from(t.queued_jobs)
        }),
        ("meridian_tenant_queued_gpus", "GPUs the tenant's queued jobs want (GPU demand).", |t| {
            f64::from(t.queued_gpus)
        }),
        (
            "meridian_tenant_running_jobs",
            "Jobs of the tenant holding GPUs (offered, bound, running or unknown).",
            |t| f64::from(t.running_jobs),
        ),
        ("meridian_tenant_running_gpus", "GPUs the tenant's jobs hold across the federation.", |t| {
            f64::from(t.running_gpus)
        }),
        (
            "meridian_tenant_fair_share_ratio",
            "The tenant's weight over the weights of every tenant with active jobs (0..1): its share under contention.",
            |t| t.fair_share,
        ),
        ("meridian_tenant_gpu_share_ratio", "The tenant's share of the GPUs federation jobs hold (0..1).", |t| {
            t.gpu_share
        }),
        ("meridian_tenant_weight", "The tenant's fair-share weight.", |t| t.weight),
    ];
    for (name, help, field) in families {
        gauges(encoder, name, help, tenants.iter().map(|t| (by(&t.tenant), field(t))))?;
    }
    gauges(
        encoder,
        "meridian_tenant_quota_gpus",
        "The tenant's GPU quota (maxGpus); absent for tenants without one.",
        tenants.iter().filter_map(|t| t.max_gpus.map(|max| (by(&t.tenant), f64::from(max)))),
    )?;

    // Jobs not started yet, by tenant and why they wait, with the oldest one's age.
    let mut pending: BTreeMap<(&str, PendingReason), (u32, f64)> = BTreeMap::new();
    let mut by_state: BTreeMap<JobState, u32> = JobState::ALL.iter().map(|s| (*s, 0)).collect();
    for job in view.jobs() {
        *by_state.entry(job.state).or_default() += 1;
        if !matches!(job.state, JobState::Queued | JobState::Offered | JobState::Bound) {
            continue;
        }
        let Some(reason) = view.pending_reason(&job.id) else { continue };
        let age = (now_ms.saturating_sub(job.submitted_at_ms)).max(0) as f64 / 1000.0;
        let entry = pending.entry((job.spec.tenant.as_str(), reason)).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(age);
    }
    gauges(
        encoder,
        "meridian_pending_jobs",
        "Jobs not started yet, by tenant and why they wait (reason: not_yet_placed, held_by_quota, \
         waiting_for_capacity, no_eligible_cluster, offered, member_queue).",
        pending.iter().map(|((tenant, reason), (count, _))| {
            (vec![("tenant", safe(tenant)), ("reason", Cow::Borrowed(reason.as_str()))], f64::from(*count))
        }),
    )?;
    gauges(
        encoder,
        "meridian_pending_oldest_seconds",
        "Seconds since submit of the oldest job not started yet, by tenant and why it waits.",
        pending.iter().map(|((tenant, reason), (_, oldest))| {
            (vec![("tenant", safe(tenant)), ("reason", Cow::Borrowed(reason.as_str()))], *oldest)
        }),
    )?;
    gauges(
        encoder,
        "meridian_jobs",
        "Jobs the gateway remembers, by state (finished ones until their retention ends).",
        by_state
            .into_iter()
            .map(|(state, count)| (vec![("state", Cow::Borrowed(super::state_name(state)))], f64::from(count))),
    )?;
    Ok(())
}

/// The labels naming `tenant`.
fn by(tenant: &str) -> Labels<'_> {
    vec![("tenant", safe(tenant))]
}
