//! Three gateways on etcd, one elected leader, and member clusters whose agents know all three,
//! started together for the highly available gateway's end-to-end tests:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use meridian_e2e::ha::{HaFederation, witness_member};
//! let mut federation = HaFederation::builder("example")
//!     .cluster("east", witness_member("east", 1.0, 8))
//!     .start()
//!     .await?;
//! let (leader, _epoch) = federation.leader().await?;
//! federation.kill9(leader);
//! federation.restart(leader).await?;
//! # Ok(()) }
//! ```
//!
//! The etcd is the one the test command started (`MERIDIAN_ETCD_ENDPOINTS`) unless the test asks
//! for a private three-member cluster ([`HaBuilder::private_etcd`]: needed to kill members) or
//! none was started; every federation works under a key prefix of its own. Each gateway may
//! reach etcd through [`TcpProxy`]s of its own ([`HaBuilder::etcd_through_proxies`]), so a
//! test can cut one gateway from etcd while its agents keep their streams to it.
//!
//! Gateways listen on fixed ports, so agents (and the load's clients) find a restarted one
//! again. Each start of a gateway writes a log of its own (`gw-N/gateway.<k>.log`);
//! [`HaGateway::log`] joins them. Lines start with tracing's UTC timestamp, which
//! [`stamp_ns`] reads, so the tests can order what two gateways did. Set `MERIDIAN_HA_KEEP` to
//! keep the directory (configs, logs, witnesses) after a test.

pub mod http;
pub mod load;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use meridian_store::KeyRing;
use meridian_store::testing::etcd::{EtcdCluster, shared_endpoints, unique_prefix};
use serde_json::Value;

use crate::witness::{self, Ledger};
use crate::{ClusterOptions, Proc, ProxyMode, TcpProxy, binaries, free_port, plain_unless_tls, poll, wait_for_file};

/// The gateways' settings besides the store and `ha:` (which the fixture writes): quick
/// rounds, and a `lostJobTimeout` far beyond any failover here, so a failover never places a
/// running job again (every start past a job's first is a fault).
pub const HA_GATEWAY: &str = "placementInterval: 200ms\nofferTimeout: 5s\nclusterTimeout: 10s\nlostJobTimeout: 30s\n\
                              leaseMargin: 10s\nlimits: {requestsPerSecond: 100000, requestBurst: 100000}\n";

/// The leader's etcd lease and step-down margin (the defaults, written out).
pub const LEASE_TTL: Duration = Duration::from_secs(2);
/// See [`LEASE_TTL`].
pub const STEP_DOWN_MARGIN: Duration = Duration::from_millis(500);

/// How many gateways a federation has.
pub const GATEWAYS: usize = 3;

/// The flags every member of a private etcd runs with: the gateway's default batch limits.
pub const ETCD_FLAGS: [&str; 4] = ["--max-txn-ops", "1024", "--max-request-bytes", "8388608"];

/// The longest wait for anything the federation does on its own (an election, a start, agents
/// finding the leader).
const WAIT: Duration = Duration::from_secs(30);

/// Set to keep each federation's directory (configs, every log, the witnesses) after the test.
pub const KEEP_ENV: &str = "MERIDIAN_HA_KEEP";

/// How long a `/readyz` probe may take (a paused gateway accepts but never answers).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// One of the three gateways: its fixed addresses and the process of its current start.
pub struct HaGateway {
    /// `gw-1`, `gw-2`, `gw-3` (its `ha.name`).
    pub name: String,
    /// REST address.
    pub rest: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    dir: PathBuf,
    proc: Option<Proc>,
    /// The log of each start, oldest first.
    logs: Vec<PathBuf>,
}

