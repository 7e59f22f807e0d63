//! Harness for end-to-end tests: builds and starts the real `meridian gateway` and
//! `meridian-agent` processes on `127.0.0.1:0` ports, talks to them over REST, gRPC and the CLI,
//! and stops them when dropped.
//!
//! Most tests start a whole [`Federation`] (a gateway and its clusters, each described by
//! [`ClusterOptions`]); [`Gateway`] and [`Agent`] remain for set-ups it does not cover.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub mod browser;
pub mod cluster;
pub mod federation;
pub mod fuzzing;
pub mod ha;
pub mod manifests;
pub mod pki;
pub mod proxy;
pub mod witness;

use anyhow::{Context, Result, anyhow, bail};
use meridian_cli::client::Client;
use serde_json::Value;

pub use cluster::{ClusterOptions, H100_NODE, L4_HOST, Runner, agent_config};
pub use federation::{Federation, FederationBuilder, ProcessHost};
pub use pki::Pki;
pub use proxy::{ProxyMode, TcpProxy};

/// Paths of the two binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `meridian`.
    pub meridian: PathBuf,
    /// `meridian-agent`.
    pub agent: PathBuf,
}

/// Builds the binaries once per test process (a no-op when they are fresh) and returns their
/// paths. Building through cargo guarantees the tests never run stale binaries.
pub fn binaries() -> &'static Binaries {
    static BINARIES: OnceLock<Binaries> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&workspace)
            .args([
                "build",
                "--quiet",
                "-p",
                "meridian",
                "-p",
                "meridian-agent",
                "--bins",
                "--features",
                "meridian/etcd",
            ])
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("building the binaries failed: {other:?}"),
        }
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
        let dir = target.join("debug");
        Binaries { meridian: dir.join("meridian"), agent: dir.join("meridian-agent") }
    })
}

/// A child process killed on drop, with its stderr kept in a file for failure messages.
pub struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(mut command: Command, log: PathBuf) -> Result<Self> {
        let file = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .env("MERIDIAN_LOG", "info")
            .spawn()
            .context("spawning process")?;
        Ok(Self { child, log })
    }

    /// What the process wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (a name such as `STOP`, `CONT` or `TERM`) to the process with `kill(1)`.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let pid = self.child.id();
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed: {status}");
        }
        Ok(())
    }

    /// Stops the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running gateway.
pub struct Gateway {
    /// The process.
    pub proc: Proc,
    /// REST address.
    pub rest: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Its working directory (config, data, logs).
    pub dir: PathBuf,
    /// The CA its certificate chains to, when it serves TLS (`tls:` in its config): REST and
    /// the CLI then use https.
    pub ca: Option<PathBuf>,
}

impl Gateway {
    /// Starts a gateway with `config` (YAML) in `dir`, on free ports, and waits until it listens.
    pub async fn start(dir: &Path, config: &str) -> Result<Self> {
        Self::start_on(dir, config, "127.0.0.1:0", "127.0.0.1:0").await
    }

    /// Starts a gateway on the given REST and gRPC addresses (fixed ports survive a restart, so
    /// agents find the gateway again).
    pub async fn start_on(dir: &Path, config: &str, rest: &str, grpc: &str) -> Result<Self> {
        let config_path = dir.join("gateway.yaml");
        std::fs::write(&config_path, plain_unless_tls(config))?;
        let ready = dir.join("gateway.ready");
        let _ = std::fs::remove_file(&ready);
        let mut command = Command::new(&binaries().meridian);
        command.current_dir(dir).args(["gateway", "--config"]).arg(&config_path).args([
            "--listen",
            rest,
            "--grpc-listen",
            grpc,
            "--data-dir",
        ]);
        command.arg(dir.join("data")).arg("--ready-file").arg(&ready);
        let mut proc = Proc::spawn(command, dir.join("gateway.log"))?;
        let text = wait_for_file(&ready, &mut proc).await?;
        let addrs: Value = serde_json::from_str(&text)?;
        let rest = addrs["rest"].as_str().ok_or_else(|| anyhow!("ready file lacks rest"))?.parse()?;
        let grpc = addrs["grpc"].as_str().ok_or_else(|| anyhow!("ready file lacks grpc"))?.parse()?;
        Ok(Self { proc, rest, grpc, dir: dir.to_path_buf(), ca: None })
    }

    /// Starts a gateway that serves TLS: `config` has a `tls:` section; `ca` is the CA its
    /// certificate chains to (for the REST client and the CLI).
    pub async fn start_tls(dir: &Path, config: &str, ca: &Path) -> Result<Self> {
        let mut gateway = Self::start(dir, config).await?;
        gateway.ca = Some(ca.to_path_buf());
        Ok(gateway)
    }

    /// The REST address as the CLI takes it: `https://...` when the gateway serves TLS.
    pub fn rest_url(&self) -> String {
        match &self.ca {
            Some(_) => format!("https://{}", self.rest),
            None => self.rest.to_string(),
        }
    }

    /// A REST client for this gateway.
    pub fn client(&self) -> Client {
        let client = Client::new(&self.rest_url()).unwrap_or_else(|e| panic!("client for {}: {e}", self.rest));
        match &self.ca {
            Some(ca) => client.with_ca_file(ca).unwrap_or_else(|e| panic!("CA {}: {e}", ca.display())),
            None => client,
        }
    }

