//! [`IdempotencyLayer`]: the guard's settings and the tower [`Layer`] that
//! wraps a route in an [`IdempotencyService`].
//!
//! The layer holds an [`Engine`] and its own settings ([`Config`](super::config::Config): what is
//! guarded, how bodies are bounded, what is stored and replayed). Its
//! engine builders (`with_lease`, `with_retention`, ...) are not written
//! here: `forward_to_engine!` expands the engine's own list of builders
//! (`engine_settings!`, `transactional_settings!`) into forwarders with the
//! engine's docs and signatures, so a new engine setting costs one edit, in
//! the engine, and the layer has it too.

use std::sync::Arc;

use http::{HeaderName, Method, StatusCode, request::Parts};
use tower::Layer;

use super::config::Config;
use super::service::IdempotencyService;
use crate::adapter::BodyBudget;
use crate::engine::{Drain, Engine};
use crate::replay::ReplayPolicy;
use crate::store::Store;

/// Makes each builder of an engine settings list (`engine_settings!`,
/// `transactional_settings!`) a method of the layer with the same name,
/// docs and arguments, that sets it on the layer's engine.
macro_rules! forward_to_engine {
    ($(
        $(#[$meta:meta])*
        pub fn $name:ident(mut self $(, $arg:ident: $ty:ty)* $(,)?) -> Self $body:block
    )*) => {
        $(
            $(#[$meta])*
            pub fn $name(mut self $(, $arg: $ty)*) -> Self {
                self.engine = self.engine.$name($($arg),*);
                self
            }
        )*
    };
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

    crate::engine::engine_settings!(forward_to_engine);

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
    /// A scope must be 1 to 255 bytes without a control character; others are refused with 400
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
        self.config_mut().scope = Some(Arc::new(scope));
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
    /// use idempotency_guard::adapter::BodyBudget;
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
    /// 413, 415 and 422 are stored only when marked [`FinalResponse`](super::FinalResponse).)
    ///
    /// The default value is [`default_stored_status`](crate::response::default_stored_status): below 500, except
    /// 408, 425 and 429.
    pub fn with_stored_statuses(mut self, rule: fn(StatusCode) -> bool) -> Self {
        self.config_mut().stored_statuses = rule;
        self
    }

    /// Sets the status of `key-reused` answers.
    ///
    /// The default value is 409 Conflict; 422 is what the IETF draft suggests.
    pub fn with_mismatch_status(mut self, status: StatusCode) -> Self {
        self.config_mut().mismatch_status = status;
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

    /// Keeps each request with its claim (method, path and query, the
    /// `Idempotency-Key` and `Content-Type` headers and those named here,
    /// and the body, which the body limit bounds; sealed when the store
    /// is an encrypted one), so that a
    /// [`Completer`](crate::engine::Completer) can finish a run abandoned
    /// mid-way without waiting for its client. Off by default; for routes
    /// that resume ([`AbandonedPolicy::Resume`](crate::AbandonedPolicy::Resume)).
    /// Name the headers the route (and the scope function) reads: the
    /// completer sends only those. Costs one store write per request,
    /// before the handler runs.
    pub fn with_stored_request(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config_mut().stored_request = Some(headers.into_iter().collect());
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
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl<S: crate::store::TransactionalStore> IdempotencyLayer<S> {
    crate::engine::transactional_settings!(forward_to_engine);
}

impl<S: Store, I> Layer<I> for IdempotencyLayer<S> {
    type Service = IdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        self.engine.check();
        IdempotencyService::new(inner, self.engine.clone(), Arc::clone(&self.config))
    }
}
