//! The one module that runs the guard's engine: a guarded call in (scope,
//! key, fingerprint, the work), this crate's own [`Answer`] out. The work
//! settles with the engine's own [`Settle`], keeping a [`Stored`] JSON-RPC
//! response (turned into the record's response here).

use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotency_guard::engine::{self as guard, Engine, Job, Refusal, Settle};
use idempotency_guard::telemetry::Outcome;
use idempotency_guard::{Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};

use crate::refusal::RpcRefusal;

/// A JSON-RPC answer as kept: what the work keeps, and what a replay gets.
pub(crate) struct Stored {
    /// The JSON-RPC response as stored.
    pub(crate) response: Bytes,
    /// Whether the server sent it as an event stream.
    pub(crate) sse: bool,
}

/// The engine's [`guard::Answer`], its replay and refusal in this crate's
/// terms.
pub(crate) enum Answer<T> {
    /// The work ran for this caller.
    Ran(T),
    /// The work ran before: its stored answer (`None`: too large to store).
    Replay(Option<Stored>),
    /// The work did not run.
    Refused(RpcRefusal),
}

/// What identifies one guarded call to the engine.
pub(crate) struct GuardedCall {
    pub(crate) scope: Scope,
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    /// The JSON-RPC method (shown by the status service as the method).
    pub(crate) method: String,
    /// The tool, or the method again (shown as the path, and the metrics' route).
    pub(crate) target: String,
}

/// Runs `work` at most once for the call's key; answers with how it ended
/// and the `outcome` label the call is counted under.
pub(crate) async fn run<S, F, Fut, T>(
    engine: &Engine<S>,
    call: GuardedCall,
    work: F,
) -> (Answer<T>, Outcome)
where
    S: Store,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Settle<T, Stored>> + Send + 'static,
    T: Send + 'static,
{
    let job = Job::new(call.scope, call.key, call.fingerprint)
        .with_request(call.method, call.target.clone())
        .with_route(call.target);
    let answer = engine
        .run(job, move |_context| async move {
            work().await.map_response(stored_response)
        })
        .await;
    let counted = answer.outcome();
    let answer = match answer {
        guard::Answer::Ran { reply, .. } => Answer::Ran(reply),
        guard::Answer::Replay(stored) => Answer::Replay(stored.body.map(|response| Stored {
            sse: is_sse(&stored.headers),
            response,
        })),
        guard::Answer::Refused(refusal) => Answer::Refused(refused(refusal)),
    };
    (answer, counted)
}

/// The record's response: status 200, the form the server answered in, and
/// the JSON-RPC response alone (never the notifications around it).
fn stored_response(Stored { response, sse }: Stored) -> StoredResponse {
    let mut headers = HeaderMap::new();
    let form = if sse {
        "text/event-stream"
    } else {
        "application/json"
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(form));
    StoredResponse {
        status: StatusCode::OK,
        headers,
        body: Some(response),
    }
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|form| form.as_bytes().starts_with(b"text/event-stream"))
}

fn refused(refusal: Refusal) -> RpcRefusal {
    match refusal {
        Refusal::KeyReused { .. } => RpcRefusal::KeyReused,
        Refusal::RequestInFlight { retry_after, .. } => RpcRefusal::RequestInFlight { retry_after },
        Refusal::OutcomeUnknown { .. } => RpcRefusal::OutcomeUnknown,
        Refusal::ResponseNotStored { .. } => RpcRefusal::ResponseNotStored,
        Refusal::StoreUnavailable { retry_after, .. } => {
            RpcRefusal::StoreUnavailable { retry_after }
        }
        Refusal::HandlerTimeout { .. } => RpcRefusal::HandlerTimeout,
        Refusal::HandlerFailed { .. } => RpcRefusal::HandlerFailed,
        // A refusal added to the engine later: fail closed, as unknown.
        _ => RpcRefusal::OutcomeUnknown,
    }
}
