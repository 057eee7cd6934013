//! The HTTP API: [`build_router`] and its handlers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{HeaderValue, StatusCode, header};
use idempotency_client::status::{LookupRequest, LookupResponse, LookupResult, MissingKey};
use idempotency_guard::store::AnyStore;
use idempotency_guard::{Fingerprint, IdempotencyKey, Store};
use serde::{Deserialize, Serialize};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::{IntoParams, ToSchema};

use crate::auth::{Scope, Tokens};
use crate::problem::ApiProblem;
use crate::status::{held_status, key_status};

/// The most keys one lookup may name.
pub const MAX_LOOKUP_KEYS: usize = 1000;

/// The largest request body accepted (a lookup of 1000 keys of 255
/// characters, JSON-escaped, fits).
pub const BODY_LIMIT: usize = 1024 * 1024;

/// How long one store read may take before the answer is 503.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The scope and key `/readyz` reads to prove the store answers.
const READINESS_PROBE: (&str, &str) = ("readyz", "readyz");

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Where the records are.
    pub store: AnyStore,
    /// The bearer tokens and their scopes.
    pub tokens: Arc<Tokens>,
    /// Renders `/metrics`; `None` shows an empty page (tests install no recorder).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The `retry_after_seconds` hint for in-flight keys.
    pub retry_after: Duration,
    /// The admin tokens (see [`crate::admin`]); none: the admin API
    /// refuses every request.
    pub admin_tokens: Arc<crate::admin::AdminTokens>,
}

/// The service's router. Tests call it with `oneshot`; `serve` binds it.
pub fn build_router(state: AppState) -> Router {
    let keys = Router::new()
        .route("/v1/keys/lookup", post(lookup).get(get_key_named_lookup))
        .route("/v1/keys/{key}", get(get_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .merge(keys)
        .merge(crate::admin::router(state.clone()))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .route("/openapi.json", get(openapi_json))
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

/// Refuses requests without a known bearer token (401); passes the scope on.
async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    match state
        .tokens
        .authenticate(request.headers().get(header::AUTHORIZATION))
    {
        Some(scope) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        None => ApiProblem::Unauthorized.into_response(),
    }
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

/// Keys the status API answered for, by state (`absent` for a 404 or a
/// lookup miss): clients told to `reconcile` over and over point at
/// abandoned keys nobody has fixed.
pub const KEY_STATES_TOTAL: &str = "idempotency_status_key_states_total";

fn count_state(state: Option<idempotency_client::status::KeyState>) {
    use idempotency_client::status::KeyState;
    let label = match state {
        Some(KeyState::InFlight) => "in_flight",
        Some(KeyState::Completed) => "completed",
        Some(KeyState::Abandoned) => "abandoned",
        None => "absent",
    };
    metrics::counter!(KEY_STATES_TOTAL, "state" => label).increment(1);
}

/// The query of `GET /v1/keys/{key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KeyQuery {
    /// The fingerprint of the request the client would resend
    /// (`sha256:<64 lowercase hex>`); the answer then says whether it
    /// matches the record's.
    #[param(pattern = "^sha256:[0-9a-f]{64}$")]
    pub fingerprint: Option<String>,
}

/// Which of `keys` (without a record) a single-commit run holds: those are
/// in flight, never `retry`.
async fn held(state: &AppState, scope: &str, keys: &[&str]) -> Result<Vec<bool>, ApiProblem> {
    use idempotency_guard::store::admin::AdminStore;
    read(state.store.held_without_record(scope, keys)).await
}

async fn read<T>(
    future: impl std::future::Future<Output = Result<T, idempotency_guard::StoreError>>,
) -> Result<T, ApiProblem> {
    match tokio::time::timeout(STORE_TIMEOUT, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "store read failed");
            Err(ApiProblem::StoreUnavailable)
        }
        Err(_) => {
            tracing::warn!("store read timed out");
            Err(ApiProblem::StoreUnavailable)
        }
    }
}

fn valid_key(key: &str) -> Result<IdempotencyKey, ApiProblem> {
    IdempotencyKey::from_raw(key)
        .map_err(|error| ApiProblem::BadRequest(format!("invalid key: {error}")))
}

