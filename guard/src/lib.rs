//! An idempotency guard for axum write routes: a retried request never runs
//! its handler twice.
//!
//! A client that timed out, got a 502/504 or lost its connection does not
//! know whether its write ran. With this layer in front of the route it can
//! simply send the same request again with the same `Idempotency-Key`: if the
//! first one ran, it gets the stored response; if it is still running, it is
//! told so; if it never ran, it runs now, once.
//!
//! # Quick start
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idempotency_guard::{IdempotencyLayer, store::AnyStore};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let store = AnyStore::connect("sqlite://idempotency.db?mode=rwc").await?;
//! store.migrate().await?;
//! let app = Router::new()
//!     .route("/payments", post(|| async { (http::StatusCode::CREATED, "paid") }))
//!     .route_layer(IdempotencyLayer::new(store).with_scope(|parts| {
//!         parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("default").into()
//!     }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! Mount it with `route_layer`, not `layer`, so an unknown route still
//! answers 404 rather than 400 `key-missing`.
//!
//! # What a request gets
//!
//! | situation | response | handler runs |
//! |---|---|---|
//! | method not guarded (default: not POST or PATCH) | handler's | yes |
//! | no key, key required (default) | 400 `key-missing` | no |
//! | no key, key optional | handler's | yes, unguarded |
//! | key invalid (not 1–255 visible ASCII, malformed sf-string, sent twice) | 400 `key-invalid` | no |
//! | scope from the app's scope function empty, over 255 bytes or holding a control character | 400 `scope-invalid` | no |
//! | body over the limit (default 1 MiB) | 413 `body-too-large` | no |
//! | body cannot be read to its end | 400 `body-unreadable` | no |
//! | bodies being buffered at once fill the budget (`with_max_buffered_bytes`; off by default) | 503 `body-buffer-full` with `Retry-After` | no |
//! | new key | handler's, stored before it is sent | yes, once |
//! | same key and fingerprint, completed | stored status, headers and body, plus `Idempotent-Replayed: true` | no |
//! | same key, different fingerprint | 409 `key-reused` (configurable, e.g. 422) | no |
//! | same key, still in flight | 409 `request-in-flight` with `Retry-After`; or, when the route waits, the replay once the first finishes (up to a bound) | no |
//! | same key, earlier run abandoned | 409 `outcome-unknown` (configurable: run again, or resume with its recorded steps) | no (default) |
//! | same key, response was over the stored-response limit | 409 `response-not-stored` | no |
//! | store unreachable or failing | 503 `store-unavailable` with `Retry-After` | no (fail closed) |
//! | handler refuses before starting its work (an extractor rejection: 400, 413, 415, 422 not marked [`FinalResponse`]) | the rejection, not stored; the key is released | no work done |
//! | handler past the maximum handler time (its response body included) | 504 `handler-timeout`; the key becomes abandoned (released in transactional mode when the handler began its `Tx`) | cut off |
//! | handler panics or fails | 500 `handler-failed`; the key is released | once |
//!
//! Every answer of the guard's own is `application/problem+json` (RFC 9457)
//! with `type` = `urn:idempotency:<name>`, `title`, `status`, `detail`, and
//! the key in `key` when the request had a valid one. See [`engine::Refusal`].
//!
//! # The record's life
//!
//! ```text
//!            claim (atomic insert)            complete (fenced)
//!   (none) ─────────────────────────▶ in_flight ───────────────▶ completed
//!     ▲                                 │   │                        │
//!     │  release (fenced): 5xx, 408,    │   │ lease ends unrenewed   │ retention
//!     └──── 425, 429, no-store, panic ──┘   ▼ (crash, or cut off)     ▼ passes
//!                                        abandoned ──▶ taken over   purged
//!                                        (409 outcome-unknown,     (key free
//!                                         or run again if allowed)   again)
//! ```
//!
//! - The **claim** is one atomic statement against the `(scope, key)`
//!   unique constraint: two requests can never both win it.
//! - The winner holds a **lease** (default 60 s) that the guard renews every
//!   third of its length while the handler runs. Every later write
//!   (complete, renew, release, take over) names the lease's token and
//!   changes nothing if the record carries another one (**fencing**).
//! - A crashed process stops renewing; its records turn **abandoned** within
//!   one lease. An abandoned run may or may not have had effects, so by
//!   default its key answers `outcome-unknown` until retention ends.
//! - **Retention** (default 24 h) counts from the claim. After it the key
//!   may be used again, and the record is deleted by whatever runs
//!   [`purge_periodically`] or [`purge_expired`]: nothing purges on its own
//!   (the key-status service does on its store; Redis and NATS expire their
//!   records themselves).
//!
//! # Guarantees
//!
//! - For one `(scope, key)`, the handler runs at most once per retention
//!   period, however many requests arrive at once, unless the app opts into
//!   running abandoned keys again ([`AbandonedPolicy::RunAgain`], or
//!   [`AbandonedPolicy::Resume`], which skips the steps the abandoned run
//!   recorded: [`engine::Run`]).
//! - A response is stored before it is sent; a replay is the same status,
//!   headers (less hop-by-hop ones, `Date` and `Set-Cookie`) and body, byte
//!   for byte.
//! - Everything from the claim on runs in a task of its own (see
//!   [`engine`]): a client that disconnects, even while its claim is still
//!   on its way to the store, cancels nothing; the run finishes and its
//!   retry gets the replay. A claim whose reply is lost (a timeout, a
//!   dropped connection) is released in the background, fenced by its own
//!   token, so the key is never left owned by nobody.
//! - On shutdown, [`Drain::wait`] (one line after `axum::serve`) lets every
//!   running request finish and store its response.
//! - If the store cannot be reached, the handler does not run (unless the
//!   app chose [`FailureMode::Open`]).
//! - Memory per request is bounded by the body limit plus the
//!   stored-response limit.
//!
//! # Non-guarantees
//!
//! - Outside transactional mode, a handler cut off or crashed mid-way may
//!   have had some effects: the guard reports the outcome as unknown rather
//!   than guessing.
//! - A response larger than the stored-response limit reaches the first
//!   caller only; replays answer `response-not-stored`.
//! - If the store fails just as a response is being stored, the first caller
//!   still gets it, but retries see the run as abandoned.
//! - Waiting for an in-flight request (the wait policy) is woken at once
//!   inside one process, and across processes on Redis, the tiered store
//!   and PostgreSQL with notifications on
//!   ([`PostgresStore::with_notifications`](store::postgres::PostgresStore::with_notifications));
//!   on SQLite, or PostgreSQL without notifications, a waiter in another
//!   process reads the record again when its wait bound or the lease ends.
//!
//! # Transactional mode (PostgreSQL)
//!
//! With [`IdempotencyLayer::with_transactional_mode`], handlers take a
//! [`Tx`] and write through it; the guard commits those writes in the same
//! transaction that stores the response. A crash, a timeout or a lost lease
//! rolls both back, so a retry runs exactly once and no outcome is unknown.
//! Other requests see the key in flight meanwhile. The record is marked
//! transactional when the handler takes its `Tx`, not before: a handler that
//! never does is guarded as in default mode (a crash leaves its outcome
//! unknown). A handler's writes that do not go through its `Tx` get none of
//! this.
//!
//! # Beyond axum: the engine
//!
//! [`Engine::run`] is the same run-once core for code that is not an axum
//! route (message consumers, jobs): a scope, a key, a fingerprint and a
//! future; see [`engine`].
//!
//! # Fingerprints
//!
//! SHA-256 over the method, path and query, and the body; a JSON body is
//! hashed in canonical form (see [`fingerprint`]).
//!
//! # Features
//!
//! By default the engine, the axum layer and the embedded store (`sqlite`)
//! and no more; everything else is a feature you name (each item behind one
//! says which on docs.rs):
//!
//! - `sqlite` (default): [`store::sqlite::SqliteStore`], the embedded
//!   default, and its in-memory form for tests
//!   ([`SqliteStore::memory`](store::sqlite::SqliteStore::memory)).
//! - `postgres`: [`store::postgres::PostgresStore`] and transactional mode.
//! - `redis`: [`store::redis::RedisStore`] (one Redis or a Redis Cluster)
//!   and [`store::tiered::TieredStore`] (Redis in front of PostgreSQL);
//!   turns `postgres` on.
//! - `nats`: `store::nats`, NATS JetStream KV (NATS 2.11 or later),
//!   replicated by consensus; name `sqlite` or `postgres` with it (see
//!   below).
//! - `prometheus`: `telemetry::install_prometheus`, a recorder for the
//!   guard's metrics (the metrics themselves go through the [`metrics`]
//!   facade whatever the features).
//! - `logs`: `telemetry::logs`, plain-text or JSON logs chosen by
//!   `LOG_FORMAT`.
//! - `server`: `server::Server`, an accept loop that bounds every client
//!   connection, and `server::BodyTimeoutLayer`.
//! - `otel`: OpenTelemetry traces: spans for the claim, the handler,
//!   every store call and the settlement, carrying the outcome, the route
//!   and a hash of the key (never the key, never a body); W3C
//!   `traceparent` continued from incoming requests; an OTLP/HTTP exporter
//!   (see `telemetry::otel`).
//! - `openapi`: `utoipa::ToSchema` on [`problem::Problem`].
//!
//! At least one of `sqlite`, `postgres` or `redis` is needed, `nats` alone
//! not sufficing: without one the build fails with a message naming them.
//!
//! # Metrics
//!
//! Through the [`metrics`] facade; see [`telemetry`].

