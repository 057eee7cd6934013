//! Part of the *claim* step (see the engine's docs): a claim is never owned
//! by nobody. A claim whose caller went away while it was on its way
//! ([`PendingClaim`]), or that failed after it may have been sent, goes to
//! a tracked background task that follows it to its end: it releases the
//! claim, fenced by its own token, for as long as a late claim usually
//! lands; then, unless a release found it, asks the store what became of
//! it by sending the same claim again (the claim's own token, so the store
//! answers with the claim if it landed) until the store answers, and
//! releases it if it was there.
//!
//! The second part is for a claim that lands long after it was sent: on
//! PostgreSQL with a synchronous standby that does not acknowledge, a
//! claim's commit waits for the standby (no `statement_timeout` ends that
//! wait) and stays invisible meanwhile, so a release finds nothing; a
//! claim sent again with its token waits behind it (the key's unique
//! index), and answers with it once it commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::Engine;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::LeaseToken;
use crate::store::{Claim, Lease, NewRecord, Store, StoreError};

/// How often a background release is tried, while a late claim may land.
const RELEASE_PAUSE: Duration = Duration::from_millis(250);

/// The longest pause between two questions about a claim's fate.
const MAX_FATE_PAUSE: Duration = Duration::from_secs(5);

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
    /// The claim; copied only if it must be followed (a claim answered,
    /// the common case, copies nothing).
    new: Option<&'a NewRecord<'a>>,
    /// The token a takeover replaces (`None` for a claim).
    previous: Option<LeaseToken>,
}

impl<'a, S: Store> PendingClaim<'a, S> {
    /// Arms the guard of a claim (`previous` is `None`) or of a takeover of
    /// the record holding `previous`.
    pub(super) fn arm(
        engine: &'a Engine<S>,
        new: &'a NewRecord<'a>,
        previous: Option<LeaseToken>,
    ) -> Self {
        Self {
            engine,
            new: Some(new),
            previous,
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
                self.engine
                    .follow_in_background(SentClaim::new(new, self.previous));
            }
        }
    }
}

/// A claim (or takeover) that was sent and not answered, copied so that a
/// background task can send it again.
#[derive(Debug)]
pub(super) struct SentClaim {
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    method: String,
    path: String,
    token: LeaseToken,
    lease: Duration,
    retention: Duration,
    transactional: bool,
    /// The token a takeover replaces.
    previous: Option<LeaseToken>,
}

impl SentClaim {
    /// A copy of `new`, a takeover of `previous` when it is `Some`.
    pub(super) fn new(new: &NewRecord<'_>, previous: Option<LeaseToken>) -> Self {
        Self {
            scope: new.scope.clone(),
            key: new.key.clone(),
            fingerprint: *new.fingerprint,
            method: new.method.to_owned(),
            path: new.path.to_owned(),
            token: new.token,
            lease: new.lease,
            retention: new.retention,
            transactional: new.transactional,
            previous,
        }
    }

    /// The same claim, to send again.
    fn record(&self) -> NewRecord<'_> {
        NewRecord {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            token: self.token,
            lease: self.lease,
            retention: self.retention,
            transactional: self.transactional,
        }
    }

    fn lease(&self) -> Lease {
        Lease {
            scope: self.scope.clone(),
            key: self.key.clone(),
            token: self.token,
        }
    }
}

/// What the store answers about a claim sent again.
enum Fate {
    /// The store holds the claim (it landed, or the question took the key):
    /// it must be released.
    Ours,
    /// Another request's record holds the key: the claim did not land, and
    /// cannot land over that record.
    NotOurs,
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

/// What a background task needs of the engine (its clones, not the engine:
/// the task outlives no setting it copies).
struct Follower<S> {
    store: S,
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

    /// Asks the store, until it answers, whether it holds `claim`: the
    /// claim sent again (a takeover: the takeover, then the claim), which
    /// waits behind the first one where the store makes it wait.
    async fn fate(&self, claim: &SentClaim, until: Instant) -> Option<Fate> {
        let new = claim.record();
        let mut pause = RELEASE_PAUSE;
        while self.goes_on(until) {
            if let Some(previous) = claim.previous {
                match tokio::time::timeout(self.timeout, self.store.take_over(previous, &new)).await
                {
                    Ok(Ok(Some(_))) => return Some(Fate::Ours),
                    // Taken over already (perhaps by the first try), or
                    // changed: the claim below reads what holds the key.
                    Ok(Ok(None)) => {}
                    Ok(Err(_)) | Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_FATE_PAUSE);
                        continue;
                    }
                }
            }
            match tokio::time::timeout(self.timeout, self.store.claim(&new)).await {
                Ok(Ok(Claim::Acquired(_))) => return Some(Fate::Ours),
                Ok(Ok(Claim::Existing(record))) if record.lease_token == claim.token => {
                    return Some(Fate::Ours);
                }
                Ok(Ok(Claim::Existing(_))) => return Some(Fate::NotOurs),
                Ok(Err(_)) | Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_FATE_PAUSE);
        }
        None
    }

    /// Releases a claim the store holds, until the store answers.
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
                // Taken over since (its lease lapsed): no longer ours.
                Ok(Err(StoreError::LeaseLost)) => return true,
                Ok(Err(_)) | Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_FATE_PAUSE);
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
    /// window, then, unless a release found it, asked about until the
    /// store answers, and released if the store holds it.
    pub(super) fn follow_in_background(&self, claim: SentClaim) {
        let follower = self.follower();
        let followed = self.inner.followed.clone();
        self.inner.tracker.spawn(async move {
            let lease = claim.lease();
            if follower.release_for_the_window(&lease).await {
                return;
            }
            let Some(_slot) = followed.enter() else {
                tracing::warn!(
                    "too many claims of unknown fate: this one is left to its lease (it reads abandoned if it landed late)"
                );
                return;
            };
            let until = Instant::now() + claim.retention;
            let settled = match follower.fate(&claim, until).await {
                Some(Fate::Ours) => follower.release(&lease, until).await,
                Some(Fate::NotOurs) => true,
                None => false,
            };
            if !settled {
                tracing::warn!(
                    "shutdown before the store answered about a claim of unknown fate: it lapses into abandoned if it landed"
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
