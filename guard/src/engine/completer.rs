//! The completer (SPEC §12): an optional background task that finishes
//! abandoned resumable runs without waiting for their clients, from the
//! request each kept with its claim ([`StoredRequest`]).
//!
//! Off by default: nothing here runs unless the app makes a
//! [`Completer`] and runs it ([`Completer::spawn`], or
//! [`Completer::run_once`] from a scheduler of its own), and a route keeps
//! its request only when it opts in
//! ([`IdempotencyLayer::with_stored_request`](crate::IdempotencyLayer::with_stored_request),
//! [`Job::with_stored_request`]).
//!
//! # A round
//!
//! 1. **Find.** For each scope it was given ([`Completer::with_scopes`];
//!    `default` unless told), up to 1000 keys a round, the completer pages
//!    through the store's admin listing of abandoned records
//!    ([`AdminStore::list`] with [`StateFilter::Abandoned`]: not
//!    transactional, not expired) and keeps those that hold a stored request
//!    the completer has not given up on, whose lease ended at least the
//!    grace period ago, plus the backoff of the attempts made
//!    ([`Completer::with_backoff`]).
//! 2. **Drive**, at most [`Completer::with_concurrency`] at once: the run
//!    is taken over through the engine exactly as a client's retry takes it
//!    over (fenced by the previous lease token, a lease of its own, renewed
//!    while it runs), its attempt counted in the stored request before the
//!    work runs, and resumed: recorded steps return their results, the
//!    first step not recorded runs. For the axum layer the completer
//!    rebuilds an [`http::Request`] from the stored request and sends it
//!    through a clone of the service the route lives in
//!    ([`Completer::for_service`]); for [`Engine::run`] it calls the
//!    function it was given with the stored request
//!    ([`Completer::for_work`]). A client's retry meanwhile finds the key in
//!    flight; a completer that finds a client's retry running skips the key.
//! 3. **Give up** on a key whose attempts ran out
//!    ([`Completer::with_max_attempts`]), or whose stored request does not
//!    take the key over (it no longer matches the record): it takes the
//!    key over once more, marks its stored request given up and ends its
//!    lease at once. The key is then abandoned as any other, for a person
//!    to decide (the status service and the console show it), and the
//!    completer leaves it alone.
//!
//! The client's later retry gets the stored answer; so does the status
//! service.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use http::{Request, StatusCode};
use tower::{Service, ServiceExt};

use super::{Answer, Engine, Job, RunContext, Settle};
use crate::decision::AbandonedPolicy;
use crate::key::Scope;
use crate::record::StoredRequest;
use crate::record::{Record, RecordState};
use crate::refusal::Refusal;
use crate::store::AdminStore;
use crate::store::admin::{PageRequest, StateFilter};

/// The mark of a request the completer sends through a service: the
/// attempt it is. Only this crate can set it (a client's header cannot);
/// the layer keeps it in the stored request, and never runs such a request
/// unguarded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CompleterAttempt(pub(crate) u32);

/// The records one listing page holds while the completer looks for work.
const PAGE: u32 = 200;
/// The most keys one round drives (the rest wait for the next round), so a
/// round's memory stays bounded however many keys an incident left.
const MAX_PER_ROUND: usize = 1000;

/// What the completer does with a stored request: run the work it stands
/// for, through the engine (a [`Job`] for `Engine::run`) or through a
/// service (the axum layer).
#[derive(Clone)]
enum Driver {
    /// Rebuilds the work of an [`Engine::run`] from the stored request.
    Work(Arc<dyn Fn(StoredRequest, RunContext) -> BoxFuture<'static, Settle<()>> + Send + Sync>),
    /// Sends the rebuilt request through the service the route lives in;
    /// answers the response's status.
    Service(Arc<dyn Fn(Request<Body>) -> BoxFuture<'static, StatusCode> + Send + Sync>),
}

/// The completer's bounds. See each `with_*` method of [`Completer`].
#[derive(Debug, Clone)]
struct Bounds {
    scopes: Vec<Scope>,
    grace: Duration,
    interval: Duration,
    concurrency: usize,
    max_attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            scopes: vec![Scope::DEFAULT],
            grace: Duration::from_secs(30),
            interval: Duration::from_secs(10),
            concurrency: 4,
            max_attempts: 5,
            backoff: Duration::from_secs(30),
            max_backoff: Duration::from_secs(600),
        }
    }
}

impl Bounds {
    /// How long after its lease ended a key with `attempts` made waits for
    /// its next attempt: the grace period, then a backoff that doubles with
    /// each attempt (capped).
    fn wait_after(&self, attempts: u32) -> Duration {
        let backoff = match attempts {
            0 => Duration::ZERO,
            n => self
                .backoff
                .saturating_mul(1 << (n - 1).min(20))
                .min(self.max_backoff),
        };
        self.grace + backoff
    }
}

