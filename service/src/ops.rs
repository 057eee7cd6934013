//! The operations endpoints: `/healthz`, `/readyz` and `/metrics`.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use idempotency_guard::{IdempotencyKey, Scope, Store};
use serde::Serialize;
use utoipa::ToSchema;

use crate::problem::ApiProblem;
use crate::state::{AppState, read};

/// The scope and key `/readyz` reads to prove the store answers.
static READINESS_PROBE: std::sync::LazyLock<(Scope, IdempotencyKey)> =
    std::sync::LazyLock::new(|| {
        (
            Scope::new("readyz").expect("a valid scope"),
            IdempotencyKey::from_raw("readyz").expect("a valid key"),
        )
    });
/// The body of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// Answers 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Answers 200 when the store answers, 503 otherwise.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "The store answers", body = Health),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiProblem> {
    let (scope, key) = &*READINESS_PROBE;
    read(state.store.get(scope, key)).await?;
    Ok(Json(Health { status: "ok" }))
}

/// Prometheus text exposition of the service's (and the guard's) metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain; version=0.0.4"))
)]
pub(crate) async fn render_metrics(State(state): State<AppState>) -> Response {
    let text = state
        .metrics
        .as_ref()
        .map(|handle| handle.render())
        .unwrap_or_default();
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
