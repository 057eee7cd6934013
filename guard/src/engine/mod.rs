//! The run-once engine: given a scope, a key, a fingerprint and some work,
//! it runs the work at most once per key and retention, and answers every
//! other caller with the stored outcome, or with why it cannot.
//!
//! The axum layer ([`crate::IdempotencyLayer`]) is one adapter over it; code
//! that is not an axum route (a message consumer, a job, a gateway) uses
//! [`Engine::run`] directly:
//!
//! ```no_run
//! use idempotency_guard::engine::{Answer, Engine, Job, Settle};
//! use idempotency_guard::{Fingerprint, StoredResponse, store::sqlite::SqliteStore};
//!
//! # async fn f() -> anyhow::Result<()> {
//! let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
//! store.migrate().await?;
//! let engine = Engine::new(store);
//! let payload = br#"{"amount": 100}"#;
//! let job = Job::new("tenant-a", "order-42", Fingerprint::of_bytes(payload));
//! let answer = engine
//!     .run(job, |_run| async move {
//!         // ... charge the card once ...
//!         Settle::Complete { response: StoredResponse::from_bytes("charged"), reply: () }
//!     })
//!     .await;
//! match answer {
//!     Answer::Ran { .. } => println!("ran now"),
//!     Answer::Replay(stored) => println!("ran before: {:?}", stored.body),
//!     Answer::Refused(refusal) => println!("not run: {refusal:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # The life of one run
//!
//! Who owns the record at each step, and what happens when the caller goes
//! away (its future is dropped), is the whole point of this module:
//!
//! 1. **Claim** ([`claim`]): one atomic store operation with a fresh lease
//!    token, sent from the caller's own future, armed with a guard: if the
//!    caller goes away before the claim's answer comes back, the guard hands
//!    the token to a background task that releases it (fenced) for twice the
//!    store timeout, in case the claim landed or still lands. The same
//!    happens when the claim (or a takeover) fails or times out. A record
//!    already carrying the token is the request's own claim (a client
//!    library retried it after losing the reply), so it counts as acquired.
//!    A claim never ends owned by nobody.
//! 2. **Hand-off** ([`handoff`]). Once the lease is held, with no await in
//!    between, the run goes on in the caller's task while the caller waits,
//!    and moves into a task of its own the moment the caller goes away: both
//!    are tracked by the engine's [`Drain`], and dropping the caller's future
//!    cancels nothing.
//! 3. **Decide** ([`crate::decision::decide`]) on an existing record:
//!    replay, refuse, wait for it, or take it over (atomically, fenced by
//!    the previous token).
//! 4. **Run** ([`supervise`]): the work runs in the task; its lease is renewed
//!    every third of its length until the outcome is settled, including the
//!    time an adapter spends capturing a response body. At the maximum
//!    handler time the work is cut off: renewals stop first (and the store
//!    refuses to revive a lapsed lease), then the record is abandoned.
//! 5. **Settle** ([`settle`]): store the outcome (complete) or release the
//!    key, fenced by the token; in transactional mode inside the work's
//!    transaction, so the work's writes and the outcome commit together.
//! 6. **Answer**: the caller, if still there, gets the reply; waiters on the
//!    key are woken.
//!
//! On shutdown, [`Drain::wait`] waits for every task of step 1 to end,
//! bounded by the maximum handler time.

mod cache;
mod claim;
mod drain;
mod handoff;
mod settle;
mod supervise;
mod timed;
#[cfg(feature = "postgres")]
pub(crate) mod transaction;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::task::TaskTracker;

pub use drain::Drain;
pub(crate) use timed::timed;

use crate::decision::{AbandonedPolicy, InFlightPolicy, Policy};
use crate::store::{Lease, Store, StoreError};
use crate::telemetry::{MetricHandles, Outcome};
use crate::{Fingerprint, StoredResponse};

/// What the engine does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Refuse with [`Refusal::StoreUnavailable`]; the work does not run. The default.
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

