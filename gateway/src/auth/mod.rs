//! Who is calling: bearer tokens (static tokens from a file, or JWTs verified against a key set)
//! mapped to a [`Caller`] with a subject, a [`Role`] and tenants; and what a caller may do
//! ([`authorize`]).
//!
//! The gateway's APIs call [`Authenticator::authenticate`] with the `Authorization` header (REST)
//! or metadata (gRPC `Jobs`). The agents' `Federation` stream is authenticated by mTLS instead.
//! Without an `auth` section every caller is an anonymous admin (a development mode; the gateway
//! warns at start-up).

pub mod authorize;
mod config;
pub mod jwt;
pub mod tokens;
mod watched;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use authorize::Denied;
pub use config::{AuthConfig, JwtConfig};

use self::jwt::{JwtError, JwtSettings, KeySet};
use self::tokens::TokenSet;
use self::watched::Watched;

/// What a caller may do in its tenants. Ordered: each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads jobs (get, list, explain, logs) of its tenants.
    Viewer,
    /// A viewer that also submits and cancels jobs of its tenants.
    Member,
    /// Everything, in every tenant.
    Admin,
}

impl Role {
    /// The role's name as written in token files and claims.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "viewer" => Ok(Role::Viewer),
            "member" => Ok(Role::Member),
            "admin" => Ok(Role::Admin),
            other => Err(format!("`{other}` is not a role; use admin, member or viewer")),
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who (a token's `subject`, a JWT's `sub`); named in logs and 403 answers.
    pub subject: String,
    /// What it may do in `tenants` (an admin: in every tenant).
    pub role: Role,
    /// The tenants it acts in; ignored for admins.
    pub tenants: BTreeSet<String>,
}

impl Caller {
    /// The caller every request is when authentication is off.
    pub fn anonymous_admin() -> Self {
        Caller { subject: "anonymous".into(), role: Role::Admin, tenants: BTreeSet::new() }
    }

    /// Whether the caller sees every tenant.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// Why a configured token or key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not what it should be; every problem at once, each naming its entry.
    #[error("{path} is invalid:\n  {}", .problems.join("\n  "))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// One line per problem.
        problems: Vec<String>,
    },
}

/// Why a request's credentials were refused (401). Messages never contain the token.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// No `Authorization` header / metadata.
    #[error("authentication required: send `Authorization: Bearer <token>` (the CLI reads MERIDIAN_TOKEN)")]
    Missing,
    /// The header is not `Bearer <token>`.
    #[error("the Authorization header must be `Bearer <token>`")]
    Malformed,
    /// Not a known static token, and not a JWT.
    #[error("the bearer token is not valid")]
    UnknownToken,
    /// A JWT that does not verify.
    #[error("the bearer token (a JWT) is not valid: {0}")]
    Jwt(#[from] JwtError),
}

/// Turns bearer tokens into [`Caller`]s; reloads its files when they change.
pub struct Authenticator {
    mode: Mode,
    reload_interval: Duration,
}

// Large only in one variant, and there is one per gateway: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// No `auth` configured: everyone is an anonymous admin.
    Off,
    /// Tokens are checked.
    On {
        /// Static tokens, if a `tokensFile` is configured.
        tokens: Option<Watched<TokenSet>>,
        /// JWT settings and keys, if `jwt` is configured.
        jwt: Option<(JwtSettings, Watched<KeySet>)>,
    },
}

impl Authenticator {
    /// Authentication off: every caller is [`Caller::anonymous_admin`].
    pub fn off() -> Self {
        Authenticator { mode: Mode::Off, reload_interval: Duration::from_secs(2) }
    }

    /// Builds the authenticator `config` describes, reading its files now; `None` is [`off`].
    ///
    /// [`off`]: Authenticator::off
    pub fn from_config(config: Option<&AuthConfig>) -> Result<Self, LoadError> {
        let Some(config) = config else { return Ok(Self::off()) };
        let tokens = match &config.tokens_file {
            Some(path) => Some(Watched::load(path.clone(), tokens::load)?),
            None => None,
        };
        let jwt = match &config.jwt {
            Some(jwt) => Some((jwt.settings(), Watched::load(jwt.jwks_file.clone(), jwt::load_jwks)?)),
            None => None,
        };
        Ok(Authenticator { mode: Mode::On { tokens, jwt }, reload_interval: config.reload_interval.0 })
    }

    /// Whether tokens are checked at all.
    pub fn is_on(&self) -> bool {
        matches!(self.mode, Mode::On { .. })
    }

    /// The caller an `Authorization` value (`Bearer <token>`) stands for.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Rejection> {
        let Mode::On { tokens, jwt } = &self.mode else { return Ok(Caller::anonymous_admin()) };
        let header = authorization.ok_or(Rejection::Missing)?;
        let token = bearer_token(header).ok_or(Rejection::Malformed)?;
        if let Some(tokens) = tokens
            && let Some(caller) = tokens.current().lookup(token)
        {
            return Ok(caller.clone());
        }
        match jwt {
            Some((settings, keys)) if jwt::looks_like_jwt(token) => {
                Ok(jwt::verify(token, &keys.current(), settings, unix_now())?)
            }
            _ => Err(Rejection::UnknownToken),
        }
    }

    /// Reads each file again if it changed since it was last read; a bad file keeps the old set
    /// and is logged as an error.
    pub fn reload_if_changed(&self) {
        if let Mode::On { tokens, jwt } = &self.mode {
            if let Some(tokens) = tokens {
                tokens.reload_if_changed();
            }
            if let Some((_, keys)) = jwt {
                keys.reload_if_changed();
            }
        }
    }

    /// Polls the files for changes until `shutdown` flips.
    pub async fn watch_files(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        if !self.is_on() {
            return;
        }
        let mut every = tokio::time::interval(self.reload_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.reload_if_changed(),
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
        }
    }
}

