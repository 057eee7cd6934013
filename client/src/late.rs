//! Attempts that outlived their timeout: still running, and still welcome.
//!
//! An attempt's timeout ([`Policy::with_attempt_timeout`](crate::Policy::with_attempt_timeout))
//! is how long the call waits for it before it goes on (a status look-up,
//! a pause, the next attempt); the attempt itself is not cut off. It keeps
//! running until the call's deadline, beside whatever the call does next,
//! and the first answer the policy would hand back wins, from whichever
//! attempt it comes. A lost answer then costs the next attempt only when
//! the first one is really gone (dropped, reset), never when it is only
//! slow: the lab's jitter row (docs/lab/issue-53.md), where a third of the
//! answers that time out arrive a second or two later.
//!
//! The call drops what is still running when it ends, which closes those
//! connections.

use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use reqwest::Response;

/// One attempt's answer, as reqwest gives it.
pub(crate) type Sent = Result<Response, reqwest::Error>;

/// An attempt in flight.
pub(crate) type Pending = Pin<Box<dyn Future<Output = Sent> + Send>>;

/// The attempts of one call that are still running after their timeout.
#[derive(Default)]
pub(crate) struct Late {
    running: FuturesUnordered<Pending>,
}

impl Late {
    /// Keeps `attempt` running beside the rest of the call.
    pub(crate) fn keep(&mut self, attempt: Pending) {
        self.running.push(attempt);
    }

    /// Whether no attempt is still running.
    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The next late attempt to end, with what it got; `None` when none
    /// is running.
    pub(crate) async fn next(&mut self) -> Option<Sent> {
        self.running.next().await
    }
}
