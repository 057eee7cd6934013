//! The tiered store: Redis in front of PostgreSQL.
//!
//! PostgreSQL stays the source of truth: every claim, takeover, completion,
//! renewal and release is a PostgreSQL statement, durable when it returns.
//! Redis only holds copies of *completed* records, which never change
//! until their retention ends: replays and status reads of a completed key
//! are answered from Redis in one round trip, without touching PostgreSQL.
//!
//! A copy is written whole by one script and expires a second before its
//! record's retention ends (a time to live measured on PostgreSQL's clock
//! and counted down by Redis, so a skewed clock cannot stretch it), so
//! Redis never answers from a partial or stale entry. Copies are made when PostgreSQL first answers with a completed
//! record (the first replay or status read), never speculatively.
//!
//! If Redis fails or hangs, the store keeps working on PostgreSQL alone:
//! each failed Redis call is counted in `idempotency_tiered_fallbacks_total`
//! and Redis is left alone for a second before it is tried again.
//!
//! Waiters in other processes are woken through Redis pub/sub; with
//! PostgreSQL notifications on (build the PostgreSQL store with
//! `.with_events(cache.events().clone())` and then
//! `.with_notifications()`, as [`AnyStore::open`](crate::store::AnyStore::open)
//! does), `LISTEN/NOTIFY` wakes them too, and keeps doing so while Redis
//! is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use time::OffsetDateTime;

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{LeaseToken, Record, RecordState, Step, StoredResponse};
/// What the tiered store asks of its cache (declared with the store's
/// other contracts, in `store/mod.rs`).
pub use crate::store::RecordCache;
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};
use crate::store::postgres::PostgresStore;
use crate::store::redis::RedisStore;
use crate::store::{
    AdminStore, Claim, Lease, NewRecord, Purge, Store, StoreError, TransactionalStore,
};

/// Redis calls that fell back to PostgreSQL, by operation.
pub const FALLBACKS_TOTAL: &str = "idempotency_tiered_fallbacks_total";

/// How long one cache call may take before it counts as failed.
const CACHE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long Redis is skipped after a failure.
const COOL_DOWN: Duration = Duration::from_secs(1);
/// How much earlier than its record a cached copy expires (covers clock
/// skew between PostgreSQL and Redis).
const EXPIRY_MARGIN: time::Duration = time::Duration::seconds(1);

/// PostgreSQL (the truth) with a cache, Redis by default, serving
/// completed records.
#[derive(Debug, Clone)]
pub struct TieredStore<C = RedisStore> {
    postgres: PostgresStore,
    cache: C,
    /// Until when (Unix ms, local clock) Redis is skipped after a failure.
    skip_cache_until: Arc<AtomicI64>,
}

fn now_millis() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

