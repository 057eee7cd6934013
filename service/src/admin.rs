//! The admin API: what an operator may do to one key, without SQL or
//! `redis-cli`.
//!
//! | endpoint | does |
//! |---|---|
//! | `GET /v1/admin/keys?scope=&state=&after=&limit=` | lists a scope's records (`state`: `any`, `in_flight`, `completed`, `abandoned`), by key, a page at a time (`next` is the `after` of the next page) |
//! | `DELETE /v1/admin/keys/{scope}/{key}` | forgets a completed record: its replay is gone, the next request with the key runs |
//! | `DELETE /v1/admin/keys/{scope}/{key}?force=true` | forgets a completed **or abandoned** record |
//! | `POST /v1/admin/keys/{scope}/{key}/release` | frees an abandoned key, so a retry runs (after you reconciled its unknown outcome) |
//!
//! A record whose lease is live (its handler is running) is never deleted,
//! with or without `force` (409 `request-in-flight`): deleting it would let
//! a retry run beside the handler. Once its lease lapses the record is
//! abandoned, and `force=true` (or `release`) may remove it: its outcome is
//! unknown, so removing it is a decision an operator takes explicitly,
//! which is why a plain `DELETE` refuses it (409 `outcome-unknown`).
//!
//! # Admin tokens
//!
//! Admin tokens are separate from scope tokens (a scope token answers 401
//! here, an admin token 401 on `/v1/keys`): `ADMIN_TOKENS_FILE` (or
//! `--admin-tokens-file`) holds one `<name> <scopes> <token>` line per
//! token, `#` starting a comment; `ADMIN_TOKENS` the same triples separated
//! by `;`. `<scopes>` is a comma-separated list of the scopes the token may
//! act on, or `*` for all; a scope outside it answers 403
//! `scope-forbidden`. `<name>` names the holder in audit lines (the token
//! itself is never logged).
//!
//! # Audit
//!
//! Every admin action, allowed or refused, writes one `INFO` line on the
//! `idempotency::audit` target with `who` (the token's name), `action`
//! (`list`, `forget`, `release`), `scope`, `key` (`-` for a listing),
//! `result` and `at` (RFC 3339, UTC), and is counted in
//! `idempotency_admin_actions_total{action, result}`.

use std::path::Path as FsPath;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{HeaderValue, StatusCode, header};
use idempotency_guard::problem::Problem as ProblemBody;
use idempotency_guard::store::admin::{
    AdminStore, ForgetRule, Forgotten, MAX_PAGE, PageRequest, StateFilter,
};
use idempotency_guard::{IdempotencyKey, Record, RecordState};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, ToSchema};

use crate::auth::MIN_TOKEN_LEN;
use crate::routes::AppState;

/// Admin actions, by action and result.
pub const ADMIN_ACTIONS_TOTAL: &str = "idempotency_admin_actions_total";

/// The log target of audit lines.
pub const AUDIT_TARGET: &str = "idempotency::audit";

/// How many records a listing returns when `limit` is not given.
pub const DEFAULT_PAGE: u32 = 100;

/// The scopes an admin token may act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scopes {
    /// Every scope (`*`).
    All,
    /// These scopes only.
    Only(Vec<String>),
}

impl Scopes {
    /// Whether `scope` is one of them.
    pub fn allows(&self, scope: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(scopes) => scopes.iter().any(|s| s == scope),
        }
    }
}

/// The holder of an admin token, as the handlers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    /// The token's name: who, in audit lines.
    pub name: String,
    /// The scopes it may act on.
    pub scopes: Scopes,
}

/// The configured admin tokens.
#[derive(Clone, Default)]
pub struct AdminTokens {
    entries: Vec<([u8; 32], Admin)>,
}

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTokens")
            .field("count", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// An admin tokens file or string could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminTokensError {
    /// The file could not be read.
    #[error("cannot read the admin tokens file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `<name> <scopes> <token>`.
    #[error("admin tokens line {line}: expected `<name> <scopes-comma-separated-or-*> <token>`")]
    Malformed {
        /// The line number, from 1.
        line: usize,
    },
    /// A token is shorter than [`MIN_TOKEN_LEN`].
    #[error("admin tokens line {line}: the token is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort {
        /// The line number, from 1.
        line: usize,
    },
    /// The same token appears twice.
    #[error("admin tokens line {line}: this token is already configured")]
    Duplicate {
        /// The line number, from 1.
        line: usize,
    },
}

