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

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;

use crate::store::batch::{BatchLimits, Batched, BatchedStore, ClaimItem};
use crate::store::sql::{CLAIM_ATTEMPTS, fenced, millis};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError};
use crate::{Fingerprint, Record, RecordEvents, StoredResponse};

const INSERT: &str = "insert into idempotency_records
        (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
         transactional, created_at, expires_at)
    values (?1, ?2, ?3, ?4, ?5, 'in_flight', ?6, ?7 + ?8, ?9, ?7, ?7 + ?10)
    on conflict (scope, key) do nothing";

const GET: &str = "select fingerprint, method, path, lease_token, lease_expires_at, transactional, \
    response_status, response_headers, response_body, created_at, completed_at, expires_at \
    from idempotency_records where scope = ?1 and key = ?2";

const TAKE_OVER: &str = "update idempotency_records set
        fingerprint = ?4, method = ?5, path = ?6, state = 'in_flight', lease_token = ?7,
        lease_expires_at = ?11 + ?8, transactional = ?9,
        response_status = null, response_headers = null, response_body = null,
        created_at = ?11, completed_at = null, expires_at = ?11 + ?10
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

/// A completion waiting in a batch.
type CompleteItem = (Lease, StoredResponse);

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
    pub async fn migrate(&self) -> Result<(), crate::MigrationError> {
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
                Err(error) => return Err(crate::MigrationError(error)),
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
        .map_err(|_| crate::record::CorruptRecord("a stored time is out of range").into())
}

fn token_bytes(token: LeaseToken) -> Vec<u8> {
    token.as_uuid().as_bytes().to_vec()
}

fn record_from_row(
    row: &SqliteRow,
    scope: &str,
    key: &str,
    observed_at: OffsetDateTime,
) -> Result<Record, StoreError> {
    let corrupt = crate::record::CorruptRecord;
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
        scope: scope.to_owned(),
        key: key.to_owned(),
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
    })
}

impl BatchedStore for SqliteRecords {
    type Completion = CompleteItem;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> CompleteItem {
        (lease.clone(), response.clone())
    }

    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        // Reads first, on one connection: replays take no write lock.
        let mut results: Vec<Option<Claim>> = Vec::with_capacity(items.len());
        {
            let mut connection = self.pool.acquire().await?;
            for item in &items {
                let observed_at = OffsetDateTime::now_utc();
                let row = sqlx::query(GET)
                    .bind(&item.scope)
                    .bind(&item.key)
                    .fetch_optional(&mut *connection)
                    .await?;
                results.push(
                    row.map(|row| record_from_row(&row, &item.scope, &item.key, observed_at))
                        .transpose()?
                        .map(|record| Claim::Existing(Box::new(record))),
                );
            }
        }
        if results.iter().any(Option::is_none) {
            // The misses, in one write transaction: each insert arbitrates
            // (`on conflict do nothing`); a lost one reads the winner,
            // which the write lock keeps in place until the commit.
            let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let now = now_millis();
            for (item, result) in items.iter().zip(&mut results) {
                if result.is_some() {
                    continue;
                }
                let inserted = sqlx::query(INSERT)
                    .bind(&item.scope)
                    .bind(&item.key)
                    .bind(item.fingerprint.as_bytes().as_slice())
                    .bind(&item.method)
                    .bind(&item.path)
                    .bind(token_bytes(item.token))
                    .bind(now)
                    .bind(millis(item.lease))
                    .bind(i64::from(item.transactional))
                    .bind(millis(item.retention))
                    .execute(&mut *transaction)
                    .await?;
                if inserted.rows_affected() == 1 {
                    *result = Some(Claim::Acquired(item.as_new().lease()));
                    continue;
                }
                let observed_at = OffsetDateTime::now_utc();
                let row = sqlx::query(GET)
                    .bind(&item.scope)
                    .bind(&item.key)
                    .fetch_one(&mut *transaction)
                    .await?;
                let record = record_from_row(&row, &item.scope, &item.key, observed_at)?;
                *result = Some(Claim::Existing(Box::new(record)));
            }
            transaction.commit().await?;
        }
        Ok(results
            .into_iter()
            .map(|claim| {
                claim.ok_or_else(|| {
                    StoreError::Unavailable("a claim of the batch went unanswered".into())
                })
            })
            .collect())
    }

    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_millis();
        let mut results = Vec::with_capacity(items.len());
        for (lease, response) in &items {
            let result = sqlx::query(COMPLETE)
                .bind(lease.scope.as_str())
                .bind(lease.key.as_str())
                .bind(token_bytes(lease.token))
                .bind(i64::from(response.status.as_u16()))
                .bind(response.encode_headers())
                .bind(response.body.as_ref().map(|b| b.to_vec()))
                .bind(now)
                .execute(&mut *transaction)
                .await?;
            results.push(fenced(result.rows_affected()));
        }
        transaction.commit().await?;
        Ok(results)
    }
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
                .bind(new.scope)
                .bind(new.key)
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
            .bind(new.scope)
            .bind(new.key)
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

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let result = sqlx::query(RELEASE)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind(token_bytes(lease.token))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let observed_at = OffsetDateTime::now_utc();
        let row = sqlx::query(GET)
            .bind(scope)
            .bind(key)
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

