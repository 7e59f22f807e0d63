//! A real etcd cluster for tests: [`EtcdCluster`] starts `etcd` member processes on free loopback
//! ports, each with a temporary data directory, and kills them when dropped.
//!
//! Tests that do not kill members may use a cluster the test command started instead
//! ([`shared_endpoints`], from `MERIDIAN_ETCD_ENDPOINTS`, see `scripts/etcd/up.sh`).
//! `MERIDIAN_SKIP_ETCD=1` skips the etcd tests knowingly ([`skip`]).
//!
//! ```no_run
//! use meridian_store::testing::etcd::EtcdCluster;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mut cluster = EtcdCluster::start(3).await;
//! let endpoints = cluster.endpoints(); // ["http://127.0.0.1:…", …]
//! cluster.kill(0);
//! cluster.restart(0).await;
//! # drop(endpoints);
//! # }
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a member may take to report healthy after it starts.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// Distinguishes the clusters and prefixes of one test process.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Etcd member processes on loopback, each with its own data directory under one temporary
/// directory; every member is killed (by PID) when the cluster is dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: PathBuf,
    token: String,
    extra_flags: Vec<String>,
    tls: Option<ServerTls>,
    members: Vec<Member>,
}

/// TLS for an [`EtcdCluster`]'s client URLs: each member serves `https://` with `cert` and `key`
/// and accepts only clients with a certificate signed by `ca` (etcd's `--client-cert-auth`).
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM file of the CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// PEM file of the members' server certificate (valid for IP 127.0.0.1).
    pub cert: PathBuf,
    /// PEM file of its private key.
    pub key: PathBuf,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health` (and `/metrics`), whatever the client URL's scheme.
    health_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

/// The endpoints of a cluster the test command started (`MERIDIAN_ETCD_ENDPOINTS`, comma
/// separated), for tests that do not kill members.
pub fn shared_endpoints() -> Option<Vec<String>> {
    let value = std::env::var("MERIDIAN_ETCD_ENDPOINTS").ok()?;
    let endpoints: Vec<String> =
        value.split(',').map(str::trim).filter(|endpoint| !endpoint.is_empty()).map(String::from).collect();
    (!endpoints.is_empty()).then_some(endpoints)
}

/// Whether the etcd tests are skipped (`MERIDIAN_SKIP_ETCD=1`); such a test prints a line saying
/// so and returns.
pub fn skip() -> bool {
    std::env::var("MERIDIAN_SKIP_ETCD").is_ok_and(|value| value == "1")
}

/// A key prefix no other test (or earlier run) uses: `/test/<test>-<pid>-<nanos>-<n>/`.
pub fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    format!("/test/{test}-{}-{nanos}-{}/", std::process::id(), SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

impl EtcdCluster {
    /// Starts `members` members (1 or 3) and waits until each reports healthy.
    ///
    /// Panics when `etcd` is not installed, or when a member does not become healthy within 30 s
    /// (naming its log file).
    pub async fn start(members: usize) -> EtcdCluster {
        Self::start_with(members, &[], None).await
    }

    /// Like [`EtcdCluster::start`], with more `etcd` flags for every member (e.g.
    /// `["--max-txn-ops", "1000"]`).
    pub async fn start_with_flags(members: usize, extra_flags: &[&str]) -> EtcdCluster {
        Self::start_with(members, extra_flags, None).await
    }

    /// Like [`EtcdCluster::start`], serving the client URLs over TLS (`https://`).
    pub async fn start_tls(members: usize, tls: ServerTls) -> EtcdCluster {
        Self::start_with(members, &[], Some(tls)).await
    }

    async fn start_with(members: usize, extra_flags: &[&str], tls: Option<ServerTls>) -> EtcdCluster {
        assert!(members == 1 || members == 3, "an etcd test cluster has 1 or 3 members, not {members}");
        check_installed();
        let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.subsec_nanos());
        let token = format!("meridian-test-{}-{sequence}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(&token);
        if let Err(error) = std::fs::create_dir_all(&dir) {
            panic!("cannot create {}: {error}", dir.display());
        }
        let ports = free_ports(members * 3);
        let members = (0..members)
            .map(|index| Member {
                name: format!("m{}", index + 1),
                client_port: ports[index * 3],
                peer_port: ports[index * 3 + 1],
                health_port: ports[index * 3 + 2],
                data_dir: dir.join(format!("m{}", index + 1)),
                log: dir.join(format!("m{}.log", index + 1)),
                process: None,
            })
            .collect();
        let extra_flags = extra_flags.iter().map(|flag| flag.to_string()).collect();
        let mut cluster = EtcdCluster { dir, token, extra_flags, tls, members };
        for index in 0..cluster.members.len() {
            cluster.spawn(index, "new");
        }
        for index in 0..cluster.members.len() {
            cluster.wait_healthy(index).await;
        }
        cluster
    }

    /// The members' client URLs, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|member| self.client_url(member)).collect()
    }

    fn client_url(&self, member: &Member) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", member.client_port)
    }

    /// Member `index`'s log file.
    pub fn log(&self, index: usize) -> &Path {
        &self.members[index].log
    }

    /// Kills member `index` with SIGKILL (by PID) and waits for it to exit.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut process) = self.members[index].process.take() {
            // It may have exited already; then there is nothing to kill.
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Starts member `index` again on its data directory and ports (it rejoins the cluster), and
    /// waits until it reports healthy (which needs a quorum).
    pub async fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index, "existing");
        self.wait_healthy(index).await;
    }

    /// Starts member `index` again without waiting for it: several killed members must all run
    /// before any of them can report healthy. Follow with [`EtcdCluster::wait_healthy`].
    pub fn start_again(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index, "existing");
    }

    /// Waits until member `index` answers `GET /health` with `"health":"true"` (on a plain HTTP
    /// metrics URL of its own), panicking after 30 s with its log's tail.
    pub async fn wait_healthy(&self, index: usize) {
        let member = &self.members[index];
        let started = Instant::now();
        while started.elapsed() < HEALTHY_WITHIN {
            if is_healthy(member.health_port).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "etcd member {} (client port {}, /health on port {}) did not report healthy within {HEALTHY_WITHIN:?}; its log {}:\n{}",
            member.name,
            member.client_port,
            member.health_port,
            member.log.display(),
            log_tail(&member.log)
        );
    }

    /// Kills every member (by PID).
    pub fn stop(&mut self) {
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }

    fn spawn(&mut self, index: usize, state: &str) {
        let initial_cluster = self
            .members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let client_url = self.client_url(&self.members[index]);
        let tls_flags: Vec<std::ffi::OsString> = match &self.tls {
            Some(tls) => vec![
                "--cert-file".into(),
                tls.cert.clone().into(),
                "--key-file".into(),
                tls.key.clone().into(),
                "--trusted-ca-file".into(),
                tls.ca.clone().into(),
                "--client-cert-auth".into(),
            ],
            None => Vec::new(),
        };
        let member = &mut self.members[index];
        let log = match File::options().create(true).append(true).open(&member.log) {
            Ok(log) => log,
            Err(error) => panic!("cannot open {}: {error}", member.log.display()),
        };
        let log_for_stdout = match log.try_clone() {
            Ok(log) => log,
            Err(error) => panic!("cannot open {} twice: {error}", member.log.display()),
        };
        let health_url = format!("http://127.0.0.1:{}", member.health_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let spawned = Command::new("etcd")
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster, "--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--listen-metrics-urls", &health_url])
            .args(&tls_flags)
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra_flags)
            .stdin(Stdio::null())
            .stdout(log_for_stdout)
            .stderr(log)
            .spawn();
        match spawned {
            Ok(process) => member.process = Some(process),
            Err(error) => panic!("cannot start etcd member {}: {error} (log {})", member.name, member.log.display()),
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
        // Best effort: a leftover directory under the temporary directory harms nothing.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn check_installed() {
    match Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            panic!("etcd is not installed: apt-get install etcd-server (scripts/test.sh installs it)")
        }
        Err(error) => panic!("cannot run etcd --version: {error}"),
    }
}

/// `count` distinct loopback ports that were free a moment ago, below the kernel's ephemeral
/// range ([`super::free_port`]): a stopped member must be able to start again on its ports.
fn free_ports(count: usize) -> Vec<u16> {
    (0..count)
        .map(|_| match super::free_port() {
            Ok(port) => port,
            Err(error) => panic!("cannot find a free loopback port: {error}"),
        })
        .collect()
}

/// Whether `GET /health` on the client port answers `"health":"true"` within a second or two.
async fn is_healthy(port: u16) -> bool {
    let check = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).contains("\"health\":\"true\""))
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), check).await, Ok(Some(true)))
}

fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        }
        Err(error) => format!("(cannot read it: {error})"),
    }
}
