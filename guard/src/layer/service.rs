//! [`IdempotencyService`] and the path a guarded request takes through it:
//! method check, key, scope, bounded body read, fingerprint, then the engine
//! with the work "call the route, then keep, release or abandon its
//! response" (`classify.rs` decides which, `body.rs` captures what is
//! kept). Each request's outcome is counted once, in
//! [`IdempotencyService::call`].

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{MatchedPath, OriginalUri};
use axum::response::IntoResponse;
use bytes::Bytes;
use futures_util::FutureExt;
use http::header::CONTENT_TYPE;
use http::{HeaderName, Method, Request, Response, request::Parts};
use http_body::Body as HttpBody;
use tower::{Service, ServiceExt};

use super::classify::classify;
use super::config::Config;
use super::future::ResponseFuture;
use crate::adapter::{capture_response, read_body};
use crate::engine::{
    Answer, CompleterAttempt, Engine, Job, Refusal, RunContext, Settle, boxed_in_place,
};
use crate::fingerprint::Fingerprint;
use crate::key::{IDEMPOTENCY_KEY, IdempotencyKey, KeyError, Scope};
use crate::record::StoredRequest;
use crate::record::StoredResponse;
use crate::response::{BoxError, headers_to_store};
use crate::store::Store;
use crate::telemetry::{Outcome, Tally, attempt_label};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around a route.
pub struct IdempotencyService<S, I> {
    inner: I,
    engine: Engine<S>,
    config: Arc<Config>,
    /// The route's name, shared by its clones.
    route: Arc<RouteName>,
}

impl<S: Clone, I: Clone> Clone for IdempotencyService<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
            route: Arc::clone(&self.route),
        }
    }
}

/// The `route` label of the requests of one service: the first request's
/// matched path, kept, so that the requests after it share its text
/// instead of copying it each. Mounted with `route_layer` (as the layer's
/// docs say), a service serves one route, and every request finds it
/// here; a request of another route (a layer over a whole router) gets a
/// copy of its own.
#[derive(Default)]
struct RouteName(OnceLock<Arc<str>>);

impl RouteName {
    /// The name `matched`, shared when it is the kept one.
    fn of(&self, matched: &str) -> Arc<str> {
        match self.0.get() {
            Some(kept) if **kept == *matched => Arc::clone(kept),
            Some(_) => Arc::from(matched),
            None => Arc::clone(self.0.get_or_init(|| Arc::from(matched))),
        }
    }
}

impl<S, I> std::fmt::Debug for IdempotencyService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, I> IdempotencyService<S, I> {
    pub(super) fn new(inner: I, engine: Engine<S>, config: Arc<Config>) -> Self {
        Self {
            inner,
            engine,
            config,
            route: Arc::default(),
        }
    }
}

/// Counts a request's `outcome` on its tally (nothing for requests the
/// guard does not count).
fn count(tally: Option<Tally>, outcome: Option<Outcome>) {
    let Some(tally) = tally else { return };
    let Some(outcome) = outcome else {
        tally.forget();
        return;
    };
    tally.count(outcome);
    #[cfg(feature = "otel")]
    tracing::Span::current().record(crate::telemetry::otel::OUTCOME, outcome.as_str());
}

/// What a guarded request ended with, to be counted once.
struct Counted<E> {
    /// `None` for requests the guard does not count (methods it does not guard).
    outcome: Option<Outcome>,
    result: Result<Response<Body>, E>,
}

