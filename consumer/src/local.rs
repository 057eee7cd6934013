//! The keys this process is running now, so that a duplicate whose twin
//! runs here waits for the twin's end (woken when it ends, not polled)
//! instead of asking the store, hearing "in flight" and holding a handler
//! slot for a fixed hint.
//!
//! A brokers delivers copies of one message close together (a publisher's
//! retry, a redelivery after a lost ack, two producers): with 30 % of the
//! copies right behind their first, slots held for a fixed 1 s hint cut
//! the executions per second by more than half. A copy that waits here
//! holds no handler permit ([`Inbox::process_with`](crate::Inbox)); once
//! its twin has settled, the store answers it with the stored outcome.
//!
//! This is only a shortcut: the store still decides. A twin running in
//! another process is not seen here; its copy hears "in flight" from the
//! store as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

/// The `(scope, key)` pairs running in this process.
#[derive(Debug, Default)]
pub(crate) struct LocalRuns {
    running: Mutex<HashMap<(String, String), watch::Sender<()>>>,
}

/// What [`LocalRuns::enter`] found.
pub(crate) enum Entry {
    /// No twin runs here: this copy runs, and its end wakes any copy that
    /// came behind it (when the guard drops).
    Mine(RunningHere),
    /// A twin runs here: wait for its end with [`Twin::ended`].
    Twin(Twin),
}

/// A key held by this process's run of it; dropping it wakes its waiters.
pub(crate) struct RunningHere {
    runs: Arc<LocalRuns>,
    key: (String, String),
}

/// A twin running in this process.
pub(crate) struct Twin(watch::Receiver<()>);

impl LocalRuns {
    /// Marks `(scope, key)` as running here, or returns the twin that does.
    pub(crate) fn enter(self: &Arc<Self>, scope: &str, key: &str) -> Entry {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (scope.to_owned(), key.to_owned());
        if let Some(sender) = running.get(&id) {
            return Entry::Twin(Twin(sender.subscribe()));
        }
        running.insert(id.clone(), watch::channel(()).0);
        Entry::Mine(RunningHere {
            runs: Arc::clone(self),
            key: id,
        })
    }

    /// How many keys run here now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Twin {
    /// Completes when the twin's run has ended (its sender is dropped).
    /// The receiver was taken under the lock, so an end between the
    /// lookup and this wait is not missed.
    pub(crate) async fn ended(mut self) {
        while self.0.changed().await.is_ok() {}
    }
}

impl Drop for RunningHere {
    fn drop(&mut self) {
        // Removing the entry drops its sender: every waiter wakes.
        self.runs
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_twin_waits_for_the_first_run_and_is_woken_by_its_end() {
        let runs = Arc::new(LocalRuns::default());
        let Entry::Mine(first) = runs.enter("s", "k") else {
            panic!("the first copy runs");
        };
        let Entry::Twin(twin) = runs.enter("s", "k") else {
            panic!("the second copy is a twin");
        };
        // Another scope with the same key is not a twin.
        assert!(matches!(runs.enter("t", "k"), Entry::Mine(_)));
        let waiting = tokio::spawn(twin.ended());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "the twin waits while the first runs"
        );
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the twin is woken when the first ends")
            .expect("the waiting task");
        assert_eq!(runs.len(), 0, "nothing is left behind");
        assert!(matches!(runs.enter("s", "k"), Entry::Mine(_)));
    }

    #[tokio::test]
    async fn an_end_between_the_lookup_and_the_wait_is_not_missed() {
        let runs = Arc::new(LocalRuns::default());
        let Entry::Mine(first) = runs.enter("s", "k") else {
            panic!("the first copy runs");
        };
        let Entry::Twin(twin) = runs.enter("s", "k") else {
            panic!("the second copy is a twin");
        };
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), twin.ended())
            .await
            .expect("an end before the wait still wakes the twin");
    }
}
