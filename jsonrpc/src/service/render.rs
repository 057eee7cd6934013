//! An answer the layer writes itself, as one JSON-RPC message with HTTP
//! 200, JSON or an event stream as the client's `Accept` asks: a replay
//! under the retry's own `id`, or a refusal.

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use idempotency_guard::engine::Refusal;
use idempotency_guard::{IDEMPOTENT_REPLAYED, IdempotencyKey};
use serde_json::value::RawValue;

use crate::accept::Accept;
use crate::engine::KeptAnswer;
use crate::refusal::to_json;
use crate::reply::replayed;
use crate::sse::sse_event;

/// The stored answer under the retry's own `id`, marked replayed, in the
/// form the retry accepts.
pub(crate) fn replay(
    stored: &KeptAnswer,
    id: &RawValue,
    key: IdempotencyKey,
    accept: Accept,
) -> Response<Body> {
    let Ok(response) = replayed(&stored.response, id) else {
        tracing::error!("a stored JSON-RPC answer does not parse; not replayed");
        return refusal(&Refusal::HandlerFailed { key }, Some(id), accept);
    };
    let mut response = render(&response, accept.wants_sse(stored.sse));
    response
        .headers_mut()
        .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// A refusal as a JSON-RPC error, with HTTP 200 (see
/// [`crate::refusal`]).
pub(crate) fn refusal(refusal: &Refusal, id: Option<&RawValue>, accept: Accept) -> Response<Body> {
    render(&to_json(refusal, id), accept.wants_sse(false))
}

/// One JSON-RPC message as an HTTP 200 answer, JSON or an event stream.
pub(crate) fn render(message: &Bytes, sse: bool) -> Response<Body> {
    let (body, form) = if sse {
        (sse_event(message), "text/event-stream")
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
