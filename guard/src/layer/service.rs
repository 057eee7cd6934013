//! [`IdempotencyService`] and the path a guarded request takes through it:
//! method check, key, scope, bounded body read, fingerprint, then the engine
//! with the work "call the route, capture its response". Each request's
//! outcome is counted once, in [`IdempotencyService::call`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{MatchedPath, OriginalUri};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{HeaderMap, Request, Response, header, request::Parts};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::{Service, ServiceExt};

use super::budget::{BodyBudget, Reservation};
use super::{Config, FinalResponse, MAX_SCOPE_LEN, OutcomeUnknown, is_rejection_before_work};
use crate::engine::{Answer, Engine, Job, RunContext, Settle};
use crate::problem::Rejection;
use crate::response::{BoxError, Captured, capture, headers_to_store, is_no_store};
use crate::store::Store;
use crate::telemetry::{MetricHandles, Outcome, attempt_label};
use crate::{Fingerprint, IdempotencyKey, KeyError, StoredResponse};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around a route.
pub struct IdempotencyService<S, I> {
    inner: I,
    engine: Engine<S>,
    config: Arc<Config>,
}

impl<S: Clone, I: Clone> Clone for IdempotencyService<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
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
        }
    }
}

/// The response future of [`IdempotencyService`].
pub struct ResponseFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Counts one request's outcome in `idempotency_requests_total` exactly
/// once: when its answer is ready, or, for a request of a guarded method
/// whose caller went away first, as [`Outcome::CallerGone`] when it is
/// dropped.
struct Tally {
    metrics: Arc<MetricHandles>,
    route: String,
    attempt: &'static str,
    /// Whether dropping the tally uncounted counts a caller gone.
    caller_gone: bool,
}

