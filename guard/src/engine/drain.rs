//! Waiting for every run on shutdown.

use std::time::Duration;

use tokio_util::task::TaskTracker;

/// Waits, on shutdown, for every run an engine started (and the background
/// releases and renewals they own), so none is dropped mid-flight.
///
/// A server stops accepting first, then drains:
///
/// ```no_run
/// # use idempotency_guard::{IdempotencyLayer, store::AnyStore};
/// # async fn f(layer: IdempotencyLayer<AnyStore>, app: axum::Router, listener: tokio::net::TcpListener) -> std::io::Result<()> {
/// let drain = layer.drain();
/// axum::serve(listener, app)
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// drain.wait().await; // the one line: runs whose clients left still finish
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Drain {
    tracker: TaskTracker,
    bound: Duration,
}

impl Drain {
    pub(super) fn new(tracker: TaskTracker, bound: Duration) -> Self {
        Self { tracker, bound }
    }

    /// How many runs (and their background tasks) are still going.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until every run has ended, at most the maximum handler time
    /// plus the completion retry window (and two store timeouts for the
    /// last writes); returns whether all
    /// ended. Runs started meanwhile are waited for too.
    pub async fn wait(self) -> bool {
        self.tracker.close();
        let ended = tokio::time::timeout(self.bound, self.tracker.wait())
            .await
            .is_ok();
        if !ended {
            tracing::warn!(
                running = self.tracker.len(),
                "shutdown: some idempotent runs did not end in time; their keys lapse into abandoned"
            );
        }
        ended
    }
}
