//! Every answer the product gives instead of a handler's, rendered in one
//! place as `application/problem+json` (RFC 9457).
//!
//! Each problem is declared once in [`types`] (name, status, title,
//! headers); [`Problem`] is its body, built from a [`ProblemType`] with
//! [`ProblemType::problem`] and turned into a response by its
//! [`IntoResponse`]. The guard's own refusals, [`Refusal`](crate::engine::Refusal),
//! render through their problem type here (`problem/refusal.rs`).
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
//!
//! ```
//! use idempotency_guard::problem::types;
//!
//! let problem = types::KEY_NOT_FOUND.problem("No record.").with("key", "k-1");
//! assert_eq!(
//!     serde_json::to_string(&problem).unwrap(),
//!     r#"{"type":"urn:idempotency:key-not-found","title":"Key not found","status":404,"detail":"No record.","key":"k-1"}"#
//! );
//! ```

mod refusal;
pub mod types;

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde::{Deserialize, Serialize};

use crate::headers::retry_after_value;

/// The media type of every problem answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` prefix of every problem.
pub const TYPE_PREFIX: &str = "urn:idempotency:";

/// A header that goes with a problem type wherever it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemHeader {
    /// `Retry-After`: the problem's hint
    /// ([`Problem::with_retry_after`]), else 1 second.
    RetryAfter,
    /// `WWW-Authenticate: Bearer`.
    BearerChallenge,
    /// `Connection: close`: the connection cannot be reused.
    ConnectionClose,
}

/// One problem type, as [`types`] declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    /// The usual status (see [`Problem::with_status`] for those that vary).
    pub status: StatusCode,
    /// The name: the part of `type` after `urn:idempotency:`.
    pub name: &'static str,
    /// The short summary of the problem type.
    pub title: &'static str,
    /// The headers every answer of this type carries.
    pub headers: &'static [ProblemHeader],
}

impl ProblemType {
    /// A problem of this type, with this request's `detail`.
    pub fn problem(&self, detail: impl Into<String>) -> Problem {
        Problem {
            problem_type: format!("{TYPE_PREFIX}{}", self.name),
            title: self.title.to_owned(),
            status: self.status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            headers: self.headers,
            retry_after: None,
        }
    }

    /// The `type` member: `urn:idempotency:<name>`.
    pub fn type_uri(&self) -> String {
        format!("{TYPE_PREFIX}{}", self.name)
    }
}

/// An RFC 9457 problem: `type` = `urn:idempotency:<name>`, `title`,
/// `status`, `detail`, and extension members (`key`, `advice`, …) in a
/// fixed (sorted) order. Every problem of the product (the guard's, the
/// service's, the gateway's) has this shape.
///
/// **Feature `openapi`:** `Problem` implements `utoipa::ToSchema` (the
/// derive is generated only with the feature, so docs.rs cannot label the
/// impl itself; this line does).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// `urn:idempotency:<name>`.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(schema_with = type_schema))]
    pub problem_type: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// Extension members (`key`, `advice`, …), sorted by name.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub extensions: serde_json::Map<String, serde_json::Value>,
    /// The headers its type declares (not part of the body).
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    headers: &'static [ProblemHeader],
    /// The `Retry-After` hint, where the type declares one.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    retry_after: Option<Duration>,
}

/// The OpenAPI schema of `type`: one of the URNs [`types::ALL`] declares.
#[cfg(feature = "openapi")]
fn type_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(
            "`urn:idempotency:<name>`: one of the problem types the product declares.",
        ))
        .enum_values(Some(types::ALL.iter().map(ProblemType::type_uri)))
        .build()
}

impl Problem {
    /// Adds an extension member.
    #[must_use]
    pub fn with(mut self, name: &str, value: impl Serialize) -> Self {
        if let Ok(value) = serde_json::to_value(value) {
            self.extensions.insert(name.to_owned(), value);
        }
        self
    }

    /// Answers with `status` instead of the type's usual one.
    #[must_use]
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status.as_u16();
        self
    }

    /// The `Retry-After` hint (rounded up to whole seconds), for a type that
    /// declares [`ProblemHeader::RetryAfter`].
    #[must_use]
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        self.retry_after = Some(hint);
        self
    }

    /// The problem's name: the part of `type` after `urn:idempotency:`.
    pub fn name(&self) -> Option<&str> {
        self.problem_type.strip_prefix(TYPE_PREFIX)
    }
}

/// The response: the problem as JSON, with its status, the problem+json
/// content type and its type's headers.
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = Response::new(body.into());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        for declared in self.headers {
            match declared {
                ProblemHeader::RetryAfter => {
                    let hint = self.retry_after.unwrap_or(Duration::from_secs(1));
                    headers.insert(header::RETRY_AFTER, retry_after_value(hint));
                }
                ProblemHeader::BearerChallenge => {
                    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                }
                ProblemHeader::ConnectionClose => {
                    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
            }
        }
        response
    }
}
