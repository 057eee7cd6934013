//! The peer: the crate `idempotent` 0.3.0 with its Valkey/Redis store.
//!
//! It ships a store and typed entries but no HTTP layer, so this module is
//! the thin axum middleware its README's example describes, written as its
//! users would: key from `Idempotency-Key`, body read up to 1 MiB (our
//! guard's default limit), fingerprint with its default strategy (xxh3 of
//! `"<method> <path>:" + body`), one `try_insert` (a Lua script), the
//! handler, one `complete` (a second script) on a fresh key; one
//! `try_insert` answering the stored entry on a replay. Its store cannot
//! keep response headers (`Metadata` has no public constructor), so a
//! replay gets the status, the body and `content-type: application/json`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

/// The largest request or response body read (our guard's default).
const BODY_LIMIT: usize = 1024 * 1024;
/// How long an entry lives (our guard's default retention).
const TTL: Duration = Duration::from_secs(24 * 3600);

/// The peer's store, shared by every request.
#[derive(Clone)]
pub(crate) struct Peer {
    store: Arc<ValkeyStore>,
}

impl Peer {
    /// Connects the peer's store to `url`, its keys under `prefix`.
    pub(crate) async fn connect(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let store = ValkeyStore::with_prefix(client, Some(prefix)).await?;
        Ok(Self {
            store: Arc::new(store),
        })
    }
}

fn problem(status: StatusCode, what: &'static str) -> Response {
    (status, what).into_response()
}

/// The middleware: at most one execution per key, replays from the store.
pub(crate) async fn guard(State(peer): State<Peer>, request: Request, next: Next) -> Response {
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| IdempotencyKey::new(value).ok())
    else {
        return problem(StatusCode::BAD_REQUEST, "key missing or invalid");
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, BODY_LIMIT).await else {
        return problem(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    };
    let operation = format!("{} {}", parts.method, parts.uri.path());
    let fingerprint = DefaultFingerprintStrategy.compute(&operation, &body);
    let entry = IdempotencyEntry::new(fingerprint, TTL);
    match peer.store.try_insert(&key, entry.clone()).await {
        Ok(InsertResult::Claimed { fencing_token }) => {
            let response = next.run(Request::from_parts(parts, Body::from(body))).await;
            let (parts, body) = response.into_parts();
            let Ok(body) = to_bytes(body, BODY_LIMIT).await else {
                let _ = peer.store.remove(&key).await;
                return problem(StatusCode::INTERNAL_SERVER_ERROR, "response body failed");
            };
            if parts.status.is_server_error() {
                let _ = peer.store.remove(&key).await;
            } else {
                let cached = CachedResponse {
                    status_code: parts.status.as_u16(),
                    metadata: Metadata::default(),
                    body: body.clone(),
                };
                if peer
                    .store
                    .complete(&key, entry.complete(cached), fencing_token)
                    .await
                    .is_err()
                {
                    return problem(StatusCode::SERVICE_UNAVAILABLE, "could not store");
                }
            }
            Response::from_parts(parts, Body::from(body))
        }
        Ok(InsertResult::Exists(ExistingEntry::Completed(done))) => {
            if !done.fingerprint_matches(fingerprint) {
                return problem(StatusCode::CONFLICT, "key reused");
            }
            let cached = done.into_response();
            let status = StatusCode::from_u16(cached.status_code).unwrap_or(StatusCode::OK);
            let mut response = Response::new(Body::from(cached.body));
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            response
        }
        Ok(InsertResult::Exists(ExistingEntry::Processing(_))) => {
            problem(StatusCode::CONFLICT, "request in flight")
        }
        Err(_) => problem(StatusCode::SERVICE_UNAVAILABLE, "store unavailable"),
    }
}
