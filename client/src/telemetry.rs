//! The retry client's metrics, through the `metrics` facade (install any
//! recorder, for example `metrics-exporter-prometheus`).
//!
//! - `idempotency_client_calls_total{endpoint, outcome, retried}`: logical
//!   calls, by how they ended (`success`, `client-error`, `server-error`,
//!   or an [`ErrorKind`] name such as
//!   `budget-exhausted`) and whether they retried (`true`/`false`).
//! - `idempotency_client_given_up_total{endpoint, class, cause}`: calls
//!   that ended without an answer, split by `class` (`read`, `write`, or
//!   `unknown` for a request that could not be built) and by `cause`
//!   (`budget`, `deadline`, `breaker`, `overload`, `attempts`,
//!   `outcome-unknown`, `still-running`, `unkeyed-write`, `not-retryable`,
//!   `invalid-request`).
//! - `idempotency_client_attempts_total{endpoint, outcome}`: every request
//!   sent, by what it got (below).
//! - `idempotency_client_retries_total{endpoint, outcome}`: the attempts
//!   after the first, by what they got; retries with `outcome="success"`
//!   are the retry successes.
//! - `idempotency_client_budget_refusals_total{endpoint, budget}`: retries
//!   the budget refused (`budget` is `shared`, the client's, or `endpoint`,
//!   an endpoint's own).
//! - `idempotency_client_overload_refusals_total{endpoint}`: retries the
//!   overload limiter refused (the server said it is overloaded).
//! - `idempotency_client_status_checks_total{endpoint, advice}`: key-status
//!   look-ups after an outcome-unknown failure, by advice (`replay`,
//!   `wait`, `retry`, `reconcile`, or `unavailable`).
//!
//! An attempt's `outcome` is `success` (1xx–3xx), `client-error` (a 4xx
//! handed back), `throttled` (429), `in-flight` and `outcome-unknown` (the
//! guard's 409s), `server-error` (408, 5xx), `timeout`, `connect-error`,
//! `dropped` or `broken`.

use crate::ErrorKind;
use crate::decision::{GuardConflict, Observed};

/// Logical calls.
pub const CALLS_TOTAL: &str = "idempotency_client_calls_total";
/// Calls given up, by class and cause.
pub const GIVEN_UP_TOTAL: &str = "idempotency_client_given_up_total";
/// Requests sent.
pub const ATTEMPTS_TOTAL: &str = "idempotency_client_attempts_total";
/// Requests sent after the first of their call.
pub const RETRIES_TOTAL: &str = "idempotency_client_retries_total";
/// Retries the budget refused.
pub const BUDGET_REFUSALS_TOTAL: &str = "idempotency_client_budget_refusals_total";
/// Retries the overload limiter refused.
pub const OVERLOAD_REFUSALS_TOTAL: &str = "idempotency_client_overload_refusals_total";
/// Key-status look-ups.
pub const STATUS_CHECKS_TOTAL: &str = "idempotency_client_status_checks_total";

/// Describes the metrics to the installed recorder (once is enough; more
/// is harmless).
pub fn describe() {
    metrics::describe_counter!(
        CALLS_TOTAL,
        "Logical calls of the retry client, by endpoint, outcome and whether they retried."
    );
    metrics::describe_counter!(
        GIVEN_UP_TOTAL,
        "Calls of the retry client that ended without an answer, by endpoint, class (read, write) and cause."
    );
    metrics::describe_counter!(
        ATTEMPTS_TOTAL,
        "Requests sent by the retry client, by endpoint and outcome."
    );
    metrics::describe_counter!(
        RETRIES_TOTAL,
        "Requests sent after the first of their call, by endpoint and outcome."
    );
    metrics::describe_counter!(
        BUDGET_REFUSALS_TOTAL,
        "Retries refused by the retry budget, by endpoint and budget (shared or endpoint)."
    );
    metrics::describe_counter!(
        OVERLOAD_REFUSALS_TOTAL,
        "Retries refused by the overload limiter (the server said it is overloaded), by endpoint."
    );
    metrics::describe_counter!(
        STATUS_CHECKS_TOTAL,
        "Key-status look-ups after an outcome-unknown failure, by endpoint and advice."
    );
}

