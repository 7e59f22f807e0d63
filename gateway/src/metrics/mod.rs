//! Prometheus metrics of the gateway at `GET /metrics` on the REST listener (OpenMetrics text,
//! `prometheus-client`'s encoder).
//!
//! Almost everything is computed at scrape time from what the runtime publishes: the latest
//! [`ReadView`](meridian_core::ReadView) (clusters, tenants, jobs, and the core's
//! [`Tally`](meridian_core::Tally) of decisions, delays, burst use and data moved) and the
//! driver's [`Stats`](crate::runtime::stats::Stats) (commit latency, rounds, agent streams). So a
//! scrape reads one consistent snapshot, nothing is counted twice, and no task runs between
//! scrapes. `docs/operations.md (Metrics)` lists every metric.
//!
//! Who may scrape is [`MetricsConfig::access`]: by default open when the gateway has no `auth`
//! (every caller is an admin then anyway) and a bearer token when it has: the scrape token of
//! `metrics.tokenFile` (good for nothing but `/metrics`, so Prometheus never holds an API
//! token) or an admin's token. Metrics name tenants, clusters, queue depths and costs, which a
//! tenant's member should not read about other tenants.

pub mod encode;
pub mod fleet;
pub mod history;
pub mod queues;
pub mod runtime;
pub mod usage;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use meridian_proto::job::JobState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::api::ApiError;
use crate::auth::Authenticator;
use crate::auth::tokens::sha256;
use crate::runtime::{Handle, now_ms};

/// The media type of the answer (what `prometheus-client`'s text encoder writes).
pub const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub use crate::config::metrics::{MetricsAccess, MetricsConfig};

/// Why the metrics endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The scrape token file could not be read.
    #[error("metrics.tokenFile {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The scrape token file holds no token.
    #[error("metrics.tokenFile {0}: the file is empty; write the scrape token in it")]
    EmptyToken(PathBuf),
}

/// Who may read `/metrics`, ready to check requests.
pub struct ScrapeAccess {
    access: MetricsAccess,
    /// SHA-256 of the scrape token, if one is configured (compared as digests, so the
    /// comparison's time says nothing about the token).
    scrape_token: Option<[u8; 32]>,
    auth: Arc<Authenticator>,
}

/// The metrics registry and who may read it.
pub struct Metrics {
    registry: Registry,
    access: ScrapeAccess,
}

impl ScrapeAccess {
    /// The access `config` and `auth` give; reads the scrape token file now (before any port
    /// is bound, so a missing file is a start-up error).
    pub fn load(config: &MetricsConfig, auth: Arc<Authenticator>) -> Result<Self, Error> {
        let scrape_token = match &config.token_file {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| Error::TokenFile { path: path.clone(), source })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(Error::EmptyToken(path.clone()));
                }
                Some(sha256(token.as_bytes()))
            }
            None => None,
        };
        let access = config.effective_access(auth.is_on());
        Ok(Self { access, scrape_token, auth })
    }

    /// Who may read `/metrics`.
    pub fn access(&self) -> MetricsAccess {
        self.access
    }
}

impl Metrics {
    /// Sets up the registry over `handle`, served to callers `access` lets in.
    pub fn new(handle: Handle, access: ScrapeAccess) -> Self {
        let mut registry = Registry::default();
        usage::register(&mut registry, handle.clone());
        registry.register_collector(Box::new(GatewayCollector { handle }));
        Self { registry, access }
    }

    /// Who may read `/metrics`.
    pub fn access(&self) -> MetricsAccess {
        self.access.access
    }

    /// The exposition now, in the OpenMetrics text format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// The `/metrics` route, to merge into the REST router (no route when access is `off`).
    pub fn router(self: Arc<Self>) -> Router {
        if self.access() == MetricsAccess::Off {
            return Router::new();
        }
        Router::new().route("/metrics", get(scrape)).with_state(self)
    }
}

