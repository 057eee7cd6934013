//! The *hand-off* step of a run (see the engine's docs): once the lease is held, the run goes on in
//! the caller's own task while the caller waits for it (no task to spawn,
//! no wake-up across tasks), and moves into a task of its own the moment
//! the caller goes away (its future is dropped): dropping the caller's
//! future never cancels a run.
//!
//! While it runs in the caller's task, the run holds a token of the
//! engine's task tracker, so [`super::Drain`] waits for it as for any task.
//!
//! # The box's shape (issue 56, item 1)
//!
//! A request that the layer guards costs two boxes: the layer's request
//! future (`layer/service.rs`, `call`) and, from the hand-off on, the run
//! ([`HandOff`]: `Engine::run_acquired`'s future, steps 4 to 6, the
//! recorded steps' [`super::Run`] made inside it). Both are made *in* their
//! box ([`boxed_in_place`]: the box allocated first, the future written
//! into it), not on the stack and copied in: the run is about 9.6 kB in
//! the bench's build, and `Box::pin(run)` copied all of it per request.
//! Code that adds to the run (a completer, a request kept with the claim)
//! adds to what `make` captures and to `run_acquired`'s state; it stays in
//! the one box that moves into a task when the caller goes away.
//!
//! Measured and left out: the run *inline* in the layer's box, moved into
//! a task with the whole box only when the caller goes away (one box per
//! request). Every `.await` of a future copies all of its bytes into the
//! awaiting future's state, so a run three awaits deep in the layer's
//! future was copied three times: 118.7k instructions per fresh request
//! against 88.6k (callgrind, `scripts/profile-guard`; docs/BENCHMARKS.md,
//! issue 56).

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
    /// Takes the run of `key` that `make` makes over for the caller, made
    /// in its box (see [`boxed_in_place`]); `tracker` is the engine's.
    pub(super) fn new<F>(
        make: impl FnOnce() -> F,
        tracker: &TaskTracker,
        key: IdempotencyKey,
    ) -> Self
    where
        F: Future<Output = Answer<T>> + Send + 'static,
    {
        Self {
            run: Some(boxed_in_place(make)),
            token: tracker.token(),
            key,
        }
    }
}

/// The future `make` makes, in a box allocated first: made where it then
/// lives, not on the stack and copied in (a request's run is several
/// kilobytes, and `Box::pin(make())` copies all of them, used or not).
/// The layer's request future is boxed the same way.
pub(crate) fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), made_by(make)))
}

/// Calls `make` out of line, so that its result is written straight to
/// the place the caller gives (the box) instead of a copy on the stack.
#[inline(never)]
fn made_by<F>(make: impl FnOnce() -> F) -> F {
    make()
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
