//! The key-status endpoints: `GET /v1/keys/{key}` and
//! `POST /v1/keys/lookup`, behind the scope tokens.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{StatusCode, header};
use idempotency_client::status::{LookupRequest, LookupResponse, LookupResult, MissingKey};
use idempotency_guard::{Fingerprint, IdempotencyKey, Store};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::problem::ApiProblem;
use crate::state::{AppState, BODY_LIMIT, read};
use crate::status::{held_status, key_status};
use crate::tokens::Scope;

/// The most keys one lookup may name.
pub(crate) const MAX_LOOKUP_KEYS: usize = 1000;
/// The key routes, behind the scope tokens (the caller merges them into
/// the service's router).
pub(crate) fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/v1/keys/lookup", post(lookup).get(get_key_named_lookup))
        .route("/v1/keys/{key}", get(get_key))
        .route_layer(middleware::from_fn_with_state(state, require_token))
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

/// Keys the status API answered for, by state (`absent` for a 404 or a
/// lookup miss): clients told to `reconcile` over and over point at
/// abandoned keys nobody has fixed.
pub(crate) const KEY_STATES_TOTAL: &str = "idempotency_status_key_states_total";

fn count_state(state: Option<idempotency_client::status::KeyState>) {
    use idempotency_client::status::KeyState;
    let label = match state {
        Some(KeyState::InFlight) => "in_flight",
        Some(KeyState::Completed) => "completed",
        Some(KeyState::Abandoned) => "abandoned",
        Some(KeyState::Resuming) => "resuming",
        None => "absent",
    };
    metrics::counter!(KEY_STATES_TOTAL, "state" => label).increment(1);
}

/// The query of `GET /v1/keys/{key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct KeyQuery {
    /// The fingerprint of the request the client would resend
    /// (`sha256:<64 lowercase hex>`); the answer then says whether it
    /// matches the record's.
    #[param(pattern = "^sha256:[0-9a-f]{64}$")]
    pub fingerprint: Option<String>,
}

/// Which of `keys` (without a record) a single-commit run holds: those are
/// in flight, never `retry`.
async fn held(state: &AppState, scope: &str, keys: &[&str]) -> Result<Vec<bool>, ApiProblem> {
    use idempotency_guard::store::AdminStore;
    read(state.store.held_without_record(scope, keys)).await
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
pub(crate) async fn get_key(
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
pub(crate) async fn get_key_named_lookup(
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
    let record = read(state.store.get(scope, &key)).await?;
    let mut status =
        record.and_then(|record| key_status(&record, fingerprint.as_ref(), state.retry_after));
    if status.is_none() && held(state, scope.as_str(), &[key.as_str()]).await?[0] {
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
pub(crate) async fn lookup(
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
    let keys = request
        .keys
        .iter()
        .enumerate()
        .map(|(index, key)| {
            IdempotencyKey::from_raw(key).map_err(|error| {
                ApiProblem::BadRequest(format!("keys[{index}] is invalid: {error}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let records = read(state.store.get_many(&scope, &keys)).await?;
    let statuses: Vec<_> = records
        .into_iter()
        .map(|record| record.and_then(|record| key_status(&record, None, state.retry_after)))
        .collect();
    // Keys without a record may be held by a single-commit run.
    let absent: Vec<&str> = keys
        .iter()
        .zip(&statuses)
        .filter(|(_, status)| status.is_none())
        .map(|(key, _)| key.as_str())
        .collect();
    let mut held_keys = if absent.is_empty() {
        Vec::new()
    } else {
        held(&state, scope.as_str(), &absent).await?
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