/// What one round of the completer did ([`Completer::run_once`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompleterRound {
    /// Keys it finished: their records now hold the answer.
    pub completed: usize,
    /// Attempts that did not finish their key (it is abandoned again, or
    /// its run released it): tried again after the backoff.
    pub failed: usize,
    /// Keys it gave up on this round.
    pub gave_up: usize,
    /// Keys it found but did not drive: someone else (a client's retry)
    /// holds them, or the store failed on the way.
    pub skipped: usize,
}

/// What became of one key.
enum Outcome {
    Completed,
    Failed,
    GaveUp,
    Skipped,
}

/// Finishes abandoned resumable runs in the background (see the module
/// documentation). Cloning shares the engine and the driver.
#[derive(Clone)]
pub struct Completer<S> {
    engine: Engine<S>,
    driver: Driver,
    bounds: Bounds,
}

impl<S> std::fmt::Debug for Completer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer")
            .field("bounds", &self.bounds)
            .finish_non_exhaustive()
    }
}

impl<S: AdminStore> Completer<S> {
    /// A completer of the runs of [`Engine::run`]: `work` gets the stored
    /// request a run kept ([`Job::with_stored_request`]) and the run's
    /// context, and rebuilds the work from them (its steps included).
    ///
    /// # Panics
    ///
    /// When `engine` does not resume abandoned runs
    /// ([`AbandonedPolicy::Resume`]): a completer would have nothing to
    /// resume.
    pub fn for_work<F, Fut>(engine: Engine<S>, work: F) -> Self
    where
        F: Fn(StoredRequest, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Settle<()>> + Send + 'static,
    {
        let work = Arc::new(work);
        Self::new(
            engine,
            Driver::Work(Arc::new(move |request, context| {
                let work = Arc::clone(&work);
                Box::pin(async move { work(request, context).await })
            })),
        )
    }

    /// A completer of the routes behind an
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) over `engine`
    /// ([`IdempotencyLayer::engine`](crate::IdempotencyLayer::engine)):
    /// each stored request is rebuilt and sent through a clone of `service`
    /// (the router the routes live in), the same way as a client's retry.
    ///
    /// # Panics
    ///
    /// As [`Completer::for_work`].
    pub fn for_service<I, B>(engine: Engine<S>, service: I) -> Self
    where
        I: Service<Request<Body>, Response = http::Response<B>> + Clone + Send + Sync + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        B: Send + 'static,
    {
        Self::new(
            engine,
            Driver::Service(Arc::new(move |request| {
                let service = service.clone();
                Box::pin(async move {
                    match service.oneshot(request).await {
                        Ok(response) => response.status(),
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
                    }
                })
            })),
        )
    }

    fn new(engine: Engine<S>, driver: Driver) -> Self {
        assert!(
            engine.inner.config.policy.abandoned == AbandonedPolicy::Resume,
            "a completer needs an engine that resumes abandoned runs \
             (with_abandoned(AbandonedPolicy::Resume))"
        );
        Self {
            engine,
            driver,
            bounds: Bounds::default(),
        }
    }

    /// The scopes whose keys it looks after (`default` unless told): the
    /// store's listing is by scope.
    pub fn with_scopes(mut self, scopes: impl IntoIterator<Item = Scope>) -> Self {
        self.bounds.scopes = scopes.into_iter().collect();
        self
    }