impl HaGateway {
    /// Starts the gateway again (a new log) and waits until it listens.
    async fn start(&mut self) -> Result<()> {
        if self.proc.is_some() {
            bail!("{} is running already", self.name);
        }
        let ready = self.dir.join("gateway.ready");
        let _ = std::fs::remove_file(&ready);
        let log = self.dir.join(format!("gateway.{}.log", self.logs.len()));
        let mut command = Command::new(&binaries().meridian);
        command.current_dir(&self.dir).arg("gateway").arg("--config").arg(self.dir.join("gateway.yaml"));
        command.args(["--listen", &self.rest.to_string(), "--grpc-listen", &self.grpc.to_string()]);
        command.arg("--data-dir").arg(self.dir.join("data")).arg("--ready-file").arg(&ready);
        let mut proc = Proc::spawn(command, log.clone())?;
        self.logs.push(log);
        wait_for_file(&ready, &mut proc).await.with_context(|| format!("starting {}", self.name))?;
        self.proc = Some(proc);
        Ok(())
    }

    /// The first start: on ports that were free a moment ago, so another process may have taken
    /// one since; then it starts again on fresh ports (a few times). Later starts keep the ports
    /// (agents and clients know them).
    async fn first_start(&mut self) -> Result<()> {
        let mut attempt = 0;
        loop {
            match self.start().await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 3 && self.current_log().contains("in use") => {
                    attempt += 1;
                    self.rest = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                    self.grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
                    eprintln!("{}: a port was taken ({e:#}); starting on fresh ports", self.name);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The process, while it runs.
    pub fn proc(&self) -> Option<&Proc> {
        self.proc.as_ref()
    }

    /// Every start's log, oldest first, each after a `=== <name> start <k>` line.
    pub fn log(&self) -> String {
        let mut text = String::new();
        for (k, path) in self.logs.iter().enumerate() {
            text.push_str(&format!("=== {} start {k}\n", self.name));
            text.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
        text
    }

    /// The log of the current (or last) start.
    pub fn current_log(&self) -> String {
        self.logs.last().and_then(|path| std::fs::read_to_string(path).ok()).unwrap_or_default()
    }
}

/// Three gateways on etcd, the member clusters' agents, and the directory witnesses write to.
/// Dropping it tells the witnesses to stop, then stops the agents, the gateways, the proxies
/// and a private etcd, and removes the directory.
pub struct HaFederation {
    // Dropped in this order: agents first, so no job is started while the gateways go.
    agents: BTreeMap<String, Proc>,
    gateways: Vec<HaGateway>,
    etcd_links: Vec<Vec<TcpProxy>>,
    etcd: Option<EtcdCluster>,
    prefix: String,
    witnesses: PathBuf,
    dir: tempfile::TempDir,
}

/// How to start an [`HaFederation`].
pub struct HaBuilder {
    test: String,
    private_etcd: bool,
    etcd_proxies: bool,
    config: String,
    clusters: Vec<(String, ClusterOptions)>,
}

/// A member cluster for witness jobs: the builtin backend with the process runner (killGrace
/// 1 s) on one node of `gpus` declared H100s at `price` an hour; its jobs learn the cluster's
/// name from [`witness::CLUSTER_ENV`].
pub fn witness_member(name: &str, price: f64, gpus: u32) -> ClusterOptions {
    ClusterOptions::default()
        .prices(format!("{{h100: {price}}}"))
        .nodes(format!("  - {{shape: h100-node, count: 1, gpuType: h100, gpus: {gpus}, cpu: 96, memoryGiB: 1024}}\n"))
        .process_runner("1s")
        .env(witness::CLUSTER_ENV, name)
}

/// The spec of a one-GPU job that runs the witness `program` for `seconds`, writing to
/// `witnesses`, with idempotency key `key`.
pub fn witness_spec(program: &str, witnesses: &Path, name: &str, seconds: f64, key: &str) -> String {
    let quote = |text: &str| serde_json::Value::String(text.to_string()).to_string();
    format!(
        "name: {name}\ntenant: t\nidempotencyKey: {}\ngang: {{replicas: 1, resources: {{gpus: 1}}}}\n\
         runtime: {{estimate: 1m}}\npayload: {{command: [{}, \"{seconds}\"], env: {{{}: {}}}}}\n",
        quote(key),
        quote(program),
        witness::DIR_ENV,
        quote(&witnesses.display().to_string())
    )
}

impl HaBuilder {
    /// Starts a private three-member etcd (with [`ETCD_FLAGS`]) even when the test command
    /// started one: for tests that kill members.
    pub fn private_etcd(mut self) -> Self {
        self.private_etcd = true;
        self
    }

    /// Each gateway reaches each etcd member through a [`TcpProxy`] of its own
    /// ([`HaFederation::cut_from_etcd`]).
    pub fn etcd_through_proxies(mut self) -> Self {
        self.etcd_proxies = true;
        self
    }

    /// The gateways' settings besides store, secrets and `ha:` (default [`HA_GATEWAY`]).
    pub fn gateway_config(mut self, config: impl Into<String>) -> Self {
        self.config = config.into();
        self
    }

    /// Adds member cluster `name`, whose agent lists all three gateways.
    pub fn cluster(mut self, name: impl Into<String>, options: ClusterOptions) -> Self {
        self.clusters.push((name.into(), options));
        self
    }

    /// Starts etcd (unless shared), the three gateways, waits for a leader and two warm
    /// standbys, then starts the agents and waits until every cluster is connected to the
    /// leader.
    pub async fn start(self) -> Result<HaFederation> {
        let dir = tempfile::tempdir()?;
        let witnesses = dir.path().join("witness");
        std::fs::create_dir(&witnesses)?;
        let (etcd, endpoints) = match (self.private_etcd, shared_endpoints()) {
            (false, Some(endpoints)) => (None, endpoints),
            _ => {
                let cluster = EtcdCluster::start_with_flags(3, &ETCD_FLAGS).await;
                let endpoints = cluster.endpoints();
                (Some(cluster), endpoints)
            }
        };
        let key_file = dir.path().join("secrets.key");
        KeyRing::load_or_create(&key_file).context("creating the secrets key file")?;
        let prefix = unique_prefix(&self.test);
        let mut gateways = Vec::new();
        let mut etcd_links = Vec::new();
        for i in 0..GATEWAYS {
            let name = format!("gw-{}", i + 1);
            let gateway_dir = dir.path().join(&name);
            std::fs::create_dir(&gateway_dir)?;
            let mut links = Vec::new();
            let mut reach = Vec::new();
            for endpoint in &endpoints {
                if self.etcd_proxies {
                    let upstream: SocketAddr = endpoint
                        .trim_start_matches("http://")
                        .parse()
                        .with_context(|| format!("etcd endpoint {endpoint} is not http://host:port"))?;
                    let proxy = TcpProxy::start(upstream).await?;
                    reach.push(format!("http://{}", proxy.addr));
                    links.push(proxy);
                } else {
                    reach.push(endpoint.clone());
                }
            }
            let config = format!(
                "insecure: true\nstore:\n  kind: etcd\n  etcd:\n    endpoints: [{}]\n    prefix: {prefix}\n\
                 secrets:\n  keyFile: {}\nha:\n  name: {name}\n  leaseTtl: {}ms\n  stepDownMargin: {}ms\n{}",
                reach.join(", "),
                key_file.display(),
                LEASE_TTL.as_millis(),
                STEP_DOWN_MARGIN.as_millis(),
                self.config
            );
            std::fs::write(gateway_dir.join("gateway.yaml"), config)?;
            let rest = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            gateways.push(HaGateway { name, rest, grpc, dir: gateway_dir, proc: None, logs: Vec::new() });
            etcd_links.push(links);
        }
        let mut federation =
            HaFederation { agents: BTreeMap::new(), gateways, etcd_links, etcd, prefix, witnesses, dir };
        for gateway in &mut federation.gateways {
            gateway.first_start().await?;
        }
        let (leader, _) = federation.leader().await?;
        for i in 0..GATEWAYS {
            if i != leader {
                federation.wait_standby(i).await?;
            }
        }
        for (name, options) in &self.clusters {
            let agent = federation.spawn_agent(name, options)?;
            federation.agents.insert(name.clone(), agent);
        }
        federation.wait_clusters(leader).await?;
        Ok(federation)
    }
}

impl HaFederation {
    /// A federation for test `test` (its etcd prefix says so) with [`HA_GATEWAY`], shared etcd,
    /// direct etcd connections and no clusters yet.
    pub fn builder(test: &str) -> HaBuilder {
        HaBuilder {
            test: test.to_string(),
            private_etcd: false,
            etcd_proxies: false,
            config: HA_GATEWAY.to_string(),
            clusters: Vec::new(),
        }
    }

    /// Gateway `i` (0, 1 or 2).
    pub fn gateway(&self, i: usize) -> &HaGateway {
        &self.gateways[i]
    }

    /// The REST addresses of the three gateways, in order.
    pub fn rest_addrs(&self) -> Vec<SocketAddr> {
        self.gateways.iter().map(|g| g.rest).collect()
    }

    /// A REST client for gateway `i`.
    pub fn client(&self, i: usize) -> meridian_cli::client::Client {
        let rest = self.gateways[i].rest;
        meridian_cli::client::Client::new(&rest.to_string()).unwrap_or_else(|e| panic!("client for {rest}: {e}"))
    }

    /// The directory the witness jobs write to.
    pub fn witnesses(&self) -> &Path {
        &self.witnesses
    }

    /// Every copy of every job the witnesses recorded so far.
    pub fn ledger(&self) -> Result<Ledger> {
        Ok(Ledger::read(&self.witnesses)?)
    }

    /// The etcd key prefix of this federation.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The private etcd, to kill and restart members; an error for a shared one.
    pub fn etcd(&mut self) -> Result<&mut EtcdCluster> {
        self.etcd.as_mut().ok_or_else(|| anyhow!("this federation uses the shared etcd; start it with private_etcd()"))
    }

    /// What gateway `i` answers on `/readyz` (`{"role": "leader", "epoch": N}` or
    /// `{"role": "standby", "leader": {..}, "warm": true}`); None when it does not answer within
    /// a second (killed, paused, restarting).
    pub async fn readyz(&self, i: usize) -> Option<Value> {
        let answer = http::exchange(self.gateways[i].rest, "GET", "/readyz", None, PROBE_TIMEOUT).await.ok()?;
        Some(answer.json()).filter(|body| body.get("role").is_some())
    }

    /// Waits until exactly one gateway says it leads and returns it with its epoch.
    pub async fn leader(&self) -> Result<(usize, u64)> {
        self.leader_where(|_| true).await
    }

    /// Waits until exactly one gateway says it leads and it is not `old`.
    pub async fn new_leader(&self, old: usize) -> Result<(usize, u64)> {
        self.leader_where(|i| i != old).await
    }

    async fn leader_where(&self, accept: impl Fn(usize) -> bool) -> Result<(usize, u64)> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let mut roles = Vec::new();
            for i in 0..GATEWAYS {
                roles.push(self.readyz(i).await);
            }
            let leaders: Vec<(usize, u64)> = roles
                .iter()
                .enumerate()
                .filter_map(|(i, ready)| {
                    let ready = ready.as_ref()?;
                    (ready["role"] == "leader").then(|| (i, ready["epoch"].as_u64().unwrap_or(0)))
                })
                .collect();
            if let [(i, epoch)] = leaders.as_slice()
                && accept(*i)
            {
                return Ok((*i, *epoch));
            }
            if tokio::time::Instant::now() > deadline {
                bail!("no single (new) leader within {WAIT:?}; /readyz said {roles:?}\n{}", self.logs_tail(30));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until gateway `i` is a standby with its view loaded.
    pub async fn wait_standby(&self, i: usize) -> Result<Value> {
        poll(WAIT, || async {
            let ready = self.readyz(i).await?;
            (ready["role"] == "standby" && ready["warm"] == true).then_some(ready)
        })
        .await
        .map_err(|_| {
            anyhow!(
                "{} did not become a warm standby:\n{}",
                self.gateways[i].name,
                tail(&self.gateways[i].current_log(), 30)
            )
        })
    }

    /// Waits until gateway `i` lists every cluster as connected with GPUs, and the cluster was
    /// heard from in the last second (the leader's, not a view followed from the store).
    pub async fn wait_clusters(&self, i: usize) -> Result<()> {
        let client = self.client(i);
        let count = self.agents.len();
        if count == 0 {
            return Ok(());
        }
        poll(WAIT, || async {
            let clusters = client.clusters().await.ok()?;
            let ready = clusters["clusters"]
                .as_array()?
                .iter()
                .filter(|c| {
                    c["connected"] == true
                        && c["gpusTotal"].as_u64().unwrap_or(0) > 0
                        && c["lastSeenSecsAgo"].as_f64().is_some_and(|ago| ago < 1.0)
                })
                .count();
            (ready >= count).then_some(())
        })
        .await
        .map_err(|_| anyhow!("the clusters did not connect to {}:\n{}", self.gateways[i].name, self.logs_tail(20)))
    }

    /// Kills gateway `i` with SIGKILL and waits for it.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut proc) = self.gateways[i].proc.take() {
            proc.kill();
        }
    }

    /// Sends SIGTERM to gateway `i` and waits (at most 30 s) until it has exited.
    pub async fn sigterm(&mut self, i: usize) -> Result<()> {
        let gateway = &mut self.gateways[i];
        let Some(proc) = gateway.proc.as_mut() else { bail!("{} is not running", gateway.name) };
        proc.signal("TERM")?;
        let exited = poll(WAIT, || {
            let status = proc.child.try_wait();
            async move { status.ok().flatten() }
        })
        .await;
        match exited {
            Ok(_) => {
                gateway.proc = None;
                Ok(())
            }
            Err(_) => {
                bail!("{} did not exit within {WAIT:?} of SIGTERM:\n{}", gateway.name, tail(&gateway.current_log(), 30))
            }
        }
    }

    /// Pauses gateway `i` (SIGSTOP).
    pub fn sigstop(&self, i: usize) -> Result<()> {
        self.gateways[i].proc.as_ref().context("not running")?.signal("STOP")
    }

    /// Resumes gateway `i` (SIGCONT).
    pub fn sigcont(&self, i: usize) -> Result<()> {
        self.gateways[i].proc.as_ref().context("not running")?.signal("CONT")
    }

    /// Starts gateway `i` again (after [`HaFederation::kill9`] or [`HaFederation::sigterm`]) on
    /// its ports and waits until it listens.
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        self.gateways[i].start().await
    }

    /// Sets every proxy between gateway `i` and etcd to `mode`
    /// ([`HaBuilder::etcd_through_proxies`]).
    pub fn cut_from_etcd(&self, i: usize, mode: ProxyMode) -> Result<()> {
        if self.etcd_links[i].is_empty() {
            bail!("the gateways reach etcd directly; start with etcd_through_proxies()");
        }
        for proxy in &self.etcd_links[i] {
            proxy.set(mode);
        }
        Ok(())
    }

    /// What cluster `name`'s agent logged so far.
    pub fn agent_log(&self, name: &str) -> String {
        self.agents.get(name).map(Proc::log).unwrap_or_default()
    }

    /// The clusters' names.
    pub fn clusters(&self) -> Vec<String> {
        self.agents.keys().cloned().collect()
    }

    /// The last `lines` lines of every gateway's current log and every agent's log, for failure
    /// messages.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        for gateway in &self.gateways {
            text.push_str(&format!("--- {} (last start)\n{}\n", gateway.name, tail(&gateway.current_log(), lines)));
        }
        for (name, agent) in &self.agents {
            text.push_str(&format!("--- agent {name}\n{}\n", tail(&agent.log(), lines)));
        }
        text
    }