/// One request to run some work once: the key it runs under and what
/// identifies the request (so a reuse of the key for another request is
/// refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The namespace of the key (a tenant, a queue).
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The fingerprint of the request.
    pub fingerprint: Fingerprint,
    /// What kind of request it is (an HTTP method; `RUN` by default). Shown
    /// by the status service.
    pub method: String,
    /// Where the request went (an HTTP path; empty by default). Shown by the
    /// status service.
    pub path: String,
    /// A name of few values for metrics (a route template, a queue); empty
    /// by default.
    pub route: String,
}

impl Job {
    /// A job for `key` in `scope`, with method `RUN` and an empty path.
    pub fn new(scope: impl Into<String>, key: impl Into<String>, fingerprint: Fingerprint) -> Self {
        Self {
            scope: scope.into(),
            key: key.into(),
            fingerprint,
            method: String::from("RUN"),
            path: String::new(),
            route: String::new(),
        }
    }

    /// Sets the method and path the status service shows for the record.
    pub fn with_request(mut self, method: impl Into<String>, path: impl Into<String>) -> Self {
        self.method = method.into();
        self.path = path.into();
        self
    }

    /// Sets the name the run's metrics carry (a route template, a queue).
    pub fn with_route(mut self, route: impl Into<String>) -> Self {
        self.route = route.into();
        self
    }
}

/// How the work ended, as the work tells the engine.
#[derive(Debug)]
pub enum Settle<T> {
    /// Keep `response` as the key's outcome (replayed to every later
    /// caller); hand `reply` to this caller.
    Complete {
        /// The outcome to store.
        response: StoredResponse,
        /// What this caller gets.
        reply: T,
    },
    /// Keep nothing: release the key, so a retry runs the work again.
    Release {
        /// What this caller gets.
        reply: T,
        /// In transactional mode, whether the work's writes commit (a
        /// success that is not to be stored) or roll back (a failure).
        keep_writes: bool,
    },
    /// The work's outcome is unknown (it handed the job to something that
    /// went silent after receiving it: an upstream reset mid-request, a
    /// timeout): end the lease so the key is abandoned, answered
    /// `outcome-unknown` and never run again blindly. In transactional mode
    /// the work's writes roll back and the key is released instead.
    Abandon {
        /// What this caller gets.
        reply: T,
    },
}

/// What became of the outcome of work that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The outcome was stored: later callers get it replayed.
    Stored,
    /// The key was released: a retry runs the work again.
    Released,
    /// The work said its outcome is unknown: the key is abandoned.
    Abandoned,
    /// The work ran but its outcome could not be stored (the store failed):
    /// later callers see the run as abandoned.
    NotStored,
    /// The store was down and the engine fails open: the work ran unguarded.
    Unguarded,
}

/// Why the engine did not run the work (or cannot vouch for its run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The key was used with another request (another fingerprint).
    KeyReused,
    /// The first request with this key is still running.
    InFlight {
        /// When to ask again.
        retry_after: Duration,
    },
    /// An earlier run was abandoned: its effects are unknown.
    OutcomeUnknown,
    /// The earlier run's outcome was too large to store.
    ResponseNotStored,
    /// The store failed or did not answer; the work did not run.
    StoreUnavailable {
        /// When to try again.
        retry_after: Duration,
    },
    /// The work ran past the maximum handler time and was cut off.
    TimedOut {
        /// Whether its writes were rolled back with the record
        /// (transactional mode): then a retry runs it again, safely.
        rolled_back: bool,
    },
    /// The work panicked (or its transactional completion failed and was
    /// rolled back); the key was released.
    Failed,
}

/// The engine's answer to one [`Engine::run`].
#[derive(Debug)]
pub enum Answer<T> {
    /// The work ran for this caller.
    Ran {
        /// What the work handed back.
        reply: T,
        /// What became of its outcome.
        settled: Settled,
    },
    /// The work ran before: its stored outcome.
    Replay(StoredResponse),
    /// The work did not run for this caller.
    Refused(Refusal),
}

