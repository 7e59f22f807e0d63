//! `meridian certs`: a development CA, the gateway's server certificate, and one client
//! certificate per member cluster (rcgen, ECDSA P-256).
//!
//! Files in `--dir`: `ca.pem`/`ca.key` (the CA), `gateway.pem`/`gateway.key` (SANs localhost,
//! 127.0.0.1, ::1 and `--gateway-name`s; serverAuth only), `cluster-NAME.pem`/`cluster-NAME.key`
//! (URI SAN `urn:meridian:cluster:NAME`; clientAuth only). Keys are written 0600. Existing
//! files are never overwritten without `--force`.
//!
//! Production deployments can use any CA instead: the gateway only needs a server certificate
//! and a CA whose client certificates carry the cluster URI SAN.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use time::{Duration, OffsetDateTime};

use meridian_gateway::tls::identity::cluster_uri;

/// The CA's common name. `certs issue` rebuilds the issuer from it and the CA key, so it must
/// not change between versions.
const CA_COMMON_NAME: &str = "Meridian development CA";

/// `meridian certs` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CertsCommand {
    /// Write a development CA and the gateway's server certificate into DIR.
    Init {
        /// Where to write `ca.pem`, `ca.key`, `gateway.pem` and `gateway.key`.
        #[arg(long)]
        dir: PathBuf,
        /// Extra DNS names or IP addresses of the gateway (localhost, 127.0.0.1 and ::1 are
        /// always included). Repeat for several.
        #[arg(long = "gateway-name", value_name = "NAME")]
        gateway_names: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Write cluster NAME's agent certificate, signed by the CA in DIR.
    Issue {
        /// The cluster the certificate names (URI SAN `urn:meridian:cluster:NAME`).
        #[arg(long)]
        cluster: String,
        /// Where the CA is and where `cluster-NAME.pem` and `cluster-NAME.key` go.
        #[arg(long)]
        dir: PathBuf,
        /// Validity in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Files that would be overwritten.
    #[error("{} already exist(s); pass --force to overwrite", list(.0))]
    Exists(Vec<PathBuf>),
    /// The CA is missing.
    #[error("{} not found; run `meridian certs init --dir {}` first", .0.display(), .1.display())]
    NoCa(PathBuf, PathBuf),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// rcgen refused (a name that is not a valid DNS name, a bad key file).
    #[error("{context}: {source}")]
    Generate {
        /// What was being made.
        context: String,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },
    /// A value given on the command line is not usable.
    #[error("{field}: {reason}")]
    Invalid {
        /// The option.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// `ca.pem` and `ca.key` do not belong together (or `ca.pem` was not made by `certs init`).
    #[error(
        "the certificate just issued does not chain to {}: {reason}; was ca.pem replaced, or ca.key taken from another CA?",
        .ca.display()
    )]
    CaMismatch {
        /// The CA certificate file.
        ca: PathBuf,
        /// The verifier's reason.
        reason: String,
    },
}

fn list(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    /// Not before.
    pub from: OffsetDateTime,
    /// Not after.
    pub until: OffsetDateTime,
}

impl Validity {
    /// From an hour ago (clock skew between hosts) for `days` days.
    pub fn days(days: u32) -> Self {
        let now = OffsetDateTime::now_utc();
        Self { from: now - Duration::hours(1), until: now + Duration::days(i64::from(days)) }
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

/// A CA able to sign.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate and key.
    pub pair: Pair,
}

impl Ca {
    /// A new self-signed CA.
    pub fn generate(validity: Validity) -> Result<Self> {
        let key = key_pair("the CA key")?;
        let mut params = ca_params();
        params.not_before = validity.from;
        params.not_after = validity.until;
        let cert = params.self_signed(&key).map_err(generate("the CA certificate"))?;
        let pair = Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
        Ok(Self { issuer: Issuer::new(ca_params(), key), pair })
    }