/// The `outcome` label of an attempt.
pub(crate) fn attempt_outcome(outcome: Observed) -> &'static str {
    match outcome {
        Observed::Answer {
            conflict: Some(GuardConflict::InFlight),
            ..
        } => "in-flight",
        Observed::Answer {
            conflict: Some(GuardConflict::OutcomeUnknown),
            ..
        } => "outcome-unknown",
        Observed::Answer { status: 429, .. } => "throttled",
        Observed::Answer { status: 408, .. } => "server-error",
        Observed::Answer { status, .. } if status < 400 => "success",
        Observed::Answer { status, .. } if status < 500 => "client-error",
        Observed::Answer { .. } => "server-error",
        Observed::ConnectFailed => "connect-error",
        Observed::TimedOut => "timeout",
        Observed::Dropped => "dropped",
        Observed::Broken | Observed::Advised { .. } | Observed::StatusUnavailable => "broken",
    }
}

/// The `outcome` label of a call that ended with an answer.
pub(crate) fn answered(status: u16) -> &'static str {
    match status {
        0..=399 => "success",
        400..=499 => "client-error",
        _ => "server-error",
    }
}

/// Counts one attempt (and one retry if it was not the first).
pub(crate) fn attempt(endpoint: &str, number: u32, outcome: Observed) {
    let label = attempt_outcome(outcome);
    metrics::counter!(ATTEMPTS_TOTAL, "endpoint" => endpoint.to_owned(), "outcome" => label)
        .increment(1);
    if number > 0 {
        metrics::counter!(RETRIES_TOTAL, "endpoint" => endpoint.to_owned(), "outcome" => label)
            .increment(1);
    }
}

/// Counts one finished call.
pub(crate) fn call(endpoint: &str, outcome: &'static str, retried: bool) {
    metrics::counter!(
        CALLS_TOTAL,
        "endpoint" => endpoint.to_owned(),
        "outcome" => outcome,
        "retried" => if retried { "true" } else { "false" },
    )
    .increment(1);
}

/// The `cause` label of a call given up.
pub(crate) fn cause(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::BudgetExhausted => "budget",
        ErrorKind::DeadlineExceeded => "deadline",
        ErrorKind::CircuitOpen => "breaker",
        ErrorKind::Overloaded => "overload",
        ErrorKind::AttemptsExhausted => "attempts",
        ErrorKind::OutcomeUnknown => "outcome-unknown",
        ErrorKind::OutcomeStillRunning => "still-running",
        ErrorKind::UnkeyedWrite => "unkeyed-write",
        ErrorKind::NotRetryable => "not-retryable",
        ErrorKind::InvalidRequest => "invalid-request",
    }
}

/// Counts one call given up.
pub(crate) fn given_up(endpoint: &str, class: &'static str, kind: ErrorKind) {
    metrics::counter!(
        GIVEN_UP_TOTAL,
        "endpoint" => endpoint.to_owned(),
        "class" => class,
        "cause" => cause(kind),
    )
    .increment(1);
}

/// Counts one refused retry.
pub(crate) fn budget_refusal(endpoint: &str, budget: &'static str) {
    metrics::counter!(
        BUDGET_REFUSALS_TOTAL,
        "endpoint" => endpoint.to_owned(),
        "budget" => budget,
    )
    .increment(1);
}

/// Counts one retry the overload limiter refused.
pub(crate) fn overload_refusal(endpoint: &str) {
    metrics::counter!(OVERLOAD_REFUSALS_TOTAL, "endpoint" => endpoint.to_owned()).increment(1);
}

/// Counts one status look-up.
pub(crate) fn status_check(endpoint: &str, advice: &'static str) {
    metrics::counter!(
        STATUS_CHECKS_TOTAL,
        "endpoint" => endpoint.to_owned(),
        "advice" => advice,
    )
    .increment(1);
}