    /// Starts cluster `name`'s agent with the addresses of all three gateways.
    fn spawn_agent(&self, name: &str, options: &ClusterOptions) -> Result<Proc> {
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, plain_unless_tls(&options.config(name)))?;
        let gateways: Vec<String> = self.gateways.iter().map(|g| format!("http://{}", g.grpc)).collect();
        let mut command = Command::new(&binaries().agent);
        command.arg("--config").arg(&path).arg("--gateway").arg(gateways.join(","));
        command.envs(options.env.iter().map(|(key, value)| (key, value)));
        Proc::spawn(command, self.dir.path().join(format!("{name}.log")))
    }
}

impl Drop for HaFederation {
    fn drop(&mut self) {
        let _ = std::fs::write(self.witnesses.join(witness::STOP_FILE), "");
        if std::env::var_os(KEEP_ENV).is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("{KEEP_ENV}: kept {}", self.dir.path().display());
        }
        // A paused gateway would not stop on SIGTERM; SIGKILL (on drop) stops it anyway, but a
        // paused process also holds its ports until then.
        for gateway in &self.gateways {
            if let Some(proc) = &gateway.proc {
                let _ = proc.signal("CONT");
            }
        }
    }
}

/// The Unix time in ns of a log line's leading UTC timestamp as tracing prints it
/// (`2026-12-04T08:25:21.123456Z`); None for a line without one.
pub fn stamp_ns(line: &str) -> Option<u64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (ymd.next()?.ok()?, ymd.next()?.ok()?, ymd.next()?.ok()?);
    let mut hms = time.splitn(3, ':');
    let hours: u64 = hms.next()?.parse().ok()?;
    let minutes: u64 = hms.next()?.parse().ok()?;
    let seconds_text = hms.next()?;
    let (whole, fraction) = seconds_text.split_once('.').unwrap_or((seconds_text, ""));
    let seconds: u64 = whole.parse().ok()?;
    let digits: String = fraction.chars().take(9).collect();
    let nanos: u64 = if digits.is_empty() { 0 } else { format!("{digits:0<9}").parse().ok()? };
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    Some(((days * 24 + hours) * 60 + minutes) * 60 * 1_000_000_000 + seconds * 1_000_000_000 + nanos)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The first line of `log` stamped at or after `after_ns` that contains every one of
/// `needles`, with its time.
pub fn find_line<'a>(log: &'a str, needles: &[&str], after_ns: u64) -> Option<(u64, &'a str)> {
    log.lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .filter_map(|line| Some((stamp_ns(line)?, line)))
        .find(|(at, _)| *at >= after_ns)
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn a_tracing_timestamp_reads_as_unix_nanoseconds() {
        assert_eq!(stamp_ns("1970-01-01T00:00:01.5Z  INFO x"), Some(1_500_000_000));
        // 2026-12-04T08:25:21Z is 1796372721 (date -d @1796372721 -u).
        assert_eq!(stamp_ns("2026-12-04T08:25:21.000123Z  INFO leading"), Some(1_796_372_721_000_123_000));
        assert_eq!(stamp_ns("2024-02-29T23:59:59Z x"), Some(1_709_251_199_000_000_000));
        assert_eq!(stamp_ns("=== gw-1 start 0"), None);
    }

    #[test]
    fn the_first_matching_line_after_an_instant_is_found() {
        let log = "1970-01-01T00:00:01Z  INFO leading epoch=3\n1970-01-01T00:00:05Z  INFO offered job=a\n\
                   1970-01-01T00:00:09Z  INFO leading epoch=9\n";
        assert_eq!(find_line(log, &["leading"], 2_000_000_000).map(|(at, _)| at), Some(9_000_000_000));
        assert_eq!(find_line(log, &["offered", "job=a"], 0).map(|(at, _)| at), Some(5_000_000_000));
        assert!(find_line(log, &["offered"], 6_000_000_000).is_none());
    }

    #[test]
    fn a_witness_spec_names_its_key_program_and_directory() {
        let spec = witness_spec("/bin/witness", Path::new("/tmp/w"), "j", 1.5, "load-0-1");
        assert!(
            spec.contains("idempotencyKey: \"load-0-1\"") && spec.contains("[\"/bin/witness\", \"1.5\"]"),
            "{spec}"
        );
        assert!(spec.contains(&format!("{}: \"/tmp/w\"", witness::DIR_ENV)), "{spec}");
    }
}
