//! The admin API's problems: each refusal's status, name, title, detail
//! and headers, and the `result` its audit line and counter carry.

use axum::response::{IntoResponse, Response};
use idempotency_guard::problem::{Problem, types};

/// Why the admin API answered with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum AdminProblem {
    /// 401 `unauthorized`: no admin token, or an unknown one (a scope
    /// token included).
    Unauthorized,
    /// 401 `unauthorized`: the console session ended (signed out,
    /// expired, or the service restarted).
    SessionEnded,
    /// 403 `origin-refused`: a write signed in by a console session
    /// without the console's `Origin`.
    OriginRefused,
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
    /// 409 `record-completed`: a completed record's outcome is known;
    /// there is nothing to reconcile.
    NothingToReconcile {
        /// The key.
        key: String,
    },
    /// 422 `reason-required`: a state-changing call without a reason (or
    /// with one that is empty, over 500 characters or holds a control
    /// character); the detail says which.
    ReasonRequired(String),
    /// 503 `store-unavailable`.
    StoreUnavailable,
}

impl AdminProblem {
    /// The `result` label and audit field of this refusal.
    pub(super) fn result(&self) -> &'static str {
        match self {
            Self::Unauthorized | Self::SessionEnded => "unauthorized",
            Self::OriginRefused => "origin-refused",
            Self::ScopeForbidden { .. } => "forbidden",
            Self::BadRequest(_) => "bad-request",
            Self::KeyNotFound { .. } => "not-found",
            Self::InFlight { .. } => "refused-in-flight",
            Self::Abandoned { .. } => "refused-abandoned",
            Self::Completed { .. } | Self::NothingToReconcile { .. } => "refused-completed",
            Self::ReasonRequired(_) => "reason-required",
            Self::StoreUnavailable => "store-unavailable",
        }
    }
}

impl AdminProblem {
    /// The declared problem type and this answer's detail.
    fn problem(&self) -> Problem {
        match self {
            Self::Unauthorized => types::UNAUTHORIZED.problem(
                "Send `Authorization: Bearer <token>` with an admin token (scope tokens are not admin tokens).",
            ),
            Self::SessionEnded => types::UNAUTHORIZED.problem(
                "The console session ended (signed out, idle too long, or the service restarted): sign in again.",
            ),
            Self::OriginRefused => types::ORIGIN_REFUSED.problem(
                "A write signed in by a console session must come from the console's page (its `Origin`).",
            ),
            Self::ScopeForbidden { scope } => types::SCOPE_FORBIDDEN
                .problem(format!("This admin token may not act on scope {scope:?}.")),
            Self::BadRequest(detail) => types::BAD_REQUEST.problem(detail.clone()),
            Self::KeyNotFound { key } => types::KEY_NOT_FOUND
                .problem("No record of this key in this scope.")
                .with("key", key),
            Self::InFlight { key } => types::REQUEST_IN_FLIGHT
                .problem("The record's handler is running (its lease is live): it is never deleted. Ask again once it finished or its lease lapsed.")
                .with("key", key),
            Self::Abandoned { key } => types::OUTCOME_UNKNOWN
                .problem("The record is abandoned: its handler may or may not have had effects. Reconcile, then forget it with `?force=true` or free it with `POST .../release`.")
                .with("key", key),
            Self::Completed { key } => types::RECORD_COMPLETED
                .problem("`release` frees abandoned keys; forget a completed record with `DELETE`.")
                .with("key", key),
            Self::NothingToReconcile { key } => types::RECORD_COMPLETED
                .problem("The record is completed: its outcome is known, there is nothing to reconcile.")
                .with("key", key),
            Self::ReasonRequired(detail) => types::REASON_REQUIRED.problem(detail.clone()),
            Self::StoreUnavailable => types::STORE_UNAVAILABLE
                .problem("The idempotency store could not be reached. Try again shortly."),
        }
    }
}

impl IntoResponse for AdminProblem {
    fn into_response(self) -> Response {
        self.problem().into_response()
    }
}
