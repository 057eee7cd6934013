//! [`GrpcIdempotencyService`] and the path a call takes through it: scope,
//! method check, key, bounded message read, then the engine with the work
//! "call the method, capture its answer". Each guarded call is counted
//! once, in [`GrpcIdempotencyService::call`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::Full;
use idempotency_guard::adapter::read_body;
use idempotency_guard::engine::{Answer, Refusal, Settle};
use idempotency_guard::telemetry::{Outcome, attempt_label};
use idempotency_guard::{Engine, IdempotencyKey, KeyError, Scope, Store, StoredResponse};
use tonic::metadata::MetadataMap;
use tower::{Service, ServiceExt};

use super::{CallScope, Config};
use crate::engine::{self, Call};
use crate::exchange::{AnswerRead, BoxError, Exchange, read_answer};
use crate::outcome::settle;
use crate::refusal::to_status;

/// The service [`GrpcIdempotencyLayer`](super::GrpcIdempotencyLayer) wraps
/// around a tonic server's routes.
pub struct GrpcIdempotencyService<S, I> {
    inner: I,
    engine: Engine<S>,
    config: Arc<Config>,
}

impl<S: Clone, I: Clone> Clone for GrpcIdempotencyService<S, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, I> std::fmt::Debug for GrpcIdempotencyService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyService")
            .finish_non_exhaustive()
    }
}

impl<S, I> GrpcIdempotencyService<S, I> {
    pub(super) fn new(inner: I, engine: Engine<S>, config: Arc<Config>) -> Self {
        Self {
            inner,
            engine,
            config,
        }
    }
}

/// The response future of [`GrpcIdempotencyService`].
pub struct ResponseFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<tonic::body::Body>, E>> + Send>>,
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<tonic::body::Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> std::fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, I, B> Service<Request<tonic::body::Body>> for GrpcIdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<tonic::body::Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = I::Error;
    type Future = ResponseFuture<I::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven to readiness with `oneshot` on a
        // clone, after the claim: nothing is reserved here.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<tonic::body::Body>) -> Self::Future {
        let service = self.clone();
        let method = request.uri().path().to_owned();
        // The scope function sees the headers as metadata, moved, not copied.
        let metadata = MetadataMap::from_headers(std::mem::take(request.headers_mut()));
        let scope = (service.config.scope)(&metadata, request.extensions());
        *request.headers_mut() = metadata.into_headers();
        request
            .extensions_mut()
            .insert(CallScope::new(scope.clone(), method.clone()));
        if !service.config.methods.contains(method.as_str()) {
            let inner = service.inner;
            return ResponseFuture {
                inner: Box::pin(async move {
                    inner
                        .oneshot(request)
                        .await
                        .map(|r| r.map(tonic::body::Body::new))
                }),
            };
        }
        // Counted once: when answered, or as `caller-gone` when the caller
        // went away first (a run that had started goes on to its end).
        let tally = service
            .engine
            .tally(method.clone(), attempt_label(request.headers()));
        let guarded = service
            .guard(request, scope, method)
            .map(move |(outcome, result)| {
                tally.count(outcome);
                result
            });
        ResponseFuture {
            inner: Box::pin(guarded),
        }
    }
}

/// A refusal's answer, with the outcome it is counted under.
fn refuse<E>(refusal: &Refusal) -> (Outcome, Result<Response<tonic::body::Body>, E>) {
    (Outcome::Rejected, Ok(to_status(refusal).into_http()))
}