impl AdminTokens {
    /// Reads `<name> <scopes> <token>` lines from a file.
    ///
    /// # Errors
    ///
    /// See [`AdminTokensError`].
    pub fn from_file(path: &FsPath) -> Result<Self, AdminTokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| AdminTokensError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut tokens = Self::default();
        tokens.add_lines(text.lines())?;
        Ok(tokens)
    }

    /// Adds `<name> <scopes> <token>` triples separated by `;` or newlines.
    ///
    /// # Errors
    ///
    /// See [`AdminTokensError`].
    pub fn add_triples(&mut self, triples: &str) -> Result<(), AdminTokensError> {
        self.add_lines(triples.split(['\n', ';']))
    }

    fn add_lines<'a>(
        &mut self,
        lines: impl Iterator<Item = &'a str>,
    ) -> Result<(), AdminTokensError> {
        for (index, text) in lines.enumerate() {
            let line = index + 1;
            let content = crate::tokens::content_of(text);
            if content.is_empty() {
                continue;
            }
            let mut fields = content.split_whitespace();
            let (Some(name), Some(scopes), Some(token), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(AdminTokensError::Malformed { line });
            };
            let scopes = if scopes == "*" {
                Scopes::All
            } else {
                let list: Vec<String> = scopes
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                if list.is_empty() || list.iter().any(|s| s.len() > 255 || s == "*") {
                    return Err(AdminTokensError::Malformed { line });
                }
                Scopes::Only(list)
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(AdminTokensError::TooShort { line });
            }
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if self.entries.iter().any(|(known, _)| *known == digest) {
                return Err(AdminTokensError::Duplicate { line });
            }
            self.entries.push((
                digest,
                Admin {
                    name: name.to_owned(),
                    scopes,
                },
            ));
        }
        Ok(())
    }

    /// How many admin tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no admin token is configured (then the admin API refuses
    /// every request).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The admin holding `presented`, if it is a configured token. Takes
    /// the same time whichever token matches, or none.
    pub fn admin_of(&self, presented: &str) -> Option<Admin> {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = subtle::Choice::from(0);
        let mut index = 0u64;
        for (i, (known, _)) in self.entries.iter().enumerate() {
            let matches = known.ct_eq(&presented);
            index = u64::conditional_select(&index, &(i as u64), matches);
            found |= matches;
        }
        bool::from(found)
            .then(|| usize::try_from(index).ok())
            .flatten()
            .and_then(|i| self.entries.get(i))
            .map(|(_, admin)| admin.clone())
    }

    /// The admin of an `Authorization: Bearer <token>` header value.
    pub fn authenticate(&self, authorization: Option<&HeaderValue>) -> Option<Admin> {
        let value = authorization?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.admin_of(token.trim())
    }
}

/// Why the admin API answered with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminProblem {
    /// 401 `unauthorized`: no admin token, or an unknown one (a scope
    /// token included).
    Unauthorized,
    /// 403 `scope-forbidden`: the admin token may not act on this scope.
    ScopeForbidden {
        /// The scope asked for.
        scope: String,
    },
    /// 400 `bad-request`: the request is malformed; the detail says how.
    BadRequest(String),
    /// 404 `key-not-found`: no record of this key in this scope.
    KeyNotFound {
        /// The key asked for.
        key: String,
    },
    /// 409 `request-in-flight`: the record's lease is live; it is never
    /// deleted.
    InFlight {
        /// The key.
        key: String,
    },
    /// 409 `outcome-unknown`: the record is abandoned; forgetting it needs
    /// `?force=true` (or `release`).
    Abandoned {
        /// The key.
        key: String,
    },
    /// 409 `record-completed`: `release` frees abandoned keys only; a
    /// completed record is forgotten with `DELETE`.
    Completed {
        /// The key.
        key: String,
    },
    /// 503 `store-unavailable`.
    StoreUnavailable,
}

impl AdminProblem {
    /// The `result` label and audit field of this refusal.
    fn result(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::ScopeForbidden { .. } => "forbidden",
            Self::BadRequest(_) => "bad-request",
            Self::KeyNotFound { .. } => "not-found",
            Self::InFlight { .. } => "refused-in-flight",
            Self::Abandoned { .. } => "refused-abandoned",
            Self::Completed { .. } => "refused-completed",
            Self::StoreUnavailable => "store-unavailable",
        }
    }
}

impl IntoResponse for AdminProblem {
    fn into_response(self) -> Response {
        let (status, name, title, detail) = match &self {
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "Send `Authorization: Bearer <token>` with an admin token (scope tokens are not admin tokens).".to_owned(),
            ),
            Self::ScopeForbidden { scope } => (
                StatusCode::FORBIDDEN,
                "scope-forbidden",
                "Scope forbidden",
                format!("This admin token may not act on scope {scope:?}."),
            ),
            Self::BadRequest(detail) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request", detail.clone()),
            Self::KeyNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "key-not-found",
                "Key not found",
                "No record of this key in this scope.".to_owned(),
            ),
            Self::InFlight { .. } => (
                StatusCode::CONFLICT,
                "request-in-flight",
                "Request in flight",
                "The record's handler is running (its lease is live): it is never deleted. Ask again once it finished or its lease lapsed.".to_owned(),
            ),
            Self::Abandoned { .. } => (
                StatusCode::CONFLICT,
                "outcome-unknown",
                "Outcome unknown",
                "The record is abandoned: its handler may or may not have had effects. Reconcile, then forget it with `?force=true` or free it with `POST .../release`.".to_owned(),
            ),
            Self::Completed { .. } => (
                StatusCode::CONFLICT,
                "record-completed",
                "Record completed",
                "`release` frees abandoned keys; forget a completed record with `DELETE`.".to_owned(),
            ),
            Self::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                "The idempotency store could not be reached. Try again shortly.".to_owned(),
            ),
        };
        let mut body = ProblemBody::new(status, name, title, &detail);
        match &self {
            Self::KeyNotFound { key }
            | Self::InFlight { key }
            | Self::Abandoned { key }
            | Self::Completed { key } => body = body.with("key", key),
            _ => {}
        }
        let mut response = body.into_response();
        match self {
            Self::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::StoreUnavailable => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            }
            _ => {}
        }
        response
    }
}

