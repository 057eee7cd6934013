//! [`JsonRpcService`] and the path a POST takes through it: bounded body
//! read, envelope, key, scope, then the engine with the work "call the
//! server, capture its final JSON-RPC response"; and the answer rendered as
//! JSON or as an event stream, as the client's `Accept` asks.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::IntoResponse;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use idempotency_guard::adapter::{BodyReadError, Captured, capture, read_body, resume};
use idempotency_guard::engine::Settle;
use idempotency_guard::telemetry::{Outcome, attempt_label};
use idempotency_guard::{IDEMPOTENT_REPLAYED, KeyError, OutcomeUnknown, Scope, Store};
use serde_json::value::RawValue;
use tower::{Service, ServiceExt};

use crate::engine::{self, Answer, GuardedCall, Stored};
use crate::envelope::{self, Envelope};
use crate::layer::{Config, MissingKey};
use crate::reply::{self, IdScanner, RpcRefusal, SseScanner, SseStripper};

/// The boxed error of a body.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
    /// counted once, here, with what [`JsonRpcService::guard`] did with it.
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
                    let refused = RpcRefusal::BodyTooLarge { limit };
                    return Ok(refusal(&refused, id.as_deref(), None, accept));
                }
                Err(error) => {
                    let rejection = error.into_refusal(None, engine.retry_after());
                    return Ok(rejection.into_response());
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
                engine.count_request(BATCH_ROUTE, Outcome::Rejected, attempt);
                return Ok(refusal(&RpcRefusal::BatchNotGuarded, None, None, accept));
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

/// A guarded call: its key and scope checked, then run through the
/// engine; answers with the `outcome` label it is counted under.
async fn guard<S, I, B>(
    engine: &idempotency_guard::Engine<S>,
    config: &Config,
    inner: I,
    request: Request<Body>,
    call: envelope::Call,
    accept: Accept,
) -> (Outcome, Result<Response<Body>, I::Error>)
where
    S: Store,
    I: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let rejected = |refused: &RpcRefusal| {
        (
            Outcome::Rejected,
            Ok(refusal(refused, Some(&call.id), None, accept)),
        )
    };
    let key = match call.key {
        Ok(ref key) => key.clone(),
        Err(KeyError::Missing) if config.missing_key == MissingKey::PassThrough => {
            return (Outcome::Unguarded, pass_through(inner, request).await);
        }
        Err(KeyError::Missing) => return rejected(&RpcRefusal::KeyMissing),
        Err(_) => return rejected(&RpcRefusal::KeyInvalid),
    };
    let (parts, body) = request.into_parts();
    let Ok(scope) = Scope::new((config.scope)(&parts)) else {
        return rejected(&RpcRefusal::ScopeInvalid);
    };
    // Known while it runs, so that the agent's `notifications/cancelled`
    // for it does not reach the server (see `Running`).
    let running = config.running.enter(&parts.headers, &call.id);
    let request = Request::from_parts(parts, body);
    let guarded = GuardedCall {
        scope,
        key: key.clone(),
        fingerprint: call.fingerprint,
        target: call.tool.clone().unwrap_or_else(|| call.method.clone()),
        method: call.method,
    };
    let call_key = key.as_str().to_owned();
    let (id, limit) = (call.id.clone(), config.stored_response_limit);
    let (answer, counted) = engine::run(engine, guarded, move || async move {
        let _running = running;
        let call = ServerCall {
            id,
            key: call_key,
            limit,
            accept,
        };
        call_server(inner, request, call).await
    })
    .await;
    let response = match answer {
        Answer::Ran(reply) => return (counted, reply),
        Answer::Replay(Some(stored)) => replay(&stored, &call.id, key.as_str(), accept),
        Answer::Replay(None) => refusal(
            &RpcRefusal::ResponseNotStored,
            Some(&call.id),
            Some(key.as_str()),
            accept,
        ),
        Answer::Refused(refused) => refusal(&refused, Some(&call.id), Some(key.as_str()), accept),
    };
    (counted, Ok(response))
}

/// What [`call_server`] needs to know of the call.
struct ServerCall {
    id: Box<RawValue>,
    key: String,
    /// The stored-response limit.
    limit: usize,
    accept: Accept,
}