impl<T> Answer<T> {
    /// The metrics outcome of this answer (the `outcome` label).
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Ran { settled, .. } => match settled {
                Settled::Stored | Settled::NotStored => Outcome::Executed,
                Settled::Released => Outcome::Released,
                Settled::Abandoned => Outcome::Abandoned,
                Settled::Unguarded => Outcome::StoreUnavailable,
            },
            Self::Replay(_) => Outcome::Replayed,
            Self::Refused(refusal) => match refusal {
                Refusal::KeyReused => Outcome::KeyReused,
                Refusal::InFlight { .. } => Outcome::InFlight,
                Refusal::OutcomeUnknown | Refusal::ResponseNotStored => Outcome::Rejected,
                Refusal::StoreUnavailable { .. } => Outcome::StoreUnavailable,
                Refusal::TimedOut { rolled_back: true } | Refusal::Failed => Outcome::Released,
                Refusal::TimedOut { rolled_back: false } => Outcome::Abandoned,
            },
        }
    }
}

/// What the work gets to know about its run.
#[derive(Debug)]
pub struct RunContext {
    lease: Option<Lease>,
    #[cfg(feature = "postgres")]
    slot: Option<transaction::TransactionSlot>,
}

impl RunContext {
    /// The lease the run holds, or `None` when it runs unguarded (the store
    /// failed and the engine fails open).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Begins (on first call) the run's transaction in transactional mode:
    /// writes through it commit together with the stored outcome.
    ///
    /// # Errors
    ///
    /// [`crate::transaction::TxRejection`] when the engine is not in
    /// transactional mode, the transaction is in use, or it cannot begin.
    #[cfg(feature = "postgres")]
    pub async fn tx(&self) -> Result<transaction::Tx, transaction::TxRejection> {
        match &self.slot {
            Some(slot) => slot.tx().await,
            None => Err(transaction::TxRejection::NotTransactional),
        }
    }

    /// The transaction slot, for adapters that hand it on (the axum layer
    /// puts it in the request's extensions for the [`crate::Tx`] extractor).
    #[cfg(feature = "postgres")]
    pub(crate) fn slot(&self) -> Option<&transaction::TransactionSlot> {
        self.slot.as_ref()
    }
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
    /// Off: it needs PostgreSQL and work that writes through a [`crate::Tx`].
    #[cfg(feature = "postgres")]
    pub(crate) transactions: Option<transaction::Transactions>,
    /// Off: only work whose every write goes through its transaction may
    /// be taken over before it began one.
    #[cfg(feature = "postgres")]
    pub(crate) transactional_claims: bool,
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
            #[cfg(feature = "postgres")]
            transactions: None,
            #[cfg(feature = "postgres")]
            transactional_claims: false,
        }
    }
}

/// The run-once engine over a store. Cloning shares it (and its [`Drain`]).
///
/// Every setting has a safe default; see each `with_*` method.
#[derive(Clone)]
pub struct Engine<S> {
    store: S,
    config: Arc<EngineConfig>,
    tracker: TaskTracker,
    cache: Option<Arc<ReplayCacheHandle>>,
    metrics: Arc<MetricHandles>,
}

/// The replay cache and its registration with the store's events (dropping
/// the last engine clone unregisters it).
struct ReplayCacheHandle {
    cache: Arc<cache::ReplayCache>,
    _watcher: Arc<crate::events::Watcher>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("config", &self.config)
            .field("runs", &self.tracker.len())
            .finish()
    }
}

impl<S: Store> Engine<S> {
    /// Creates an engine over a store, with every setting at its default.
    pub fn new(store: S) -> Self {
        Self {
            store,
            config: Arc::new(EngineConfig::default()),
            tracker: TaskTracker::new(),
            cache: None,
            metrics: Arc::default(),
        }
    }

