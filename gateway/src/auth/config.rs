//! The gateway config's `auth` section. Secrets never sit in it: it names the files that hold
//! them (hashed static tokens; public keys).

use std::path::PathBuf;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use serde::{Deserialize, Serialize};

use super::jwt::JwtSettings;

/// `auth`: how callers of the REST API and the gRPC `Jobs` service prove who they are. At least
/// one of `tokensFile` and `jwt` must be set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthConfig {
    /// A YAML file of static tokens (stored as SHA-256 hex), each with a subject, role and
    /// tenants. Read again when it changes.
    #[serde(default)]
    pub tokens_file: Option<PathBuf>,
    /// JWTs signed by an identity provider.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// How often the files are checked for changes.
    #[serde(default = "default_reload_interval")]
    pub reload_interval: HumanDuration,
}

/// `auth.jwt`: which JWTs are accepted (RS256 or ES256, from keys in `jwksFile`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// A value the token's `aud` must hold.
    pub audience: String,
    /// A JSON Web Key Set file with the issuer's public keys. Read again when it changes.
    pub jwks_file: PathBuf,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway: HumanDuration,
    /// The claim that names the caller.
    #[serde(default = "default_subject_claim")]
    pub subject_claim: String,
    /// The claim with the caller's tenants (a list of strings, or one string).
    #[serde(default = "default_tenants_claim")]
    pub tenants_claim: String,
    /// The claim with the caller's role (`admin`, `member` or `viewer`).
    #[serde(default = "default_role_claim")]
    pub role_claim: String,
}

impl AuthConfig {
    /// Problems with the section, each naming its field under `prefix` (such as `auth.`).
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.tokens_file.is_none() && self.jwt.is_none() {
            problems.push(format!(
                "{prefix}tokensFile, {prefix}jwt: set at least one (or leave `auth` out for the unauthenticated dev mode)"
            ));
        }
        if self.tokens_file.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            problems.push(format!("{prefix}tokensFile: must name a file"));
        }
        if self.reload_interval.0.is_zero() {
            problems.push(format!("{prefix}reloadInterval: must be longer than 0s"));
        }
        if let Some(jwt) = &self.jwt {
            let jwt_prefix = format!("{prefix}jwt.");
            for (field, value) in [
                ("issuer", &jwt.issuer),
                ("audience", &jwt.audience),
                ("subjectClaim", &jwt.subject_claim),
                ("tenantsClaim", &jwt.tenants_claim),
                ("roleClaim", &jwt.role_claim),
            ] {
                if value.trim().is_empty() {
                    problems.push(format!("{jwt_prefix}{field}: must not be empty"));
                }
            }
            if jwt.jwks_file.as_os_str().is_empty() {
                problems.push(format!("{jwt_prefix}jwksFile: must name a file"));
            }
        }
        problems
    }
}

impl JwtConfig {
    /// What verification checks.
    pub(crate) fn settings(&self) -> JwtSettings {
        JwtSettings {
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
            leeway_secs: self.leeway.0.as_secs() as i64,
            subject_claim: self.subject_claim.clone(),
            tenants_claim: self.tenants_claim.clone(),
            role_claim: self.role_claim.clone(),
        }
    }
}

fn default_reload_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}
fn default_leeway() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_subject_claim() -> String {
    "sub".into()
}
fn default_tenants_claim() -> String {
    "meridian_tenants".into()
}
fn default_role_claim() -> String {
    "meridian_role".into()
}
