//! A store operation under the store timeout, its latency recorded when it
//! ends.
//!
//! A hand-written future rather than an `async fn`: an `async fn` that
//! takes the operation's future keeps it twice in its state (once as its
//! argument, once inside the timeout), and every future awaiting it grows
//! by as much. As an `async fn`, a timed claim on Redis took 2,144 bytes
//! for a 448-byte store call; this takes the store call, the timer and a
//! few words.
//!
//! The store call sits beside its timer, not inside tokio's `Timeout`:
//! each move of a future copies all of its bytes, and wrapping the call
//! in a `Timeout` first, then that in the timed future, copied it once
//! more per operation, twice per fresh request: on Redis the guard's
//! `memcpy` fell from 7.7k to 5.6k instructions per fresh request, the
//! request from 77.3k to 74.7k (callgrind; docs/BENCHMARKS.md, issue 56).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use crate::store::StoreError;
use crate::telemetry::MetricHandles;

pin_project_lite::pin_project! {
    /// See the module docs; made by [`timed`].
    pub(crate) struct Timed<'m, F> {
        #[pin]
        operation_future: F,
        #[pin]
        deadline: tokio::time::Sleep,
        metrics: &'m MetricHandles,
        operation: &'static str,
        timeout: Duration,
        started: Instant,
    }
}

/// Runs the store operation `future` under `timeout` and records its
/// latency and result in `metrics` (and, with `otel`, in a span).
pub(crate) fn timed<'m, R, F>(
    metrics: &'m MetricHandles,
    operation: &'static str,
    timeout: Duration,
    future: F,
) -> impl Future<Output = Result<R, StoreError>> + use<'m, R, F>
where
    F: Future<Output = Result<R, StoreError>>,
{
    let timed = Timed {
        operation_future: future,
        // On tokio's clock, which a test may pause.
        deadline: tokio::time::sleep(timeout),
        metrics,
        operation,
        timeout,
        started: Instant::now(),
    };
    #[cfg(feature = "otel")]
    let timed = tracing::Instrument::instrument(
        timed,
        tracing::info_span!("idempotency.store", idempotency.store.operation = operation),
    );
    timed
}

impl<R, F> Future for Timed<'_, F>
where
    F: Future<Output = Result<R, StoreError>>,
{
    type Output = Result<R, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.operation_future.poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => {
                ready!(this.deadline.poll(cx));
                Err(StoreError::Timeout(*this.timeout))
            }
        };
        this.metrics.observe_store(
            this.operation,
            *this.started,
            !matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
        );
        Poll::Ready(result)
    }
}
