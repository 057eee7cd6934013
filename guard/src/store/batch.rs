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
//! batching: the engine's claim guard releases a claim whose caller left). When a caller went away before its result arrived (its request was
//! dropped, its store timeout fired), the worker hands the result to the
//! store's `undelivered` hook: a claim that was acquired for nobody is
//! released there.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use std::time::Duration;

use crate::store::admin::{AdminStore, ForgetRule, Forgotten, Page, PageRequest, StateFilter};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError};
use crate::{Record, RecordEvents, StoredResponse};

/// How a store groups concurrent calls of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most items one batch carries. `1` turns batching off: each call
    /// then goes to the store by itself, from the caller's own task.
    pub max_batch: usize,
    /// How many batches of one operation may be on their way at once.
    pub max_in_flight: usize,
}

impl BatchLimits {
    /// No batching: every call is its own statement or script.
    pub const OFF: Self = Self {
        max_batch: 1,
        max_in_flight: 1,
    };

    /// Whether calls go through a batcher at all.
    pub fn enabled(&self) -> bool {
        self.max_batch > 1
    }
}

/// The histogram of batch sizes, by `op` (`claim` or `complete`).
pub const BATCH_SIZE: &str = "idempotency_store_batch_size";

/// How many batches, and items in them, one operation has sent (for tests
/// and benchmarks; also exported as the histogram
/// `idempotency_store_batch_size{op}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Batches sent.
    pub batches: u64,
    /// Items in them.
    pub items: u64,
    /// The largest batch sent.
    pub largest: u64,
}

impl BatchCounts {
    /// The mean batch size, 0 when nothing was sent.
    pub fn mean(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.items as f64 / self.batches as f64
        }
    }
}

/// The counts of a store's batched operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Claims.
    pub claims: BatchCounts,
    /// Completions.
    pub completions: BatchCounts,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    items: AtomicU64,
    largest: AtomicU64,
    /// `idempotency_store_batch_size{op}`, registered on the first batch.
    histogram: OnceLock<metrics::Histogram>,
}

impl Counters {
    fn record(&self, op: &'static str, size: usize) {
        let size = size as u64;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(size, Ordering::Relaxed);
        self.largest.fetch_max(size, Ordering::Relaxed);
        self.histogram
            .get_or_init(|| metrics::histogram!(BATCH_SIZE, "op" => op))
            .record(size as f64);
    }

    fn snapshot(&self) -> BatchCounts {
        BatchCounts {
            batches: self.batches.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }
}

/// The future of one batch: a result per item, or one error for them all.
pub(crate) type BatchFuture<O> =
    Pin<Box<dyn Future<Output = Result<Vec<Result<O, StoreError>>, StoreError>> + Send>>;

/// What sends one batch to the store.
type Send_<I, O> = dyn Fn(Vec<I>) -> BatchFuture<O> + Send + Sync;

/// What becomes of a result whose caller went away.
type Undelivered<O> = dyn Fn(O) + Send + Sync;

struct Queued<I, O> {
    item: I,
    reply: oneshot::Sender<Result<O, StoreError>>,
    /// Counts the item in [`Slots::queued`] until it is sent or dropped.
    _counted: CountedAsQueued,
}

/// One item counted in [`Slots::queued`]: uncounted when dropped, whether
/// the worker sent it or it was lost unsent (the worker's runtime shut down
/// with items in its queue). Otherwise the count would stay above zero and
/// no call would go by itself again.
struct CountedAsQueued(Arc<Slots>);

impl CountedAsQueued {
    fn new(slots: &Arc<Slots>) -> Self {
        slots.queued.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(slots))
    }
}

