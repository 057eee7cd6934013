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

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Row};
use time::OffsetDateTime;

use crate::store::batch::{BatchLimits, Batched, BatchedStore, ClaimItem};
use crate::store::sql::{CLAIM_ATTEMPTS, fenced, millis};
use crate::store::{
    Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError, TransactionalStore,
};
use crate::{Fingerprint, Record, RecordEvents, StoredResponse};

/// The columns every read returns, `observed_at` being the database's clock.
macro_rules! record_columns {
    () => {
        "fingerprint, method, path, lease_token, lease_expires_at, transactional, \
         response_status, response_headers, response_body, created_at, completed_at, \
         expires_at, now() as observed_at"
    };
}

mod single_commit;

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

/// The claims of a batch, one statement: like [`CLAIM`], per row of the
/// input arrays, answering one row per claim in input order (`n`). Rows are
/// inserted in key order, so two batches never wait on each other's keys in
/// opposite orders.
const CLAIM_BATCH: &str = "with input as (
        select * from unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[],
                             $6::uuid[], $7::int8[], $8::bool[], $9::int8[])
            with ordinality as input(scope, key, fingerprint, method, path, token,
                                     lease_ms, transactional, retention_ms, n)
    ), existing as (
        select input.n, r.fingerprint, r.method, r.path, r.lease_token, r.lease_expires_at,
               r.transactional, r.response_status, r.response_headers, r.response_body,
               r.created_at, r.completed_at, r.expires_at
        from input join idempotency_records r on r.scope = input.scope and r.key = input.key
    ), inserted as (
        insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
        select scope, key, fingerprint, method, path, 'in_flight', token,
               now() + lease_ms * interval '1 millisecond', transactional, now(),
               now() + retention_ms * interval '1 millisecond'
        from input
        where not exists (select 1 from existing where existing.n = input.n)
        order by scope, key, n
        on conflict (scope, key) do nothing
        returning lease_token
    )
    select input.n,
           exists (select 1 from inserted where inserted.lease_token = input.token) as acquired,
           existing.fingerprint, existing.method, existing.path, existing.lease_token,
           existing.lease_expires_at, existing.transactional, existing.response_status,
           existing.response_headers, existing.response_body, existing.created_at,
           existing.completed_at, existing.expires_at, now() as observed_at
    from input left join existing on existing.n = input.n
    order by input.n";

/// The completions of a batch, one statement, fenced per row: answers the
/// input positions (`n`) of the rows it completed.
const COMPLETE_BATCH: &str = "with input as (
        select * from unnest($1::text[], $2::text[], $3::uuid[], $4::int2[], $5::bytea[],
                             $6::bytea[])
            with ordinality as input(scope, key, token, status, headers, body, n)
    ), updated as (
        update idempotency_records r set
            state = 'completed', response_status = input.status,
            response_headers = input.headers, response_body = input.body,
            completed_at = clock_timestamp()
        from input
        where r.scope = input.scope and r.key = input.key and r.lease_token = input.token
          and r.state = 'in_flight'
        returning input.n, r.scope, r.key
    )
    select n, case when $7 then pg_notify($8, octet_length(scope)::text || ':' || scope || key)
              end::text as notified
    from updated";

const TAKE_OVER: &str = "update idempotency_records set
        fingerprint = $4, method = $5, path = $6, state = 'in_flight', lease_token = $7,
        lease_expires_at = now() + $8 * interval '1 millisecond', transactional = $9,
        response_status = null, response_headers = null, response_body = null,
        created_at = now(), completed_at = null,
        expires_at = now() + $10 * interval '1 millisecond'
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

/// A completion waiting in a batch.
type CompleteItem = (Lease, StoredResponse);

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

    /// Applies the migrations in `migrations/postgres` that have not run yet.
    /// Safe to run from several processes at once (an advisory lock
    /// serializes them).
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), crate::MigrationError> {
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

impl BatchedStore for PostgresRecords {
    type Completion = CompleteItem;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> CompleteItem {
        (lease.clone(), response.clone())
    }

    /// Claims a batch: one statement, then again for the rows that raced a
    /// concurrent insert committed after its snapshot.
    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        // A batch of one (no load): the single-claim statement, which is
        // cheaper to run than the batch's.
        if let [item] = items.as_slice() {
            return Ok(vec![self.claim(&item.as_new()).await]);
        }
        let mut results: Vec<Option<Result<Claim, StoreError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        for _ in 0..CLAIM_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let column = |f: &dyn Fn(&ClaimItem) -> String| -> Vec<String> {
                pending.iter().map(|&i| f(&items[i])).collect()
            };
            let rows = sqlx::query(CLAIM_BATCH)
                .bind(column(&|item| item.scope.clone()))
                .bind(column(&|item| item.key.clone()))
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].fingerprint.as_bytes().to_vec())
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|item| item.method.clone()))
                .bind(column(&|item| item.path.clone()))
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].token.as_uuid())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| millis(items[i].lease))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].transactional)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| millis(items[i].retention))
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&self.pool)
                .await?;
            if rows.len() != pending.len() {
                return Err(StoreError::Unavailable(
                    "the batch claim answered the wrong number of rows".into(),
                ));
            }
            let mut again = Vec::new();
            for (row, &index) in rows.iter().zip(&pending) {
                let item = &items[index];
                if row.try_get::<bool, _>("acquired")? {
                    results[index] = Some(Ok(Claim::Acquired(item.as_new().lease())));
                } else if row.try_get::<Option<Vec<u8>>, _>("fingerprint")?.is_some() {
                    results[index] = Some(
                        record_from_row(row, &item.scope, &item.key)
                            .map(|record| Claim::Existing(Box::new(record))),
                    );
                } else {
                    // Raced an insert committed after the snapshot (or one
                    // of this batch's own rows for the same key): again.
                    again.push(index);
                }
            }
            pending = again;
        }
        Ok(results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(StoreError::Unavailable(
                        "the claim kept racing a concurrent insert".into(),
                    ))
                })
            })
            .collect())
    }

    /// Completes a batch: one statement, fenced per row.
    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        if let [(lease, response)] = items.as_slice() {
            return Ok(vec![self.complete(lease, response).await]);
        }
        let rows = sqlx::query(COMPLETE_BATCH)
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.scope.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.token.as_uuid())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| {
                        i16::try_from(response.status.as_u16()).unwrap_or(i16::MAX)
                    })
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| response.encode_headers())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| response.body.as_ref().map(|b| b.to_vec()))
                    .collect::<Vec<_>>(),
            )
            .bind(self.listener.is_some())
            .bind(NOTIFY_CHANNEL)
            .fetch_all(&self.pool)
            .await?;
        let mut completed = vec![false; items.len()];
        for row in &rows {
            let n: i64 = row.try_get("n")?;
            if let Some(slot) = usize::try_from(n - 1)
                .ok()
                .and_then(|i| completed.get_mut(i))
            {
                *slot = true;
            }
        }
        Ok(completed
            .into_iter()
            .map(|done| {
                if done {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost)
                }
            })
            .collect())
    }
}

