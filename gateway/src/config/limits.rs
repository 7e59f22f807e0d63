//! The `limits:` section of the gateway config: what a REST client may hold and how fast it may
//! ask. The listener (`api/listener.rs`, `api/limits.rs`) and the guard (`api/guard.rs`) enforce
//! it.

use meridian_proto::duration::HumanDuration;
use serde::{Deserialize, Serialize};

/// The `limits:` section of the gateway config: connection caps, timeouts and the per-client
/// request rate of the REST API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// REST connections served at once, from all clients. Keep it well under the process's
    /// open-file limit (`ulimit -n`), which the gRPC port and the store share.
    pub max_connections: usize,
    /// REST connections served at once from one client address.
    pub max_connections_per_client: usize,
    /// Extra connections beyond the caps in which only `GET /healthz` is served; everything else
    /// gets 503 (gateway full) or 429 (client full). One address may hold a quarter of them.
    pub reserve_connections: usize,
    /// A request's head (request line and headers) must arrive within this; otherwise the
    /// connection is closed. It also bounds how long a kept-alive connection may sit idle
    /// between requests, and a TLS handshake.
    pub header_read_timeout: HumanDuration,
    /// A request's body must arrive within this, counted from the end of its head; otherwise the
    /// JSON 408 and the connection is closed.
    pub body_read_timeout: HumanDuration,
    /// An answer's bytes must be taken by the client within this each time the socket is full;
    /// otherwise the connection is closed (a client that does not read cannot hold it).
    pub write_timeout: HumanDuration,
    /// The whole life of a reserve connection (handshake, one request, its answer).
    pub reserve_timeout: HumanDuration,
    /// Requests per second one client address may make on average (`/healthz` is not counted).
    pub requests_per_second: f64,
    /// Requests one client address may make at once before the rate applies.
    pub request_burst: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_client: 512,
            reserve_connections: 32,
            header_read_timeout: HumanDuration::from_secs(10),
            body_read_timeout: HumanDuration::from_secs(30),
            write_timeout: HumanDuration::from_secs(30),
            reserve_timeout: HumanDuration::from_secs(2),
            requests_per_second: 200.0,
            request_burst: 400,
        }
    }
}

impl LimitsConfig {
    /// Problems with these values, each naming its field under `prefix` (e.g. `limits.`).
    pub fn problems(&self, prefix: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (field, value) in [
            ("maxConnections", self.max_connections),
            ("maxConnectionsPerClient", self.max_connections_per_client),
            ("reserveConnections", self.reserve_connections),
        ] {
            if value == 0 {
                problems.push(format!("{prefix}{field}: must be at least 1"));
            }
        }
        if self.max_connections_per_client > self.max_connections {
            problems.push(format!(
                "{prefix}maxConnectionsPerClient: {} is more than maxConnections ({})",
                self.max_connections_per_client, self.max_connections
            ));
        }
        for (field, value) in [
            ("headerReadTimeout", self.header_read_timeout),
            ("bodyReadTimeout", self.body_read_timeout),
            ("writeTimeout", self.write_timeout),
            ("reserveTimeout", self.reserve_timeout),
        ] {
            if value.0.is_zero() {
                problems.push(format!("{prefix}{field}: must be longer than 0s"));
            }
        }
        if !(self.requests_per_second.is_finite() && self.requests_per_second > 0.0) {
            problems.push(format!("{prefix}requestsPerSecond: {} must be a positive number", self.requests_per_second));
        }
        if self.request_burst == 0 {
            problems.push(format!("{prefix}requestBurst: must be at least 1"));
        }
        problems
    }

    /// Reserve slots one client address may hold at once.
    pub fn reserve_per_client(&self) -> usize {
        self.reserve_connections.div_ceil(4).max(1)
    }
}