impl Drop for CountedAsQueued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One batched operation of one store. Clones share the queue.
pub(crate) struct Batcher<I, O> {
    shared: Arc<Shared<I, O>>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<I, O> std::fmt::Debug for Batcher<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("op", &self.shared.op)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

struct Shared<I, O> {
    op: &'static str,
    limits: BatchLimits,
    send: Arc<Send_<I, O>>,
    undelivered: Arc<Undelivered<O>>,
    /// The worker's queue, started on first use (a store may be built
    /// outside a runtime) and again if its runtime went away.
    queue: Mutex<Option<mpsc::UnboundedSender<Queued<I, O>>>>,
    counters: Arc<Counters>,
    slots: Arc<Slots>,
}

/// The batches of one operation on their way (the worker's, and items that
/// callers sent by themselves), at most [`BatchLimits::max_in_flight`].
#[derive(Debug, Default)]
struct Slots {
    busy: AtomicUsize,
    /// Items queued for the worker and not yet sent (a caller sends its
    /// item by itself only when none waits: queued items go first).
    queued: AtomicUsize,
    /// Woken when a batch comes back (the worker may be waiting for a slot).
    freed: tokio::sync::Notify,
}

impl Slots {
    /// Takes a slot when fewer than `below` batches are on their way.
    fn take(self: &Arc<Self>, below: usize) -> Option<OnItsWay> {
        let mut busy = self.busy.load(Ordering::Acquire);
        while busy < below {
            match self.busy.compare_exchange_weak(
                busy,
                busy + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(OnItsWay(Arc::clone(self))),
                Err(now) => busy = now,
            }
        }
        None
    }
}

/// A slot held by one batch until it is dropped (answered, or given up).
pub(crate) struct OnItsWay(Arc<Slots>);

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// A batcher for `op` that sends batches with `send` and hands results
    /// nobody waits for any more to `undelivered`.
    pub(crate) fn new(
        op: &'static str,
        limits: BatchLimits,
        send: impl Fn(Vec<I>) -> BatchFuture<O> + Send + Sync + 'static,
        undelivered: impl Fn(O) + Send + Sync + 'static,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                op,
                limits: BatchLimits {
                    max_batch: limits.max_batch.max(1),
                    max_in_flight: limits.max_in_flight.max(1),
                },
                send: Arc::new(send),
                undelivered: Arc::new(undelivered),
                queue: Mutex::new(None),
                counters: Arc::default(),
                slots: Arc::default(),
            }),
        }
    }

    /// What this operation has sent so far.
    pub(crate) fn counts(&self) -> BatchCounts {
        self.shared.counters.snapshot()
    }

    /// A slot for a call that goes by itself, now, from the caller's task,
    /// counted as a batch of one: when nothing of this operation is on its
    /// way or queued (no load). The caller sends it while it holds the slot
    /// (a store can then send what it borrows, with no item to build).
    ///
    /// Only outside any tracing span: sqlx keeps the span current at a
    /// query in the query's stream, and SQLite's connections were seen to
    /// hold such spans (and their parents, the request's) open long after
    /// the request ended; the worker's task has no span.
    pub(crate) fn lone(&self) -> Option<OnItsWay> {
        let slots = &self.shared.slots;
        if slots.queued.load(Ordering::Acquire) != 0 || !tracing::Span::current().is_none() {
            return None;
        }
        let on_its_way = slots.take(1)?;
        self.shared.counters.record(self.shared.op, 1);
        Some(on_its_way)
    }

    /// Queues `item` for the next batch and waits for its result (the
    /// worker owns it once queued).
    pub(crate) async fn queue_and_wait(&self, item: I) -> Result<O, StoreError> {
        let slots = &self.shared.slots;
        let (reply, result) = oneshot::channel();
        let mut queued = Queued {
            item,
            reply,
            _counted: CountedAsQueued::new(slots),
        };
        // At most two tries: the second one after starting a new worker
        // when the old one's runtime is gone.
        for _ in 0..2 {
            let queue = self.queue();
            match queue.send(queued) {
                Ok(()) => {
                    return result.await.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable(
                            "the batch worker stopped before answering".into(),
                        ))
                    });
                }
                Err(mpsc::error::SendError(back)) => {
                    queued = back;
                    self.forget_queue(&queue);
                }
            }
        }
        Err(StoreError::Unavailable(
            "the batch worker could not be started".into(),
        ))
    }

    fn queue(&self) -> mpsc::UnboundedSender<Queued<I, O>> {
        let mut slot = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*slot {
            Some(queue) if !queue.is_closed() => queue.clone(),
            _ => {
                let (queue, receiver) = mpsc::unbounded_channel();
                tokio::spawn(work(
                    receiver,
                    self.shared.op,
                    self.shared.limits,
                    self.shared.send.clone(),
                    self.shared.undelivered.clone(),
                    self.shared.counters.clone(),
                    self.shared.slots.clone(),
                ));
                *slot = Some(queue.clone());
                queue
            }
        }
    }

    fn forget_queue(&self, dead: &mpsc::UnboundedSender<Queued<I, O>>) {
        let mut slot = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.as_ref().is_some_and(|queue| queue.same_channel(dead)) {
            *slot = None;
        }
    }
}