/// The token of `Bearer <token>` (the scheme is case-insensitive, RFC 7235).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(char::is_whitespace))
        .then_some(token)
}

/// Seconds since the Unix epoch (JWT times are wall-clock times).
fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer   abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer a b"), None);
    }

    #[test]
    fn with_authentication_off_everyone_is_an_anonymous_admin() {
        let auth = Authenticator::off();
        assert_eq!(auth.authenticate(None).unwrap(), Caller::anonymous_admin());
        assert!(!auth.is_on());
    }

    fn config(dir: &std::path::Path, jwt: bool) -> AuthConfig {
        let jwt = jwt.then(|| JwtConfig {
            issuer: "https://idp.example".into(),
            audience: "meridian".into(),
            jwks_file: dir.join("jwks.json"),
            leeway: meridian_proto::duration::HumanDuration::from_secs(60),
            subject_claim: "sub".into(),
            tenants_claim: "meridian_tenants".into(),
            role_claim: "meridian_role".into(),
        });
        AuthConfig {
            tokens_file: Some(dir.join("tokens.yaml")),
            jwt,
            reload_interval: meridian_proto::duration::HumanDuration::from_secs(1),
        }
    }

    fn write_tokens(dir: &std::path::Path, entries: &[(&str, &str)]) {
        let mut text = String::from("tokens:\n");
        for (subject, token) in entries {
            text.push_str(&format!(
                "  - {{subject: {subject}, role: member, tenants: [t], sha256: {}}}\n",
                tokens::sha256_hex(token)
            ));
        }
        std::fs::write(dir.join("tokens.yaml"), text).unwrap();
    }

    #[test]
    fn a_changed_tokens_file_is_read_again_and_a_bad_one_keeps_the_old_set() {
        let dir = tempfile::tempdir().unwrap();
        write_tokens(dir.path(), &[("alice", "alice-token-0000001")]);
        let auth = Authenticator::from_config(Some(&config(dir.path(), false))).unwrap();
        assert_eq!(auth.authenticate(Some("Bearer alice-token-0000001")).unwrap().subject, "alice");
        assert!(matches!(auth.authenticate(None), Err(Rejection::Missing)));
        assert!(matches!(auth.authenticate(Some("Basic xyz")), Err(Rejection::Malformed)));

        // Rotation: the new token works and the old one stops working, without a restart.
        write_tokens(dir.path(), &[("alice", "alice-token-0000002"), ("bob", "bob-token-000000001")]);
        auth.reload_if_changed();
        assert!(matches!(auth.authenticate(Some("Bearer alice-token-0000001")), Err(Rejection::UnknownToken)));
        assert_eq!(auth.authenticate(Some("Bearer bob-token-000000001")).unwrap().subject, "bob");

        std::fs::write(dir.path().join("tokens.yaml"), "tokens: [{subject: x}]\n").unwrap();
        auth.reload_if_changed();
        assert_eq!(auth.authenticate(Some("Bearer alice-token-0000002")).unwrap().subject, "alice");
    }

    #[test]
    fn a_bad_file_at_start_up_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = Authenticator::from_config(Some(&config(dir.path(), false))).err().unwrap();
        assert!(err.to_string().contains("tokens.yaml"), "{err}");
        write_tokens(dir.path(), &[]);
        std::fs::write(dir.path().join("jwks.json"), "{}").unwrap();
        let err = Authenticator::from_config(Some(&config(dir.path(), true))).err().unwrap();
        assert!(err.to_string().contains("jwks.json") && err.to_string().contains("keys"), "{err}");
    }

    #[test]
    fn jwts_verify_against_the_key_file_and_a_rotated_key_is_picked_up() {
        use serde_json::json;

        use super::jwt::testing::{Signer, jwks};
        let dir = tempfile::tempdir().unwrap();
        write_tokens(dir.path(), &[]);
        let (old, new) = (Signer::es256(), Signer::es256());
        std::fs::write(dir.path().join("jwks.json"), jwks(&[old.jwk("old")])).unwrap();
        let auth = Authenticator::from_config(Some(&config(dir.path(), true))).unwrap();
        let claims = json!({"iss": "https://idp.example", "aud": "meridian", "sub": "svc", "exp": unix_now() + 300,
                            "meridian_role": "viewer", "meridian_tenants": ["t"]});
        let by_old = format!("Bearer {}", old.sign(json!({"kid": "old"}), &claims));
        let by_new = format!("Bearer {}", new.sign(json!({"kid": "new"}), &claims));
        assert_eq!(auth.authenticate(Some(&by_old)).unwrap().role, Role::Viewer);
        assert!(matches!(auth.authenticate(Some(&by_new)), Err(Rejection::Jwt(JwtError::UnknownKey { .. }))));

        std::fs::write(dir.path().join("jwks.json"), jwks(&[new.jwk("new")])).unwrap();
        auth.reload_if_changed();
        assert_eq!(auth.authenticate(Some(&by_new)).unwrap().subject, "svc");
        assert!(auth.authenticate(Some(&by_old)).is_err());
        assert!(matches!(auth.authenticate(Some("Bearer not-a-jwt")), Err(Rejection::UnknownToken)));
    }

    #[test]
    fn roles_are_ordered_by_what_they_allow() {
        assert!(Role::Viewer < Role::Member && Role::Member < Role::Admin);
        assert_eq!("member".parse::<Role>().unwrap(), Role::Member);
        assert!("root".parse::<Role>().unwrap_err().contains("admin, member or viewer"));
    }
}