impl PostgresRecords {
    /// Sends the `NOTIFY` for a changed record, when notifications are on.
    async fn notify<'c>(
        &self,
        executor: impl sqlx::PgExecutor<'c>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        if self.listener.is_some() {
            sqlx::query(NOTIFY)
                .bind(NOTIFY_CHANNEL)
                .bind(notification(&lease.scope, &lease.key))
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

fn record_from_row(row: &PgRow, scope: &str, key: &str) -> Result<Record, StoreError> {
    let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| crate::record::CorruptRecord("the fingerprint is not 32 bytes"))?;
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
        scope: scope.to_owned(),
        key: key.to_owned(),
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
    })
}

impl Store for PostgresRecords {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        for _ in 0..CLAIM_ATTEMPTS {
            let row = sqlx::query(CLAIM)
                .bind(new.scope)
                .bind(new.key)
                .bind(new.fingerprint.as_bytes().as_slice())
                .bind(new.method)
                .bind(new.path)
                .bind(new.token.as_uuid())
                .bind(millis(new.lease))
                .bind(new.transactional)
                .bind(millis(new.retention))
                .fetch_one(&self.pool)
                .await?;
            if row.try_get::<bool, _>("acquired")? {
                return Ok(Claim::Acquired(new.lease()));
            }
            // The row we conflicted with is visible unless it was committed
            // after this statement's snapshot: then simply ask again.
            if row.try_get::<Option<Vec<u8>>, _>("fingerprint")?.is_some() {
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
            .bind(new.scope)
            .bind(new.key)
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
        let result = complete_query(lease, response).execute(&self.pool).await?;
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

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let result = lease_query(RELEASE, lease).execute(&self.pool).await?;
        fenced(result.rows_affected())?;
        self.notify(&self.pool, lease).await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(GET)
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| record_from_row(&row, scope, key)).transpose()
    }

    async fn get_many(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        let rows = sqlx::query(GET_MANY)
            .bind(scope)
            .bind(keys)
            .fetch_all(&self.pool)
            .await?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let key: String = row.try_get("key")?;
            let record = record_from_row(row, scope, &key)?;
            found.insert(key, record);
        }
        Ok(keys.iter().map(|key| found.get(*key).cloned()).collect())
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

// ---------------------------------------------------------------------------
// Operators' operations (`AdminStore`): listing and forgetting records.
// ---------------------------------------------------------------------------

/// One page of a scope's records (keyset pagination by key, byte order).
/// `$3` is the state filter's name; expired records are left out.
const ADMIN_LIST: &str = concat!(
    "select key, ",
    record_columns!(),
    " from idempotency_records
    where scope = $1 and key collate \"C\" > $2 and expires_at > now()
      and ($3 = 'any'
        or ($3 = 'completed' and state = 'completed')
        or ($3 = 'in_flight' and state = 'in_flight' and lease_expires_at > now())
        or ($3 = 'abandoned' and state = 'in_flight' and lease_expires_at <= now()
            and not transactional))
    order by key collate \"C\"
    limit $4"
);

/// Deletes the record when the rule allows its state (`$3`: completed ones,
/// `$4`: abandoned ones), deciding and deleting in one statement; a live
/// lease always keeps it.
const ADMIN_FORGET: &str = "delete from idempotency_records
    where scope = $1 and key = $2
      and ((state = 'completed' and $3)
        or (state = 'in_flight' and lease_expires_at <= now() and $4))
    returning state";

impl crate::store::admin::AdminStore for PostgresRecords {
    async fn list(
        &self,
        scope: &str,
        filter: crate::store::admin::StateFilter,
        page: crate::store::admin::PageRequest<'_>,
    ) -> Result<crate::store::admin::Page, StoreError> {
        let limit = page.clamped_limit();
        let rows = sqlx::query(ADMIN_LIST)
            .bind(scope)
            .bind(page.after.unwrap_or(""))
            .bind(filter.as_str())
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                let key: String = row.try_get("key")?;
                record_from_row(row, scope, &key)
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

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        let locks: Vec<i64> = keys.iter().map(|key| lock_key(scope, key)).collect();
        let rows = sqlx::query(single_commit::LOCKS_HELD)
            .bind(locks)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| row.try_get::<bool, _>("held").map_err(StoreError::from))
            .collect()
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
