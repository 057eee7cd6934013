//! The policy: what to do with a request whose key already has a record.
//!
//! [`decide`] is a pure function of the record (read with the store's own
//! clock), the new request's fingerprint and the configured policy. The layer
//! only carries out what it returns, so the whole policy is this file and its
//! truth table below.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::record::{Record, RecordState};

/// What to do when a key's earlier run was abandoned (its lease ended
/// before it completed, or the guard cut it off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AbandonedPolicy {
    /// Answer 409 `outcome-unknown`: the earlier run may have had effects,
    /// so running again could do them twice. The safe default.
    #[default]
    Reject,
    /// Take the key over and run the handler again. Choose this only for
    /// handlers whose effects are safe to repeat after a crash.
    RunAgain,
    /// Take the key over (fenced, as [`RunAgain`](Self::RunAgain) does) and
    /// resume the run: the handler runs again, and the steps the abandoned
    /// run recorded ([`Run::step`](crate::engine::Run::step)) return their
    /// recorded results without running; the client gets the real answer,
    /// not a 409. A step that was running when the process died runs again
    /// (pass its [`derived key`](crate::engine::Run::derived_key) on), and
    /// work outside steps runs again: **without steps, resume means "run
    /// again"**, right only for work that is safe to repeat.
    Resume,
}

/// What to do with a request whose key is still being handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlightPolicy {
    /// Answer 409 `request-in-flight` at once, with `Retry-After`.
    Reject,
    /// Wait up to the bound for the first request to finish (woken by its
    /// completion, not by polling) and answer with its replay; past the
    /// bound, answer 409 `request-in-flight`.
    Wait(Duration),
}

/// The inputs of [`decide`] that come from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// See [`AbandonedPolicy`].
    pub(crate) abandoned: AbandonedPolicy,
    /// See [`InFlightPolicy`].
    pub(crate) in_flight: InFlightPolicy,
    /// The `Retry-After` hint for in-flight answers; never beyond the lease.
    pub(crate) retry_after: Duration,
}

/// What the layer does with a request whose key has a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Answer with the stored response (`Idempotent-Replayed: true`).
    Replay,
    /// The response was too large to store: 409 `response-not-stored`.
    ResponseNotStored,
    /// The key was used with another request: `key-reused`.
    KeyReused,
    /// Still running: 409 `request-in-flight` with this `Retry-After`.
    InFlight {
        /// How long the client should wait before asking again.
        retry_after: Duration,
    },
    /// Still running and the route waits: wait for its completion, then
    /// read the record again.
    Wait,
    /// The earlier run's outcome is unknown: 409 `outcome-unknown`.
    OutcomeUnknown,
    /// The record no longer binds the key (expired, or abandoned where
    /// running again is safe): take it over and run the handler.
    TakeOver,
}

