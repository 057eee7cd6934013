//! The guard's refusals ([`Refusal`], the one vocabulary of every adapter)
//! as gRPC statuses with rich error details: [`to_status`].
//!
//! Each carries a `google.rpc.ErrorInfo` with `domain` = [`DOMAIN`] and
//! `reason` = the problem name of the HTTP guard (`key-reused`, …), the
//! key in its metadata when there is one, and, where a retry may succeed,
//! a `google.rpc.RetryInfo` with the delay to wait:
//!
//! | situation | status | `reason` | `RetryInfo` |
//! |---|---|---|---|
//! | no key on a guarded method | `INVALID_ARGUMENT` | `key-missing` | no |
//! | key malformed or repeated | `INVALID_ARGUMENT` | `key-invalid` | no |
//! | scope function gave an empty or over-long scope | `INVALID_ARGUMENT` | `scope-invalid` | no |
//! | request message over the limit | `RESOURCE_EXHAUSTED` | `body-too-large` | no |
//! | request stream broke off | `CANCELLED` | `body-unreadable` | no |
//! | key used with another request | `FAILED_PRECONDITION` | `key-reused` | no |
//! | first call with the key still running | `UNAVAILABLE` | `request-in-flight` | yes |
//! | earlier run abandoned | `FAILED_PRECONDITION` | `outcome-unknown` | no |
//! | this call cut off at the maximum handler time (outcome unknown) | `FAILED_PRECONDITION` | `handler-timeout` | no |
//! | earlier answer too large to store | `FAILED_PRECONDITION` | `response-not-stored` | no |
//! | store unreachable or failing (the method did not run) | `UNAVAILABLE` | `store-unavailable` | yes |
//! | cut off, its writes rolled back (transactional mode) | `UNAVAILABLE` | `handler-timeout` | yes |
//! | the handler panicked or its answer broke off (key released) | `INTERNAL` | `handler-failed` | no |
//! | the request bodies being buffered fill the budget | `UNAVAILABLE` | `body-buffer-full` | yes |
//! | a JSON-RPC batch with a guarded call (never on gRPC) | `INVALID_ARGUMENT` | `batch-not-guarded` | no |
//! | a typed handler's AIP-155 helper without the layer in front | `INTERNAL` | `layer-missing` | no |
//! | [`crate::tx()`] outside transactional mode, or taken twice | `INTERNAL` | `transaction-unavailable` | no |
//!
//! Every answer with `RetryInfo` also carries `grpc-retry-pushback-ms`
//! (gRPC's own retry design, A6: the server's pushback), so a client's
//! `retryPolicy` waits the same delay before its next attempt.
//!
//! # Which codes a retry policy may name
//!
//! A status a `retryPolicy` names is retried blindly, so it must always be
//! safe to retry (gRPC's status code guide: `UNAVAILABLE` when the client
//! can retry just the failing call; `ABORTED` when it should retry at a
//! higher level, a read-modify-write sequence; `FAILED_PRECONDITION` when
//! it should not retry until the system's state has been fixed; AIP-194
//! retries `UNAVAILABLE` only). Hence:
//!
//! - Every `UNAVAILABLE` of the guard is safe to resend with the same
//!   key: the method did not run for this call (`request-in-flight`,
//!   `store-unavailable`), or its writes were rolled back
//!   (`handler-timeout`). A policy with `retryableStatusCodes:
//!   ["UNAVAILABLE"]` absorbs them all, the in-flight refusal included.
//! - `outcome-unknown` and an unrolled-back `handler-timeout` are
//!   `FAILED_PRECONDITION`, a code no sane policy
//!   retries: whether the first run took effect is unknown, so the client
//!   must reconcile first (for instance through the key-status service);
//!   resending the key gets the same answer until the record expires.
//! - `ABORTED` is never the guard's own: it comes only from the method
//!   (and releases the key).

use std::collections::HashMap;
use std::time::Duration;

use idempotency_guard::engine::Refusal;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `domain` of the guard's `ErrorInfo` details.
pub const DOMAIN: &str = "idempotency";

/// The metadata entry of gRPC's retry design (A6) through which a server
/// tells a client's `retryPolicy` how long to wait before its next
/// attempt, in milliseconds.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// How soon a refusal whose retry may succeed invites it when the
/// handler's own failure released the key.
const RELEASED_RETRY: Duration = Duration::from_secs(1);

