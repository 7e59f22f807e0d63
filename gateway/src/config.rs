//! The gateway's configuration: typed, defaulted, and checked as a whole before any port is bound.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use meridian_proto::config_file;
use meridian_proto::duration::HumanDuration;
use meridian_proto::gpu::GpuCatalog;
use serde::{Deserialize, Serialize};

use meridian_placement::{NetworkTable, PlacementConfig};

pub mod limits;
pub mod metrics;
pub mod store;

pub use limits::LimitsConfig;

pub use meridian_proto::config_file::ConfigError as Error;

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the gateway needs to start. Every field has a default, so an empty file (or no file)
/// runs a single-machine gateway on loopback with its data in `./meridian-data`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// REST/JSON API address (`GET /v1/jobs`, ...). Port 0 picks a free port.
    pub listen: SocketAddr,
    /// gRPC address: the user `Jobs` service and the agents' `Federation` stream.
    pub grpc_listen: SocketAddr,
    /// Where the embedded store keeps its database (`meridian.redb`, locked while the gateway runs).
    pub data_dir: PathBuf,
    /// Fair-share weight and quota per tenant; tenants not listed get `default_tenant_weight`
    /// and `default_quota`.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Weight of tenants not listed in `tenants` (or listed without a weight).
    pub default_tenant_weight: f64,
    /// Quota of tenants without their own `quota` block. The default sets no limit.
    pub default_quota: QuotaConfig,
    /// Extra GPU types beyond the built-in list.
    pub gpu_types: Vec<GpuTypeConfig>,
    /// Region-pair network: overrides on top of the seeded defaults.
    pub network: NetworkTable,
    /// Placement weights.
    pub placement: PlacementConfig,
    /// How long an offer may stay unanswered before the job is placed again.
    pub offer_timeout: HumanDuration,
    /// A cluster silent for this long is marked disconnected and its jobs `Unknown`.
    pub cluster_timeout: HumanDuration,
    /// How often the queue is placed again even when nothing changed.
    pub placement_interval: HumanDuration,
    /// A job `Unknown` this long (counted from when its cluster was last heard) is placed again
    /// elsewhere; if the lost cluster returns, its stale copy is stopped by fencing.
    pub lost_job_timeout: HumanDuration,
    /// Agents get a lease of `lostJobTimeout - leaseMargin`: an agent that has not heard from
    /// the gateway for that long stops the gateway's jobs, so no job runs twice across a
    /// partition. Equal to `lostJobTimeout` or more: no lease (agents never stop jobs on their own).
    pub lease_margin: HumanDuration,
    /// Finished jobs and their decisions are forgotten this long after they finished.
    pub retention: HumanDuration,
    /// Messages queued for one agent stream at most. Beyond it messages are dropped (and
    /// counted in `meridian_agent_messages_dropped_total`), never the stream: each is repeated
    /// when it matters. The default suits thousands of jobs per cluster.
    pub agent_buffer: usize,
    /// TLS on both ports: the server certificate, its key, and the CA agents' client
    /// certificates must chain to (see `docs/security.md`). Required unless `insecure`.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Serve plain text on both ports, with no agent authentication (tests, local experiments).
    /// Logs a warning at start-up.
    pub insecure: bool,
    /// What a REST client may hold and how fast it may ask: connection caps, timeouts, rate.
    pub limits: LimitsConfig,
    /// How REST and gRPC `Jobs` callers authenticate (see `docs/security.md`). Left out:
    /// every caller is an anonymous admin (a development mode; the gateway warns at start-up).
    pub auth: Option<crate::auth::AuthConfig>,
    /// When a running job counts as holding idle GPUs: its GPUs' mean utilisation (as its
    /// agent measures it) stays under `threshold` for `after`.
    pub idle_gpu: IdleGpuSection,
    /// Who may scrape `GET /metrics` (see `docs/operations.md (Metrics)`).
    pub metrics: metrics::MetricsConfig,
    /// Where the state lives: the embedded file (default) or etcd (several gateways, see
    /// `docs/operations.md#high-availability`).
    pub store: store::StoreSection,
    /// The key that seals stored secret values.
    pub secrets: store::SecretsSection,
    /// Leader election (with `store.kind: etcd`).
    pub ha: store::HaSection,
}

/// The `idleGpu:` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IdleGpuSection {
    /// Utilisation (fraction 0..1) under which a job's sample counts as low.
    pub threshold: f64,
    /// How long samples must stay low before the job is flagged idle.
    pub after: HumanDuration,
}

impl Default for IdleGpuSection {
    fn default() -> Self {
        let core = meridian_core::IdleGpuConfig::default();
        Self { threshold: core.threshold, after: HumanDuration(core.after) }
    }
}

