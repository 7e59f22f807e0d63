//! The gateway's configuration: typed, defaulted, and checked as a whole before any port is bound.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use meridian_proto::config_file;
use meridian_proto::duration::HumanDuration;
use meridian_proto::gpu::GpuCatalog;
use serde::{Deserialize, Serialize};

use crate::placement::{NetworkTable, PlacementConfig};

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
    /// Fair-share weight per tenant; tenants not listed get `default_tenant_weight`.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Weight of tenants not listed in `tenants`.
    pub default_tenant_weight: f64,
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
    /// How REST and gRPC `Jobs` callers authenticate (see `docs/security/auth.md`). Left out:
    /// every caller is an anonymous admin (a development mode; the gateway warns at start-up).
    pub auth: Option<crate::auth::AuthConfig>,
}

/// Per-tenant settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantConfig {
    /// Share of GPUs relative to other tenants (2 gets twice what 1 gets under contention).
    pub weight: f64,
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
            gpu_types: Vec::new(),
            network: NetworkTable::default(),
            placement: PlacementConfig::default(),
            offer_timeout: HumanDuration::from_secs(30),
            cluster_timeout: HumanDuration::from_secs(15),
            placement_interval: HumanDuration::from_secs(2),
            lost_job_timeout: HumanDuration::from_secs(600),
            lease_margin: HumanDuration::from_secs(60),
            retention: HumanDuration::from_secs(7 * 24 * 3600),
            auth: None,
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
            if !positive(t.weight) {
                problems.push(format!("tenants.{tenant}.weight: {} must be a positive number", t.weight));
            }
        }
        if !positive(self.default_tenant_weight) {
            problems.push(format!("defaultTenantWeight: {} must be a positive number", self.default_tenant_weight));
        }
        for (i, gpu) in self.gpu_types.iter().enumerate() {
            if gpu.name.trim().is_empty() {
                problems.push(format!("gpuTypes[{i}].name: must not be empty"));
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
        problems.extend(self.placement.problems("placement."));
        if let Some(auth) = &self.auth {
            problems.extend(auth.problems("auth."));
        }
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
        self.tenants.get(tenant).map_or(self.default_tenant_weight, |t| t.weight)
    }

    /// The policy the core runs with.
    pub fn core_config(&self) -> meridian_core::CoreConfig {
        meridian_core::CoreConfig {
            placement: self.placement.clone(),
            network: self.network_table(),
            tenant_weights: self.tenants.iter().map(|(name, t)| (name.clone(), t.weight)).collect(),
            default_tenant_weight: self.default_tenant_weight,
            offer_timeout: self.offer_timeout.0,
            cluster_timeout: self.cluster_timeout.0,
            lost_job_timeout: self.lost_job_timeout.0,
            lease_margin: self.lease_margin.0,
            retention: self.retention.0,
        }
    }

    /// How the runtime drives the core.
    pub fn runtime_config(&self) -> crate::runtime::RuntimeConfig {
        crate::runtime::RuntimeConfig { placement_interval: self.placement_interval.0, ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_gives_the_defaults() {
        let config = GatewayConfig::parse("", Path::new("g.yaml")).unwrap();
        assert_eq!(config.listen.port(), 7070);
        assert_eq!(config.tenant_weight("anyone"), 1.0);
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = GatewayConfig::parse("listn: 1.2.3.4:5\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("listn"), "{err}");
    }

    #[test]
    fn an_auth_section_needs_a_tokens_file_or_jwt_settings() {
        let err = GatewayConfig::parse("auth: {}\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("auth.tokensFile, auth.jwt"), "{err}");
        let text = "auth: {tokensFile: tokens.yaml, jwt: {issuer: '', audience: m, jwksFile: k.json}}\n";
        let err = GatewayConfig::parse(text, Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("auth.jwt.issuer: must not be empty"), "{err}");
        let ok = GatewayConfig::parse("auth: {tokensFile: tokens.yaml}\n", Path::new("g.yaml")).unwrap();
        assert!(ok.auth.is_some());
    }

    #[test]
    fn every_invalid_value_is_reported() {
        let text = "tenants: {nlp: {weight: 0}}\ndefaultTenantWeight: -1\nofferTimeout: 0s\n";
        match GatewayConfig::parse(text, Path::new("g.yaml")) {
            Err(Error::Invalid { problems, .. }) => assert_eq!(problems.len(), 3, "{problems:?}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }
}
