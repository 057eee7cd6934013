//! The PostgreSQL store: durable, for production, and the only store with
//! transactional mode.
//!
//! Every operation is one statement. Time comparisons use the database's
//! clock (`now()`), so app servers with skewed clocks agree on leases.
//!
//! Claims and completions of concurrent requests are batched (group
//! commit, [`crate::store::batch`]): while one claim statement is on its
//! way, the claims that queue meanwhile go together in the next one
//! (`insert … select from unnest(…) on conflict do nothing`, one row of
//! answer per claim), and completions likewise (`update … from unnest(…)`,
//! fenced per row). One statement and one commit then serve many requests.
//! [`Batched::with_batching`] tunes or turns it off.
//!
//! The folder: this file holds the store's types, its builders, the
//! statements of one call and [`Store`]; `batch.rs` the batch statements
//! ([`BatchedStore`](crate::store::BatchedStore)); `admin.rs` the
//! operators' listing and forgetting
//! ([`AdminStore`](crate::store::AdminStore)); `single_commit.rs` the
//! store's half of single-commit transactional mode; `kept.rs` the
//! connections runs' transactions end on, kept for the next run (sqlx's
//! pool would ping each one it takes back).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Row};
use time::OffsetDateTime;

use crate::events::RecordEvents;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::migrate::MigrationError;
use crate::record::StoredRequest;
use crate::record::{CorruptRecord, LeaseToken, Record, Step, StoredResponse};
use crate::store::batch::{BatchLimits, Batched};
use crate::store::sql::{CLAIM_ATTEMPTS, fenced, millis};
use crate::store::{Claim, Lease, NewRecord, Purge, Store, StoreError, TransactionalStore};

/// The columns every read returns, `observed_at` being the database's clock.
macro_rules! record_columns {
    () => {
        "fingerprint, method, path, lease_token, lease_expires_at, transactional, \
         response_status, response_headers, response_body, created_at, completed_at, \
         expires_at, steps, request, now() as observed_at"
    };
}

mod admin;
mod batch;
mod kept;
mod single_commit;

pub use kept::RunTransaction;
pub use single_commit::{LockedClaim, lock_key};

/// The claim, one statement: it reads the record first and inserts only
/// when its snapshot has none, so claiming a completed key (a replay) costs
/// a read. The insert still arbitrates: against a concurrent insert the
/// unique constraint picks one winner (`on conflict do nothing`).
const CLAIM: &str = concat!(
    "with existing as (
        select ",
    record_columns!(),
    " from idempotency_records where scope = $1 and key = $2
    ), inserted as (
        insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
        select $1, $2, $3, $4, $5, 'in_flight', $6, now() + $7 * interval '1 millisecond',
               $8, now(), now() + $9 * interval '1 millisecond'
        where not exists (select 1 from existing)
        on conflict (scope, key) do nothing
        returning 1
    )
    select exists (select 1 from inserted) as acquired, existing.*
    from (values (1)) as one
    left join existing on true"
);

const TAKE_OVER: &str = "update idempotency_records set
        fingerprint = $4, method = $5, path = $6, state = 'in_flight', lease_token = $7,
        lease_expires_at = now() + $8 * interval '1 millisecond', transactional = $9,
        response_status = null, response_headers = null, response_body = null,
        created_at = now(), completed_at = null,
        expires_at = now() + $10 * interval '1 millisecond',
        steps = case when expires_at <= now() then null else steps end,
        request = case when expires_at <= now() then null else request end
    where scope = $1 and key = $2 and lease_token = $3
      and (expires_at <= now() or (state = 'in_flight' and lease_expires_at <= now()))";

const COMPLETE: &str = "update idempotency_records set
        state = 'completed', response_status = $4, response_headers = $5, response_body = $6,
        completed_at = clock_timestamp()
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'";

/// A lease that has ended cannot be renewed: a renewal that was on its way
/// when the run was cut off must not revive the abandoned record. The
/// statement clock (re-read after waiting for a row lock) decides.
const RENEW: &str = "update idempotency_records
    set lease_expires_at = clock_timestamp() + $4 * interval '1 millisecond'
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'
      and lease_expires_at > clock_timestamp()";