/// The worker: sends what is queued as soon as a batch may go, delivers each
/// result to its caller, until every handle to the batcher is dropped and
/// every batch sent has answered.
async fn work<I, O>(
    mut queue: mpsc::UnboundedReceiver<Queued<I, O>>,
    op: &'static str,
    limits: BatchLimits,
    send: Arc<Send_<I, O>>,
    undelivered: Arc<Undelivered<O>>,
    counters: Arc<Counters>,
    slots: Arc<Slots>,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    // The first item of the next batch, waiting for a slot.
    let mut held: Option<Queued<I, O>> = None;
    loop {
        tokio::select! {
            biased;
            Some((replies, results)) = in_flight.next(), if !in_flight.is_empty() => {
                deliver(replies, results, &*undelivered);
            }
            () = slots.freed.notified(), if held.is_some() => {}
            first = queue.recv(), if open && held.is_none() => match first {
                Some(first) => held = Some(first),
                None => open = false,
            },
            else => break,
        }
        if held.is_none() {
            continue;
        }
        let Some(on_its_way) = slots.take(limits.max_in_flight) else {
            continue;
        };
        let mut batch = Vec::from_iter(held.take());
        while batch.len() < limits.max_batch {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        counters.record(op, batch.len());
        // Each item's `_counted` is dropped here: sent, no longer queued.
        let (items, replies): (Vec<I>, Vec<_>) = batch
            .into_iter()
            .map(|queued| (queued.item, queued.reply))
            .unzip();
        let future = send(items);
        in_flight.push(async move {
            let results = future.await;
            drop(on_its_way);
            (replies, results)
        });
    }
}

type Replies<O> = Vec<oneshot::Sender<Result<O, StoreError>>>;

fn deliver<O>(
    replies: Replies<O>,
    results: Result<Vec<Result<O, StoreError>>, StoreError>,
    undelivered: &Undelivered<O>,
) {
    match results {
        Ok(results) if results.len() == replies.len() => {
            for (reply, result) in replies.into_iter().zip(results) {
                if let Err(Ok(outcome)) = reply.send(result) {
                    undelivered(outcome);
                }
            }
        }
        Ok(_) => {
            for reply in replies {
                let _ = reply.send(Err(StoreError::Unavailable(
                    "the store answered a batch with the wrong number of results".into(),
                )));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.for_each_item()));
            }
        }
    }
}

impl StoreError {
    /// The same error for every item of a failed batch (a store's source
    /// error is not `Clone`: its message is kept).
    pub(crate) fn for_each_item(&self) -> StoreError {
        match self {
            StoreError::LeaseLost => StoreError::LeaseLost,
            StoreError::Timeout(bound) => StoreError::Timeout(*bound),
            StoreError::Corrupt(corrupt) => StoreError::Corrupt(*corrupt),
            StoreError::Unsupported(what) => StoreError::Unsupported(what),
            StoreError::NotReplicated { wanted, acked } => StoreError::NotReplicated {
                wanted: *wanted,
                acked: *acked,
            },
            StoreError::Unavailable(source) => {
                StoreError::Unavailable(format!("the batch failed: {source}").into())
            }
        }
    }
}

/// A claim waiting in a batch: an owned [`NewRecord`].
#[derive(Debug, Clone)]
pub struct ClaimItem {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: crate::Fingerprint,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) token: crate::store::LeaseToken,
    pub(crate) lease: std::time::Duration,
    pub(crate) retention: std::time::Duration,
    pub(crate) transactional: bool,
}

