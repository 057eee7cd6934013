//! The policy: after an attempt (or a status look-up), hand the answer
//! back, send again after a pause, ask the key-status service, or stop.
//!
//! [`decide`] is a pure function of what happened, the call's situation and
//! a uniform random sample; the retry loop only carries out what it
//! returns (and asks the budget and the breaker, which hold state). The
//! whole policy is this file and its truth table below.

use std::time::Duration;

use crate::backoff::full_jitter;
use crate::signal::Signal;
use crate::status::Advice;
use crate::{ErrorKind, Policy};

/// What kind of request a call sends, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// GET, HEAD, OPTIONS, TRACE, or a write marked idempotent: safe to
    /// repeat.
    Read,
    /// A write with an `Idempotency-Key`: safe to repeat with that key.
    KeyedWrite,
    /// A write without a key: never repeated.
    UnkeyedWrite,
}

/// A problem the guard answers with 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuardConflict {
    /// `urn:idempotency:request-in-flight`: the first request with this key
    /// still runs.
    InFlight,
    /// `urn:idempotency:outcome-unknown`: the first request with this key
    /// was abandoned; it may have run.
    OutcomeUnknown,
}

/// What an attempt, or a status look-up, produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    /// An answer: its status, its `Retry-After` (parsed), and the guard's
    /// problem when it is a 409 of the guard.
    Answer {
        status: u16,
        retry_after: Option<Duration>,
        conflict: Option<GuardConflict>,
    },
    /// No connection: the request never left.
    ConnectFailed,
    /// No answer within the attempt's timeout: it may have run.
    TimedOut,
    /// The connection broke after the request was sent: it may have run.
    Dropped,
    /// A transport failure no retry fixes (a redirect loop).
    Broken,
    /// The key-status service's advice (`retry_after` for `wait`).
    Advised {
        advice: Advice,
        retry_after: Duration,
    },
    /// The key-status service could not be asked, or did not answer.
    StatusUnavailable,
}

impl Observed {
    /// Whether a write that got this may have run.
    pub(crate) fn may_have_run(self) -> bool {
        match self {
            Self::Answer {
                status, conflict, ..
            } => matches!(status, 502 | 504) || conflict.is_some(),
            Self::TimedOut | Self::Dropped => true,
            Self::Advised { advice, .. } => advice != Advice::Retry,
            Self::ConnectFailed | Self::Broken | Self::StatusUnavailable => false,
        }
    }

    /// Whether the attempt counts as a failure for the circuit breaker.
    pub(crate) fn is_failure(self) -> bool {
        match self {
            Self::Answer { status, .. } => status == 408 || status == 429 || status >= 500,
            Self::ConnectFailed | Self::TimedOut | Self::Dropped => true,
            Self::Broken | Self::Advised { .. } | Self::StatusUnavailable => false,
        }
    }
}

/// Where a call stands when an outcome comes in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Situation<'a> {
    /// The kind of request.
    pub(crate) class: Class,
    /// Whether a key-status service is configured.
    pub(crate) status_service: bool,
    /// Attempts sent so far (the first try included).
    pub(crate) attempts: u32,
    /// What is left of the call's deadline.
    pub(crate) remaining: Duration,
    /// The endpoint's policy.
    pub(crate) policy: &'a Policy,
    /// A uniform sample in `[0, 1)` for the jitter.
    pub(crate) sample: f64,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Hand the answer back to the caller.
    Return,
    /// Send again (same key) after this pause: a retry, if the budget
    /// allows.
    Resend { after: Duration },
    /// Send again (same key) after this pause to fetch an answer the guard
    /// stored, or is about to store: the write ran or runs, so this is no
    /// load on a failing service and takes nothing from the budget (it
    /// still takes an attempt and fits in the deadline).
    Fetch { after: Duration },
    /// Ask the key-status service about the key after this pause.
    AskStatus { after: Duration },
    /// Give up.
    Stop(ErrorKind),
}