// ---------------------------------------------------------------------------
// Operators' operations (`AdminStore`): listing and forgetting records.
// ---------------------------------------------------------------------------

/// One page of a scope's records (keyset pagination by key; SQLite compares
/// text bytewise). `?3` is the state filter's name, `?5` the clock.
const ADMIN_LIST: &str = "select key, fingerprint, method, path, lease_token, lease_expires_at, \
    transactional, response_status, response_headers, response_body, created_at, completed_at, \
    expires_at from idempotency_records
    where scope = ?1 and key > ?2 and expires_at > ?5
      and (?3 = 'any'
        or (?3 = 'completed' and state = 'completed')
        or (?3 = 'in_flight' and state = 'in_flight' and lease_expires_at > ?5)
        or (?3 = 'abandoned' and state = 'in_flight' and lease_expires_at <= ?5
            and transactional = 0))
    order by key
    limit ?4";

/// Deletes the record when the rule allows its state (`?3`: completed ones,
/// `?4`: abandoned ones; `?5` the clock), deciding and deleting in one
/// statement; a live lease always keeps it.
const ADMIN_FORGET: &str = "delete from idempotency_records
    where scope = ?1 and key = ?2
      and ((state = 'completed' and ?3) or (state = 'in_flight' and lease_expires_at <= ?5 and ?4))
    returning state";

impl crate::store::admin::AdminStore for SqliteRecords {
    async fn list(
        &self,
        scope: &str,
        filter: crate::store::admin::StateFilter,
        page: crate::store::admin::PageRequest<'_>,
    ) -> Result<crate::store::admin::Page, StoreError> {
        let limit = page.clamped_limit();
        let observed_at = OffsetDateTime::now_utc();
        let rows = sqlx::query(ADMIN_LIST)
            .bind(scope)
            .bind(page.after.unwrap_or(""))
            .bind(filter.as_str())
            .bind(i64::from(limit) + 1)
            .bind(to_millis(observed_at))
            .fetch_all(&self.pool)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                let key: String = row.try_get("key")?;
                record_from_row(row, scope, &key, observed_at)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(crate::store::admin::Page::from_overfetch(records, limit))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: crate::store::admin::ForgetRule,
    ) -> Result<crate::store::admin::Forgotten, StoreError> {
        use crate::RecordState;
        use crate::store::admin::Forgotten;
        let deleted = sqlx::query(ADMIN_FORGET)
            .bind(scope)
            .bind(key)
            .bind(rule.allows(RecordState::Completed))
            .bind(rule.allows(RecordState::Abandoned))
            .bind(now_millis())
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = deleted {
            let state: String = row.try_get("state")?;
            self.events.publish(scope, key);
            return Ok(Forgotten::Deleted(if state == "completed" {
                RecordState::Completed
            } else {
                RecordState::Abandoned
            }));
        }
        // Nothing deleted: say why (a read after the decision, for the
        // answer only).
        Ok(match self.get(scope, key).await? {
            Some(record) => Forgotten::Refused(record.state()),
            None => Forgotten::Missing,
        })
    }
}
