//! Waiting for every run on shutdown.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
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
    /// Cancelled when the drain begins: the tasks that follow claims of
    /// unknown fate stop (see `release.rs`).
    stopping: CancellationToken,
    bound: Duration,
}

impl Drain {
    pub(super) fn new(tracker: TaskTracker, stopping: CancellationToken, bound: Duration) -> Self {
        Self {
            tracker,
            stopping,
            bound,
        }
    }

    /// How many runs (and their background tasks) are still going.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until every run has ended, at most the maximum handler time
    /// plus the completion retry window (and two store timeouts for the
    /// last writes); returns whether all
    /// ended. Runs started meanwhile are waited for too. A claim the engine
    /// still follows past its window of releases (sent, never answered, see
    /// the engine's docs) is left at once: it lapses into abandoned if it
    /// landed, as a stopped process's claim does.
    pub async fn wait(self) -> bool {
        self.tracker.close();
        self.stopping.cancel();
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
