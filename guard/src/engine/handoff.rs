//! The *hand-off* step of a run (see the engine's docs): once the lease is held, the run goes on in
//! the caller's own task while the caller waits for it (no task to spawn,
//! no wake-up across tasks), and moves into a task of its own the moment
//! the caller goes away (its future is dropped): dropping the caller's
//! future never cancels a run.
//!
//! While it runs in the caller's task, the run holds a token of the
//! engine's task tracker, so [`super::Drain`] waits for it as for any task.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::{Answer, Refusal};
use crate::key::IdempotencyKey;

/// The boxed run: boxed so that it can move into a task after it started
/// (its state stays where it is; only the box moves).
type Run<T> = Pin<Box<dyn Future<Output = Answer<T>> + Send>>;

/// A run owned by its caller until the caller goes away.
pub(super) struct HandOff<T: Send + 'static> {
    /// `None` once it ended (or panicked).
    run: Option<Run<T>>,
    /// Counts the run as the tracker's while the caller holds it; its
    /// tracker is where the run moves if the caller goes away.
    token: TaskTrackerToken,
    /// The run's key, for the refusal when the engine's own code panics.
    key: IdempotencyKey,
}

impl<T: Send + 'static> HandOff<T> {
    /// Takes `run` of `key` over for the caller; `tracker` is the engine's.
    pub(super) fn new(
        run: impl Future<Output = Answer<T>> + Send + 'static,
        tracker: &TaskTracker,
        key: IdempotencyKey,
    ) -> Self {
        Self {
            run: Some(Box::pin(run)),
            token: tracker.token(),
            key,
        }
    }
}

impl<T: Send + 'static> Future for HandOff<T> {
    type Output = Answer<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<T>> {
        let Some(run) = self.run.as_mut() else {
            return Poll::Ready(Answer::Refused(Refusal::HandlerFailed {
                key: self.key.clone(),
            }));
        };
        // A panic of the engine's own code (the work's panics are caught
        // inside the run) ends the run here: it must not move into a task
        // and be polled again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(answer)) => {
                self.run = None;
                Poll::Ready(answer)
            }
            Err(_panic) => {
                self.run = None;
                tracing::error!("the engine's run panicked");
                Poll::Ready(Answer::Refused(Refusal::HandlerFailed {
                    key: self.key.clone(),
                }))
            }
        }
    }
}

impl<T: Send + 'static> Drop for HandOff<T> {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else { return };
        // The caller went away mid-run: the run goes on in a task of its own.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.token.task_tracker().spawn_on(run, &runtime);
            }
            Err(_) => {
                // Only when the caller's future is dropped outside any
                // runtime (its runtime is gone): nothing can run it any more,
                // as for a task of a runtime that shut down. The record
                // lapses into abandoned when its lease ends.
                tracing::error!(
                    "a run was dropped outside a runtime; its key lapses into abandoned"
                );
            }
        }
    }
}
