//! The audit trail kept with the store: every state-changing admin
//! decision (`release`, `forget`, `reconcile`), allowed or refused, as a
//! record of a reserved scope, written and read through the store's own
//! operations ([`Store`], [`AdminStore`]), so that it is kept wherever the
//! records are (PostgreSQL, SQLite, Redis, Redis Cluster, the tiered
//! store, NATS) with no code of its own per backend.
//!
//! # Layout
//!
//! | record field | holds |
//! |---|---|
//! | scope | the tenant scope's trail: `idempotency.audit:<scope>`, or `idempotency.audit#<sha-256 of the scope, hex>` when that would pass 255 bytes |
//! | key | `<sha-256 of the key, hex>.<nanoseconds since 1970, 20 digits>.<8 hex digits>`: a key's entries are adjacent, in time order |
//! | method, path | `AUDIT`, and the decision as JSON: `at`, `who`, `action`, `scope`, `key`, `reason` |
//! | stored response | 200, `{"result": ...}` |
//!
//! An entry is claimed when the decision is taken, before the action
//! runs (a store that cannot take it refuses the action: no decision
//! without its entry), and completed with the result once the action is
//! done. An entry whose result never came (the service stopped, the store
//! failed in between) reads back with the result `unknown` (`pending`
//! while its lease of [`INTENT_LEASE`] runs).
//!
//! An entry lives [`TRAIL_RETENTION`], or the retention of the record it
//! decides on when that is longer: it outlives the record (a release or a
//! forget deletes it) by at least the record's own retention. Past it, the
//! entry is purged as any record is (Redis and NATS expire it by
//! themselves).

use std::time::Duration;

