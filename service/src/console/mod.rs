//! The operators' console (`/console`, served when `CONSOLE=true`): one
//! HTML page, a stylesheet and a script embedded in the binary, with no
//! front-end build step.
//!
//! The page holds no data and no rule of its own: the script sends the
//! admin token the operator types once, to `POST /v1/admin/session`,
//! which answers with a session cookie (`HttpOnly`: the script never
//! sees it; see the admin API's `session`), and calls the admin API with
//! that cookie, so every read and every action goes through the same
//! endpoints, scopes and audit lines as `curl` would. The page keeps no
//! token. The assets are served without a session (they are the same for
//! everyone); the data is not.
//!
//! A filtered list follows the listing's `next` until it has a page of
//! matches or the range is read to its end, showing its progress, and
//! says "nothing" only then. The layout fits a 375 px wide screen.
//!
//! Everything the page shows from a record (keys, paths, headers, bodies:
//! client input) is put in the DOM as text (`textContent`), never as
//! markup, and the page is served with a Content-Security-Policy that
//! allows its own script and stylesheet only, no inline script, no other
//! origin, no framing.

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, header};

/// The page.
const INDEX_HTML: &str = include_str!("index.html");
/// The script.
const CONSOLE_JS: &str = include_str!("console.js");
/// The stylesheet.
const CONSOLE_CSS: &str = include_str!("console.css");

/// The Content-Security-Policy of every console answer.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /console`: the page.
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /console/console.js`: the script.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

/// `GET /console/console.css`: the stylesheet.
pub(crate) async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

/// The console's routes (the caller merges them only when the console is
/// on).
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/console.js", get(script))
        .route("/console/console.css", get(stylesheet))
}