    /// Keeps completed records' responses in this process, up to
    /// `capacity` bytes, so replays cost no store round trip (see the
    /// cache's docs in the crate's `engine::cache` module for when a copy
    /// is dropped). A copy lives at most `max_age`: on a store that does not
    /// publish other processes' changes (SQLite, PostgreSQL without
    /// notifications), that bounds how long an operator's deletion made
    /// elsewhere can go unseen here.
    ///
    /// The default value is no cache.
    pub fn with_replay_cache(mut self, capacity: usize, max_age: Duration) -> Self {
        let cache = Arc::new(cache::ReplayCache::new(capacity, max_age));
        let weak = Arc::downgrade(&cache);
        let watcher: Arc<crate::events::Watcher> = Arc::new(move |scope: &str, key: &str| {
            if let Some(cache) = weak.upgrade() {
                cache.invalidate(scope, key);
            }
        });
        self.store.events().watch(&watcher);
        self.cache = Some(Arc::new(ReplayCacheHandle {
            cache,
            _watcher: watcher,
        }));
        self
    }

    /// The replay cache, when the engine keeps one.
    fn replay_cache(&self) -> Option<&cache::ReplayCache> {
        self.cache.as_deref().map(|handle| &*handle.cache)
    }

    fn config_mut(&mut self) -> &mut EngineConfig {
        Arc::make_mut(&mut self.config)
    }

    /// The store the engine keeps records in.
    pub fn store(&self) -> &S {
        &self.store
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
    pub fn with_lease(mut self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_secs(1),
            "the lease must be at least one second"
        );
        self.config_mut().lease = lease;
        self
    }

    /// Sets the longest a run may take (work and capture of its outcome);
    /// past it the engine cuts it off and answers [`Refusal::TimedOut`]. The
    /// key becomes abandoned (in transactional mode it is released: its
    /// writes were rolled back).
    ///
    /// The default value is 10 minutes.
    pub fn with_max_handler_time(mut self, max: Duration) -> Self {
        self.config_mut().max_handler_time = max;
        self
    }

