//! Each [`Refusal`] tied to its problem type, and rendered as
//! problem+json: the HTTP adapters' wire (the axum layer, the webhook
//! receivers, the gateway). The other adapters render the same refusal in
//! their own wire (`idempotency_grpc`'s status, `idempotency_jsonrpc`'s
//! error object), each from [`Refusal::problem_type`].

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::{Problem, ProblemType, types};
use crate::refusal::Refusal;

impl Refusal {
    /// The problem type this refusal answers with: its name, usual status,
    /// title and headers (one exhaustive match: a new refusal is declared
    /// here with its problem, or the crate does not compile).
    pub fn problem_type(&self) -> ProblemType {
        match self {
            Self::KeyMissing => types::KEY_MISSING,
            Self::KeyInvalid(_) => types::KEY_INVALID,
            Self::ScopeInvalid => types::SCOPE_INVALID,
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE,
            Self::BodyUnreadable => types::BODY_UNREADABLE,
            Self::BodyBufferFull { .. } => types::BODY_BUFFER_FULL,
            Self::BatchNotGuarded => types::BATCH_NOT_GUARDED,
            Self::LayerMissing => types::LAYER_MISSING,
            Self::TransactionUnavailable => types::TRANSACTION_UNAVAILABLE,
            Self::KeyReused { .. } => types::KEY_REUSED,
            Self::RequestInFlight { .. } => types::REQUEST_IN_FLIGHT,
            Self::OutcomeUnknown { .. } => types::OUTCOME_UNKNOWN,
            Self::ResponseNotStored { .. } => types::RESPONSE_NOT_STORED,
            Self::StoreUnavailable { .. } => types::STORE_UNAVAILABLE,
            Self::HandlerTimeout { .. } => types::HANDLER_TIMEOUT,
            Self::HandlerFailed { .. } => types::HANDLER_FAILED,
        }
    }

    /// The problem's name: the part of `type` after `urn:idempotency:`.
    pub fn name(&self) -> &'static str {
        self.problem_type().name
    }

    /// The problem+json body of this refusal over HTTP: its type, the
    /// `detail` a person reads, the key in `key` (when valid) and the
    /// `Retry-After` hint. `key-reused` answers with its type's 409; the
    /// axum layer sets the configured status with
    /// [`Problem::with_status`].
    pub fn problem(&self) -> Problem {
        let mut problem = self.problem_type().problem(self.detail());
        if let Some(key) = self.key() {
            problem = problem.with("key", key.as_str());
        }
        if let Some(retry_after) = self.retry_after() {
            problem = problem.with_retry_after(retry_after);
        }
        problem
    }

    /// What went wrong with this request, as HTTP tells it.
    fn detail(&self) -> String {
        match self {
            Self::KeyMissing => "This route requires an Idempotency-Key header: send one unique key per operation and reuse it on every retry of that operation.".into(),
            Self::KeyInvalid(error) => format!("{error}. A key is 1 to 255 visible ASCII characters, sent once, bare or as an RFC 8941 string."),
            Self::ScopeInvalid => "The scope of this request is empty, longer than 255 bytes, or holds a control character.".into(),
            Self::BodyTooLarge { limit } => format!("The request body exceeds the limit of {limit} bytes."),
            Self::BodyUnreadable => "The request body could not be read to its end.".into(),
            Self::BodyBufferFull { .. } => "The server is holding as many request bodies as it may at once, so this request was not read or processed. Retry after the time in Retry-After with the same key.".into(),
            Self::BatchNotGuarded => "A JSON-RPC batch may not hold a guarded call: send each guarded call on its own.".into(),
            Self::LayerMissing => "The server has no idempotency layer in front of this handler, so the request's scope is unknown.".into(),
            Self::TransactionUnavailable => "The handler asked for the request's transaction, but the route is not guarded in transactional mode or the transaction is already in use.".into(),
            Self::KeyReused { .. } => "This key was already used with a different request (method, path, query or body). Use a new key for a new operation.".into(),
            Self::RequestInFlight { .. } => "A request with this key is still being processed. Retry after the time in Retry-After to get its response.".into(),
            Self::OutcomeUnknown { .. } => "An earlier request with this key started but never completed, so whether it took effect is unknown. Do not resend blindly: reconcile first.".into(),
            Self::ResponseNotStored { .. } => "The request with this key ran, but its response was too large to store for replay. It will not run again.".into(),
            Self::StoreUnavailable { .. } => "The idempotency store could not be reached, so the request was not processed. Retry later with the same key.".into(),
            Self::HandlerTimeout { rolled_back: true, .. } => "The request exceeded the maximum handler time and its effects were rolled back. Retrying with the same key is safe.".into(),
            Self::HandlerTimeout { rolled_back: false, .. } => "The request exceeded the maximum handler time and was cut off; whether it took effect is unknown. Reconcile before resending.".into(),
            Self::HandlerFailed { .. } => "The request failed unexpectedly and its key was released. Retrying with the same key is safe.".into(),
        }
    }

    /// The problem+json response, with `key-reused` answered with
    /// `mismatch_status` (409, or 422 as the IETF draft suggests) and
    /// every other refusal with its type's status.
    pub fn into_response_with(self, mismatch_status: StatusCode) -> Response {
        let problem = self.problem();
        if matches!(self, Self::KeyReused { .. }) {
            problem.with_status(mismatch_status).into_response()
        } else {
            problem.into_response()
        }
    }
}

/// The refusal's problem+json response (`key-reused` with its type's 409;
/// the axum layer answers the configured status through
/// [`Refusal::into_response_with`]).
impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::KeyError;
    use crate::problem::PROBLEM_JSON;
    use http::header;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_type_title_status_detail_key_and_retry_after() {
        let response = Refusal::RequestInFlight {
            key: "k-1".parse().expect("a key"),
            retry_after: Duration::from_millis(1500),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "urn:idempotency:request-in-flight");
        assert_eq!(json["status"], 409);
        assert_eq!(json["key"], "k-1");
        assert!(json["title"].is_string() && json["detail"].is_string());
    }

    #[test]
    fn invalid_keys_are_not_echoed() {
        let refusal = Refusal::KeyInvalid(KeyError::TooLong);
        assert_eq!(refusal.key(), None);
        assert_eq!(refusal.problem().status, 400);
    }

    #[test]
    fn only_key_reused_takes_the_mismatch_status() {
        let key = || "k".parse().expect("a key");
        let reused = Refusal::KeyReused { key: key() };
        let response = reused.into_response_with(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let unknown = Refusal::OutcomeUnknown { key: key() };
        let response = unknown.into_response_with(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.status(), StatusCode::CONFLICT);
    }
}
