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
//! use idempotency_guard::{Fingerprint, Scope, StoredResponse, store::sqlite::SqliteStore};
//!
//! # async fn f() -> anyhow::Result<()> {
//! let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
//! store.migrate().await?;
//! let engine = Engine::new(store);
//! let payload = br#"{"amount": 100}"#;
//! let job = Job::new(Scope::new("tenant-a")?, "order-42".parse()?, Fingerprint::of_bytes(payload));
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
//! 1. **Claim** (`claim.rs`, `release.rs`): one atomic store operation with a fresh lease
//!    token, sent from the caller's own future, armed with a guard: if the
//!    caller goes away before the claim's answer comes back, the guard hands
//!    the token to a background task that releases it (fenced) for twice the
//!    store timeout, in case the claim landed or still lands; then, unless a
//!    release found it, waits until the store says no write of the claim can
//!    still land (`Store::settle`: PostgreSQL waits behind a commit still
//!    waiting for a synchronous standby) and releases it once more. The same
//!    happens when the claim (or a takeover) fails or times out. A record
//!    already carrying the token is the request's own claim (a client
//!    library retried it after losing the reply), so it counts as acquired.
//!    A claim never ends owned by nobody.
//! 2. **Decide** (`decision::decide`, a pure function) on an existing record:
//!    replay, refuse, wait for it, or take it over (atomically, fenced by
//!    the previous token).
//! 3. **Hand-off** (`handoff.rs`). Once the lease is held, with no await in
//!    between, the run goes on in the caller's task while the caller waits,
//!    and moves into a task of its own the moment the caller goes away: both
//!    are tracked by the engine's [`Drain`], and dropping the caller's future
//!    cancels nothing.
//! 4. **Run** (`supervise.rs`): the work runs in the task; its lease is renewed
//!    every third of its length until the outcome is settled, including the
//!    time an adapter spends capturing a response body. At the maximum
//!    handler time the work is cut off: renewals stop first (and the store
//!    refuses to revive a lapsed lease), then the record is abandoned.
//! 5. **Settle** (`settle.rs`): store the outcome (complete) or release the
//!    key, fenced by the token; in transactional mode inside the work's
//!    transaction, so the work's writes and the outcome commit together. A
//!    completion that fails transiently (the store unavailable, or electing
//!    a leader) is sent again with capped exponential backoff (`retry.rs`)
//!    for up to the completion retry window (30 s by default), never once
//!    its lease may have ended (`lease_end.rs`); its lease is still renewed
//!    meanwhile, and the caller's answer waits for it.
//! 6. **Answer**: the caller, if still there, gets the reply; waiters on the
//!    key are woken.
//!
//! On shutdown, [`Drain::wait`] waits for every task of steps 1 and 3 to end,
//! bounded by the maximum handler time and the completion retry window.

mod answer;
mod cache;
mod claim;
mod completer;
mod config;
mod drain;
mod handoff;
mod job;
mod lease_end;
mod release;
mod retry;
mod settle;
mod steps;
mod supervise;
mod timed;
pub(crate) mod transaction;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio_util::task::TaskTracker;

pub use answer::{Answer, Refusal, Settle, Settled};
pub(crate) use completer::CompleterAttempt;
pub use completer::{Completer, CompleterHandle, CompleterRound, GiveUp};
pub(crate) use config::EngineConfig;
pub use config::FailureMode;
pub(crate) use config::engine_settings;
pub use drain::Drain;
pub(crate) use handoff::boxed_in_place;
pub use job::Job;
pub use steps::{Run, StepError};
pub(crate) use timed::timed;
#[cfg_attr(not(feature = "postgres"), allow(unused_imports))]
pub(crate) use transaction::transactional_settings;

use crate::record::StoredRequest;
use crate::record::StoredResponse;
use crate::store::{Lease, Store, StoreError};
use crate::telemetry::MetricHandles;

use transaction::{Held, Resume};

/// What the work gets to know about its run, and its handle to record
/// steps ([`RunContext::step`], see [`Run`]).
#[derive(Debug)]
pub struct RunContext {
    /// Shared with the run that supervises it, not copied.
    lease: Option<Arc<Lease>>,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    slot: Option<transaction::TransactionSlot>,
    run: Run,
}

