//! The `store:`, `secrets:` and `ha:` sections: where the gateway keeps its state, the key that
//! seals stored secrets, and how several gateways elect a leader (with `store.kind: etcd`).

use std::path::PathBuf;

use meridian_proto::duration::HumanDuration;
use serde::{Deserialize, Serialize};

/// The `store:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StoreSection {
    /// `embedded` (default: a redb file in `dataDir`, one gateway) or `etcd` (several gateways,
    /// one elected leader).
    pub kind: StoreKind,
    /// How to reach etcd; required with `kind: etcd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSection>,
}

/// Which store the gateway uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StoreKind {
    /// The embedded redb file in `dataDir`: one gateway, nothing to install.
    #[default]
    Embedded,
    /// etcd: several gateways, one elected leader, standbys that answer reads.
    Etcd,
}

/// The `store.etcd:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EtcdSection {
    /// Client URLs of the etcd members, e.g. `https://etcd-0:2379`.
    pub endpoints: Vec<String>,
    /// Every key lives under this prefix (several federations can share one etcd).
    pub prefix: String,
    /// The CA etcd's certificate chains to, and this gateway's client certificate and key
    /// (needed when etcd runs with `--client-cert-auth`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EtcdTlsSection>,
    /// etcd user (with `passwordFile`), when etcd has authentication on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// File holding the etcd user's password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// How long connecting may take.
    pub dial_timeout: HumanDuration,
    /// A commit or a read page that takes longer fails (a leader then steps down).
    pub request_timeout: HumanDuration,
    /// Writes in one transaction at most; etcd must run with `--max-txn-ops` at least this.
    pub max_txn_ops: usize,
    /// Bytes in one request at most; etcd must run with `--max-request-bytes` at least this.
    pub max_request_bytes: usize,
    /// Keys read per request when loading.
    pub page_size: usize,
}

impl Default for EtcdSection {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            prefix: "/meridian/".to_string(),
            tls: None,
            username: None,
            password_file: None,
            dial_timeout: HumanDuration(std::time::Duration::from_secs(2)),
            request_timeout: HumanDuration(std::time::Duration::from_secs(3)),
            max_txn_ops: 1024,
            max_request_bytes: 8 * 1024 * 1024,
            page_size: 1000,
        }
    }
}

/// The `store.etcd.tls:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdTlsSection {
    /// The CA that signed etcd's server certificate.
    pub ca: PathBuf,
    /// This gateway's client certificate (with `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// The `secrets:` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SecretsSection {
    /// The key file that seals stored values (see `docs/security.md#secrets-at-rest`). Left out
    /// with the embedded store: `<dataDir>/secrets.key`, created on first start. Required with
    /// etcd (every gateway needs the same key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

/// The `ha:` section (used with `store.kind: etcd`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HaSection {
    /// This gateway's name in logs and in the leader's address; default: the host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The REST base URL others reach this gateway at when it leads (standbys send clients
    /// there); default: from `listen` (and `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_rest: Option<String>,
    /// The gRPC URL agents reach this gateway at when it leads; default: from `grpcListen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_grpc: Option<String>,
    /// The leader's etcd lease. A dead leader is replaced after at most this long.
    pub lease_ttl: HumanDuration,
    /// A leader that could not renew its lease stops sending this long before the lease can
    /// expire at etcd (covers clock-rate differences and the send of its last message).
    pub step_down_margin: HumanDuration,
}

impl Default for HaSection {
    fn default() -> Self {
        Self {
            name: None,
            advertise_rest: None,
            advertise_grpc: None,
            lease_ttl: HumanDuration(std::time::Duration::from_secs(2)),
            step_down_margin: HumanDuration(std::time::Duration::from_millis(500)),
        }
    }
}

