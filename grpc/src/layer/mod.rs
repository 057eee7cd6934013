//! [`GrpcIdempotencyLayer`]: the guard as a tower layer for tonic servers.
//!
//! ```no_run
//! use idempotency_grpc::GrpcIdempotencyLayer;
//! use idempotency_guard::{Engine, store::sqlite::SqliteStore};
//!
//! # async fn f() -> anyhow::Result<()> {
//! let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
//! store.migrate().await?;
//! let layer = GrpcIdempotencyLayer::new(Engine::new(store))
//!     .with_methods(["/payments.v1.Payments/CreatePayment"])
//!     .with_scope(|metadata, _extensions| {
//!         metadata
//!             .get("x-tenant")
//!             .and_then(|v| v.to_str().ok())
//!             .unwrap_or("default")
//!             .to_owned()
//!     });
//! // tonic::transport::Server::builder().layer(layer).add_service(...)
//! # let _ = layer; Ok(()) }
//! ```
//!
//! What the layer does with one call:
//!
//! 1. It names the call's scope (the [`with_scope`](GrpcIdempotencyLayer::with_scope)
//!    function, over its metadata and extensions) and puts it in the
//!    request's extensions as a [`CallScope`], for every call (typed
//!    handlers using [`crate::run`] read it there).
//! 2. A method it does not guard (any streaming method, any method not
//!    named) passes through untouched.
//! 3. For a guarded method it reads the key from the metadata entry
//!    (`idempotency-key` by default), reads the request message whole (up
//!    to the request limit), and runs the method through the engine: at
//!    most once per `(scope, key)`. The handler's answer is read whole and
//!    classified by [`crate::outcome::settle`]: stored (then every later call
//!    with the key gets it replayed byte for byte, marked
//!    `idempotent-replayed: true`) or released.
//! 4. Every guarded call is counted once in `idempotency_requests_total`
//!    (`route` = the full method name).
//!
//! A client whose deadline passes while the method runs does not cancel
//! it: the engine lets the run finish and stores its answer, and the
//! client's retry gets the replay.

mod service;

use std::collections::HashSet;
use std::sync::Arc;

use http::{Extensions, HeaderName};
use idempotency_guard::Engine;
use tonic::metadata::MetadataMap;

pub use service::{GrpcIdempotencyService, ResponseFuture};

/// The metadata entry that carries the key by default.
pub const IDEMPOTENCY_KEY_METADATA: &str = "idempotency-key";

/// The function that names a call's scope.
type ScopeFn = Arc<dyn Fn(&MetadataMap, &Extensions) -> String + Send + Sync>;

/// The scope of a call, and its full method name, as the layer put them in
/// the request's extensions (a typed handler reads them through
/// `tonic::Request::extensions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallScope {
    scope: String,
    method: String,
}

impl CallScope {
    /// A call in `scope` to `method` (`/pkg.Service/Method`), for code that
    /// puts it in a request's extensions without the layer (tests,
    /// another interceptor).
    pub fn new(scope: impl Into<String>, method: impl Into<String>) -> Self {
        Self {
            scope: scope.into(),
            method: method.into(),
        }
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The full method name.
    pub fn method(&self) -> &str {
        &self.method
    }
}

/// The layer's own settings (the engine holds the rest). Each default says
/// why it is the default.
#[derive(Clone)]
pub(crate) struct Config {
    /// None: which unary methods write is the app's knowledge.
    pub(crate) methods: HashSet<Box<str>>,
    /// `idempotency-key`, as Yandex Cloud and Nebius name it.
    pub(crate) key: HeaderName,
    /// One fixed scope, `default`: apps without tenants need nothing more.
    pub(crate) scope: ScopeFn,
    /// 4 MiB, tonic's own default for a decoded message: the message is
    /// buffered to fingerprint it, so it must be bounded.
    pub(crate) request_limit: usize,
    /// 1 MiB, as the HTTP guard: stored answers live for the whole retention.
    pub(crate) stored_response_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: HashSet::new(),
            key: HeaderName::from_static(IDEMPOTENCY_KEY_METADATA),
            scope: Arc::new(|_, _| String::from("default")),
            request_limit: 4 * 1024 * 1024,
            stored_response_limit: 1024 * 1024,
        }
    }
}

/// The idempotency guard, as a tower layer for tonic servers
/// (`tonic::transport::Server::builder().layer(...)`).
///
/// Every setting has a safe default; see each `with_*` method. The
/// engine's own settings (lease, retention, waiting for an in-flight call
/// instead of refusing it, failure mode) are set on the [`Engine`].
pub struct GrpcIdempotencyLayer<S> {
    engine: Engine<S>,
    config: Arc<Config>,
}

