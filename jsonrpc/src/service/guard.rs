//! The guarded path of one call: its key and scope checked, then run
//! through the engine, with the work "call the server" ([`super::call`]);
//! a replay or a refusal rendered as the client's `Accept` asks.

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body as HttpBody;
use idempotency_guard::adapter::hand_run;
use idempotency_guard::engine::{Answer, Refusal};
use idempotency_guard::telemetry::Outcome;
use idempotency_guard::{KeyError, Scope, Store};
use tower::Service;

use super::call::{BoxError, ServerCall, call_server, pass_through};
use super::render::{refusal, replay};
use crate::accept::Accept;
use crate::config::{Config, MissingKey};
use crate::engine::{self, GuardedCall, kept};
use crate::envelope;

/// A guarded call: its key and scope checked, then run through the
/// engine; answers with the `outcome` label it is counted under.
pub(crate) async fn guard<S, I, B>(
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
    let rejected = |refused: &Refusal| {
        (
            Outcome::Rejected,
            Ok(refusal(refused, Some(&call.id), accept)),
        )
    };
    let key = match call.key {
        Ok(ref key) => key.clone(),
        Err(KeyError::Missing) if config.missing_key == MissingKey::PassThrough => {
            return (Outcome::Unguarded, pass_through(inner, request).await);
        }
        Err(KeyError::Missing) => return rejected(&Refusal::KeyMissing),
        Err(error) => return rejected(&Refusal::KeyInvalid(error)),
    };
    let (parts, body) = request.into_parts();
    let Ok(scope) = Scope::new((config.scope)(&parts)) else {
        return rejected(&Refusal::ScopeInvalid);
    };
    // Known while it runs, so that the agent's `notifications/cancelled`
    // for it does not reach the server (see [`crate::running::Running`]).
    let running = config.running.enter(&parts.headers, &call.id);
    let mut request = Request::from_parts(parts, body);
    let guarded = GuardedCall {
        scope,
        key: key.clone(),
        fingerprint: call.fingerprint,
        target: call.tool.clone().unwrap_or_else(|| call.method.clone()),
        method: call.method,
    };
    let call_key = key.clone();
    let (id, limit) = (call.id.clone(), config.stored_response_limit);
    let (answer, counted) = engine::run(engine, guarded, move |context| async move {
        let _running = running;
        // The server's handler reads the run's handle from the request's
        // extensions (an axum handler extracts `run: Run`).
        hand_run(request.extensions_mut(), &context);
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
        Answer::Ran { reply, .. } => return (counted, reply),
        Answer::Replay(stored) => match kept(stored) {
            Some(stored) => replay(&stored, &call.id, key, accept),
            None => refusal(&Refusal::ResponseNotStored { key }, Some(&call.id), accept),
        },
        Answer::Refused(refused) => refusal(&refused, Some(&call.id), accept),
    };
    (counted, Ok(response))
}