/// What the policy wants before the limits (attempts, deadline) apply.
#[derive(Debug, Clone, Copy)]
enum Want {
    Return,
    Stop(ErrorKind),
    /// Resend after the backoff's pause.
    Backoff,
    /// Resend after the server's hint, at least the floor, plus jitter.
    ResendAfterHint(Duration),
    /// Fetch the stored answer at once (the status service says it ran).
    FetchNow,
    /// Fetch after the guard's hint (its 409: the first request runs).
    FetchAfterHint(Duration),
    /// Ask the status service if there is one, else back off and resend.
    AskOrBackoff,
    /// Ask the status service again after this long (advice `wait`).
    AskAfter(Duration),
}

/// How long the guard's in-flight 409 asks to wait when it says nothing.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(1);

/// Decides what a call does after `outcome`.
pub(crate) fn decide(outcome: Observed, at: &Situation<'_>) -> Decision {
    limit(want(outcome, at.class), at)
}

fn want(outcome: Observed, class: Class) -> Want {
    use Class::{KeyedWrite, Read, UnkeyedWrite};
    match (outcome, class) {
        (Observed::Answer { status, .. }, _) if status < 400 => Want::Return,
        // The guard's own conflicts, for a keyed write.
        (
            Observed::Answer {
                status: 409,
                conflict: Some(GuardConflict::InFlight),
                retry_after,
            },
            KeyedWrite,
        ) => Want::FetchAfterHint(retry_after.unwrap_or(IN_FLIGHT_WAIT)),
        (
            Observed::Answer {
                status: 409,
                conflict: Some(GuardConflict::OutcomeUnknown),
                ..
            },
            KeyedWrite,
        ) => Want::Stop(ErrorKind::OutcomeUnknown),
        // 429: the server did nothing and said when to come back. The one
        // failure a write without a key is retried on (seed 000's rule).
        (
            Observed::Answer {
                status: 429,
                retry_after: Some(hint),
                ..
            },
            _,
        ) => Want::ResendAfterHint(hint),
        // A 503 with `Retry-After`: the server sheds load (or the guard's
        // store is unavailable) and said when to come back. A read or a
        // keyed write waits that long; a write without a key takes the
        // 503 as the answer, as before.
        (
            Observed::Answer {
                status: 503,
                retry_after: Some(hint),
                ..
            },
            Read | KeyedWrite,
        ) => Want::ResendAfterHint(hint),
        // Not run (or released by the guard): send again.
        (
            Observed::Answer {
                status: 408 | 500 | 503,
                ..
            },
            Read | KeyedWrite,
        ) => Want::Backoff,
        // A gateway lost it: a read is sent again, a write asks first.
        (
            Observed::Answer {
                status: 502 | 504, ..
            },
            Read,
        ) => Want::Backoff,
        (
            Observed::Answer {
                status: 502 | 504, ..
            },
            KeyedWrite,
        ) => Want::AskOrBackoff,
        // Everything else is the answer: 4xx, 501, 505..., any answer but
        // a 429 with `Retry-After` to an unkeyed write.
        (Observed::Answer { .. }, _) => Want::Return,
        (Observed::ConnectFailed, Read | KeyedWrite) => Want::Backoff,
        (Observed::TimedOut | Observed::Dropped, Read) => Want::Backoff,
        (Observed::TimedOut | Observed::Dropped, KeyedWrite) => Want::AskOrBackoff,
        (Observed::ConnectFailed | Observed::TimedOut | Observed::Dropped, UnkeyedWrite) => {
            Want::Stop(ErrorKind::UnkeyedWrite)
        }
        (Observed::Broken, _) => Want::Stop(ErrorKind::NotRetryable),
        (
            Observed::Advised {
                advice,
                retry_after,
            },
            _,
        ) => match advice {
            Advice::Replay => Want::FetchNow,
            Advice::Retry => Want::Backoff,
            Advice::Wait => Want::AskAfter(retry_after),
            Advice::Reconcile => Want::Stop(ErrorKind::OutcomeUnknown),
        },
        // The service is down: the guard still makes a resend safe.
        (Observed::StatusUnavailable, _) => Want::Backoff,
    }
}

