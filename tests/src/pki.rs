//! Certificates for a test federation over TLS: a development CA, the gateway's server
//! certificate and one client certificate per cluster, as PEM files in the federation's
//! directory.

use std::path::{Path, PathBuf};

use anyhow::Result;
use meridian::certs::{Ca, Pair, Validity};

/// A CA and the certificates it signed, in a directory: `ca.pem`, `gateway.pem`/`gateway.key`,
/// and `NAME.pem`/`NAME.key` per agent certificate.
pub struct Pki {
    dir: PathBuf,
    /// The CA, to sign more certificates (expired ones, odd names) in a test.
    pub ca: Ca,
}

impl Pki {
    /// Makes a CA and the gateway's certificate (for `localhost`) valid for a day, in `dir`.
    pub fn new(dir: &Path) -> Result<Self> {
        let ca = Ca::generate(Validity::days(1))?;
        std::fs::write(dir.join("ca.pem"), &ca.pair.cert_pem)?;
        let server = ca.server(&[], Validity::days(1))?;
        write_pair(dir, "gateway", &server)?;
        Ok(Self { dir: dir.to_path_buf(), ca })
    }

    /// The path of `file` in the directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The CA certificate's file, which clients of the gateway trust.
    pub fn ca_file(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The gateway's `tls:` section (one line, certificates reloaded every 100 ms).
    pub fn gateway_tls(&self) -> String {
        format!(
            "tls: {{cert: {}, key: {}, clientCa: {}, reloadInterval: 100ms}}\n",
            self.path("gateway.pem").display(),
            self.path("gateway.key").display(),
            self.ca_file().display()
        )
    }

    /// Writes `file.pem`/`file.key`, an agent certificate naming `cluster` valid for a day.
    pub fn agent(&self, file: &str, cluster: &str) -> Result<Pair> {
        let pair = self.ca.agent(cluster, Validity::days(1))?;
        write_pair(&self.dir, file, &pair)?;
        Ok(pair)
    }

    /// An agent's `tls:` section presenting the certificate for `cluster` (`cluster.pem`),
    /// which is issued first if there is none yet.
    pub fn agent_tls(&self, cluster: &str) -> Result<String> {
        if !self.path(&format!("{cluster}.pem")).exists() {
            self.agent(cluster, cluster)?;
        }
        Ok(format!(
            "tls: {{ca: {}, cert: {}, key: {}}}\n",
            self.ca_file().display(),
            self.path(&format!("{cluster}.pem")).display(),
            self.path(&format!("{cluster}.key")).display()
        ))
    }
}

fn write_pair(dir: &Path, name: &str, pair: &Pair) -> Result<()> {
    std::fs::write(dir.join(format!("{name}.pem")), &pair.cert_pem)?;
    std::fs::write(dir.join(format!("{name}.key")), &pair.key_pem)?;
    Ok(())
}
