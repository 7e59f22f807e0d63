//! The web console: a few static files embedded in the binary (no build step, no CDN) and the
//! one call they need besides the public REST API, `GET /console/session` (who the caller is).
//!
//! The page itself is plain HTML, CSS and JavaScript in `gateway/console/`. It reads the same
//! REST endpoints as the CLI (`/v1/clusters`, `/v1/tenants`, `/v1/jobs`, ...) with the caller's
//! bearer token and follows `/v1/events` for live updates, falling back to polling where the
//! stream is absent. The static files need no token; every data call does, as on the API.

mod assets;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::api::ApiError;
use crate::api::rest::RestState;
use crate::auth::Caller;

pub use assets::{ASSETS, Asset};

/// What the console's pages may load and talk to: only this origin, scripts and styles from
/// their own files (no inline script or style), no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes, merged into the REST router: the page at `/`, `/console` and
/// `/console/`, its files under `/console/`, and `GET /console/session`.
pub fn router() -> Router<RestState> {
    Router::new()
        .route("/", get(index))
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/{file}", get(file))
}

/// The page (every view is a `#/...` fragment of it).
async fn index(headers: HeaderMap) -> Response {
    match Asset::find("index.html") {
        Some(asset) => serve(asset, &headers),
        None => ApiError::NotFound("console page".into()).into_response(),
    }
}

/// One of the console's files, by name.
async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match Asset::find(&name) {
        Some(asset) => serve(asset, &headers),
        None => {
            let body = json!({"error": {"code": "not_found", "message": format!("the console has no file `{name}`"), "fields": []}});
            (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
        }
    }
}

/// Who the caller is, for the console's header and its cancel button: subject, role, tenants,
/// and whether the gateway authenticates at all. Answered 401 without a valid token when
/// authentication is on, like every data call.
/// `GET /console/session`: who the caller is (routed with the API's operations, see
/// `api::openapi`).
pub(crate) async fn session(State(state): State<RestState>, caller: Caller) -> Response {
    let body = json!({
        "subject": caller.subject,
        "role": caller.role,
        "tenants": caller.tenants,
        "authentication": state.auth.is_on(),
    });
    let mut response = axum::Json(body).into_response();
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `asset` with its security and cache headers, or `304 Not Modified` when the browser holds
/// this version (its `If-None-Match` names the asset's `ETag`).
pub fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let etag = asset.etag();
    let fresh = request
        .get(IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == etag || tag.trim() == "*"));
    let mut response =
        if fresh { StatusCode::NOT_MODIFIED.into_response() } else { (StatusCode::OK, asset.body).into_response() };
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(ETAG, value);
    }
    // The files change with the binary: revalidate on every load (a 304 costs one round trip).
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers
        .insert(HeaderName::from_static("content-security-policy"), HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    headers.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    headers.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn header<'a>(response: &'a Response, name: &str) -> &'a str {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    #[test]
    fn every_file_is_served_with_its_type_and_the_security_headers() {
        for asset in ASSETS {
            let response = serve(asset, &HeaderMap::new());
            assert_eq!(response.status(), StatusCode::OK, "{}", asset.name);
            assert_eq!(header(&response, "content-type"), asset.content_type);
            assert_eq!(header(&response, "content-security-policy"), CONTENT_SECURITY_POLICY);
            assert_eq!(header(&response, "x-content-type-options"), "nosniff");
            assert_eq!(header(&response, "cache-control"), "no-cache");
            assert!(header(&response, "etag").starts_with('"'), "{}", asset.name);
        }
    }

    #[test]
    fn a_browser_holding_the_current_version_gets_304() {
        let asset = Asset::find("app.js").unwrap();
        let mut request = HeaderMap::new();
        request.insert(IF_NONE_MATCH, HeaderValue::from_str(&format!("\"old\", {}", asset.etag())).unwrap());
        assert_eq!(serve(asset, &request).status(), StatusCode::NOT_MODIFIED);
        request.insert(IF_NONE_MATCH, HeaderValue::from_static("\"old\""));
        assert_eq!(serve(asset, &request).status(), StatusCode::OK);
    }

    #[test]
    fn the_policy_allows_no_inline_script_or_other_origin() {
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-inline"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-eval"));
        assert!(!CONTENT_SECURITY_POLICY.contains("http"));
        let page = std::str::from_utf8(Asset::find("index.html").unwrap().body).unwrap();
        // Every script is a same-origin file: the policy would block an inline one.
        for tag in page.split("<script").skip(1) {
            let open = &tag[..tag.find('>').unwrap()];
            assert!(open.contains("src=\"/console/"), "inline or foreign script: <script{open}>");
        }
        assert!(!page.contains(" style=\""), "inline style attributes are blocked by the policy");
        assert!(!page.contains("http://") && !page.contains("https://"), "the page loads nothing from elsewhere");
    }

    #[test]
    fn files_referenced_by_the_page_exist() {
        let page = std::str::from_utf8(Asset::find("index.html").unwrap().body).unwrap();
        for reference in page.split("\"/console/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(Asset::find(name).is_some(), "index.html refers to /console/{name}, which is not embedded");
        }
    }
}