/// Problems with the three sections, each naming its field.
pub(crate) fn problems(store: &StoreSection, secrets: &SecretsSection, ha: &HaSection) -> Vec<String> {
    let mut problems = Vec::new();
    match store.kind {
        StoreKind::Embedded => {
            if store.etcd.is_some() {
                problems.push("store.etcd: set, but store.kind is embedded; set `kind: etcd` to use it".to_string());
            }
        }
        StoreKind::Etcd => {
            if !cfg!(feature = "etcd") {
                problems.push(
                    "store.kind: etcd needs a gateway built with the etcd store: `cargo build --release -p meridian --features etcd` (or the container image)"
                        .to_string(),
                );
            }
            match &store.etcd {
                None => problems.push("store.etcd: required with `kind: etcd` (at least `endpoints`)".to_string()),
                Some(etcd) => problems.extend(etcd_problems(etcd)),
            }
            if secrets.key_file.is_none() {
                problems.push(
                    "secrets.keyFile: required with store.kind etcd: every gateway must seal and open stored secrets with the same key (docs/security.md#secrets-at-rest)"
                        .to_string(),
                );
            }
            let ttl = ha.lease_ttl.0;
            if ttl < std::time::Duration::from_secs(2) {
                problems.push(format!("ha.leaseTtl: {ttl:?} is shorter than etcd's smallest lease (2s)"));
            } else if ttl.subsec_nanos() != 0 {
                problems.push(format!("ha.leaseTtl: {ttl:?} must be whole seconds (etcd's leases count seconds)"));
            }
            if ha.step_down_margin.0.is_zero() || ha.step_down_margin.0 * 2 >= ttl {
                problems.push(format!(
                    "ha.stepDownMargin: {:?} must be above 0 and under half of ha.leaseTtl ({ttl:?})",
                    ha.step_down_margin.0
                ));
            }
            for (field, url) in [("ha.advertiseRest", &ha.advertise_rest), ("ha.advertiseGrpc", &ha.advertise_grpc)] {
                if let Some(url) = url
                    && !(url.starts_with("http://") || url.starts_with("https://"))
                {
                    problems.push(format!("{field}: `{url}` must be a URL starting with http:// or https://"));
                }
            }
        }
    }
    problems
}

fn etcd_problems(etcd: &EtcdSection) -> Vec<String> {
    let mut problems = Vec::new();
    if etcd.endpoints.is_empty() {
        problems.push("store.etcd.endpoints: name at least one etcd client URL (three members: name all three)".into());
    }
    for (i, endpoint) in etcd.endpoints.iter().enumerate() {
        let https = endpoint.starts_with("https://");
        if !(https || endpoint.starts_with("http://")) {
            problems.push(format!("store.etcd.endpoints[{i}]: `{endpoint}` must start with http:// or https://"));
        } else if https && etcd.tls.is_none() {
            problems.push(format!("store.etcd.endpoints[{i}]: `{endpoint}` is https; set store.etcd.tls.ca"));
        } else if !https && etcd.tls.is_some() {
            problems.push(format!(
                "store.etcd.endpoints[{i}]: `{endpoint}` is plain http but store.etcd.tls is set; use https://"
            ));
        }
    }
    if !etcd.prefix.starts_with('/') || !etcd.prefix.ends_with('/') {
        problems.push(format!("store.etcd.prefix: `{}` must start and end with `/`", etcd.prefix));
    }
    if let Some(tls) = &etcd.tls
        && tls.cert.is_some() != tls.key.is_some()
    {
        problems.push("store.etcd.tls: set both `cert` and `key`, or neither".into());
    }
    if etcd.username.is_some() != etcd.password_file.is_some() {
        problems.push("store.etcd: set both `username` and `passwordFile`, or neither".into());
    }
    for (field, value) in [("dialTimeout", etcd.dial_timeout), ("requestTimeout", etcd.request_timeout)] {
        if value.0.is_zero() {
            problems.push(format!("store.etcd.{field}: must be longer than 0s"));
        }
    }
    if etcd.max_txn_ops < 16 {
        problems.push(format!(
            "store.etcd.maxTxnOps: {} is too small; at least 16 (etcd's default is 128)",
            etcd.max_txn_ops
        ));
    }
    if etcd.max_request_bytes < 1024 * 1024 {
        problems.push(format!(
            "store.etcd.maxRequestBytes: {} is too small; at least 1048576 (a job spec may be 256 KiB)",
            etcd.max_request_bytes
        ));
    }
    if etcd.page_size == 0 {
        problems.push("store.etcd.pageSize: must be at least 1".into());
    }
    problems
}