impl RunContext {
    /// The lease the run holds, or `None` when it runs unguarded (the store
    /// failed and the engine fails open).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_deref()
    }

    /// The run's handle (a clone shares it): to record steps from another
    /// task, or to hand to code that takes a [`Run`].
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// [`Run::step`] on this run.
    ///
    /// # Errors
    ///
    /// See [`StepError`].
    pub async fn step<T, F, Fut>(&self, name: &str, work: F) -> Result<T, StepError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        self.run.step(name, work).await
    }

    /// [`Run::step_with_input`] on this run.
    ///
    /// # Errors
    ///
    /// See [`StepError`].
    pub async fn step_with_input<I, T, F, Fut>(
        &self,
        name: &str,
        input: &I,
        work: F,
    ) -> Result<T, StepError>
    where
        I: serde::Serialize + ?Sized,
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        self.run.step_with_input(name, input, work).await
    }

    /// [`Run::derived_key`] of this run.
    pub fn derived_key(&self, step: &str) -> crate::key::IdempotencyKey {
        self.run.derived_key(step)
    }

    /// [`Run::try_step`] on this run: only a success is recorded.
    ///
    /// # Errors
    ///
    /// See [`Run::try_step`].
    pub async fn try_step<T, E, F, Fut>(
        &self,
        name: &str,
        work: F,
    ) -> Result<Result<T, E>, StepError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run.try_step(name, work).await
    }

    /// [`Run::step_tx`] on this run: a step whose writes through its
    /// [`Tx`](crate::Tx) commit with its recorded result.
    ///
    /// # Errors
    ///
    /// See [`Run::step_tx`].
    #[cfg(feature = "postgres")]
    pub async fn step_tx<T, F, Fut>(&self, name: &str, work: F) -> Result<T, StepError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce(crate::Tx) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run.step_tx(name, work).await
    }
}

/// The run-once engine over a store. Cloning shares it (and its [`Drain`]).
///
/// Every setting has a safe default; see each `with_*` method.
pub struct Engine<S> {
    /// Everything, behind one pointer: every request clones the engine
    /// (into its run, and the layer's service with it), and one reference
    /// count costs less than one per field.
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// What an [`Engine`] and its clones share.
#[derive(Clone)]
struct Inner<S> {
    store: S,
    config: EngineConfig,
    tracker: TaskTracker,
    /// The claims of unknown fate its background tasks follow.
    followed: release::Followed,
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
            .field("store", &self.inner.store)
            .field("config", &self.inner.config)
            .field("runs", &self.inner.tracker.len())
            .finish()
    }
}

