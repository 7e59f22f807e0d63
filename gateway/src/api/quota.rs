//! The per-tenant submit rate (`quota.submitsPerSecond` / `quota.submitBurst`), checked by the
//! REST and gRPC submit handlers once the spec has parsed (the tenant is in the spec) and before
//! anything reaches the core, so a refused submit stores nothing.

use std::collections::HashMap;

use tokio::time::Instant;

use super::error::ApiError;
use super::rate::RateLimiter;
use crate::config::{GatewayConfig, QuotaConfig};

/// Submit-rate limits of every tenant: one token bucket per tenant.
#[derive(Debug, Default)]
pub struct SubmitRate {
    /// Tenants with their own quota block: their limit, or None when the block sets no rate.
    own: HashMap<String, Option<Limit>>,
    /// Every other tenant, each with its own bucket at `defaultQuota`'s rate.
    default: Option<Limit>,
}

#[derive(Debug)]
struct Limit {
    limiter: RateLimiter<String>,
    per_second: f64,
    /// Where the limit is configured (`tenants.NAME.quota` or `defaultQuota`).
    source: String,
}

impl Limit {
    fn new(quota: &QuotaConfig, source: String) -> Option<Self> {
        let (per_second, burst) = quota.submit_rate()?;
        Some(Self { limiter: RateLimiter::new(per_second, burst), per_second, source })
    }
}

impl SubmitRate {
    /// The limits `config` sets (none at all by default).
    pub fn from_config(config: &GatewayConfig) -> Self {
        let own = config
            .tenants
            .iter()
            .filter_map(|(name, tenant)| {
                let quota = tenant.quota.as_ref()?;
                Some((name.clone(), Limit::new(quota, format!("tenants.{name}.quota"))))
            })
            .collect();
        Self { own, default: Limit::new(&config.default_quota, "defaultQuota".to_string()) }
    }

    /// Takes one submit of `tenant` now; over the rate, the 429 to answer.
    pub fn check(&self, tenant: &str) -> Result<(), ApiError> {
        self.check_at(tenant, Instant::now())
    }

    /// [`check`](Self::check) at `now`.
    pub fn check_at(&self, tenant: &str, now: Instant) -> Result<(), ApiError> {
        let limit = match self.own.get(tenant) {
            Some(own) => own.as_ref(),
            None => self.default.as_ref(),
        };
        let Some(limit) = limit else { return Ok(()) };
        limit.limiter.check(&tenant.to_string(), now).map_err(|wait| ApiError::RateLimited {
            what: format!(
                "tenant {tenant} may submit {} jobs per second ({}.submitsPerSecond)",
                limit.per_second, limit.source
            ),
            // Whole seconds, rounded up: a client that waits that long gets a token.
            retry_after_secs: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    fn rate(text: &str) -> SubmitRate {
        SubmitRate::from_config(&GatewayConfig::parse(&format!("insecure: true\n{text}"), Path::new("g.yaml")).unwrap())
    }

    #[test]
    fn a_tenant_over_its_submit_rate_is_told_when_to_retry() {
        let rate = rate("tenants: {nlp: {quota: {submitsPerSecond: 0.5, submitBurst: 2}}}\n");
        let now = Instant::now();
        assert!(rate.check_at("nlp", now).is_ok());
        assert!(rate.check_at("nlp", now).is_ok());
        match rate.check_at("nlp", now) {
            Err(ApiError::RateLimited { what, retry_after_secs }) => {
                assert_eq!(retry_after_secs, 2);
                assert!(what.contains("tenants.nlp.quota.submitsPerSecond"), "{what}");
            }
            other => panic!("expected 429, got {other:?}"),
        }
        assert!(rate.check_at("nlp", now + Duration::from_secs(2)).is_ok());
        assert!(rate.check_at("vision", now).is_ok(), "no default quota: no limit");
    }

    #[test]
    fn the_default_rate_gives_each_unlisted_tenant_its_own_bucket() {
        let rate = rate("tenants: {nlp: {quota: {maxGpus: 8}}}\ndefaultQuota: {submitsPerSecond: 1}\n");
        let now = Instant::now();
        assert!(rate.check_at("a", now).is_ok());
        assert!(matches!(rate.check_at("a", now), Err(ApiError::RateLimited { retry_after_secs: 1, .. })));
        assert!(rate.check_at("b", now).is_ok(), "another tenant has its own bucket");
        for _ in 0..10 {
            assert!(rate.check_at("nlp", now).is_ok(), "nlp's own quota block sets no rate");
        }
    }
}