/// Fenced as a renewal: a lease that has ended records nothing.
const RECORD_STEPS: &str = "update idempotency_records set steps = $4
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'
      and lease_expires_at > clock_timestamp()";

/// Single-commit mode: the key's lock fences the write (no lease is
/// renewed there, and nobody else can take the key while it is held).
const RECORD_STEPS_LOCKED: &str = "update idempotency_records set steps = $4
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'";

/// Fenced as a renewal: a lease that has ended keeps no request.
const RECORD_REQUEST: &str = "update idempotency_records set request = $4
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'
      and lease_expires_at > clock_timestamp()";

/// Marks the record transactional when the run begins its transaction.
const MARK_TRANSACTIONAL: &str = "update idempotency_records set transactional = true
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'";

const RELEASE: &str = "delete from idempotency_records
    where scope = $1 and key = $2 and lease_token = $3 and state = 'in_flight'";

const GET: &str = concat!(
    "select ",
    record_columns!(),
    " from idempotency_records where scope = $1 and key = $2"
);

const GET_MANY: &str = concat!(
    "select key, ",
    record_columns!(),
    " from idempotency_records where scope = $1 and key = any($2)"
);

const PURGE: &str = "delete from idempotency_records where (scope, key) in (
        select scope, key from idempotency_records
        where expires_at <= now()
        order by expires_at
        limit $1
        for update skip locked)";

/// The channel of `NOTIFY` messages (see [`PostgresStore::with_notifications`]).
pub const NOTIFY_CHANNEL: &str = "idempotency_records";

const NOTIFY: &str = "select pg_notify($1, $2)";

/// [`Store::settle`]'s probe, in a transaction always rolled back: an
/// insert of the key that conflicts with, and so waits behind, a claim or
/// takeover of it still in progress (a commit waiting for a synchronous
/// standby). `do update … where false` locks a committed row without
/// changing it; the insert of a key that has no row is rolled back.
const SETTLE: &str = "insert into idempotency_records
        (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
         transactional, created_at, expires_at)
    values ($1, $2, $3, '', '', 'in_flight', $4, now(), false, now(), now())
    on conflict (scope, key) do update set state = idempotency_records.state where false";

/// Aborts the `LISTEN` task when the last clone of the store is dropped.
#[derive(Debug)]
struct Listener(tokio::task::AbortHandle);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The default batching: up to 256 claims (or completions) per statement,
/// two statements of each on their way at once.
pub const DEFAULT_BATCHING: BatchLimits = BatchLimits {
    max_batch: 256,
    max_in_flight: 2,
};

/// Records in PostgreSQL, in the table `idempotency_records`, with claims
/// and completions batched ([`DEFAULT_BATCHING`]): [`PostgresRecords`]
/// wrapped in [`Batched`].
pub type PostgresStore = Batched<PostgresRecords>;

/// Records in PostgreSQL, each call a statement of its own: the store that
/// [`PostgresStore`] batches.
#[derive(Debug, Clone)]
pub struct PostgresRecords {
    pool: PgPool,
    events: RecordEvents,
    listener: Option<std::sync::Arc<Listener>>,
    /// The connections runs' transactions ended on, kept for the next run
    /// (`kept.rs`).
    kept: std::sync::Arc<kept::KeptConnections>,
}

impl PostgresStore {
    /// Wraps a pool. Run [`PostgresStore::migrate`] once before use.
    /// Claims and completions are batched ([`DEFAULT_BATCHING`]).
    pub fn new(pool: PgPool) -> Self {
        Batched::wrap(
            PostgresRecords {
                pool,
                events: RecordEvents::new(),
                listener: None,
                kept: std::sync::Arc::default(),
            },
            DEFAULT_BATCHING,
        )
    }

    /// Makes the store publish its changes into `events` (the tiered store
    /// shares one registry between its Redis and PostgreSQL sides). Call it
    /// before [`PostgresStore::with_notifications`].
    pub fn with_events(self, events: RecordEvents) -> Self {
        self.map(|mut direct| {
            direct.events = events;
            direct
        })
    }