    /// The CA written by `certs init` in `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        for path in [&cert_path, &key_path] {
            if !path.exists() {
                return Err(Error::NoCa(path.clone(), dir.to_path_buf()));
            }
        }
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(generate(&key_path.display().to_string()))?;
        Ok(Self { issuer: Issuer::new(ca_params(), key), pair: Pair { cert_pem, key_pem } })
    }

    /// The gateway's server certificate: localhost, 127.0.0.1, ::1 and `names`.
    pub fn server(&self, names: &[String], validity: Validity) -> Result<Pair> {
        let mut sans: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        for name in names {
            if !sans.contains(name) {
                sans.push(name.clone());
            }
        }
        let mut params = CertificateParams::new(sans).map_err(generate("--gateway-name"))?;
        params.distinguished_name.push(DnType::CommonName, "meridian gateway");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, validity, "the gateway certificate")
    }

    /// Cluster `cluster`'s agent certificate. The name must follow the cluster-name grammar
    /// ([`meridian_proto::names`]), which the gateway checks too.
    pub fn agent(&self, cluster: &str, validity: Validity) -> Result<Pair> {
        check_cluster_name(cluster)?;
        self.client(&[cluster_uri(cluster)], &format!("meridian agent {cluster}"), validity)
    }

    /// A client certificate with exactly these URI SANs, which are not checked: what any CA may
    /// sign. For testing how the gateway treats certificates it did not issue; agents get theirs
    /// from [`Ca::agent`].
    pub fn client(&self, uris: &[String], common_name: &str, validity: Validity) -> Result<Pair> {
        let mut params = CertificateParams::default();
        for uri in uris {
            params.subject_alt_names.push(SanType::URI(uri.clone().try_into().map_err(generate("--cluster"))?));
        }
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, validity, "the agent certificate")
    }

    fn sign(&self, mut params: CertificateParams, validity: Validity, what: &str) -> Result<Pair> {
        params.not_before = validity.from;
        params.not_after = validity.until;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = key_pair(what)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate(what))?;
        Ok(Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, CA_COMMON_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn key_pair(what: &str) -> Result<KeyPair> {
    KeyPair::generate().map_err(generate(what))
}

fn generate(context: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |source| Error::Generate { context: context.to_string(), source }
}

/// Cluster names in certificates end up in file names and URIs, and the gateway refuses a
/// certificate whose name breaks the cluster-name grammar: refuse it here, before anything is
/// written.
fn check_cluster_name(cluster: &str) -> Result<()> {
    meridian_proto::names::check_cluster_name(cluster)
        .map_err(|reason| Error::Invalid { field: "--cluster", reason: reason.to_string() })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Writes `files` (path, contents, is a key), refusing to overwrite unless `force`.
fn write_all(files: &[(PathBuf, &str, bool)], force: bool) -> Result<()> {
    if !force {
        let existing: Vec<PathBuf> = files.iter().filter(|(p, _, _)| p.exists()).map(|(p, _, _)| p.clone()).collect();
        if !existing.is_empty() {
            return Err(Error::Exists(existing));
        }
    }
    for (path, contents, secret) in files {
        write_file(path, contents, *secret).map_err(|source| Error::Io { path: path.clone(), source })?;
    }
    Ok(())
}

fn write_file(path: &Path, contents: &str, secret: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path)?;
    // `mode` applies only to a new file; an overwritten key must not keep looser bits.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Checks that `pair` chains to the CA certificate `ca_pem` as a client certificate.
fn verify_chain(ca_pem: &str, pair: &Pair, ca_path: &Path) -> Result<()> {
    let mismatch = |reason: String| Error::CaMismatch { ca: ca_path.to_path_buf(), reason };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.map_err(|e| mismatch(e.to_string()))?).map_err(|e| mismatch(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| mismatch(e.to_string()))?;
    let leaf = CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).map_err(|e| mismatch(e.to_string()))?;
    verifier.verify_client_cert(&leaf, &[], UnixTime::now()).map_err(|e| mismatch(e.to_string()))?;
    Ok(())
}

/// Runs a `certs` command, saying on `out` what it wrote.
pub fn run(command: CertsCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match command {
        CertsCommand::Init { dir, gateway_names, days, force } => {
            let written = init(&dir, &gateway_names, days, force)?;
            for path in written {
                writeln!(out, "wrote {}", path.display())?;
            }
            writeln!(
                out,
                "gateway config:\n  tls: {{cert: {0}/gateway.pem, key: {0}/gateway.key, clientCa: {0}/ca.pem}}\n\
                 next: `meridian certs issue --dir {0} --cluster NAME` for each member cluster",
                dir.display()
            )?;
        }
        CertsCommand::Issue { cluster, dir, days, force } => {
            let written = issue(&dir, &cluster, days, force)?;
            for path in written {
                writeln!(out, "wrote {}", path.display())?;
            }
            writeln!(
                out,
                "agent config:\n  tls: {{ca: {0}/ca.pem, cert: {0}/cluster-{1}.pem, key: {0}/cluster-{1}.key}}",
                dir.display(),
                cluster
            )?;
        }
    }
    Ok(())
}

/// `certs init`: writes the CA and the gateway certificate into `dir`; returns the files.
pub fn init(dir: &Path, gateway_names: &[String], days: u32, force: bool) -> Result<Vec<PathBuf>> {
    if days == 0 {
        return Err(Error::Invalid { field: "--days", reason: "must be at least 1".into() });
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    let validity = Validity::days(days);
    let ca = Ca::generate(validity)?;
    let gateway = ca.server(gateway_names, validity)?;
    let files = [
        (dir.join("ca.pem"), ca.pair.cert_pem.as_str(), false),
        (dir.join("ca.key"), ca.pair.key_pem.as_str(), true),
        (dir.join("gateway.pem"), gateway.cert_pem.as_str(), false),
        (dir.join("gateway.key"), gateway.key_pem.as_str(), true),
    ];
    write_all(&files, force)?;
    Ok(files.into_iter().map(|(p, _, _)| p).collect())
}

/// `certs issue`: writes `cluster`'s agent certificate into `dir`; returns the files.
pub fn issue(dir: &Path, cluster: &str, days: u32, force: bool) -> Result<Vec<PathBuf>> {
    if days == 0 {
        return Err(Error::Invalid { field: "--days", reason: "must be at least 1".into() });
    }
    check_cluster_name(cluster)?;
    let ca = Ca::load(dir)?;
    let pair = ca.agent(cluster, Validity::days(days))?;
    verify_chain(&ca.pair.cert_pem, &pair, &dir.join("ca.pem"))?;
    let files = [
        (dir.join(format!("cluster-{cluster}.pem")), pair.cert_pem.as_str(), false),
        (dir.join(format!("cluster-{cluster}.key")), pair.key_pem.as_str(), true),
    ];
    write_all(&files, force)?;
    Ok(files.into_iter().map(|(p, _, _)| p).collect())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn init_then_issue_writes_a_chain_the_gateway_accepts_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let written = init(dir.path(), &["gw.example".into()], 30, false).unwrap();
        assert_eq!(written.len(), 4);
        let issued = issue(dir.path(), "onprem-east", 30, false).unwrap();
        assert_eq!(issued[0], dir.path().join("cluster-onprem-east.pem"));
        for key in ["ca.key", "gateway.key", "cluster-onprem-east.key"] {
            let mode = std::fs::metadata(dir.path().join(key)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{key}");
        }
        let cert = std::fs::read(&issued[0]).unwrap();
        let der = CertificateDer::from_pem_slice(&cert).unwrap();
        assert_eq!(meridian_gateway::tls::identity::clusters_named(&der), ["onprem-east"]);
    }

    #[test]
    fn existing_files_are_kept_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &[], 1, false).unwrap();
        let before = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
        let err = init(dir.path(), &[], 1, false).unwrap_err().to_string();
        assert!(err.contains("ca.pem") && err.contains("--force"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("ca.pem")).unwrap(), before);
        init(dir.path(), &[], 1, true).unwrap();
        assert_ne!(std::fs::read_to_string(dir.path().join("ca.pem")).unwrap(), before);
        issue(dir.path(), "a", 1, false).unwrap();
        assert!(issue(dir.path(), "a", 1, false).unwrap_err().to_string().contains("--force"));
    }

    #[test]
    fn issue_without_a_ca_says_to_run_init() {
        let dir = tempfile::tempdir().unwrap();
        let err = issue(dir.path(), "a", 1, false).unwrap_err().to_string();
        assert!(err.contains("meridian certs init"), "{err}");
    }

    #[test]
    fn a_ca_key_from_another_ca_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &[], 1, false).unwrap();
        let other = Ca::generate(Validity::days(1)).unwrap();
        std::fs::write(dir.path().join("ca.key"), &other.pair.key_pem).unwrap();
        let err = issue(dir.path(), "a", 1, false).unwrap_err().to_string();
        assert!(err.contains("does not chain"), "{err}");
    }

    #[test]
    fn a_client_ca_file_with_the_old_and_the_new_ca_accepts_certificates_of_both() {
        // Development CAs share their name: rollover must still try every anchor of that name.
        let (old, new) = (Ca::generate(Validity::days(1)).unwrap(), Ca::generate(Validity::days(1)).unwrap());
        let both = format!("{}{}", old.pair.cert_pem, new.pair.cert_pem);
        for ca in [&old, &new] {
            verify_chain(&both, &ca.agent("a", Validity::days(1)).unwrap(), Path::new("both.pem")).unwrap();
        }
        let stranger = Ca::generate(Validity::days(1)).unwrap().agent("a", Validity::days(1)).unwrap();
        assert!(verify_chain(&both, &stranger, Path::new("both.pem")).is_err());
    }

    #[test]
    fn cluster_names_that_would_escape_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        init(dir.path(), &[], 1, false).unwrap();
        for bad in ["", "../x", "a/b", ".hidden", "a b", "East", "on_prem", "1east", "east-", &"a".repeat(64)] {
            assert!(
                matches!(issue(dir.path(), bad, 1, false), Err(Error::Invalid { field: "--cluster", .. })),
                "{bad}"
            );
        }
        let err = issue(dir.path(), "west/../east", 1, false).unwrap_err().to_string();
        assert!(err.starts_with("--cluster: has `/` at character 5;"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4, "nothing was written");
    }
}
