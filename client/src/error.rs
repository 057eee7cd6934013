//! Why a call gave up: [`RetryError`], its [`ErrorKind`], and the last
//! [`Failure`] it saw.

use std::fmt;

/// Why a call ended without an answer to hand back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request could not be built (an invalid URL or header, a body
    /// that failed to serialize).
    InvalidRequest,
    /// A write without an `Idempotency-Key` failed (connect error, timeout,
    /// dropped connection). It is never sent again: it may have run. (A
    /// write gets a key only on an endpoint declared guarded:
    /// [`Policy::guarded_write`](crate::Policy::guarded_write).)
    UnkeyedWrite,
    /// A failure that no retry fixes (a redirect loop, an unreadable
    /// answer).
    NotRetryable,
    /// The retry budget (the client's or the endpoint's) is spent: the
    /// call failed and was not retried, so that retries stay a bounded
    /// share of calls. Not a network failure of its own.
    BudgetExhausted,
    /// The server said it is overloaded (a 429, or a 5xx with
    /// `Retry-After`) often enough that the client's overload limiter
    /// holds retries back (gRPC's retry throttling, fed by throttling
    /// answers only): the call failed and was not retried, so that a
    /// server shedding load is not sent more. The last failure is the
    /// server's answer.
    Overloaded,
    /// The call's time budget ran out, or what is left of it cannot cover
    /// another attempt (or the wait the server asked for).
    DeadlineExceeded,
    /// The call made as many attempts as its policy allows.
    AttemptsExhausted,
    /// The endpoint's circuit breaker is open: the call failed fast.
    CircuitOpen,
    /// The write's outcome is unknown: the key-status service advised
    /// `reconcile`, or the guard answered `409 outcome-unknown`. It may
    /// have run; do not resend it blindly. Reconcile by other means (the
    /// key is in [`RetryError::key`]).
    OutcomeUnknown,
    /// The write is still running (the key-status service advised `wait`,
    /// or the guard answered `409 request-in-flight`), and the call's
    /// deadline or attempts do not allow waiting as long as asked. It may
    /// well succeed: send it again later with the same key
    /// ([`RetryError::key`]), never a new one, to get its answer.
    OutcomeStillRunning,
}

impl ErrorKind {
    /// The kind's name, as in metric labels (`budget-exhausted`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid-request",
            Self::UnkeyedWrite => "unkeyed-write",
            Self::NotRetryable => "not-retryable",
            Self::BudgetExhausted => "budget-exhausted",
            Self::Overloaded => "overloaded",
            Self::DeadlineExceeded => "deadline-exceeded",
            Self::AttemptsExhausted => "attempts-exhausted",
            Self::CircuitOpen => "circuit-open",
            Self::OutcomeUnknown => "outcome-unknown",
            Self::OutcomeStillRunning => "outcome-still-running",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidRequest => "the request could not be built",
            Self::UnkeyedWrite => "a write without an idempotency key failed and is never resent",
            Self::NotRetryable => "the request failed in a way no retry fixes",
            Self::BudgetExhausted => "the retry budget is spent",
            Self::Overloaded => "the server is overloaded; its retries are held back",
            Self::DeadlineExceeded => "the deadline leaves no room for another attempt",
            Self::AttemptsExhausted => "the attempts allowed are spent",
            Self::CircuitOpen => "the circuit breaker is open",
            Self::OutcomeUnknown => "the write's outcome is unknown",
            Self::OutcomeStillRunning => {
                "the write is still running and the call cannot wait for it"
            }
        })
    }
}

/// What the last attempt got, when it was not an answer to hand back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// An answer the client retries (408, 429, 5xx, or a guard's 409 for a
    /// write), whole: its status, headers and unread body.
    #[error("the server answered {}", .0.status())]
    Answer(reqwest::Response),
    /// No answer: a connect error, a timeout, a dropped connection, or a
    /// request that could not be built.
    #[error("the request got no answer")]
    Transport(#[source] reqwest::Error),
    /// No answer within the attempt's timeout
    /// ([`Policy::with_attempt_timeout`](crate::Policy::with_attempt_timeout));
    /// the attempt went on running beside the next ones until the call
    /// ended, and its answer would have been taken had it come.
    #[error("the request got no answer within the attempt's timeout")]
    TimedOut,
}

impl Failure {
    /// Returns the status of the answer, if there was one.
    pub fn status(&self) -> Option<reqwest::StatusCode> {
        match self {
            Self::Answer(response) => Some(response.status()),
            Self::Transport(error) => error.status(),
            Self::TimedOut => None,
        }
    }
}

/// A call that gave up, and why: the kind (budget exhausted, deadline,
/// outcome unknown, ...), how many attempts it made, the idempotency key
/// it used, and the last failure it saw.
#[derive(Debug, thiserror::Error)]
#[error("{endpoint}: {kind} (after {attempts} attempt(s){})", key_note(.key.as_deref()))]
pub struct RetryError {
    pub(crate) kind: ErrorKind,
    pub(crate) endpoint: String,
    pub(crate) attempts: u32,
    pub(crate) key: Option<String>,
    pub(crate) may_have_run: bool,
    #[source]
    pub(crate) last: Option<Failure>,
}

/// The key in the message, when the call sent one: the caller needs it to
/// reconcile or to fetch the answer later.
fn key_note(key: Option<&str>) -> String {
    key.map(|key| format!(", key {key}")).unwrap_or_default()
}

impl RetryError {
    /// Returns why the call gave up.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Returns the endpoint's name.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Returns how many requests were sent (0 when none was: an open
    /// circuit, an invalid request).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Returns the `Idempotency-Key` the call sent, if it sent one: resend
    /// later with this key (never a new one) to learn what became of it.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Returns whether a write may have run although the call failed: one
    /// of its attempts timed out, lost its connection after sending, or got
    /// a 502, a 504 or a guard's 409 (in flight, outcome unknown), or the
    /// status service said it ran or runs. `false` for reads.
    pub fn may_have_run(&self) -> bool {
        self.may_have_run
    }

    /// Returns the last failure the call saw, if it made an attempt.
    pub fn last(&self) -> Option<&Failure> {
        self.last.as_ref()
    }

    /// Returns the last failure, taking it out of the error (for example to
    /// read the last answer's body).
    pub fn into_last(self) -> Option<Failure> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn errors_travel_across_tasks() {
        assert_send_sync_static::<RetryError>();
        assert_send_sync_static::<Failure>();
    }

    #[test]
    fn the_message_says_where_why_and_how_often() {
        let error = RetryError {
            kind: ErrorKind::BudgetExhausted,
            endpoint: "create-payment".to_owned(),
            attempts: 1,
            key: Some("k".to_owned()),
            may_have_run: false,
            last: None,
        };
        assert_eq!(
            error.to_string(),
            "create-payment: the retry budget is spent (after 1 attempt(s), key k)"
        );
        assert_eq!(error.kind().as_str(), "budget-exhausted");
        let running = RetryError {
            kind: ErrorKind::OutcomeStillRunning,
            endpoint: "create-payment".to_owned(),
            attempts: 1,
            key: None,
            may_have_run: true,
            last: None,
        };
        assert_eq!(
            running.to_string(),
            "create-payment: the write is still running and the call cannot wait for it \
             (after 1 attempt(s))"
        );
    }
}