    /// Wakes waiters in every process through PostgreSQL: completions,
    /// releases and abandonments send a `NOTIFY` on [`NOTIFY_CHANNEL`], and
    /// a `LISTEN` connection (one per store, reconnecting by itself) turns
    /// the messages into events. Without it, a request waiting for an
    /// in-flight key in another process reads the record again only when
    /// its wait bound or the lease ends.
    ///
    /// # Warning
    ///
    /// PostgreSQL serializes the commits of transactions that `NOTIFY`:
    /// under heavy write load this costs throughput. It is off by default.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the `LISTEN` connection cannot be made.
    pub async fn with_notifications(self) -> Result<Self, StoreError> {
        let mut listener = sqlx::postgres::PgListener::connect_with(self.pool()).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        let events = self.events().clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(notification) => {
                        if let Some((scope, key)) = parse_notification(notification.payload()) {
                            events.publish(scope, key);
                        }
                    }
                    // The listener reconnects on the next call.
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        });
        let listener = std::sync::Arc::new(Listener(task.abort_handle()));
        Ok(self.map(|mut direct| {
            direct.listener = Some(listener);
            direct
        }))
    }

    /// Connects to `url` (`postgres://...`) with a pool of up to
    /// `max_connections`, an acquire timeout of 5 s, and a server-side
    /// `statement_timeout` of 5 s (the layer's default store timeout), so a
    /// statement the guard gave up on is abandoned by the server too.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or the server
    /// cannot be reached.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        let options = options.options([("statement_timeout", "5s")]);
        // No ping before every statement (sqlx's default): it doubles the
        // round trips; a dead connection fails its statement instead, the
        // request answers 503, and the pool replaces the connection.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        Ok(Self::new(pool))
    }

    /// The pool the store uses.
    pub fn pool(&self) -> &PgPool {
        &self.direct().pool
    }

    /// Begins a run's transaction (transactional mode), on a connection an
    /// earlier run's transaction ended on when one is kept (`kept.rs`).
    pub(crate) async fn begin_run(&self) -> Result<RunTransaction, sqlx::Error> {
        let direct = self.direct();
        RunTransaction::begin(&direct.pool, &direct.kept).await
    }

    /// Applies the migrations in `migrations/postgres` that have not run yet.
    /// Safe to run from several processes at once (an advisory lock
    /// serializes them).
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), MigrationError> {
        crate::migrate::run_postgres(self.pool()).await
    }

    /// Completes the record inside `transaction`, the handler's transaction
    /// in transactional mode; the caller commits.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    pub async fn complete_in(
        &self,
        transaction: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let result = complete_query(lease, response)
            .execute(&mut *transaction)
            .await?;
        fenced(result.rows_affected())?;
        // Delivered when the transaction commits.
        self.direct().notify(&mut *transaction, lease).await
    }

    /// Marks the record held by `lease` transactional, committed on its own
    /// before the run's transaction begins: from then on a lapsed lease
    /// means the run's writes were rolled back, so the key may run again.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    pub async fn mark_transactional(&self, lease: &Lease) -> Result<(), StoreError> {
        let result = lease_query(MARK_TRANSACTIONAL, lease)
            .execute(self.pool())
            .await?;
        fenced(result.rows_affected())
    }

    /// Releases the record inside `transaction` (a `no-store` answer in
    /// transactional mode); the caller commits.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    pub async fn release_in(
        &self,
        transaction: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let result = lease_query(RELEASE, lease)
            .execute(&mut *transaction)
            .await?;
        fenced(result.rows_affected())?;
        self.direct().notify(&mut *transaction, lease).await
    }
}

/// Records the steps of the run holding `lease` inside `transaction` (a
/// transactional step's, committed with its writes): fenced as
/// [`Store::record_steps`] is, or, when the key is `held_by_lock`
/// (single-commit mode, whose lease is never renewed), by the lock.
///
/// # Errors
///
/// [`StoreError::LeaseLost`] when the record no longer holds `lease` (or
/// its lease ended).
pub(crate) async fn record_steps_in(
    transaction: &mut PgConnection,
    lease: &Lease,
    steps: &[Step],
    held_by_lock: bool,
) -> Result<(), StoreError> {
    let sql = if held_by_lock {
        RECORD_STEPS_LOCKED
    } else {
        RECORD_STEPS
    };
    let result = lease_query(sql, lease)
        .bind(Step::encode_all(steps))
        .execute(transaction)
        .await?;
    fenced(result.rows_affected())
}