impl Tally {
    /// Counts `outcome` (nothing for requests the guard does not count).
    fn count(mut self, outcome: Option<Outcome>) {
        self.caller_gone = false;
        if let Some(outcome) = outcome {
            self.metrics
                .count_request(&self.route, outcome, self.attempt);
            #[cfg(feature = "otel")]
            tracing::Span::current().record(crate::telemetry::otel::OUTCOME, outcome.as_str());
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if self.caller_gone {
            self.metrics
                .count_request(&self.route, Outcome::CallerGone, self.attempt);
        }
    }
}

/// What a guarded request ended with, to be counted once.
struct Counted<E> {
    /// `None` for requests the guard does not count (methods it does not guard).
    outcome: Option<Outcome>,
    result: Result<Response<Body>, E>,
}

impl<E> Counted<E> {
    fn rejected(rejection: Rejection) -> Self {
        Self {
            outcome: Some(Outcome::Rejected),
            result: Ok(rejection.into_response()),
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
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map_or("unmatched", MatchedPath::as_str)
            .to_owned();
        let tally = Tally {
            metrics: Arc::clone(service.engine.metrics()),
            route: route.clone(),
            attempt: attempt_label(request.headers()),
            caller_gone: service.config.methods.contains(request.method()),
        };
        // `handle`'s own future, mapped, goes into the box: an `async`
        // block awaiting it would hold the request and the service twice.
        // Dropped before it ends (the caller went away), the closure drops
        // the tally, which counts that.
        let guarded = service.handle(request, route).map(move |counted| {
            tally.count(counted.outcome);
            counted.result
        });
        #[cfg(feature = "otel")]
        let guarded = tracing::Instrument::instrument(guarded, span);
        ResponseFuture {
            inner: Box::pin(guarded),
        }
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
    async fn handle(self, request: Request<Body>, route: String) -> Counted<I::Error> {
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
            Err(KeyError::Missing) => return Counted::rejected(Rejection::KeyMissing),
            Err(error) => return Counted::rejected(Rejection::KeyInvalid(error)),
        };
        let (parts, body) = request.into_parts();
        let scope = (self.config.scope)(&parts);
        if scope.is_empty() || scope.len() > MAX_SCOPE_LEN {
            return Counted::rejected(Rejection::ScopeInvalid);
        }
        let budget = self.config.body_budget.as_ref();
        let read = match budget {
            None => read_body(body, &parts.headers, self.config.body_limit)
                .await
                .map(|body| (body, None)),
            Some(budget) => read_body_within(body, &parts.headers, self.config.body_limit, budget)
                .await
                .map(|(body, reservation)| (body, Some(reservation))),
        };
        // The reservation, if any, is held until the guard answers.
        let (body, _reservation) = match read {
            Ok(read) => read,
            Err(BodyRefusal::Rejected(rejection)) => return Counted::rejected(rejection),
            Err(BodyRefusal::BufferFull) => {
                return Counted::rejected(Rejection::BodyBufferFull {
                    key: key.as_str().to_owned(),
                    retry_after: self.engine.retry_after(),
                });
            }
        };
        let path = path_and_query(&parts);
        let fingerprint = Fingerprint::of_request(&parts.method, &path, &parts.headers, &body);
        let job_key = key.as_str().to_owned();
        let job = Job {
            scope,
            key: job_key.clone(),
            fingerprint,
            method: parts.method.as_str().to_owned(),
            path,
            route,
        };
        let request = Request::from_parts(parts, Body::from(body));
        let (inner, config) = (self.inner, Arc::clone(&self.config));
        let answer = self
            .engine
            .run(job, move |context| {
                run_route(context, inner, request, config, key.as_str().to_owned())
            })
            .await;
        let outcome = Some(answer.outcome());
        let result = match answer {
            Answer::Ran { reply, .. } => reply,
            Answer::Replay(stored) => Ok(self.config.replay.replay_owned(stored, &job_key)),
            Answer::Refused(refusal) => {
                Ok(
                    Rejection::from_refusal(refusal, &job_key, self.config.mismatch_status)
                        .into_response(),
                )
            }
        };
        Counted { outcome, result }
    }
}

/// The work the engine runs for a claimed request: call the route, then
/// capture its response for storage, or say why it is not to be kept.
async fn run_route<I, B>(
    context: RunContext,
    inner: I,
    request: Request<Body>,
    config: Arc<Config>,
    key: String,
) -> Settle<Result<Response<Body>, I::Error>>
where
    I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    I::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    #[cfg(feature = "postgres")]
    let request = {
        let mut request = request;
        if let Some(slot) = context.slot() {
            request.extensions_mut().insert(slot.clone());
        }
        request
    };
    let _ = &context;
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
    let release = |parts, body: B, keep_writes| Settle::Release {
        reply: Ok(Response::from_parts(parts, Body::new(body))),
        keep_writes,
    };
    if parts.extensions.get::<OutcomeUnknown>().is_some() {
        return Settle::Abandon {
            reply: Ok(Response::from_parts(parts, Body::new(body))),
        };
    }
    // Stripe's rule: an extractor's rejection means no work was done.
    if is_rejection_before_work(parts.status) && parts.extensions.get::<FinalResponse>().is_none() {
        return release(parts, body, false);
    }
    let no_store = is_no_store(&parts.headers);
    if no_store || !(config.stored_statuses)(parts.status) {
        // Not an answer to keep: free the key so a retry may run. A
        // `no-store` success keeps its writes; failures roll them back.
        let keep_writes = no_store && parts.status.is_success();
        return release(parts, body, keep_writes);
    }
    let captured = match capture(Box::pin(body), config.stored_response_limit).await {
        Ok(captured) => captured,
        Err(error) => {
            tracing::error!(error = %error, "the handler's response body failed");
            return Settle::Release {
                reply: Ok(Rejection::HandlerFailed { key }.into_response()),
                keep_writes: false,
            };
        }
    };
    let (stored_body, sent_body) = match captured {
        Captured::Whole(bytes) => (Some(bytes.clone()), Body::from(bytes)),
        Captured::TooLarge { prefix, rest } => (None, crate::response::resume(prefix, rest)),
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

/// Calls the route without the guard.
async fn pass_through<I, B>(inner: I, request: Request<Body>) -> Result<Response<Body>, I::Error>
where
    I: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    inner.oneshot(request).await.map(|r| r.map(Body::new))
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

/// Why a body was not read.
enum BodyRefusal {
    /// Too large or broken.
    Rejected(Rejection),
    /// The budget of buffered bodies has no room for it.
    BufferFull,
}

impl From<Rejection> for BodyRefusal {
    fn from(rejection: Rejection) -> Self {
        Self::Rejected(rejection)
    }
}

/// The declared `Content-Length`, refused when over `limit`.
fn declared_length(headers: &HeaderMap, limit: usize) -> Result<Option<usize>, Rejection> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => Err(Rejection::BodyTooLarge { limit }),
        // Not over a `usize` limit: it fits.
        Some(length) => Ok(usize::try_from(length).ok()),
        None => Ok(None),
    }
}

/// The rejection of a body read that failed with `error`.
fn read_failure(error: &BoxError, limit: usize) -> Rejection {
    if error.is::<LengthLimitError>() {
        Rejection::BodyTooLarge { limit }
    } else {
        Rejection::BodyUnreadable
    }
}

/// Reads a request body up to `limit` bytes: a `Content-Length` over the
/// limit is refused before any byte is read.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, BodyRefusal> {
    declared_length(headers, limit)?;
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => Err(read_failure(&error, limit).into()),
    }
}

/// Reads a request body as [`read_body`] does, within `budget`: a declared
/// `Content-Length` is reserved before any byte is read, a chunked body as
/// its chunks arrive; the bytes are copied into one buffer as they come
/// (the chunks are freed at once), so what is held is what is reserved.
async fn read_body_within(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    budget: &BodyBudget,
) -> Result<(Bytes, Reservation), BodyRefusal> {
    let declared = declared_length(headers, limit)?;
    let mut reservation = budget
        .reserve(declared.unwrap_or(0))
        .ok_or(BodyRefusal::BufferFull)?;
    let mut buffer = BytesMut::with_capacity(declared.unwrap_or(0));
    let mut body = std::pin::pin!(Limited::new(body, limit));
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|error| read_failure(&error, limit))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let needed = buffer.len() + data.len();
        if !reservation.cover(needed) {
            return Err(BodyRefusal::BufferFull);
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer.freeze(), reservation))
}
