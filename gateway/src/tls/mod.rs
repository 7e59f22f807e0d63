//! TLS on the gateway's two listeners: the server certificate both serve, the CA agents'
//! client certificates must chain to, the cluster name a certificate carries, and the reload of
//! all three files when they change on disk.
//!
//! - gRPC asks every client for a certificate but lets anonymous clients in (users' `Jobs` calls
//!   carry bearer tokens instead); a certificate that is presented must chain to `clientCa` and
//!   be valid now, or the handshake fails. `Federation.Attach` then requires one ([`identity`]).
//! - REST asks for none.
//!
//! Files: `identity.rs` (the cluster a certificate names), `incoming.rs` (accepting connections:
//! handshakes on their own tasks under a timeout, a cap on open connections), `reload.rs`
//! (polling the files).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meridian_proto::duration::HumanDuration;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use conn::Handshake;

pub mod conn;
pub mod identity;
pub mod incoming;
pub mod reload;

pub use incoming::{ConnLimits, Incoming, incoming};
pub use reload::Reloader;

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The gateway's `tls:` section: PEM files, read at start and again whenever they change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// The gateway's certificate chain (leaf first), served on both ports.
    pub cert: PathBuf,
    /// The private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA (one or more certificates) that agents' client certificates must chain to.
    pub client_ca: PathBuf,
    /// How often the three files are checked for changes.
    #[serde(default = "default_reload_interval")]
    pub reload_interval: HumanDuration,
    /// A connection that has not finished its TLS handshake by then is closed.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: HumanDuration,
    /// Open connections the gRPC listener holds at most (and the REST listener, until its own
    /// limits land); beyond it, new connections are closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

fn default_reload_interval() -> HumanDuration {
    HumanDuration::from_secs(5)
}
fn default_handshake_timeout() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_max_connections() -> usize {
    ConnLimits::default().max_connections
}

impl TlsConfig {
    /// The limits the listeners apply.
    pub fn limits(&self) -> ConnLimits {
        ConnLimits { handshake_timeout: self.handshake_timeout.0, max_connections: self.max_connections }
    }
}

/// Why TLS could not be set up from the configured files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("tls.{field}: cannot read {}: {source}", path.display())]
    Read {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM block of the kind needed.
    #[error("tls.{field}: {}: {reason}", path.display())]
    Pem {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the certificate, key or CA (a key that does not match the certificate, a
    /// CA that is not a valid trust anchor).
    #[error("tls.{field}: {}: {source}", path.display())]
    Rustls {
        /// The config field naming the file rustls refused.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
}

/// The rustls configurations of both listeners, built from the same files.
#[derive(Debug)]
pub struct ServerConfigs {
    /// gRPC: HTTP/2 only, asks for (but does not require) a client certificate from `clientCa`.
    pub grpc: Arc<rustls::ServerConfig>,
    /// REST: HTTP/1.1, no client certificate.
    pub rest: Arc<rustls::ServerConfig>,
}

/// The config problems of `tls` and `insecure` (the one check `GatewayConfig::check` calls).
pub fn problems(tls: Option<&TlsConfig>, insecure: bool) -> Vec<String> {
    let mut problems = Vec::new();
    match tls {
        None if !insecure => problems.push(
            "tls: the gateway serves TLS only; set `tls: {cert, key, clientCa}` (`meridian certs init --dir DIR` \
             writes a development CA and certificate), or `insecure: true` to serve plain text"
                .to_string(),
        ),
        None => {}
        Some(tls) => {
            if insecure {
                problems.push("insecure: true contradicts the `tls` section; remove one of them".to_string());
            }
            for (field, path) in [("cert", &tls.cert), ("key", &tls.key), ("clientCa", &tls.client_ca)] {
                if path.as_os_str().is_empty() {
                    problems.push(format!("tls.{field}: must name a PEM file"));
                }
            }
            if tls.reload_interval.0.is_zero() {
                problems.push("tls.reloadInterval: must be longer than 0s".to_string());
            }
            if tls.handshake_timeout.0.is_zero() {
                problems.push("tls.handshakeTimeout: must be longer than 0s".to_string());
            }
            if tls.max_connections == 0 {
                problems.push("tls.maxConnections: must be at least 1".to_string());
            }
        }
    }
    problems
}

/// The process-wide crypto provider: ring, the only one compiled in.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Read { field, path: path.to_path_buf(), source })
}

fn certificates(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem { field, path: path.to_path_buf(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            field,
            path: path.to_path_buf(),
            reason: "no `BEGIN CERTIFICATE` block found".into(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Error::Pem {
        field: "key",
        path: path.to_path_buf(),
        reason: format!("no private key found ({e})"),
    })
}

/// Reads the three files and builds both listeners' configurations.
pub fn load(config: &TlsConfig) -> Result<ServerConfigs> {
    let chain = certificates("cert", &config.cert)?;
    let key = private_key(&config.key)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in certificates("clientCa", &config.client_ca)? {
        roots.add(ca).map_err(|source| Error::Rustls { field: "clientCa", path: config.client_ca.clone(), source })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Pem { field: "clientCa", path: config.client_ca.clone(), reason: e.to_string() })?;
    let key_error = |source| Error::Rustls { field: "key", path: config.key.clone(), source };
    let mut grpc = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(key_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(key_error)?;
    grpc.alpn_protocols = vec![b"h2".to_vec()];
    let mut rest = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(key_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(key_error)?;
    rest.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerConfigs { grpc: Arc::new(grpc), rest: Arc::new(rest) })
}

/// Which listener a [`TlsHandshake`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// gRPC: client certificates asked for.
    Grpc,
    /// REST: a client speaking plain HTTP is told to use https.
    Rest,
}

/// The TLS handshake of one listener, with the configuration current at accept time (so a
/// reloaded certificate serves the next connection).
#[derive(Debug, Clone)]
pub struct TlsHandshake {
    configs: watch::Receiver<Arc<ServerConfigs>>,
    listener: Listener,
}

impl TlsHandshake {
    /// A handshake for `listener` using the latest of `configs`.
    pub fn new(configs: watch::Receiver<Arc<ServerConfigs>>, listener: Listener) -> Self {
        Self { configs, listener }
    }
}

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Sent to a client that speaks plain HTTP to the TLS REST port, so it does not just see a
/// closed connection.
fn plain_http_answer() -> Vec<u8> {
    let body = "{\"error\":{\"code\":\"tls_required\",\"message\":\"this port serves HTTPS only: use https://HOST:PORT with the gateway's CA\"}}\n";
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl Handshake for TlsHandshake {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    async fn handshake(&self, mut tcp: TcpStream) -> std::io::Result<Self::Io> {
        let config = {
            let configs = self.configs.borrow();
            match self.listener {
                Listener::Grpc => configs.grpc.clone(),
                Listener::Rest => configs.rest.clone(),
            }
        };
        if self.listener == Listener::Rest {
            let mut first = [0u8; 1];
            let read = tcp.peek(&mut first).await?;
            if read == 1 && first[0] != TLS_HANDSHAKE_RECORD {
                let _ = tcp.write_all(&plain_http_answer()).await;
                let _ = tcp.shutdown().await;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "plain HTTP on the TLS port (answered 400 tls_required)",
                ));
            }
        }
        tokio_rustls::TlsAcceptor::from(config).accept(tcp).await
    }
}

#[cfg(test)]
pub(crate) mod tests;