impl PostgresRecords {
    /// A connection for a statement: one kept from an earlier statement or
    /// run (`kept.rs`: sqlx's pool would have pinged it), or the pool's.
    pub(super) async fn connection(&self) -> Result<kept::KeptConnection, StoreError> {
        Ok(self.kept.acquire(&self.pool).await?)
    }

    /// Keeps `connection`, whose statement answered, for the next one. A
    /// connection whose statement failed is dropped instead (`?`): the pool
    /// takes it back and checks it.
    pub(super) fn keep(&self, connection: kept::KeptConnection) {
        self.kept.give_back(&self.pool, connection);
    }

    /// Sends the `NOTIFY` for a changed record, when notifications are on.
    async fn notify<'c>(
        &self,
        executor: impl sqlx::PgExecutor<'c>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        if self.listener.is_some() {
            sqlx::query(NOTIFY)
                .bind(NOTIFY_CHANNEL)
                .bind(notification(lease.scope.as_str(), lease.key.as_str()))
                .execute(executor)
                .await?;
        }
        Ok(())
    }
}

fn lease_query(
    sql: &'static str,
    lease: &Lease,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(lease.scope.as_str())
        .bind(lease.key.as_str())
        .bind(lease.token.as_uuid())
}

fn complete_query(
    lease: &Lease,
    response: &StoredResponse,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    lease_query(COMPLETE, lease)
        .bind(i16::try_from(response.status.as_u16()).unwrap_or(i16::MAX))
        .bind(response.encode_headers())
        .bind(response.body.as_ref().map(|b| b.to_vec()))
}

/// `<scope length>:<scope><key>`: unambiguous, whatever the scope holds.
fn notification(scope: &str, key: &str) -> String {
    format!("{}:{scope}{key}", scope.len())
}

fn parse_notification(payload: &str) -> Option<(&str, &str)> {
    let (length, rest) = payload.split_once(':')?;
    let length: usize = length.parse().ok()?;
    Some((rest.get(..length)?, rest.get(length..)?))
}

