//! Calling the server: for a claimed call, the work the engine runs (call
//! it, capture its final JSON-RPC response from a JSON body or an event
//! stream, say whether it is kept); for anything else, a plain pass.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{Request, Response, header};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use idempotency_guard::adapter::{Captured, capture, resume};
use idempotency_guard::engine::{Refusal, Settle};
use idempotency_guard::{IdempotencyKey, OutcomeUnknown};
use serde_json::value::RawValue;
use tower::{Service, ServiceExt};

use super::render::render;
use crate::accept::Accept;
use crate::engine::KeptAnswer;
use crate::outcome::settle;
use crate::refusal::to_json_with;
use crate::reply::is_response_to;
use crate::sse::{SseScanner, SseStripper, is_event_stream};

/// The boxed error of a body.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What [`call_server`] needs to know of the call.
pub(crate) struct ServerCall {
    pub(crate) id: Box<RawValue>,
    pub(crate) key: IdempotencyKey,
    /// The stored-response limit.
    pub(crate) limit: usize,
    pub(crate) accept: Accept,
}

/// The work the engine runs for a claimed call: call the server, then
/// capture its final JSON-RPC response (from a JSON body or an event
/// stream) and say whether it is kept.
pub(crate) async fn call_server<I, B>(
    inner: I,
    request: Request<Body>,
    call: ServerCall,
) -> Settle<Result<Response<Body>, I::Error>, KeptAnswer>
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
        let message = to_json_with(&Refusal::OutcomeUnknown { key }, Some(&id), data);
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
/// unknown), kept as [`settle`] says.
async fn capture_json<E>(
    parts: http::response::Parts,
    body: Body,
    id: &RawValue,
    limit: usize,
) -> Settle<Result<Response<Body>, E>, KeptAnswer> {
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
    if !is_response_to(&bytes, id) {
        return Settle::Release {
            reply,
            keep_writes: false,
        };
    }
    settle(&bytes)
        .map_response(|()| KeptAnswer {
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
) -> Settle<Result<Response<Body>, E>, KeptAnswer> {
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
            return settle(&response)
                .map_response(|()| KeptAnswer {
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

/// Calls the server without the guard.
pub(crate) async fn pass_through<I, B>(
    inner: I,
    request: Request<Body>,
) -> Result<Response<Body>, I::Error>
where
    I: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    inner.oneshot(request).await.map(|r| r.map(Body::new))
}