impl<E> Counted<E> {
    /// A refusal before the engine ran: counted as `rejected`.
    fn refused(refusal: Refusal) -> Self {
        Self {
            outcome: Some(Outcome::Rejected),
            result: Ok(refusal.into_response()),
        }
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
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven to readiness with `oneshot` on a clone,
        // after the claim: nothing is reserved here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let service = self.clone();
        #[cfg(feature = "otel")]
        let span = crate::telemetry::otel::request_span(&request);
        let route = self.route.of(request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str));
        // Only requests of a guarded method are counted (and counted as
        // `caller-gone` when their caller goes away first).
        let tally = service.config.methods.contains(request.method()).then(|| {
            service
                .engine
                .tally(Arc::clone(&route), attempt_label(request.headers()))
        });
        // `handle`'s own future, mapped, goes into the box: an `async`
        // block awaiting it would hold the request and the service twice.
        // Dropped before it ends (the caller went away), the closure drops
        // the tally, which counts that.
        // Made in its box, not on the stack and copied in.
        let guarded = boxed_in_place(move || {
            let guarded = service.handle(request, route).map(move |counted| {
                count(tally, counted.outcome);
                counted.result
            });
            #[cfg(feature = "otel")]
            let guarded = tracing::Instrument::instrument(guarded, span);
            guarded
        });
        ResponseFuture::new(guarded)
    }
}

impl<S, I, B> IdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async fn handle(self, request: Request<Body>, route: Arc<str>) -> Counted<I::Error> {
        if !self.config.methods.contains(request.method()) {
            return Counted {
                outcome: None,
                result: pass_through(self.inner, request).await,
            };
        }
        let key = match IdempotencyKey::from_headers(request.headers()) {
            Ok(key) => key,
            Err(KeyError::Missing) if !self.config.key_required => {
                return Counted {
                    outcome: Some(Outcome::Unguarded),
                    result: pass_through(self.inner, request).await,
                };
            }
            Err(KeyError::Missing) => return Counted::refused(Refusal::KeyMissing),
            Err(error) => return Counted::refused(Refusal::KeyInvalid(error)),
        };
        let (parts, body) = request.into_parts();
        let scope = match &self.config.scope {
            None => Scope::DEFAULT,
            Some(name) => match Scope::new(name(&parts)) {
                Ok(scope) => scope,
                Err(_) => return Counted::refused(Refusal::ScopeInvalid),
            },
        };
        // The reservation, if any, is held until the guard answers.
        let budget = self.config.body_budget.as_ref();
        let (body, _reservation) =
            match read_body(body, &parts.headers, self.config.body_limit, budget).await {
                Ok(read) => read,
                Err(error) => {
                    let refusal = error.into_refusal(Some(key), self.engine.retry_after());
                    return Counted::refused(refusal);
                }
            };
        let path = path_and_query(&parts);
        let fingerprint = Fingerprint::of_request(&parts.method, &path, &parts.headers, &body);
        // The key's text is shared by the job, the work and the answer.
        let stored_request = self
            .config
            .stored_request
            .as_deref()
            .map(|names| Box::new(stored_request(&parts, &path, names, &body)));
        let job = Job {
            scope,
            key: key.clone(),
            fingerprint,
            method: method_name(&parts.method),
            path,
            route,
            stored_request,
        };
        let request = Request::from_parts(parts, Body::from(body));
        let (inner, config) = (self.inner, Arc::clone(&self.config));
        let work_key = key.clone();
        let answer = self
            .engine
            .run(job, move |context| {
                run_route(context, inner, request, config, work_key)
            })
            .await;
        let outcome = Some(answer.outcome());
        let result = match answer {
            Answer::Ran { reply, .. } => reply,
            Answer::Replay(stored) => Ok(self.config.replay.replay_owned(stored, key.as_str())),
            Answer::Refused(refusal) => Ok(refusal.into_response_with(self.config.mismatch_status)),
        };
        Counted { outcome, result }
    }
}

