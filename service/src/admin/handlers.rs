//! The listing and the deleting actions (`list`, `forget`, `release`),
//! and the scan of a scope's records through the filters that the listing
//! and the export share.

use axum::extract::State;
use axum::{Extension, Json};
use idempotency_guard::store::AdminStore;
use idempotency_guard::store::admin::{ForgetRule, Forgotten, MAX_PAGE, PageRequest};
use idempotency_guard::{RecordState, Scope};

use super::AdminState;
use super::audit::audited;
use super::bounded::store_call;
use super::decision::decided;
use super::dto::{AdminAction, AdminPage, AdminRecord};
use super::extract::{AdminQuery, AdminTarget, Listing};
use super::problem::AdminProblem;
use super::query::{
    DEFAULT_PAGE, Filters, ForgetQuery, KeysQuery, PageQuery, ReasonQuery, required_reason,
};
use super::tokens::Admin;

/// How many store pages one listing reads at most to fill a page when
/// filters leave records out (`next` then resumes where it stopped).
const SCAN_PAGES: u32 = 10;

/// What one [`scan`] found.
pub(super) struct Scanned {
    /// The records that passed the filters, by key.
    pub records: Vec<AdminRecord>,
    /// The cursor of what follows (`None` at the end).
    pub next: Option<String>,
    /// How many records the scan read from the store to find them.
    pub read: u64,
}

/// Reads up to `limit` records of `scope` that pass `filters`, from after
/// `after`, at most `pages` store pages.
pub(super) async fn scan(
    state: &AdminState,
    scope: &Scope,
    filters: &Filters,
    after: Option<&str>,
    limit: u32,
    pages: u32,
) -> Result<Scanned, AdminProblem> {
    let mut scanned = Scanned {
        records: Vec::new(),
        next: None,
        read: 0,
    };
    if filters.nothing {
        return Ok(scanned);
    }
    let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut cursor = after.map(str::to_owned);
    for _ in 0..pages {
        let page = store_call(state.store.list(
            scope.as_str(),
            filters.state,
            PageRequest {
                after: cursor.as_deref(),
                limit,
            },
        ))
        .await?;
        let count = page.records.len();
        for (index, raw) in page.records.iter().enumerate() {
            scanned.read += 1;
            let record = AdminRecord::new(raw, state.reconciled.of(raw));
            if !filters.accepts(&record, raw) {
                continue;
            }
            scanned.records.push(record);
            if scanned.records.len() == wanted {
                let more = index + 1 < count || page.next.is_some();
                scanned.next = more.then(|| raw.key.as_str().to_owned());
                return Ok(scanned);
            }
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(scanned),
        }
    }
    scanned.next = cursor;
    Ok(scanned)
}

