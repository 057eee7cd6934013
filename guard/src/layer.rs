//! [`IdempotencyLayer`] (the builder), [`IdempotencyService`] and the path a
//! guarded request takes through them.
//!
//! The path, in order: method check, key, scope, bounded body read,
//! fingerprint, one atomic claim, then either the handler (run detached from
//! the client's connection, its lease renewed, its response stored before it
//! is sent) or what [`decide`] says about the existing record.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode, header, request::Parts};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use crate::decision::{AbandonedPolicy, Decision, InFlightPolicy, Policy, decide};
use crate::problem::Rejection;
use crate::response::{BoxError, Captured, capture, default_stored_status, headers_to_store};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Store, StoreError};
use crate::telemetry::{Outcome, attempt_label, count_lease_lost, count_request, observe_store};
use crate::{Fingerprint, IdempotencyKey, KeyError, Record, StoredResponse};

/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 255;

/// How many times one request claims again after losing a race (the record
/// changed between two reads) before it gives up with `request-in-flight`.
const MAX_CLAIM_ROUNDS: usize = 8;

/// What the guard does when the store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Answer 503 `store-unavailable`; the handler does not run. The default.
    #[default]
    Closed,
    /// Run the handler unguarded.
    ///
    /// # Warning
    ///
    /// While the store is down, retries run again: a retried payment is
    /// charged twice. Choose this only for routes where a duplicate is
    /// cheaper than an outage.
    Open,
}

/// The function that names the scope of a request.
type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The layer's settings. Each default says why it is the default.
#[derive(Clone)]
struct Config {
    /// POST and PATCH: the methods that are not idempotent by definition.
    methods: Vec<Method>,
    /// Required: a write without a key cannot be made safe to retry.
    key_required: bool,
    /// One fixed scope, `default`: apps without tenants need nothing more.
    scope: ScopeFn,
    /// 1 MiB: the body is buffered to fingerprint it, so it must be bounded.
    body_limit: usize,
    /// 1 MiB: stored responses live in the store for the whole retention.
    stored_response_limit: usize,
    /// Below 500, except 408, 425 and 429 (see [`default_stored_status`]).
    stored_statuses: fn(StatusCode) -> bool,
    /// 60 s: long enough that renewals (every third of it) are rare, short
    /// enough that a crashed process's keys free up within a minute.
    lease: Duration,
    /// 10 minutes: no write endpoint should hold a key longer.
    max_handler_time: Duration,
    /// 24 hours, as Stripe keeps keys: covers any sane retry schedule.
    retention: Duration,
    /// 409, as Stripe answers; the IETF draft suggests 422.
    mismatch_status: StatusCode,
    /// Reject at once, abandoned runs are not run again, 1 s hint.
    policy: Policy,
    /// Closed: an outage must never turn into double execution.
    failure_mode: FailureMode,
    /// 5 s: a store slower than that is as good as down.
    store_timeout: Duration,
    /// `Date` (stale on replay) and `Set-Cookie` (a session is not a result).
    excluded_headers: Vec<HeaderName>,
    /// Off: it needs PostgreSQL and handlers that write through [`crate::Tx`].
    transactional: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            scope: Arc::new(|_| String::from("default")),
            body_limit: 1024 * 1024,
            stored_response_limit: 1024 * 1024,
            stored_statuses: default_stored_status,
            lease: Duration::from_secs(60),
            max_handler_time: Duration::from_secs(600),
            retention: Duration::from_secs(24 * 3600),
            mismatch_status: StatusCode::CONFLICT,
            policy: Policy {
                abandoned: AbandonedPolicy::Reject,
                in_flight: InFlightPolicy::Reject,
                retry_after: Duration::from_secs(1),
            },
            failure_mode: FailureMode::Closed,
            store_timeout: Duration::from_secs(5),
            excluded_headers: vec![header::DATE, header::SET_COOKIE],
            transactional: false,
        }
    }
}

