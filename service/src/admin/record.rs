//! One record, seen and decided on: `GET /v1/admin/keys/{scope}/{key}`
//! (its life, its request, a redacted preview of its stored response),
//! `POST .../reconcile` (kept, no longer needing a decision), and
//! `GET /v1/admin/whoami` (the scopes the caller's admin token may act on).

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use http::HeaderMap;
use idempotency_guard::store::admin::StateFilter;
use idempotency_guard::{IdempotencyKey, Record, RecordState, Scope, Store, StoredResponse};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::AdminState;
use super::audit::audited;
use super::handlers::{
    AdminRecord, RequiredReasonQuery, rfc3339, store_call, valid_key, valid_reason, valid_scope,
};
use super::problem::AdminProblem;
use super::reconciled::Reconciliation;
use super::tokens::{Admin, Scopes};

/// The header the encryption at rest leaves in clear on a sealed response.
const SEALED: &str = "idempotency-sealed";

/// What replaces a redacted value.
const REDACTED: &str = "[redacted]";

/// The most characters of a body preview.
const PREVIEW_CHARS: usize = 2048;

/// A stored response's header, as shown (sensitive values redacted).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminHeader {
    /// The header's name.
    pub name: String,
    /// Its value, `[redacted]` for credentials and cookies, `[binary]`
    /// when it is not text.
    pub value: String,
}

/// A stored response's body, as previewed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminBody {
    /// Whether a body is stored (a body past the stored-response limit
    /// is not: replays answer `response-not-stored`).
    pub stored: bool,
    /// Its size in bytes, when stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The redacted preview: JSON with the values of sensitive members
    /// (passwords, tokens, secrets, card and account numbers) replaced by
    /// `[redacted]`, digit runs of 12 or more masked but their last four,
    /// cut at 2048 characters. Absent when sealed, not text, or not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// Whether the preview was cut.
    #[serde(default)]
    pub truncated: bool,
    /// Why there is no preview, when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A stored response, as shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminResponse {
    /// The status code.
    pub status: u16,
    /// Whether it is sealed (encrypted at rest): then its headers and
    /// body are ciphertext the service holds no key for, and only the
    /// status is shown.
    pub sealed: bool,
    /// Its headers (none when sealed).
    pub headers: Vec<AdminHeader>,
    /// Its body.
    pub body: AdminBody,
}

/// A step of a record's life.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminEvent {
    /// `claimed`, `completed`, `lease_expires`, `lease_expired`
    /// (abandoned), `reconciled`, `expires` (purged then).
    #[schema(pattern = "^(claimed|completed|lease_expires|lease_expired|reconciled|expires)$")]
    pub event: String,
    /// When (RFC 3339, UTC); a future time for what is still to come.
    #[schema(format = DateTime)]
    pub at: String,
}

/// One record in full: `GET /v1/admin/keys/{scope}/{key}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminRecordDetail {
    /// The record, as listed.
    pub record: AdminRecord,
    /// Its life, in time order. The store keeps the claim, the last
    /// lease's end and the completion: a renewal shows as a later lease
    /// end, not as a step of its own; a release or a forget deletes the
    /// record (the audit log holds those).
    pub life: Vec<AdminEvent>,
    /// The stored response, once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdminResponse>,
    /// When the service read the record (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub read_at: String,
}

/// Who the caller is: `GET /v1/admin/whoami`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdminIdentity {
    /// The admin token's name.
    pub name: String,
    /// The scopes it may act on; `["*"]` for all.
    pub scopes: Vec<String>,
}

fn sensitive_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || ["token", "secret", "key", "signature", "password", "session"]
        .iter()
        .any(|word| name.contains(word))
}