/// The work the engine runs for a claimed call: call the server, then
/// capture its final JSON-RPC response (from a JSON body or an event
/// stream) and say whether it is kept.
async fn call_server<I, B>(
    inner: I,
    request: Request<Body>,
    call: ServerCall,
) -> Settle<Result<Response<Body>, I::Error>, Stored>
where
    I: Service<Request<Body>, Response = Response<B>> + Send + 'static,
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
    let (parts, body) = response.into_parts();
    let body = Body::new(body);
    let ServerCall {
        id,
        key,
        limit,
        accept,
    } = call;
    // The inner service says the call may have run but its answer is lost
    // (the gateway's upstream reset or timed out after the request was
    // sent): never run it again blindly. The caller gets the JSON-RPC error
    // `outcome-unknown` (HTTP 200, as every refusal), with the inner
    // answer's problem type as `data.upstream`.
    if parts.extensions.get::<OutcomeUnknown>().is_some() {
        let mut data = serde_json::Map::new();
        if let Some(kind) = problem_type(body).await {
            data.insert("upstream".into(), kind.into());
        }
        let message = RpcRefusal::OutcomeUnknown.to_json_with(Some(&id), Some(&key), data);
        return Settle::Abandon {
            reply: Ok(render(&message, accept.wants_sse(false))),
        };
    }
    // Not a JSON-RPC answer (a 4xx for a missing session, a 5xx): the call
    // did not complete; a retry may run it.
    if !parts.status.is_success() {
        return Settle::Release {
            reply: Ok(Response::from_parts(parts, body)),
            keep_writes: false,
        };
    }
    if is_event_stream(&parts.headers) {
        capture_stream(parts, body, &id, limit).await
    } else {
        capture_json(parts, body, &id, limit).await
    }
}

/// The `type` of a problem+json body (the first 16 KiB read; anything else
/// is `None`).
async fn problem_type(body: Body) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Problem {
        #[serde(rename = "type")]
        kind: String,
    }
    let bytes = http_body_util::Limited::new(body, 16 * 1024)
        .collect()
        .await
        .ok()?
        .to_bytes();
    serde_json::from_slice::<Problem>(&bytes)
        .ok()
        .map(|p| p.kind)
}

/// A JSON answer: read up to `limit` (past it, or broken, the outcome is
/// unknown), kept as [`reply::settle`] says.
async fn capture_json<E>(
    parts: http::response::Parts,
    body: Body,
    id: &RawValue,
    limit: usize,
) -> Settle<Result<Response<Body>, E>, Stored> {
    let bytes = match capture(body, limit).await {
        Captured::Whole(bytes) => bytes,
        Captured::TooLarge { prefix, rest } => {
            return Settle::Abandon {
                reply: Ok(Response::from_parts(parts, resume(prefix, rest))),
            };
        }
        Captured::Broken { prefix, .. } => {
            return Settle::Abandon {
                reply: Ok(Response::from_parts(parts, Body::from(prefix))),
            };
        }
    };
    let reply = Ok(Response::from_parts(parts, Body::from(bytes.clone())));
    if !reply::is_response_to(&bytes, id) {
        return Settle::Release {
            reply,
            keep_writes: false,
        };
    }
    reply::settle(&bytes)
        .map_response(|()| Stored {
            response: bytes,
            sse: false,
        })
        .map_reply(|()| reply)
}

/// An event stream: read until the event holding the final response (or
/// `limit`), notifications passed on to this caller but never stored. The
/// stream's events reach the first caller once the final response is in,
/// without resumption ids ([`SseStripper`]): the answer is complete when
/// stored and is never resumed.
async fn capture_stream<E>(
    mut parts: http::response::Parts,
    mut body: Body,
    id: &RawValue,
    limit: usize,
) -> Settle<Result<Response<Body>, E>, Stored> {
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut sent = BytesMut::new();
    let mut scanner = SseScanner::default();
    let mut stripper = SseStripper::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        sent.extend_from_slice(&stripper.push(&data));
        if let Some(response) = scanner.push(&data, id) {
            let reply = Ok(Response::from_parts(parts, Body::from(sent.freeze())));
            return reply::settle(&response)
                .map_response(|()| Stored {
                    response,
                    sse: true,
                })
                .map_reply(|()| reply);
        }
        if sent.len() > limit {
            let rest = stripped(stripper, body);
            return Settle::Abandon {
                reply: Ok(Response::from_parts(parts, resume(sent.freeze(), rest))),
            };
        }
    }
    // The stream ended (or broke) before the final response: the tool may
    // have run, nobody knows its result.
    sent.extend_from_slice(&stripper.finish());
    Settle::Abandon {
        reply: Ok(Response::from_parts(parts, Body::from(sent.freeze()))),
    }
}

