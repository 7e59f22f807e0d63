//! The checks every REST request passes before it reaches a handler, and the one rule for every
//! error answer after it: a JSON body. In order: the request target's length (414), what the
//! connection is admitted for (reserve connections serve only `/healthz`), the path's encoding
//! (400), the client's request rate (429), then the body, read whole under a deadline and a size
//! limit (408, 413). Whatever the router answers with a status ≥ 400 and no JSON body (axum's
//! own rejections) is rewritten into the documented `{"error": {...}}` body.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, Method, Request};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;
use tower_service::Service;

use super::error::{ApiError, http};
use super::limits::{LimitsConfig, MAX_URI_BYTES, Refusal};
use super::query::check_path;
use super::rate::RateLimiter;

/// The largest request body read (a little over the largest job spec, so that the submit
/// handler still answers an oversize spec with its own 413 naming `spec`).
pub const MAX_BODY_BYTES: usize = meridian_proto::validate::MAX_SPEC_BYTES * 4;

/// Longest error text kept from a rejection of the HTTP layer.
const MAX_REJECTION_TEXT: usize = 4 * 1024;

/// What a connection was admitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every endpoint.
    Full,
    /// Only `GET /healthz`; anything else is refused for this reason.
    HealthOnly(Refusal),
}

/// The per-request checks in front of the REST router; cheap to clone (one per connection).
#[derive(Clone)]
pub struct Guard {
    router: Router,
    rate: Arc<RateLimiter<IpAddr>>,
    requests_per_second: f64,
    body_read_timeout: Duration,
    max_connections_per_client: usize,
}

impl Guard {
    /// Guards `router` with `limits`.
    pub fn new(router: Router, limits: &LimitsConfig) -> Self {
        Self {
            router,
            rate: Arc::new(RateLimiter::new(limits.requests_per_second, limits.request_burst)),
            requests_per_second: limits.requests_per_second,
            body_read_timeout: limits.body_read_timeout.0,
            max_connections_per_client: limits.max_connections_per_client,
        }
    }

    /// Answers `request` from `client` on a connection admitted for `access`.
    pub async fn handle<B>(mut self, request: Request<B>, client: IpAddr, access: Access) -> Response
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let health = request.method() == Method::GET && request.uri().path() == "/healthz";
        let target = request.uri().path_and_query().map_or(0, |target| target.as_str().len());
        if target > MAX_URI_BYTES {
            return closing(&ApiError::UriTooLong { length: target, limit: MAX_URI_BYTES });
        }
        if let Access::HealthOnly(refusal) = access
            && !health
        {
            return closing(&self.refusal(refusal));
        }
        if let Err(error) = check_path(request.uri().path()) {
            return http(&error);
        }
        if !health && let Err(wait) = self.rate.check(&client, Instant::now()) {
            let error = ApiError::RateLimited {
                what: format!(
                    "{client} sends more than {} requests per second (limits.requestsPerSecond)",
                    self.requests_per_second
                ),
                retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
            };
            return http(&error);
        }
        let (parts, body) = request.into_parts();
        let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return closing(&ApiError::BodyTooLarge { limit: MAX_BODY_BYTES });
        }
        let body =
            match tokio::time::timeout(self.body_read_timeout, Limited::new(body, MAX_BODY_BYTES).collect()).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
                    return closing(&ApiError::BodyTooLarge { limit: MAX_BODY_BYTES });
                }
                Ok(Err(error)) => {
                    let reason = format!("could not be read: {error}");
                    return closing(&ApiError::BadRequest { field: "body".into(), reason });
                }
                Err(_) => return closing(&ApiError::RequestTimeout(self.body_read_timeout)),
            };
        let request = Request::from_parts(parts, Body::from(body));
        let response = match self.router.call(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        uniform(response).await
    }

    fn refusal(&self, refusal: Refusal) -> ApiError {
        match refusal {
            Refusal::GatewayFull => ApiError::Overloaded(
                "the gateway serves as many connections as it may (limits.maxConnections); \
                 only /healthz is answered now, retry shortly"
                    .into(),
            ),
            Refusal::ClientFull => ApiError::RateLimited {
                what: format!(
                    "this client holds {} connections already (limits.maxConnectionsPerClient); \
                     reuse or close one",
                    self.max_connections_per_client
                ),
                retry_after_secs: 1,
            },
        }
    }
}

