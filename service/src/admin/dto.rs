//! The admin API's JSON: a record as listed ([`AdminRecord`]), a page of
//! them, what an action did, one record in full (its life and its stored
//! response, previewed) and who the caller is.

use idempotency_guard::Record;
use idempotency_guard::store::admin::StateFilter;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;

use super::reconciled::Reconciliation;

/// A record as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminRecord {
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
    /// Whether it will complete by itself: abandoned, but its route keeps
    /// its request for the completer, which has not given up on it (the
    /// client's retry resumes it too). Such a key needs no decision; an
    /// operator may still release or forget it.
    #[serde(default)]
    pub will_complete: bool,
    /// The names of the steps its run recorded, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
    /// The completer's account of it, when its route keeps its request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completer: Option<CompleterAccount>,
    /// The operator's mark, when it was reconciled and kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<Reconciliation>,
}

/// What the completer did with a key whose route keeps its request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct CompleterAccount {
    /// How many times it took the run over.
    pub attempts: u32,
    /// Whether it gave up (its attempts ran out): the key then needs a
    /// decision.
    pub gave_up: bool,
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
    pub(crate) fn new(record: &Record, reconciled: Option<Reconciliation>) -> Self {
        let will_complete =
            StateFilter::Abandoned.accepts(record) && crate::status::resumes(record);
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
            needs_decision: StateFilter::Abandoned.accepts(record)
                && !will_complete
                && reconciled.is_none(),
            will_complete,
            steps: record.steps.iter().map(|step| step.name.clone()).collect(),
            completer: record.request.as_deref().map(|request| CompleterAccount {
                attempts: request.attempts,
                gave_up: request.gave_up,
            }),
            reconciled,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminPage {
    /// The records, by key in byte order.
    pub records: Vec<AdminRecord>,
    /// The `after` of the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// How many records the service read to fill this page (more than
    /// `records` when filters left some out): a console shows it while
    /// it follows `next`.
    #[serde(default)]
    pub scanned: u64,
}

/// What an admin action did to one record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminAction {
    /// The scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// `forget`, `release` or `give-up`.
    #[schema(pattern = "^(forget|release|give-up)$")]
    pub action: String,
    /// The state the record was in when it was deleted.
    #[schema(pattern = "^(completed|abandoned)$")]
    pub previous_state: String,
}

/// A stored response's header, as shown (sensitive values redacted).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminHeader {
    /// The header's name.
    pub name: String,
    /// Its value, `[redacted]` for credentials and cookies, `[binary]`
    /// when it is not text.
    pub value: String,
}

/// A stored response's body, as previewed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminBody {
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
pub(crate) struct AdminResponse {
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
pub(crate) struct AdminEvent {
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
pub(crate) struct AdminRecordDetail {
    /// The record, as listed.
    pub record: AdminRecord,
    /// Its life, in time order. The store keeps the claim, the last
    /// lease's end and the completion: a renewal shows as a later lease
    /// end, not as a step of its own; a release or a forget deletes the
    /// record (its audit trail, `.../decisions`, holds those).
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
pub(crate) struct AdminIdentity {
    /// The admin token's name.
    pub name: String,
    /// The scopes it may act on; `["*"]` for all.
    pub scopes: Vec<String>,
}

/// One decision on a key, as its audit trail keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminDecision {
    /// When it was taken (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub at: String,
    /// Who took it: the admin token's name.
    pub who: String,
    /// `release`, `forget`, `reconcile` or `give-up` (the completer's
    /// attempts given up on).
    #[schema(pattern = "^(release|forget|reconcile|give-up)$")]
    pub action: String,
    /// The scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// Why: the operator's reason.
    pub reason: String,
    /// What came of it: the audit line's result (`deleted-abandoned`,
    /// `reconciled`, `refused-in-flight`, `forbidden`, …); `pending`
    /// while the action runs, `unknown` when its result was never written
    /// (the service stopped or the store failed in between).
    pub result: String,
    /// When the trail lets this entry go (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// The decisions on one key: `GET /v1/admin/keys/{scope}/{key}/decisions`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct AdminTrail {
    /// The decisions, oldest first (at most 1000).
    pub decisions: Vec<AdminDecision>,
    /// Whether newer entries exist beyond the 1000 shown.
    #[serde(default)]
    pub truncated: bool,
}
