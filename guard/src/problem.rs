//! Every answer the guard gives instead of the handler's, rendered in one
//! place as `application/problem+json` (RFC 9457).
//!
//! Each problem's `type` is `urn:idempotency:<name>`; the names are those of
//! the status-code table in the crate docs. The `key` member echoes the key
//! when the request had a valid one. No problem ever carries data of another
//! scope.
//!
//! `type` is a URN, which `http::Uri` (and so the `problem_details` crate)
//! cannot hold, and `http-api-problem` keeps extension members in a hash
//! map, whose order changes from one answer to the next: an answer about
//! another scope's key must not differ in any byte from one about an absent
//! key. [`Problem`] is the small struct that does both right.

use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use serde::{Deserialize, Serialize};

use crate::KeyError;
use crate::headers::retry_after_value;

/// The media type of every problem answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem: `type` = `urn:idempotency:<name>`, `title`,
/// `status`, `detail`, and extension members in a fixed (sorted) order.
///
/// The service renders its own problems (`unauthorized`, `key-not-found`,
/// `bad-request`) with this type too, so every problem of the product has
/// the same shape.
///
/// ```
/// use http::StatusCode;
/// use idempotency_guard::problem::Problem;
///
/// let problem = Problem::new(StatusCode::NOT_FOUND, "key-not-found", "Key not found", "No record.")
///     .with("key", "k-1");
/// assert_eq!(
///     serde_json::to_string(&problem).unwrap(),
///     r#"{"type":"urn:idempotency:key-not-found","title":"Key not found","status":404,"detail":"No record.","key":"k-1"}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// `urn:idempotency:<name>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// Extension members (`key`, `advice`), sorted by name.
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// A problem named `name` (the part of `type` after `urn:idempotency:`).
    pub fn new(status: StatusCode, name: &str, title: &str, detail: &str) -> Self {
        Self {
            problem_type: format!("urn:idempotency:{name}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.to_owned(),
            extensions: serde_json::Map::new(),
        }
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Serialize) -> Self {
        if let Ok(value) = serde_json::to_value(value) {
            self.extensions.insert(name.to_owned(), value);
        }
        self
    }

    /// The problem's name: the part of `type` after `urn:idempotency:`.
    pub fn name(&self) -> Option<&str> {
        self.problem_type.strip_prefix("urn:idempotency:")
    }

    /// The response: this problem as JSON, with its status and the
    /// problem+json content type.
    pub fn into_response(self) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

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

    /// The problem's name: the part of `type` after `urn:idempotency:`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::KeyMissing => "key-missing",
            Self::KeyInvalid(_) => "key-invalid",
            Self::ScopeInvalid => "scope-invalid",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::BodyUnreadable => "body-unreadable",
            Self::KeyReused { .. } => "key-reused",
            Self::RequestInFlight { .. } => "request-in-flight",
            Self::OutcomeUnknown { .. } => "outcome-unknown",
            Self::ResponseNotStored { .. } => "response-not-stored",
            Self::StoreUnavailable { .. } => "store-unavailable",
            Self::BodyBufferFull { .. } => "body-buffer-full",
            Self::HandlerTimeout { .. } => "handler-timeout",
            Self::HandlerFailed { .. } => "handler-failed",
        }
    }

    /// The status code of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::KeyMissing | Self::KeyInvalid(_) | Self::ScopeInvalid | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::KeyReused { status, .. } => *status,
            Self::RequestInFlight { .. }
            | Self::OutcomeUnknown { .. }
            | Self::ResponseNotStored { .. } => StatusCode::CONFLICT,
            Self::StoreUnavailable { .. } | Self::BodyBufferFull { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::HandlerTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::HandlerFailed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn title_and_detail(&self) -> (&'static str, String) {
        match self {
            Self::KeyMissing => (
                "Idempotency-Key header required",
                "This route requires an Idempotency-Key header: send one unique key per operation and reuse it on every retry of that operation.".into(),
            ),
            Self::KeyInvalid(error) => (
                "Idempotency-Key header invalid",
                format!("{error}. A key is 1 to 255 visible ASCII characters, sent once, bare or as an RFC 8941 string."),
            ),
            Self::ScopeInvalid => (
                "Request scope invalid",
                "The scope of this request is empty, longer than 255 bytes, or holds a control character.".into(),
            ),
            Self::BodyTooLarge { limit } => (
                "Request body too large",
                format!("The request body exceeds the limit of {limit} bytes."),
            ),
            Self::BodyUnreadable => (
                "Request body unreadable",
                "The request body could not be read to its end.".into(),
            ),
            Self::KeyReused { .. } => (
                "Idempotency key reused",
                "This key was already used with a different request (method, path, query or body). Use a new key for a new operation.".into(),
            ),
            Self::RequestInFlight { .. } => (
                "Request in flight",
                "A request with this key is still being processed. Retry after the time in Retry-After to get its response.".into(),
            ),
            Self::OutcomeUnknown { .. } => (
                "Outcome unknown",
                "An earlier request with this key started but never completed, so whether it took effect is unknown. Do not resend blindly: reconcile first.".into(),
            ),
            Self::ResponseNotStored { .. } => (
                "Response not stored",
                "The request with this key ran, but its response was too large to store for replay. It will not run again.".into(),
            ),
            Self::StoreUnavailable { .. } => (
                "Idempotency store unavailable",
                "The idempotency store could not be reached, so the request was not processed. Retry later with the same key.".into(),
            ),
            Self::BodyBufferFull { .. } => (
                "Request bodies buffer full",
                "The server is holding as many request bodies as it may at once, so this request was not read or processed. Retry after the time in Retry-After with the same key.".into(),
            ),
            Self::HandlerTimeout { rolled_back: true, .. } => (
                "Handler timed out",
                "The request exceeded the maximum handler time and its effects were rolled back. Retrying with the same key is safe.".into(),
            ),
            Self::HandlerTimeout { rolled_back: false, .. } => (
                "Handler timed out",
                "The request exceeded the maximum handler time and was cut off; whether it took effect is unknown. Reconcile before resending.".into(),
            ),
            Self::HandlerFailed { .. } => (
                "Handler failed",
                "The request failed unexpectedly and its key was released. Retrying with the same key is safe.".into(),
            ),
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

    /// Renders the rejection as its problem+json response.
    pub fn into_response(self) -> Response<Body> {
        let (title, detail) = self.title_and_detail();
        let mut problem = Problem::new(self.status(), self.name(), title, &detail);
        if let Some(key) = self.key() {
            problem = problem.with("key", key);
        }
        let mut response = problem.into_response();
        if let Some(retry_after) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after_value(retry_after));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
