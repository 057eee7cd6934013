//! [`IdempotencyLayer`]: the engine as a tower layer for axum routes.
//!
//! The layer is a thin adapter. For a guarded request it reads the key,
//! the scope and the body (bounded), computes the fingerprint, and hands the
//! engine a [`Job`](crate::engine::Job) and the work: call the route, then
//! capture its response for storage. The engine's [`Answer`](crate::engine::Answer)
//! becomes the response: the route's own, a replay, or a problem+json
//! rejection. See `layer/service.rs` for the request path and [`crate::engine`] for
//! what happens to the record.
//!
//! # What is stored, what releases the key
//!
//! | the route answered | stored | key |
//! |---|---|---|
//! | a status below 500 but 408, 425, 429 (configurable) | yes | completed |
//! | 400, 413, 415 or 422 not marked [`FinalResponse`] (an extractor rejected the request before the handler started: Stripe's rule) | no | released: the corrected request runs |
//! | 400, 413, 415 or 422 with [`FinalResponse`] in its extensions (the handler decided it) | yes | completed |
//! | 5xx, 408, 425, 429, `Cache-Control: no-store`, a panic, a broken body | no | released |
//! | anything carrying [`OutcomeUnknown`] in its extensions | no | abandoned (released in transactional mode when the run began its transaction) |
//! | nothing before the maximum handler time | no | abandoned (released in transactional mode when the run began its transaction) |

mod budget;
mod service;
#[cfg(feature = "postgres")]
mod tx;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, header, request::Parts};
use tower::Layer;

pub use budget::{BodyBudget, BodyReadError, BodyReservation, read_body};
pub use service::{IdempotencyService, ResponseFuture};

use crate::decision::{AbandonedPolicy, InFlightPolicy};
use crate::engine::{Drain, Engine, FailureMode};
use crate::replay::ReplayPolicy;
use crate::response::default_stored_status;
use crate::store::Store;

/// The longest scope accepted, in bytes (the rule is [`Scope`](crate::Scope)'s).
pub use crate::key::MAX_SCOPE_LEN;

/// Marks a client-error response (400, 413, 415, 422) that the handler
/// decided on after starting its work, so the guard stores it like any
/// other answer. Without it such a response is taken for an extractor's
/// rejection (nothing ran) and releases the key, as Stripe does: the
/// corrected request with the same key then runs.
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use idempotency_guard::layer::FinalResponse;
///
/// async fn create_payment() -> impl IntoResponse {
///     // ... the card was declined: that is the answer, keep it.
///     (StatusCode::UNPROCESSABLE_ENTITY, FinalResponse, "card declined")
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinalResponse;

impl axum::response::IntoResponseParts for FinalResponse {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}

/// Marks a response whose outcome the handler does not know: it handed the
/// request on and lost track of it (an upstream reset the connection after
/// receiving the request, or timed out). The guard sends the response, but
/// stores nothing and ends the lease: the key is abandoned, later requests
/// get 409 `outcome-unknown` and the status service says `reconcile`, so
/// nothing runs twice blindly. (The gateway marks its 502/504 answers so.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeUnknown;

impl axum::response::IntoResponseParts for OutcomeUnknown {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}

/// The statuses an extractor rejection answers with (malformed, too large,
/// wrongly typed or invalid body): released unless marked [`FinalResponse`].
pub(crate) fn is_rejection_before_work(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 413 | 415 | 422)
}