/// The idempotency guard, as a tower layer for axum routes.
///
/// Mount it with `route_layer` on write routes, so unknown routes still
/// answer 404. Every setting has a safe default; see each `with_*` method.
///
/// ```
/// use axum::{Router, routing::post};
/// use idempotency_guard::{IdempotencyLayer, store::sqlite::SqliteStore};
///
/// # async fn run() -> anyhow::Result<()> {
/// let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
/// let app: Router = Router::new()
///     .route("/payments", post(|| async { "created" }))
///     .route_layer(IdempotencyLayer::new(store));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer<S> {
    store: S,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.store)
            .field("methods", &self.config.methods)
            .field("lease", &self.config.lease)
            .field("retention", &self.config.retention)
            .field("transactional", &self.config.transactional)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayer<S> {
    /// Creates the layer over a store, with every setting at its default.
    pub fn new(store: S) -> Self {
        Self {
            store,
            config: Arc::new(Config::default()),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// The store the layer keeps records in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Sets the guarded methods; others pass through untouched.
    ///
    /// The default value is POST and PATCH.
    ///
    /// ```
    /// # use idempotency_guard::{IdempotencyLayer, store::AnyStore};
    /// # fn f(store: AnyStore) -> IdempotencyLayer<AnyStore> {
    /// use http::Method;
    /// IdempotencyLayer::new(store).with_methods([Method::POST, Method::PUT, Method::DELETE])
    /// # }
    /// ```
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config_mut().methods = methods.into_iter().collect();
        self
    }

    /// Sets whether a guarded request must carry a key. When not required,
    /// a request without one runs unguarded (a request with an invalid key
    /// is still refused).
    ///
    /// The default value is `true`.
    pub fn with_key_required(mut self, required: bool) -> Self {
        self.config_mut().key_required = required;
        self
    }

    /// Sets the function that names a request's scope, for example its
    /// tenant or authenticated principal. Keys of two scopes never meet.
    /// A scope must be 1 to 255 bytes; others are refused with 400
    /// `scope-invalid`.
    ///
    /// The default value is one fixed scope, `default`.
    ///
    /// ```
    /// # use idempotency_guard::{IdempotencyLayer, store::AnyStore};
    /// # fn f(store: AnyStore) -> IdempotencyLayer<AnyStore> {
    /// IdempotencyLayer::new(store).with_scope(|parts| {
    ///     parts.headers.get("x-tenant")
    ///         .and_then(|v| v.to_str().ok())
    ///         .unwrap_or("default")
    ///         .to_owned()
    /// })
    /// # }
    /// ```
    ///
    /// # Warning
    ///
    /// Derive the scope from something the client cannot forge (an
    /// authenticated principal): a client that can name another scope can
    /// read that scope's replays.
    pub fn with_scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config_mut().scope = Arc::new(scope);
        self
    }

    /// Sets the largest request body accepted, in bytes; larger ones get 413
    /// `body-too-large` (before any of it is buffered when `Content-Length`
    /// tells).
    ///
    /// The default value is 1 MiB.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.config_mut().body_limit = bytes;
        self
    }

    /// Sets the largest response body stored for replay, in bytes. A larger
    /// response still reaches the first caller; replays of its key answer
    /// 409 `response-not-stored` and never run the handler again.
    ///
    /// The default value is 1 MiB.
    pub fn with_stored_response_limit(mut self, bytes: usize) -> Self {
        self.config_mut().stored_response_limit = bytes;
        self
    }

    /// Sets which response statuses are stored. A response that is not
    /// stored releases its key, so a retry runs the handler again.
    ///
    /// The default value is [`default_stored_status`]: below 500, except
    /// 408, 425 and 429.
    pub fn with_stored_statuses(mut self, rule: fn(StatusCode) -> bool) -> Self {
        self.config_mut().stored_statuses = rule;
        self
    }

    /// Sets the lease a request holds on its key while the handler runs. The
    /// guard renews it every third of its length, so a live handler never
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

    /// Sets the longest a handler may run; past it the guard cuts it off and
    /// answers 504 `handler-timeout`. The key becomes abandoned (in
    /// transactional mode it is released: its writes were rolled back).
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

    /// Sets the status of `key-reused` answers.
    ///
    /// The default value is 409 Conflict; 422 is what the IETF draft suggests.
    pub fn with_mismatch_status(mut self, status: StatusCode) -> Self {
        self.config_mut().mismatch_status = status;
        self
    }

    /// Sets what a request does when its key is still in flight.
    ///
    /// The default value is [`InFlightPolicy::Reject`].
    pub fn with_in_flight(mut self, policy: InFlightPolicy) -> Self {
        self.config_mut().policy.in_flight = policy;
        self
    }

    /// Sets the `Retry-After` hint of `request-in-flight` and
    /// `store-unavailable` answers (never beyond the remaining lease).
    ///
    /// The default value is 1 second.
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        self.config_mut().policy.retry_after = hint;
        self
    }

    /// Sets what a request does when its key's earlier run was abandoned.
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

    /// Sets how long one store operation may take before the guard treats
    /// the store as unavailable.
    ///
    /// The default value is 5 seconds.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().store_timeout = timeout;
        self
    }

    /// Sets the response headers left out of stored responses, beside the
    /// hop-by-hop headers, which are never stored.
    ///
    /// The default value is `Date` and `Set-Cookie`.
    pub fn with_excluded_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config_mut().excluded_headers = names.into_iter().collect();
        self
    }

    /// Turns transactional mode on or off: handlers write through a
    /// [`Tx`](crate::Tx), and the guard commits their writes together with
    /// the stored response, so a crash or timeout leaves nothing behind.
    ///
    /// The default value is `false`.
    ///
    /// # Panics
    ///
    /// When turned on over a store without PostgreSQL.
    #[cfg(feature = "postgres")]
    pub fn with_transactional_mode(mut self, on: bool) -> Self {
        assert!(
            !on || self.store.transactions().is_some(),
            "transactional mode needs a PostgreSQL store"
        );
        self.config_mut().transactional = on;
        self
    }
}