use idempotency_guard::store::admin::{PageRequest, StateFilter};
use idempotency_guard::store::{AdminStore, Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{
    Fingerprint, IdempotencyKey, MAX_SCOPE_LEN, Record, RecordState, Scope, Store, StoreError,
    StoredResponse,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use super::dto::{AdminDecision, rfc3339};

/// The start of every trail scope: a scope that starts with it is the
/// trail's, and no admin action may change it.
pub(crate) const TRAIL_PREFIX: &str = "idempotency.audit";

/// How long an entry lives at least: about 13 months, a yearly audit and
/// some.
pub(crate) const TRAIL_RETENTION: Duration = Duration::from_secs(400 * 24 * 3600);

/// How long an entry waits for its action's result before it reads back
/// as `unknown` (the admin API's store calls give up after 10 seconds).
pub(crate) const INTENT_LEASE: Duration = Duration::from_secs(60);

/// The most entries one key's trail shows (the oldest first).
pub(crate) const TRAIL_MAX: usize = 1000;

/// How many entries one store page of a trail reads.
const TRAIL_PAGE: u32 = 100;

/// The method of every entry.
const ENTRY_METHOD: &str = "AUDIT";

/// A decision, as an entry's path holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Decision {
    /// When it was taken (RFC 3339, UTC).
    pub at: String,
    /// Who took it: the admin token's name.
    pub who: String,
    /// `release`, `forget` or `reconcile`.
    pub action: String,
    /// The tenant scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The operator's reason.
    pub reason: String,
}

/// What an entry's stored response holds.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    result: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `scope` is a trail's (or could be taken for one).
pub(crate) fn is_reserved(scope: &str) -> bool {
    scope.starts_with(TRAIL_PREFIX)
}

/// The scope of `scope`'s trail: readable when it fits, hashed otherwise
/// (either way 1 to 255 bytes without a control character, so never an
/// error in practice).
pub(crate) fn trail_scope(scope: &Scope) -> Result<Scope, StoreError> {
    let readable = format!("{TRAIL_PREFIX}:{}", scope.as_str());
    let text = if readable.len() <= MAX_SCOPE_LEN {
        readable
    } else {
        format!(
            "{TRAIL_PREFIX}#{}",
            hex(&Sha256::digest(scope.as_str().as_bytes()))
        )
    };
    Scope::new(text).map_err(|error| StoreError::Unavailable(Box::new(error)))
}

/// The start of every entry key of `key`'s trail (the `.` included).
fn entry_prefix(key: &IdempotencyKey) -> String {
    format!("{}.", hex(&Sha256::digest(key.as_str().as_bytes())))
}

/// A fresh entry key of `key`'s trail, taken at `at`.
fn entry_key(key: &IdempotencyKey, at: OffsetDateTime) -> Result<IdempotencyKey, StoreError> {
    let nonce = LeaseToken::new().as_uuid();
    let text = format!(
        "{}{:020}.{}",
        entry_prefix(key),
        at.unix_timestamp_nanos().max(0),
        hex(&nonce.as_bytes()[..4])
    );
    IdempotencyKey::from_raw(&text)
        .map_err(|_| StoreError::Unavailable("an audit entry's key is not a key".into()))
}

/// How long an entry on `record` lives: [`TRAIL_RETENTION`], or the
/// record's own retention when that is longer.
pub(crate) fn retention_for(record: Option<&Record>) -> Duration {
    let own = record
        .map(|r| (r.expires_at - r.created_at).unsigned_abs())
        .unwrap_or_default();
    TRAIL_RETENTION.max(own)
}

/// Claims the entry of `decision` (its result still to come): the lease
/// that [`close`] completes.
///
/// # Errors
///
/// When the store fails (the decision must then not be carried out).
pub(crate) async fn open<S: Store>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
    decision: &Decision,
    retention: Duration,
) -> Result<Lease, StoreError> {
    let trail = trail_scope(scope)?;
    let path = serde_json::to_string(decision)
        .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
    let fingerprint = Fingerprint::from_bytes(Sha256::digest(path.as_bytes()).into());
    // A clash of entry keys needs the same nanosecond and nonce: one more
    // try is plenty.
    for _ in 0..2 {
        let entry = entry_key(key, OffsetDateTime::now_utc())?;
        let new = NewRecord {
            scope: &trail,
            key: &entry,
            fingerprint: &fingerprint,
            method: ENTRY_METHOD,
            path: &path,
            token: LeaseToken::new(),
            lease: INTENT_LEASE,
            retention,
            transactional: false,
        };
        if let Claim::Acquired(lease) = store.claim(&new).await? {
            return Ok(lease);
        }
    }
    Err(StoreError::Unavailable(
        "two audit entries took the same key".into(),
    ))
}

/// Completes the entry held by `lease` with the action's `result`.
///
/// # Errors
///
/// When the store fails (the entry then reads back as `unknown`).
pub(crate) async fn close<S: Store>(
    store: &S,
    lease: &Lease,
    result: &str,
) -> Result<(), StoreError> {
    let body = serde_json::to_vec(&Outcome {
        result: result.to_owned(),
    })
    .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let response = StoredResponse {
        status: http::StatusCode::OK,
        headers,
        body: Some(body.into()),
    };
    store.complete(lease, &response).await
}

/// The decision an entry holds, with its result.
fn decision_of(record: &Record) -> Option<AdminDecision> {
    if record.method != ENTRY_METHOD {
        return None;
    }
    let decision: Decision = serde_json::from_str(&record.path).ok()?;
    let result = match record.state() {
        RecordState::Completed => record
            .response
            .as_ref()
            .and_then(|r| r.body.as_ref())
            .and_then(|body| serde_json::from_slice::<Outcome>(body).ok())
            .map_or_else(|| "unknown".to_owned(), |outcome| outcome.result),
        RecordState::InFlight => "pending".to_owned(),
        RecordState::Abandoned => "unknown".to_owned(),
    };
    Some(AdminDecision {
        at: decision.at,
        who: decision.who,
        action: decision.action,
        scope: decision.scope,
        key: decision.key,
        reason: decision.reason,
        result,
        expires_at: rfc3339(record.expires_at),
    })
}

