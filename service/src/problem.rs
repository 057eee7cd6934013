//! The service's problem answers, rendered in one place with the guard's
//! [`Problem`](idempotency_guard::problem::Problem), so that every problem
//! of the product has one shape.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use idempotency_client::status::Advice;
use idempotency_guard::problem::Problem as ProblemBody;
use serde::Serialize;
use utoipa::ToSchema;

/// Why the service answered with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiProblem {
    /// 401 `unauthorized`: no bearer token, or an unknown one.
    Unauthorized,
    /// 404 `key-not-found`: no record in this scope; `advice: retry`.
    KeyNotFound {
        /// The key asked for.
        key: String,
    },
    /// 400 `bad-request`: the request is malformed; the detail says how.
    BadRequest(String),
    /// 413 `body-too-large`: the request body exceeds the limit.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// 503 `store-unavailable`: the store failed or did not answer.
    StoreUnavailable,
    /// 404 `not-found`: no such endpoint (a key with an unencoded `/`
    /// lands here: percent-encode it).
    RouteNotFound,
    /// 405 `method-not-allowed`: the endpoint exists, not with this method
    /// (answered before any token check). A too-long target or head is
    /// answered 414 `uri-too-long` or 431 `headers-too-large` by the
    /// server, before routing (see `idempotency_guard::server`, which also
    /// lists what hyper answers itself, with an empty body).
    MethodNotAllowed,
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        let (status, name, title, detail) = match &self {
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "Send `Authorization: Bearer <token>` with a token issued for your scope.".to_owned(),
            ),
            Self::KeyNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "key-not-found",
                "Key not found",
                "No request with this key ran in your scope, or it was released: sending it again with the same key is safe."
                    .to_owned(),
            ),
            Self::BadRequest(detail) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request", detail.clone()),
            Self::BodyTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("The request body exceeds the limit of {limit} bytes."),
            ),
            Self::RouteNotFound => (
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "No such endpoint. Keys go in one path segment: percent-encode `/` and other reserved characters.".to_owned(),
            ),
            Self::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "This endpoint does not answer this method.".to_owned(),
            ),
            Self::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                "The idempotency store could not be reached. Ask again shortly.".to_owned(),
            ),
        };
        let mut body = ProblemBody::new(status, name, title, &detail);
        if let Self::KeyNotFound { key } = &self {
            body = body.with("key", key).with("advice", Advice::Retry);
        }
        let mut response = body.into_response();
        match self {
            Self::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::StoreUnavailable => {
                let retry = Duration::from_secs(1).as_secs();
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry));
            }
            _ => {}
        }
        response
    }
}

/// An RFC 9457 problem, as the service (and the guard) sends it with
/// `Content-Type: application/problem+json`. For the OpenAPI document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// `urn:idempotency:<name>`.
    #[serde(rename = "type")]
    #[schema(pattern = "^urn:idempotency:[a-z-]+$")]
    pub problem_type: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// The key the request named, when it named a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// On `key-not-found`: `retry`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<Advice>,
}