impl<C: RecordCache> TieredStore<C> {
    /// Puts `cache` in front of `postgres`. Both must be connected; the
    /// Redis store's prefix namespaces the cached copies.
    pub fn new(postgres: PostgresStore, cache: C) -> Self {
        Self {
            postgres,
            cache,
            skip_cache_until: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The PostgreSQL store behind the cache.
    pub fn database(&self) -> &PostgresStore {
        &self.postgres
    }

    /// Runs a cache call unless Redis is cooling down; a failure or a
    /// timeout is counted and starts a cool-down. `None` means "no answer
    /// from the cache": go to PostgreSQL.
    async fn cached<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Option<T> {
        if now_millis() < self.skip_cache_until.load(Ordering::Relaxed) {
            metrics::counter!(FALLBACKS_TOTAL, "operation" => operation).increment(1);
            return None;
        }
        match tokio::time::timeout(CACHE_TIMEOUT, call).await {
            Ok(Ok(value)) => Some(value),
            failed => {
                let reason = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(
                    operation,
                    reason,
                    "Redis failed; the tiered store falls back to PostgreSQL"
                );
                metrics::counter!(FALLBACKS_TOTAL, "operation" => operation).increment(1);
                let cool_down = i64::try_from(COOL_DOWN.as_millis()).unwrap_or(1000);
                self.skip_cache_until
                    .store(now_millis() + cool_down, Ordering::Relaxed);
                None
            }
        }
    }

    /// A completed record from the cache, if it holds one.
    async fn cached_completed(&self, scope: &Scope, key: &IdempotencyKey) -> Option<Record> {
        self.cached("cache_get", self.cache.get_completed(scope, key))
            .await
            .flatten()
            .filter(|record| record.state() == RecordState::Completed && !record.is_expired())
    }

    /// Copies a completed record read from PostgreSQL into the cache.
    async fn fill(&self, record: &Record) {
        if record.state() != RecordState::Completed {
            return;
        }
        // Expire the copy before the record: a duration measured on
        // PostgreSQL's clock, which Redis counts down on its own (no two
        // clocks are ever compared).
        let remaining = record.expires_at - record.observed_at - EXPIRY_MARGIN;
        let Ok(ttl) = Duration::try_from(remaining) else {
            return;
        };
        if ttl.is_zero() {
            return;
        }
        self.cached("cache_put", self.cache.put_completed(record, ttl))
            .await;
    }

    /// Wakes waiters in every process after a change in PostgreSQL.
    async fn announce(&self, lease: &Lease) {
        self.cached(
            "announce",
            self.cache
                .announce(lease.scope.as_str(), lease.key.as_str()),
        )
        .await;
    }
}

impl<C: RecordCache> Store for TieredStore<C> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        if let Some(record) = self.cached_completed(new.scope, new.key).await {
            return Ok(Claim::Existing(Box::new(record)));
        }
        let claim = self.postgres.claim(new).await?;
        if let Claim::Existing(record) = &claim {
            self.fill(record).await;
        }
        Ok(claim)
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        // Only expired or abandoned records are taken over, and neither is
        // ever in the cache.
        self.postgres.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.postgres.complete(lease, response).await?;
        self.announce(lease).await;
        Ok(())
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.postgres.renew(lease, duration).await?;
        if duration.is_zero() {
            self.announce(lease).await;
        }
        Ok(())
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        // In flight: only PostgreSQL holds it (the cache keeps completed
        // records alone).
        self.postgres.record_steps(lease, steps).await
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        self.postgres.record_request(lease, request).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.postgres.release(lease).await?;
        self.announce(lease).await;
        Ok(())
    }

    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        self.postgres.settle(lease, wait).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        if let Some(record) = self.cached_completed(scope, key).await {
            return Ok(Some(record));
        }
        let record = self.postgres.get(scope, key).await?;
        if let Some(record) = &record {
            self.fill(record).await;
        }
        Ok(record)
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        self.postgres.get_many(scope, keys).await
    }

    fn events(&self) -> &RecordEvents {
        self.cache.events()
    }
}

impl<C: RecordCache> Purge for TieredStore<C> {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        // Cached copies expire by themselves, before their records.
        self.postgres.purge(limit).await
    }
}

impl<C: RecordCache> TransactionalStore for TieredStore<C> {
    fn postgres(&self) -> Option<&PostgresStore> {
        Some(&self.postgres)
    }

    async fn committed(&self, lease: &Lease) {
        // The completion committed in PostgreSQL, outside this store's own
        // calls: wake waiters in other processes through Redis too.
        self.announce(lease).await;
    }
}

// ---------------------------------------------------------------------------
// Operators' operations (`AdminStore`): PostgreSQL decides; the cached copy
// of a forgotten completed record is deleted before and after, so a copy
// filled by a read that raced the delete does not outlive it.
// ---------------------------------------------------------------------------

impl<C: RecordCache> AdminStore for TieredStore<C> {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        self.postgres.list(scope, filter, page).await
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        // The cache must not answer for a record PostgreSQL no longer has:
        // here a Redis failure fails the operation (unlike reads, which
        // fall back), so the operator can try again.
        self.cache.forget(scope, key).await?;
        let forgotten = self.postgres.forget(scope, key, rule).await?;
        if let Forgotten::Deleted(_) = forgotten {
            self.cache.forget(scope, key).await?;
            self.cache.announce(scope, key).await?;
            // This process at once, not when the announcement comes back.
            self.events().publish(scope, key);
        }
        Ok(forgotten)
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        self.postgres.held_without_record(scope, keys).await
    }
}
