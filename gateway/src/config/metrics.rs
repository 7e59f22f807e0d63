//! The `metrics` section of the gateway config: who may scrape `/metrics`. The endpoint itself is
//! `crate::metrics`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Who may read `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MetricsAccess {
    /// Anyone who reaches the REST port.
    Open,
    /// A bearer token: the scrape token of `tokenFile`, or (with `auth`) an admin's token.
    Token,
    /// Not served (404).
    Off,
}

/// The `metrics` section of the gateway configuration. `Default` reads as the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `open`, `token` or `off`; left out: `token` when `auth` is configured, `open` when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access: Option<MetricsAccess>,
    /// A file holding the scrape token (its whole content, surrounding white space ignored),
    /// accepted only at `/metrics`; Prometheus reads the same file (`authorization:
    /// credentials_file`). Read at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

impl MetricsConfig {
    /// The access in force, given whether `auth` is configured.
    pub fn effective_access(&self, auth_configured: bool) -> MetricsAccess {
        self.access.unwrap_or(if auth_configured { MetricsAccess::Token } else { MetricsAccess::Open })
    }

    /// Problems with the section, each naming its field.
    pub fn problems(&self, auth_configured: bool) -> Vec<String> {
        let mut problems = Vec::new();
        if self.effective_access(auth_configured) == MetricsAccess::Token
            && !auth_configured
            && self.token_file.is_none()
        {
            problems.push(
                "metrics.access: `token` needs metrics.tokenFile (or an `auth` section whose admins may scrape)".into(),
            );
        }
        if self.token_file.is_some() && self.effective_access(auth_configured) != MetricsAccess::Token {
            problems.push("metrics.tokenFile: only used with metrics.access `token`; remove it or set access".into());
        }
        problems
    }
}
