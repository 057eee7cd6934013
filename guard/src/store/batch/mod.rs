//! Group commit: claims (and completions) of concurrent requests that queue
//! while one statement or script is on its way go together in the next one.
//!
//! [`Batched`] wraps a store ([`BatchedStore`]: one that can send many
//! claims or completions at once) with one `Batcher` per batched
//! operation, built once over a copy of the store. A caller that finds
//! nothing of its operation on its way sends its item by itself, from its
//! own task (no hand-off to the worker and back: one connection's latency
//! does not grow). Otherwise it hands its item to the batcher and waits for
//! its own result: the batcher's worker task takes everything queued (up to
//! [`BatchLimits::max_batch`]) and sends it as one batch as soon as fewer
//! than [`BatchLimits::max_in_flight`] batches are on their way. Nothing
//! waits for a batch to fill; under load, batches grow by themselves and
//! each request costs a fraction of a statement, a commit and a round trip.
//!
//! Every item gets its own result: the store answers per row (per key),
//! fencing included. When the whole batch fails (the store is unreachable,
//! the statement failed), every item gets that error, and nothing was written
//! for any of them (one statement or one transaction).
//!
//! Nothing is stranded: the worker, not the caller, owns a batch once it is
//! sent (a caller that sent its item by itself owns it, as without
//! batching: the engine's claim guard releases a claim whose caller left).
//! When a caller went away before its result arrived (its request was
//! dropped, its store timeout fired), the worker hands the result to the
//! store's `undelivered` hook: a claim that was acquired for nobody is
//! released there.
//!
//! The folder: this file holds [`Batched`] and the pair of batchers it
//! builds; `batcher.rs` the queue of one operation, `worker.rs` the task
//! that sends it, `queue.rs` what the two share, `limits.rs` the limits
//! and counts a user sees. The contract a store implements to be batched,
//! [`BatchedStore`] (with [`ClaimItem`]), is declared with the others in
//! `store/mod.rs`. The batcher, its worker and their queue are private to
//! this folder.

use std::sync::Arc;
use std::time::Duration;

mod batcher;
mod limits;
mod queue;
mod worker;

use batcher::Batcher;
pub use limits::{BATCH_SIZE, BatchCounts, BatchLimits, BatchStats};
use queue::BatchFuture;

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{LeaseToken, Record, Step, StoredResponse};
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};
use crate::store::{AdminStore, Claim, Lease, NewRecord, Purge, Store, StoreError};
/// The contract of a store that can be batched, and its claims in a batch
/// (declared with the other contracts, in `store/mod.rs`).
use crate::store::{BatchedStore, ClaimItem};

/// The batchers of one store's claims and completions.
struct Batches<C> {
    /// Claims.
    claims: Batcher<ClaimItem, Claim>,
    /// Completions.
    completions: Batcher<C, ()>,
}

impl<C> std::fmt::Debug for Batches<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("limits", &self.claims.limits())
            .finish_non_exhaustive()
    }
}

impl<C: Send + 'static> Batches<C> {
    /// Batchers that send through `direct` (a copy of the store that does
    /// not batch: it holds no `Batches` of its own, so no cycle keeps the
    /// workers alive once the store is dropped).
    fn new<S: BatchedStore<Completion = C>>(direct: S, limits: BatchLimits) -> Self {
        let for_claims = direct.clone();
        let for_release = direct.clone();
        let claims = Batcher::new(
            "claim",
            limits,
            move |items: Vec<ClaimItem>| -> BatchFuture<Claim> {
                let store = for_claims.clone();
                Box::pin(async move { store.claim_batch(items).await })
            },
            move |claim: Claim| {
                // Acquired for a caller that went away: nobody will run
                // it, so release it (fenced by its own token).
                if let Claim::Acquired(lease) = claim {
                    let store = for_release.clone();
                    tokio::spawn(async move { store.release(&lease).await });
                }
            },
        );
        let completions = Batcher::new(
            "complete",
            limits,
            move |items: Vec<C>| -> BatchFuture<()> {
                let store = direct.clone();
                Box::pin(async move { store.complete_batch(items).await })
            },
            |()| {},
        );
        Self {
            claims,
            completions,
        }
    }

    /// What both batchers have sent.
    fn stats(&self) -> BatchStats {
        BatchStats {
            claims: self.claims.counts(),
            completions: self.completions.counts(),
        }
    }
}

/// A store whose claims and completions go through batchers: `S` is the
/// store that sends each call on its own, wrapped once (as
/// [`EncryptedStore`](crate::store::encrypted::EncryptedStore) and
/// [`TieredStore`](crate::store::tiered::TieredStore) wrap theirs).
///
/// A claim or completion that finds nothing of its operation on its way
/// goes straight to `S` from the caller's task; under load it is queued
/// for the next batch ([`BatchedStore::claim_batch`],
/// [`BatchedStore::complete_batch`]). Every other operation is `S`'s own.
///
/// The batchers send through a copy of `S` made when they were built. A
/// setting of `S` can only change through [`Batched::map`], which builds
/// them again over the changed store: no batched call runs on a stale copy.
/// `PostgresStore`, `SqliteStore` and `RedisStore` are `Batched` over
/// their backend's direct store.
pub struct Batched<S: BatchedStore> {
    direct: S,
    batches: Option<Arc<Batches<S::Completion>>>,
}

