//! The one module that runs the guard's engine: a guarded call in (scope,
//! key, fingerprint, the work), the engine's own [`Answer`] out. The work
//! settles with the engine's own [`Settle`], keeping a [`KeptAnswer`]
//! (turned into the record's response here, and back for a replay).

use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use idempotency_guard::engine::{Answer, Engine, Job, RunContext, Settle};
use idempotency_guard::telemetry::Outcome;
use idempotency_guard::{Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};

/// A JSON-RPC answer as kept: what the work keeps, and what a replay gets.
pub(crate) struct KeptAnswer {
    /// The JSON-RPC response as stored.
    pub(crate) response: Bytes,
    /// Whether the server sent it as an event stream.
    pub(crate) sse: bool,
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

/// Runs `work` at most once for the call's key, handing it the run's
/// context (its [`Run`](idempotency_guard::engine::Run), for the server's
/// handler); answers with how it ended and the `outcome` label the call is
/// counted under.
pub(crate) async fn run<S, F, Fut, T>(
    engine: &Engine<S>,
    call: GuardedCall,
    work: F,
) -> (Answer<T>, Outcome)
where
    S: Store,
    F: FnOnce(RunContext) -> Fut + Send + 'static,
    Fut: Future<Output = Settle<T, KeptAnswer>> + Send + 'static,
    T: Send + 'static,
{
    let job = Job::new(call.scope, call.key, call.fingerprint)
        .with_request(call.method, call.target.clone())
        .with_route(call.target);
    let answer = engine
        .run(job, move |context| async move {
            work(context).await.map_response(stored_response)
        })
        .await;
    let counted = answer.outcome();
    (answer, counted)
}

/// A replayed record's answer as kept (`None`: it was too large to store).
pub(crate) fn kept(stored: StoredResponse) -> Option<KeptAnswer> {
    let sse = is_sse(&stored.headers);
    stored.body.map(|response| KeptAnswer { response, sse })
}

/// The record's response: status 200, the form the server answered in, and
/// the JSON-RPC response alone (never the notifications around it).
fn stored_response(KeptAnswer { response, sse }: KeptAnswer) -> StoredResponse {
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
