//! The engine's settings: [`EngineConfig`] with a reason for each default,
//! and every `Engine::with_*` builder but transactional mode's (in
//! `transaction.rs`). Each builder is written once, in `engine_settings!`:
//! the engine expands that list as written, and the axum layer expands it
//! into forwarders that carry the same docs and signature. A new setting
//! costs one field, one default and one entry there.

use std::sync::Arc;
use std::time::Duration;

use super::transaction::as_written;
use super::{Engine, ReplayCacheHandle, cache};
use crate::decision::{AbandonedPolicy, InFlightPolicy, Policy};
use crate::store::Store;

/// What the engine does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Refuse with [`Refusal::StoreUnavailable`](crate::engine::Refusal::StoreUnavailable); the work does not run. The default.
    #[default]
    Closed,
    /// Run the work unguarded.
    ///
    /// # Warning
    ///
    /// While the store is down, retries run again: a retried payment is
    /// charged twice. Choose this only where a duplicate is cheaper than an
    /// outage.
    Open,
}

/// The engine's settings. Each default says why it is the default.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    /// 60 s: long enough that renewals (every third of it) are rare, short
    /// enough that a crashed process's keys free up within a minute.
    pub(crate) lease: Duration,
    /// 10 minutes: no write should hold a key longer.
    pub(crate) max_handler_time: Duration,
    /// 24 hours, as Stripe keeps keys: covers any sane retry schedule.
    pub(crate) retention: Duration,
    /// Reject at once, abandoned runs are not run again, 1 s hint.
    pub(crate) policy: Policy,
    /// Closed: an outage must never turn into double execution.
    pub(crate) failure_mode: FailureMode,
    /// 5 s: a store slower than that is as good as down.
    pub(crate) store_timeout: Duration,
    /// 30 s: beyond two NATS JetStream leader elections back to back (one
    /// took up to 8.3 s; the storm's outages lasted up to 16 s), so a
    /// completion rides them out.
    pub(crate) completion_retry_window: Duration,
    /// Off: it needs PostgreSQL and work that writes through a [`crate::Tx`].
    pub(crate) transactions: Option<super::transaction::Transactions>,
    /// Off: only work whose every write goes through its transaction may
    /// be taken over before it began one.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) transactional_claims: bool,
    /// Off: single-commit runs repeat work whose effects are outside their
    /// transaction when a run dies (see `Engine::with_single_commit`).
    pub(crate) single_commit: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            max_handler_time: Duration::from_secs(600),
            retention: Duration::from_secs(24 * 3600),
            policy: Policy {
                abandoned: AbandonedPolicy::Reject,
                in_flight: InFlightPolicy::Reject,
                retry_after: Duration::from_secs(1),
            },
            failure_mode: FailureMode::Closed,
            store_timeout: Duration::from_secs(5),
            completion_retry_window: COMPLETION_RETRY_WINDOW,
            transactions: None,
            transactional_claims: false,
            single_commit: false,
        }
    }
}

/// The default completion retry window (see
/// [`Engine::with_completion_retry_window`]).
pub(super) const COMPLETION_RETRY_WINDOW: Duration = Duration::from_secs(30);

/// The replay cache's default bound on the bytes it holds: 16 MiB, a few
/// thousand typical JSON answers, small beside any server's memory.
pub(super) const REPLAY_CACHE_BYTES: usize = 16 << 20;
/// The default longest life of a replay cache copy: 5 s. Retries come in
/// bursts (a client's, a proxy's, a service's), most within seconds of the
/// first answer; and on a store that does not publish other processes'
/// changes, it bounds how long an operator's deletion elsewhere goes
/// unseen here.
pub(super) const REPLAY_CACHE_MAX_AGE: Duration = Duration::from_secs(5);