    /// Sets how long a record lives after its key was first claimed; then it
    /// is purged and the key may be used again.
    ///
    /// The default value is 24 hours.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.config_mut().retention = retention;
        self
    }

    /// Sets what a caller does when its key is still in flight.
    ///
    /// The default value is [`InFlightPolicy::Reject`].
    pub fn with_in_flight(mut self, policy: InFlightPolicy) -> Self {
        self.config_mut().policy.in_flight = policy;
        self
    }

    /// Sets the `retry_after` hint of in-flight and store-unavailable
    /// refusals (never beyond the remaining lease).
    ///
    /// The default value is 1 second.
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        self.config_mut().policy.retry_after = hint;
        self
    }

    /// Sets what a caller does when its key's earlier run was abandoned.
    ///
    /// The default value is [`AbandonedPolicy::Reject`].
    pub fn with_abandoned(mut self, policy: AbandonedPolicy) -> Self {
        self.config_mut().policy.abandoned = policy;
        self
    }

    /// Sets what happens when the store fails.
    ///
    /// The default value is [`FailureMode::Closed`].
    pub fn with_failure_mode(mut self, mode: FailureMode) -> Self {
        self.config_mut().failure_mode = mode;
        self
    }

    /// Sets how long one store operation may take before the engine treats
    /// the store as unavailable.
    ///
    /// The default value is 5 seconds.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().store_timeout = timeout;
        self
    }

    /// A handle that waits, on shutdown, for every run this engine (and its
    /// clones) started.
    pub fn drain(&self) -> Drain {
        Drain::new(
            self.tracker.clone(),
            self.config.max_handler_time + 2 * self.config.store_timeout,
        )
    }

    /// Checks the settings against each other.
    ///
    /// # Panics
    ///
    /// When the retention does not exceed the maximum handler time plus the
    /// lease: a running record could be purged.
    pub(crate) fn check(&self) {
        let config = &self.config;
        assert!(
            config.retention > config.max_handler_time + config.lease,
            "retention ({:?}) must exceed the maximum handler time plus the lease ({:?}), \
             or a running request's record could be purged",
            config.retention,
            config.max_handler_time + config.lease,
        );
    }

    /// Runs `work` at most once for `job`'s key, or answers with the stored
    /// outcome or the reason it does not run.
    ///
    /// The work runs in the caller's task, and in a task of its own once the
    /// caller stops waiting (its future is dropped): the run goes on to its end and its outcome is
    /// stored, so the caller's retry gets the replay; a caller that goes away
    /// while its claim is still on its way leaves the claim to be released
    /// in the background. A panic in the work releases the key and answers
    /// [`Refusal::Failed`].
    ///
    /// (Not an `async fn`: one would keep `job` and `work` a second time in
    /// its state, in every request's future.)
    pub fn run<F, Fut, T>(&self, job: Job, work: F) -> impl Future<Output = Answer<T>>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
        T: Send + 'static,
    {
        #[cfg(not(feature = "otel"))]
        {
            self.run_once(job, work)
        }
        #[cfg(feature = "otel")]
        {
            let span = tracing::info_span!(
                "idempotency.run",
                idempotency.route = %job.route,
                idempotency.key_hash = %crate::telemetry::otel::key_hash(&job.scope, &job.key),
                idempotency.outcome = tracing::field::Empty,
            );
            // Recorded inside the span (an `async` block awaiting the run
            // would hold it twice).
            let run = self.run_once(job, work).inspect(|answer| {
                tracing::Span::current()
                    .record(crate::telemetry::otel::OUTCOME, answer.outcome().as_str());
            });
            tracing::Instrument::instrument(run, span)
        }
    }

    /// [`Engine::run`], steps 1 to 6.
    async fn run_once<F, Fut, T>(&self, job: Job, work: F) -> Answer<T>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
        T: Send + 'static,
    {
        let lease = match self.acquire(&job).await {
            claim::Acquired::Lease(lease) => lease,
            claim::Acquired::Answer(answer) => return answer,
            claim::Acquired::StoreFailed => return self.store_failed(work).await,
        };
        // No await between the claim's answer and this hand-off: from here
        // on the run goes on to its end, whatever becomes of the caller.
        let engine = self.clone();
        let run = async move { engine.run_acquired(job, lease, work).await };
        // The run stays inside the caller's span, in a task of its own too.
        #[cfg(feature = "otel")]
        let run = tracing::Instrument::in_current_span(run);
        handoff::HandOff::new(run, &self.tracker).await
    }

    /// Runs `work` once for `job`'s key and keeps its JSON value as the
    /// outcome; later calls get the stored value back (deserialized).
    ///
    /// # Errors
    ///
    /// The refusal when the work did not run and no stored value exists,
    /// or [`Refusal::Failed`] when a stored value does not deserialize.
    pub async fn run_json<F, Fut, V>(&self, job: Job, work: F) -> Result<V, Refusal>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = V> + Send + 'static,
        V: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    {
        let answer = self
            .run(job, |context| async move {
                let value = work(context).await;
                match serde_json::to_vec(&value) {
                    Ok(bytes) => Settle::Complete {
                        response: StoredResponse::from_bytes(bytes),
                        reply: value,
                    },
                    Err(error) => {
                        tracing::error!(error = %error, "the outcome does not serialize; the key is released");
                        Settle::Release {
                            reply: value,
                            keep_writes: false,
                        }
                    }
                }
            })
            .await;
        match answer {
            Answer::Ran { reply, .. } => Ok(reply),
            Answer::Replay(stored) => stored
                .body
                .as_deref()
                .and_then(|body| serde_json::from_slice(body).ok())
                .ok_or(Refusal::Failed),
            Answer::Refused(refusal) => Err(refusal),
        }
    }

    /// Steps 4 to 6 of the module docs, inside the run's own task.
    async fn run_acquired<F, Fut, T>(self, job: Job, lease: Lease, work: F) -> Answer<T>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
        T: Send + 'static,
    {
        #[cfg(feature = "postgres")]
        let slot = self.config.transactions.as_ref().map(|transactions| {
            transaction::TransactionSlot::new(transactions.postgres.clone(), lease.clone())
        });
        let context = RunContext {
            lease: Some(lease.clone()),
            #[cfg(feature = "postgres")]
            slot: slot.clone(),
        };
        #[cfg(feature = "postgres")]
        let transaction = settle::Transaction(slot);
        #[cfg(not(feature = "postgres"))]
        let transaction = settle::Transaction;
        // The work's future is made here, not inside an `async` block that
        // would hold the closure and its future both; a panic while making
        // it is caught as one while it runs.
        let work = match std::panic::catch_unwind(AssertUnwindSafe(|| work(context))) {
            Ok(future) => {
                futures_util::future::Either::Left(AssertUnwindSafe(future).catch_unwind())
            }
            Err(panic) => futures_util::future::Either::Right(std::future::ready(Err(panic))),
        };
        #[cfg(feature = "otel")]
        let work =
            tracing::Instrument::instrument(work, tracing::info_span!("idempotency.handler"));
        // Boxed before it is handed on: the work's future (the handler's)
        // is then never copied along with the run's.
        self.supervise_and_settle(&job, lease, transaction, Box::pin(work))
            .await
    }

    /// Fails closed (refuses) or open (runs the work unguarded).
    async fn store_failed<F, Fut, T>(&self, work: F) -> Answer<T>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
    {
        match self.config.failure_mode {
            FailureMode::Closed => Answer::Refused(Refusal::StoreUnavailable {
                retry_after: self.config.policy.retry_after,
            }),
            FailureMode::Open => {
                let context = RunContext {
                    lease: None,
                    #[cfg(feature = "postgres")]
                    slot: None,
                };
                let reply = match work(context).await {
                    Settle::Complete { reply, .. }
                    | Settle::Release { reply, .. }
                    | Settle::Abandon { reply } => reply,
                };
                Answer::Ran {
                    reply,
                    settled: Settled::Unguarded,
                }
            }
        }
    }

    /// Runs a store operation under the store timeout and records its latency.
    pub(crate) fn timed<'a, R, F>(
        &'a self,
        operation: &'static str,
        future: F,
    ) -> impl Future<Output = Result<R, StoreError>> + use<'a, R, F, S>
    where
        F: Future<Output = Result<R, StoreError>>,
    {
        timed(&self.metrics, operation, self.config.store_timeout, future)
    }

    /// The handles of the engine's per-request metrics.
    pub(crate) fn metrics(&self) -> &Arc<MetricHandles> {
        &self.metrics
    }
}