/// The work the engine runs for a claimed request: call the route, then
/// keep its response (captured for storage), release the key or abandon
/// it, as [`classify`] says.
async fn run_route<I, B>(
    context: RunContext,
    inner: I,
    request: Request<Body>,
    config: Arc<Config>,
    key: IdempotencyKey,
) -> Settle<Result<Response<Body>, I::Error>>
where
    I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    I::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut request = request;
    if context.lease().is_none() && request.extensions().get::<CompleterAttempt>().is_some() {
        // The completer never runs a key unguarded (a fail-open engine
        // whose store failed): it tries again later.
        return Settle::Release {
            reply: Ok(Refusal::StoreUnavailable {
                key: Some(key),
                retry_after: std::time::Duration::from_secs(1),
            }
            .into_response()),
            keep_writes: false,
        };
    }
    #[cfg(feature = "postgres")]
    if let Some(slot) = context.slot() {
        request.extensions_mut().insert(slot.clone());
    }
    crate::adapter::hand_run(request.extensions_mut(), &context);
    let response = match inner.oneshot(request).await {
        Ok(response) => response,
        Err(error) => {
            return Settle::Release {
                reply: Err(error),
                keep_writes: false,
            };
        }
    };
    let (parts, body) = response.into_parts();
    match classify(&parts, config.stored_statuses) {
        Settle::Complete { .. } => {}
        Settle::Release { keep_writes, .. } => {
            return Settle::Release {
                reply: Ok(Response::from_parts(parts, Body::new(body))),
                keep_writes,
            };
        }
        Settle::Abandon { .. } => {
            return Settle::Abandon {
                reply: Ok(Response::from_parts(parts, Body::new(body))),
            };
        }
    }
    let (stored_body, sent_body) = match capture_response(body, config.stored_response_limit).await
    {
        Ok(captured) => captured,
        Err(error) => {
            tracing::error!(error = %error, "the handler's response body failed");
            return Settle::Release {
                reply: Ok(Refusal::HandlerFailed { key }.into_response()),
                keep_writes: false,
            };
        }
    };
    let response = config.replay.prepare_for_storage(StoredResponse {
        status: parts.status,
        headers: headers_to_store(&parts.headers, &config.excluded_headers),
        body: stored_body,
    });
    Settle::Complete {
        response,
        reply: Ok(Response::from_parts(parts, sent_body)),
    }
}

/// The request kept for the completer: method, path, the key, the
/// content type and the headers the route names, the body; the attempt it
/// is when the completer sent it.
fn stored_request(parts: &Parts, path: &str, names: &[HeaderName], body: &Bytes) -> StoredRequest {
    let mut headers = http::HeaderMap::new();
    let kept = [&IDEMPOTENCY_KEY, &CONTENT_TYPE].into_iter().chain(names);
    for name in kept {
        if headers.contains_key(name) {
            continue;
        }
        for value in parts.headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let mut request = StoredRequest::new(parts.method.as_str(), path, headers, body.clone());
    if let Some(CompleterAttempt(attempt)) = parts.extensions.get::<CompleterAttempt>() {
        request.attempts = *attempt;
    }
    request
}

/// Calls the route without the guard.
async fn pass_through<I, B>(inner: I, request: Request<Body>) -> Result<Response<Body>, I::Error>
where
    I: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    inner.oneshot(request).await.map(|r| r.map(Body::new))
}

/// A request method's name: a constant for the standard methods (no
/// allocation per request), a copy for an extension method.
fn method_name(method: &Method) -> Cow<'static, str> {
    static STANDARD: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::PATCH, "PATCH"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::CONNECT, "CONNECT"),
        (Method::TRACE, "TRACE"),
    ];
    STANDARD
        .iter()
        .find(|(standard, _)| standard == method)
        .map_or_else(
            || Cow::Owned(method.as_str().to_owned()),
            |(_, name)| Cow::Borrowed(*name),
        )
}