/// The admin routes (the caller merges them into the service's router).
pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/v1/admin/keys", get(list_keys))
        .route(
            "/v1/admin/keys/{scope}/{key}",
            axum::routing::delete(forget_key),
        )
        .route("/v1/admin/keys/{scope}/{key}/release", post(release_key))
        .route_layer(middleware::from_fn_with_state(state, require_admin_token))
}

/// Refuses requests without a known admin token (401); passes the admin on.
async fn require_admin_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    match state
        .admin_tokens
        .authenticate(request.headers().get(header::AUTHORIZATION))
    {
        Some(admin) => {
            request.extensions_mut().insert(admin);
            next.run(request).await
        }
        None => {
            metrics::counter!(ADMIN_ACTIONS_TOTAL, "action" => "any", "result" => "unauthorized")
                .increment(1);
            AdminProblem::Unauthorized.into_response()
        }
    }
}

/// Writes the audit line of one action and counts it.
fn audit(admin: &Admin, action: &'static str, scope: &str, key: &str, result: &'static str) {
    let at = OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default();
    tracing::info!(
        target: AUDIT_TARGET,
        who = %admin.name,
        action,
        scope,
        key,
        result,
        at = %at,
        "admin action"
    );
    metrics::counter!(ADMIN_ACTIONS_TOTAL, "action" => action, "result" => result).increment(1);
}

/// Runs one audited action: checks the scope, runs `work`, and writes the
/// audit line of whatever came of it.
async fn audited<T>(
    admin: &Admin,
    action: &'static str,
    scope: &str,
    key: &str,
    work: impl Future<Output = Result<(T, &'static str), AdminProblem>>,
) -> Result<T, AdminProblem> {
    if !admin.scopes.allows(scope) {
        let problem = AdminProblem::ScopeForbidden {
            scope: scope.to_owned(),
        };
        audit(admin, action, scope, key, problem.result());
        return Err(problem);
    }
    match work.await {
        Ok((value, result)) => {
            audit(admin, action, scope, key, result);
            Ok(value)
        }
        Err(problem) => {
            audit(admin, action, scope, key, problem.result());
            Err(problem)
        }
    }
}

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
    State(state): State<AppState>,
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
    state: &AppState,
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
    State(state): State<AppState>,
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
    State(state): State<AppState>,
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

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "admin-token-one-0123456789";
    const T2: &str = "admin-token-two-0123456789";

    #[test]
    fn reads_names_scopes_and_tokens() {
        let mut tokens = AdminTokens::default();
        tokens
            .add_triples(&format!(
                "# ops\nalice * {T1}  # everything\n;bob tenant-a,tenant-b {T2}"
            ))
            .unwrap();
        assert_eq!(tokens.len(), 2);
        let alice = tokens.admin_of(T1).unwrap();
        assert_eq!(
            (alice.name.as_str(), alice.scopes.clone()),
            ("alice", Scopes::All)
        );
        let bob = tokens.admin_of(T2).unwrap();
        assert!(bob.scopes.allows("tenant-b"));
        assert!(!bob.scopes.allows("tenant-c"));
        assert_eq!(tokens.admin_of("admin-token-three-0123456789"), None);
    }

    #[test]
    fn refuses_bad_lines_and_never_shows_tokens() {
        let mut tokens = AdminTokens::default();
        assert!(matches!(
            tokens.add_triples(&format!("alice {T1}")),
            Err(AdminTokensError::Malformed { line: 1 })
        ));
        assert!(matches!(
            tokens.add_triples("alice * short"),
            Err(AdminTokensError::TooShort { .. })
        ));
        assert!(matches!(
            tokens.add_triples(&format!("alice , {T1}")),
            Err(AdminTokensError::Malformed { .. })
        ));
        assert!(matches!(
            tokens.add_triples(&format!("a * {T1}\nb * {T1}")),
            Err(AdminTokensError::Duplicate { line: 2 })
        ));
        assert!(!format!("{tokens:?}").contains("admin-token"));
    }
}