/// The JSON error, and the connection closed after it (its request may be unread).
fn closing(error: &ApiError) -> Response {
    let mut response = http(error);
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// `response` if it is a success or already JSON; otherwise the same status with the JSON error
/// body, keeping the headers that matter to the client.
pub async fn uniform(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MAX_REJECTION_TEXT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message =
        if text.is_empty() { status.canonical_reason().unwrap_or("the request was refused").to_string() } else { text };
    let mut rewritten = http(&ApiError::Rejected { status, message });
    for name in [ALLOW, RETRY_AFTER, CONNECTION, WWW_AUTHENTICATE] {
        if let Some(value) = parts.headers.get(&name) {
            rewritten.headers_mut().insert(name, value.clone());
        }
    }
    rewritten
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::pin::Pin;
    use std::task::{Context, Poll};

    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use http_body_util::Full;
    use meridian_proto::duration::HumanDuration;
    use serde_json::Value;

    use super::*;

    /// A body whose bytes never come.
    struct Stalled;

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    fn guard(limits: LimitsConfig) -> Guard {
        let router = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/echo", post(|body: Bytes| async move { body }));
        Guard::new(router, &limits)
    }

    fn client() -> IpAddr {
        IpAddr::from([10, 1, 2, 3])
    }

    fn request(method: Method, uri: &str, body: &'static str) -> Request<Full<Bytes>> {
        Request::builder().method(method).uri(uri).body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap()
    }

    async fn error_of(response: Response) -> (StatusCode, Value) {
        let status = response.status();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json", "{status}");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_the_connection_closed() {
        let limits = LimitsConfig { body_read_timeout: HumanDuration::from_secs(5), ..LimitsConfig::default() };
        let request = Request::builder().method(Method::POST).uri("/echo").body(Stalled).unwrap();
        let started = Instant::now();
        let response = guard(limits).handle(request, client(), Access::Full).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(response.headers()[CONNECTION], "close");
        let (status, body) = error_of(response).await;
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(body["error"]["code"], "request_timeout");
    }

    #[tokio::test]
    async fn framework_rejections_become_the_json_error_with_their_headers() {
        let response =
            guard(LimitsConfig::default()).handle(request(Method::PATCH, "/echo", ""), client(), Access::Full).await;
        assert_eq!(response.headers()[ALLOW], "POST");
        let (status, body) = error_of(response).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(body["error"]["code"], "method_not_allowed");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_reserve_connection_serves_only_healthz() {
        let guard = guard(LimitsConfig::default());
        let full = Access::HealthOnly(Refusal::GatewayFull);
        let health = guard.clone().handle(request(Method::GET, "/healthz", ""), client(), full).await;
        assert_eq!(health.status(), StatusCode::OK);
        let (status, body) =
            error_of(guard.clone().handle(request(Method::POST, "/echo", "x"), client(), full).await).await;
        assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")));
        let mine = Access::HealthOnly(Refusal::ClientFull);
        let response = guard.handle(request(Method::POST, "/echo", "x"), client(), mine).await;
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        let (status, _) = error_of(response).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }

    #[tokio::test(start_paused = true)]
    async fn the_request_rate_is_limited_per_client_but_not_for_healthz() {
        let limits = LimitsConfig { requests_per_second: 1.0, request_burst: 2, ..LimitsConfig::default() };
        let guard = guard(limits);
        for _ in 0..2 {
            let response = guard.clone().handle(request(Method::POST, "/echo", "x"), client(), Access::Full).await;
            assert_eq!(response.status(), StatusCode::OK);
        }
        let response = guard.clone().handle(request(Method::POST, "/echo", "x"), client(), Access::Full).await;
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(error_of(response).await.0, StatusCode::TOO_MANY_REQUESTS);
        let health = guard.clone().handle(request(Method::GET, "/healthz", ""), client(), Access::Full).await;
        assert_eq!(health.status(), StatusCode::OK);
        let other = guard.handle(request(Method::POST, "/echo", "x"), IpAddr::from([10, 9, 9, 9]), Access::Full).await;
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn long_targets_oversize_bodies_and_bad_paths_are_refused_before_the_router() {
        let guard = guard(LimitsConfig::default());
        let long = format!("/echo?q={}", "x".repeat(MAX_URI_BYTES));
        let response = guard.clone().handle(request(Method::GET, &long, ""), client(), Access::Full).await;
        assert_eq!(error_of(response).await.0, StatusCode::URI_TOO_LONG);

        let mut oversize = request(Method::POST, "/echo", "");
        oversize.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(MAX_BODY_BYTES + 1));
        let response = guard.clone().handle(oversize, client(), Access::Full).await;
        assert_eq!(response.headers()[CONNECTION], "close");
        assert_eq!(error_of(response).await.0, StatusCode::PAYLOAD_TOO_LARGE);

        let (status, body) =
            error_of(guard.handle(request(Method::GET, "/e%ffcho", ""), client(), Access::Full).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["fields"][0]["field"], "path");
    }
}
