//! The hand-written guard: what a user writes instead of ours, on
//! PostgreSQL or SQLite, for the baseline of the SQL stores' fresh keys.
//!
//! Naive and correct, one statement per step, no batching: the key from
//! `Idempotency-Key` (400 when missing), a SHA-256 of the body, then one
//! `insert … on conflict (key) do nothing` claims the key. The winner runs
//! the handler and stores its status and body with one `update`; a loser
//! reads the row with one `select`: no status yet answers 409 (in flight),
//! another body's fingerprint 422, else the stored status and body
//! (`content-type: application/json`, `idempotent-replayed: true`). A store
//! error answers 503; a completion that fails leaves the key in flight (no
//! lease, no retention: what the naive version does not have).
//!
//! The pools are those of the guard's stores, so the comparison is fair:
//! PostgreSQL as `PostgresStore::connect` (`--pool-size` connections, a 5 s
//! acquire timeout, no ping before acquiring, `statement_timeout = 5s`),
//! in the guard's database; SQLite as `SqliteStore::connect` (8
//! connections, a 5 s acquire timeout, no ping before acquiring, WAL,
//! `synchronous = FULL`, a 5 s busy timeout), on the same file.

use std::str::FromStr as _;
use std::time::Duration;

use axum::body::{Body, Bytes, to_bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};

/// The largest response body stored (our guard's default limit).
const BODY_LIMIT: usize = 1024 * 1024;

/// The table on PostgreSQL.
const PG_CREATE: &str = "create table if not exists handwritten_keys (
        key text primary key, fingerprint bytea not null, status integer, body bytea,
        created_at bigint not null)";
/// The claim on PostgreSQL.
const PG_CLAIM: &str = "insert into handwritten_keys (key, fingerprint, status, body, created_at)
    values ($1, $2, null, null, $3) on conflict (key) do nothing";
/// The completion on PostgreSQL.
const PG_COMPLETE: &str = "update handwritten_keys set status = $2, body = $3 where key = $1";
/// The read of a claimed key on PostgreSQL.
const PG_LOOKUP: &str = "select fingerprint, status, body from handwritten_keys where key = $1";

/// The table on SQLite.
const SQLITE_CREATE: &str = "create table if not exists handwritten_keys (
        key text primary key, fingerprint blob not null, status integer, body blob,
        created_at integer not null)";
/// The claim on SQLite.
const SQLITE_CLAIM: &str =
    "insert into handwritten_keys (key, fingerprint, status, body, created_at)
    values (?1, ?2, null, null, ?3) on conflict (key) do nothing";
/// The completion on SQLite.
const SQLITE_COMPLETE: &str = "update handwritten_keys set status = ?2, body = ?3 where key = ?1";
/// The read of a claimed key on SQLite.
const SQLITE_LOOKUP: &str = "select fingerprint, status, body from handwritten_keys where key = ?1";

/// Empties the table at startup on PostgreSQL (the harness truncates only
/// the guard's records; a truncate, as theirs, leaves no dead rows behind).
const PG_CLEAR: &str = "truncate handwritten_keys";
/// Empties the table at startup on SQLite (the harness gives every run a
/// fresh file: this is for a file used twice).
const SQLITE_CLEAR: &str = "delete from handwritten_keys";

/// The row of a claimed key: its fingerprint, and its status and body once
/// completed.
type Stored = (Vec<u8>, Option<i32>, Option<Vec<u8>>);

/// The hand-written guard's table, on one of the two SQL databases.
#[derive(Debug, Clone)]
pub(crate) enum Table {
    /// On PostgreSQL.
    Postgres(PgPool),
    /// On SQLite.
    Sqlite(SqlitePool),
}