    /// Runs the `meridian` CLI against this gateway.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut command = Command::new(&binaries().meridian);
        command.args(args).env("MERIDIAN_GATEWAY", self.rest_url()).env_remove("MERIDIAN_CA");
        if let Some(ca) = &self.ca {
            command.env("MERIDIAN_CA", ca);
        }
        command.output().unwrap_or_else(|e| panic!("running meridian {args:?}: {e}"))
    }

    /// Waits until `count` clusters are connected and have reported GPUs.
    pub async fn wait_for_clusters(&self, count: usize) -> Result<Value> {
        self.wait_for_clusters_as(None, count).await
    }

    /// [`Gateway::wait_for_clusters`], asking with `token` (a gateway with `auth:` answers only
    /// callers with a token).
    pub async fn wait_for_clusters_as(&self, token: Option<&str>, count: usize) -> Result<Value> {
        let client = self.client().with_token(token.map(str::to_string));
        poll(Duration::from_secs(20), || async {
            let clusters = client.clusters().await.ok()?;
            let ready = clusters["clusters"]
                .as_array()?
                .iter()
                .filter(|c| c["connected"] == true && c["gpusTotal"].as_u64().unwrap_or(0) > 0)
                .count();
            (ready >= count).then_some(clusters)
        })
        .await
        .with_context(|| format!("{count} clusters did not connect; gateway log:\n{}", self.proc.log()))
    }

    /// Waits until job `id` is in `state` and returns it.
    pub async fn wait_for_state(&self, id: &str, state: &str, timeout: Duration) -> Result<Value> {
        let client = self.client();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = Value::Null;
        loop {
            if let Ok(job) = client.get(id).await {
                if job["state"] == state {
                    return Ok(job);
                }
                last = job;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("job {id} never reached {state}; last seen {last}\ngateway log:\n{}", self.proc.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A running member agent.
pub struct Agent {
    /// The process.
    pub proc: Proc,
}

impl Agent {
    /// Starts an agent with `config` (YAML, its `gateway` replaced by `gateway`'s address).
    pub fn start(dir: &Path, name: &str, config: &str, gateway: &Gateway) -> Result<Self> {
        Self::start_via(dir, name, config, gateway.grpc)
    }

    /// Starts an agent that dials `grpc` (a proxy in front of the gateway, say): over TLS when
    /// `config` has a `tls:` section, else in plain text with `insecure: true` added.
    pub fn start_via(dir: &Path, name: &str, config: &str, grpc: SocketAddr) -> Result<Self> {
        Self::start_with_env(dir, name, config, grpc, &[])
    }

    /// [`Agent::start_via`] with `env` added to the agent's environment (the jobs of the
    /// process runner inherit it).
    pub fn start_with_env(
        dir: &Path,
        name: &str,
        config: &str,
        grpc: SocketAddr,
        env: &[(String, String)],
    ) -> Result<Self> {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, plain_unless_tls(config))?;
        let scheme = if has_tls(config) { "https" } else { "http" };
        let mut command = Command::new(&binaries().agent);
        command.arg("--config").arg(&path).arg("--gateway").arg(format!("{scheme}://{grpc}"));
        command.envs(env.iter().map(|(key, value)| (key, value)));
        Ok(Self { proc: Proc::spawn(command, dir.join(format!("{name}.log")))? })
    }
}

/// Whether a YAML config has a top-level `tls:` section.
fn has_tls(config: &str) -> bool {
    config.lines().any(|line| line.starts_with("tls:"))
}

/// Tests written before TLS run their processes in plain text: `insecure: true` is added to a
/// config that sets neither `tls` nor `insecure`.
fn plain_unless_tls(config: &str) -> String {
    if has_tls(config) || config.lines().any(|line| line.starts_with("insecure:")) {
        config.to_string()
    } else {
        format!("insecure: true\n{config}")
    }
}

/// A port that was free a moment ago on 127.0.0.1, below the kernel's ephemeral range (see
/// [`meridian_store::testing::free_port`]).
pub use meridian_store::testing::free_port;

/// `GET /metrics` from a plain-HTTP metrics listener (an agent's `metrics.listen`) over
/// HTTP/1.0: the body, or None while nothing answers 200.
pub async fn scrape(addr: SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n").await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split_whitespace().nth(1)?;
    (status == "200").then(|| body.to_string())
}

/// Polls `check` every 50 ms until it yields a value or `timeout` passes. Tests wait for a
/// condition, never for a fixed time.
pub async fn poll<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("condition not met within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_file(path: &Path, proc: &mut Proc) -> Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.is_empty()
        {
            return Ok(text);
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            bail!("gateway exited with {status}:\n{}", proc.log());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("gateway did not start:\n{}", proc.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway config with quick placement rounds.
pub const GATEWAY_CONFIG: &str = "placementInterval: 200ms\nofferTimeout: 10s\nclusterTimeout: 10s\n";

/// The UTC timestamp that starts each line of a process log (tracing's default format), for
/// the first line that contains every one of `needles`.
pub fn log_time(log: &str, needles: &[&str]) -> Option<String> {
    log.lines()
        .find(|line| needles.iter().all(|n| line.contains(n)))
        .and_then(|line| line.split_whitespace().next())
        .map(str::to_string)
}

/// Seconds between two RFC 3339 UTC timestamps of the same day as tracing prints them
/// (`2026-12-03T07:05:01.123456Z`); `later - earlier`.
pub fn seconds_between(earlier: &str, later: &str) -> Option<f64> {
    fn seconds_of_day(stamp: &str) -> Option<f64> {
        let time = stamp.split('T').nth(1)?.trim_end_matches('Z');
        let mut parts = time.split(':');
        let hours: f64 = parts.next()?.parse().ok()?;
        let minutes: f64 = parts.next()?.parse().ok()?;
        let seconds: f64 = parts.next()?.parse().ok()?;
        Some(hours * 3600.0 + minutes * 60.0 + seconds)
    }
    Some(seconds_of_day(later)? - seconds_of_day(earlier)?)
}
