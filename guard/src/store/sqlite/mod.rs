//! The SQLite store: the embedded default, no server needed.
//!
//! The database runs in WAL mode with a busy timeout, so several connections
//! (and several processes on one machine) share it safely. Times are Unix
//! milliseconds from the local clock, which every process on the machine
//! shares.
//!
//! Claims and completions of concurrent requests are batched (group
//! commit, [`crate::store::batch`]): the claims that queue while one batch
//! is being written go together in one `BEGIN IMMEDIATE` transaction (one
//! commit, one fsync), after one read of each (a replay takes no write
//! lock); completions likewise. [`Batched::with_batching`] tunes or
//! turns it off.
//!
//! The folder: this file holds the store's types, its builders, the
//! statements of one call and [`Store`]; `batch.rs` the batch
//! transactions ([`BatchedStore`](crate::store::BatchedStore));
//! `admin.rs` the operators' listing and forgetting
//! ([`AdminStore`](crate::store::AdminStore)).

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;

mod admin;
mod batch;

use crate::events::RecordEvents;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::migrate::MigrationError;
use crate::record::StoredRequest;
use crate::record::{CorruptRecord, LeaseToken, Record, Step, StoredResponse};
use crate::store::batch::{BatchLimits, Batched};
use crate::store::sql::{CLAIM_ATTEMPTS, fenced, millis};
use crate::store::{Claim, Lease, NewRecord, Purge, Store, StoreError};

const INSERT: &str = "insert into idempotency_records
        (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
         transactional, created_at, expires_at)
    values (?1, ?2, ?3, ?4, ?5, 'in_flight', ?6, ?7 + ?8, ?9, ?7, ?7 + ?10)
    on conflict (scope, key) do nothing";

const GET: &str = "select fingerprint, method, path, lease_token, lease_expires_at, transactional, \
    response_status, response_headers, response_body, created_at, completed_at, expires_at, steps, \
    request from idempotency_records where scope = ?1 and key = ?2";

const TAKE_OVER: &str = "update idempotency_records set
        fingerprint = ?4, method = ?5, path = ?6, state = 'in_flight', lease_token = ?7,
        lease_expires_at = ?11 + ?8, transactional = ?9,
        response_status = null, response_headers = null, response_body = null,
        created_at = ?11, completed_at = null, expires_at = ?11 + ?10,
        steps = case when expires_at <= ?11 then null else steps end,
        request = case when expires_at <= ?11 then null else request end
    where scope = ?1 and key = ?2 and lease_token = ?3
      and (expires_at <= ?11 or (state = 'in_flight' and lease_expires_at <= ?11))";

const COMPLETE: &str = "update idempotency_records set
        state = 'completed', response_status = ?4, response_headers = ?5, response_body = ?6,
        completed_at = ?7
    where scope = ?1 and key = ?2 and lease_token = ?3 and state = 'in_flight'";

/// A lease that has ended cannot be renewed (a renewal that was on its way
/// at the cut-off must not revive an abandoned record).
const RENEW: &str = "update idempotency_records set lease_expires_at = ?4 + ?5
    where scope = ?1 and key = ?2 and lease_token = ?3 and state = 'in_flight'
      and lease_expires_at > ?4";

/// Fenced as a renewal: a lease that has ended records nothing.
const RECORD_STEPS: &str = "update idempotency_records set steps = ?5
    where scope = ?1 and key = ?2 and lease_token = ?3 and state = 'in_flight'
      and lease_expires_at > ?4";

/// Fenced as a renewal: a lease that has ended keeps no request.
const RECORD_REQUEST: &str = "update idempotency_records set request = ?5
    where scope = ?1 and key = ?2 and lease_token = ?3 and state = 'in_flight'
      and lease_expires_at > ?4";

const RELEASE: &str = "delete from idempotency_records
    where scope = ?1 and key = ?2 and lease_token = ?3 and state = 'in_flight'";

const PURGE: &str = "delete from idempotency_records where rowid in (
        select rowid from idempotency_records where expires_at <= ?1 order by expires_at limit ?2)";

/// The default batching: up to 128 claims (or completions) per
/// transaction, one transaction of each on its way at a time (SQLite has
/// one writer).
pub const DEFAULT_BATCHING: BatchLimits = BatchLimits {
    max_batch: 128,
    max_in_flight: 1,
};

