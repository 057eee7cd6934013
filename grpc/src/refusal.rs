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
//! | first call with the key still running | `ABORTED` | `request-in-flight` | yes |
//! | earlier run abandoned, or this one cut off at the maximum handler time | `ABORTED` | `outcome-unknown` | no |
//! | earlier answer too large to store | `FAILED_PRECONDITION` | `response-not-stored` | no |
//! | store unreachable or failing (the method did not run) | `UNAVAILABLE` | `store-unavailable` | yes |
//! | cut off, its writes rolled back (transactional mode) | `UNAVAILABLE` | `handler-timeout` | yes |
//! | the handler panicked or its answer broke off (key released) | `INTERNAL` | `handler-failed` | no |
//! | a typed handler's AIP-155 helper without the layer in front | `INTERNAL` | `layer-missing` | no |
//!
//! `ABORTED` without `RetryInfo` is the one answer a client must not retry
//! blindly: whether the first run took effect is unknown (reconcile first,
//! for instance through the key-status service).

use std::collections::HashMap;
use std::time::Duration;

use idempotency_guard::KeyError;
use idempotency_guard::problem::types;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `domain` of the guard's `ErrorInfo` details.
pub const DOMAIN: &str = "idempotency";

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
    /// `ABORTED` `request-in-flight` with `RetryInfo`.
    InFlight {
        /// The key.
        key: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// `ABORTED` `outcome-unknown`, without `RetryInfo`.
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
        };
        kind.name
    }

    /// The status code.
    pub fn code(&self) -> Code {
        match self {
            Self::KeyMissing | Self::KeyInvalid(_) | Self::ScopeInvalid => Code::InvalidArgument,
            Self::BodyTooLarge { .. } => Code::ResourceExhausted,
            Self::BodyUnreadable => Code::Cancelled,
            Self::KeyReused { .. } | Self::ResponseNotStored { .. } => Code::FailedPrecondition,
            Self::InFlight { .. } | Self::OutcomeUnknown { .. } => Code::Aborted,
            Self::StoreUnavailable { .. } | Self::TimedOutRolledBack { .. } => Code::Unavailable,
            Self::HandlerFailed { .. } | Self::LayerMissing => Code::Internal,
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
            | Self::LayerMissing => None,
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
        }
    }

    /// The status, with its `ErrorInfo` and, where a retry may succeed,
    /// its `RetryInfo`.
    pub fn to_status(&self) -> Status {
        let mut metadata = HashMap::new();
        if let Some(key) = self.key() {
            metadata.insert(String::from("key"), key.to_owned());
        }
        let mut details = ErrorDetails::with_error_info(self.reason(), DOMAIN, metadata);
        if let Some(delay) = self.retry_after() {
            details.set_retry_info(Some(delay));
        }
        Status::with_error_details(self.code(), self.message(), details)
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
                Code::Aborted,
                "request-in-flight",
                Some(D),
            ),
            (
                GrpcRefusal::OutcomeUnknown {
                    key: key(),
                    cut_off: false,
                },
                Code::Aborted,
                "outcome-unknown",
                None,
            ),
            (
                GrpcRefusal::OutcomeUnknown {
                    key: key(),
                    cut_off: true,
                },
                Code::Aborted,
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
        }
    }
}