impl<S: Store, I> Layer<I> for IdempotencyLayer<S> {
    type Service = IdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        let config = &self.config;
        assert!(
            config.retention > config.max_handler_time + config.lease,
            "retention ({:?}) must exceed the maximum handler time plus the lease ({:?}), \
             or a running request's record could be purged",
            config.retention,
            config.max_handler_time + config.lease,
        );
        IdempotencyService {
            inner,
            guard: Guard {
                store: self.store.clone(),
                config: Arc::clone(&self.config),
            },
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around a route.
#[derive(Clone)]
pub struct IdempotencyService<S, I> {
    inner: I,
    guard: Guard<S>,
}

impl<S, I> std::fmt::Debug for IdempotencyService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, I, B> Service<Request<Body>> for IdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = I::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, I::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven to readiness with `oneshot` on a clone,
        // after the claim: nothing is reserved here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let guard = self.guard.clone();
        let inner = self.inner.clone();
        Box::pin(guard.handle(inner, request))
    }
}

/// Everything known about a guarded request once its key and body are read.
struct Attempt {
    scope: String,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    method: String,
    path: String,
    route: String,
    attempt: &'static str,
}

impl Attempt {
    fn new_record(&self, transactional: bool, config: &Config) -> NewRecord<'_> {
        NewRecord {
            scope: &self.scope,
            key: self.key.as_str(),
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            token: LeaseToken::new(),
            lease: config.lease,
            retention: config.retention,
            transactional,
        }
    }

    fn key(&self) -> String {
        self.key.as_str().to_owned()
    }
}

/// How a handler run ended, as far as the record is concerned.
enum Ending<'a> {
    /// Store this response (in transactional mode: commit the handler's writes with it).
    Complete(&'a StoredResponse),
    /// Delete the record, keeping the handler's writes (`no-store`).
    Release,
    /// Delete the record and roll the handler's writes back (failures).
    Rollback,
    /// Keep the record but end its lease: it becomes abandoned.
    Abandon,
}

/// A failed settlement, and whether the handler's writes were rolled back
/// (or may have been: a transaction that did not confirm its commit).
struct SettleError {
    error: StoreError,
    rolled_back: bool,
}

/// The request's transaction in transactional mode.
#[cfg(feature = "postgres")]
type Slot = Option<crate::transaction::TransactionSlot>;
#[cfg(not(feature = "postgres"))]
type Slot = Option<std::convert::Infallible>;

/// The shared state of every request through one layer.
struct Guard<S> {
    store: S,
    config: Arc<Config>,
}

