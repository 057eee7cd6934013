//! The layer's own settings, [`Config`] (the engine holds the rest): read
//! by the layer's builders, which write it, and by the service, which
//! follows it for every request. Its own file, so that neither of the two
//! imports the other for it.

use std::sync::Arc;

use http::{HeaderName, Method, StatusCode, request::Parts};

use crate::adapter::BodyBudget;
use crate::replay::ReplayPolicy;
use crate::response::default_stored_status;

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
    /// One fixed scope, `default` (`None`: the constant `Scope::DEFAULT`,
    /// nothing to allocate): apps without tenants need nothing more.
    pub(crate) scope: Option<ScopeFn>,
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
    /// The headers kept with the request for the completer (beyond the
    /// key and the content type); `None`: no request is kept.
    pub(crate) stored_request: Option<Vec<HeaderName>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            scope: None,
            body_limit: 1024 * 1024,
            stored_response_limit: 1024 * 1024,
            body_budget: None,
            stored_statuses: default_stored_status,
            mismatch_status: StatusCode::CONFLICT,
            excluded_headers: crate::headers::EXCLUDED_BY_DEFAULT.to_vec(),
            replay: ReplayPolicy::new(),
            stored_request: None,
        }
    }
}
