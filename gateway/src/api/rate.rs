//! Token-bucket rate limits keyed by who asks (a client address, a tenant). Shared by the
//! per-client request limit and the per-tenant submit quota, so both answer 429 the same way.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Keys remembered before idle full buckets are dropped (a full bucket carries no state).
const MAX_KEYS: usize = 65_536;

/// A token bucket per key: `burst` requests at once, refilled at `per_second`.
#[derive(Debug)]
pub struct RateLimiter<K> {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// A limiter allowing `per_second` requests per key on average and `burst` at once.
    /// `per_second` must be positive and `burst` at least 1 (config checks say so by field).
    pub fn new(per_second: f64, burst: u32) -> Self {
        Self { per_second, burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one token for `key` at `now`; `Err(wait)` says how long until one is free.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        // A poisoned lock only means another request panicked mid-update; the buckets are still
        // numbers, so keep going with them.
        let mut buckets = self.buckets.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_KEYS && !buckets.contains_key(key) {
            let (per_second, burst) = (self.per_second, self.burst);
            buckets.retain(|_, b| b.refilled(now, per_second, burst) < burst);
        }
        let bucket = buckets.entry(key.clone()).or_insert(Bucket { tokens: self.burst, at: now });
        let tokens = bucket.refilled(now, self.per_second, self.burst);
        if tokens >= 1.0 {
            *bucket = Bucket { tokens: tokens - 1.0, at: now };
            Ok(())
        } else {
            *bucket = Bucket { tokens, at: now };
            Err(Duration::from_secs_f64((1.0 - tokens) / self.per_second))
        }
    }
}

impl Bucket {
    fn refilled(&self, now: Instant, per_second: f64, burst: f64) -> f64 {
        (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * per_second).min(burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_next_request_waits_for_a_token() {
        let limiter = RateLimiter::new(2.0, 3);
        let now = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check(&"a", now).is_ok());
        }
        let wait = limiter.check(&"a", now).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // Another key has its own bucket.
        assert!(limiter.check(&"b", now).is_ok());
        // Half a second later one token is back.
        assert!(limiter.check(&"a", now + Duration::from_millis(500)).is_ok());
        assert!(limiter.check(&"a", now + Duration::from_millis(500)).is_err());
    }
}
