//! Static bearer tokens from a YAML file (`auth.tokensFile`):
//!
//! ```yaml
//! tokens:
//!   - subject: alice
//!     role: member            # admin | member | viewer
//!     tenants: [vision]
//!     sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//!   - subject: ci
//!     role: admin
//!     token: a-plain-token-of-16-or-more-chars   # accepted, but prefer sha256
//! ```
//!
//! The gateway keeps only SHA-256 digests and looks a presented token up by its digest.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use meridian_proto::config_file;
use ring::digest::{SHA256, digest};
use serde::Deserialize;

use super::{Caller, LoadError, Role};

/// Shortest plain `token:` accepted: shorter ones can be guessed.
pub const MIN_PLAIN_TOKEN_LEN: usize = 16;

/// The tokens of one version of the file.
#[derive(Debug, Default)]
pub struct TokenSet {
    by_digest: HashMap<[u8; 32], Caller>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    /// `tokens:` with every entry commented out reads as null: no tokens.
    #[serde(default)]
    tokens: Option<Vec<TokenEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    subject: String,
    role: Role,
    #[serde(default)]
    tenants: BTreeSet<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

impl TokenSet {
    /// The caller `token` stands for, if it is one of the set.
    pub fn lookup(&self, token: &str) -> Option<&Caller> {
        self.by_digest.get(&sha256(token.as_bytes()))
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether the set holds no token.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Parses the file's text; `path` is only used in messages. Lists every problem at once,
    /// naming entries by index and subject, never by token.
    pub fn parse(text: &str, path: &Path) -> Result<TokenSet, LoadError> {
        let invalid = |problems: Vec<String>| LoadError::Invalid { path: path.to_path_buf(), problems };
        let file: TokensFile = config_file::parse_yaml(text, path).map_err(|e| invalid(vec![parse_message(e)]))?;
        let mut problems = Vec::new();
        let mut by_digest = HashMap::new();
        for (i, entry) in file.tokens.unwrap_or_default().into_iter().enumerate() {
            let at = format!("tokens[{i}]");
            if entry.subject.trim().is_empty() {
                problems.push(format!("{at}.subject: must not be empty"));
            }
            if entry.role != Role::Admin && entry.tenants.is_empty() {
                problems.push(format!("{at}.tenants: a {} needs at least one tenant", entry.role));
            }
            if entry.tenants.iter().any(|t| t.trim().is_empty()) {
                problems.push(format!("{at}.tenants: tenant names must not be empty"));
            }
            let digest = match (&entry.sha256, &entry.token) {
                (Some(hex), None) => match parse_hex_digest(hex) {
                    Some(digest) => Some(digest),
                    None => {
                        problems.push(format!("{at}.sha256: must be 64 hex digits (`printf %s TOKEN | sha256sum`)"));
                        None
                    }
                },
                (None, Some(token)) if token.chars().count() < MIN_PLAIN_TOKEN_LEN => {
                    problems.push(format!("{at}.token: must be at least {MIN_PLAIN_TOKEN_LEN} characters"));
                    None
                }
                (None, Some(token)) if token.contains(char::is_whitespace) => {
                    problems.push(format!("{at}.token: must not contain spaces"));
                    None
                }
                (None, Some(token)) => Some(sha256(token.as_bytes())),
                (Some(_), Some(_)) => {
                    problems.push(format!("{at}: give `sha256` or `token`, not both"));
                    None
                }
                (None, None) => {
                    problems.push(format!("{at}: needs `sha256` (preferred) or `token`"));
                    None
                }
            };
            let caller = Caller { subject: entry.subject, role: entry.role, tenants: entry.tenants };
            if let Some(digest) = digest
                && let Some(earlier) = by_digest.insert(digest, caller)
            {
                problems.push(format!("{at}: the same token is already listed for {}", earlier.subject));
            }
        }
        if problems.is_empty() { Ok(TokenSet { by_digest }) } else { Err(invalid(problems)) }
    }
}

/// Reads and parses a tokens file.
pub fn load(path: &Path) -> Result<TokenSet, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_path_buf(), source })?;
    TokenSet::parse(&text, path)
}

/// The SHA-256 digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// The lowercase hex of a SHA-256 digest (what a tokens file's `sha256:` holds).
pub fn sha256_hex(token: &str) -> String {
    sha256(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn parse_message(error: config_file::ConfigError) -> String {
    match error {
        config_file::ConfigError::Parse { message, .. } => message,
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TokenSet, LoadError> {
        TokenSet::parse(text, Path::new("tokens.yaml"))
    }

    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Err(LoadError::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn hashed_and_plain_tokens_map_to_their_callers() {
        let text = format!(
            "tokens:\n  - {{subject: alice, role: member, tenants: [vision], sha256: {}}}\n  \
             - {{subject: ci, role: admin, token: plain-token-for-ci-0001}}\n",
            sha256_hex("alice-secret-token")
        );
        let set = parse(&text).unwrap();
        assert_eq!(set.len(), 2);
        let alice = set.lookup("alice-secret-token").unwrap();
        assert_eq!((alice.subject.as_str(), alice.role), ("alice", Role::Member));
        assert!(alice.tenants.contains("vision"));
        assert_eq!(set.lookup("plain-token-for-ci-0001").unwrap().role, Role::Admin);
        assert!(set.lookup("alice-secret-tokeN").is_none());
        assert!(set.lookup("").is_none());
    }

    #[test]
    fn the_digest_is_uppercase_or_lowercase_hex() {
        let text = format!(
            "tokens: [{{subject: a, role: viewer, tenants: [t], sha256: {}}}]",
            sha256_hex("0123456789abcdef").to_uppercase()
        );
        assert!(parse(&text).unwrap().lookup("0123456789abcdef").is_some());
    }

    #[test]
    fn every_bad_entry_is_named_without_showing_a_token() {
        let text = "tokens:\n\
            - {subject: '', role: member, tenants: [t], token: short}\n\
            - {subject: b, role: viewer, sha256: abc}\n\
            - {subject: c, role: admin}\n\
            - {subject: d, role: admin, token: aaaaaaaaaaaaaaaaaaaa, sha256: abc}\n";
        let found = problems(text);
        let joined = found.join("\n");
        for expected in [
            "tokens[0].subject",
            "tokens[0].token: must be at least 16",
            "tokens[1].tenants",
            "tokens[1].sha256: must be 64 hex digits",
            "tokens[2]: needs `sha256`",
            "tokens[3]: give `sha256` or `token`, not both",
        ] {
            assert!(joined.contains(expected), "{expected} missing from:\n{joined}");
        }
        assert!(!joined.contains("short") && !joined.contains("aaaaaaaa"), "{joined}");
    }

    #[test]
    fn the_same_token_twice_is_refused() {
        let text = "tokens:\n- {subject: a, role: admin, token: same-token-0123456789}\n\
                    - {subject: b, role: admin, token: same-token-0123456789}\n";
        assert!(problems(text)[0].contains("already listed for a"));
    }

    #[test]
    fn unknown_fields_and_roles_are_named() {
        let found = problems("tokens: [{subject: a, role: root, token: xxxxxxxxxxxxxxxxxxxx}]");
        assert!(found[0].contains("tokens[0].role"), "{found:?}");
        let found = problems("tokens: [{subject: a, role: admin, token: xxxxxxxxxxxxxxxxxxxx, tenant: x}]");
        assert!(found[0].contains("tenant"), "{found:?}");
    }
}