impl ScrapeAccess {
    /// Whether a request with these headers may read the metrics.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.access != MetricsAccess::Token {
            return Ok(());
        }
        let header = match headers.get(AUTHORIZATION).map(HeaderValue::to_str) {
            None => None,
            Some(Ok(text)) => Some(text),
            Some(Err(_)) => return Err(ApiError::Unauthenticated("the Authorization header is not ASCII".into())),
        };
        let token = header.and_then(|h| h.trim().split_once(' ')).and_then(|(scheme, token)| {
            (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then_some(token.trim())
        });
        if let (Some(token), Some(expected)) = (token, &self.scrape_token)
            && sha256(token.as_bytes()) == *expected
        {
            return Ok(());
        }
        if !self.auth.is_on() {
            return Err(ApiError::Unauthenticated(
                "reading /metrics needs `Authorization: Bearer <the scrape token of metrics.tokenFile>`".into(),
            ));
        }
        let caller = self.auth.authenticate(header).map_err(ApiError::from)?;
        if caller.is_admin() {
            Ok(())
        } else {
            Err(ApiError::Forbidden {
                subject: caller.subject,
                action: "read /metrics".into(),
                missing: "role admin (or the scrape token of metrics.tokenFile)".into(),
            })
        }
    }
}

async fn scrape(State(metrics): State<Arc<Metrics>>, headers: HeaderMap) -> Response {
    if let Err(error) = metrics.access.authorize(&headers) {
        return error.into_response();
    }
    // A scrape walks every job remembered (about 55 ms for 100,000 in a release build): off the
    // async workers, so it never holds up other requests.
    match tokio::task::spawn_blocking(move || metrics.render()).await {
        Ok(Ok(text)) => ([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], text).into_response(),
        Ok(Err(_)) | Err(_) => {
            tracing::error!("encoding the metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed").into_response()
        }
    }
}

/// The label value of a job state (lower case, as the API writes states).
pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Queued => "queued",
        JobState::Offered => "offered",
        JobState::Bound => "bound",
        JobState::Running => "running",
        JobState::Succeeded => "succeeded",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
        JobState::Unknown => "unknown",
    }
}

/// Everything the gateway computes at scrape time from the runtime's handle.
struct GatewayCollector {
    handle: Handle,
}

impl std::fmt::Debug for GatewayCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayCollector")
    }
}

impl Collector for GatewayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let view = self.handle.view();
        let now = now_ms();
        fleet::encode(&view, now, &mut encoder)?;
        queues::encode(&view, now, &mut encoder)?;
        history::encode(view.tally(), &mut encoder)?;
        runtime::encode(&self.handle.stats(), &view, &self.handle.role(), &mut encoder)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::GatewayConfig;

    #[test]
    fn scraping_is_open_without_auth_and_needs_a_token_with_it() {
        let config = MetricsConfig::default();
        assert_eq!(config.effective_access(false), MetricsAccess::Open);
        assert_eq!(config.effective_access(true), MetricsAccess::Token);
        let off = MetricsConfig { access: Some(MetricsAccess::Off), token_file: None };
        assert_eq!(off.effective_access(true), MetricsAccess::Off);
    }

    #[test]
    fn a_token_access_without_auth_needs_a_token_file_and_says_so() {
        let err = GatewayConfig::parse("insecure: true\nmetrics: {access: token}\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("metrics.access: `token` needs metrics.tokenFile"), "{err}");
        let err = GatewayConfig::parse("insecure: true\nmetrics: {tokenFile: t}\n", Path::new("g.yaml")).unwrap_err();
        assert!(err.to_string().contains("metrics.tokenFile: only used with metrics.access `token`"), "{err}");
        let ok = GatewayConfig::parse("insecure: true\nmetrics: {access: token, tokenFile: t}\n", Path::new("g.yaml"));
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn an_empty_scrape_token_file_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  \n").unwrap();
        let config = MetricsConfig { access: Some(MetricsAccess::Token), token_file: Some(path) };
        let err = ScrapeAccess::load(&config, Arc::new(Authenticator::off())).err().unwrap();
        assert!(matches!(err, Error::EmptyToken(_)), "{err}");
    }
}