impl ClaimItem {
    /// An owned copy of `new`.
    pub fn new(new: &NewRecord<'_>) -> Self {
        Self {
            scope: new.scope.to_owned(),
            key: new.key.to_owned(),
            fingerprint: *new.fingerprint,
            method: new.method.to_owned(),
            path: new.path.to_owned(),
            token: new.token,
            lease: new.lease,
            retention: new.retention,
            transactional: new.transactional,
        }
    }

    /// The claim as the store's [`Store::claim`] takes it.
    pub fn as_new(&self) -> NewRecord<'_> {
        NewRecord {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            token: self.token,
            lease: self.lease,
            retention: self.retention,
            transactional: self.transactional,
        }
    }
}

/// A store that can send many claims, or many completions, at once: one
/// result per item, in the order of the items. [`Batched`] wraps such a
/// store and feeds it the batches.
pub trait BatchedStore: Store {
    /// A completion waiting in a batch, in the store's own encoding.
    type Completion: Send + 'static;

    /// The completion of `lease` with `response`, as a batch carries it.
    fn completion(&self, lease: &Lease, response: &StoredResponse) -> Self::Completion;

    /// Claims every item: the batch's one statement, script or transaction.
    fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> impl Future<Output = Result<Vec<Result<Claim, StoreError>>, StoreError>> + Send;

    /// Completes every item, fenced per item.
    fn complete_batch(
        &self,
        items: Vec<Self::Completion>,
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;
}

/// The batchers of one store's claims and completions.
pub(crate) struct Batches<C> {
    /// Claims.
    pub(crate) claims: Batcher<ClaimItem, Claim>,
    /// Completions.
    pub(crate) completions: Batcher<C, ()>,
}

impl<C> std::fmt::Debug for Batches<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("limits", &self.claims.shared.limits)
            .finish_non_exhaustive()
    }
}

impl<C: Send + 'static> Batches<C> {
    /// Batchers that send through `direct` (a copy of the store that does
    /// not batch: it holds no `Batches` of its own, so no cycle keeps the
    /// workers alive once the store is dropped).
    pub(crate) fn new<S: BatchedStore<Completion = C>>(direct: S, limits: BatchLimits) -> Self {
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
    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            claims: self.claims.counts(),
            completions: self.completions.counts(),
        }
    }
}

/// A store whose claims and completions go through batchers: `S` is the
/// store that sends each call on its own, wrapped once (as
/// [`EncryptedStore`](crate::store::EncryptedStore) and
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
            .map_or(BatchLimits::OFF, |batches| batches.claims.shared.limits)
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

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.direct.get(scope, key).await
    }

    async fn get_many(
        &self,
        scope: &str,
        keys: &[&str],
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

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// A batcher whose batches answer each item with itself.
    fn echo() -> Batcher<u32, u32> {
        Batcher::new(
            "test",
            BatchLimits {
                max_batch: 8,
                max_in_flight: 1,
            },
            |items: Vec<u32>| -> BatchFuture<u32> {
                Box::pin(async move { Ok(items.into_iter().map(Ok).collect()) })
            },
            |_| {},
        )
    }

    #[test]
    fn items_lost_with_their_workers_runtime_are_no_longer_counted_as_queued() {
        let batcher = echo();
        let first = runtime();
        let slot = first.block_on(async {
            // Hold the only slot, so that the queued item waits in the worker.
            let slot = batcher.lone().expect("nothing is on its way yet");
            let caller = batcher.clone();
            tokio::spawn(async move { caller.queue_and_wait(1).await });
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(batcher.shared.slots.queued.load(Ordering::Acquire), 1);
            slot
        });
        // The worker, its caller and the item they hold go with the runtime.
        drop(first);
        drop(slot);
        assert_eq!(batcher.shared.slots.queued.load(Ordering::Acquire), 0);

        runtime().block_on(async {
            assert!(
                batcher.lone().is_some(),
                "a call goes by itself again once nothing is queued"
            );
            // And queued calls reach a new worker on this runtime.
            assert_eq!(batcher.queue_and_wait(7).await.expect("answered"), 7);
        });
    }
}