impl<S, I, B> GrpcIdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<tonic::body::Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async fn guard(
        self,
        request: Request<tonic::body::Body>,
        scope: String,
        method: String,
    ) -> (Outcome, Result<Response<tonic::body::Body>, I::Error>) {
        let key = match read_key(request.headers(), &self.config.key) {
            Ok(key) => key,
            Err(KeyError::Missing) => return refuse(&Refusal::KeyMissing),
            Err(error) => return refuse(&Refusal::KeyInvalid(error)),
        };
        let Ok(scope) = Scope::new(scope) else {
            return refuse(&Refusal::ScopeInvalid);
        };
        let (parts, body) = request.into_parts();
        let limit = self.config.request_limit;
        let message = match read_body(body, &parts.headers, limit, None).await {
            Ok((message, _)) => message,
            // No budget here: never `body-buffer-full`.
            Err(error) => {
                return refuse(&error.into_refusal(Some(key), self.engine.retry_after()));
            }
        };
        let call = Call {
            scope,
            key: key.clone(),
            method: &method,
            message: &message,
        };
        let request =
            Request::from_parts(parts, tonic::body::Body::new(Full::new(message.clone())));
        let (inner, stored_limit) = (self.inner, self.config.stored_response_limit);
        let work_key = key.clone();
        let retry_after = self.engine.retry_after();
        let (ended, outcome) = engine::run(&self.engine, call, move |context| {
            let request = with_run(request, context, &work_key, retry_after);
            run_method(inner, request, stored_limit, work_key)
        })
        .await;
        let result = match ended {
            Answer::Ran { reply, .. } => reply,
            Answer::Replay(stored) => match Exchange::from_stored(stored) {
                Some(exchange) => Ok(exchange.into_response(true)),
                None => {
                    tracing::error!(method, "a stored answer is not a gRPC answer of this guard");
                    return refuse(&Refusal::OutcomeUnknown { key });
                }
            },
            Answer::Refused(refusal) => Ok(to_status(&refusal).into_http()),
        };
        (outcome, result)
    }
}

/// The request with the run in its extensions: the method's run handle
/// (`request.extensions().get::<Run>()`, put there by the adapter kit's
/// [`hand_run`](idempotency_guard::adapter::hand_run)) and, with
/// PostgreSQL, its way to the run's transaction ([`crate::tx()`]).
fn with_run(
    mut request: Request<tonic::body::Body>,
    context: idempotency_guard::engine::RunContext,
    key: &IdempotencyKey,
    retry_after: std::time::Duration,
) -> Request<tonic::body::Body> {
    idempotency_guard::adapter::hand_run(request.extensions_mut(), &context);
    #[cfg(feature = "postgres")]
    request
        .extensions_mut()
        .insert(crate::tx::CallRun::new(context, key.clone(), retry_after));
    #[cfg(not(feature = "postgres"))]
    let _ = (context, key, retry_after);
    request
}

/// Reads the key from the metadata entry `name`: one entry, parsed as the
/// HTTP guard parses its header.
fn read_key(headers: &HeaderMap, name: &http::HeaderName) -> Result<IdempotencyKey, KeyError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    IdempotencyKey::parse_bytes(first.as_bytes())
}

/// The work the engine runs for a claimed call: call the method, read its
/// answer whole, and keep or release it by [`settle`].
async fn run_method<I, B>(
    inner: I,
    request: Request<tonic::body::Body>,
    stored_limit: usize,
    key: IdempotencyKey,
) -> Settle<Result<Response<tonic::body::Body>, I::Error>, Option<StoredResponse>>
where
    I: Service<Request<tonic::body::Body>, Response = Response<B>> + Send + 'static,
    I::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let response = match inner.oneshot(request).await {
        Ok(response) => response,
        Err(error) => {
            return Settle::Release {
                reply: Err(error),
                keep_writes: false,
            };
        }
    };
    match read_answer(response, stored_limit).await {
        AnswerRead::Whole(mut exchange) => {
            let marked_final = exchange.take_final_marker();
            // The handler lost track of its work (a step did not return):
            // nothing is kept, the key is left abandoned with its steps.
            if exchange.take_outcome_unknown_marker() {
                return Settle::Abandon {
                    reply: Ok(exchange.into_response(false)),
                };
            }
            settle(exchange.code(), marked_final)
                .map_response(|()| Some(exchange.to_stored()))
                .map_reply(|()| Ok(exchange.into_response(false)))
        }
        // Its status is still unknown, but the method ran: it is never
        // run again (replays answer `response-not-stored`).
        AnswerRead::TooLarge(response) => Settle::Complete {
            response: None,
            reply: Ok(response),
        },
        AnswerRead::Broken(error) => {
            tracing::error!(error = %error, "the method's answer broke off; its key is released");
            Settle::Release {
                reply: Ok(to_status(&Refusal::HandlerFailed { key }).into_http()),
                keep_writes: false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn the_key_is_one_metadata_entry() {
        let name = http::HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(read_key(&headers, &name), Err(KeyError::Missing));
        headers.insert(&name, HeaderValue::from_static("pay-1"));
        assert_eq!(read_key(&headers, &name).unwrap().as_str(), "pay-1");
        headers.append(&name, HeaderValue::from_static("pay-2"));
        assert_eq!(read_key(&headers, &name), Err(KeyError::Repeated));
    }
}
