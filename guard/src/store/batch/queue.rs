//! What the batcher and its worker share: an item in the queue with the
//! way back to its caller ([`Queued`]), the batches of one operation on
//! their way ([`Slots`], [`OnItsWay`]), and the store's two hooks (the
//! send of a batch, and what becomes of a result nobody waits for).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

use crate::store::StoreError;

/// The future of one batch: a result per item, or one error for them all.
pub(super) type BatchFuture<O> =
    Pin<Box<dyn Future<Output = Result<Vec<Result<O, StoreError>>, StoreError>> + Send>>;

/// What sends one batch to the store.
pub(super) type Send_<I, O> = dyn Fn(Vec<I>) -> BatchFuture<O> + Send + Sync;

/// What becomes of a result whose caller went away.
pub(super) type Undelivered<O> = dyn Fn(O) + Send + Sync;

/// An item in the worker's queue, with the way back to its caller.
pub(super) struct Queued<I, O> {
    pub(super) item: I,
    pub(super) reply: oneshot::Sender<Result<O, StoreError>>,
    /// Counts the item in [`Slots::queued`] until it is sent or dropped.
    pub(super) _counted: CountedAsQueued,
}

/// One item counted in [`Slots::queued`]: uncounted when dropped, whether
/// the worker sent it or it was lost unsent (the worker's runtime shut down
/// with items in its queue). Otherwise the count would stay above zero and
/// no call would go by itself again.
pub(super) struct CountedAsQueued(Arc<Slots>);

impl CountedAsQueued {
    /// Counts one more item as queued.
    pub(super) fn new(slots: &Arc<Slots>) -> Self {
        slots.queued.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(slots))
    }
}

impl Drop for CountedAsQueued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The batches of one operation on their way (the worker's, and items that
/// callers sent by themselves), at most [`BatchLimits::max_in_flight`](super::BatchLimits::max_in_flight).
#[derive(Debug, Default)]
pub(super) struct Slots {
    busy: AtomicUsize,
    /// Items queued for the worker and not yet sent (a caller sends its
    /// item by itself only when none waits: queued items go first).
    pub(super) queued: AtomicUsize,
    /// Woken when a batch comes back (the worker may be waiting for a slot).
    pub(super) freed: tokio::sync::Notify,
}

impl Slots {
    /// Takes a slot when fewer than `below` batches are on their way.
    pub(super) fn take(self: &Arc<Self>, below: usize) -> Option<OnItsWay> {
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
pub(super) struct OnItsWay(Arc<Slots>);

impl Drop for OnItsWay {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}
