//! The admin endpoints (list, show, forget, release, reconcile, export,
//! whoami) and their JSON.

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
use super::reconciled::Reconciliation;
use super::tokens::Admin;

/// How many records a listing returns when `limit` is not given.
pub const DEFAULT_PAGE: u32 = 100;

pub(super) async fn store_call<T>(
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
pub(super) fn valid_scope(scope: &str) -> Result<(), AdminProblem> {
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

pub(super) fn valid_key(key: &str) -> Result<IdempotencyKey, AdminProblem> {
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
    /// Whether a person must decide what became of it: abandoned (its
    /// lease lapsed before its handler finished, so its outcome is
    /// unknown) and not marked reconciled.
    #[serde(default)]
    pub needs_decision: bool,
    /// The operator's mark, when it was reconciled and kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<Reconciliation>,
}

pub(super) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

impl From<&Record> for AdminRecord {
    fn from(record: &Record) -> Self {
        Self::new(record, None)
    }
}

impl AdminRecord {
    /// The record as the admin API shows it, with its reconciled mark.
    pub fn new(record: &Record, reconciled: Option<Reconciliation>) -> Self {
        Self {
            scope: record.scope.as_str().to_owned(),
            key: record.key.as_str().to_owned(),
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
            needs_decision: StateFilter::Abandoned.accepts(record) && reconciled.is_none(),
            reconciled,
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
    /// `true`: only the records that need a decision (abandoned, not
    /// marked reconciled); `false`: only the others.
    pub needs_decision: Option<bool>,
    /// Only records whose request had this method (`POST`).
    #[param(min_length = 1, max_length = 32, pattern = "^[!-~]+$")]
    pub method: Option<String>,
    /// Only records whose request's path (and query) starts with this
    /// (`/payments`).
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub path_prefix: Option<String>,
    /// Only records claimed at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_after: Option<String>,
    /// Only records claimed before this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_before: Option<String>,
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

/// The query of `GET /v1/admin/keys.csv`: the listing's filters, without
/// paging (every matching record, up to [`EXPORT_MAX_ROWS`]).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// The scope to export (1 to 255 bytes, no control characters).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub scope: String,
    /// `any` (the default), `in_flight`, `completed` or `abandoned`.
    #[param(pattern = "^(any|in_flight|completed|abandoned)$")]
    pub state: Option<String>,
    /// `true`: only the records that need a decision (finance's list);
    /// `false`: only the others.
    pub needs_decision: Option<bool>,
    /// Only records whose request had this method.
    #[param(min_length = 1, max_length = 32, pattern = "^[!-~]+$")]
    pub method: Option<String>,
    /// Only records whose request's path (and query) starts with this.
    #[param(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub path_prefix: Option<String>,
    /// Only records claimed at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_after: Option<String>,
    /// Only records claimed before this time (RFC 3339).
    #[param(format = DateTime)]
    pub created_before: Option<String>,
    /// Start after this key (the `x-next-after` header of a truncated
    /// export).
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub after: Option<String>,
}

/// The query of the actions (`release`, `forget`, `reconcile`).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReasonQuery {
    /// Why the operator acts (1 to 500 characters, no control
    /// characters): written to the audit line.
    #[param(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub reason: Option<String>,
}

/// The query of `POST /v1/admin/keys/{scope}/{key}/reconcile`: the reason
/// is required.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RequiredReasonQuery {
    /// Why the record is kept (1 to 500 characters, no control
    /// characters): written to the audit line and the mark.
    #[param(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub reason: String,
}

/// The query of `DELETE /v1/admin/keys/{scope}/{key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ForgetQuery {
    /// Also forget an abandoned record (lease lapsed, outcome unknown). A
    /// live lease is never overridden.
    pub force: Option<bool>,
    /// Why the operator acts (1 to 500 characters, no control
    /// characters): written to the audit line.
    #[param(
        min_length = 1,
        max_length = 500,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"
    )]
    pub reason: Option<String>,
}

/// An operator's reason: 1 to 500 characters, no control characters (an
/// audit line stays one line).
pub(super) fn valid_reason(reason: Option<&str>) -> Result<Option<&str>, AdminProblem> {
    match reason {
        Some(reason)
            if reason.is_empty()
                || reason.chars().count() > 500
                || reason.chars().any(char::is_control) =>
        {
            Err(AdminProblem::BadRequest(
                "reason is 1 to 500 characters, no control characters".to_owned(),
            ))
        }
        reason => Ok(reason),
    }
}

fn parse_time(name: &str, value: Option<&str>) -> Result<Option<OffsetDateTime>, AdminProblem> {
    value
        .map(|value| {
            OffsetDateTime::parse(value, &Rfc3339).map_err(|_| {
                AdminProblem::BadRequest(format!(
                    "{name} is an RFC 3339 time (2026-01-31T12:00:00Z)"
                ))
            })
        })
        .transpose()
}