/// The rest of an event stream through `stripper`.
fn stripped(stripper: SseStripper, rest: Body) -> Body {
    let events = futures_util::stream::unfold(
        Some((stripper, rest.into_data_stream())),
        |state| async move {
            let (mut stripper, mut rest) = state?;
            match futures_util::StreamExt::next(&mut rest).await {
                Some(Ok(data)) => Some((Ok(stripper.push(&data)), Some((stripper, rest)))),
                Some(Err(error)) => Some((Err(error), None)),
                None => Some((Ok(stripper.finish()), None)),
            }
        },
    );
    Body::from_stream(events)
}

/// The stored answer under the retry's own `id`, marked replayed, in the
/// form the retry accepts.
fn replay(stored: &Stored, id: &RawValue, key: &str, accept: Accept) -> Response<Body> {
    let Ok(response) = reply::replayed(&stored.response, id) else {
        tracing::error!("a stored JSON-RPC answer does not parse; not replayed");
        return refusal(&RpcRefusal::HandlerFailed, Some(id), Some(key), accept);
    };
    let mut response = render(&response, accept.wants_sse(stored.sse));
    response
        .headers_mut()
        .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// A refusal as a JSON-RPC error, with HTTP 200 (see [`RpcRefusal`]).
fn refusal(
    refusal: &RpcRefusal,
    id: Option<&RawValue>,
    key: Option<&str>,
    accept: Accept,
) -> Response<Body> {
    render(&refusal.to_json(id, key), accept.wants_sse(false))
}

/// One JSON-RPC message as an HTTP 200 answer, JSON or an event stream.
fn render(message: &Bytes, sse: bool) -> Response<Body> {
    let (body, form) = if sse {
        (reply::sse_event(message), "text/event-stream")
    } else {
        (message.clone(), "application/json")
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(form));
    if sse {
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    response
}

/// The guarded calls running now, by MCP session (`Mcp-Session-Id`) and
/// JSON-RPC id.
///
/// MCP SDK clients send `notifications/cancelled` when they stop waiting
/// for a call (after their own timeout). A server that honours it stops
/// answering (rmcp drops the answer and lets the tool finish), and the key
/// would be abandoned: the agent's retry would get `outcome-unknown` for
/// the whole retention although the tool finished. So a cancellation of a
/// guarded call that still runs is answered `202 Accepted` here and not
/// passed on (MCP lets a receiver ignore a cancellation): the tool's result
/// is captured and stored, and the retry gets it (`request-in-flight`
/// while it runs, the replay after). Calls without a session (a stateless
/// server) are not tracked: their cancellation cannot reach the call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Running(Arc<Mutex<HashMap<(String, String), usize>>>);

/// The MCP session header.
const MCP_SESSION_ID: &str = "mcp-session-id";

/// The method of an MCP cancellation.
const CANCELLED: &str = "notifications/cancelled";

impl Running {
    /// Notes a guarded call with `id` in the request's session, until the
    /// answer is dropped.
    fn enter(&self, headers: &HeaderMap, id: &RawValue) -> Option<RunningCall> {
        let session = headers.get(MCP_SESSION_ID)?.to_str().ok()?.to_owned();
        let entry = (session, normal_id(id.get())?);
        let mut calls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *calls.entry(entry.clone()).or_default() += 1;
        Some(RunningCall {
            running: self.clone(),
            entry,
        })
    }

    /// Whether `body` is a `notifications/cancelled` for a guarded call
    /// running in the request's session.
    fn holds_cancelled(&self, headers: &HeaderMap, body: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct Notification<'a> {
            #[serde(borrow)]
            method: std::borrow::Cow<'a, str>,
            params: Option<Params<'a>>,
            id: Option<serde::de::IgnoredAny>,
        }
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(rename = "requestId", borrow)]
            request_id: &'a RawValue,
        }
        if self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
        {
            return false;
        }
        let Some(session) = headers.get(MCP_SESSION_ID).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Ok(Notification {
            method,
            params: Some(params),
            id: None,
        }) = serde_json::from_slice::<Notification<'_>>(body)
        else {
            return false;
        };
        let Some(id) = normal_id(params.request_id.get()) else {
            return false;
        };
        method == CANCELLED
            && self
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&(session.to_owned(), id))
    }
}

/// An id in one written form (`1` and `1.0` stay apart, as JSON-RPC ids).
fn normal_id(id: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(id)
        .ok()
        .map(|value| value.to_string())
}

