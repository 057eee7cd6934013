//! One record, seen and decided on: `GET /v1/admin/keys/{scope}/{key}`
//! (its life, its request, a redacted preview of its stored response),
//! `GET .../decisions` (its audit trail: the decisions taken on the key,
//! kept after the record is gone), `POST .../reconcile` (kept, no longer
//! needing a decision), and `GET /v1/admin/whoami` (the scopes the
//! caller's admin token may act on).

use axum::extract::State;
use axum::{Extension, Json};
use idempotency_guard::store::admin::StateFilter;
use idempotency_guard::{Record, RecordState, Store};
use time::OffsetDateTime;

use super::AdminState;
use super::audit::audited;
use super::bounded::store_call;
use super::decision::decided;
use super::dto::{AdminEvent, AdminIdentity, AdminRecord, AdminRecordDetail, AdminTrail, rfc3339};
use super::extract::{AdminQuery, AdminTarget};
use super::preview::preview;
use super::problem::AdminProblem;
use super::query::{ReasonQuery, required_reason};
use super::reconciled::Reconciliation;
use super::tokens::{Admin, Scopes};
use super::trail;

fn life(record: &Record, detail: &AdminRecord) -> Vec<AdminEvent> {
    let event = |event: &str, at: OffsetDateTime| (at, event.to_owned());
    let mut steps = vec![event("claimed", record.created_at)];
    if let Some(at) = record.completed_at {
        steps.push(event("completed", at));
    } else if record.state() == RecordState::Abandoned {
        steps.push(event("lease_expired", record.lease_expires_at));
    } else {
        steps.push(event("lease_expires", record.lease_expires_at));
    }
    if let Some(mark) = &detail.reconciled
        && let Ok(at) =
            OffsetDateTime::parse(&mark.at, &time::format_description::well_known::Rfc3339)
    {
        steps.push(event("reconciled", at));
    }
    steps.push(event("expires", record.expires_at));
    steps.sort_by_key(|(at, _)| *at);
    steps
        .into_iter()
        .map(|(at, event)| AdminEvent {
            event,
            at: rfc3339(at),
        })
        .collect()
}

/// Reads one live record (an expired one is as good as gone).
async fn read(
    state: &AdminState,
    AdminTarget { scope, key }: &AdminTarget,
) -> Result<Record, AdminProblem> {
    match store_call(state.store.get(scope, key)).await? {
        Some(record) if StateFilter::Any.accepts(&record) => Ok(record),
        _ => Err(AdminProblem::KeyNotFound {
            key: key.as_str().to_owned(),
        }),
    }
}

/// Shows one record: its life, its request, and a redacted preview of its
/// stored response.
#[utoipa::path(
    get,
    path = "/v1/admin/keys/{scope}/{key}",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record", body = AdminRecordDetail),
        (status = 400, description = "Invalid scope or key", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn show_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
) -> Result<Json<AdminRecordDetail>, AdminProblem> {
    let (scope, key) = (target.scope.as_str(), target.key.as_str());
    audited(&admin, "show", scope, key, async {
        let record = read(&state, &target).await?;
        let detail = AdminRecord::new(&record, state.reconciled.of(&record));
        Ok((
            Json(AdminRecordDetail {
                life: life(&record, &detail),
                response: record.response.as_ref().map(preview),
                record: detail,
                read_at: rfc3339(OffsetDateTime::now_utc()),
            }),
            "ok",
        ))
    })
    .await
}

/// Marks an abandoned record reconciled: kept (its key still answers
/// `outcome-unknown` until released, forgotten or expired), and no longer
/// listed as needing a decision. The reason is required.
#[utoipa::path(
    post,
    path = "/v1/admin/keys/{scope}/{key}/reconcile",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
        ReasonQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record, marked", body = AdminRecord),
        (status = 400, description = "Invalid scope or key, or a scope of the audit trail", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing to reconcile: in flight (`request-in-flight`) or completed (`record-completed`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "No reason, or one that is empty, over 500 characters or holds a control character (`reason-required`): nothing was done", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable or could not take the decision's audit entry, or the mark could not be written", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn reconcile_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
    AdminQuery(query): AdminQuery<ReasonQuery>,
) -> Result<Json<AdminRecord>, AdminProblem> {
    let reason = required_reason(query.reason.as_deref())?;
    let key = target.key.as_str();
    decided(&state, &admin, "reconcile", &target, reason, async {
        let record = read(&state, &target).await?;
        match record.state() {
            RecordState::InFlight => {
                return Err(AdminProblem::InFlight {
                    key: key.to_owned(),
                });
            }
            RecordState::Completed => {
                return Err(AdminProblem::NothingToReconcile {
                    key: key.to_owned(),
                });
            }
            RecordState::Abandoned => {}
        }
        let mark = Reconciliation {
            at: rfc3339(OffsetDateTime::now_utc()),
            by: admin.name.clone(),
            reason: reason.to_owned(),
        };
        if let Err(error) = state.reconciled.mark(&record, mark.clone()) {
            tracing::warn!(error = %error, "cannot write the reconciled mark");
            return Err(AdminProblem::StoreUnavailable);
        }
        Ok((Json(AdminRecord::new(&record, Some(mark))), "reconciled"))
    })
    .await
}

/// The decisions taken on one key (`release`, `forget`, `reconcile`,
/// refused ones included), oldest first: who, when, why and what came of
/// it. Kept with the store, they outlive the record (a release deletes
/// it), so a key without a record may still have a trail.
#[utoipa::path(
    get,
    path = "/v1/admin/keys/{scope}/{key}/decisions",
    tag = "admin",
    params(
        ("scope" = String, Path, description = "The scope (1 to 255 bytes, no control characters), percent-encoded", min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$"),
        ("key" = String, Path, description = "The idempotency key, percent-encoded", min_length = 1, max_length = 255, pattern = "^[!-~]+$"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The key's decisions (none: an empty list)", body = AdminTrail),
        (status = 400, description = "Invalid scope or key, or a scope of the audit trail", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn key_decisions(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    target: AdminTarget,
) -> Result<Json<AdminTrail>, AdminProblem> {
    let (scope, key) = (target.scope.as_str(), target.key.as_str());
    if trail::is_reserved(scope) {
        return Err(AdminProblem::BadRequest(format!(
            "scopes starting with {} hold the audit trail: they have none of their own",
            trail::TRAIL_PREFIX
        )));
    }
    audited(&admin, "decisions", scope, key, async {
        let (decisions, truncated) =
            store_call(trail::read(&state.store, &target.scope, &target.key)).await?;
        Ok((
            Json(AdminTrail {
                decisions,
                truncated,
            }),
            "ok",
        ))
    })
    .await
}

/// The caller's admin token: its name and the scopes it may act on (the
/// console offers these scopes).
#[utoipa::path(
    get,
    path = "/v1/admin/whoami",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The admin token's name and scopes", body = AdminIdentity),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn whoami(Extension(admin): Extension<Admin>) -> Json<AdminIdentity> {
    Json(identity(&admin))
}

/// Who `admin` is, as `whoami` (and the console's sign-in) answer.
pub(super) fn identity(admin: &Admin) -> AdminIdentity {
    AdminIdentity {
        name: admin.name.clone(),
        scopes: match &admin.scopes {
            Scopes::All => vec!["*".to_owned()],
            Scopes::Only(scopes) => scopes.clone(),
        },
    }
}