impl<S: Clone> Clone for GrpcIdempotencyLayer<S> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S> std::fmt::Debug for GrpcIdempotencyLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyLayer")
            .field("methods", &self.config.methods)
            .field("key", &self.config.key)
            .finish_non_exhaustive()
    }
}

impl<S> GrpcIdempotencyLayer<S> {
    /// A layer over `engine` that guards no method yet (see
    /// [`with_methods`](Self::with_methods)).
    pub fn new(engine: Engine<S>) -> Self {
        Self {
            engine,
            config: Arc::new(Config::default()),
        }
    }

    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Adds unary methods to guard, by full name (`/pkg.Service/Method`).
    /// Only unary methods may be named: a streaming method's messages are
    /// not one request and one answer (name one and its calls are refused
    /// or broken).
    ///
    /// The default value is no method.
    ///
    /// ```
    /// # use idempotency_grpc::GrpcIdempotencyLayer;
    /// # fn f<S>(layer: GrpcIdempotencyLayer<S>) -> GrpcIdempotencyLayer<S> {
    /// layer.with_methods(["/payments.v1.Payments/CreatePayment"])
    /// # }
    /// ```
    pub fn with_methods<I, M>(mut self, methods: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: Into<String>,
    {
        let config = self.config_mut();
        config
            .methods
            .extend(methods.into_iter().map(|m| m.into().into_boxed_str()));
        self
    }

    /// Sets the metadata entry the key is read from.
    ///
    /// The default value is `idempotency-key`.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid ASCII metadata name (lowercase letters,
    /// digits, `-`, `_`, `.`), or names a binary entry (`-bin`).
    pub fn with_key_metadata(mut self, name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .ok()
            .filter(|n| !n.as_str().ends_with("-bin"))
            .unwrap_or_else(|| panic!("{name:?} is not an ASCII metadata name"));
        self.config_mut().key = name;
        self
    }

    /// Sets the function that names a call's scope from its metadata and
    /// extensions (an authenticated principal an earlier layer put there).
    /// An empty scope or one over 255 bytes is refused with
    /// `INVALID_ARGUMENT` `scope-invalid`.
    ///
    /// The default value is one fixed scope, `default`.
    ///
    /// # Warning
    ///
    /// Two callers in one scope share its keys: a scope taken from
    /// metadata the client chooses freely lets one client read another's
    /// stored answers by guessing its keys.
    ///
    /// ```
    /// # use idempotency_grpc::GrpcIdempotencyLayer;
    /// # #[derive(Clone)] struct Principal(String);
    /// # fn f<S>(layer: GrpcIdempotencyLayer<S>) -> GrpcIdempotencyLayer<S> {
    /// layer.with_scope(|_metadata, extensions| {
    ///     extensions
    ///         .get::<Principal>()
    ///         .map(|principal| principal.0.clone())
    ///         .unwrap_or_default() // empty: refused
    /// })
    /// # }
    /// ```
    pub fn with_scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&MetadataMap, &Extensions) -> String + Send + Sync + 'static,
    {
        self.config_mut().scope = Arc::new(scope);
        self
    }

    /// Sets the largest request message (body bytes) a guarded method
    /// accepts; a larger one is refused with `RESOURCE_EXHAUSTED`
    /// `body-too-large` before the method runs.
    ///
    /// The default value is 4 MiB.
    pub fn with_request_limit(mut self, bytes: usize) -> Self {
        self.config_mut().request_limit = bytes;
        self
    }

    /// Sets the largest answer kept for replay. A larger answer is still
    /// sent to the first caller; later calls with its key get
    /// `FAILED_PRECONDITION` `response-not-stored`, never a second run.
    ///
    /// The default value is 1 MiB.
    pub fn with_stored_response_limit(mut self, bytes: usize) -> Self {
        self.config_mut().stored_response_limit = bytes;
        self
    }

    /// The engine the layer runs guarded calls through (for its drain
    /// handle, or for typed handlers that call [`crate::run`]).
    pub fn engine(&self) -> &Engine<S> {
        &self.engine
    }
}

impl<S: Clone, I> tower::Layer<I> for GrpcIdempotencyLayer<S> {
    type Service = GrpcIdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        GrpcIdempotencyService::new(inner, self.engine.clone(), Arc::clone(&self.config))
    }
}
