//! The worker of one batcher: a task that sends what is queued as soon as
//! a batch may go, and delivers each result to its caller (or, when the
//! caller went away, to the store's `undelivered` hook).

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::limits::{BatchLimits, Counters};
use super::queue::{Queued, Send_, Slots, Undelivered};
use crate::store::StoreError;

/// The worker: sends what is queued as soon as a batch may go, delivers each
/// result to its caller, until every handle to the batcher is dropped and
/// every batch sent has answered.
pub(super) async fn work<I, O>(
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
