//! The admin endpoints (list, forget, release) and their JSON.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use idempotency_guard::store::admin::{
    AdminStore, ForgetRule, Forgotten, MAX_PAGE, PageRequest, StateFilter,
};
use idempotency_guard::{IdempotencyKey, Record, RecordState};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, ToSchema};

use super::AdminState;
use super::audit::audited;
use super::problem::AdminProblem;
use super::tokens::Admin;

/// How many records a listing returns when `limit` is not given.
pub const DEFAULT_PAGE: u32 = 100;

async fn store_call<T>(
    future: impl Future<Output = Result<T, idempotency_guard::StoreError>>,
) -> Result<T, AdminProblem> {
    match tokio::time::timeout(std::time::Duration::from_secs(10), future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "admin store operation failed");
            Err(AdminProblem::StoreUnavailable)
        }
        Err(_) => {
            tracing::warn!("admin store operation timed out");
            Err(AdminProblem::StoreUnavailable)
        }
    }
}

/// A scope as the store can hold it: 1 to 255 bytes, no control character
/// (PostgreSQL refuses a NUL in text: checked here, it is a 400, not a
/// store failure).
fn valid_scope(scope: &str) -> Result<(), AdminProblem> {
    use idempotency_guard::ScopeError;
    match idempotency_guard::Scope::new(scope) {
        Ok(_) => Ok(()),
        Err(ScopeError::ControlCharacter) => Err(AdminProblem::BadRequest(
            "a scope has no control characters".to_owned(),
        )),
        Err(_) => Err(AdminProblem::BadRequest(
            "a scope is 1 to 255 bytes".to_owned(),
        )),
    }
}

/// A listing cursor (`after`): a key, so 1 to 255 bytes without control
/// characters.
fn valid_cursor(after: Option<&str>) -> Result<(), AdminProblem> {
    match after {
        Some(after)
            if after.is_empty() || after.len() > 255 || after.chars().any(char::is_control) =>
        {
            Err(AdminProblem::BadRequest(
                "after is the next of an earlier page: 1 to 255 bytes, no control characters"
                    .to_owned(),
            ))
        }
        _ => Ok(()),
    }
}

fn valid_key(key: &str) -> Result<IdempotencyKey, AdminProblem> {
    IdempotencyKey::from_raw(key)
        .map_err(|error| AdminProblem::BadRequest(format!("invalid key: {error}")))
}

/// A record as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminRecord {
    /// The scope.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// `in_flight`, `completed` or `abandoned`.
    #[schema(pattern = "^(in_flight|completed|abandoned)$")]
    pub state: String,
    /// The fingerprint of the request that claimed the key.
    #[schema(pattern = "^sha256:[0-9a-f]{64}$")]
    pub fingerprint: String,
    /// That request's method.
    pub method: String,
    /// That request's path and query.
    pub path: String,
    /// Whether the record was claimed in transactional mode.
    pub transactional: bool,
    /// The stored response's status, once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    /// When the key was claimed (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When the response was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub completed_at: Option<String>,
    /// When the current (or last) lease ends.
    #[schema(format = DateTime)]
    pub lease_expires_at: String,
    /// When the record will be purged.
    #[schema(format = DateTime)]
    pub expires_at: String,
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

impl From<&Record> for AdminRecord {
    fn from(record: &Record) -> Self {
        Self {
            scope: record.scope.clone(),
            key: record.key.clone(),
            state: record.state().as_str().to_owned(),
            fingerprint: record.fingerprint.to_string(),
            method: record.method.clone(),
            path: record.path.clone(),
            transactional: record.transactional,
            response_status: record.response.as_ref().map(|r| r.status.as_u16()),
            created_at: rfc3339(record.created_at),
            completed_at: record.completed_at.map(rfc3339),
            lease_expires_at: rfc3339(record.lease_expires_at),
            expires_at: rfc3339(record.expires_at),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminPage {
    /// The records, by key in byte order.
    pub records: Vec<AdminRecord>,
    /// The `after` of the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// What an admin action did to one record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminAction {
    /// The scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// `forget` or `release`.
    #[schema(pattern = "^(forget|release)$")]
    pub action: String,
    /// The state the record was in when it was deleted.
    #[schema(pattern = "^(completed|abandoned)$")]
    pub previous_state: String,
}

/// The query of `GET /v1/admin/keys`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The scope to list (1 to 255 bytes, no control characters).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub scope: String,
    /// `any` (the default), `in_flight`, `completed` or `abandoned`.
    #[param(pattern = "^(any|in_flight|completed|abandoned)$")]
    pub state: Option<String>,
    /// Only keys after this one: the previous page's `next` (1 to 255
    /// bytes, no control characters).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub after: Option<String>,
    /// At most this many records (1 to 1000; default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// The query of `DELETE /v1/admin/keys/{scope}/{key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForgetQuery {
    /// Also forget an abandoned record (lease lapsed, outcome unknown). A
    /// live lease is never overridden.
    pub force: Option<bool>,
}

/// Lists a scope's records, by key, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    tag = "admin",
    params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One page of records", body = AdminPage),
        (status = 400, description = "Invalid scope, state, cursor or limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_keys(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<AdminPage>, AdminProblem> {
    let Query(query) =
        query.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&query.scope)?;
    valid_cursor(query.after.as_deref())?;
    let filter: StateFilter = query.state.as_deref().unwrap_or("any").parse().map_err(
        |error: idempotency_guard::store::admin::UnknownStateFilter| {
            AdminProblem::BadRequest(error.to_string())
        },
    )?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(AdminProblem::BadRequest(format!(
            "limit is 1 to {MAX_PAGE}"
        )));
    }
    audited(&admin, "list", &query.scope, "-", async {
        let page = store_call(state.store.list(
            &query.scope,
            filter,
            PageRequest {
                after: query.after.as_deref(),
                limit,
            },
        ))
        .await?;
        Ok((
            Json(AdminPage {
                records: page.records.iter().map(AdminRecord::from).collect(),
                next: page.next,
            }),
            "ok",
        ))
    })
    .await
}

