//! The service's router: [`build_router`] puts the key, admin, console
//! (when on) and operations routes together under the layers every request passes.

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::admin::{self, AdminState};
use crate::problem::ApiProblem;
use crate::state::{AppState, BODY_LIMIT};
use crate::{console, keys, openapi, ops};

/// The service's router. Tests call it with `oneshot`; `serve` binds it.
pub fn build_router(state: AppState) -> Router {
    let console = if state.console {
        console::router()
    } else {
        Router::new()
    };
    Router::new()
        .merge(keys::router(state.clone()))
        .merge(console)
        .merge(admin::router(AdminState::from_ref(&state)))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::render_metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .fallback(|| async { ApiProblem::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiProblem::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(count_requests))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            let id = request
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
        }))
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// Counts requests by endpoint and status, and times them.
async fn count_requests(request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("idempotency_status_requests_total", "endpoint" => endpoint.clone(), "status" => status).increment(1);
    metrics::histogram!("idempotency_status_request_duration_seconds", "endpoint" => endpoint)
        .record(started.elapsed());
    response
}
