//! Harness for end-to-end tests: builds and starts the real `meridian gateway` and
//! `meridian-agent` processes on `127.0.0.1:0` ports, talks to them over REST, gRPC and the CLI,
//! and stops them when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub mod browser;
pub mod fuzzing;
pub mod manifests;
pub mod witness;

use anyhow::{Context, Result, anyhow, bail};
use meridian_gateway::client::Client;
use serde_json::Value;

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
            .args(["build", "--quiet", "-p", "meridian-gateway", "-p", "meridian-agent", "--bins"])
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
        let client = self.client();
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
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, plain_unless_tls(config))?;
        let scheme = if has_tls(config) { "https" } else { "http" };
        let mut command = Command::new(&binaries().agent);
        command.arg("--config").arg(&path).arg("--gateway").arg(format!("{scheme}://{grpc}"));
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

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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

/// A gateway and one agent, `gpu-host`: the builtin backend with the process runner on one
/// node of two L4s (no GPU discovery), in a temporary directory that the tests may use too.
pub struct ProcessHost {
    /// The gateway.
    pub gateway: Gateway,
    /// The agent.
    pub agent: Agent,
    /// Where both keep their files.
    pub dir: tempfile::TempDir,
}

impl ProcessHost {
    /// Starts the gateway with `gateway_config` and the agent with `killGrace: kill_grace`, and
    /// waits until the cluster is connected.
    pub async fn start(gateway_config: &str, kill_grace: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let host = format!(
            "cluster: gpu-host\nregion: us-east\nbackend: builtin\nrunner: process\n\
             process: {{gpuDiscovery: none, killGrace: {kill_grace}}}\nreportInterval: 300ms\n\
             nodes:\n  - {{shape: l4-host, count: 1, gpuType: l4, gpus: 2, cpu: 8, memoryGiB: 32}}\n"
        );
        let gateway = Gateway::start(dir.path(), gateway_config).await?;
        let agent = Agent::start(dir.path(), "gpu-host", &host, &gateway)?;
        gateway.wait_for_clusters(1).await?;
        Ok(Self { gateway, agent, dir })
    }
}

/// An agent config for a builtin cluster with the simulated runner. `nodes` is YAML list items (without the `nodes:` key).
pub fn agent_config(cluster: &str, region: &str, tier: &str, prices: &str, nodes: &str, time_scale: f64) -> String {
    format!(
        "cluster: {cluster}\nregion: {region}\ntier: {tier}\nprices: {prices}\nbackend: builtin\nrunner: simulated\n\
         queues: [{{name: default, weight: 1}}]\nnodes:\n{nodes}\ntimeScale: {time_scale}\nreportInterval: 300ms\n"
    )
}

/// A gateway config with quick placement rounds.
pub const GATEWAY_CONFIG: &str = "placementInterval: 200ms\nofferTimeout: 10s\nclusterTimeout: 10s\n";

/// What a [`TcpProxy`] does with the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards bytes both ways.
    Pass,
    /// Keeps connections open but forwards nothing (a partition that sends no RST: both ends
    /// see only silence). Held bytes flow again on `Pass`.
    Blackhole,
    /// Holds what the client sends (agent → gateway) while the other direction flows: the
    /// upstream hears nothing, the client hears everything. Held bytes flow again on `Pass`.
    CutToUpstream,
    /// Holds what the upstream sends (gateway → agent) while the other direction flows: the
    /// client hears nothing, the upstream hears everything. Held bytes flow again on `Pass`.
    CutToClient,
    /// Closes every connection and closes new ones at once (a link that is down).
    Down,
}

impl ProxyMode {
    /// Whether bytes going `direction` are held in this mode.
    fn holds(self, direction: Direction) -> bool {
        match self {
            ProxyMode::Blackhole => true,
            ProxyMode::CutToUpstream => direction == Direction::ToUpstream,
            ProxyMode::CutToClient => direction == Direction::ToClient,
            ProxyMode::Pass | ProxyMode::Down => false,
        }
    }
}

/// Which way a [`TcpProxy`] pump copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client → upstream (agent → gateway).
    ToUpstream,
    /// Upstream → client (gateway → agent).
    ToClient,
}

/// A TCP proxy on `127.0.0.1:0` in front of `upstream` that a test can cut or blackhole.
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: tokio::sync::watch::Sender<ProxyMode>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = tokio::sync::watch::channel(ProxyMode::Pass);
        let modes = mode.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                if *modes.borrow() == ProxyMode::Down {
                    drop(client);
                    continue;
                }
                let modes = modes.subscribe();
                connections.spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else { return };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    // Each side learns that the other closed only through its own direction,
                    // so a held direction hides the close too (as a real one-way partition
                    // would); the connection ends once both directions have ended.
                    let to_upstream = pump(client_read, server_write, Direction::ToUpstream, modes.clone());
                    let to_client = pump(server_read, client_write, Direction::ToClient, modes.clone());
                    let both = async { tokio::join!(to_upstream, to_client) };
                    tokio::select! {
                        _ = both => {}
                        () = wait_down(modes) => {}
                    }
                });
            }
        });
        Ok(Self { addr, mode, task })
    }

    /// Changes what the proxy does from now on.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_down(mut modes: tokio::sync::watch::Receiver<ProxyMode>) {
    let _ = modes.wait_for(|m| *m == ProxyMode::Down).await;
}

/// Copies bytes one way, holding them (and the end of the stream) while the mode holds
/// `direction`; returning drops `to`, which closes that side's writing half.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    direction: Direction,
    mut modes: tokio::sync::watch::Receiver<ProxyMode>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        // A read error ends the stream as the end of the stream does.
        let read = from.read(&mut buffer).await.unwrap_or(0);
        if modes.wait_for(|m| !m.holds(direction)).await.map(|m| *m).unwrap_or(ProxyMode::Down) == ProxyMode::Down
            || read == 0
        {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

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
