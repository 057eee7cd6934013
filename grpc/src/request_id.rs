//! Keys carried in the request message (AIP-155's `request_id`), for typed
//! handlers: [`run`].

use std::future::Future;

use http::HeaderValue;
use idempotency_guard::engine::{Answer, Refusal, Settle};
use idempotency_guard::{
    Engine, IDEMPOTENT_REPLAYED, IdempotencyKey, Scope, Store, StoredResponse,
};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::engine::{self, Call};
use crate::exchange::Exchange;
use crate::layer::CallScope;
use crate::outcome::{FINAL_STATUS, settle};
use crate::refusal::to_status;

/// Runs `work` at most once per key that `key` reads from the request
/// message (AIP-155: `|m| m.request_id.clone()`), on `engine`, and answers
/// with its result, or with the stored result of the first run, or with
/// the guard's refusal as a status (see [`crate::refusal`]).
///
/// The scope and the full method name come from the [`CallScope`] that
/// [`crate::GrpcIdempotencyLayer`] puts in every request's extensions:
/// the layer must be in front of the server (it need not guard this
/// method). The fingerprint covers the method and the encoded request
/// message; what is kept follows [`crate::outcome::settle`], as for the
/// layer, and a replayed answer carries `idempotent-replayed: true`.
///
/// ```ignore
/// async fn refund_payment(&self, request: Request<RefundPaymentRequest>)
///     -> Result<Response<Refund>, Status>
/// {
///     let refunds = self.refunds.clone();
///     let payment = request.get_ref().payment_id.clone();
///     idempotency_grpc::run(&self.engine, &request, |m| m.request_id.clone(), move || async move {
///         Ok(Response::new(refunds.refund(&payment).await?))
///     })
///     .await
/// }
/// ```
///
/// # Errors
///
/// The work's own status, or the guard's: `INVALID_ARGUMENT` for an
/// empty or malformed key, `INTERNAL` `layer-missing` without the layer,
/// and the refusals of [`crate::refusal`].
pub async fn run<S, M, R, K, W, Fut>(
    engine: &Engine<S>,
    request: &Request<M>,
    key: K,
    work: W,
) -> Result<Response<R>, Status>
where
    S: Store,
    M: prost::Message,
    R: prost::Message + Default + Send + 'static,
    K: FnOnce(&M) -> String,
    W: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<R>, Status>> + Send + 'static,
{
    let raw = key(request.get_ref());
    let key = match IdempotencyKey::from_raw(&raw) {
        Ok(key) => key,
        Err(_) if raw.is_empty() => return Err(to_status(&Refusal::KeyMissing)),
        Err(error) => return Err(to_status(&Refusal::KeyInvalid(error))),
    };
    let Some(scope) = request.extensions().get::<CallScope>() else {
        return Err(to_status(&Refusal::LayerMissing));
    };
    let Ok(valid_scope) = Scope::new(scope.scope()) else {
        return Err(to_status(&Refusal::ScopeInvalid));
    };
    let message = request.get_ref().encode_to_vec();
    let call = Call {
        scope: valid_scope,
        key: key.clone(),
        method: scope.method(),
        message: &message,
    };
    let (ended, _outcome) = engine::run(engine, call, move |_context| async move {
        settle_result(work().await)
    })
    .await;
    match ended {
        Answer::Ran { reply, .. } => reply,
        Answer::Replay(stored) => replay(Exchange::from_stored(stored), key),
        Answer::Refused(refusal) => Err(to_status(&refusal)),
    }
}

/// Keeps or releases a typed handler's result.
fn settle_result<R: prost::Message>(
    result: Result<Response<R>, Status>,
) -> Settle<Result<Response<R>, Status>, Option<StoredResponse>> {
    match result {
        Ok(response) => {
            let (metadata, message, extensions) = response.into_parts();
            let exchange = Exchange {
                headers: metadata.clone().into_headers(),
                message: message.encode_to_vec().into(),
                trailers: None,
            };
            Settle::Complete {
                response: Some(exchange.to_stored()),
                reply: Ok(Response::from_parts(metadata, message, extensions)),
            }
        }
        Err(mut status) => {
            let marked_final = status.metadata_mut().remove(FINAL_STATUS).is_some();
            settle(Some(status.code()), marked_final)
                .map_response(|()| {
                    let answer: http::Response<()> = status.clone().into_http();
                    let exchange = Exchange {
                        headers: answer.into_parts().0.headers,
                        message: bytes::Bytes::new(),
                        trailers: None,
                    };
                    Some(exchange.to_stored())
                })
                .map_reply(|()| Err(status))
        }
    }
}

/// A typed handler's stored result, marked replayed.
fn replay<R: prost::Message + Default>(
    exchange: Option<Exchange>,
    key: IdempotencyKey,
) -> Result<Response<R>, Status> {
    let failed = |key| to_status(&Refusal::HandlerFailed { key });
    let Some(exchange) = exchange else {
        return Err(failed(key));
    };
    let mut headers = exchange.headers;
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    if let Some(status) = Status::from_header_map(&headers) {
        return Err(status);
    }
    let message = R::decode(exchange.message).map_err(|_| failed(key))?;
    Ok(Response::from_parts(
        MetadataMap::from_headers(headers),
        message,
        http::Extensions::new(),
    ))
}
