//! The layer's settings ([`Config`]) and their defaults, shared by the
//! builder ([`crate::JsonRpcLayer`]) and the services it makes, and
//! [`MissingKey`], the one setting that is a public type.

use std::sync::Arc;

use http::request::Parts;
use idempotency_guard::adapter::BodyBudget;

use crate::envelope::{Guarded, KeySource};
use crate::running::Running;

/// What the layer does with a guarded call that carries no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Refuse it with the JSON-RPC error `key-missing` (-32094); the tool
    /// does not run. The default: a write tool without a key cannot be
    /// retried safely, and the agent should learn that at once.
    #[default]
    Refuse,
    /// Let it through unguarded, as if the tool were not named.
    ///
    /// # Warning
    ///
    /// A retried call without a key runs again: for clients that cannot
    /// send keys yet, during a migration.
    PassThrough,
}

/// The function that names the scope of a request.
pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// The layer's settings. Each default says why it is the default.
#[derive(Clone)]
pub(crate) struct Config {
    /// None: the app names its write tools; everything else passes.
    pub(crate) guarded: Guarded,
    /// [`KeySource::defaults`]: the header first (set by the transport),
    /// then the places agents put keys today.
    pub(crate) key_sources: Vec<KeySource>,
    /// Refuse: fail closed.
    pub(crate) missing_key: MissingKey,
    /// One fixed scope, `default`, as the axum layer: apps put their
    /// authenticated principal here.
    pub(crate) scope: ScopeFn,
    /// 1 MiB, as the axum layer: tool arguments are small.
    pub(crate) body_limit: usize,
    /// None, as the axum layer: each body is bounded by `body_limit`.
    pub(crate) body_budget: Option<BodyBudget>,
    /// 1 MiB, as the axum layer: a larger answer (or event stream up to the
    /// final response) reaches the first caller only.
    pub(crate) stored_response_limit: usize,
    /// The guarded calls running now (not a setting: shared by every
    /// service the layer makes).
    pub(crate) running: Running,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            guarded: Guarded::default(),
            key_sources: KeySource::defaults(),
            missing_key: MissingKey::Refuse,
            scope: Arc::new(|_| String::from("default")),
            body_limit: 1024 * 1024,
            body_budget: None,
            stored_response_limit: 1024 * 1024,
            running: Running::default(),
        }
    }
}