fn limit(want: Want, at: &Situation<'_>) -> Decision {
    let policy = at.policy;
    let retry = at.attempts.saturating_sub(1);
    let ceiling = policy.backoff.ceiling(retry);
    let attempts_left = at.attempts < policy.max_attempts;
    // Whether a pause and then a whole attempt fit in what is left.
    let fits = |pause: Duration| {
        pause
            .checked_add(policy.attempt_room())
            .is_some_and(|needed| needed <= at.remaining)
    };
    match want {
        Want::Return => Decision::Return,
        Want::Stop(kind) => Decision::Stop(kind),
        Want::AskOrBackoff if at.status_service => Decision::AskStatus {
            after: Duration::ZERO,
        },
        _ if matches!(
            want,
            Want::Backoff | Want::AskOrBackoff | Want::ResendAfterHint(_)
        ) && !attempts_left =>
        {
            Decision::Stop(ErrorKind::AttemptsExhausted)
        }
        // The pause is the schedule's, whatever is left of the deadline:
        // when it and another attempt do not fit, stop and say so, rather
        // than retry sooner (a shrunken pause brings retries in bursts).
        Want::Backoff | Want::AskOrBackoff => {
            let pause = policy.backoff.delay(retry, at.sample);
            if fits(pause) {
                Decision::Resend { after: pause }
            } else {
                Decision::Stop(ErrorKind::DeadlineExceeded)
            }
        }
        // The server's wait is never shortened; only the spreading on top
        // of it takes what the deadline leaves.
        Want::ResendAfterHint(hint) => {
            let wait = hint.max(policy.retry_after_floor);
            if !fits(wait) {
                return Decision::Stop(ErrorKind::DeadlineExceeded);
            }
            let spare = at.remaining - wait - policy.attempt_room();
            Decision::Resend {
                after: wait + full_jitter(ceiling.min(spare), at.sample),
            }
        }
        Want::FetchNow if !attempts_left => Decision::Stop(ErrorKind::AttemptsExhausted),
        Want::FetchNow if at.remaining.is_zero() => Decision::Stop(ErrorKind::DeadlineExceeded),
        // The first fetch goes at once. After a fetch or resend that got
        // no answer, the next one waits the backoff's pause, as any retry
        // does (at once when that pause and an attempt would not fit):
        // a connection reset costs no time, and fetches one after the
        // other would spend every attempt within the same network blip.
        Want::FetchNow => {
            let pause = if at.attempts > 1 {
                policy.backoff.delay(retry, at.sample)
            } else {
                Duration::ZERO
            };
            Decision::Fetch {
                after: if fits(pause) { pause } else { Duration::ZERO },
            }
        }
        // Still running: wait as told when the call can, else say so.
        Want::FetchAfterHint(hint) => {
            if !attempts_left || hint >= at.remaining {
                return Decision::Stop(ErrorKind::OutcomeStillRunning);
            }
            let spare = at
                .remaining
                .saturating_sub(hint)
                .saturating_sub(policy.attempt_room());
            Decision::Fetch {
                after: hint + full_jitter(ceiling.min(spare), at.sample),
            }
        }
        Want::AskAfter(wait) => {
            if !attempts_left || wait >= at.remaining {
                Decision::Stop(ErrorKind::OutcomeStillRunning)
            } else {
                Decision::AskStatus { after: wait }
            }
        }
    }
}