impl<S: Clone> Clone for Guard<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: Store> Guard<S> {
    async fn handle<I, B>(
        self,
        inner: I,
        request: Request<Body>,
    ) -> Result<Response<Body>, I::Error>
    where
        I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if !self.config.methods.contains(request.method()) {
            return inner.oneshot(request).await.map(|r| r.map(Body::new));
        }
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str)
            .to_owned();
        let attempt = attempt_label(request.headers());
        let reject = |rejection: Rejection| {
            count_request(&route, Outcome::Rejected, attempt);
            Ok(rejection.into_response())
        };
        let key = match IdempotencyKey::from_headers(request.headers()) {
            Ok(key) => key,
            Err(KeyError::Missing) if !self.config.key_required => {
                count_request(&route, Outcome::Unguarded, attempt);
                return inner.oneshot(request).await.map(|r| r.map(Body::new));
            }
            Err(KeyError::Missing) => return reject(Rejection::KeyMissing),
            Err(error) => return reject(Rejection::KeyInvalid(error)),
        };
        let (parts, body) = request.into_parts();
        let scope = (self.config.scope)(&parts);
        if scope.is_empty() || scope.len() > MAX_SCOPE_LEN {
            return reject(Rejection::ScopeInvalid);
        }
        let body = match read_body(body, &parts.headers, self.config.body_limit).await {
            Ok(body) => body,
            Err(rejection) => return reject(rejection),
        };
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str())
            .to_owned();
        let fingerprint = Fingerprint::of_request(&parts.method, &path, &parts.headers, &body);
        let attempt = Attempt {
            scope,
            key,
            fingerprint,
            method: parts.method.as_str().to_owned(),
            path,
            route,
            attempt,
        };
        let request = Request::from_parts(parts, Body::from(body));
        self.guarded(attempt, inner, request).await
    }

    /// Claims the key and acts on the result.
    async fn guarded<I, B>(
        self,
        attempt: Attempt,
        inner: I,
        request: Request<Body>,
    ) -> Result<Response<Body>, I::Error>
    where
        I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let answer = |outcome: Outcome, rejection: Rejection| {
            count_request(&attempt.route, outcome, attempt.attempt);
            Ok(rejection.into_response())
        };
        let wait_until = match self.config.policy.in_flight {
            InFlightPolicy::Wait(bound) => Instant::now() + bound,
            InFlightPolicy::Reject => Instant::now(),
        };
        for _ in 0..MAX_CLAIM_ROUNDS {
            let new = attempt.new_record(self.config.transactional, &self.config);
            let mut record = match self.timed("claim", self.store.claim(&new)).await {
                Ok(Claim::Acquired(lease)) => {
                    return self.execute(attempt, lease, inner, request).await;
                }
                Ok(Claim::Existing(record)) => *record,
                Err(error) => {
                    if matches!(error, StoreError::Timeout(_)) {
                        // The claim may still land: free the key if it does.
                        self.release_in_background(new.lease());
                    }
                    return self.store_failed(attempt, error, inner, request).await;
                }
            };
            // Decide about the record, waiting for it where the route waits.
            loop {
                let wait_left = wait_until.saturating_duration_since(Instant::now());
                match decide(
                    &record,
                    &attempt.fingerprint,
                    &self.config.policy,
                    wait_left,
                ) {
                    Decision::Replay => {
                        if let Some(stored) = &record.response
                            && let Some(body) = &stored.body
                        {
                            count_request(&attempt.route, Outcome::Replayed, attempt.attempt);
                            return Ok(crate::response::replay(stored, body.clone()));
                        }
                        return answer(
                            Outcome::Rejected,
                            Rejection::ResponseNotStored { key: attempt.key() },
                        );
                    }
                    Decision::ResponseNotStored => {
                        return answer(
                            Outcome::Rejected,
                            Rejection::ResponseNotStored { key: attempt.key() },
                        );
                    }
                    Decision::KeyReused => {
                        let status = self.config.mismatch_status;
                        return answer(
                            Outcome::KeyReused,
                            Rejection::KeyReused {
                                key: attempt.key(),
                                status,
                            },
                        );
                    }
                    Decision::InFlight { retry_after } => {
                        return answer(
                            Outcome::InFlight,
                            Rejection::RequestInFlight {
                                key: attempt.key(),
                                retry_after,
                            },
                        );
                    }
                    Decision::OutcomeUnknown => {
                        return answer(
                            Outcome::Rejected,
                            Rejection::OutcomeUnknown { key: attempt.key() },
                        );
                    }
                    Decision::Wait => {
                        match self.wait_for_change(&attempt, &record, wait_left).await {
                            Ok(Some(changed)) => record = changed,
                            Ok(None) => break, // released meanwhile: claim again
                            Err(error) => {
                                return self.store_failed(attempt, error, inner, request).await;
                            }
                        }
                    }
                    Decision::TakeOver => {
                        let new = attempt.new_record(self.config.transactional, &self.config);
                        match self
                            .timed("take_over", self.store.take_over(record.lease_token, &new))
                            .await
                        {
                            Ok(Some(lease)) => {
                                return self.execute(attempt, lease, inner, request).await;
                            }
                            Ok(None) => break, // someone else changed it first: claim again
                            Err(error) => {
                                if matches!(error, StoreError::Timeout(_)) {
                                    // The takeover may still land: free the key if it does.
                                    self.release_in_background(new.lease());
                                }
                                return self.store_failed(attempt, error, inner, request).await;
                            }
                        }
                    }
                }
            }
        }
        let retry_after = self.config.policy.retry_after;
        answer(
            Outcome::InFlight,
            Rejection::RequestInFlight {
                key: attempt.key(),
                retry_after,
            },
        )
    }

    /// Waits (up to `wait_left`) until the in-flight `record` changes, and
    /// reads it again. `None` when the record is gone.
    async fn wait_for_change(
        &self,
        attempt: &Attempt,
        record: &Record,
        wait_left: Duration,
    ) -> Result<Option<Record>, StoreError> {
        // Subscribe before reading again, so a completion in between is seen.
        let subscription = self
            .store
            .events()
            .subscribe(&attempt.scope, attempt.key.as_str());
        let current = self
            .timed("get", self.store.get(&attempt.scope, attempt.key.as_str()))
            .await?;
        match current {
            Some(current)
                if current.lease_token == record.lease_token && current.response.is_none() =>
            {
                // Still the same run: wait for its end, bounded by the route's
                // wait and by its lease (a crashed holder publishes nothing).
                let bound = wait_left.min(current.lease_remaining());
                let _ = tokio::time::timeout(bound, subscription.changed()).await;
                self.timed("get", self.store.get(&attempt.scope, attempt.key.as_str()))
                    .await
            }
            other => Ok(other),
        }
    }

    /// Fails closed (503) or open (runs the handler unguarded).
    async fn store_failed<I, B>(
        &self,
        attempt: Attempt,
        error: StoreError,
        inner: I,
        request: Request<Body>,
    ) -> Result<Response<Body>, I::Error>
    where
        I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        count_request(&attempt.route, Outcome::StoreUnavailable, attempt.attempt);
        match self.config.failure_mode {
            FailureMode::Closed => {
                tracing::warn!(error = %error, route = %attempt.route, "idempotency store failed; request refused");
                Ok(Rejection::StoreUnavailable {
                    key: Some(attempt.key()),
                    retry_after: self.config.policy.retry_after,
                }
                .into_response())
            }
            FailureMode::Open => {
                tracing::warn!(error = %error, route = %attempt.route, "idempotency store failed; running unguarded");
                inner.oneshot(request).await.map(|r| r.map(Body::new))
            }
        }
    }

    /// Runs the handler for a claimed key in a task of its own, so a client
    /// that disconnects does not cancel it: its response is still stored.
    async fn execute<I, B>(
        &self,
        attempt: Attempt,
        lease: Lease,
        inner: I,
        request: Request<Body>,
    ) -> Result<Response<Body>, I::Error>
    where
        I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
        I::Future: Send + 'static,
        I::Error: Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let key = attempt.key();
        let guard = self.clone();
        let task =
            tokio::spawn(async move { guard.run_claimed(attempt, lease, inner, request).await });
        match task.await {
            Ok(result) => result,
            Err(error) => {
                tracing::error!(error = %error, "the guard's handler task failed");
                Ok(Rejection::HandlerFailed { key }.into_response())
            }
        }
    }

    async fn run_claimed<I, B>(
        self,
        attempt: Attempt,
        lease: Lease,
        inner: I,
        mut request: Request<Body>,
    ) -> Result<Response<Body>, I::Error>
    where
        I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
        I::Future: Send + 'static,
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let slot = self.open_slot(&mut request);
        let handler = AssertUnwindSafe(inner.oneshot(request)).catch_unwind();
        let ended = self.supervise(handler, &lease, &attempt.route).await;

        let outcome = match ended {
            Ok(Ok(Ok(response))) => return Ok(self.finish(attempt, lease, slot, response).await),
            Ok(Ok(Err(error))) => {
                self.settle_failure(&attempt, &lease, slot, Ending::Rollback)
                    .await;
                count_request(&attempt.route, Outcome::Released, attempt.attempt);
                return Err(error);
            }
            Ok(Err(_panic)) => {
                tracing::error!(route = %attempt.route, "the handler panicked; its key is released");
                self.settle_failure(&attempt, &lease, slot, Ending::Rollback)
                    .await;
                (
                    Outcome::Released,
                    Rejection::HandlerFailed { key: attempt.key() },
                )
            }
            Err(_elapsed) => {
                let rolled_back = self.config.transactional;
                let ending = if rolled_back {
                    Ending::Rollback
                } else {
                    Ending::Abandon
                };
                tracing::warn!(route = %attempt.route, "the handler exceeded the maximum handler time");
                self.settle_failure(&attempt, &lease, slot, ending).await;
                let outcome = if rolled_back {
                    Outcome::Released
                } else {
                    Outcome::Abandoned
                };
                (
                    outcome,
                    Rejection::HandlerTimeout {
                        key: attempt.key(),
                        rolled_back,
                    },
                )
            }
        };
        count_request(&attempt.route, outcome.0, attempt.attempt);
        Ok(outcome.1.into_response())
    }

    /// Runs the handler up to the maximum handler time, renewing its lease
    /// every third of the lease once it has run that long (most handlers
    /// finish first, and cost one timer). `Err` when it was cut off.
    async fn supervise<F: Future>(
        &self,
        handler: F,
        lease: &Lease,
        route: &str,
    ) -> Result<F::Output, Elapsed> {
        let started = Instant::now();
        let max = self.config.max_handler_time;
        let first = (self.config.lease / 3).min(max);
        let mut handler = std::pin::pin!(handler);
        if let Ok(output) = tokio::time::timeout(first, &mut handler).await {
            return Ok(output);
        }
        let renewals = tokio::spawn(renew_periodically(
            self.store.clone(),
            lease.clone(),
            self.config.lease,
            self.config.store_timeout,
            route.to_owned(),
        ));
        let left = max.saturating_sub(started.elapsed());
        let output = tokio::time::timeout(left, &mut handler)
            .await
            .map_err(|_| Elapsed);
        renewals.abort();
        output
    }

    /// Stores (or releases) the handler's response, then hands it over.
    async fn finish<B>(
        &self,
        attempt: Attempt,
        lease: Lease,
        slot: Slot,
        response: Response<B>,
    ) -> Response<Body>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = response.into_parts();
        let no_store = crate::response::is_no_store(&parts.headers);
        if no_store || !(self.config.stored_statuses)(parts.status) {
            // Not an answer to keep: free the key so a retry may run. A
            // `no-store` success keeps its writes; failures roll them back.
            let ending = if no_store && parts.status.is_success() {
                Ending::Release
            } else {
                Ending::Rollback
            };
            self.settle_failure(&attempt, &lease, slot, ending).await;
            count_request(&attempt.route, Outcome::Released, attempt.attempt);
            return Response::from_parts(parts, Body::new(body));
        }
        let captured = match capture(Box::pin(body), self.config.stored_response_limit).await {
            Ok(captured) => captured,
            Err(error) => {
                tracing::error!(error = %error, route = %attempt.route, "the handler's response body failed");
                self.settle_failure(&attempt, &lease, slot, Ending::Rollback)
                    .await;
                count_request(&attempt.route, Outcome::Released, attempt.attempt);
                return Rejection::HandlerFailed { key: attempt.key() }.into_response();
            }
        };
        let (stored_body, sent_body) = match captured {
            Captured::Whole(bytes) => (Some(bytes.clone()), Body::from(bytes)),
            Captured::TooLarge { prefix, rest } => (None, crate::response::resume(prefix, rest)),
        };
        let stored = StoredResponse {
            status: parts.status,
            headers: headers_to_store(&parts.headers, &self.config.excluded_headers),
            body: stored_body,
        };
        match self.settle(&lease, slot, Ending::Complete(&stored)).await {
            Ok(()) => {}
            Err(SettleError {
                error,
                rolled_back: true,
            }) => {
                // The handler's writes did not commit: this answer must not
                // claim they did. A retry is safe either way.
                let (outcome, rejection) = if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&attempt.route, "complete");
                    let retry_after = self.config.policy.retry_after;
                    (
                        Outcome::InFlight,
                        Rejection::RequestInFlight {
                            key: attempt.key(),
                            retry_after,
                        },
                    )
                } else {
                    self.release_in_background(lease);
                    let retry_after = self.config.policy.retry_after;
                    (
                        Outcome::StoreUnavailable,
                        Rejection::StoreUnavailable {
                            key: Some(attempt.key()),
                            retry_after,
                        },
                    )
                };
                tracing::error!(error = %error, route = %attempt.route, "transactional completion failed; writes rolled back");
                count_request(&attempt.route, outcome, attempt.attempt);
                return rejection.into_response();
            }
            Err(SettleError {
                error,
                rolled_back: false,
            }) => {
                // The handler ran and its effects stand: this caller gets its
                // answer, though retries will not find it.
                if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&attempt.route, "complete");
                }
                tracing::error!(error = %error, route = %attempt.route, "the response could not be stored");
            }
        }
        self.store
            .events()
            .publish(&attempt.scope, attempt.key.as_str());
        count_request(&attempt.route, Outcome::Executed, attempt.attempt);
        Response::from_parts(parts, sent_body)
    }

    /// Settles a run that produced no answer to store, logging what fails
    /// (the record then lapses into abandoned, which is safe).
    async fn settle_failure(
        &self,
        attempt: &Attempt,
        lease: &Lease,
        slot: Slot,
        ending: Ending<'_>,
    ) {
        if let Err(SettleError { error, .. }) = self.settle(lease, slot, ending).await {
            if matches!(error, StoreError::LeaseLost) {
                count_lease_lost(&attempt.route, "release");
            }
            tracing::warn!(error = %error, route = %attempt.route, "could not settle the record after the handler");
        }
        self.store
            .events()
            .publish(&attempt.scope, attempt.key.as_str());
    }

    /// Writes the end of a run to the store: in the handler's transaction
    /// when it began one, else with the fenced store operations.
    async fn settle(
        &self,
        lease: &Lease,
        slot: Slot,
        ending: Ending<'_>,
    ) -> Result<(), SettleError> {
        #[cfg(feature = "postgres")]
        if let Some(slot) = slot {
            match slot.take() {
                Ok(Some(transaction)) => {
                    return self.settle_in_transaction(lease, transaction, ending).await;
                }
                Ok(None) => {}
                Err(crate::transaction::TxStillInUse) => {
                    // A leaked `Tx` keeps the transaction: it rolls back when
                    // dropped. Free the key so a retry runs.
                    tracing::error!(
                        "the handler kept its Tx after returning; its writes are rolled back"
                    );
                    return match self.timed("release", self.store.release(lease)).await {
                        Ok(()) => Err(SettleError {
                            error: StoreError::Unsupported("a Tx outliving its handler"),
                            rolled_back: true,
                        }),
                        Err(error) => Err(SettleError {
                            error,
                            rolled_back: true,
                        }),
                    };
                }
            }
        }
        #[cfg(not(feature = "postgres"))]
        let _: Slot = slot;
        let result = match ending {
            Ending::Complete(stored) => self.complete_with_retries(lease, stored).await,
            Ending::Release | Ending::Rollback => {
                self.timed("release", self.store.release(lease)).await
            }
            Ending::Abandon => {
                self.timed("renew", self.store.renew(lease, Duration::ZERO))
                    .await
            }
        };
        result.map_err(|error| SettleError {
            error,
            rolled_back: false,
        })
    }

    #[cfg(feature = "postgres")]
    async fn settle_in_transaction(
        &self,
        lease: &Lease,
        mut transaction: sqlx::Transaction<'static, sqlx::Postgres>,
        ending: Ending<'_>,
    ) -> Result<(), SettleError> {
        let rolled_back = |error| SettleError {
            error,
            rolled_back: true,
        };
        let Some(postgres) = self.store.transactions() else {
            return Err(rolled_back(StoreError::Unsupported("transactions")));
        };
        let written = match ending {
            Ending::Complete(stored) => {
                self.timed(
                    "complete",
                    postgres.complete_in(&mut transaction, lease, stored),
                )
                .await
            }
            Ending::Release => {
                self.timed("release", postgres.release_in(&mut transaction, lease))
                    .await
            }
            Ending::Rollback | Ending::Abandon => {
                // Roll the writes back, then free the key: nothing ran.
                let _ = transaction.rollback().await;
                return self
                    .timed("release", self.store.release(lease))
                    .await
                    .map_err(rolled_back);
            }
        };
        if let Err(error) = written {
            let _ = transaction.rollback().await;
            return Err(rolled_back(error));
        }
        let commit = async { transaction.commit().await.map_err(StoreError::from) };
        self.timed("commit", commit).await.map_err(rolled_back)
    }

    /// Completes the record, trying again on transient failures: a response
    /// that is not stored turns into an unknown outcome for every retry.
    async fn complete_with_retries(
        &self,
        lease: &Lease,
        stored: &StoredResponse,
    ) -> Result<(), StoreError> {
        let mut pause = Duration::from_millis(50);
        for _ in 0..2 {
            match self
                .timed("complete", self.store.complete(lease, stored))
                .await
            {
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                other => return other,
            }
        }
        self.timed("complete", self.store.complete(lease, stored))
            .await
    }

    #[cfg(feature = "postgres")]
    fn open_slot(&self, request: &mut Request<Body>) -> Slot {
        if !self.config.transactional {
            return None;
        }
        let postgres = self.store.transactions()?;
        let slot = crate::transaction::TransactionSlot::new(postgres.pool().clone());
        request.extensions_mut().insert(slot.clone());
        Some(slot)
    }

    #[cfg(not(feature = "postgres"))]
    fn open_slot(&self, _request: &mut Request<Body>) -> Slot {
        None
    }

    /// Frees a lease from a task of its own, ignoring the result.
    ///
    /// A write that timed out may still land in the store later (a claim
    /// queued behind a lock, say). So the release is tried again, every
    /// quarter second, for twice the store timeout: a late claim is freed
    /// rather than left to lapse into "outcome unknown" although nothing
    /// ran. The token is this request's own, so nothing else is touched.
    fn release_in_background(&self, lease: Lease) {
        let store = self.store.clone();
        let timeout = self.config.store_timeout;
        tokio::spawn(async move {
            let attempts = (2 * timeout.as_millis() / 250).max(4);
            for _ in 0..attempts {
                if let Ok(Ok(())) = tokio::time::timeout(timeout, store.release(&lease)).await {
                    store.events().publish(&lease.scope, &lease.key);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    /// Runs a store operation under the store timeout and records its latency.
    async fn timed<T>(
        &self,
        operation: &'static str,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        timed(operation, self.config.store_timeout, future).await
    }
}

async fn timed<T>(
    operation: &'static str,
    timeout: Duration,
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(timeout, future)
        .await
        .unwrap_or(Err(StoreError::Timeout(timeout)));
    observe_store(
        operation,
        started,
        !matches!(
            result,
            Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
        ),
    );
    result
}

/// The handler ran past the maximum handler time.
struct Elapsed;

/// Renews the lease at once, then every third of its length, until
/// aborted or lost.
async fn renew_periodically<S: Store>(
    store: S,
    lease: Lease,
    length: Duration,
    timeout: Duration,
    route: String,
) {
    let period = length / 3;
    loop {
        match timed("renew", timeout, store.renew(&lease, length)).await {
            Ok(()) => {}
            Err(StoreError::LeaseLost) => {
                count_lease_lost(&route, "renew");
                tracing::error!(route = %route, key = %lease.key, "lease lost while the handler runs; its completion will be refused");
                return;
            }
            Err(error) => {
                tracing::warn!(error = %error, route = %route, "lease renewal failed; will try again")
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// Reads a request body up to `limit` bytes: a `Content-Length` over the
/// limit is refused before any byte is read.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, Rejection> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(Rejection::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Rejection::BodyTooLarge { limit }),
        Err(_) => Err(Rejection::BodyUnreadable),
    }
}
