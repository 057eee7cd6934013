//! [`Rejection`]: why the guard answered instead of the handler, and the
//! problem each reason renders as.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;

use super::{ProblemType, types};
use crate::key::KeyError;

/// Why the guard answered instead of the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400 `key-missing`: the route requires a key and the request has none.
    KeyMissing,
    /// 400 `key-invalid`: the key is malformed or repeated.
    KeyInvalid(KeyError),
    /// 400 `scope-invalid`: the app's scope function gave an empty scope or
    /// one longer than 255 bytes.
    ScopeInvalid,
    /// 413 `body-too-large`: the request body exceeds the limit.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// 400 `body-unreadable`: the request body could not be read.
    BodyUnreadable,
    /// 409 (or the configured status) `key-reused`: the key was used with
    /// another request.
    KeyReused {
        /// The key.
        key: String,
        /// The configured mismatch status (409, or 422 as the IETF draft suggests).
        status: StatusCode,
    },
    /// 409 `request-in-flight`: the first request with this key still runs.
    RequestInFlight {
        /// The key.
        key: String,
        /// The `Retry-After` hint.
        retry_after: Duration,
    },
    /// 409 `outcome-unknown`: the earlier run was abandoned.
    OutcomeUnknown {
        /// The key.
        key: String,
    },
    /// 409 `response-not-stored`: the earlier run's response was too large
    /// to store.
    ResponseNotStored {
        /// The key.
        key: String,
    },
    /// 503 `store-unavailable`: the store failed or did not answer; the
    /// handler did not run.
    StoreUnavailable {
        /// The key, when the request had one.
        key: Option<String>,
        /// The `Retry-After` hint.
        retry_after: Duration,
    },
    /// 503 `body-buffer-full`: the bodies being buffered already fill the
    /// layer's budget (see
    /// [`IdempotencyLayer::with_max_buffered_bytes`](crate::IdempotencyLayer::with_max_buffered_bytes));
    /// nothing ran.
    BodyBufferFull {
        /// The key, when it was read before the body.
        key: Option<String>,
        /// The `Retry-After` hint.
        retry_after: Duration,
    },
    /// 504 `handler-timeout`: the guard cut the handler off at the maximum
    /// handler time.
    HandlerTimeout {
        /// The key.
        key: String,
        /// Whether the handler's writes were rolled back with the record
        /// (transactional mode): then a retry runs it again, safely.
        rolled_back: bool,
    },
    /// 500 `handler-failed`: the handler panicked, failed or sent a broken
    /// body; the key was released (and in transactional mode its writes
    /// rolled back).
    HandlerFailed {
        /// The key.
        key: String,
    },
}

impl Rejection {
    /// The answer for an engine's refusal of the request with `key`;
    /// `mismatch_status` is the status of `key-reused` (409 or 422).
    pub fn from_refusal(
        refusal: crate::engine::Refusal,
        key: &str,
        mismatch_status: StatusCode,
    ) -> Self {
        use crate::engine::Refusal;
        let key = key.to_owned();
        match refusal {
            Refusal::KeyReused => Self::KeyReused {
                key,
                status: mismatch_status,
            },
            Refusal::InFlight { retry_after } => Self::RequestInFlight { key, retry_after },
            Refusal::OutcomeUnknown => Self::OutcomeUnknown { key },
            Refusal::ResponseNotStored => Self::ResponseNotStored { key },
            Refusal::StoreUnavailable { retry_after } => Self::StoreUnavailable {
                key: Some(key),
                retry_after,
            },
            Refusal::TimedOut { rolled_back } => Self::HandlerTimeout { key, rolled_back },
            Refusal::Failed => Self::HandlerFailed { key },
        }
    }