/// Lists a scope's records, by key, a page at a time.
///
/// With filters beyond `state` (`needs_decision`, `method`,
/// `path_prefix`, `created_after`, `created_before`), one request reads
/// at most ten store pages of `limit` records, so a page may hold fewer
/// than `limit` records (even none) and still have a `next`: keep
/// following `next` until it is absent (`scanned` says how many records
/// this page read, for a progress line).
#[utoipa::path(
    get,
    path = "/v1/admin/keys",
    tag = "admin",
    params(KeysQuery, PageQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One page of records", body = AdminPage),
        (status = 400, description = "Invalid scope, filter, cursor or limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_keys(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    Listing {
        scope,
        filters,
        after,
    }: Listing,
    AdminQuery(page): AdminQuery<PageQuery>,
) -> Result<Json<AdminPage>, AdminProblem> {
    let limit = page.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(AdminProblem::BadRequest(format!(
            "limit is 1 to {MAX_PAGE}"
        )));
    }
    audited(&admin, "list", scope.as_str(), "-", async {
        let Scanned {
            records,
            next,
            read,
        } = scan(
            &state,
            &scope,
            &filters,
            after.as_deref(),
            limit,
            SCAN_PAGES,
        )
        .await?;
        Ok((
            Json(AdminPage {
                records,
                next,
                scanned: read,
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
    AdminTarget { scope, key }: &AdminTarget,
    rule: ForgetRule,
) -> Result<Forgotten, AdminProblem> {
    let (scope, key) = (scope.as_str(), key.as_str());
    let forgotten = store_call(state.store.forget(scope, key, rule)).await?;
    if forgotten == Forgotten::Missing
        && store_call(state.store.held_without_record(scope, &[key])).await?[0]
    {
        return Ok(Forgotten::Refused(RecordState::InFlight));
    }
    Ok(forgotten)
}

fn forget_answer(
    AdminTarget { scope, key }: &AdminTarget,
    action: &'static str,
    forgotten: Forgotten,
) -> Result<(Json<AdminAction>, &'static str), AdminProblem> {
    let key_owned = || key.as_str().to_owned();
    match forgotten {
        Forgotten::Deleted(previous) => Ok((
            Json(AdminAction {
                scope: scope.as_str().to_owned(),
                key: key.as_str().to_owned(),
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
        (status = 400, description = "Invalid scope, key or query, or a scope of the audit trail", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Kept: in flight (`request-in-flight`), or abandoned without `force=true` (`outcome-unknown`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "No reason, or one that is empty, over 500 characters or holds a control character (`reason-required`): nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable, or could not take the decision's audit entry: nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn forget_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
    AdminQuery(query): AdminQuery<ForgetQuery>,
) -> Result<Json<AdminAction>, AdminProblem> {
    let reason = required_reason(query.reason.as_deref())?;
    let rule = if query.force.unwrap_or(false) {
        ForgetRule::CompletedOrAbandoned
    } else {
        ForgetRule::Completed
    };
    decided(&state, &admin, "forget", &target, reason, async {
        let forgotten = forget(&state, &target, rule).await?;
        forget_answer(&target, "forget", forgotten)
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
        (status = 400, description = "Invalid scope or key, or a scope of the audit trail", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Kept: in flight (`request-in-flight`) or completed (`record-completed`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "No reason, or one that is empty, over 500 characters or holds a control character (`reason-required`): nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable, or could not take the decision's audit entry: nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn release_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
    AdminQuery(query): AdminQuery<ReasonQuery>,
) -> Result<Json<AdminAction>, AdminProblem> {
    let reason = required_reason(query.reason.as_deref())?;
    decided(&state, &admin, "release", &target, reason, async {
        let forgotten = forget(&state, &target, ForgetRule::Abandoned).await?;
        forget_answer(&target, "release", forgotten)
    })
    .await
}

/// Gives up on completing a key that will complete (its route keeps its
/// request for the completer, SPEC §12): no completer takes it again, and
/// it stays abandoned, with its steps, for a person to decide (release,
/// forget). Runs nothing of its work. A key no completer would finish
/// (abandoned without a kept request, or given up already) is left as it
/// is, and answers the same.
#[utoipa::path(
    post,
    path = "/v1/admin/keys/{scope}/{key}/give-up",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ReasonQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "No completer takes the key again: it is abandoned, for a person", body = AdminAction),
        (status = 400, description = "Invalid scope or key, or a scope of the audit trail", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "In flight (`request-in-flight`: a completer or a client's retry runs it) or completed (`record-completed`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "No reason, or one that is empty, over 500 characters or holds a control character (`reason-required`): nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable, or could not take the decision's audit entry: nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn give_up_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
    AdminQuery(query): AdminQuery<ReasonQuery>,
) -> Result<Json<AdminAction>, AdminProblem> {
    use idempotency_guard::AbandonedPolicy;
    use idempotency_guard::engine::{Engine, GiveUp, Refusal};
    let reason = required_reason(query.reason.as_deref())?;
    decided(&state, &admin, "give-up", &target, reason, async {
        let engine = Engine::new(state.store.clone()).with_abandoned(AbandonedPolicy::Resume);
        let given = store_call(engine.give_up_completion(&target.scope, &target.key)).await?;
        let key = || target.key.as_str().to_owned();
        let answer = |result| {
            Ok((
                Json(AdminAction {
                    scope: target.scope.as_str().to_owned(),
                    key: key(),
                    action: "give-up".to_owned(),
                    previous_state: RecordState::Abandoned.as_str().to_owned(),
                }),
                result,
            ))
        };
        match given {
            GiveUp::GaveUp => answer("gave-up"),
            GiveUp::NotResuming(RecordState::Abandoned) => answer("not-resuming"),
            GiveUp::Missing => Err(AdminProblem::KeyNotFound { key: key() }),
            GiveUp::NotResuming(RecordState::Completed) => {
                Err(AdminProblem::Completed { key: key() })
            }
            GiveUp::Refused(Refusal::RequestInFlight { .. })
            | GiveUp::NotResuming(RecordState::InFlight) => {
                Err(AdminProblem::InFlight { key: key() })
            }
            _ => Err(AdminProblem::StoreUnavailable),
        }
    })
    .await
}