/// Records in an SQLite database, in the table `idempotency_records`, with
/// claims and completions batched ([`DEFAULT_BATCHING`]): [`SqliteRecords`]
/// wrapped in [`Batched`].
pub type SqliteStore = Batched<SqliteRecords>;

/// Records in an SQLite database, each call on its own: the store that
/// [`SqliteStore`] batches.
#[derive(Debug, Clone)]
pub struct SqliteRecords {
    pool: SqlitePool,
    events: RecordEvents,
}

impl SqliteStore {
    /// Wraps a pool. Run [`SqliteStore::migrate`] once before use.
    /// Claims and completions are batched ([`DEFAULT_BATCHING`]).
    pub fn new(pool: SqlitePool) -> Self {
        Batched::wrap(
            SqliteRecords {
                pool,
                events: RecordEvents::new(),
            },
            DEFAULT_BATCHING,
        )
    }

    /// Opens (creating it if missing) the database at `url`
    /// (`sqlite://path/to/file.db`), in WAL mode with a 5 s busy timeout and
    /// `synchronous = FULL`: every commit reaches the disk before the guard
    /// goes on, so a power loss forgets no claim and no stored response.
    /// (`NORMAL`, which is faster, may lose the last commits on power loss
    /// though never on a process crash; choose it with [`SqliteStore::new`]
    /// over a pool of your own if that is acceptable.)
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or the file
    /// cannot be opened.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        // No ping before every statement (sqlx's default): the file is
        // local, and a failing connection fails its statement anyway.
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        Ok(Self::new(pool))
    }

    /// A store in memory, migrated and empty: **for tests and
    /// single-process tools only, never for production** (its records are
    /// lost when the store, or the process, ends; no other process sees
    /// them).
    ///
    /// It is the SQLite store, so it behaves as the file-backed one does
    /// (it passes the same store, engine and guard suites), over one
    /// connection to a private `sqlite::memory:` database that the pool
    /// never closes. (Each pooled connection to `sqlite::memory:` would
    /// open a database of its own: one connection is what keeps every call
    /// on the same records.) Each call opens a new, separate database, so
    /// tests that each call it do not see each other's keys.
    ///
    /// ```
    /// # async fn run() -> Result<(), idempotency_guard::StoreError> {
    /// use idempotency_guard::{IdempotencyLayer, store::sqlite::SqliteStore};
    ///
    /// let store = SqliteStore::memory().await?;
    /// let layer = IdempotencyLayer::new(store);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database cannot be opened or
    /// migrated.
    pub async fn memory() -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?;
        // One connection that lives as long as the pool: closing it would
        // drop the database.
        let pool = SqlitePoolOptions::new()
            .min_connections(1)
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        let store = Self::new(pool);
        store
            .migrate()
            .await
            .map_err(|error| StoreError::Unavailable(Box::new(error)))?;
        Ok(store)
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &SqlitePool {
        &self.direct().pool
    }

    /// Applies the migrations in `migrations/sqlite` that have not run yet.
    ///
    /// Safe to run from several processes at once: SQLite has no advisory
    /// lock, so two processes may both start the same migration; the loser
    /// fails inside its transaction (nothing of it stays) and tries again,
    /// finding the migration done.
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        const ATTEMPTS: u32 = 5;
        let mut attempt = 1;
        loop {
            match crate::migrate::sqlite_migrator().run(self.pool()).await {
                Ok(()) => return Ok(()),
                Err(
                    sqlx::migrate::MigrateError::Execute(_)
                    | sqlx::migrate::MigrateError::ExecuteMigration(..),
                ) if attempt < ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    attempt += 1;
                }
                Err(error) => return Err(MigrationError(error)),
            }
        }
    }
}

fn now_millis() -> i64 {
    to_millis(OffsetDateTime::now_utc())
}

fn to_millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

fn from_millis(millis: i64) -> Result<OffsetDateTime, StoreError> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000)
        .map_err(|_| CorruptRecord("a stored time is out of range").into())
}

fn token_bytes(token: LeaseToken) -> Vec<u8> {
    token.as_uuid().as_bytes().to_vec()
}