/// Forgets a record as `rule` allows; a key without a record that a
/// single-commit run holds counts as in flight (kept), not as missing.
async fn forget(
    state: &AdminState,
    scope: &str,
    key: &str,
    rule: ForgetRule,
) -> Result<Forgotten, AdminProblem> {
    let forgotten = store_call(state.store.forget(scope, key, rule)).await?;
    if forgotten == Forgotten::Missing
        && store_call(state.store.held_without_record(scope, &[key])).await?[0]
    {
        return Ok(Forgotten::Refused(RecordState::InFlight));
    }
    Ok(forgotten)
}

fn forget_answer(
    scope: &str,
    key: &str,
    action: &'static str,
    forgotten: Forgotten,
) -> Result<(Json<AdminAction>, &'static str), AdminProblem> {
    let key_owned = || key.to_owned();
    match forgotten {
        Forgotten::Deleted(previous) => Ok((
            Json(AdminAction {
                scope: scope.to_owned(),
                key: key.to_owned(),
                action: action.to_owned(),
                previous_state: previous.as_str().to_owned(),
            }),
            if previous == RecordState::Completed {
                "deleted-completed"
            } else {
                "deleted-abandoned"
            },
        )),
        Forgotten::Missing => Err(AdminProblem::KeyNotFound { key: key_owned() }),
        Forgotten::Refused(RecordState::InFlight) => {
            Err(AdminProblem::InFlight { key: key_owned() })
        }
        Forgotten::Refused(RecordState::Abandoned) => {
            Err(AdminProblem::Abandoned { key: key_owned() })
        }
        Forgotten::Refused(RecordState::Completed) => {
            Err(AdminProblem::Completed { key: key_owned() })
        }
    }
}

/// Forgets a completed record (or, with `force=true`, an abandoned one):
/// the next request with the key runs.
#[utoipa::path(
    delete,
    path = "/v1/admin/keys/{scope}/{key}",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ForgetQuery
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record was deleted", body = AdminAction),
        (status = 400, description = "Invalid scope, key or query", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Kept: in flight (`request-in-flight`), or abandoned without `force=true` (`outcome-unknown`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn forget_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<ForgetQuery>, QueryRejection>,
) -> Result<Json<AdminAction>, AdminProblem> {
    let Path((scope, key)) =
        path.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    let Query(query) =
        query.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&scope)?;
    let key = valid_key(&key)?;
    let rule = if query.force.unwrap_or(false) {
        ForgetRule::CompletedOrAbandoned
    } else {
        ForgetRule::Completed
    };
    audited(&admin, "forget", &scope, key.as_str(), async {
        let forgotten = forget(&state, &scope, key.as_str(), rule).await?;
        forget_answer(&scope, key.as_str(), "forget", forgotten)
    })
    .await
}

/// Frees an abandoned key (lease lapsed, outcome unknown), so that a retry
/// runs: for after you reconciled what its first run did.
#[utoipa::path(
    post,
    path = "/v1/admin/keys/{scope}/{key}/release",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The abandoned record was deleted", body = AdminAction),
        (status = 400, description = "Invalid scope or key", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Kept: in flight (`request-in-flight`) or completed (`record-completed`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn release_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<AdminAction>, AdminProblem> {
    let Path((scope, key)) =
        path.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&scope)?;
    let key = valid_key(&key)?;
    audited(&admin, "release", &scope, key.as_str(), async {
        let forgotten = forget(&state, &scope, key.as_str(), ForgetRule::Abandoned).await?;
        forget_answer(&scope, key.as_str(), "release", forgotten)
    })
    .await
}
