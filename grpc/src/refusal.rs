//! The guard's own answers as gRPC statuses with rich error details.
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
//! | earlier run abandoned, or this one cut off at the maximum handler time | `FAILED_PRECONDITION` | `outcome-unknown` | no |
//! | earlier answer too large to store | `FAILED_PRECONDITION` | `response-not-stored` | no |
//! | store unreachable or failing (the method did not run) | `UNAVAILABLE` | `store-unavailable` | yes |
//! | cut off, its writes rolled back (transactional mode) | `UNAVAILABLE` | `handler-timeout` | yes |
//! | the handler panicked or its answer broke off (key released) | `INTERNAL` | `handler-failed` | no |
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
//! - `outcome-unknown` is `FAILED_PRECONDITION`, a code no sane policy
//!   retries: whether the first run took effect is unknown, so the client
//!   must reconcile first (for instance through the key-status service);
//!   resending the key gets the same answer until the record expires.
//! - `ABORTED` is never the guard's own: it comes only from the method
//!   (and releases the key).

use std::collections::HashMap;
use std::time::Duration;

use idempotency_guard::KeyError;
use idempotency_guard::problem::types;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `domain` of the guard's `ErrorInfo` details.
pub const DOMAIN: &str = "idempotency";

/// The metadata entry of gRPC's retry design (A6) through which a server
/// tells a client's `retryPolicy` how long to wait before its next
/// attempt, in milliseconds.
pub const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Why the guard answered instead of the method.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrpcRefusal {
    /// `INVALID_ARGUMENT` `key-missing`.
    KeyMissing,
    /// `INVALID_ARGUMENT` `key-invalid`.
    KeyInvalid(KeyError),
    /// `INVALID_ARGUMENT` `scope-invalid`.
    ScopeInvalid,
    /// `RESOURCE_EXHAUSTED` `body-too-large`.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// `CANCELLED` `body-unreadable`.
    BodyUnreadable,
    /// `FAILED_PRECONDITION` `key-reused`.
    KeyReused {
        /// The key.
        key: String,
    },
    /// `UNAVAILABLE` `request-in-flight` with `RetryInfo`.
    InFlight {
        /// The key.
        key: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `FAILED_PRECONDITION` `outcome-unknown`, without `RetryInfo`.
    OutcomeUnknown {
        /// The key.
        key: String,
        /// Whether this call's own run was cut off at the maximum handler time.
        cut_off: bool,
    },
    /// `FAILED_PRECONDITION` `response-not-stored`.
    ResponseNotStored {
        /// The key.
        key: String,
    },
    /// `UNAVAILABLE` `store-unavailable` with `RetryInfo`.
    StoreUnavailable {
        /// The key.
        key: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `UNAVAILABLE` `handler-timeout` with `RetryInfo`: cut off, its writes
    /// rolled back with the record.
    TimedOutRolledBack {
        /// The key.
        key: String,
    },
    /// `INTERNAL` `handler-failed`: the key was released.
    HandlerFailed {
        /// The key.
        key: String,
    },
    /// `INTERNAL` `layer-missing`: [`crate::run`] found no scope from the layer.
    LayerMissing,
    /// `INTERNAL` `transaction-unavailable`: [`crate::tx()`] outside
    /// transactional mode, or while the transaction is taken.
    TransactionUnavailable,
}

/// How soon a refusal whose retry may succeed invites it when the
/// handler's own failure released the key.
const RELEASED_RETRY: Duration = Duration::from_secs(1);

impl GrpcRefusal {
    /// The problem name (the `reason` of its `ErrorInfo`).
    pub fn reason(&self) -> &'static str {
        let kind = match self {
            Self::KeyMissing => types::KEY_MISSING,
            Self::KeyInvalid(_) => types::KEY_INVALID,
            Self::ScopeInvalid => types::SCOPE_INVALID,
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE,
            Self::BodyUnreadable => types::BODY_UNREADABLE,
            Self::KeyReused { .. } => types::KEY_REUSED,
            Self::InFlight { .. } => types::REQUEST_IN_FLIGHT,
            Self::OutcomeUnknown { .. } => types::OUTCOME_UNKNOWN,
            Self::ResponseNotStored { .. } => types::RESPONSE_NOT_STORED,
            Self::StoreUnavailable { .. } => types::STORE_UNAVAILABLE,
            Self::TimedOutRolledBack { .. } => types::HANDLER_TIMEOUT,
            Self::HandlerFailed { .. } => types::HANDLER_FAILED,
            Self::LayerMissing => types::LAYER_MISSING,
            Self::TransactionUnavailable => types::TRANSACTION_UNAVAILABLE,
        };
        kind.name
    }

    /// The status code.
    pub fn code(&self) -> Code {
        match self {
            Self::KeyMissing | Self::KeyInvalid(_) | Self::ScopeInvalid => Code::InvalidArgument,
            Self::BodyTooLarge { .. } => Code::ResourceExhausted,
            Self::BodyUnreadable => Code::Cancelled,
            Self::KeyReused { .. }
            | Self::ResponseNotStored { .. }
            | Self::OutcomeUnknown { .. } => Code::FailedPrecondition,
            Self::InFlight { .. }
            | Self::StoreUnavailable { .. }
            | Self::TimedOutRolledBack { .. } => Code::Unavailable,
            Self::HandlerFailed { .. } | Self::LayerMissing | Self::TransactionUnavailable => {
                Code::Internal
            }
        }
    }

    /// The `RetryInfo` delay, where a retry may succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after, .. } | Self::StoreUnavailable { retry_after, .. } => {
                Some(*retry_after)
            }
            Self::TimedOutRolledBack { .. } => Some(RELEASED_RETRY),
            _ => None,
        }
    }

    fn key(&self) -> Option<&str> {
        match self {
            Self::KeyReused { key }
            | Self::InFlight { key, .. }
            | Self::OutcomeUnknown { key, .. }
            | Self::ResponseNotStored { key }
            | Self::StoreUnavailable { key, .. }
            | Self::TimedOutRolledBack { key }
            | Self::HandlerFailed { key } => Some(key),
            Self::KeyMissing
            | Self::KeyInvalid(_)
            | Self::ScopeInvalid
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable
            | Self::LayerMissing
            | Self::TransactionUnavailable => None,
        }
    }

    fn message(&self) -> String {
        match self {
            Self::KeyMissing => "this method requires an idempotency key: send one unique key per operation and reuse it on every retry of that operation".into(),
            Self::KeyInvalid(error) => format!("{error}; a key is 1 to 255 visible ASCII characters, sent once"),
            Self::ScopeInvalid => "the scope of this call is empty, longer than 255 bytes, or holds a control character".into(),
            Self::BodyTooLarge { limit } => format!("the request message exceeds the guard's limit of {limit} bytes"),
            Self::BodyUnreadable => "the request message could not be read to its end".into(),
            Self::KeyReused { .. } => "this key was already used with a different request (method or message); use a new key for a new operation".into(),
            Self::InFlight { .. } => "a call with this key is still being processed; retry after the RetryInfo delay to get its answer".into(),
            Self::OutcomeUnknown { cut_off: true, .. } => "the call exceeded the maximum handler time and was cut off; whether it took effect is unknown: reconcile before resending".into(),
            Self::OutcomeUnknown { cut_off: false, .. } => "an earlier call with this key started but never completed, so whether it took effect is unknown: reconcile before resending".into(),
            Self::ResponseNotStored { .. } => "the call with this key ran, but its answer was too large to store for replay; it will not run again".into(),
            Self::StoreUnavailable { .. } => "the idempotency store could not be reached, so the call was not processed; retry later with the same key".into(),
            Self::TimedOutRolledBack { .. } => "the call exceeded the maximum handler time and its effects were rolled back; retrying with the same key is safe".into(),
            Self::HandlerFailed { .. } => "the call failed unexpectedly and its key was released; retrying with the same key is safe".into(),
            Self::LayerMissing => "the server has no idempotency layer in front of this method, so the call's scope is unknown".into(),
            Self::TransactionUnavailable => "this method asked for the call's transaction, but it is not guarded in transactional mode or the transaction is already in use".into(),
        }
    }

    /// The status, with its `ErrorInfo` and, where a retry may succeed,
    /// its `RetryInfo` and the same delay as `grpc-retry-pushback-ms`.
    pub fn to_status(&self) -> Status {
        let mut metadata = HashMap::new();
        if let Some(key) = self.key() {
            metadata.insert(String::from("key"), key.to_owned());
        }
        let mut details = ErrorDetails::with_error_info(self.reason(), DOMAIN, metadata);
        if let Some(delay) = self.retry_after() {
            details.set_retry_info(Some(delay));
        }
        let mut status = Status::with_error_details(self.code(), self.message(), details);
        if let Some(delay) = self.retry_after() {
            let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            status
                .metadata_mut()
                .insert(RETRY_PUSHBACK, MetadataValue::from(millis));
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(2);

    #[test]
    fn the_refusal_mapping_as_a_truth_table() {
        let key = || String::from("k");
        // refusal, code, reason, RetryInfo
        let rows = [
            (
                GrpcRefusal::KeyMissing,
                Code::InvalidArgument,
                "key-missing",
                None,
            ),
            (
                GrpcRefusal::KeyInvalid(KeyError::Empty),
                Code::InvalidArgument,
                "key-invalid",
                None,
            ),
            (
                GrpcRefusal::ScopeInvalid,
                Code::InvalidArgument,
                "scope-invalid",
                None,
            ),
            (
                GrpcRefusal::BodyTooLarge { limit: 1 },
                Code::ResourceExhausted,
                "body-too-large",
                None,
            ),
            (
                GrpcRefusal::BodyUnreadable,
                Code::Cancelled,
                "body-unreadable",
                None,
            ),
            (
                GrpcRefusal::KeyReused { key: key() },
                Code::FailedPrecondition,
                "key-reused",
                None,
            ),
            (
                GrpcRefusal::InFlight {
                    key: key(),
                    retry_after: D,
                },
                Code::Unavailable,
                "request-in-flight",
                Some(D),
            ),
            (
                GrpcRefusal::OutcomeUnknown {
                    key: key(),
                    cut_off: false,
                },
                Code::FailedPrecondition,
                "outcome-unknown",
                None,
            ),
            (
                GrpcRefusal::OutcomeUnknown {
                    key: key(),
                    cut_off: true,
                },
                Code::FailedPrecondition,
                "outcome-unknown",
                None,
            ),
            (
                GrpcRefusal::ResponseNotStored { key: key() },
                Code::FailedPrecondition,
                "response-not-stored",
                None,
            ),
            (
                GrpcRefusal::StoreUnavailable {
                    key: key(),
                    retry_after: D,
                },
                Code::Unavailable,
                "store-unavailable",
                Some(D),
            ),
            (
                GrpcRefusal::TimedOutRolledBack { key: key() },
                Code::Unavailable,
                "handler-timeout",
                Some(RELEASED_RETRY),
            ),
            (
                GrpcRefusal::HandlerFailed { key: key() },
                Code::Internal,
                "handler-failed",
                None,
            ),
            (
                GrpcRefusal::LayerMissing,
                Code::Internal,
                "layer-missing",
                None,
            ),
            (
                GrpcRefusal::TransactionUnavailable,
                Code::Internal,
                "transaction-unavailable",
                None,
            ),
        ];
        for (refusal, code, reason, retry) in rows {
            let status = refusal.to_status();
            assert_eq!(status.code(), code, "{refusal:?}");
            let info = status.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.reason, reason);
            assert_eq!(info.domain, DOMAIN);
            assert_eq!(info.metadata.get("key").map(String::as_str), refusal.key());
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