    /// The problem type this rejection answers with.
    pub fn problem_type(&self) -> ProblemType {
        match self {
            Self::KeyMissing => types::KEY_MISSING,
            Self::KeyInvalid(_) => types::KEY_INVALID,
            Self::ScopeInvalid => types::SCOPE_INVALID,
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE,
            Self::BodyUnreadable => types::BODY_UNREADABLE,
            Self::KeyReused { .. } => types::KEY_REUSED,
            Self::RequestInFlight { .. } => types::REQUEST_IN_FLIGHT,
            Self::OutcomeUnknown { .. } => types::OUTCOME_UNKNOWN,
            Self::ResponseNotStored { .. } => types::RESPONSE_NOT_STORED,
            Self::StoreUnavailable { .. } => types::STORE_UNAVAILABLE,
            Self::BodyBufferFull { .. } => types::BODY_BUFFER_FULL,
            Self::HandlerTimeout { .. } => types::HANDLER_TIMEOUT,
            Self::HandlerFailed { .. } => types::HANDLER_FAILED,
        }
    }

    /// The problem's name: the part of `type` after `urn:idempotency:`.
    pub fn name(&self) -> &'static str {
        self.problem_type().name
    }

    /// The status code of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::KeyReused { status, .. } => *status,
            other => other.problem_type().status,
        }
    }

    /// What went wrong with this request.
    fn detail(&self) -> String {
        match self {
            Self::KeyMissing => "This route requires an Idempotency-Key header: send one unique key per operation and reuse it on every retry of that operation.".into(),
            Self::KeyInvalid(error) => format!("{error}. A key is 1 to 255 visible ASCII characters, sent once, bare or as an RFC 8941 string."),
            Self::ScopeInvalid => "The scope of this request is empty, longer than 255 bytes, or holds a control character.".into(),
            Self::BodyTooLarge { limit } => format!("The request body exceeds the limit of {limit} bytes."),
            Self::BodyUnreadable => "The request body could not be read to its end.".into(),
            Self::KeyReused { .. } => "This key was already used with a different request (method, path, query or body). Use a new key for a new operation.".into(),
            Self::RequestInFlight { .. } => "A request with this key is still being processed. Retry after the time in Retry-After to get its response.".into(),
            Self::OutcomeUnknown { .. } => "An earlier request with this key started but never completed, so whether it took effect is unknown. Do not resend blindly: reconcile first.".into(),
            Self::ResponseNotStored { .. } => "The request with this key ran, but its response was too large to store for replay. It will not run again.".into(),
            Self::StoreUnavailable { .. } => "The idempotency store could not be reached, so the request was not processed. Retry later with the same key.".into(),
            Self::BodyBufferFull { .. } => "The server is holding as many request bodies as it may at once, so this request was not read or processed. Retry after the time in Retry-After with the same key.".into(),
            Self::HandlerTimeout { rolled_back: true, .. } => "The request exceeded the maximum handler time and its effects were rolled back. Retrying with the same key is safe.".into(),
            Self::HandlerTimeout { rolled_back: false, .. } => "The request exceeded the maximum handler time and was cut off; whether it took effect is unknown. Reconcile before resending.".into(),
            Self::HandlerFailed { .. } => "The request failed unexpectedly and its key was released. Retrying with the same key is safe.".into(),
        }
    }

    fn key(&self) -> Option<&str> {
        match self {
            Self::KeyReused { key, .. }
            | Self::RequestInFlight { key, .. }
            | Self::OutcomeUnknown { key }
            | Self::ResponseNotStored { key }
            | Self::HandlerTimeout { key, .. }
            | Self::HandlerFailed { key } => Some(key),
            Self::StoreUnavailable { key, .. } | Self::BodyBufferFull { key, .. } => key.as_deref(),
            Self::KeyMissing
            | Self::KeyInvalid(_)
            | Self::ScopeInvalid
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RequestInFlight { retry_after, .. }
            | Self::StoreUnavailable { retry_after, .. }
            | Self::BodyBufferFull { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// The rejection's problem+json response.
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let mut problem = self
            .problem_type()
            .problem(self.detail())
            .with_status(self.status());
        if let Some(key) = self.key() {
            problem = problem.with("key", key);
        }
        if let Some(retry_after) = self.retry_after() {
            problem = problem.with_retry_after(retry_after);
        }
        problem.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::PROBLEM_JSON;
    use http::header;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_type_title_status_detail_key_and_retry_after() {
        let response = Rejection::RequestInFlight {
            key: "k-1".into(),
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
        let rejection = Rejection::KeyInvalid(KeyError::TooLong);
        assert_eq!(rejection.key(), None);
        assert_eq!(rejection.status(), StatusCode::BAD_REQUEST);
    }
}