/// Tells what became of one key in the caller's scope.
#[utoipa::path(
    get,
    path = "/v1/keys/{key}",
    tag = "keys",
    params(
        ("key" = String, Path, description = "The idempotency key (1 to 255 visible ASCII characters), percent-encoded",
         min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        KeyQuery
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The key has a record", body = idempotency_client::status::KeyStatus),
        (status = 400, description = "Invalid key or fingerprint", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or an unknown one", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record in this scope: resending with the same key is safe (`advice: retry`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_key(
    State(state): State<AppState>,
    Extension(scope): Extension<Scope>,
    key: Result<Path<String>, PathRejection>,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Result<Response, ApiProblem> {
    let Path(key) = key.map_err(|rejection| ApiProblem::BadRequest(rejection.body_text()))?;
    let Query(query) = query.map_err(|rejection| ApiProblem::BadRequest(rejection.body_text()))?;
    answer_key(&state, &scope, &key, query.fingerprint.as_deref()).await
}

/// Tells what became of the key named `lookup` (the path is shared with
/// `POST /v1/keys/lookup`, so it is spelled out here).
#[utoipa::path(
    get,
    path = "/v1/keys/lookup",
    tag = "keys",
    params(KeyQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The key `lookup` has a record", body = idempotency_client::status::KeyStatus),
        (status = 400, description = "Invalid fingerprint", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or an unknown one", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record in this scope (`advice: retry`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_key_named_lookup(
    State(state): State<AppState>,
    Extension(scope): Extension<Scope>,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Result<Response, ApiProblem> {
    let Query(query) = query.map_err(|rejection| ApiProblem::BadRequest(rejection.body_text()))?;
    answer_key(&state, &scope, "lookup", query.fingerprint.as_deref()).await
}

async fn answer_key(
    state: &AppState,
    scope: &Scope,
    key: &str,
    fingerprint: Option<&str>,
) -> Result<Response, ApiProblem> {
    let key = valid_key(key)?;
    let fingerprint = fingerprint
        .map(|f| f.parse::<Fingerprint>())
        .transpose()
        .map_err(|error| ApiProblem::BadRequest(error.to_string()))?;
    let record = read(state.store.get(&scope.0, key.as_str())).await?;
    let mut status =
        record.and_then(|record| key_status(&record, fingerprint.as_ref(), state.retry_after));
    if status.is_none() && held(state, &scope.0, &[key.as_str()]).await?[0] {
        status = Some(held_status(key.as_str(), state.retry_after));
    }
    count_state(status.as_ref().map(|s| s.state));
    match status {
        Some(status) => Ok(Json(status).into_response()),
        None => Err(ApiProblem::KeyNotFound {
            key: key.into_string(),
        }),
    }
}

/// Looks up 1 to 1000 keys of the caller's scope at once, in order.
#[utoipa::path(
    post,
    path = "/v1/keys/lookup",
    tag = "keys",
    request_body = LookupRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One result per key, in order", body = LookupResponse),
        (status = 400, description = "Not 1 to 1000 valid keys, or not JSON", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or an unknown one", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body exceeds 1 MiB", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn lookup(
    State(state): State<AppState>,
    Extension(scope): Extension<Scope>,
    body: Result<Json<LookupRequest>, JsonRejection>,
) -> Result<Json<LookupResponse>, ApiProblem> {
    let Json(request) = body.map_err(|rejection| match rejection {
        JsonRejection::BytesRejection(_) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiProblem::BodyTooLarge { limit: BODY_LIMIT }
        }
        other => ApiProblem::BadRequest(other.body_text()),
    })?;
    if request.keys.is_empty() || request.keys.len() > MAX_LOOKUP_KEYS {
        return Err(ApiProblem::BadRequest(format!(
            "a lookup names 1 to {MAX_LOOKUP_KEYS} keys; this one names {}",
            request.keys.len()
        )));
    }
    for (index, key) in request.keys.iter().enumerate() {
        IdempotencyKey::from_raw(key).map_err(|error| {
            ApiProblem::BadRequest(format!("keys[{index}] is invalid: {error}"))
        })?;
    }
    let keys: Vec<&str> = request.keys.iter().map(String::as_str).collect();
    let records = read(state.store.get_many(&scope.0, &keys)).await?;
    let statuses: Vec<_> = records
        .into_iter()
        .map(|record| record.and_then(|record| key_status(&record, None, state.retry_after)))
        .collect();
    // Keys without a record may be held by a single-commit run.
    let absent: Vec<&str> = keys
        .iter()
        .zip(&statuses)
        .filter(|(_, status)| status.is_none())
        .map(|(key, _)| *key)
        .collect();
    let mut held_keys = if absent.is_empty() {
        Vec::new()
    } else {
        held(&state, &scope.0, &absent).await?
    }
    .into_iter();
    let results = request
        .keys
        .iter()
        .zip(statuses)
        .map(|(key, status)| {
            let status = match status {
                Some(status) => Some(status),
                None => held_keys
                    .next()
                    .unwrap_or(false)
                    .then(|| held_status(key, state.retry_after)),
            };
            count_state(status.as_ref().map(|s| s.state));
            match status {
                Some(mut status) => {
                    status.found = Some(true);
                    LookupResult::Found(status)
                }
                None => LookupResult::Missing(MissingKey {
                    key: key.clone(),
                    found: false,
                }),
            }
        })
        .collect();
    Ok(Json(LookupResponse { results }))
}

/// The body of `/healthz` and `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// Answers 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
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
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiProblem> {
    let (scope, key) = READINESS_PROBE;
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
pub async fn render_metrics(State(state): State<AppState>) -> Response {
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

/// This API's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object))
)]
pub async fn openapi_json() -> Response {
    let mut response = crate::openapi::document().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
