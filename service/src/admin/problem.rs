//! The admin API's problems: each refusal's status, name, title, detail
//! and headers, and the `result` its audit line and counter carry.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use idempotency_guard::problem::Problem as ProblemBody;

/// Why the admin API answered with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminProblem {
    /// 401 `unauthorized`: no admin token, or an unknown one (a scope
    /// token included).
    Unauthorized,
    /// 403 `scope-forbidden`: the admin token may not act on this scope.
    ScopeForbidden {
        /// The scope asked for.
        scope: String,
    },
    /// 400 `bad-request`: the request is malformed; the detail says how.
    BadRequest(String),
    /// 404 `key-not-found`: no record of this key in this scope.
    KeyNotFound {
        /// The key asked for.
        key: String,
    },
    /// 409 `request-in-flight`: the record's lease is live; it is never
    /// deleted.
    InFlight {
        /// The key.
        key: String,
    },
    /// 409 `outcome-unknown`: the record is abandoned; forgetting it needs
    /// `?force=true` (or `release`).
    Abandoned {
        /// The key.
        key: String,
    },
    /// 409 `record-completed`: `release` frees abandoned keys only; a
    /// completed record is forgotten with `DELETE`.
    Completed {
        /// The key.
        key: String,
    },
    /// 503 `store-unavailable`.
    StoreUnavailable,
}

impl AdminProblem {
    /// The `result` label and audit field of this refusal.
    pub(super) fn result(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::ScopeForbidden { .. } => "forbidden",
            Self::BadRequest(_) => "bad-request",
            Self::KeyNotFound { .. } => "not-found",
            Self::InFlight { .. } => "refused-in-flight",
            Self::Abandoned { .. } => "refused-abandoned",
            Self::Completed { .. } => "refused-completed",
            Self::StoreUnavailable => "store-unavailable",
        }
    }
}

impl IntoResponse for AdminProblem {
    fn into_response(self) -> Response {
        let (status, name, title, detail) = match &self {
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "Send `Authorization: Bearer <token>` with an admin token (scope tokens are not admin tokens).".to_owned(),
            ),
            Self::ScopeForbidden { scope } => (
                StatusCode::FORBIDDEN,
                "scope-forbidden",
                "Scope forbidden",
                format!("This admin token may not act on scope {scope:?}."),
            ),
            Self::BadRequest(detail) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request", detail.clone()),
            Self::KeyNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "key-not-found",
                "Key not found",
                "No record of this key in this scope.".to_owned(),
            ),
            Self::InFlight { .. } => (
                StatusCode::CONFLICT,
                "request-in-flight",
                "Request in flight",
                "The record's handler is running (its lease is live): it is never deleted. Ask again once it finished or its lease lapsed.".to_owned(),
            ),
            Self::Abandoned { .. } => (
                StatusCode::CONFLICT,
                "outcome-unknown",
                "Outcome unknown",
                "The record is abandoned: its handler may or may not have had effects. Reconcile, then forget it with `?force=true` or free it with `POST .../release`.".to_owned(),
            ),
            Self::Completed { .. } => (
                StatusCode::CONFLICT,
                "record-completed",
                "Record completed",
                "`release` frees abandoned keys; forget a completed record with `DELETE`.".to_owned(),
            ),
            Self::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                "The idempotency store could not be reached. Try again shortly.".to_owned(),
            ),
        };
        let mut body = ProblemBody::new(status, name, title, &detail);
        match &self {
            Self::KeyNotFound { key }
            | Self::InFlight { key }
            | Self::Abandoned { key }
            | Self::Completed { key } => body = body.with("key", key),
            _ => {}
        }
        let mut response = body.into_response();
        match self {
            Self::Unauthorized => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::StoreUnavailable => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            }
            _ => {}
        }
        response
    }
}