/// One guarded call in [`Running`]; leaves it when dropped.
#[derive(Debug)]
struct RunningCall {
    running: Running,
    entry: (String, String),
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        let mut calls = self
            .running
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = calls.get_mut(&self.entry) {
            *count -= 1;
            if *count == 0 {
                calls.remove(&self.entry);
            }
        }
    }
}

/// The most of a body over the limit read to find its call's `id`; past
/// it, the refusal goes with a `null` id.
const LARGE_BODY_SCAN: usize = 64 * 1024 * 1024;

/// A request body that shows each chunk to an [`IdScanner`] on its way to
/// the bounded read, and leaves what the read did not take for
/// [`id_of_large_body`].
struct Sniffed {
    body: Option<Body>,
    shared: Arc<Mutex<Sniff>>,
}

/// What [`Sniffed`] saw, and the body it left.
#[derive(Default)]
struct Sniff {
    scanner: IdScanner,
    rest: Option<Body>,
}

impl Sniffed {
    fn wrap(body: Body) -> (Body, Arc<Mutex<Sniff>>) {
        let shared = Arc::new(Mutex::new(Sniff::default()));
        let sniffed = Self {
            body: Some(body),
            shared: Arc::clone(&shared),
        };
        (Body::new(sniffed), shared)
    }
}

impl HttpBody for Sniffed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let mut sniff = this.shared.lock().unwrap_or_else(PoisonError::into_inner);
            sniff.scanner.push(data);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(http_body::SizeHint::default, HttpBody::size_hint)
    }
}

impl Drop for Sniffed {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            let mut sniff = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            sniff.rest = Some(body);
        }
    }
}

/// The `id` of a call whose body is over the limit: from what the bounded
/// read saw, then from the rest of the body, read and not kept (up to
/// [`LARGE_BODY_SCAN`] bytes).
async fn id_of_large_body(sniffed: &Mutex<Sniff>) -> Option<Box<RawValue>> {
    let (mut scanner, rest) = {
        let mut sniff = sniffed.lock().unwrap_or_else(PoisonError::into_inner);
        (std::mem::take(&mut sniff.scanner), sniff.rest.take())
    };
    if !scanner.push(&[])
        && let Some(mut rest) = rest
    {
        let mut read = 0;
        while let Some(Ok(frame)) = rest.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            read += data.len();
            if scanner.push(&data) || read > LARGE_BODY_SCAN {
                break;
            }
        }
    }
    scanner.id()
}

/// Which forms of answer the client's `Accept` allows.
#[derive(Debug, Clone, Copy)]
struct Accept {
    json: bool,
    sse: bool,
}

impl Accept {
    fn of(headers: &HeaderMap) -> Self {
        let mut accept = Self {
            json: false,
            sse: false,
        };
        let mut any = false;
        for value in headers.get_all(header::ACCEPT) {
            let Ok(value) = value.to_str() else { continue };
            for range in value.split(',') {
                let media = range.split(';').next().unwrap_or("").trim();
                any = true;
                match media.to_ascii_lowercase().as_str() {
                    "application/json" | "application/*" => accept.json = true,
                    "text/event-stream" | "text/*" => accept.sse = true,
                    "*/*" => {
                        accept.json = true;
                        accept.sse = true;
                    }
                    _ => {}
                }
            }
        }
        if !any {
            return Self {
                json: true,
                sse: true,
            };
        }
        accept
    }

    /// Whether to answer as an event stream, given the form the server chose.
    fn wants_sse(self, server_sent_sse: bool) -> bool {
        match (self.json, self.sse) {
            (true, false) => false,
            (false, true) => true,
            _ => server_sent_sse,
        }
    }
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// Calls the server without the guard.
async fn pass_through<I, B>(inner: I, request: Request<Body>) -> Result<Response<Body>, I::Error>
where
    I: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    inner.oneshot(request).await.map(|r| r.map(Body::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_form_follows_accept() {
        let accept = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::ACCEPT, value.parse().unwrap());
            }
            Accept::of(&headers)
        };
        let both = accept(Some("application/json, text/event-stream"));
        assert!(both.wants_sse(true));
        assert!(!both.wants_sse(false));
        assert!(accept(Some("text/event-stream")).wants_sse(false));
        assert!(!accept(Some("application/json")).wants_sse(true));
        assert!(accept(None).wants_sse(true));
        assert!(!accept(Some("*/*;q=0.8")).wants_sse(false));
    }
}
