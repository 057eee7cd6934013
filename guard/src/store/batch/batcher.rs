//! The batcher of one operation: callers queue their items and wait for
//! their own result; a call that finds nothing of its operation on its way
//! goes by itself ([`Batcher::lone`]). The worker that sends the queue is
//! in `worker.rs`, what the two share in `queue.rs`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::limits::{BatchCounts, BatchLimits, Counters};
use super::queue::{BatchFuture, CountedAsQueued, OnItsWay, Queued, Send_, Slots, Undelivered};
use super::worker::work;
use crate::store::StoreError;

/// One batched operation of one store. Clones share the queue.
pub(super) struct Batcher<I, O> {
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

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// A batcher for `op` that sends batches with `send` and hands results
    /// nobody waits for any more to `undelivered`.
    pub(super) fn new(
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
    pub(super) fn counts(&self) -> BatchCounts {
        self.shared.counters.snapshot()
    }

    /// The limits its batches keep to.
    pub(super) fn limits(&self) -> BatchLimits {
        self.shared.limits
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
    pub(super) fn lone(&self) -> Option<OnItsWay> {
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
    pub(super) async fn queue_and_wait(&self, item: I) -> Result<O, StoreError> {
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