#[cfg(feature = "etcd")]
impl EtcdSection {
    /// The store crate's configuration.
    pub fn to_store_config(&self) -> meridian_store::etcd::EtcdConfig {
        meridian_store::etcd::EtcdConfig {
            endpoints: self.endpoints.clone(),
            prefix: self.prefix.clone(),
            tls: self.tls.as_ref().map(|tls| meridian_store::etcd::EtcdTls {
                ca: tls.ca.clone(),
                cert: tls.cert.clone(),
                key: tls.key.clone(),
            }),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
            dial_timeout: self.dial_timeout.0,
            request_timeout: self.request_timeout.0,
            max_txn_ops: self.max_txn_ops,
            max_request_bytes: self.max_request_bytes,
            page_size: self.page_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(endpoints: &[&str]) -> StoreSection {
        StoreSection {
            kind: StoreKind::Etcd,
            etcd: Some(EtcdSection {
                endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
                ..EtcdSection::default()
            }),
        }
    }

    fn keyed() -> SecretsSection {
        SecretsSection { key_file: Some("/etc/meridian/secrets.key".into()) }
    }

    #[test]
    fn the_embedded_default_needs_nothing() {
        assert_eq!(
            problems(&StoreSection::default(), &SecretsSection::default(), &HaSection::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn etcd_needs_endpoints_and_a_shared_key_file() {
        let problems = problems(&etcd(&[]), &SecretsSection::default(), &HaSection::default());
        assert!(problems.iter().any(|p| p.starts_with("store.etcd.endpoints:")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("secrets.keyFile:")), "{problems:?}");
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut store = etcd(&["etcd-0:2379", "https://etcd-1:2379"]);
        if let Some(etcd) = store.etcd.as_mut() {
            etcd.prefix = "meridian".into();
            etcd.max_txn_ops = 8;
        }
        let ha = HaSection {
            lease_ttl: HumanDuration(std::time::Duration::from_millis(2500)),
            advertise_rest: Some("gw-1:7070".into()),
            ..HaSection::default()
        };
        let problems = problems(&store, &keyed(), &ha);
        for field in [
            "store.etcd.endpoints[0]:",
            "store.etcd.endpoints[1]:",
            "store.etcd.prefix:",
            "store.etcd.maxTxnOps:",
            "ha.leaseTtl:",
            "ha.advertiseRest:",
        ] {
            assert!(problems.iter().any(|p| p.starts_with(field)), "{field} not named in {problems:?}");
        }
    }

    #[test]
    fn tls_to_a_plain_endpoint_and_a_margin_too_wide_are_refused() {
        let mut store = etcd(&["http://etcd-0:2379"]);
        if let Some(etcd) = store.etcd.as_mut() {
            etcd.tls = Some(EtcdTlsSection { ca: "/ca.pem".into(), cert: None, key: None });
        }
        let ha =
            HaSection { step_down_margin: HumanDuration(std::time::Duration::from_secs(1)), ..HaSection::default() };
        let problems = problems(&store, &keyed(), &ha);
        assert!(
            problems.iter().any(|p| p.starts_with("store.etcd.endpoints[0]:") && p.contains("plain http")),
            "{problems:?}"
        );
        assert!(problems.iter().any(|p| p.starts_with("ha.stepDownMargin:")), "{problems:?}");
    }
}
