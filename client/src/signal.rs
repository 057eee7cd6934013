//! What one attempt says about the server, for the retry budget's
//! accounting: an answer, a server error, a lost answer, or a server that
//! says it is overloaded. The budget treats them apart (see
//! [`crate::budget`]): a lost answer on a server that answers the others
//! is a blip worth retrying (Finagle's floor of retries per second serves
//! it), while a server that sheds load must not be sent more (the overload
//! limiter, after gRPC's retry throttling and the AWS SDKs' adaptive mode,
//! which react to throttling answers only).

use crate::decision::Observed;

/// What an attempt got, as the budget counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// An answer below 500 (a 429 aside): the server answers.
    Answered,
    /// A 408 or a 5xx without `Retry-After`: the server answered with an
    /// error, quickly or not; its retries take the budget's share only.
    ServerError,
    /// No answer: a connect error, a timeout, a connection reset or
    /// dropped. A blip when the server answers the client's other
    /// attempts.
    LostAnswer,
    /// A 429, or a 5xx with `Retry-After` (a 503 shedding load): the
    /// server says it is overloaded. The overload limiter counts these.
    Overload,
}

impl Signal {
    /// The signal of an attempt's outcome; `None` for what is not an
    /// attempt's answer (a status look-up, a broken request).
    pub(crate) fn of(outcome: Observed) -> Option<Self> {
        match outcome {
            Observed::Answer { status: 429, .. } => Some(Self::Overload),
            Observed::Answer {
                status,
                retry_after: Some(_),
                ..
            } if status >= 500 => Some(Self::Overload),
            Observed::Answer { status, .. } if status == 408 || status >= 500 => {
                Some(Self::ServerError)
            }
            Observed::Answer { .. } => Some(Self::Answered),
            Observed::ConnectFailed | Observed::TimedOut | Observed::Dropped => {
                Some(Self::LostAnswer)
            }
            Observed::Broken | Observed::Advised { .. } | Observed::StatusUnavailable => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn answer(status: u16, retry_after: Option<u64>) -> Observed {
        Observed::Answer {
            status,
            retry_after: retry_after.map(Duration::from_secs),
            conflict: None,
        }
    }

    #[test]
    fn only_throttling_answers_signal_overload() {
        assert_eq!(Signal::of(answer(429, None)), Some(Signal::Overload));
        assert_eq!(Signal::of(answer(429, Some(1))), Some(Signal::Overload));
        assert_eq!(Signal::of(answer(503, Some(1))), Some(Signal::Overload));
        // A bare 503 or 500 is a server error, not a request to back off.
        assert_eq!(Signal::of(answer(503, None)), Some(Signal::ServerError));
        assert_eq!(Signal::of(answer(500, None)), Some(Signal::ServerError));
        assert_eq!(Signal::of(answer(408, None)), Some(Signal::ServerError));
        assert_eq!(Signal::of(answer(200, None)), Some(Signal::Answered));
        assert_eq!(Signal::of(answer(404, None)), Some(Signal::Answered));
        for lost in [
            Observed::ConnectFailed,
            Observed::TimedOut,
            Observed::Dropped,
        ] {
            assert_eq!(Signal::of(lost), Some(Signal::LostAnswer));
        }
        assert_eq!(Signal::of(Observed::Broken), None);
        assert_eq!(Signal::of(Observed::StatusUnavailable), None);
    }
}
