//! The service's problem answers: each one a type declared in
//! [`idempotency_guard::problem::types`] with this service's detail, so
//! that every problem of the product has one name, status, title and
//! shape.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use idempotency_client::status::Advice;
use idempotency_guard::problem::types;

/// The body of every problem answer (the guard's type, which the OpenAPI
/// document describes).
pub(crate) use idempotency_guard::problem::Problem;

/// Why the service answered with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ApiProblem {
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

impl ApiProblem {
    /// The declared problem type and this answer's detail.
    fn problem(&self) -> Problem {
        match self {
            Self::Unauthorized => types::UNAUTHORIZED.problem(
                "Send `Authorization: Bearer <token>` with a token issued for your scope.",
            ),
            Self::KeyNotFound { key } => types::KEY_NOT_FOUND
                .problem(
                    "No request with this key ran in your scope, or it was released: sending it again with the same key is safe.",
                )
                .with("key", key)
                .with("advice", Advice::Retry),
            Self::BadRequest(detail) => types::BAD_REQUEST.problem(detail.clone()),
            Self::BodyTooLarge { limit } => types::BODY_TOO_LARGE
                .problem(format!("The request body exceeds the limit of {limit} bytes.")),
            Self::RouteNotFound => types::NOT_FOUND.problem(
                "No such endpoint. Keys go in one path segment: percent-encode `/` and other reserved characters.",
            ),
            Self::MethodNotAllowed => types::METHOD_NOT_ALLOWED
                .problem("This endpoint does not answer this method."),
            Self::StoreUnavailable => types::STORE_UNAVAILABLE
                .problem("The idempotency store could not be reached. Ask again shortly.")
                .with_retry_after(Duration::from_secs(1)),
        }
    }
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}