/// The decisions on `key` of `scope`, oldest first, at most [`TRAIL_MAX`]
/// (`true` when there are more).
///
/// # Errors
///
/// When the store fails.
pub(crate) async fn read<S: AdminStore>(
    store: &S,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<(Vec<AdminDecision>, bool), StoreError> {
    let trail = trail_scope(scope)?;
    let prefix = entry_prefix(key);
    // Every key of a trail is `<64 hex>.…`: the key's own entries follow
    // the digest alone.
    let mut after = prefix.trim_end_matches('.').to_owned();
    let mut decisions = Vec::new();
    loop {
        let page = store
            .list(
                trail.as_str(),
                StateFilter::Any,
                PageRequest {
                    after: Some(&after),
                    limit: TRAIL_PAGE,
                },
            )
            .await?;
        for record in &page.records {
            if !record.key.as_str().starts_with(&prefix) {
                return Ok((decisions, false));
            }
            // Only this key's entries (the digest is the key's): one
            // whose decision names another key is not shown.
            if let Some(decision) = decision_of(record).filter(|d| d.key == key.as_str()) {
                if decisions.len() == TRAIL_MAX {
                    return Ok((decisions, true));
                }
                decisions.push(decision);
            }
        }
        match page.next {
            Some(next) => after = next,
            None => return Ok((decisions, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trail_scope_is_readable_when_it_fits_and_hashed_otherwise() {
        let short = Scope::new("tenant-a").unwrap();
        assert_eq!(
            trail_scope(&short).unwrap().as_str(),
            "idempotency.audit:tenant-a"
        );
        let long = Scope::new("s".repeat(255)).unwrap();
        let hashed = trail_scope(&long).unwrap();
        assert!(hashed.as_str().starts_with("idempotency.audit#"));
        assert_eq!(hashed.as_str().len(), TRAIL_PREFIX.len() + 1 + 64);
        let other = Scope::new(format!("{}t", "s".repeat(254))).unwrap();
        assert_ne!(trail_scope(&other).unwrap().as_str(), hashed.as_str());
        assert!(is_reserved(hashed.as_str()) && is_reserved(trail_scope(&short).unwrap().as_str()));
        assert!(!is_reserved("tenant-a"));
    }

    #[test]
    fn entry_keys_are_keys_grouped_by_key_and_ordered_by_time() {
        let key = IdempotencyKey::from_raw(&"k".repeat(255)).unwrap();
        let early = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let late = early + time::Duration::nanoseconds(1);
        let first = entry_key(&key, early).unwrap();
        let second = entry_key(&key, late).unwrap();
        assert!(first.as_str().starts_with(&entry_prefix(&key)));
        assert!(first.as_str() < second.as_str());
        let other = IdempotencyKey::from_raw("k").unwrap();
        assert!(
            !entry_key(&other, early)
                .unwrap()
                .as_str()
                .starts_with(&entry_prefix(&key))
        );
    }

    #[test]
    fn an_entry_outlives_its_record_by_the_records_retention() {
        assert_eq!(retention_for(None), TRAIL_RETENTION);
        let now = OffsetDateTime::now_utc();
        let mut record = Record {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::from_raw("k").unwrap(),
            fingerprint: Fingerprint::from_bytes([0; 32]),
            method: "POST".to_owned(),
            path: "/".to_owned(),
            lease_token: LeaseToken::new(),
            lease_expires_at: now,
            created_at: now,
            completed_at: None,
            expires_at: now + time::Duration::days(1),
            observed_at: now,
            response: None,
            transactional: false,
            steps: Vec::new(),
            request: None,
        };
        assert_eq!(retention_for(Some(&record)), TRAIL_RETENTION);
        record.expires_at = now + time::Duration::days(800);
        assert_eq!(
            retention_for(Some(&record)),
            Duration::from_secs(800 * 24 * 3600)
        );
    }
}
