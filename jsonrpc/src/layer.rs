//! [`JsonRpcLayer`]: the builder (its settings and their defaults are in
//! [`crate::config`]) and the tower layer that makes a [`JsonRpcService`].

use std::sync::Arc;

use http::request::Parts;
use idempotency_guard::adapter::BodyBudget;
use idempotency_guard::{Engine, Store};

use crate::config::{Config, MissingKey};
use crate::envelope::{KeySource, MESSAGE_SEND};
use crate::service::JsonRpcService;

/// A tower layer that guards JSON-RPC 2.0 calls over HTTP POST: the MCP
/// tools and the methods it is given run at most once per key.
///
/// ```no_run
/// use idempotency_guard::{Engine, store::sqlite::SqliteStore};
/// use idempotency_jsonrpc::JsonRpcLayer;
///
/// # async fn f() -> anyhow::Result<()> {
/// let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
/// store.migrate().await?;
/// let layer = JsonRpcLayer::new(Engine::new(store))
///     .with_tool("send_email")
///     .with_a2a_message_send()
///     .with_scope(|parts| {
///         // The principal your authentication middleware put there.
///         parts.extensions.get::<String>().cloned().unwrap_or_default()
///     });
/// # let _ = layer; Ok(()) }
/// ```
pub struct JsonRpcLayer<S> {
    engine: Engine<S>,
    config: Config,
}

impl<S: Clone> Clone for JsonRpcLayer<S> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S> std::fmt::Debug for JsonRpcLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonRpcLayer")
            .field("tools", &self.config.guarded.tools)
            .field("methods", &self.config.guarded.methods)
            .field("key_sources", &self.config.key_sources)
            .field("missing_key", &self.config.missing_key)
            .finish_non_exhaustive()
    }
}

impl<S: Store> JsonRpcLayer<S> {
    /// A layer over an engine (its lease, retention, failure mode and
    /// in-flight policy apply), guarding nothing until tools or methods are
    /// named.
    pub fn new(engine: Engine<S>) -> Self {
        Self {
            engine,
            config: Config::default(),
        }
    }

    /// The engine the layer runs calls through (for its [`idempotency_guard::Drain`]).
    pub fn engine(&self) -> &Engine<S> {
        &self.engine
    }

    /// Guards the MCP tool `name` (`tools/call` with `params.name` =
    /// `name`). Tools not named (read-only ones) pass through, never stored.
    ///
    /// The default value is no tool.
    pub fn with_tool(mut self, name: impl Into<String>) -> Self {
        self.config.guarded.tools.insert(name.into());
        self
    }

    /// Guards every call of the JSON-RPC method `name` (other than
    /// `tools/call`, which is guarded per tool).
    ///
    /// The default value is no method.
    pub fn with_method(mut self, name: impl Into<String>) -> Self {
        self.config.guarded.methods.insert(name.into());
        self
    }

    /// Guards A2A's `message/send` (keyed, by default, on
    /// `params.message.messageId` when no earlier source has a key).
    pub fn with_a2a_message_send(self) -> Self {
        self.with_method(MESSAGE_SEND)
    }

    /// Sets where keys come from, in order: the first source holding one
    /// wins (a present but invalid key is refused, not skipped).
    ///
    /// The default value is [`KeySource::defaults`]: the `Idempotency-Key`
    /// header, `params._meta.idempotencyKey`, the tool arguments
    /// `idempotency_key` and `requestKey`, A2A's `params.message.messageId`.
    ///
    /// ```
    /// use idempotency_jsonrpc::{JsonRpcLayer, KeySource};
    /// # fn f(engine: idempotency_guard::Engine<idempotency_guard::store::sqlite::SqliteStore>) {
    /// let layer = JsonRpcLayer::new(engine)
    ///     .with_key_sources([KeySource::Header, KeySource::Meta("requestId".into())]);
    /// # }
    /// ```
    pub fn with_key_sources(mut self, sources: impl IntoIterator<Item = KeySource>) -> Self {
        self.config.key_sources = sources.into_iter().collect();
        self
    }

    /// Sets what a guarded call without a key gets.
    ///
    /// The default value is [`MissingKey::Refuse`].
    pub fn with_missing_key(mut self, policy: MissingKey) -> Self {
        self.config.missing_key = policy;
        self
    }

    /// Sets the function that names a request's scope: its authenticated
    /// principal (the subject of the `Authorization` bearer, as your
    /// authentication middleware established it). A scope must be 1 to 255
    /// bytes; others are refused with `scope-invalid`.
    ///
    /// Not the `Mcp-Session-Id`: a client that lost its connection
    /// reconnects, initializes a new session and retries there; keyed by
    /// session, its retry would run the tool again.
    ///
    /// The default value is one fixed scope, `default`.
    ///
    /// # Warning
    ///
    /// Derive the scope from something the client cannot forge: a client
    /// that can name another scope can read that scope's stored results.
    pub fn with_scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config.scope = Arc::new(scope);
        self
    }

    /// Sets the largest request body read; a larger one is refused with 413
    /// `body-too-large` (problem+json) before the envelope is parsed.
    ///
    /// The default value is 1 MiB.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.config.body_limit = bytes;
        self
    }

    /// Sets the budget of request bodies buffered at once, which other
    /// layers (the axum layer's routes) may share: past it a POST is
    /// refused with 503 `body-buffer-full` (problem+json, `Retry-After`)
    /// before its envelope is read. See
    /// `IdempotencyLayer::with_max_buffered_bytes`.
    ///
    /// The default value is no budget.
    ///
    /// ```
    /// # use idempotency_jsonrpc::JsonRpcLayer;
    /// # fn f(engine: idempotency_guard::Engine<idempotency_guard::store::sqlite::SqliteStore>) {
    /// use idempotency_guard::adapter::BodyBudget;
    /// let layer = JsonRpcLayer::new(engine)
    ///     .with_tool("send_email")
    ///     .with_body_budget(BodyBudget::new(64 * 1024 * 1024));
    /// # }
    /// ```
    pub fn with_body_budget(mut self, budget: BodyBudget) -> Self {
        self.config.body_budget = Some(budget);
        self
    }

    /// Sets the largest answer kept for replay (a JSON body, or an event
    /// stream up to its final response). A larger answer reaches the first
    /// caller; its key is then abandoned (`outcome-unknown`), never run again.
    ///
    /// The default value is 1 MiB.
    pub fn with_stored_response_limit(mut self, bytes: usize) -> Self {
        self.config.stored_response_limit = bytes;
        self
    }
}

impl<S: Clone, I> tower::Layer<I> for JsonRpcLayer<S> {
    type Service = JsonRpcService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        JsonRpcService::new(inner, self.engine.clone(), Arc::new(self.config.clone()))
    }
}
