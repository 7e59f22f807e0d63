//! Running jobs' GPU utilisation and idle flags as Prometheus metrics, read from the runtime's
//! latest view at each scrape:
//!
//! - `meridian_job_gpu_utilization_ratio{job,tenant,cluster}`: mean utilisation of the job's GPUs
//!   over its member's window, 0..1;
//! - `meridian_job_idle{job,tenant,cluster}`: 1 while the job is idle (under `idleGpu.threshold`
//!   for `idleGpu.after`), else 0;
//! - `meridian_idle_gpus{cluster,tenant}`: GPUs held by idle jobs (pairs with none are omitted).
//!
//! Only running jobs whose agent sends utilisation appear.

use std::collections::BTreeMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::runtime::{Handle, now_ms};

/// Adds the usage collector, over `handle`'s view, to `registry`.
pub fn register(registry: &mut Registry, handle: Handle) {
    registry.register_collector(Box::new(UsageCollector { handle }));
}

/// The collector: one pass over the running jobs with a sample per scrape.
pub struct UsageCollector {
    handle: Handle,
}

impl std::fmt::Debug for UsageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UsageCollector")
    }
}

/// One running job's sample, as the metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    /// Job id.
    pub job: String,
    /// Its tenant.
    pub tenant: String,
    /// The cluster it runs on.
    pub cluster: String,
    /// GPUs it holds (replicas × GPUs each).
    pub gpus: u32,
    /// Mean utilisation of its GPUs, 0..1.
    pub gpu_utilization: f64,
    /// Whether it is idle now.
    pub idle: bool,
}

impl Collector for UsageCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let view = self.handle.view();
        let rows: Vec<UsageRow> = view
            .usages(now_ms())
            .map(|(job, usage)| UsageRow {
                job: job.id.clone(),
                tenant: job.spec.tenant.clone(),
                cluster: job.cluster.clone().unwrap_or_default(),
                gpus: job.spec.total_gpus(),
                gpu_utilization: usage.gpu_utilization,
                idle: usage.idle,
            })
            .collect();
        encode_rows(encoder, &rows)
    }
}

/// Writes the three families for `rows`.
pub fn encode_rows(mut encoder: DescriptorEncoder, rows: &[UsageRow]) -> Result<(), std::fmt::Error> {
    let job_labels =
        |r: &UsageRow| [("job", r.job.clone()), ("tenant", r.tenant.clone()), ("cluster", r.cluster.clone())];
    {
        let mut family = encoder.encode_descriptor(
            "meridian_job_gpu_utilization_ratio",
            "Mean utilisation of a running job's GPUs over its member's window, 0..1",
            None,
            MetricType::Gauge,
        )?;
        for row in rows {
            family.encode_family(&job_labels(row))?.encode_gauge(&row.gpu_utilization)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "meridian_job_idle",
            "1 while a running job holds GPUs under idleGpu.threshold for at least idleGpu.after",
            None,
            MetricType::Gauge,
        )?;
        for row in rows {
            family.encode_family(&job_labels(row))?.encode_gauge(&i64::from(row.idle))?;
        }
    }
    let mut idle_gpus: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.idle) {
        *idle_gpus.entry((row.cluster.as_str(), row.tenant.as_str())).or_default() += u64::from(row.gpus);
    }
    let mut family = encoder.encode_descriptor(
        "meridian_idle_gpus",
        "GPUs held by idle jobs, by cluster and tenant",
        None,
        MetricType::Gauge,
    )?;
    for ((cluster, tenant), gpus) in idle_gpus {
        family.encode_family(&[("cluster", cluster), ("tenant", tenant)])?.encode_gauge(&gpus)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Rows(Vec<UsageRow>);

    impl Collector for Rows {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_rows(encoder, &self.0)
        }
    }

    fn row(job: &str, tenant: &str, gpus: u32, gpu_utilization: f64, idle: bool) -> UsageRow {
        UsageRow { job: job.into(), tenant: tenant.into(), cluster: "east".into(), gpus, gpu_utilization, idle }
    }

    #[test]
    fn idle_jobs_are_flagged_and_their_gpus_summed_per_cluster_and_tenant() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Rows(vec![
            row("j-1", "nlp", 8, 0.02, true),
            row("j-2", "nlp", 4, 0.01, true),
            row("j-3", "nlp", 2, 0.9, false),
            row("j-4", "vision", 1, 0.5, false),
        ])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE meridian_job_gpu_utilization_ratio gauge",
            "meridian_job_gpu_utilization_ratio{job=\"j-1\",tenant=\"nlp\",cluster=\"east\"} 0.02",
            "meridian_job_idle{job=\"j-1\",tenant=\"nlp\",cluster=\"east\"} 1",
            "meridian_job_idle{job=\"j-3\",tenant=\"nlp\",cluster=\"east\"} 0",
            "meridian_idle_gpus{cluster=\"east\",tenant=\"nlp\"} 12",
        ] {
            assert!(text.contains(line), "missing `{line}` in\n{text}");
        }
        assert!(!text.contains("meridian_idle_gpus{cluster=\"east\",tenant=\"vision\"}"), "{text}");
    }
}