// docs.rs (`--cfg docsrs`, nightly) marks each feature-gated item with its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The crate docs link items of every store; built with fewer features
// (`cargo doc` with the defaults: SQLite only), a link to a store left out
// shows as plain text instead of failing the build. docs.rs builds them all.
#![cfg_attr(
    not(all(feature = "postgres", feature = "redis")),
    allow(rustdoc::broken_intra_doc_links)
)]

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!(
    "idempotency-guard needs a store: enable the feature `postgres`, `sqlite` or `redis`"
);

pub mod adapter;
mod decision;
pub mod engine;
mod events;
pub mod fingerprint;
pub mod headers;
mod key;
pub mod layer;
mod migrate;
pub mod problem;
mod purge;
mod record;
mod refusal;
mod replay;
mod response;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;
pub mod store;
pub mod telemetry;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod transaction {
    //! Transactional mode (PostgreSQL): the handler's writes and its stored
    //! response commit in one transaction (see [`Tx`]). The engine's half is
    //! `engine/transaction/`, the axum extractor's `layer/tx.rs`.

    pub use crate::engine::transaction::{Tx, TxRejection};
}

pub use decision::{AbandonedPolicy, InFlightPolicy};
pub use engine::{Drain, Engine, FailureMode};
pub use events::{RecordEvents, Subscription, Watcher};
pub use fingerprint::Fingerprint;
pub use key::{
    IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN, MAX_SCOPE_LEN, Scope, ScopeError,
};
pub use layer::{FinalResponse, IdempotencyLayer, IdempotencyService, OutcomeUnknown};
pub use migrate::{MIGRATIONS_TABLE, MigrationError};
pub use purge::{purge_expired, purge_periodically};
pub use record::{CorruptRecord, Record, RecordState, Step, StoredRequest, StoredResponse};
pub use replay::{RedactFn, ReplayPolicy};
pub use response::{IDEMPOTENT_REPLAYED, default_stored_status};
pub use store::{AnyStore, Purge, Store, StoreError};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use transaction::Tx;