/// Which [`Signal`] an attempt's outcome is, for the budget (see
/// `signal.rs`).
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
    use super::*;
    use crate::{Backoff, Jitter, Kind};

    const MS: Duration = Duration::from_millis(1);

    fn policy() -> Policy {
        // Base 100 ms, attempts take up to 200 ms, at most 3 attempts.
        Policy::new(Kind::Write)
            .with_backoff(Backoff::new(100 * MS))
            .with_attempt_timeout(200 * MS)
            .with_deadline(2000 * MS)
            .with_max_attempts(3)
    }

    fn answer(status: u16) -> Observed {
        Observed::Answer {
            status,
            retry_after: None,
            conflict: None,
        }
    }

    fn hinted(status: u16, secs: u64) -> Observed {
        Observed::Answer {
            status,
            retry_after: Some(Duration::from_secs(secs)),
            conflict: None,
        }
    }

    fn conflict(conflict: GuardConflict) -> Observed {
        Observed::Answer {
            status: 409,
            retry_after: Some(Duration::from_secs(1)),
            conflict: Some(conflict),
        }
    }

    fn advised(advice: Advice) -> Observed {
        Observed::Advised {
            advice,
            retry_after: Duration::from_secs(1),
        }
    }

    #[test]
    fn truth_table() {
        use Class::{KeyedWrite as KW, Read as R, UnkeyedWrite as UW};
        use Decision::{AskStatus, Fetch, Resend, Return, Stop};
        use ErrorKind::*;
        let p = policy();
        // Attempts so far 1 (first retry: ceiling 100 ms), sample 0.5.
        let back = Resend { after: 50 * MS };
        let ask = AskStatus {
            after: Duration::ZERO,
        };
        let wait_1s = Resend {
            after: 1000 * MS + 50 * MS,
        };
        let floor = Resend {
            after: 500 * MS + 50 * MS,
        };
        let fetch_now = Fetch {
            after: Duration::ZERO,
        };
        let s = 2000 * MS;
        type Row = (Observed, Class, bool, u32, Duration, Decision);
        #[rustfmt::skip]
        let table: &[Row] = &[
            // outcome, class, status service, attempts, remaining => decision
            // Answers below 400 are the answer, whatever the class.
            (answer(200), R, true, 1, s, Return),
            (answer(201), KW, true, 1, s, Return),
            (answer(304), UW, false, 1, s, Return),
            // 400-class answers other than 408/429 come back at once.
            (answer(400), R, true, 1, s, Return),
            (answer(400), KW, true, 1, s, Return),
            (answer(404), R, true, 1, s, Return),
            (answer(409), KW, true, 1, s, Return),
            (answer(422), KW, true, 1, s, Return),
            // Retryable answers for reads.
            (answer(408), R, false, 1, s, back),
            (answer(500), R, false, 1, s, back),
            (answer(502), R, true, 1, s, back),
            (answer(503), R, false, 1, s, back),
            (answer(504), R, true, 1, s, back),
            (answer(501), R, false, 1, s, Return),
            // 429: Retry-After honoured, with a floor, for every class
            // (an unkeyed write too: the server did nothing); none: no retry.
            (hinted(429, 1), R, false, 1, s, wait_1s),
            (hinted(429, 0), R, false, 1, s, floor),
            (hinted(429, 1), KW, true, 1, s, wait_1s),
            (hinted(429, 1), UW, false, 1, s, wait_1s),
            (hinted(429, 0), UW, false, 1, s, floor),
            (answer(429), R, false, 1, s, Return),
            (answer(429), KW, true, 1, s, Return),
            (answer(429), UW, false, 1, s, Return),
            (hinted(429, 5), R, false, 1, s, Stop(DeadlineExceeded)),
            (hinted(429, 5), UW, false, 1, s, Stop(DeadlineExceeded)),
            (hinted(429, 1), UW, false, 3, s, Stop(AttemptsExhausted)),
            // Keyed writes: resend what did not run, ask about what may have.
            (answer(500), KW, true, 1, s, back),
            (answer(503), KW, true, 1, s, back),
            (answer(408), KW, true, 1, s, back),
            (answer(502), KW, true, 1, s, ask),
            (answer(504), KW, true, 1, s, ask),
            (answer(502), KW, false, 1, s, back),
            (answer(504), KW, false, 1, s, back),
            (Observed::TimedOut, KW, true, 1, s, ask),
            (Observed::Dropped, KW, true, 1, s, ask),
            (Observed::TimedOut, KW, false, 1, s, back),
            (Observed::Dropped, KW, false, 1, s, back),
            (Observed::ConnectFailed, KW, true, 1, s, back),
            // Reads retry on every transport failure.
            (Observed::TimedOut, R, true, 1, s, back),
            (Observed::Dropped, R, true, 1, s, back),
            (Observed::ConnectFailed, R, true, 1, s, back),
            // Unkeyed writes: nothing ambiguous is resent; neither is a
            // failure the server reported (it may have done part of it).
            (answer(500), UW, true, 1, s, Return),
            (answer(502), UW, true, 1, s, Return),
            (answer(503), UW, true, 1, s, Return),
            // A 503 with `Retry-After` waits as told (floor and jitter as
            // for a 429); a write without a key still takes it as the answer.
            (hinted(503, 1), R, false, 1, s, wait_1s),
            (hinted(503, 1), KW, true, 1, s, wait_1s),
            (hinted(503, 1), UW, true, 1, s, Return),
            (answer(504), UW, true, 1, s, Return),
            (answer(408), UW, true, 1, s, Return),
            (Observed::TimedOut, UW, true, 1, s, Stop(UnkeyedWrite)),
            (Observed::Dropped, UW, true, 1, s, Stop(UnkeyedWrite)),
            (Observed::ConnectFailed, UW, true, 1, s, Stop(UnkeyedWrite)),
            (Observed::Broken, R, true, 1, s, Stop(NotRetryable)),
            // The guard's conflicts: in flight is a wait for the stored
            // answer (a fetch, free of the budget), abandoned is unknown.
            (conflict(GuardConflict::InFlight), KW, true, 1, s, Fetch { after: 1050 * MS }),
            (conflict(GuardConflict::OutcomeUnknown), KW, true, 1, s, Stop(OutcomeUnknown)),
            (conflict(GuardConflict::InFlight), R, true, 1, s, Return),
            (conflict(GuardConflict::OutcomeUnknown), UW, true, 1, s, Return),
            (conflict(GuardConflict::InFlight), KW, true, 1, 1100 * MS, Fetch { after: 1000 * MS }),
            (conflict(GuardConflict::InFlight), KW, true, 1, 1000 * MS, Stop(OutcomeStillRunning)),
            (conflict(GuardConflict::InFlight), KW, true, 3, s, Stop(OutcomeStillRunning)),
            // The status service's advice: replay is a fetch, at once;
            // after a fetch that got no answer, after the backoff's pause
            // (at once when it does not fit).
            (advised(Advice::Replay), KW, true, 1, s, fetch_now),
            (advised(Advice::Replay), KW, true, 2, s, Fetch { after: 100 * MS }),
            (advised(Advice::Replay), KW, true, 2, 299 * MS, fetch_now),
            (advised(Advice::Retry), KW, true, 1, s, back),
            (advised(Advice::Wait), KW, true, 1, s, AskStatus { after: 1000 * MS }),
            (advised(Advice::Reconcile), KW, true, 1, s, Stop(OutcomeUnknown)),
            (Observed::StatusUnavailable, KW, true, 1, s, back),
            // Limits: attempts, then the deadline.
            (answer(503), R, false, 3, s, Stop(AttemptsExhausted)),
            (advised(Advice::Retry), KW, true, 3, s, Stop(AttemptsExhausted)),
            (advised(Advice::Replay), KW, true, 3, s, Stop(AttemptsExhausted)),
            // A retry needs its whole pause (50 ms here) and a whole
            // attempt (200 ms): never a pause shrunk to fit.
            (answer(503), R, false, 1, 199 * MS, Stop(DeadlineExceeded)),
            (answer(503), R, false, 1, 249 * MS, Stop(DeadlineExceeded)),
            (answer(503), R, false, 1, 250 * MS, back),
            (answer(503), R, false, 2, 299 * MS, Stop(DeadlineExceeded)),
            (answer(503), R, false, 2, 300 * MS, Resend { after: 100 * MS }),
            // A fetch needs an attempt and some deadline, not a whole
            // attempt's room: it fetches what is stored.
            (advised(Advice::Replay), KW, true, 1, 199 * MS, fetch_now),
            (advised(Advice::Replay), KW, true, 1, Duration::ZERO, Stop(DeadlineExceeded)),
            // Wait advice: followed when the deadline allows it; else the
            // error says it still runs.
            (advised(Advice::Wait), KW, true, 1, 1001 * MS, AskStatus { after: 1000 * MS }),
            (advised(Advice::Wait), KW, true, 1, 1000 * MS, Stop(OutcomeStillRunning)),
            (advised(Advice::Wait), KW, true, 3, s, Stop(OutcomeStillRunning)),
            (hinted(429, 1), R, false, 1, 1199 * MS, Stop(DeadlineExceeded)),
            (hinted(429, 1), R, false, 1, 1200 * MS, Resend { after: 1000 * MS }),
            // Asking the service costs no attempt and waits for nothing.
            (answer(504), KW, true, 3, s, ask),
            (answer(504), KW, true, 1, Duration::ZERO, ask),
            (answer(504), KW, false, 3, s, Stop(AttemptsExhausted)),
        ];
        for (i, &(outcome, class, status_service, attempts, remaining, expected)) in
            table.iter().enumerate()
        {
            let at = Situation {
                class,
                status_service,
                attempts,
                remaining,
                policy: &p,
                sample: 0.5,
            };
            assert_eq!(
                decide(outcome, &at),
                expected,
                "row {i}: {outcome:?} {class:?}"
            );
        }
    }

    #[test]
    fn pauses_follow_the_schedule_or_the_call_stops() {
        for jitter in [Jitter::Full, Jitter::Equal] {
            let p = policy()
                .with_max_attempts(100)
                .with_backoff(Backoff::new(100 * MS).with_jitter(jitter));
            for attempts in 1..20 {
                for remaining in [200 * MS, 350 * MS, 1000 * MS, 60_000 * MS] {
                    for sample in [0.0, 0.3, 0.999] {
                        let at = Situation {
                            class: Class::Read,
                            status_service: false,
                            attempts,
                            remaining,
                            policy: &p,
                            sample,
                        };
                        let scheduled = p.backoff.delay(attempts - 1, sample);
                        let expected = if scheduled + p.attempt_room() <= remaining {
                            Decision::Resend { after: scheduled }
                        } else {
                            Decision::Stop(ErrorKind::DeadlineExceeded)
                        };
                        assert_eq!(decide(answer(503), &at), expected);
                        assert!(scheduled >= p.backoff.floor(attempts - 1));
                        assert!(scheduled <= p.backoff.ceiling(attempts - 1));
                    }
                }
            }
        }
    }

    #[test]
    fn what_may_have_run() {
        assert!(Observed::TimedOut.may_have_run());
        assert!(Observed::Dropped.may_have_run());
        assert!(answer(502).may_have_run());
        assert!(answer(504).may_have_run());
        assert!(advised(Advice::Replay).may_have_run());
        assert!(conflict(GuardConflict::OutcomeUnknown).may_have_run());
        assert!(!answer(503).may_have_run());
        assert!(!answer(500).may_have_run());
        assert!(!Observed::ConnectFailed.may_have_run());
        assert!(!advised(Advice::Retry).may_have_run());
    }

    mod signals {
        use std::time::Duration;

        use super::super::*;

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
}
