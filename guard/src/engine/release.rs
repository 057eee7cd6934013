//! Part of the *claim* step (see the engine's docs): a claim is never owned
//! by nobody. A claim whose caller went away while it was on its way
//! ([`PendingClaim`]), or that failed after it may have been sent, goes to
//! a tracked background task that follows it to its end: it releases the
//! claim, fenced by its own token, for as long as a late claim usually
//! lands; then, unless a release found it, waits until the store says no
//! write of the claim can still land ([`Store::settle`]) and releases it
//! once more.
//!
//! The second part is for a claim that lands long after it was sent: on
//! PostgreSQL with a synchronous standby that does not acknowledge, a
//! claim's commit waits for the standby (no `statement_timeout` ends that
//! wait) and stays invisible meanwhile, so a release finds nothing. The
//! store's `settle` waits behind that commit without ever writing the
//! claim itself: the follower never creates a record that was not there.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::Engine;
use crate::store::{Lease, NewRecord, Store, StoreError};

/// How often a background release is tried, while a late claim may land.
const RELEASE_PAUSE: Duration = Duration::from_millis(250);

/// The longest pause between two questions about a claim's fate: short, so
/// that a drain stops a follower within about a second.
const MAX_FATE_PAUSE: Duration = Duration::from_secs(1);

/// How many claims of unknown fate an engine follows at once, past the
/// window of releases. Past it (a long outage that failed many claims), a
/// claim gets the window alone, as a claim of a process that stopped does.
const MAX_FOLLOWED: usize = 4096;

/// A claim or takeover on its way to the store. If the caller's future is
/// dropped before the answer comes back (a client that went away), the
/// claim may still land: dropping this hands it to a background task that
/// follows it to its end.
pub(super) struct PendingClaim<'a, S: Store> {
    engine: &'a Engine<S>,
    /// The claim; its lease is made only if it must be followed (a claim
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
            // A drop during a runtime's shutdown has no runtime: the process
            // is going away, and its claim lapses into abandoned.
            if tokio::runtime::Handle::try_current().is_ok() {
                self.engine.follow_in_background(new);
            }
        }
    }
}

/// The claims of unknown fate an engine follows, counted against
/// [`MAX_FOLLOWED`].
#[derive(Debug, Clone, Default)]
pub(super) struct Followed(Arc<AtomicUsize>);

impl Followed {
    /// A place among the followed claims, if one is free.
    fn enter(&self) -> Option<FollowedSlot> {
        let taken = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                (count < MAX_FOLLOWED).then_some(count + 1)
            })
            .is_ok();
        taken.then(|| FollowedSlot(Arc::clone(&self.0)))
    }
}

/// A place among the followed claims, given back when dropped.
struct FollowedSlot(Arc<AtomicUsize>);

impl Drop for FollowedSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a background task that releases or follows a claim needs of the
/// engine, cloned out of it.
struct Follower<S> {
    store: S,
    /// Closed when the engine drains: a follower then stops.
    tracker: TaskTracker,
    timeout: Duration,
}

impl<S: Store> Follower<S> {
    /// Releases the claim every quarter second for twice the store timeout,
    /// whatever each try answers; whether one release removed it.
    async fn release_for_the_window(&self, lease: &Lease) -> bool {
        let attempts = (2 * self.timeout.as_millis() / RELEASE_PAUSE.as_millis()).max(4);
        let mut released = false;
        for _ in 0..attempts {
            // A refusal (`LeaseLost`) may mean the claim has not landed
            // yet, and a client library may even send it again: keep
            // trying for the whole window.
            if let Ok(Ok(())) = tokio::time::timeout(self.timeout, self.store.release(lease)).await
            {
                self.store
                    .events()
                    .publish(lease.scope.as_str(), lease.key.as_str());
                released = true;
            }
            tokio::time::sleep(RELEASE_PAUSE).await;
        }
        released
    }

    /// Whether to go on following a claim: not once the engine drains (the
    /// process is stopping: the claim lapses into abandoned, as a stopped
    /// process's does), nor past the claim's retention (its record, if any,
    /// no longer holds the key).
    fn goes_on(&self, until: Instant) -> bool {
        !self.tracker.is_closed() && Instant::now() < until
    }

    /// Pauses for `pause`, and doubles it up to [`MAX_FATE_PAUSE`].
    async fn back_off(pause: &mut Duration) {
        tokio::time::sleep(*pause).await;
        *pause = (*pause * 2).min(MAX_FATE_PAUSE);
    }

    /// Waits, asking again until the store answers, until no write of
    /// `lease`'s claim can still land; whether the store answered.
    async fn settle(&self, lease: &Lease, until: Instant) -> bool {
        let mut pause = RELEASE_PAUSE;
        while self.goes_on(until) {
            let asked = self.store.settle(lease, self.timeout);
            if let Ok(Ok(())) = tokio::time::timeout(2 * self.timeout, asked).await {
                return true;
            }
            Self::back_off(&mut pause).await;
        }
        false
    }

    /// Releases a claim, until the store answers; whether it did.
    async fn release(&self, lease: &Lease, until: Instant) -> bool {
        let mut pause = RELEASE_PAUSE;
        while self.goes_on(until) {
            match tokio::time::timeout(self.timeout, self.store.release(lease)).await {
                Ok(Ok(())) => {
                    self.store
                        .events()
                        .publish(lease.scope.as_str(), lease.key.as_str());
                    return true;
                }
                // Not there (it never landed), or taken over since (its
                // lease lapsed): nothing of ours to free.
                Ok(Err(StoreError::LeaseLost)) => return true,
                Ok(Err(_)) | Err(_) => Self::back_off(&mut pause).await,
            }
        }
        false
    }
}

impl<S: Store> Engine<S> {
    fn follower(&self) -> Follower<S> {
        Follower {
            store: self.inner.store.clone(),
            tracker: self.inner.tracker.clone(),
            timeout: self.inner.config.store_timeout,
        }
    }

    /// Follows a claim that was sent and not answered to its end, from a
    /// tracked task of its own (see the module docs): released for the
    /// window, then, unless a release found it, settled (the store waits
    /// until no write of it can still land) and released once more.
    pub(super) fn follow_in_background(&self, new: &NewRecord<'_>) {
        let follower = self.follower();
        let followed = self.inner.followed.clone();
        let lease = new.lease();
        let retention = new.retention;
        self.inner.tracker.spawn(async move {
            if follower.release_for_the_window(&lease).await {
                return;
            }
            let Some(_slot) = followed.enter() else {
                tracing::warn!(
                    "too many claims of unknown fate: this one is left to its lease (it reads abandoned if it landed late)"
                );
                return;
            };
            let until = Instant::now() + retention;
            let settled =
                follower.settle(&lease, until).await && follower.release(&lease, until).await;
            if !settled {
                tracing::warn!(
                    "the engine drained (or the claim's retention ended) before the store settled a claim of unknown fate: it lapses into abandoned if it landed"
                );
            }
        });
    }

    /// Frees a lease from a tracked task of its own, fenced by its token.
    ///
    /// The write being released may land in the store after its sender gave
    /// up, so the release is tried every quarter second for twice the store
    /// timeout, whatever each try answers. The token is this run's own, so
    /// nothing else is ever touched.
    pub(super) fn release_in_background(&self, lease: Arc<Lease>) {
        let follower = self.follower();
        self.inner.tracker.spawn(async move {
            follower.release_for_the_window(&lease).await;
        });
    }
}