impl Table {
    /// Connects to the PostgreSQL database at `url` with a pool of
    /// `pool_size`, creates the table if missing and empties it.
    pub(crate) async fn postgres(url: &str, pool_size: u32) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(url)?.options([("statement_timeout", "5s")]);
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        sqlx::query(PG_CREATE).execute(&pool).await?;
        sqlx::query(PG_CLEAR).execute(&pool).await?;
        Ok(Self::Postgres(pool))
    }

    /// Opens (creating it if missing) the SQLite database at `url`, creates
    /// the table if missing and empties it.
    pub(crate) async fn sqlite(url: &str) -> anyhow::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        sqlx::query(SQLITE_CREATE).execute(&pool).await?;
        sqlx::query(SQLITE_CLEAR).execute(&pool).await?;
        Ok(Self::Sqlite(pool))
    }

    /// Inserts the key unless it is there: whether this request won it.
    async fn claim(&self, key: &str, fingerprint: &[u8]) -> sqlx::Result<bool> {
        let now = now_millis();
        let rows = match self {
            Self::Postgres(pool) => sqlx::query(PG_CLAIM)
                .bind(key)
                .bind(fingerprint)
                .bind(now)
                .execute(pool)
                .await?
                .rows_affected(),
            Self::Sqlite(pool) => sqlx::query(SQLITE_CLAIM)
                .bind(key)
                .bind(fingerprint)
                .bind(now)
                .execute(pool)
                .await?
                .rows_affected(),
        };
        Ok(rows == 1)
    }

    /// Stores the handler's status and body under the key.
    async fn complete(&self, key: &str, status: i32, body: &[u8]) -> sqlx::Result<()> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query(PG_COMPLETE)
                    .bind(key)
                    .bind(status)
                    .bind(body)
                    .execute(pool)
                    .await?;
            }
            Self::Sqlite(pool) => {
                sqlx::query(SQLITE_COMPLETE)
                    .bind(key)
                    .bind(status)
                    .bind(body)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// The row of the key (none when it vanished since the claim lost).
    async fn lookup(&self, key: &str) -> sqlx::Result<Option<Stored>> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_as(PG_LOOKUP)
                    .bind(key)
                    .fetch_optional(pool)
                    .await
            }
            Self::Sqlite(pool) => {
                sqlx::query_as(SQLITE_LOOKUP)
                    .bind(key)
                    .fetch_optional(pool)
                    .await
            }
        }
    }
}

/// Unix milliseconds, the `created_at` of a claim.
fn now_millis() -> i64 {
    let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// A rejection: its status and a short text.
fn reject(status: StatusCode, what: &'static str) -> Response {
    (status, what).into_response()
}

/// Runs `handler` on `body` at most once per `Idempotency-Key`, the way a
/// user writes it by hand: claim, handler, completion; or the stored answer.
pub(crate) async fn guarded<F, Fut>(
    table: &Table,
    headers: &HeaderMap,
    body: Bytes,
    handler: F,
) -> Response
where
    F: FnOnce(Bytes) -> Fut,
    Fut: Future<Output = Response>,
{
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
    else {
        return reject(StatusCode::BAD_REQUEST, "Idempotency-Key missing");
    };
    let fingerprint = Sha256::digest(&body);
    match table.claim(key, &fingerprint).await {
        Ok(true) => {
            let response = handler(body).await;
            let (parts, body) = response.into_parts();
            let Ok(body) = to_bytes(body, BODY_LIMIT).await else {
                return reject(StatusCode::INTERNAL_SERVER_ERROR, "response body failed");
            };
            let status = i32::from(parts.status.as_u16());
            if table.complete(key, status, &body).await.is_err() {
                return reject(StatusCode::SERVICE_UNAVAILABLE, "could not store");
            }
            Response::from_parts(parts, Body::from(body))
        }
        Ok(false) => match table.lookup(key).await {
            Ok(Some((_, None, _))) => reject(StatusCode::CONFLICT, "request in flight"),
            Ok(Some((stored, _, _))) if stored[..] != fingerprint[..] => {
                reject(StatusCode::UNPROCESSABLE_ENTITY, "key reused")
            }
            Ok(Some((_, Some(status), body))) => {
                let status = u16::try_from(status)
                    .ok()
                    .and_then(|status| StatusCode::from_u16(status).ok())
                    .unwrap_or(StatusCode::OK);
                let mut response = Response::new(Body::from(body.unwrap_or_default()));
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
            Ok(None) => reject(StatusCode::CONFLICT, "request in flight"),
            Err(_) => reject(StatusCode::SERVICE_UNAVAILABLE, "store unavailable"),
        },
        Err(_) => reject(StatusCode::SERVICE_UNAVAILABLE, "store unavailable"),
    }
}