/// The status of `refusal`, with its `ErrorInfo` (`reason` = the problem
/// name, the key in its metadata when there is one) and, where a retry may
/// succeed, its `RetryInfo` and the same delay as `grpc-retry-pushback-ms`
/// (see the [module docs](self)).
pub fn to_status(refusal: &Refusal) -> Status {
    let mut metadata = HashMap::new();
    if let Some(key) = refusal.key() {
        metadata.insert(String::from("key"), key.as_str().to_owned());
    }
    let reason = refusal.problem_type().name;
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    let retry = retry_after(refusal);
    if let Some(delay) = retry {
        details.set_retry_info(Some(delay));
    }
    let mut status = Status::with_error_details(code(refusal), message(refusal), details);
    if let Some(delay) = retry {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        status
            .metadata_mut()
            .insert(RETRY_PUSHBACK, MetadataValue::from(millis));
    }
    status
}

/// The status code of each refusal: the one gRPC mapping (no fallback: a
/// refusal added to the vocabulary is a compile error here).
fn code(refusal: &Refusal) -> Code {
    match refusal {
        Refusal::KeyMissing
        | Refusal::KeyInvalid(_)
        | Refusal::ScopeInvalid
        | Refusal::BatchNotGuarded => Code::InvalidArgument,
        Refusal::BodyTooLarge { .. } => Code::ResourceExhausted,
        Refusal::BodyUnreadable => Code::Cancelled,
        Refusal::KeyReused { .. }
        | Refusal::ResponseNotStored { .. }
        | Refusal::OutcomeUnknown { .. }
        | Refusal::HandlerTimeout {
            rolled_back: false, ..
        } => Code::FailedPrecondition,
        Refusal::RequestInFlight { .. }
        | Refusal::StoreUnavailable { .. }
        | Refusal::BodyBufferFull { .. }
        | Refusal::HandlerTimeout {
            rolled_back: true, ..
        } => Code::Unavailable,
        Refusal::HandlerFailed { .. } | Refusal::LayerMissing | Refusal::TransactionUnavailable => {
            Code::Internal
        }
    }
}

/// The `RetryInfo` delay, where a retry may succeed: every `UNAVAILABLE`
/// has one.
fn retry_after(refusal: &Refusal) -> Option<Duration> {
    match refusal {
        Refusal::HandlerTimeout {
            rolled_back: true, ..
        } => Some(RELEASED_RETRY),
        other => other.retry_after(),
    }
}

fn message(refusal: &Refusal) -> String {
    match refusal {
        Refusal::KeyMissing => "this method requires an idempotency key: send one unique key per operation and reuse it on every retry of that operation".into(),
        Refusal::KeyInvalid(error) => format!("{error}; a key is 1 to 255 visible ASCII characters, sent once"),
        Refusal::ScopeInvalid => "the scope of this call is empty, longer than 255 bytes, or holds a control character".into(),
        Refusal::BodyTooLarge { limit } => format!("the request message exceeds the guard's limit of {limit} bytes"),
        Refusal::BodyUnreadable => "the request message could not be read to its end".into(),
        Refusal::BodyBufferFull { .. } => "the server is holding as many request messages as it may at once; retry after the RetryInfo delay with the same key".into(),
        Refusal::BatchNotGuarded => "a batch may not hold a guarded call: send each guarded call on its own".into(),
        Refusal::KeyReused { .. } => "this key was already used with a different request (method or message); use a new key for a new operation".into(),
        Refusal::RequestInFlight { .. } => "a call with this key is still being processed; retry after the RetryInfo delay to get its answer".into(),
        Refusal::HandlerTimeout { rolled_back: false, .. } => "the call exceeded the maximum handler time and was cut off; whether it took effect is unknown: reconcile before resending".into(),
        Refusal::OutcomeUnknown { .. } => "an earlier call with this key started but never completed, so whether it took effect is unknown: reconcile before resending".into(),
        Refusal::ResponseNotStored { .. } => "the call with this key ran, but its answer was too large to store for replay; it will not run again".into(),
        Refusal::StoreUnavailable { .. } => "the idempotency store could not be reached, so the call was not processed; retry later with the same key".into(),
        Refusal::HandlerTimeout { rolled_back: true, .. } => "the call exceeded the maximum handler time and its effects were rolled back; retrying with the same key is safe".into(),
        Refusal::HandlerFailed { .. } => "the call failed unexpectedly and its key was released; retrying with the same key is safe".into(),
        Refusal::LayerMissing => "the server has no idempotency layer in front of this method, so the call's scope is unknown".into(),
        Refusal::TransactionUnavailable => "this method asked for the call's transaction, but it is not guarded in transactional mode or the transaction is already in use".into(),
    }
}

