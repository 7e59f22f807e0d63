//! [`EtcdConfig`]: where etcd is, how to authenticate, and how long to wait for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::Limits;
use crate::error::{Error, Result};

/// How to reach etcd and how large and slow a request may be.
///
/// The defaults match an etcd started with default flags on the local host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members, e.g. `http://127.0.0.1:2379` or `https://etcd-0:2379`.
    /// Give every member: requests go to any healthy one.
    pub endpoints: Vec<String>,
    /// Every key the gateway writes lives under this prefix (default `/meridian/`). The keys
    /// under `<prefix>election/` belong to [`Election`](super::Election)s.
    pub prefix: String,
    /// TLS to etcd; `None` for plain `http://` endpoints.
    pub tls: Option<EtcdTls>,
    /// The etcd user, when etcd has authentication enabled.
    pub username: Option<String>,
    /// A file holding the user's password (a trailing newline is ignored).
    pub password_file: Option<PathBuf>,
    /// How long connecting to a member may take (default 2 s).
    pub dial_timeout: Duration,
    /// How long one request may take (default 3 s): a commit or a scan page that takes longer
    /// fails.
    pub request_timeout: Duration,
    /// Operations in one transaction at most: etcd's `--max-txn-ops` (default 128).
    pub max_txn_ops: usize,
    /// Bytes in one request at most: etcd's `--max-request-bytes` (default 1,572,864, 1.5 MiB).
    pub max_request_bytes: usize,
    /// Keys read per request by a scan (default 1,000).
    pub page_size: usize,
}

/// TLS settings for etcd: the CA that signed the members' certificates, and optionally a client
/// certificate (etcd's `--client-cert-auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CA that signed the members' server certificates.
    pub ca: PathBuf,
    /// PEM file of this client's certificate (needs `key`).
    pub cert: Option<PathBuf>,
    /// PEM file of this client's private key (needs `cert`).
    pub key: Option<PathBuf>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            prefix: "/meridian/".to_string(),
            tls: None,
            username: None,
            password_file: None,
            dial_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
            max_txn_ops: 128,
            max_request_bytes: 1_572_864,
            page_size: 1000,
        }
    }
}

/// Bytes a commit keeps free of keys and values for the request's own framing, whatever the
/// batch: etcd's raft request header (request id, user name, auth revision), the transaction's
/// compare on the election key when the commit is guarded (its key is `<prefix>election/<name>/`
/// and 16 hex digits; names are at most [`MAX_ELECTION_NAME_BYTES`] bytes) and protobuf tags.
///
/// [`MAX_ELECTION_NAME_BYTES`]: super::election::MAX_ELECTION_NAME_BYTES
pub(crate) const FIXED_OVERHEAD_BYTES: usize = 1024;

/// Bytes each write adds beyond its key and value (besides the prefix, counted separately): a
/// put is a `RequestOp` holding a `PutRequest`, i.e. three length-delimited fields and two more
/// tags, at most 16 bytes of framing for values under 2 MiB. 64 leaves room for etcd to add
/// fields without our limits going wrong.
pub(crate) const PER_WRITE_OVERHEAD_BYTES: usize = 64;

impl EtcdConfig {
    /// Where the store's keys live: `<prefix>data/`. Elections live beside it under
    /// `<prefix>election/`, so a scan, a watch or a reseal of the data never touches them.
    pub fn data_prefix(&self) -> String {
        format!("{}data/", self.prefix)
    }