/// The function that names the scope of a request.
type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The layer's own settings (the engine holds the rest). Each default says
/// why it is the default.
#[derive(Clone)]
pub(crate) struct Config {
    /// POST and PATCH: the methods that are not idempotent by definition.
    pub(crate) methods: Vec<Method>,
    /// Required: a write without a key cannot be made safe to retry.
    pub(crate) key_required: bool,
    /// One fixed scope, `default`: apps without tenants need nothing more.
    pub(crate) scope: ScopeFn,
    /// 1 MiB: the body is buffered to fingerprint it, so it must be bounded.
    pub(crate) body_limit: usize,
    /// 1 MiB: stored responses live in the store for the whole retention.
    pub(crate) stored_response_limit: usize,
    /// None: each body is bounded by `body_limit`, and an app bounds its
    /// connections; a proxy that takes bodies from anyone sets one.
    pub(crate) body_budget: Option<BodyBudget>,
    /// Below 500, except 408, 425 and 429 (see [`default_stored_status`]).
    pub(crate) stored_statuses: fn(StatusCode) -> bool,
    /// 409, as Stripe answers; the IETF draft suggests 422.
    pub(crate) mismatch_status: StatusCode,
    /// `Date` (stale on replay) and `Set-Cookie` (a session is not a result).
    pub(crate) excluded_headers: Vec<HeaderName>,
    /// Everything is stored and replayed (see [`ReplayPolicy`]).
    pub(crate) replay: ReplayPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            scope: Arc::new(|_| String::from("default")),
            body_limit: 1024 * 1024,
            stored_response_limit: 1024 * 1024,
            body_budget: None,
            stored_statuses: default_stored_status,
            mismatch_status: StatusCode::CONFLICT,
            excluded_headers: vec![header::DATE, header::SET_COOKIE],
            replay: ReplayPolicy::new(),
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
    engine: Engine<S>,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("engine", &self.engine)
            .field("methods", &self.config.methods)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayer<S> {
    /// Creates the layer over a store, with every setting at its default.
    pub fn new(store: S) -> Self {
        Self::with_engine(Engine::new(store))
    }

    /// Creates the layer over an engine configured beforehand (shared with
    /// other adapters, say).
    pub fn with_engine(engine: Engine<S>) -> Self {
        Self {
            engine,
            config: Arc::new(Config::default()),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    fn engine_mut(&mut self, change: impl FnOnce(Engine<S>) -> Engine<S>) -> &mut Self {
        self.engine = change(self.engine.clone());
        self
    }

    /// The store the layer keeps records in.
    pub fn store(&self) -> &S {
        self.engine.store()
    }

    /// The engine the layer runs requests through.
    pub fn engine(&self) -> &Engine<S> {
        &self.engine
    }

    /// A handle that waits, on shutdown, for every guarded request still
    /// running (their clients may be gone): see [`Drain`].
    pub fn drain(&self) -> Drain {
        self.engine.drain()
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

    /// Sets the most bytes of guarded request bodies this layer buffers at
    /// once, over all its requests: a body that declares a `Content-Length`
    /// reserves it before any byte is read, a chunked one as it arrives,
    /// until the guard answers. Past it the answer is 503
    /// `body-buffer-full` with `Retry-After`, and nothing runs. (A body
    /// larger than the whole budget is always refused so: keep it at least
    /// the body limit.) To share one budget between layers, use
    /// [`IdempotencyLayer::with_body_budget`].
    ///
    /// The default value is no budget: each body is bounded by
    /// [`IdempotencyLayer::with_body_limit`] alone.
    ///
    /// ```
    /// # use idempotency_guard::{IdempotencyLayer, store::AnyStore};
    /// # fn f(store: AnyStore) -> IdempotencyLayer<AnyStore> {
    /// // 64 bodies of the default 1 MiB limit at once.
    /// IdempotencyLayer::new(store).with_max_buffered_bytes(64 * 1024 * 1024)
    /// # }
    /// ```
    pub fn with_max_buffered_bytes(self, bytes: usize) -> Self {
        self.with_body_budget(BodyBudget::new(bytes))
    }

    /// Sets the budget of buffered request bodies to `budget`, which other
    /// layers may share (one budget for every route of a process); see
    /// [`IdempotencyLayer::with_max_buffered_bytes`].
    ///
    /// The default value is no budget.
    ///
    /// ```
    /// # use idempotency_guard::{IdempotencyLayer, store::AnyStore};
    /// # fn f(store: AnyStore) -> (IdempotencyLayer<AnyStore>, IdempotencyLayer<AnyStore>) {
    /// use idempotency_guard::layer::BodyBudget;
    /// let budget = BodyBudget::new(64 * 1024 * 1024);
    /// let payments = IdempotencyLayer::new(store.clone()).with_body_budget(budget.clone());
    /// let refunds = IdempotencyLayer::new(store).with_body_budget(budget);
    /// # (payments, refunds) }
    /// ```
    pub fn with_body_budget(mut self, budget: BodyBudget) -> Self {
        self.config_mut().body_budget = Some(budget);
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
    /// stored releases its key, so a retry runs the handler again. (400,
    /// 413, 415 and 422 are stored only when marked [`FinalResponse`].)
    ///
    /// The default value is [`default_stored_status`]: below 500, except
    /// 408, 425 and 429.
    pub fn with_stored_statuses(mut self, rule: fn(StatusCode) -> bool) -> Self {
        self.config_mut().stored_statuses = rule;
        self
    }

    /// Sets the lease a request holds on its key while the handler runs and
    /// its response is captured. The guard renews it every third of its
    /// length, so a live handler never loses it and a crashed process's
    /// keys free up within one lease.
    ///
    /// The default value is 60 seconds.
    ///
    /// # Panics
    ///
    /// When `lease` is under one second.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.engine_mut(|engine| engine.with_lease(lease));
        self
    }

    /// Sets the longest a handler may run, its response body included; past
    /// it the guard cuts it off and answers 504 `handler-timeout`. The key
    /// becomes abandoned (in transactional mode, when the handler began its
    /// transaction, it is released: its writes were rolled back).
    ///
    /// The default value is 10 minutes.
    pub fn with_max_handler_time(mut self, max: Duration) -> Self {
        self.engine_mut(|engine| engine.with_max_handler_time(max));
        self
    }

    /// Sets how long a record lives after its key was first claimed; then it
    /// is purged and the key may be used again.
    ///
    /// The default value is 24 hours.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.engine_mut(|engine| engine.with_retention(retention));
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
        self.engine_mut(|engine| engine.with_in_flight(policy));
        self
    }

    /// Sets the `Retry-After` hint of `request-in-flight` and
    /// `store-unavailable` answers (never beyond the remaining lease).
    ///
    /// The default value is 1 second.
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        self.engine_mut(|engine| engine.with_retry_after(hint));
        self
    }

    /// Sets what a request does when its key's earlier run was abandoned.
    ///
    /// The default value is [`AbandonedPolicy::Reject`].
    pub fn with_abandoned(mut self, policy: AbandonedPolicy) -> Self {
        self.engine_mut(|engine| engine.with_abandoned(policy));
        self
    }

    /// Sets what happens when the store fails.
    ///
    /// The default value is [`FailureMode::Closed`].
    pub fn with_failure_mode(mut self, mode: FailureMode) -> Self {
        self.engine_mut(|engine| engine.with_failure_mode(mode));
        self
    }

    /// Sets how long one store operation may take before the guard treats
    /// the store as unavailable.
    ///
    /// The default value is 5 seconds.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.engine_mut(|engine| engine.with_store_timeout(timeout));
        self
    }

    /// Keeps completed responses in this process, up to `capacity` bytes and
    /// at most `max_age` each, so replays cost no store round trip; see
    /// [`Engine::with_replay_cache`].
    ///
    /// The default value is no cache.
    pub fn with_replay_cache(mut self, capacity: usize, max_age: Duration) -> Self {
        self.engine_mut(|engine| engine.with_replay_cache(capacity, max_age));
        self
    }

    /// Sets what of a response is stored and replayed: everything (the
    /// default), the status only (for routes that mint secrets: a replay
    /// answers the status with a `response-not-replayable` problem), a header
    /// allow-list, or a body with JSON fields redacted. See [`ReplayPolicy`].
    ///
    /// The default value is [`ReplayPolicy::new`]: everything.
    pub fn with_replay_policy(mut self, policy: ReplayPolicy) -> Self {
        self.config_mut().replay = policy;
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
}

#[cfg(feature = "postgres")]
impl<S: crate::store::TransactionalStore> IdempotencyLayer<S> {
    /// Turns transactional mode on or off: handlers write through a
    /// [`Tx`](crate::Tx), and the guard commits their writes together with
    /// the stored response, so a crash or timeout leaves nothing behind. A
    /// handler that never takes its `Tx` is guarded as in default mode.
    ///
    /// The default value is `false`.
    ///
    /// # Panics
    ///
    /// When turned on over a store without PostgreSQL.
    pub fn with_transactional_mode(mut self, on: bool) -> Self {
        self.engine_mut(|engine| engine.with_transactional_mode(on));
        self
    }

    /// Single-commit transactional mode (with transactional mode on): the
    /// key is held by a PostgreSQL advisory lock in the handler's
    /// transaction, and the claim, the handler's writes and the stored
    /// response commit once, together. Faster than transactional mode's
    /// two commits, and a crash leaves nothing to take over. See
    /// [`Engine::with_single_commit`](crate::engine::Engine::with_single_commit).
    ///
    /// The default value is `false`.
    ///
    /// # Warning
    ///
    /// A handler that dies (crash, timeout) committed nothing, so the retry
    /// runs it again: an effect outside its [`Tx`](crate::Tx) (an email, a
    /// call to another service) is then repeated.
    pub fn with_single_commit(mut self, on: bool) -> Self {
        self.engine_mut(|engine| engine.with_single_commit(on));
        self
    }
}

impl<S: Store, I> Layer<I> for IdempotencyLayer<S> {
    type Service = IdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        self.engine.check();
        IdempotencyService::new(inner, self.engine.clone(), Arc::clone(&self.config))
    }
}
