//! [`JsonRpcService`] and the path a request takes through it: a POST's body
//! read within its bound, its envelope read, then passed through, answered
//! here (a running call's cancellation, a guarded batch), or guarded
//! ([`guard()`]); everything else passes untouched.
//!
//! The parts, each a floor below this one: [`mod@guard`] (key, scope, the
//! engine), [`call`] (the server called, its final response captured),
//! [`render`] (an answer as JSON or an event stream), [`large_body`] (the
//! `id` of a body over the limit).

mod call;
mod guard;
mod large_body;
mod render;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use idempotency_guard::Store;
use idempotency_guard::adapter::{BodyReadError, read_body};
use idempotency_guard::engine::Refusal;
use idempotency_guard::telemetry::{Outcome, attempt_label};
use tower::Service;

use self::call::{BoxError, pass_through};
use self::guard::guard;
use self::large_body::{Sniffed, id_of_large_body};
use self::render::refusal;
use crate::accept::Accept;
use crate::config::Config;
use crate::envelope::{self, Envelope};

/// The service [`JsonRpcLayer`](crate::JsonRpcLayer) wraps around an MCP or
/// A2A endpoint.
pub struct JsonRpcService<S, I> {
    inner: I,
    engine: idempotency_guard::Engine<S>,
    config: Arc<Config>,
}

impl<S: Clone, I: Clone> Clone for JsonRpcService<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, I> std::fmt::Debug for JsonRpcService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonRpcService").finish_non_exhaustive()
    }
}

impl<S, I> JsonRpcService<S, I> {
    pub(crate) fn new(inner: I, engine: idempotency_guard::Engine<S>, config: Arc<Config>) -> Self {
        Self {
            inner,
            engine,
            config,
        }
    }
}

/// The response future of [`JsonRpcService`].
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

impl<S, I, B> Service<Request<Body>> for JsonRpcService<S, I>
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
        // The inner service is driven to readiness with `oneshot` on a clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        ResponseFuture {
            inner: Box::pin(self.clone().handle(request)),
        }
    }
}

impl<S, I, B> JsonRpcService<S, I>
where
    S: Store,
    I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    /// One request: calls that are not guarded pass; a guarded call is
    /// counted once, here, with what [`guard()`] did with it.
    async fn handle(self, request: Request<Body>) -> Result<Response<Body>, I::Error> {
        // Only a POST carries a call; GET (the server's event stream) and
        // DELETE (end of session) pass untouched.
        if request.method() != Method::POST {
            return pass_through(self.inner, request).await;
        }
        let Self {
            inner,
            engine,
            config,
        } = self;
        let (parts, body) = request.into_parts();
        let accept = Accept::of(&parts.headers);
        // The reservation, if any, is held until the call is answered.
        let budget = config.body_budget.as_ref();
        let (body, sniffed) = Sniffed::wrap(body);
        let (body, _reservation) =
            match read_body(body, &parts.headers, config.body_limit, budget).await {
                Ok(read) => read,
                // Not counted: no call is named before the envelope is read.
                Err(BodyReadError::TooLarge { limit }) => {
                    // A JSON-RPC error under the call's own id (SDK clients
                    // drop an answer they cannot match, and `error.data`
                    // with a non-2xx status).
                    let id = id_of_large_body(&sniffed).await;
                    let refused = Refusal::BodyTooLarge { limit };
                    return Ok(refusal(&refused, id.as_deref(), accept));
                }
                // Before the envelope is read no call is named: HTTP's
                // problem+json (503 with `Retry-After`, or 400).
                Err(error) => {
                    let refused = error.into_refusal(None, engine.retry_after());
                    return Ok(refused.into_response());
                }
            };
        drop(sniffed);
        let attempt = attempt_label(&parts.headers);
        let call = match envelope::read(&body, &parts.headers, &config.guarded, &config.key_sources)
        {
            Envelope::NotGuarded => {
                if config.running.holds_cancelled(&parts.headers, &body) {
                    // The agent gave up on a guarded call that still runs:
                    // the server is not told, so the tool's result is
                    // captured and stored, and the agent's retry gets it.
                    tracing::debug!("a cancellation of a running guarded call is not passed on");
                    let mut accepted = Response::new(Body::empty());
                    *accepted.status_mut() = StatusCode::ACCEPTED;
                    return Ok(accepted);
                }
                return pass_through(inner, Request::from_parts(parts, Body::from(body))).await;
            }
            Envelope::GuardedBatch => {
                engine.tally(BATCH_ROUTE, attempt).count(Outcome::Rejected);
                return Ok(refusal(&Refusal::BatchNotGuarded, None, accept));
            }
            Envelope::Call(call) => call,
        };
        // Counted once: when answered, or as `caller-gone` when the caller
        // went away first (a run that had started goes on to its end).
        let tally = engine.tally(
            call.tool.clone().unwrap_or_else(|| call.method.clone()),
            attempt,
        );
        let request = Request::from_parts(parts, Body::from(body));
        let (outcome, result) = guard(&engine, &config, inner, request, call, accept).await;
        tally.count(outcome);
        result
    }
}

/// The `route` label of a refused batch (it names no single tool).
const BATCH_ROUTE: &str = "batch";