/// The request's path and query as the client sent them: under
/// `Router::nest` the URI is stripped of the prefix, so the original one
/// is used when axum kept it (two nested mounts never share fingerprints).
fn path_and_query(parts: &Parts) -> String {
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0);
    uri.path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::IdempotencyLayer;
    use tower::Layer as _;

    /// The bytes a request's futures take: the layer's (the guarded path
    /// of one request, boxed once in [`IdempotencyService::call`]) and the
    /// engine's run inside it. A future is moved (copied) at each step
    /// that takes it by value, so a kilobyte more is a kilobyte copied
    /// per request; the cold states (waiting, taking over, failing) are
    /// boxed where they begin. Printed for docs/BENCHMARKS.md
    /// (`cargo test -p idempotency-guard --lib future_sizes -- --nocapture`),
    /// and held under a budget that fails loudly when a change inlines a
    /// large state into every request.
    fn sizes<S: Store>(store: S) -> (usize, usize) {
        let router = axum::Router::new().route(
            "/orders",
            axum::routing::post(|| async { (http::StatusCode::CREATED, "created") }),
        );
        let service = IdempotencyLayer::new(store).layer(router);
        let request = Request::post("/orders")
            .header("idempotency-key", "k")
            .body(Body::empty())
            .expect("a request");
        let handle = service.clone().handle(request, Arc::from("/orders"));
        let job = Job::new(
            Scope::new("s").expect("a scope"),
            "k".parse().expect("a key"),
            Fingerprint::of_bytes(b""),
        );
        let run = service.engine.run(job, |_context| async {
            Settle::Complete {
                response: StoredResponse::from_bytes("ok"),
                reply: (),
            }
        });
        (size_of_val(&handle), size_of_val(&run))
    }

    /// A service's route name is kept from its first request and shared by
    /// the requests after it; another route's name is its own copy.
    #[test]
    fn a_route_name_is_shared_by_the_requests_of_its_route() {
        let names = RouteName::default();
        let first = names.of("/orders");
        let again = names.of("/orders");
        assert!(Arc::ptr_eq(&first, &again), "the kept name is shared");
        let other = names.of("/refunds");
        assert_eq!(&*other, "/refunds");
        assert!(Arc::ptr_eq(&names.of("/orders"), &first));
    }

    /// The standard methods are constants, an extension method a copy.
    #[test]
    fn standard_method_names_are_constants() {
        assert!(matches!(method_name(&Method::POST), Cow::Borrowed("POST")));
        assert!(matches!(
            method_name(&Method::DELETE),
            Cow::Borrowed("DELETE")
        ));
        let custom = Method::from_bytes(b"PURGE").expect("a method");
        assert!(matches!(method_name(&custom), Cow::Owned(ref name) if name == "PURGE"));
    }

    /// What the futures may grow to before a change must say why (on
    /// 2026-12-03, with `otel` on: Redis 5,472 and 3,664 bytes, SQLite
    /// 3,672 and 2,056). Both are made in their boxes
    /// (`engine::boxed_in_place`), so their size is no longer copied per
    /// request; the budgets hold them where they are.
    const LAYER_BUDGET: usize = 6 * 1024;
    const RUN_BUDGET: usize = 4 * 1024;

    fn check(store: &str, (handle, run): (usize, usize)) {
        println!("{store}: the layer's request future {handle} bytes, Engine::run {run} bytes");
        assert!(
            handle <= LAYER_BUDGET && run <= RUN_BUDGET,
            "{store}: a request's future grew past its budget (layer {handle} of {LAYER_BUDGET}, \
             run {run} of {RUN_BUDGET}): box the cold state that grew it"
        );
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn future_sizes_on_sqlite() {
        let store = crate::store::sqlite::SqliteStore::connect("sqlite::memory:")
            .await
            .expect("an in-memory SQLite");
        check("SQLite", sizes(store));
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn future_sizes_on_redis() {
        let prefix = format!("test-sizes-{}", uuid::Uuid::new_v4().simple());
        let store = crate::store::redis::RedisStore::connect(
            &idempotency_tests::fixtures::redis_url(),
            &prefix,
        )
        .await
        .expect("Redis (start one on 127.0.0.1:6379, or set TEST_REDIS_URL)");
        check("Redis", sizes(store));
    }
}