#[cfg(feature = "postgres")]
impl<S: crate::store::TransactionalStore> Engine<S> {
    /// Turns transactional mode on or off: the work writes through a
    /// [`crate::Tx`] (see [`RunContext::tx`]), and the engine commits those
    /// writes together with the stored outcome, so a crash or timeout
    /// leaves nothing behind. A run that never begins its transaction is an
    /// ordinary run (its record is marked transactional only when the
    /// transaction begins).
    ///
    /// The default value is `false`.
    ///
    /// # Panics
    ///
    /// When turned on over a store without PostgreSQL.
    pub fn with_transactional_mode(mut self, on: bool) -> Self {
        let transactions = on.then(|| {
            let postgres = self
                .store
                .postgres()
                .cloned()
                .expect("transactional mode needs a PostgreSQL store");
            let store = self.store.clone();
            transaction::Transactions {
                postgres,
                committed: Arc::new(move |lease: Lease| {
                    let store = store.clone();
                    Box::pin(async move { store.committed(&lease).await })
                }),
            }
        });
        self.config_mut().transactions = transactions;
        self
    }

    /// Marks every record transactional from its claim on (in
    /// transactional mode), not only once the work begins its transaction:
    /// a run that dies between its claim and its commit is then taken over
    /// by the next caller, never left with an unknown outcome. For a
    /// transactional inbox, whose handler writes only through its
    /// transaction.
    ///
    /// The default value is `false`.
    ///
    /// # Warning
    ///
    /// A write of the work that does not go through [`RunContext::tx`] (a
    /// call to another service, say) is repeated when a dead run is taken
    /// over.
    pub fn with_transactional_claims(mut self, on: bool) -> Self {
        self.config_mut().transactional_claims = on;
        self
    }
}