fn sensitive_member(name: &str) -> bool {
    let name: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "authorization",
        "card",
        "pan",
        "cvv",
        "cvc",
        "iban",
        "account",
        "ssn",
        "pin",
        "otp",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// Masks every run of 12 or more digits but its last four.
fn mask_digits(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 12 {
            let keep = run.len() - 4;
            out.extend(std::iter::repeat_n('•', keep));
            out.push_str(&run[keep..]);
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

fn redact_json(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Object(members) => {
            for (name, member) in members.iter_mut() {
                if sensitive_member(name) && !member.is_null() {
                    *member = Value::String(REDACTED.to_owned());
                } else {
                    redact_json(member);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::String(text) => *text = mask_digits(text),
        Value::Number(number) => {
            let text = number.to_string();
            if text.chars().filter(char::is_ascii_digit).count() >= 12 {
                *value = Value::String(mask_digits(&text));
            }
        }
        _ => {}
    }
}

/// Cuts `text` at [`PREVIEW_CHARS`] characters.
fn cut(text: String) -> (String, bool) {
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => (text[..end].to_owned(), true),
        None => (text, false),
    }
}

fn preview_body(headers: &HeaderMap, body: &[u8]) -> AdminBody {
    let bytes = Some(body.len() as u64);
    let is_json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) {
        redact_json(&mut value);
        let (preview, truncated) = cut(serde_json::to_string_pretty(&value).unwrap_or_default());
        return AdminBody {
            stored: true,
            bytes,
            preview: Some(preview),
            truncated,
            note: None,
        };
    }
    if is_json {
        return AdminBody {
            stored: true,
            bytes,
            preview: None,
            truncated: false,
            note: Some("declared JSON but does not parse: not shown".to_owned()),
        };
    }
    match std::str::from_utf8(body) {
        Ok(text) if !text.chars().any(|c| c.is_control() && !c.is_whitespace()) => {
            let (preview, truncated) = cut(mask_digits(text));
            AdminBody {
                stored: true,
                bytes,
                preview: Some(preview),
                truncated,
                note: None,
            }
        }
        _ => AdminBody {
            stored: true,
            bytes,
            preview: None,
            truncated: false,
            note: Some("not text: not shown".to_owned()),
        },
    }
}

/// The stored response as shown: sealed ones show their status only.
pub(crate) fn preview(response: &StoredResponse) -> AdminResponse {
    let status = response.status.as_u16();
    if response.headers.contains_key(SEALED) {
        return AdminResponse {
            status,
            sealed: true,
            headers: Vec::new(),
            body: AdminBody {
                stored: response.body.is_some(),
                bytes: None,
                preview: None,
                truncated: false,
                note: Some(
                    "sealed (encrypted at rest): the service holds no key, only the status is shown"
                        .to_owned(),
                ),
            },
        };
    }
    let headers = response
        .headers
        .iter()
        .map(|(name, value)| AdminHeader {
            name: name.as_str().to_owned(),
            value: if sensitive_header(name.as_str()) {
                REDACTED.to_owned()
            } else {
                value
                    .to_str()
                    .map_or_else(|_| "[binary]".to_owned(), mask_digits)
            },
        })
        .collect();
    let body = match &response.body {
        Some(body) => preview_body(&response.headers, body),
        None => AdminBody {
            stored: false,
            bytes: None,
            preview: None,
            truncated: false,
            note: Some(
                "past the stored-response limit: the first caller got it, replays answer response-not-stored"
                    .to_owned(),
            ),
        },
    };
    AdminResponse {
        status,
        sealed: false,
        headers,
        body,
    }
}

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
    scope: &str,
    key: &IdempotencyKey,
) -> Result<Record, AdminProblem> {
    let not_found = || AdminProblem::KeyNotFound {
        key: key.as_str().to_owned(),
    };
    // The handlers checked the scope (`valid_scope`): one that breaks the
    // rule names no record.
    let scope = Scope::try_from(scope).map_err(|_| not_found())?;
    match store_call(state.store.get(&scope, key)).await? {
        Some(record) if StateFilter::Any.accepts(&record) => Ok(record),
        _ => Err(not_found()),
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
pub async fn show_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<AdminRecordDetail>, AdminProblem> {
    let Path((scope, key)) =
        path.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&scope)?;
    let key = valid_key(&key)?;
    audited(&admin, "show", &scope, key.as_str(), None, async {
        let record = read(&state, &scope, &key).await?;
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
        RequiredReasonQuery,
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The record, marked", body = AdminRecord),
        (status = 400, description = "Invalid scope or key, or no reason", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No admin token (a scope token is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "The admin token may not act on this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No record of this key in this scope", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing to reconcile: in flight (`request-in-flight`) or completed (`record-completed`)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unavailable, or the mark could not be written", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn reconcile_key(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<RequiredReasonQuery>, QueryRejection>,
) -> Result<Json<AdminRecord>, AdminProblem> {
    let Path((scope, key)) =
        path.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    let Query(query) =
        query.map_err(|rejection| AdminProblem::BadRequest(rejection.body_text()))?;
    valid_scope(&scope)?;
    let key = valid_key(&key)?;
    let Some(reason) = valid_reason(Some(&query.reason))? else {
        return Err(AdminProblem::BadRequest(
            "reconcile needs a reason (?reason=...)".to_owned(),
        ));
    };
    audited(
        &admin,
        "reconcile",
        &scope,
        key.as_str(),
        Some(reason),
        async {
            let record = read(&state, &scope, &key).await?;
            match record.state() {
                RecordState::InFlight => {
                    return Err(AdminProblem::InFlight {
                        key: key.as_str().to_owned(),
                    });
                }
                RecordState::Completed => {
                    return Err(AdminProblem::NothingToReconcile {
                        key: key.as_str().to_owned(),
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
        },
    )
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
pub async fn whoami(Extension(admin): Extension<Admin>) -> Json<AdminIdentity> {
    Json(AdminIdentity {
        name: admin.name.clone(),
        scopes: match &admin.scopes {
            Scopes::All => vec!["*".to_owned()],
            Scopes::Only(scopes) => scopes.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_digit_runs_keep_their_last_four() {
        assert_eq!(
            mask_digits("card 4111111111111111 ok"),
            "card ••••••••••••1111 ok"
        );
        assert_eq!(mask_digits("order 12345"), "order 12345");
    }

    #[test]
    fn sensitive_members_are_redacted_at_any_depth() {
        let mut value = serde_json::json!({
            "id": "pay_1",
            "card": {"number": "4111111111111111"},
            "customer": {"api_key": "sk_live_x", "note": "iban DE89370400440532013000"},
            "items": [{"password": "p"}],
            "amount": 1250
        });
        redact_json(&mut value);
        assert_eq!(value["card"], "[redacted]");
        assert_eq!(value["customer"]["api_key"], "[redacted]");
        assert_eq!(value["customer"]["note"], "iban DE••••••••••••••••3000");
        assert_eq!(value["items"][0]["password"], "[redacted]");
        assert_eq!(value["amount"], 1250);
        assert_eq!(value["id"], "pay_1");
    }

    #[test]
    fn sealed_responses_show_their_status_only() {
        let mut headers = HeaderMap::new();
        headers.insert(SEALED, http::HeaderValue::from_static("v1 k1"));
        let shown = preview(&StoredResponse {
            status: http::StatusCode::CREATED,
            headers,
            body: Some(bytes::Bytes::from_static(b"\x00\x01ciphertext")),
        });
        assert!(shown.sealed);
        assert_eq!(shown.status, 201);
        assert!(shown.headers.is_empty());
        assert!(shown.body.preview.is_none());
    }

    #[test]
    fn credentials_in_headers_are_redacted() {
        let mut headers = HeaderMap::new();
        headers.insert("set-cookie", http::HeaderValue::from_static("sid=abc"));
        headers.insert("x-api-key", http::HeaderValue::from_static("k"));
        headers.insert("location", http::HeaderValue::from_static("/payments/1"));
        let shown = preview(&StoredResponse {
            status: http::StatusCode::CREATED,
            headers,
            body: Some(bytes::Bytes::from_static(b"plain \x07 bell")),
        });
        let value = |name: &str| {
            shown
                .headers
                .iter()
                .find(|h| h.name == name)
                .map(|h| h.value.clone())
        };
        assert_eq!(value("set-cookie").as_deref(), Some("[redacted]"));
        assert_eq!(value("x-api-key").as_deref(), Some("[redacted]"));
        assert_eq!(value("location").as_deref(), Some("/payments/1"));
        assert!(
            shown.body.preview.is_none(),
            "a control character: not text"
        );
    }
}