/// The engine's builders, each written once: its docs, its signature and its
/// body. `engine_settings!(m)` hands them to the macro `m` as
/// `pub fn with_x(mut self, arg: Type, ..) -> Self { .. }` items:
/// `as_written!` makes them `Engine`'s own builders, and an adapter that
/// keeps the builder names (the axum layer's `forward_to_engine!`) makes
/// each a forwarder with the same docs. Signatures name their types by
/// full path, and doc links are absolute, so both expansions resolve them.
macro_rules! engine_settings {
    ($expand:ident) => {
        $expand! {
            /// Keeps completed records' responses in this process, up to
            /// `capacity` bytes, so replays after the first cost no store
            /// round trip (a copy is made when a replay reads the record,
            /// never when a run completes: a key never replayed costs the
            /// cache nothing; see the
            /// cache's docs in the crate's `engine::cache` module for when a copy
            /// is dropped). A copy lives at most `max_age`: on a store that does not
            /// publish other processes' changes (SQLite, PostgreSQL without
            /// notifications), that bounds how long an operator's deletion made
            /// elsewhere can go unseen here.
            ///
            /// The default value is a cache of 16 MiB whose copies live at most
            /// 5 seconds: a completed record never changes, so a stale copy can
            /// only replay an answer an operator has just deleted in another
            /// process, within those 5 seconds, never run the work a second
            /// time. [`Engine::without_replay_cache`](crate::engine::Engine::without_replay_cache)
            /// turns it off.
            pub fn with_replay_cache(mut self, capacity: usize, max_age: std::time::Duration) -> Self {
                let cache = Arc::new(cache::ReplayCache::new(capacity, max_age));
                let weak = Arc::downgrade(&cache);
                let watcher: Arc<crate::events::Watcher> = Arc::new(move |scope: &str, key: &str| {
                    if let Some(cache) = weak.upgrade() {
                        cache.invalidate(scope, key);
                    }
                });
                self.inner.store.events().watch(&watcher);
                self.inner_mut().cache = Some(Arc::new(ReplayCacheHandle {
                    cache,
                    _watcher: watcher,
                }));
                self
            }

            /// Keeps no replay cache: every replay reads the store, and an
            /// operator's deletion is seen by the next request at once, in every
            /// process ([`Engine::with_replay_cache`](crate::engine::Engine::with_replay_cache)
            /// is on by default).
            pub fn without_replay_cache(mut self) -> Self {
                self.inner_mut().cache = None;
                self
            }

            /// Sets the lease a run holds on its key. The engine renews it every
            /// third of its length until the outcome is settled, so a live run never
            /// loses it and a crashed process's keys free up within one lease.
            ///
            /// The default value is 60 seconds.
            ///
            /// # Panics
            ///
            /// When `lease` is under one second.
            pub fn with_lease(mut self, lease: std::time::Duration) -> Self {
                assert!(
                    lease >= std::time::Duration::from_secs(1),
                    "the lease must be at least one second"
                );
                self.config_mut().lease = lease;
                self
            }

            /// Sets the longest a run may take (work and capture of its outcome,
            /// for the axum layer the handler and its response body); past it
            /// the engine cuts it off and answers
            /// [`Refusal::HandlerTimeout`](crate::engine::Refusal::HandlerTimeout) (the
            /// layer's 504 `handler-timeout`). The key becomes abandoned (in
            /// transactional mode, when the run began its transaction, it is
            /// released: its writes were rolled back).
            ///
            /// The default value is 10 minutes.
            pub fn with_max_handler_time(mut self, max: std::time::Duration) -> Self {
                self.config_mut().max_handler_time = max;
                self
            }

            /// Sets how long a record lives after its key was first claimed; then
            /// the key may be used again, and the record is deleted by whatever
            /// runs `purge_periodically` or `purge_expired` (nothing purges on
            /// its own; Redis and NATS expire their records themselves).
            ///
            /// The default value is 24 hours.
            pub fn with_retention(mut self, retention: std::time::Duration) -> Self {
                self.config_mut().retention = retention;
                self
            }

            /// Sets what a caller does when its key is still in flight.
            ///
            /// The default value is [`InFlightPolicy::Reject`](crate::decision::InFlightPolicy::Reject).
            pub fn with_in_flight(mut self, policy: crate::decision::InFlightPolicy) -> Self {
                self.config_mut().policy.in_flight = policy;
                self
            }

            /// Sets the `retry_after` hint of in-flight and store-unavailable
            /// refusals (the layer's `Retry-After` on `request-in-flight` and
            /// `store-unavailable`), never beyond the remaining lease.
            ///
            /// The default value is 1 second.
            pub fn with_retry_after(mut self, hint: std::time::Duration) -> Self {
                self.config_mut().policy.retry_after = hint;
                self
            }

            /// Sets what a caller does when its key's earlier run was abandoned.
            ///
            /// The default value is [`AbandonedPolicy::Reject`](crate::decision::AbandonedPolicy::Reject).
            pub fn with_abandoned(mut self, policy: crate::decision::AbandonedPolicy) -> Self {
                self.config_mut().policy.abandoned = policy;
                self
            }

            /// Sets what happens when the store fails.
            ///
            /// The default value is [`FailureMode::Closed`](crate::engine::FailureMode::Closed).
            pub fn with_failure_mode(mut self, mode: crate::engine::FailureMode) -> Self {
                self.config_mut().failure_mode = mode;
                self
            }

            /// Sets how long one store operation may take before the engine treats
            /// the store as unavailable.
            ///
            /// The default value is 5 seconds.
            pub fn with_store_timeout(mut self, timeout: std::time::Duration) -> Self {
                self.config_mut().store_timeout = timeout;
                self
            }

            /// Sets how long the engine keeps sending a run's completion
            /// again while the store fails transiently (unavailable, or no
            /// answer within the store timeout): a store that elects a new
            /// leader, fails over or restarts in that time still stores the
            /// outcome, and the key replays it rather than answering
            /// `outcome-unknown`. Pauses double from 50 ms up to 1 s between
            /// attempts; no attempt starts past the window, and none runs
            /// past a tenth of the lease before the lease's end (a resend's
            /// store timeout is cut to end there; renewals go on meanwhile):
            /// a completion under a live lease is still valid, one past it is
            /// not sent. Past either bound the
            /// outcome is not stored ([`Settled::NotStored`](crate::engine::Settled::NotStored))
            /// and the key lapses into abandoned when its lease ends.
            ///
            /// The caller's answer waits for the completion (the response is
            /// stored before it is sent): at most this window and one store
            /// timeout more. Meanwhile other requests with the key are
            /// answered in flight, and a caller that goes away leaves the run
            /// to end in a task of its own. `Duration::ZERO` sends a
            /// completion once.
            ///
            /// The default value is 30 seconds: a NATS JetStream leader
            /// election took 4.6 to 8.3 s, and the NATS storm's two leader
            /// kills held a completion up for as long as 16 s; a Redis
            /// Sentinel or PostgreSQL failover usually takes less.
            pub fn with_completion_retry_window(mut self, window: std::time::Duration) -> Self {
                self.config_mut().completion_retry_window = window;
                self
            }
        }
    };
}
pub(crate) use engine_settings;

impl<S: Store> Engine<S> {
    pub(super) fn config_mut(&mut self) -> &mut EngineConfig {
        &mut self.inner_mut().config
    }

    engine_settings!(as_written);
}