    /// How long after its lease ended a key is left to its client's retry
    /// before the completer takes it (30 s by default).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.bounds.grace = grace;
        self
    }

    /// How long [`Completer::spawn`] waits between rounds (10 s by default).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.bounds.interval = interval;
        self
    }

    /// How many keys it drives at once (4 by default; at least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.bounds.concurrency = concurrency.max(1);
        self
    }

    /// How many attempts a key gets before the completer gives up on it
    /// (5 by default).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.bounds.max_attempts = attempts;
        self
    }

    /// The wait before a key's second attempt (beyond the grace period),
    /// doubled for each further one up to `max` (30 s and 10 min by
    /// default).
    pub fn with_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.bounds.backoff = first;
        self.bounds.max_backoff = max;
        self
    }

    /// Runs rounds ([`Completer::run_once`]) every interval in a task of
    /// its own, until the returned handle is stopped or dropped. Stopping
    /// cuts nothing short: a run it drives goes on to its end in the
    /// engine (and the engine's [`Drain`](super::Drain) waits for it).
    pub fn spawn(self) -> CompleterHandle {
        let task = tokio::spawn(async move {
            loop {
                let round = self.run_once().await;
                if round != CompleterRound::default() {
                    tracing::info!(?round, "completer round");
                }
                tokio::time::sleep(self.bounds.interval).await;
            }
        });
        CompleterHandle { task }
    }

    /// One round: finds the keys due and drives them, at most the
    /// concurrency at once; answers what it did.
    pub async fn run_once(&self) -> CompleterRound {
        let mut round = CompleterRound::default();
        let due = self.due().await;
        let outcomes = futures_util::stream::iter(due)
            .map(|record| self.attempt(record))
            .buffer_unordered(self.bounds.concurrency)
            .collect::<Vec<_>>()
            .await;
        for outcome in outcomes {
            match outcome {
                Outcome::Completed => round.completed += 1,
                Outcome::Failed => round.failed += 1,
                Outcome::GaveUp => round.gave_up += 1,
                Outcome::Skipped => round.skipped += 1,
            }
        }
        round
    }

    /// The abandoned records due for an attempt (or a give-up).
    async fn due(&self) -> Vec<Record> {
        let store = self.engine.store();
        let mut due = Vec::new();
        for scope in &self.bounds.scopes {
            let mut after: Option<String> = None;
            loop {
                let listed = store.list(
                    scope.as_str(),
                    StateFilter::Abandoned,
                    PageRequest {
                        after: after.as_deref(),
                        limit: PAGE,
                    },
                );
                let page = self.engine.timed("list", listed).await;
                let page = match page {
                    Ok(page) => page,
                    Err(error) => {
                        tracing::warn!(error = %error, scope = %scope, "the completer could not list abandoned keys");
                        break;
                    }
                };
                due.extend(
                    page.records
                        .into_iter()
                        .filter(|record| self.is_due(record)),
                );
                if due.len() >= MAX_PER_ROUND {
                    due.truncate(MAX_PER_ROUND);
                    return due;
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        due
    }

    /// Whether `record` is an abandoned resumable run the completer has not
    /// given up on, past its grace period and backoff.
    fn is_due(&self, record: &Record) -> bool {
        let Some(request) = &record.request else {
            return false;
        };
        if request.gave_up || record.transactional || record.is_expired() {
            return false;
        }
        if record.state() != RecordState::Abandoned {
            return false;
        }
        let since_lease: Duration = (record.observed_at - record.lease_expires_at)
            .try_into()
            .unwrap_or_default();
        since_lease >= self.bounds.wait_after(request.attempts)
    }

    /// Drives `record`'s run once, or gives up on it.
    async fn attempt(&self, record: Record) -> Outcome {
        let Some(request) = record.request.clone() else {
            return Outcome::Skipped;
        };
        if request.attempts >= self.bounds.max_attempts {
            return self.give_up(&record, *request).await;
        }
        let mut next = *request;
        next.attempts += 1;
        let attempt = next.attempts;
        let not_taken = match &self.driver {
            Driver::Work(work) => {
                let job = job_of(&record, next.clone());
                let work = Arc::clone(work);
                let answer = self
                    .engine
                    .run(job, move |context| work(next, context))
                    .await;
                match answer {
                    Answer::Refused(
                        Refusal::StoreUnavailable { .. } | Refusal::RequestInFlight { .. },
                    ) => Some(true),
                    Answer::Refused(_) => Some(false),
                    Answer::Ran { .. } | Answer::Replay(_) => None,
                }
            }
            Driver::Service(send) => match rebuild(&next, attempt) {
                Some(http_request) => {
                    let status = send(http_request).await;
                    // 503: the store failed on the way; anything else that
                    // did not take the key over will not next time either.
                    Some(status == StatusCode::SERVICE_UNAVAILABLE)
                }
                None => Some(false),
            },
        };
        self.judge(&record, not_taken).await
    }

    /// What the attempt on `before` did, read back from the store.
    /// `transient` says, for an attempt that may not have taken the key
    /// over, whether trying again may help (`None`: it ran).
    async fn judge(&self, before: &Record, transient: Option<bool>) -> Outcome {
        let read = self.engine.store().get(&before.scope, &before.key);
        let after = self.engine.timed("get", read).await;
        let after = match after {
            Ok(Some(after)) => after,
            // Released by its run (it failed before any step): nothing to
            // finish.
            Ok(None) => return Outcome::Failed,
            Err(error) => {
                tracing::warn!(error = %error, "the completer could not read a key back");
                return Outcome::Skipped;
            }
        };
        match after.state() {
            RecordState::Completed => Outcome::Completed,
            RecordState::InFlight => Outcome::Skipped,
            RecordState::Abandoned if after.lease_token != before.lease_token => Outcome::Failed,
            RecordState::Abandoned => match transient {
                Some(false) => match before.request.as_deref() {
                    Some(request) => self.give_up(before, request.clone()).await,
                    None => Outcome::Skipped,
                },
                _ => Outcome::Skipped,
            },
        }
    }

    /// Takes `record` over once more to mark its stored request given up,
    /// and ends that lease at once: the key stays abandoned, for a person.
    async fn give_up(&self, record: &Record, request: StoredRequest) -> Outcome {
        match self.engine.mark_given_up(record, request).await {
            Answer::Ran { .. } => {
                tracing::warn!(
                    scope = %record.scope,
                    key = %record.key,
                    "the completer gave up on a key; it needs a person's decision"
                );
                Outcome::GaveUp
            }
            _ => Outcome::Skipped,
        }
    }
}

/// What [`Engine::give_up_completion`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The key's kept request is marked given up: no completer takes the
    /// key again; it is abandoned, for a person to decide.
    GaveUp,
    /// There is no record of the key.
    Missing,
    /// The key is not one a completer would finish: in this state, or
    /// abandoned without a kept request (or given up already). Nothing
    /// was written.
    NotResuming(RecordState),
    /// The take-over was refused (the store failed, or a client's retry
    /// holds the key): nothing was written.
    Refused(Refusal),
}

impl<S: crate::store::Store> Engine<S> {
    /// Gives up on completing `(scope, key)`: the operator's way to stop
    /// completers from finishing a key that will complete
    /// ([`Completer`]). The key is taken over (fenced, as any take-over),
    /// its kept request marked given up, and the lease ended at once: it
    /// stays abandoned, with its steps, for a person to decide (release,
    /// forget). Runs nothing of the key's work.
    ///
    /// # Errors
    ///
    /// The store's, when reading the record fails.
    pub async fn give_up_completion(
        &self,
        scope: &Scope,
        key: &crate::key::IdempotencyKey,
    ) -> Result<GiveUp, crate::store::StoreError> {
        let Some(record) = self.timed("get", self.inner.store.get(scope, key)).await? else {
            return Ok(GiveUp::Missing);
        };
        let state = record.state();
        let resuming = state == RecordState::Abandoned
            && !record.transactional
            && !record.is_expired()
            && record
                .request
                .as_deref()
                .is_some_and(|request| !request.gave_up);
        let Some(request) = record.request.as_deref().filter(|_| resuming) else {
            return Ok(GiveUp::NotResuming(state));
        };
        Ok(match self.mark_given_up(&record, request.clone()).await {
            Answer::Ran { .. } => GiveUp::GaveUp,
            Answer::Refused(refusal) => GiveUp::Refused(refusal),
            Answer::Replay(_) => GiveUp::NotResuming(RecordState::Completed),
        })
    }

    /// Takes `record` over (resuming, whatever this engine's policy) to
    /// keep `request` marked given up, and ends the lease at once.
    async fn mark_given_up(&self, record: &Record, mut request: StoredRequest) -> Answer<()> {
        request.gave_up = true;
        let engine = if self.inner.config.policy.abandoned == AbandonedPolicy::Resume {
            self.clone()
        } else {
            self.clone().with_abandoned(AbandonedPolicy::Resume)
        };
        engine
            .run(job_of(record, request), |_context| async {
                Settle::Abandon { reply: () }
            })
            .await
    }
}

/// The job that takes `record` over: its own scope, key, fingerprint,
/// method and path, keeping `request`.
fn job_of(record: &Record, request: StoredRequest) -> Job {
    Job::new(record.scope.clone(), record.key.clone(), record.fingerprint)
        .with_request(record.method.clone(), record.path.clone())
        .with_stored_request(request)
}

/// The HTTP request `request` stands for, marked as the completer's
/// `attempt`; `None` when it no longer makes one (sealed with a key this
/// process does not hold, or invalid).
fn rebuild(request: &StoredRequest, attempt: u32) -> Option<Request<Body>> {
    if request.is_sealed() {
        return None;
    }
    let mut builder = Request::builder()
        .method(request.method.as_str())
        .uri(request.path.as_str());
    if let Some(headers) = builder.headers_mut() {
        headers.extend(request.headers.clone());
    }
    let mut rebuilt = builder.body(Body::from(request.body.clone())).ok()?;
    rebuilt.extensions_mut().insert(CompleterAttempt(attempt));
    Some(rebuilt)
}

/// The running completer of [`Completer::spawn`]: stops it when dropped.
#[derive(Debug)]
pub struct CompleterHandle {
    task: tokio::task::JoinHandle<()>,
}

impl CompleterHandle {
    /// Stops the completer (the runs it drives go on in the engine).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for CompleterHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_grace_then_a_doubling_capped_backoff() {
        let bounds = Bounds {
            grace: Duration::from_secs(30),
            backoff: Duration::from_secs(10),
            max_backoff: Duration::from_secs(60),
            ..Bounds::default()
        };
        let secs = |attempts| bounds.wait_after(attempts).as_secs();
        assert_eq!(
            [secs(0), secs(1), secs(2), secs(3), secs(4), secs(40)],
            [30, 40, 50, 70, 90, 90]
        );
    }
}