fn record_from_row(row: &PgRow, scope: &Scope, key: &IdempotencyKey) -> Result<Record, StoreError> {
    let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| CorruptRecord("the fingerprint is not 32 bytes"))?;
    let status: Option<i16> = row.try_get("response_status")?;
    let response = match status {
        Some(status) => {
            let headers: Option<Vec<u8>> = row.try_get("response_headers")?;
            let body: Option<Vec<u8>> = row.try_get("response_body")?;
            Some(StoredResponse::decode(
                i64::from(status),
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
        lease_token: LeaseToken::from_uuid(row.try_get("lease_token")?),
        lease_expires_at: row.try_get("lease_expires_at")?,
        transactional: row.try_get("transactional")?,
        response,
        created_at: row.try_get("created_at")?,
        completed_at: row.try_get::<Option<OffsetDateTime>, _>("completed_at")?,
        expires_at: row.try_get("expires_at")?,
        observed_at: row.try_get("observed_at")?,
        steps: Step::decode_all(row.try_get::<Option<Vec<u8>>, _>("steps")?.as_deref())?,
        request: StoredRequest::decode_optional(
            row.try_get::<Option<Vec<u8>>, _>("request")?.as_deref(),
        )?,
    })
}

impl Store for PostgresRecords {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        let mut connection = self.connection().await?;
        for _ in 0..CLAIM_ATTEMPTS {
            let row = sqlx::query(CLAIM)
                .bind(new.scope.as_str())
                .bind(new.key.as_str())
                .bind(new.fingerprint.as_bytes().as_slice())
                .bind(new.method)
                .bind(new.path)
                .bind(new.token.as_uuid())
                .bind(millis(new.lease))
                .bind(new.transactional)
                .bind(millis(new.retention))
                .fetch_one(&mut *connection)
                .await?;
            if row.try_get::<bool, _>("acquired")? {
                self.keep(connection);
                return Ok(Claim::Acquired(new.lease()));
            }
            // The row we conflicted with is visible unless it was committed
            // after this statement's snapshot: then simply ask again.
            if row.try_get::<Option<Vec<u8>>, _>("fingerprint")?.is_some() {
                self.keep(connection);
                return Ok(Claim::Existing(Box::new(record_from_row(
                    &row, new.scope, new.key,
                )?)));
            }
        }
        Err(StoreError::Unavailable(
            "the claim kept racing a concurrent insert".into(),
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
            .bind(previous.as_uuid())
            .bind(new.fingerprint.as_bytes().as_slice())
            .bind(new.method)
            .bind(new.path)
            .bind(new.token.as_uuid())
            .bind(millis(new.lease))
            .bind(new.transactional)
            .bind(millis(new.retention))
            .execute(&self.pool)
            .await?;
        Ok((result.rows_affected() == 1).then(|| new.lease()))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let mut connection = self.connection().await?;
        let result = complete_query(lease, response)
            .execute(&mut *connection)
            .await?;
        self.keep(connection);
        fenced(result.rows_affected())?;
        self.notify(&self.pool, lease).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let result = lease_query(RENEW, lease)
            .bind(millis(duration))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())?;
        if duration.is_zero() {
            self.notify(&self.pool, lease).await?;
        }
        Ok(())
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        let result = lease_query(RECORD_STEPS, lease)
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
        let result = lease_query(RECORD_REQUEST, lease)
            .bind(request.map(StoredRequest::encode))
            .execute(&self.pool)
            .await?;
        fenced(result.rows_affected())
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let result = lease_query(RELEASE, lease).execute(&self.pool).await?;
        fenced(result.rows_affected())?;
        self.notify(&self.pool, lease).await
    }

    /// Waits behind a claim or takeover of the key still in progress (see
    /// `SETTLE`), for at most `wait` (`lock_timeout`).
    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("select set_config('lock_timeout', $1, true)")
            .bind(format!("{}ms", millis(wait).max(1)))
            .execute(&mut *tx)
            .await?;
        sqlx::query(SETTLE)
            .bind(lease.scope.as_str())
            .bind(lease.key.as_str())
            .bind([0_u8; 32].as_slice())
            .bind(lease.token.as_uuid())
            .execute(&mut *tx)
            .await?;
        tx.rollback().await?;
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let mut connection = self.connection().await?;
        let row = sqlx::query(GET)
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&mut *connection)
            .await?;
        self.keep(connection);
        row.map(|row| record_from_row(&row, scope, key)).transpose()
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        let texts: Vec<&str> = keys.iter().map(IdempotencyKey::as_str).collect();
        let rows = sqlx::query(GET_MANY)
            .bind(scope.as_str())
            .bind(&texts)
            .fetch_all(&self.pool)
            .await?;
        // Each record carries the caller's key (shared), found by its text.
        let asked: std::collections::HashMap<&str, &IdempotencyKey> =
            keys.iter().map(|key| (key.as_str(), key)).collect();
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let text: String = row.try_get("key")?;
            let Some(&key) = asked.get(text.as_str()) else {
                return Err(CorruptRecord("the store answered a key it was not asked for").into());
            };
            found.insert(key.as_str(), record_from_row(row, scope, key)?);
        }
        Ok(keys
            .iter()
            .map(|key| found.get(key.as_str()).cloned())
            .collect())
    }

    fn events(&self) -> &RecordEvents {
        &self.events
    }
}

impl Purge for PostgresRecords {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        let result = sqlx::query(PURGE)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(result.rows_affected())
    }
}

impl TransactionalStore for PostgresStore {
    fn postgres(&self) -> Option<&PostgresStore> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_name_scope_and_key_unambiguously() {
        assert_eq!(notification("a:b", "c"), "3:a:bc");
        assert_eq!(parse_notification("3:a:bc"), Some(("a:b", "c")));
        assert_eq!(parse_notification(&notification("", "k")), Some(("", "k")));
        assert_eq!(parse_notification("9:short"), None);
        assert_eq!(parse_notification("x:y"), None);
    }
}
