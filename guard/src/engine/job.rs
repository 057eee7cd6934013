//! What one run is about: the [`Job`] an adapter hands the engine (the
//! scope and key it runs under, the request's fingerprint, and what the
//! status service and the metrics show).

use std::borrow::Cow;
use std::sync::Arc;

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;

/// One request to run some work once: the key it runs under and what
/// identifies the request (so a reuse of the key for another request is
/// refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The namespace of the key (a tenant, a queue): validated, 1 to 255
    /// bytes.
    pub scope: Scope,
    /// The idempotency key: validated, 1 to 255 visible ASCII characters.
    pub key: IdempotencyKey,
    /// The fingerprint of the request.
    pub fingerprint: Fingerprint,
    /// What kind of request it is (an HTTP method; `RUN` by default). Shown
    /// by the status service. A constant where it can be (the standard
    /// methods, `RUN`): most jobs do not allocate one.
    pub method: Cow<'static, str>,
    /// Where the request went (an HTTP path; empty by default). Shown by the
    /// status service.
    pub path: String,
    /// A name of few values for metrics (a route template, a queue); empty
    /// by default. Shared (an adapter's tally of the request holds it too).
    pub route: Arc<str>,
    /// The request to keep with the claim, for the completer
    /// ([`Job::with_stored_request`]); `None` by default.
    pub stored_request: Option<Box<StoredRequest>>,
}

impl Job {
    /// A job for `key` in `scope`, with method `RUN` and an empty path.
    /// Both are validated types, so an adapter cannot hand the engine a
    /// scope or key a store cannot hold.
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            method: Cow::Borrowed("RUN"),
            path: String::new(),
            route: Arc::default(),
            stored_request: None,
        }
    }

    /// Sets the method and path the status service shows for the record
    /// (a method as a `&'static str` or a `String`).
    pub fn with_request(
        mut self,
        method: impl Into<Cow<'static, str>>,
        path: impl Into<String>,
    ) -> Self {
        self.method = method.into();
        self.path = path.into();
        self
    }

    /// Keeps `request` with the claim (before the work runs, fenced by the
    /// lease), so that a [`Completer`](super::Completer) can finish the run
    /// if it is abandoned: the completer hands it back to the function it
    /// was given, which rebuilds the work from it. Only useful on an engine
    /// that resumes ([`AbandonedPolicy::Resume`](crate::AbandonedPolicy::Resume)).
    pub fn with_stored_request(mut self, request: StoredRequest) -> Self {
        self.stored_request = Some(Box::new(request));
        self
    }

    /// Sets the name the run's metrics carry (a route template, a queue).
    pub fn with_route(mut self, route: impl Into<Arc<str>>) -> Self {
        self.route = route.into();
        self
    }
}