    /// The endpoints as one string, for messages: `http://a:2379,http://b:2379`.
    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }

    /// The largest batch a commit takes: `max_txn_ops` writes, and `max_request_bytes` less the
    /// framing: [`FIXED_OVERHEAD_BYTES`], the user name, the prefix once for the guard's compare,
    /// and per write [`PER_WRITE_OVERHEAD_BYTES`] plus the prefix added to its key.
    pub(crate) fn limits(&self) -> Limits {
        let per_write = PER_WRITE_OVERHEAD_BYTES + self.data_prefix().len();
        let framing = FIXED_OVERHEAD_BYTES
            + self.username.as_ref().map_or(0, String::len)
            + self.prefix.len()
            + self.max_txn_ops.saturating_mul(per_write);
        Limits { max_writes: self.max_txn_ops, max_bytes: self.max_request_bytes.saturating_sub(framing) }
    }

    /// Every problem of the configuration at once (empty when it is usable).
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.endpoints.is_empty() {
            problems.push("endpoints: give at least one etcd client URL".to_string());
        }
        for endpoint in &self.endpoints {
            let secure = endpoint.starts_with("https://");
            if !secure && !endpoint.starts_with("http://") {
                problems.push(format!("endpoints: {endpoint:?} must start with http:// or https://"));
            } else if secure != self.tls.is_some() {
                problems.push(format!(
                    "endpoints: {endpoint:?} {} but tls is {}; use https:// endpoints exactly when tls is set",
                    if secure { "is https://" } else { "is http://" },
                    if self.tls.is_some() { "set" } else { "not set" }
                ));
            }
        }
        if self.prefix.is_empty() {
            problems.push("prefix: must not be empty (e.g. /meridian/)".to_string());
        }
        if self.username.is_some() != self.password_file.is_some() {
            problems.push("username and password_file: give both or neither".to_string());
        }
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            problems.push("tls.cert and tls.key: give both or neither".to_string());
        }
        for (name, value) in [("dial_timeout", self.dial_timeout), ("request_timeout", self.request_timeout)] {
            if value.is_zero() {
                problems.push(format!("{name}: must be more than zero"));
            }
        }
        if self.max_txn_ops == 0 {
            problems.push("max_txn_ops: must be at least 1".to_string());
        }
        if self.page_size == 0 {
            problems.push("page_size: must be at least 1".to_string());
        }
        if self.max_txn_ops > 0 && self.limits().max_bytes == 0 {
            problems.push(format!(
                "max_request_bytes: {} leaves no room for data after the framing of {} operations",
                self.max_request_bytes, self.max_txn_ops
            ));
        }
        problems
    }

    /// etcd-client's options: credentials, TLS files (read now), timeouts.
    pub(crate) fn connect_options(&self) -> Result<ConnectOptions> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.dial_timeout)
            // A member without a leader answers "no leader" at once instead of holding requests
            // and watches until they time out.
            .with_require_leader(true)
            // HTTP/2 pings find a dead connection to a member; etcd sends GOAWAY to clients that
            // ping more often than every 5 s (--grpc-keepalive-min-time) or with no stream open.
            .with_keep_alive(Duration::from_secs(10), self.dial_timeout)
            .with_keep_alive_while_idle(false);
        if let (Some(username), Some(password_file)) = (&self.username, &self.password_file) {
            let password = read_password(password_file)?;
            options = options.with_user(username.clone(), password).with_auto_token_refresh(true);
        }
        if let Some(tls) = &self.tls {
            let mut tls_options = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca)?));
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                tls_options = tls_options.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            options = options.with_tls(tls_options);
        }
        Ok(options)
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(Error::io(path))
}

/// The password in `path`, without the line break an editor or `echo` leaves at its end.
fn read_password(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
    let password = text.strip_suffix('\n').unwrap_or(&text);
    Ok(password.strip_suffix('\r').unwrap_or(password).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limits_leave_room_for_framing_below_etcds_defaults() {
        let config = EtcdConfig::default();
        let limits = config.limits();
        assert_eq!(limits.max_writes, 128);
        // The guard's compare names the election key (under the prefix); each write's key is
        // under the data prefix.
        let framing = 1024 + "/meridian/".len() + 128 * (64 + "/meridian/data/".len());
        assert_eq!(limits.max_bytes, 1_572_864 - framing);
    }

    #[test]
    fn a_longer_prefix_and_a_user_name_lower_the_byte_limit() {
        let base = EtcdConfig::default().limits().max_bytes;
        let config = EtcdConfig {
            prefix: "/meridian/production/".to_string(),
            username: Some("gateway".to_string()),
            password_file: Some("/run/secrets/etcd".into()),
            ..EtcdConfig::default()
        };
        let extra_prefix = "production/".len();
        assert_eq!(config.limits().max_bytes, base - extra_prefix * 129 - "gateway".len());
    }

    #[test]
    fn every_problem_of_a_config_is_reported_at_once() {
        let config = EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".to_string(), "https://a:2379".to_string()],
            prefix: String::new(),
            username: Some("gateway".to_string()),
            request_timeout: Duration::ZERO,
            page_size: 0,
            ..EtcdConfig::default()
        };
        let problems = config.problems();
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(problems[0].contains("must start with http:// or https://"), "{problems:#?}");
        assert!(problems[1].contains("tls is not set"), "{problems:#?}");
        assert!(EtcdConfig::default().problems().is_empty());
    }

    #[test]
    fn the_password_file_loses_its_trailing_newline_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "s3cret \n").unwrap();
        assert_eq!(read_password(&path).unwrap(), "s3cret ");
        std::fs::write(&path, "s3cret\r\n").unwrap();
        assert_eq!(read_password(&path).unwrap(), "s3cret");
        std::fs::write(&path, "s3cret").unwrap();
        assert_eq!(read_password(&path).unwrap(), "s3cret");
    }

    #[test]
    fn an_unreadable_tls_file_is_an_io_error_naming_it() {
        let config = EtcdConfig {
            endpoints: vec!["https://127.0.0.1:2379".to_string()],
            tls: Some(EtcdTls { ca: "/nonexistent/ca.pem".into(), cert: None, key: None }),
            ..EtcdConfig::default()
        };
        match config.connect_options() {
            Err(Error::Io { path, .. }) => assert_eq!(path, PathBuf::from("/nonexistent/ca.pem")),
            Err(other) => panic!("expected an I/O error, got {other}"),
            Ok(_) => panic!("expected an I/O error"),
        }
    }
}