#[cfg(test)]
mod tests {
    use idempotency_guard::{IdempotencyKey, KeyError};

    use super::*;

    const D: Duration = Duration::from_secs(2);

    #[test]
    fn the_refusal_mapping_as_a_truth_table() {
        let key = || IdempotencyKey::from_raw("k").expect("a key");
        // refusal, code, reason, RetryInfo
        let rows = [
            (
                Refusal::KeyMissing,
                Code::InvalidArgument,
                "key-missing",
                None,
            ),
            (
                Refusal::KeyInvalid(KeyError::Empty),
                Code::InvalidArgument,
                "key-invalid",
                None,
            ),
            (
                Refusal::ScopeInvalid,
                Code::InvalidArgument,
                "scope-invalid",
                None,
            ),
            (
                Refusal::BodyTooLarge { limit: 1 },
                Code::ResourceExhausted,
                "body-too-large",
                None,
            ),
            (
                Refusal::BodyUnreadable,
                Code::Cancelled,
                "body-unreadable",
                None,
            ),
            (
                Refusal::BodyBufferFull {
                    key: Some(key()),
                    retry_after: D,
                },
                Code::Unavailable,
                "body-buffer-full",
                Some(D),
            ),
            (
                Refusal::BatchNotGuarded,
                Code::InvalidArgument,
                "batch-not-guarded",
                None,
            ),
            (
                Refusal::KeyReused { key: key() },
                Code::FailedPrecondition,
                "key-reused",
                None,
            ),
            (
                Refusal::RequestInFlight {
                    key: key(),
                    retry_after: D,
                },
                Code::Unavailable,
                "request-in-flight",
                Some(D),
            ),
            (
                Refusal::OutcomeUnknown { key: key() },
                Code::FailedPrecondition,
                "outcome-unknown",
                None,
            ),
            (
                Refusal::HandlerTimeout {
                    key: key(),
                    rolled_back: false,
                },
                Code::FailedPrecondition,
                "handler-timeout",
                None,
            ),
            (
                Refusal::ResponseNotStored { key: key() },
                Code::FailedPrecondition,
                "response-not-stored",
                None,
            ),
            (
                Refusal::StoreUnavailable {
                    key: Some(key()),
                    retry_after: D,
                },
                Code::Unavailable,
                "store-unavailable",
                Some(D),
            ),
            (
                Refusal::HandlerTimeout {
                    key: key(),
                    rolled_back: true,
                },
                Code::Unavailable,
                "handler-timeout",
                Some(RELEASED_RETRY),
            ),
            (
                Refusal::HandlerFailed { key: key() },
                Code::Internal,
                "handler-failed",
                None,
            ),
            (Refusal::LayerMissing, Code::Internal, "layer-missing", None),
            (
                Refusal::TransactionUnavailable,
                Code::Internal,
                "transaction-unavailable",
                None,
            ),
        ];
        for (refusal, code, reason, retry) in rows {
            let status = to_status(&refusal);
            assert_eq!(status.code(), code, "{refusal:?}");
            let info = status.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, DOMAIN);
            assert_eq!(
                info.metadata.get("key").map(String::as_str),
                refusal.key().map(IdempotencyKey::as_str)
            );
            let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
            assert_eq!(delay, retry, "{refusal:?}");
            let pushback = status
                .metadata()
                .get(RETRY_PUSHBACK)
                .map(|v| v.to_str().unwrap().parse::<u128>().unwrap());
            assert_eq!(pushback, retry.map(|d| d.as_millis()), "{refusal:?}");
            // A code a retry policy may name is always safe to retry.
            if code == Code::Unavailable {
                assert!(retry.is_some(), "{refusal:?}");
            }
        }
    }
}