/// The filters of a listing or an export, checked.
#[derive(Debug, Clone)]
pub(super) struct Filters {
    state: StateFilter,
    /// No record can pass (`needs_decision=true` with a state other than
    /// `any` or `abandoned`).
    nothing: bool,
    needs_decision: Option<bool>,
    method: Option<String>,
    path_prefix: Option<String>,
    created_after: Option<OffsetDateTime>,
    created_before: Option<OffsetDateTime>,
}

impl Filters {
    fn parse(
        state: Option<&str>,
        needs_decision: Option<bool>,
        method: Option<&str>,
        path_prefix: Option<&str>,
        created_after: Option<&str>,
        created_before: Option<&str>,
    ) -> Result<Self, AdminProblem> {
        let mut state: StateFilter = state.unwrap_or("any").parse().map_err(
            |error: idempotency_guard::store::admin::UnknownStateFilter| {
                AdminProblem::BadRequest(error.to_string())
            },
        )?;
        // The records that need a decision are abandoned ones: with
        // another state, nothing passes both filters.
        let mut nothing = false;
        if needs_decision == Some(true) {
            match state {
                StateFilter::Any | StateFilter::Abandoned => state = StateFilter::Abandoned,
                StateFilter::InFlight | StateFilter::Completed => nothing = true,
            }
        }
        if let Some(method) = method
            && (method.is_empty()
                || method.len() > 32
                || !method.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(AdminProblem::BadRequest(
                "method is 1 to 32 printable ASCII characters".to_owned(),
            ));
        }
        if let Some(prefix) = path_prefix
            && (prefix.is_empty()
                || prefix.chars().count() > 1024
                || prefix.chars().any(char::is_control))
        {
            return Err(AdminProblem::BadRequest(
                "path_prefix is 1 to 1024 characters, no control characters".to_owned(),
            ));
        }
        Ok(Self {
            state,
            nothing,
            needs_decision,
            method: method.map(str::to_owned),
            path_prefix: path_prefix.map(str::to_owned),
            created_after: parse_time("created_after", created_after)?,
            created_before: parse_time("created_before", created_before)?,
        })
    }

    /// Whether `record` passes the filters the store does not apply.
    fn accepts(&self, record: &AdminRecord, raw: &Record) -> bool {
        self.needs_decision
            .is_none_or(|needs| needs == record.needs_decision)
            && self
                .method
                .as_deref()
                .is_none_or(|method| raw.method.eq_ignore_ascii_case(method))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| raw.path.starts_with(prefix))
            && self.created_after.is_none_or(|at| raw.created_at >= at)
            && self.created_before.is_none_or(|at| raw.created_at < at)
    }
}

/// How many store pages one listing reads at most to fill a page when
/// filters leave records out (`next` then resumes where it stopped).
const SCAN_PAGES: u32 = 10;

/// The most rows one CSV export holds (`x-next-after` names where the
/// next one starts).
pub const EXPORT_MAX_ROWS: usize = 100_000;

/// Reads up to `limit` records of `scope` that pass `filters`, from after
/// `after`, at most `pages` store pages: the records and the cursor of
/// what follows (`None` at the end).
pub(super) async fn scan(
    state: &AdminState,
    scope: &str,
    filters: &Filters,
    after: Option<&str>,
    limit: u32,
    pages: u32,
) -> Result<(Vec<AdminRecord>, Option<String>), AdminProblem> {
    if filters.nothing {
        return Ok((Vec::new(), None));
    }
    let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut cursor = after.map(str::to_owned);
    let mut found = Vec::new();
    for _ in 0..pages {
        let page = store_call(state.store.list(
            scope,
            filters.state,
            PageRequest {
                after: cursor.as_deref(),
                limit,
            },
        ))
        .await?;
        let count = page.records.len();
        for (index, raw) in page.records.iter().enumerate() {
            let record = AdminRecord::new(raw, state.reconciled.of(raw));
            if !filters.accepts(&record, raw) {
                continue;
            }
            found.push(record);
            if found.len() == wanted {
                let more = index + 1 < count || page.next.is_some();
                return Ok((found, more.then(|| raw.key.as_str().to_owned())));
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok((found, None)),
        }
    }
    Ok((found, cursor))
}

/// Lists a scope's records, by key, a page at a time.
///
/// With filters beyond `state` (`needs_decision`, `method`,
/// `path_prefix`, `created_after`, `created_before`), a page may hold
/// fewer than `limit` records (even none) and still have a `next`: keep
/// following `next` until it is absent.
#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    tag = "admin",
    params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One page of records", body = AdminPage),
        (status = 400, description = "Invalid scope, filter, cursor or limit", body = crate::problem::Problem, content_type = "application/problem+json"),
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
    let filters = Filters::parse(
        query.state.as_deref(),
        query.needs_decision,
        query.method.as_deref(),
        query.path_prefix.as_deref(),
        query.created_after.as_deref(),
        query.created_before.as_deref(),
    )?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(AdminProblem::BadRequest(format!(
            "limit is 1 to {MAX_PAGE}"
        )));
    }
    audited(&admin, "list", &query.scope, "-", None, async {
        let (records, next) = scan(
            &state,
            &query.scope,
            &filters,
            query.after.as_deref(),
            limit,
            SCAN_PAGES,
        )
        .await?;
        Ok((Json(AdminPage { records, next }), "ok"))
    })
    .await
}

