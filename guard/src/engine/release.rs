//! Part of the *claim* step (see the engine's docs): a claim is never owned
//! by nobody. A claim whose caller went away while it was on its way
//! ([`PendingClaim`]), or that failed after it may have been sent, is
//! released from a tracked background task, fenced by its own token, for
//! as long as a late claim may still land.

use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use crate::store::{Lease, NewRecord, Store};

/// How often a background release is tried, while a late claim may land.
const RELEASE_PAUSE: Duration = Duration::from_millis(250);

/// A claim or takeover on its way to the store. If the caller's future is
/// dropped before the answer comes back (a client that went away), the
/// claim may still land: dropping this hands its token to a background
/// release.
pub(super) struct PendingClaim<'a, S: Store> {
    engine: &'a Engine<S>,
    /// The claim; its lease is made only if it must be released (a claim
    /// answered, the common case, copies nothing).
    new: Option<&'a NewRecord<'a>>,
}

impl<'a, S: Store> PendingClaim<'a, S> {
    pub(super) fn arm(engine: &'a Engine<S>, new: &'a NewRecord<'a>) -> Self {
        Self {
            engine,
            new: Some(new),
        }
    }

    /// The answer came back: whoever reads it owns what it says.
    pub(super) fn disarm(mut self) {
        self.new = None;
    }
}

impl<S: Store> Drop for PendingClaim<'_, S> {
    fn drop(&mut self) {
        if let Some(new) = self.new.take() {
            tracing::warn!(
                "the caller went away while its claim was on its way; releasing it in case it landed"
            );
            self.engine.release_if_running(Arc::new(new.lease()));
        }
    }
}

impl<S: Store> Engine<S> {
    /// Frees a lease from a tracked task of its own, when called inside a
    /// runtime (a drop during a runtime's shutdown has none: the process is
    /// going away, and its claim lapses into abandoned).
    fn release_if_running(&self, lease: Arc<Lease>) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.release_in_background(lease);
        }
    }

    /// Frees a lease from a tracked task of its own, fenced by its token.
    ///
    /// The write being released may land in the store after its sender gave
    /// up, so the release is tried every quarter second for twice the store
    /// timeout, whatever each try answers. The token is this run's own, so
    /// nothing else is ever touched.
    pub(super) fn release_in_background(&self, lease: Arc<Lease>) {
        let store = self.inner.store.clone();
        let timeout = self.inner.config.store_timeout;
        self.inner.tracker.spawn(async move {
            let attempts = (2 * timeout.as_millis() / RELEASE_PAUSE.as_millis()).max(4);
            for _ in 0..attempts {
                // A refusal (`LeaseLost`) may mean the claim has not landed
                // yet, and a client library may even send it again: keep
                // trying for the whole window.
                if let Ok(Ok(())) = tokio::time::timeout(timeout, store.release(&lease)).await {
                    store
                        .events()
                        .publish(lease.scope.as_str(), lease.key.as_str());
                }
                tokio::time::sleep(RELEASE_PAUSE).await;
            }
        });
    }
}