fn record_from_row(
    row: &SqliteRow,
    scope: &Scope,
    key: &IdempotencyKey,
    observed_at: OffsetDateTime,
) -> Result<Record, StoreError> {
    let corrupt = CorruptRecord;
    let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| corrupt("the fingerprint is not 32 bytes"))?;
    let token: Vec<u8> = row.try_get("lease_token")?;
    let token =
        uuid::Uuid::from_slice(&token).map_err(|_| corrupt("the lease token is not 16 bytes"))?;
    let status: Option<i64> = row.try_get("response_status")?;
    let response = match status {
        Some(status) => {
            let headers: Option<Vec<u8>> = row.try_get("response_headers")?;
            let body: Option<Vec<u8>> = row.try_get("response_body")?;
            Some(StoredResponse::decode(
                status,
                &headers.unwrap_or_default(),
                body.map(bytes::Bytes::from),
            )?)
        }
        None => None,
    };
    Ok(Record {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes(fingerprint),
        method: row.try_get("method")?,
        path: row.try_get("path")?,
        lease_token: LeaseToken::from_uuid(token),
        lease_expires_at: from_millis(row.try_get("lease_expires_at")?)?,
        transactional: row.try_get::<i64, _>("transactional")? != 0,
        response,
        created_at: from_millis(row.try_get("created_at")?)?,
        completed_at: row
            .try_get::<Option<i64>, _>("completed_at")?
            .map(from_millis)
            .transpose()?,
        expires_at: from_millis(row.try_get("expires_at")?)?,
        observed_at,
        steps: Step::decode_all(row.try_get::<Option<Vec<u8>>, _>("steps")?.as_deref())?,
        request: StoredRequest::decode_optional(
            row.try_get::<Option<Vec<u8>>, _>("request")?.as_deref(),
        )?,
    })
}

impl Store for SqliteRecords {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        // A read first: a replay then costs no write lock (SQLite has one
        // writer at a time). The insert that follows a miss is what
        // arbitrates: `on conflict do nothing` lets one claimer win.
        if let Some(record) = self.get(new.scope, new.key).await? {
            return Ok(Claim::Existing(Box::new(record)));
        }
        for _ in 0..CLAIM_ATTEMPTS {
            let inserted = sqlx::query(INSERT)
                .bind(new.scope.as_str())
                .bind(new.key.as_str())
                .bind(new.fingerprint.as_bytes().as_slice())
                .bind(new.method)
                .bind(new.path)
                .bind(token_bytes(new.token))
                .bind(now_millis())
                .bind(millis(new.lease))
                .bind(i64::from(new.transactional))
                .bind(millis(new.retention))
                .execute(&self.pool)
                .await?;
            if inserted.rows_affected() == 1 {
                return Ok(Claim::Acquired(new.lease()));
            }
            // The insert lost to a record made since the read: report it.
            // If it was released in between, insert again.
            if let Some(record) = self.get(new.scope, new.key).await? {
                return Ok(Claim::Existing(Box::new(record)));
            }
        }
        Err(StoreError::Unavailable(
            "the claim kept racing a concurrent release".into(),
        ))
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        let result = sqlx::query(TAKE_OVER)
            .bind(new.scope.as_str())
            .bind(new.key.as_str())
            .bind(token_bytes(previous))
            .bind(new.fingerprint.as_bytes().as_slice())
            .bind(new.method)
            .bind(new.path)
            .bind(token_bytes(new.token))
            .bind(millis(new.lease))
            .bind(i64::from(new.transactional))
            .bind(millis(new.retention))
            .bind(now_millis())
            .execute(&self.pool)
            .await?;
        Ok((result.rows_affected() == 1).then(|| new.lease()))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let result = sqlx::query(COMPLETE)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .bind(i64::from(response.status.as_u16()))
            .bind(response.encode_headers())
            .bind(response.body.as_ref().map(|b| b.to_vec()))
            .bind(now_millis())
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let result = sqlx::query(RENEW)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .bind(now_millis())
            .bind(millis(duration))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        let result = sqlx::query(RECORD_STEPS)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .bind(now_millis())
            .bind(Step::encode_all(steps))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(RECORD_REQUEST)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .bind(now_millis())
            .bind(request.map(StoredRequest::encode))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let result = sqlx::query(RELEASE)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let observed_at = OffsetDateTime::now_utc();
        let row = sqlx::query(GET)
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| record_from_row(&row, scope, key, observed_at))
            .transpose()
    }

    fn events(&self) -> &RecordEvents {
        &self.events
    }
}

impl Purge for SqliteRecords {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        let result = sqlx::query(PURGE)
            .bind(now_millis())
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }
}