/// Per-tenant settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantConfig {
    /// Share of GPUs relative to other tenants (2 gets twice what 1 gets under contention);
    /// absent: `defaultTenantWeight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// The tenant's limits; absent: `defaultQuota`. A block given replaces `defaultQuota` as a
    /// whole (a limit it leaves out is not limited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaConfig>,
}

/// A tenant's limits; every one is optional and absent means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaConfig {
    /// GPUs the tenant may hold across the federation (offered, bound, running and `Unknown`
    /// jobs). A job that would go past it waits `Queued`; a gang larger than it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    /// Only the tenant's first this many queued jobs (priority, then age) are placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_jobs: Option<u32>,
    /// Submits per second the tenant may make on average (REST and gRPC together); more are
    /// answered 429 with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submits_per_second: Option<f64>,
    /// Submits the tenant may make at once before the rate applies; absent: the rate rounded
    /// up (at least 1). Needs `submitsPerSecond`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_burst: Option<u32>,
}

impl QuotaConfig {
    /// Problems with the values, each naming its field under `prefix` (e.g. `defaultQuota.`).
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (field, value) in
            [("maxGpus", self.max_gpus), ("maxQueuedJobs", self.max_queued_jobs), ("submitBurst", self.submit_burst)]
        {
            if value == Some(0) {
                problems.push(format!("{prefix}{field}: must be at least 1 (leave it out for no limit)"));
            }
        }
        match self.submits_per_second {
            Some(rate) if !(rate.is_finite() && rate > 0.0) => {
                problems.push(format!("{prefix}submitsPerSecond: {rate} must be a positive number"));
            }
            None if self.submit_burst.is_some() => {
                problems.push(format!("{prefix}submitBurst: needs {prefix}submitsPerSecond"));
            }
            _ => {}
        }
        problems
    }

    /// The limits placement enforces.
    pub fn placement(&self) -> meridian_core::TenantQuota {
        meridian_core::TenantQuota { max_gpus: self.max_gpus, max_queued_jobs: self.max_queued_jobs }
    }

    /// The submit rate limit, if any: (per second, burst).
    pub fn submit_rate(&self) -> Option<(f64, u32)> {
        let per_second = self.submits_per_second?;
        // `as` saturates; a rate beyond u32 is no limit in practice anyway.
        let burst = self.submit_burst.unwrap_or(per_second.ceil() as u32).max(1);
        Some((per_second, burst))
    }
}

/// An extra GPU model.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuTypeConfig {
    /// Name used in specs and inventories.
    pub name: String,
    /// Memory per GPU in GiB.
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            data_dir: PathBuf::from("meridian-data"),
            tenants: BTreeMap::new(),
            default_tenant_weight: 1.0,
            default_quota: QuotaConfig::default(),
            gpu_types: Vec::new(),
            network: NetworkTable::default(),
            placement: PlacementConfig::default(),
            offer_timeout: HumanDuration::from_secs(30),
            cluster_timeout: HumanDuration::from_secs(15),
            placement_interval: HumanDuration::from_secs(2),
            lost_job_timeout: HumanDuration::from_secs(600),
            lease_margin: HumanDuration::from_secs(60),
            retention: HumanDuration::from_secs(7 * 24 * 3600),
            agent_buffer: 1024,
            tls: None,
            insecure: false,
            limits: LimitsConfig::default(),
            auth: None,
            store: store::StoreSection::default(),
            secrets: store::SecretsSection::default(),
            ha: store::HaSection::default(),
            idle_gpu: IdleGpuSection::default(),
            metrics: metrics::MetricsConfig::default(),
        }
    }
}

impl GatewayConfig {
    /// Reads and checks a YAML config file.
    pub fn load(path: &Path) -> Result<Self> {
        Self::parse(&config_file::read(path)?, path)
    }