/// One cell of a CSV line: quoted, quotes doubled, and a leading `=`,
/// `+`, `-`, `@`, tab or CR prefixed with `'` so that a spreadsheet does
/// not run it as a formula (a key or a path is client input).
fn csv_cell(value: &str) -> String {
    let guarded = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    format!("\"{}\"", guarded.replace('"', "\"\""))
}

/// The CSV columns, in order.
const CSV_COLUMNS: [&str; 15] = [
    "scope",
    "key",
    "state",
    "needs_decision",
    "method",
    "path",
    "fingerprint",
    "response_status",
    "created_at",
    "completed_at",
    "lease_expires_at",
    "expires_at",
    "reconciled_at",
    "reconciled_by",
    "reconcile_reason",
];

fn csv_line(record: &AdminRecord) -> String {
    let status = record
        .response_status
        .map(|s| s.to_string())
        .unwrap_or_default();
    let mark = record.reconciled.as_ref();
    let cells = [
        record.scope.as_str(),
        &record.key,
        &record.state,
        if record.needs_decision {
            "true"
        } else {
            "false"
        },
        &record.method,
        &record.path,
        &record.fingerprint,
        &status,
        &record.created_at,
        record.completed_at.as_deref().unwrap_or(""),
        &record.lease_expires_at,
        &record.expires_at,
        mark.map_or("", |m| m.at.as_str()),
        mark.map_or("", |m| m.by.as_str()),
        mark.map_or("", |m| m.reason.as_str()),
    ];
    let mut line = cells.map(csv_cell).join(",");
    line.push_str("\r\n");
    line
}

/// Exports a scope's records that pass the filters as CSV (RFC 4180, a
/// header line first): with `needs_decision=true`, the list finance needs
/// after an incident. At most [`EXPORT_MAX_ROWS`] rows; when more remain,
/// the `x-next-after` header names the `after` of the rest.
#[utoipa::path(
    get,
    path = "/v1/admin/keys.csv",
    tag = "admin",
    params(ExportQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The records as CSV, one line each after the header line", body = String, content_type = "text/csv",
            headers(("x-next-after" = String, description = "Present when the export was cut at its row limit: the `after` of the rest"))),
        (status = 400, description = "Invalid scope, filter or cursor", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn export_keys(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Result<axum::response::Response, AdminProblem> {
    use axum::response::IntoResponse as _;
    let Query(query) =
        query.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&query.scope)?;
    valid_cursor(query.after.as_deref())?;
    let filters = Filters::parse(
        query.state.as_deref(),
        query.needs_decision,
        query.method.as_deref(),
        query.path_prefix.as_deref(),
        query.created_after.as_deref(),
        query.created_before.as_deref(),
    )?;
    audited(&admin, "export", &query.scope, "-", None, async {
        let mut text = CSV_COLUMNS.join(",");
        text.push_str("\r\n");
        let mut rows = 0;
        let mut cursor = query.after.clone();
        loop {
            let room = u32::try_from(EXPORT_MAX_ROWS - rows)
                .unwrap_or(MAX_PAGE)
                .min(MAX_PAGE);
            let (records, next) =
                scan(&state, &query.scope, &filters, cursor.as_deref(), room, 1).await?;
            rows += records.len();
            for record in &records {
                text.push_str(&csv_line(record));
            }
            cursor = next;
            if cursor.is_none() || rows >= EXPORT_MAX_ROWS {
                break;
            }
        }
        let mut response = (
            [
                (http::header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (
                    http::header::CONTENT_DISPOSITION,
                    "attachment; filename=\"keys.csv\"",
                ),
            ],
            text,
        )
            .into_response();
        if let Some(next) = cursor
            && let Ok(value) = http::HeaderValue::from_str(&next)
        {
            response.headers_mut().insert("x-next-after", value);
        }
        Ok((response, "ok"))
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
    let reason = valid_reason(query.reason.as_deref())?;
    let rule = if query.force.unwrap_or(false) {
        ForgetRule::CompletedOrAbandoned
    } else {
        ForgetRule::Completed
    };
    audited(&admin, "forget", &scope, key.as_str(), reason, async {
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
        ReasonQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The abandoned record was deleted", body = AdminAction),
        (status = 400, description = "Invalid scope, key or reason", body = crate::problem::Problem, content_type = "application/problem+json"),
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
    query: Result<Query<ReasonQuery>, QueryRejection>,
) -> Result<Json<AdminAction>, AdminProblem> {
    let Path((scope, key)) =
        path.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    let Query(query) =
        query.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&scope)?;
    let key = valid_key(&key)?;
    let reason = valid_reason(query.reason.as_deref())?;
    audited(&admin, "release", &scope, key.as_str(), reason, async {
        let forgotten = forget(&state, &scope, key.as_str(), ForgetRule::Abandoned).await?;
        forget_answer(&scope, key.as_str(), "release", forgotten)
    })
    .await
}