/// Decides what a request with `fingerprint` does about `record`.
///
/// `wait_left` is how much of the route's wait bound remains (zero when the
/// request has waited its fill or the route does not wait).
pub(crate) fn decide(
    record: &Record,
    fingerprint: &Fingerprint,
    policy: &Policy,
    wait_left: Duration,
) -> Decision {
    // Past retention the key is free again, whatever the record says.
    if record.is_expired() {
        return Decision::TakeOver;
    }
    if record.fingerprint != *fingerprint {
        return Decision::KeyReused;
    }
    match record.state() {
        RecordState::Completed => match record.response.as_ref().and_then(|r| r.body.as_ref()) {
            Some(_) => Decision::Replay,
            None => Decision::ResponseNotStored,
        },
        RecordState::InFlight => match policy.in_flight {
            InFlightPolicy::Wait(_) if !wait_left.is_zero() => Decision::Wait,
            _ => Decision::InFlight {
                retry_after: policy.retry_after.min(record.lease_remaining()),
            },
        },
        // In transactional mode a lapsed lease means the handler's writes
        // were rolled back with the record: nothing ran, so running is safe.
        RecordState::Abandoned if record.transactional => Decision::TakeOver,
        RecordState::Abandoned => match policy.abandoned {
            AbandonedPolicy::Reject => Decision::OutcomeUnknown,
            AbandonedPolicy::RunAgain | AbandonedPolicy::Resume => Decision::TakeOver,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{LeaseToken, StoredResponse};
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use time::OffsetDateTime;

    const FP: Fingerprint = Fingerprint::from_bytes([1; 32]);
    const OTHER: Fingerprint = Fingerprint::from_bytes([2; 32]);

    #[derive(Clone, Copy)]
    enum Shape {
        InFlight,
        Abandoned,
        Completed,
        CompletedNotStored,
    }

    fn record(shape: Shape, transactional: bool, expired: bool) -> Record {
        let now = OffsetDateTime::now_utc();
        let secs = time::Duration::seconds;
        let response = |body: Option<Bytes>| {
            Some(StoredResponse {
                status: StatusCode::CREATED,
                headers: HeaderMap::new(),
                body,
            })
        };
        let (lease_expires_at, response) = match shape {
            Shape::InFlight => (now + secs(30), None),
            Shape::Abandoned => (now - secs(1), None),
            Shape::Completed => (now + secs(30), response(Some(Bytes::from_static(b"{}")))),
            Shape::CompletedNotStored => (now + secs(30), response(None)),
        };
        Record {
            scope: crate::Scope::new("s").unwrap(),
            key: crate::IdempotencyKey::from_raw("k").unwrap(),
            fingerprint: FP,
            method: "POST".into(),
            path: "/".into(),
            lease_token: LeaseToken::new(),
            lease_expires_at,
            transactional,
            response,
            created_at: now - secs(60),
            completed_at: None,
            expires_at: if expired {
                now - secs(1)
            } else {
                now + secs(3600)
            },
            observed_at: now,
            steps: Vec::new(),
            request: None,
        }
    }

    fn policy(abandoned: AbandonedPolicy, in_flight: InFlightPolicy) -> Policy {
        Policy {
            abandoned,
            in_flight,
            retry_after: Duration::from_secs(1),
        }
    }

    #[test]
    fn truth_table() {
        use AbandonedPolicy::{Reject as AReject, RunAgain};
        use Decision::*;
        use InFlightPolicy::{Reject as IReject, Wait as IWait};
        let wait = IWait(Duration::from_secs(5));
        let second = Duration::from_secs(1);
        let in_flight_409 = InFlight {
            retry_after: second,
        };
        type Row = (
            Shape,
            bool,
            bool,
            Fingerprint,
            AbandonedPolicy,
            InFlightPolicy,
            Duration,
            Decision,
        );
        #[rustfmt::skip]
        let table: &[Row] = &[
            // shape, transactional, expired, fingerprint, abandoned, in flight, wait left => decision
            (Shape::Completed, false, false, FP, AReject, IReject, Duration::ZERO, Replay),
            (Shape::Completed, true, false, FP, AReject, IReject, Duration::ZERO, Replay),
            (Shape::CompletedNotStored, false, false, FP, AReject, IReject, Duration::ZERO, ResponseNotStored),
            (Shape::Completed, false, false, OTHER, AReject, IReject, Duration::ZERO, KeyReused),
            (Shape::InFlight, false, false, OTHER, AReject, wait, second, KeyReused),
            (Shape::Abandoned, false, false, OTHER, RunAgain, IReject, Duration::ZERO, KeyReused),
            (Shape::InFlight, false, false, FP, AReject, IReject, Duration::ZERO, in_flight_409),
            (Shape::InFlight, false, false, FP, AReject, wait, second, Wait),
            (Shape::InFlight, false, false, FP, AReject, wait, Duration::ZERO, in_flight_409),
            (Shape::Abandoned, false, false, FP, AReject, IReject, Duration::ZERO, OutcomeUnknown),
            (Shape::Abandoned, false, false, FP, AReject, wait, second, OutcomeUnknown),
            (Shape::Abandoned, false, false, FP, RunAgain, IReject, Duration::ZERO, TakeOver),
            (Shape::Abandoned, true, false, FP, AReject, IReject, Duration::ZERO, TakeOver),
            (Shape::Completed, false, true, OTHER, AReject, IReject, Duration::ZERO, TakeOver),
            (Shape::InFlight, false, true, FP, AReject, IReject, Duration::ZERO, TakeOver),
            (Shape::Abandoned, false, true, FP, AReject, IReject, Duration::ZERO, TakeOver),
        ];
        for (i, &(shape, tx, expired, fp, abandoned, in_flight, wait_left, expected)) in
            table.iter().enumerate()
        {
            let got = decide(
                &record(shape, tx, expired),
                &fp,
                &policy(abandoned, in_flight),
                wait_left,
            );
            assert_eq!(got, expected, "row {i}");
        }
    }

    #[test]
    fn retry_after_never_reaches_beyond_the_lease() {
        let mut r = record(Shape::InFlight, false, false);
        r.lease_expires_at = r.observed_at + time::Duration::milliseconds(300);
        let p = Policy {
            retry_after: Duration::from_secs(5),
            ..policy(AbandonedPolicy::Reject, InFlightPolicy::Reject)
        };
        match decide(&r, &FP, &p, Duration::ZERO) {
            Decision::InFlight { retry_after } => {
                assert!(retry_after <= Duration::from_millis(300))
            }
            other => panic!("expected in flight, got {other:?}"),
        }
    }
}