    /// Parses and checks YAML config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let config: GatewayConfig =
            if text.trim().is_empty() { GatewayConfig::default() } else { config_file::parse_yaml(text, path)? };
        config.check(path)?;
        Ok(config)
    }

    /// Checks values that types cannot express; lists every problem.
    pub fn check(&self, path: &Path) -> Result<()> {
        let mut problems = Vec::new();
        let positive = |v: f64| v.is_finite() && v > 0.0;
        for (tenant, t) in &self.tenants {
            if let Some(weight) = t.weight
                && !positive(weight)
            {
                problems.push(format!("tenants.{tenant}.weight: {weight} must be a positive number"));
            }
            if let Some(quota) = &t.quota {
                problems.extend(quota.problems(&format!("tenants.{tenant}.quota.")));
            }
        }
        if !positive(self.default_tenant_weight) {
            problems.push(format!("defaultTenantWeight: {} must be a positive number", self.default_tenant_weight));
        }
        problems.extend(self.default_quota.problems("defaultQuota."));
        for (i, gpu) in self.gpu_types.iter().enumerate() {
            if gpu.name.trim().is_empty() {
                problems.push(format!("gpuTypes[{i}].name: must not be empty"));
            } else if gpu.name.contains(meridian_proto::gpu::SPAN_SEPARATOR) {
                problems.push(format!(
                    "gpuTypes[{i}].name: `{}` must not contain `{}`, which joins the types of a span",
                    gpu.name,
                    meridian_proto::gpu::SPAN_SEPARATOR
                ));
            }
            if gpu.memory_gib == 0 {
                problems.push(format!("gpuTypes[{i}].memoryGiB: must be at least 1"));
            }
        }
        for (field, value) in [
            ("offerTimeout", self.offer_timeout),
            ("clusterTimeout", self.cluster_timeout),
            ("placementInterval", self.placement_interval),
            ("lostJobTimeout", self.lost_job_timeout),
            ("retention", self.retention),
        ] {
            if value.0.is_zero() {
                problems.push(format!("{field}: must be longer than 0s"));
            }
        }
        if self.agent_buffer == 0 {
            problems.push("agentBuffer: must be at least 1 (messages queued per agent stream)".to_string());
        }
        problems.extend(self.placement.problems("placement."));
        problems.extend(crate::tls::problems(self.tls.as_ref(), self.insecure));
        problems.extend(self.limits.problems("limits."));
        if let Some(auth) = &self.auth {
            problems.extend(auth.problems("auth."));
        }
        if !(self.idle_gpu.threshold.is_finite() && self.idle_gpu.threshold > 0.0 && self.idle_gpu.threshold <= 1.0) {
            problems.push(format!(
                "idleGpu.threshold: {} must be a utilisation fraction above 0 and at most 1 (0.05 is 5%)",
                self.idle_gpu.threshold
            ));
        }
        if self.idle_gpu.after.0.is_zero() {
            problems.push("idleGpu.after: must be longer than 0s".to_string());
        }
        problems.extend(self.metrics.problems(self.auth.is_some()));
        problems.extend(store::problems(&self.store, &self.secrets, &self.ha));
        if self.listen == self.grpc_listen && self.listen.port() != 0 {
            problems.push(format!("listen and grpcListen: both are {}; use two ports", self.listen));
        }
        config_file::check(path, problems)
    }

    /// The GPU catalog: built-in models plus `gpu_types`.
    pub fn gpu_catalog(&self) -> GpuCatalog {
        GpuCatalog::with_extra(self.gpu_types.iter().map(|g| (g.name.clone(), g.memory_gib)))
    }

    /// The region-pair network placement uses: the seeded defaults with `network` on top.
    pub fn network_table(&self) -> NetworkTable {
        let mut table = NetworkTable::default_seeded();
        table.extend(&self.network);
        table
    }

    /// Fair-share weight of `tenant`.
    pub fn tenant_weight(&self, tenant: &str) -> f64 {
        self.tenants.get(tenant).and_then(|t| t.weight).unwrap_or(self.default_tenant_weight)
    }

    /// The quota of `tenant`, and where it is configured (`tenants.NAME.quota` or `defaultQuota`).
    pub fn quota(&self, tenant: &str) -> (&QuotaConfig, String) {
        match self.tenants.get(tenant).and_then(|t| t.quota.as_ref()) {
            Some(quota) => (quota, format!("tenants.{tenant}.quota")),
            None => (&self.default_quota, "defaultQuota".to_string()),
        }
    }

    /// The policy the core runs with.
    pub fn core_config(&self) -> meridian_core::CoreConfig {
        meridian_core::CoreConfig {
            placement: self.placement.clone(),
            network: self.network_table(),
            tenant_weights: self.tenants.iter().filter_map(|(name, t)| Some((name.clone(), t.weight?))).collect(),
            default_tenant_weight: self.default_tenant_weight,
            offer_timeout: self.offer_timeout.0,
            cluster_timeout: self.cluster_timeout.0,
            lost_job_timeout: self.lost_job_timeout.0,
            lease_margin: self.lease_margin.0,
            retention: self.retention.0,
            quotas: self
                .tenants
                .iter()
                .filter_map(|(name, t)| Some((name.clone(), t.quota.as_ref()?.placement())))
                .collect(),
            default_quota: self.default_quota.placement(),
            idle_gpu: meridian_core::IdleGpuConfig { threshold: self.idle_gpu.threshold, after: self.idle_gpu.after.0 },
        }
    }

    /// How the runtime drives the core.
    pub fn runtime_config(&self) -> crate::runtime::RuntimeConfig {
        crate::runtime::RuntimeConfig {
            placement_interval: self.placement_interval.0,
            agent_buffer: self.agent_buffer,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let config = GatewayConfig::parse("insecure: true\n", Path::new("g.yaml")).unwrap();
        assert_eq!(config.listen.port(), 7070);
        assert_eq!(config.tenant_weight("anyone"), 1.0);
    }

    #[test]
    fn idle_gpu_defaults_to_five_percent_for_thirty_minutes_and_bad_values_are_named() {
        let config = GatewayConfig::parse("insecure: true\n", Path::new("g.yaml")).unwrap();
        assert_eq!(config.core_config().idle_gpu.threshold, 0.05);
        assert_eq!(config.core_config().idle_gpu.after.as_secs(), 1800);
        let config =
            GatewayConfig::parse("insecure: true\nidleGpu: {threshold: 0.1, after: 2s}\n", Path::new("g.yaml"))
                .unwrap();
        assert_eq!(config.core_config().idle_gpu.after.as_secs(), 2);
        let err = GatewayConfig::parse("insecure: true\nidleGpu: {threshold: 5, after: 0s}\n", Path::new("g.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("idleGpu.threshold") && err.contains("idleGpu.after"), "{err}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = GatewayConfig::parse("listn: 1.2.3.4:5\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("listn"), "{err}");
    }

    #[test]
    fn quotas_are_read_per_tenant_with_a_default_for_the_rest() {
        let text = "insecure: true\ntenants:\n  nlp: {quota: {maxGpus: 8, submitsPerSecond: 2}}\n  vision: {weight: 2}\n\
                    defaultQuota: {maxQueuedJobs: 100}\n";
        let config = GatewayConfig::parse(text, Path::new("g.yaml")).unwrap();
        let (nlp, source) = config.quota("nlp");
        assert_eq!((nlp.max_gpus, nlp.max_queued_jobs, source.as_str()), (Some(8), None, "tenants.nlp.quota"));
        assert_eq!(nlp.submit_rate(), Some((2.0, 2)));
        let (vision, source) = config.quota("vision");
        assert_eq!((vision.max_queued_jobs, source.as_str()), (Some(100), "defaultQuota"));
        assert_eq!(config.tenant_weight("nlp"), 1.0, "no weight given: the default");
        assert_eq!(config.tenant_weight("vision"), 2.0);
        let core = config.core_config();
        assert_eq!(core.quota("nlp").max_gpus, Some(8));
        assert_eq!(core.quota("anyone").max_queued_jobs, Some(100));
    }

    #[test]
    fn invalid_quotas_name_their_fields() {
        let text = "insecure: true\ntenants: {nlp: {quota: {maxGpus: 0, submitsPerSecond: -1}}}\n\
                    defaultQuota: {submitBurst: 5, maxQueuedJobs: 0}\n";
        match GatewayConfig::parse(text, Path::new("g.yaml")) {
            Err(Error::Invalid { problems, .. }) => {
                let joined = problems.join("\n");
                for field in [
                    "tenants.nlp.quota.maxGpus",
                    "tenants.nlp.quota.submitsPerSecond",
                    "defaultQuota.maxQueuedJobs",
                    "defaultQuota.submitBurst: needs defaultQuota.submitsPerSecond",
                ] {
                    assert!(joined.contains(field), "{field} missing from {joined}");
                }
                assert_eq!(problems.len(), 4, "{problems:?}");
            }
            other => panic!("expected invalid, got {other:?}"),
        }
        let err = GatewayConfig::parse("defaultQuota: {maxGPUs: 3}\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("maxGPUs"), "{err}");
    }

    #[test]
    fn a_gpu_type_name_may_not_contain_the_span_separator() {
        let text = "insecure: true\ngpuTypes: [{name: a100+b, memoryGiB: 40}]\n";
        let err = GatewayConfig::parse(text, Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("gpuTypes[0].name: `a100+b` must not contain `+`"), "{err}");
        let ok =
            GatewayConfig::parse("insecure: true\ngpuTypes: [{name: mi325x, memoryGiB: 256}]\n", Path::new("g.yaml"));
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn an_auth_section_needs_a_tokens_file_or_jwt_settings() {
        let err = GatewayConfig::parse("insecure: true\nauth: {}\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("auth.tokensFile, auth.jwt"), "{err}");
        let text =
            "insecure: true\nauth: {tokensFile: tokens.yaml, jwt: {issuer: '', audience: m, jwksFile: k.json}}\n";
        let err = GatewayConfig::parse(text, Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("auth.jwt.issuer: must not be empty"), "{err}");
        let ok =
            GatewayConfig::parse("insecure: true\nauth: {tokensFile: tokens.yaml}\n", Path::new("g.yaml")).unwrap();
        assert!(ok.auth.is_some());
    }

    #[test]
    fn every_invalid_value_is_reported() {
        let text = "insecure: true\ntenants: {nlp: {weight: 0}}\ndefaultTenantWeight: -1\nofferTimeout: 0s\n";
        match GatewayConfig::parse(text, Path::new("g.yaml")) {
            Err(Error::Invalid { problems, .. }) => assert_eq!(problems.len(), 3, "{problems:?}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }
}