impl<S: BatchedStore> Clone for Batched<S> {
    fn clone(&self) -> Self {
        Self {
            direct: self.direct.clone(),
            batches: self.batches.clone(),
        }
    }
}

impl<S: BatchedStore + std::fmt::Debug> std::fmt::Debug for Batched<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batched")
            .field("direct", &self.direct)
            .field("limits", &self.limits())
            .finish()
    }
}

impl<S: BatchedStore> Batched<S> {
    /// Batches `direct`'s claims and completions within `limits`;
    /// [`BatchLimits::OFF`] sends each on its own.
    pub fn wrap(direct: S, limits: BatchLimits) -> Self {
        let batches = limits
            .enabled()
            .then(|| Arc::new(Batches::new(direct.clone(), limits)));
        Self { direct, batches }
    }

    /// Sets how concurrent claims and completions are batched;
    /// [`BatchLimits::OFF`] sends each on its own.
    ///
    /// The default value is the backend's `DEFAULT_BATCHING` (PostgreSQL:
    /// 256 per statement, two on their way; SQLite: 128 per transaction,
    /// one on its way; Redis: off, `redis::PIPELINED_BATCHING` turns on 64
    /// per pipeline, two on their way).
    pub fn with_batching(self, limits: BatchLimits) -> Self {
        Self::wrap(self.direct, limits)
    }

    /// Changes the store behind the batchers (a builder of `S`), and builds
    /// the batchers again over the changed store, with the same limits.
    pub fn map(self, change: impl FnOnce(S) -> S) -> Self {
        let limits = self.limits();
        Self::wrap(change(self.direct), limits)
    }

    /// The store that sends each call on its own.
    pub fn direct(&self) -> &S {
        &self.direct
    }

    /// How claims and completions are batched ([`BatchLimits::OFF`] when
    /// they are not).
    pub fn limits(&self) -> BatchLimits {
        self.batches
            .as_ref()
            .map_or(BatchLimits::OFF, |batches| batches.claims.limits())
    }

    /// How many batches (and claims and completions in them) this store
    /// has sent.
    pub fn batch_stats(&self) -> BatchStats {
        self.batches
            .as_ref()
            .map(|batches| batches.stats())
            .unwrap_or_default()
    }
}

impl<S: BatchedStore> Store for Batched<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        // A lone claim (no load) goes by itself with what it borrows,
        // holding its slot; under load it is queued for the next batch.
        let _lone = match &self.batches {
            Some(batches) => match batches.claims.lone() {
                Some(lone) => Some(lone),
                None => return batches.claims.queue_and_wait(ClaimItem::new(new)).await,
            },
            None => None,
        };
        self.direct.claim(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.direct.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let _lone = match &self.batches {
            Some(batches) => match batches.completions.lone() {
                Some(lone) => Some(lone),
                None => {
                    let item = self.direct.completion(lease, response);
                    return batches.completions.queue_and_wait(item).await;
                }
            },
            None => None,
        };
        self.direct.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.direct.renew(lease, duration).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.direct.release(lease).await
    }

    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        self.direct.settle(lease, wait).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        self.direct.record_steps(lease, steps).await
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        self.direct.record_request(lease, request).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.direct.get(scope, key).await
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        self.direct.get_many(scope, keys).await
    }

    fn events(&self) -> &RecordEvents {
        self.direct.events()
    }
}

impl<S: BatchedStore + Purge> Purge for Batched<S> {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        self.direct.purge(limit).await
    }
}

impl<S: BatchedStore + AdminStore> AdminStore for Batched<S> {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        self.direct.list(scope, filter, page).await
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        self.direct.forget(scope, key, rule).await
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        self.direct.held_without_record(scope, keys).await
    }
}

/// A batched cache is its direct store's cache (none of these calls is
/// batched).
#[cfg(feature = "redis")]
impl<S: BatchedStore + crate::store::RecordCache> crate::store::RecordCache for Batched<S> {
    async fn get_completed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Record>, StoreError> {
        self.direct().get_completed(scope, key).await
    }

    async fn put_completed(&self, record: &Record, ttl: Duration) -> Result<(), StoreError> {
        self.direct().put_completed(record, ttl).await
    }

    async fn forget(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        crate::store::RecordCache::forget(self.direct(), scope, key).await
    }

    async fn announce(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        self.direct().announce(scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        crate::store::RecordCache::events(self.direct())
    }
}
