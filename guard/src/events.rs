//! Wakes requests that wait for an in-flight record to finish.
//!
//! The layer publishes an event whenever it completes, releases or abandons a
//! record; a request that chose to wait subscribes *before* it reads the
//! record again, so an event between that read and the wait is never lost.
//! Stores that see other processes' changes (PostgreSQL `LISTEN`, Redis
//! pub/sub) publish into the same registry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::Notify;

type RecordId = (String, String);

/// A function told of every event (the engine's replay cache drops its copy
/// of a record that changed). Held weakly: dropping it unregisters it. It
/// is called with the registry's lock held, so it must not publish or
/// watch itself.
pub type Watcher = dyn Fn(&str, &str) + Send + Sync;

/// A registry of waiters, keyed by `(scope, key)`. Cloning shares it.
#[derive(Clone, Default)]
pub struct RecordEvents {
    waiters: Arc<Mutex<HashMap<RecordId, Weak<Channel>>>>,
    watchers: Arc<Mutex<Vec<Weak<Watcher>>>>,
}

#[derive(Default)]
struct Channel {
    generation: AtomicU64,
    notify: Notify,
}

impl std::fmt::Debug for RecordEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waiting = self.lock().len();
        f.debug_struct("RecordEvents")
            .field("records_waited_on", &waiting)
            .finish()
    }
}

impl RecordEvents {
    /// Creates an empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Weak<Channel>>> {
        // The map stays consistent even if a holder panicked.
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching `(scope, key)`: the subscription sees every event
    /// published after this call.
    pub fn subscribe(&self, scope: &str, key: &str) -> Subscription {
        let mut waiters = self.lock();
        let id = (scope.to_owned(), key.to_owned());
        let channel = match waiters.get(&id).and_then(Weak::upgrade) {
            Some(channel) => channel,
            None => {
                let channel = Arc::new(Channel::default());
                waiters.insert(id.clone(), Arc::downgrade(&channel));
                channel
            }
        };
        let seen = channel.generation.load(Ordering::Acquire);
        Subscription {
            events: self.clone(),
            id,
            channel,
            seen,
        }
    }

    /// Tells `watcher` of every event from now on, until it is dropped.
    pub fn watch(&self, watcher: &Arc<Watcher>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        watchers.retain(|w| w.strong_count() > 0);
        watchers.push(Arc::downgrade(watcher));
    }

    /// Whether an event published now would reach anybody (a subscription
    /// or a watcher): a store that decodes an event's record from a message
    /// first skips that work when nobody listens. A subscription made after
    /// this answered `false` reads the record after the write it would have
    /// been told of, so it misses nothing.
    #[cfg(feature = "nats")]
    pub(crate) fn is_heard(&self) -> bool {
        !self.lock().is_empty()
            || self
                .watchers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .any(|watcher| watcher.strong_count() > 0)
    }

    /// Wakes every subscription to `(scope, key)`, and tells every watcher.
    ///
    /// Every request's end is published here: with nobody waiting and no
    /// watcher, it costs two uncontended locks and allocates nothing.
    pub fn publish(&self, scope: &str, key: &str) {
        // Told under the lock, which allocates nothing: a watcher (the
        // replay cache's) only drops a copy and never publishes or
        // registers (`watch`) from inside.
        for watcher in self
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
        {
            watcher(scope, key);
        }
        let channel = {
            let waiters = self.lock();
            if waiters.is_empty() {
                return;
            }
            waiters
                .get(&(scope.to_owned(), key.to_owned()))
                .and_then(Weak::upgrade)
        };
        if let Some(channel) = channel {
            channel.generation.fetch_add(1, Ordering::AcqRel);
            channel.notify.notify_waiters();
        }
    }
}

/// A watch on one record, from [`RecordEvents::subscribe`].
pub struct Subscription {
    events: RecordEvents,
    id: RecordId,
    channel: Arc<Channel>,
    seen: u64,
}

impl Subscription {
    /// Resolves once an event was published after the subscription began
    /// (at once if one already was).
    pub async fn changed(&self) {
        loop {
            let notified = self.channel.notify.notified();
            if self.channel.generation.load(Ordering::Acquire) != self.seen {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut waiters = self.events.lock();
        // The map and this subscription hold the only references: forget it.
        if Arc::strong_count(&self.channel) == 1 {
            waiters.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn an_event_after_subscribing_is_never_lost() {
        let events = RecordEvents::new();
        let subscription = events.subscribe("s", "k");
        events.publish("s", "k");
        // Published before the wait started: still seen.
        tokio::time::timeout(Duration::from_secs(1), subscription.changed())
            .await
            .expect("the event was lost");
    }

    #[tokio::test]
    async fn events_are_per_record() {
        let events = RecordEvents::new();
        let subscription = events.subscribe("s", "k");
        events.publish("s", "other");
        events.publish("other", "k");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), subscription.changed())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn wakes_every_waiter_and_forgets_records_nobody_waits_for() {
        let events = RecordEvents::new();
        let waiters: Vec<_> = (0..10)
            .map(|_| {
                let subscription = events.subscribe("s", "k");
                tokio::spawn(async move { subscription.changed().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        events.publish("s", "k");
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(1), waiter)
                .await
                .expect("a waiter was not woken")
                .unwrap();
        }
        assert!(events.lock().is_empty());
    }
}