impl<S: Store> Engine<S> {
    /// Creates an engine over a store, with every setting at its default
    /// (the replay cache on: [`Engine::with_replay_cache`]).
    pub fn new(store: S) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                config: EngineConfig::default(),
                tracker: TaskTracker::new(),
                followed: release::Followed::default(),
                cache: None,
                metrics: Arc::default(),
            }),
        }
        .with_replay_cache(config::REPLAY_CACHE_BYTES, config::REPLAY_CACHE_MAX_AGE)
    }

    /// The shared state, to change a setting: this engine's own copy when
    /// it is shared (a builder called on a clone changes that clone alone;
    /// its runs, metrics and replay cache stay shared, as before).
    fn inner_mut(&mut self) -> &mut Inner<S> {
        Arc::make_mut(&mut self.inner)
    }

    /// The replay cache, when the engine keeps one.
    fn replay_cache(&self) -> Option<&cache::ReplayCache> {
        self.inner.cache.as_deref().map(|handle| &*handle.cache)
    }

    /// The store the engine keeps records in.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// A handle that waits, on shutdown, for every run this engine (and its
    /// clones) started.
    pub fn drain(&self) -> Drain {
        Drain::new(
            self.inner.tracker.clone(),
            self.inner.config.max_handler_time
                + self.inner.config.completion_retry_window
                + 2 * self.inner.config.store_timeout,
        )
    }

    /// Checks the settings against each other.
    ///
    /// # Panics
    ///
    /// When the retention does not exceed the maximum handler time plus the
    /// lease: a running record could be purged.
    pub(crate) fn check(&self) {
        let config = &self.inner.config;
        assert!(
            config.retention > config.max_handler_time + config.lease,
            "retention ({:?}) must exceed the maximum handler time plus the lease ({:?}), \
             or a running request's record could be purged",
            config.retention,
            config.max_handler_time + config.lease,
        );
        assert!(
            !config.single_commit || config.transactions.is_some(),
            "single-commit mode needs transactional mode (with_transactional_mode(true))"
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
    /// [`Refusal::HandlerFailed`].
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
                idempotency.key_hash = %crate::telemetry::otel::key_hash(job.scope.as_str(), job.key.as_str()),
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
        // The lease taken below ends no earlier than a lease after this.
        let claim_sent = tokio::time::Instant::now();
        let (lease, held, resume) = match self.acquire(&job).await {
            claim::Acquired::Lease(lease) => (lease, Held::default(), Resume::default()),
            claim::Acquired::Resumed(lease, resume) => (lease, Held::default(), resume),
            claim::Acquired::Locked(lease, transaction) => {
                (lease, Some(transaction), Resume::default())
            }
            claim::Acquired::Answer(answer) => return answer,
            claim::Acquired::StoreFailed => return self.store_failed(&job, work).await,
            claim::Acquired::InFlight => {
                return Answer::Refused(Refusal::RequestInFlight {
                    key: job.key,
                    retry_after: self.inner.config.policy.retry_after,
                });
            }
        };
        // No await between the claim's answer and this hand-off: from here
        // on the run goes on to its end, whatever becomes of the caller.
        let engine = self.clone();
        let key = job.key.clone();
        // The run is made in its box (not made here and copied in), and
        // stays inside the caller's span, in a task of its own too.
        let run = move || {
            let run = engine.run_acquired(job, lease, held, resume, claim_sent, work);
            #[cfg(feature = "otel")]
            let run = tracing::Instrument::in_current_span(run);
            run
        };
        handoff::HandOff::new(run, &self.inner.tracker, key).await
    }

    /// Runs `work` once for `job`'s key and keeps its JSON value as the
    /// outcome; later calls get the stored value back (deserialized).
    ///
    /// # Errors
    ///
    /// The refusal when the work did not run and no stored value exists,
    /// or [`Refusal::HandlerFailed`] when a stored value does not deserialize.
    pub async fn run_json<F, Fut, V>(&self, job: Job, work: F) -> Result<V, Refusal>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = V> + Send + 'static,
        V: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    {
        let key = job.key.clone();
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
                .ok_or(Refusal::HandlerFailed { key }),
            Answer::Refused(refusal) => Err(refusal),
        }
    }

    /// Steps 4 to 6 of the module docs, inside the run's own task.
    async fn run_acquired<F, Fut, T>(
        self,
        job: Job,
        lease: Lease,
        held: Held,
        resume: Resume,
        claim_sent: tokio::time::Instant,
        work: F,
    ) -> Answer<T>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
        T: Send + 'static,
    {
        // One allocation shared by the work, the supervision and its
        // renewals, where each had its copy of the scope and key.
        let lease = Arc::new(lease);
        if let Some(request) = &job.stored_request {
            // Boxed: the cold path of the routes that keep their request.
            Box::pin(self.keep_request(&lease, request, resume.attempts)).await;
        }
        let slot = transaction::TransactionSlot::for_run(
            held,
            self.inner.config.transactions.as_ref(),
            &lease,
        );
        let run = Run::new(
            &self,
            job.scope.clone(),
            job.key.clone(),
            Some(Arc::clone(&lease)),
            resume.steps,
            slot.clone(),
        );
        let steps = run.clone();
        let context = RunContext {
            lease: Some(Arc::clone(&lease)),
            slot: slot.clone(),
            run,
        };
        let transaction = supervise::Transaction(slot);
        // The work's future is made here, not inside an `async` block that
        // would hold the closure and its future both; a panic while making
        // it is caught as one while it runs.
        let work = match std::panic::catch_unwind(AssertUnwindSafe(|| work(context))) {
            Ok(future) => {
                futures_util::future::Either::Left(AssertUnwindSafe(future).catch_unwind())
            }
            Err(panic) => futures_util::future::Either::Right(std::future::ready(Err(panic))),
        };
        // A run that fails (or panics) once the record holds steps ends its
        // lease (the key abandoned, resumable) instead of releasing the key:
        // a release would delete the steps, and a retry would run them
        // again.
        let work = async move {
            match work.await {
                Ok(Settle::Release { reply, .. }) if steps.holds_steps() => {
                    Ok(Settle::Abandon { reply })
                }
                Ok(settle) => Ok(settle),
                Err(_payload) => Err(supervise::Panicked {
                    keeps_steps: steps.holds_steps(),
                }),
            }
        };
        #[cfg(feature = "otel")]
        let work =
            tracing::Instrument::instrument(work, tracing::info_span!("idempotency.handler"));
        // Not boxed: this run is in the hand-off's box already, and the
        // work is pinned inside it (one allocation less per request).
        self.supervise_and_settle(&job, lease, transaction, claim_sent, work)
            .await
    }

    /// Keeps the run's request with its claim, for the completer, before
    /// the work runs. A failure is logged, not fatal: the run goes on (a
    /// lost lease shows at its next write), and the completer finds no
    /// request to finish it from (the client's retry still resumes it).
    /// A resumed run keeps the completer's `attempts` so far (the request
    /// of a client's retry counts none: without this it would give the
    /// completer fresh attempts).
    async fn keep_request(&self, lease: &Lease, request: &StoredRequest, attempts: u32) {
        let counted;
        let request = if request.attempts < attempts {
            counted = StoredRequest {
                attempts,
                ..request.clone()
            };
            &counted
        } else {
            request
        };
        let kept = self
            .timed(
                "record_request",
                self.inner.store.record_request(lease, Some(request)),
            )
            .await;
        if let Err(error) = kept {
            tracing::warn!(error = %error, "the request was not kept for the completer");
        }
    }

    /// Fails closed (refuses) or open (runs the work unguarded).
    async fn store_failed<F, Fut, T>(&self, job: &Job, work: F) -> Answer<T>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Settle<T>> + Send + 'static,
    {
        match self.inner.config.failure_mode {
            FailureMode::Closed => Answer::Refused(Refusal::StoreUnavailable {
                key: Some(job.key.clone()),
                retry_after: self.inner.config.policy.retry_after,
            }),
            FailureMode::Open => {
                let context = RunContext {
                    lease: None,
                    slot: None,
                    run: Run::new(
                        self,
                        job.scope.clone(),
                        job.key.clone(),
                        None,
                        Vec::new(),
                        None,
                    ),
                };
                let reply = work(context).await.into_reply();
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
        timed(
            &self.inner.metrics,
            operation,
            self.inner.config.store_timeout,
            future,
        )
    }

    /// The `Retry-After` hint of the engine's refusals (see
    /// [`Engine::with_retry_after`]).
    pub fn retry_after(&self) -> std::time::Duration {
        self.inner.config.policy.retry_after
    }

    /// What a caller does when its key's earlier run was abandoned (see
    /// [`Engine::with_abandoned`]): an adapter that redelivers (a message
    /// consumer) sends a run it abandoned back to be resumed when this is
    /// [`AbandonedPolicy::Resume`](crate::decision::AbandonedPolicy::Resume).
    pub fn abandoned_policy(&self) -> crate::decision::AbandonedPolicy {
        self.inner.config.policy.abandoned
    }

    /// A [`Tally`](crate::telemetry::Tally) of one request of an adapter
    /// over this engine (a JSON-RPC tool call, a gRPC call, a message),
    /// counted once in `idempotency_requests_total` as the axum layer counts
    /// its own: when its answer is ready ([`Answer::outcome`], or
    /// `rejected` for a refusal before the engine ran) or as `caller-gone`
    /// when it is dropped first. `route` is a name of few values (a route
    /// template, a tool), `attempt` from
    /// [`crate::telemetry::attempt_label`]. The one way an adapter counts a
    /// request.
    ///
    /// ```
    /// use idempotency_guard::{Engine, Store, telemetry};
    /// # fn f<S: Store>(engine: &Engine<S>, headers: &http::HeaderMap) {
    /// let tally = engine.tally("send_email", telemetry::attempt_label(headers));
    /// tally.count(telemetry::Outcome::Rejected);
    /// # }
    /// ```
    pub fn tally(
        &self,
        route: impl Into<Arc<str>>,
        attempt: &'static str,
    ) -> crate::telemetry::Tally {
        crate::telemetry::Tally::new(Arc::clone(&self.inner.metrics), route.into(), attempt)
    }
}
