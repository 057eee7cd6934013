//! [`RpcRefusal`]: the guard's refusals as JSON-RPC error objects, their
//! codes, messages and `error.data`. Self-contained: it names nothing else
//! in this crate.

use std::time::Duration;

use bytes::Bytes;
use idempotency_guard::headers::retry_after_seconds;
use idempotency_guard::problem::{ProblemType, types};
use serde_json::value::RawValue;

/// A refusal of the guard, sent as a JSON-RPC error object (with HTTP 200:
/// SDK clients turn other statuses into transport errors and lose
/// `error.data`).
///
/// | problem (`error.data.type`) | `error.code` | `data` also has |
/// |---|---|---|
/// | `urn:idempotency:request-in-flight` | -32090 | `retry_after` (seconds) |
/// | `urn:idempotency:key-reused` | -32091 | `key` |
/// | `urn:idempotency:outcome-unknown` | -32092 | `key` |
/// | `urn:idempotency:store-unavailable` | -32093 | `retry_after` (seconds) |
/// | `urn:idempotency:key-missing` | -32094 | |
/// | `urn:idempotency:key-invalid` | -32095 | |
/// | `urn:idempotency:response-not-stored` | -32096 | `key` |
/// | `urn:idempotency:handler-timeout` | -32097 | `key` |
/// | `urn:idempotency:handler-failed` | -32098 | `key` |
/// | `urn:idempotency:scope-invalid` | -32099 | |
/// | `urn:idempotency:batch-not-guarded` | -32600 (Invalid Request) | |
/// | `urn:idempotency:body-too-large` | -32600 (Invalid Request) | `limit` (bytes) |
///
/// The codes are in JSON-RPC's block for implementation-defined server
/// errors (-32000 to -32099), clear of those MCP and its SDKs use (-32000
/// connection closed, -32001 request timeout, -32002 resource not found,
/// -32042 URL elicitation).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RpcRefusal {
    /// The first call with this key still runs: ask again after `retry_after`.
    RequestInFlight {
        /// When to ask again.
        retry_after: Duration,
    },
    /// The key was used with another call (another tool or other arguments).
    KeyReused,
    /// An earlier call with this key was abandoned: its effects are unknown.
    OutcomeUnknown,
    /// The store failed; the call did not run.
    StoreUnavailable {
        /// When to try again.
        retry_after: Duration,
    },
    /// A guarded call without a key, and the layer refuses those.
    KeyMissing,
    /// The key is not 1 to 255 visible ASCII characters, not a JSON string,
    /// or the header was sent twice.
    KeyInvalid,
    /// The call ran, but its answer was too large to store: it does not run
    /// again.
    ResponseNotStored,
    /// The call ran past the maximum handler time and was cut off.
    HandlerTimeout,
    /// The call failed unexpectedly; its key was released.
    HandlerFailed,
    /// The scope function named an empty scope or one over 255 bytes.
    ScopeInvalid,
    /// A batch holds a guarded call.
    BatchNotGuarded,
    /// The request body is over the layer's limit; nothing was read but the
    /// call's `id`.
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

impl RpcRefusal {
    /// The problem's name (the part of `error.data.type` after `urn:idempotency:`).
    pub fn name(&self) -> &'static str {
        self.problem_type().name
    }

    /// The problem type of the guard's vocabulary this refusal is.
    fn problem_type(&self) -> ProblemType {
        match self {
            Self::RequestInFlight { .. } => types::REQUEST_IN_FLIGHT,
            Self::KeyReused => types::KEY_REUSED,
            Self::OutcomeUnknown => types::OUTCOME_UNKNOWN,
            Self::StoreUnavailable { .. } => types::STORE_UNAVAILABLE,
            Self::KeyMissing => types::KEY_MISSING,
            Self::KeyInvalid => types::KEY_INVALID,
            Self::ResponseNotStored => types::RESPONSE_NOT_STORED,
            Self::HandlerTimeout => types::HANDLER_TIMEOUT,
            Self::HandlerFailed => types::HANDLER_FAILED,
            Self::ScopeInvalid => types::SCOPE_INVALID,
            Self::BatchNotGuarded => types::BATCH_NOT_GUARDED,
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE,
        }
    }

    /// The JSON-RPC `error.code` (see the table above).
    pub fn code(&self) -> i64 {
        match self {
            Self::RequestInFlight { .. } => -32090,
            Self::KeyReused => -32091,
            Self::OutcomeUnknown => -32092,
            Self::StoreUnavailable { .. } => -32093,
            Self::KeyMissing => -32094,
            Self::KeyInvalid => -32095,
            Self::ResponseNotStored => -32096,
            Self::HandlerTimeout => -32097,
            Self::HandlerFailed => -32098,
            Self::ScopeInvalid => -32099,
            Self::BatchNotGuarded | Self::BodyTooLarge { .. } => -32600,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::RequestInFlight { .. } => {
                "A call with this idempotency key is still running; retry after retry_after seconds to get its result."
            }
            Self::KeyReused => {
                "This idempotency key was already used with a different call (tool or arguments); use a new key for a new operation."
            }
            Self::OutcomeUnknown => {
                "An earlier call with this idempotency key started but never completed; whether it took effect is unknown. Reconcile, do not resend blindly."
            }
            Self::StoreUnavailable { .. } => {
                "The idempotency store is unavailable, so the call did not run; retry later with the same key."
            }
            Self::KeyMissing => {
                "This tool call needs an idempotency key (the Idempotency-Key header, params._meta.idempotencyKey or a key argument)."
            }
            Self::KeyInvalid => {
                "The idempotency key is invalid: 1 to 255 visible ASCII characters, a JSON string, sent once."
            }
            Self::ResponseNotStored => {
                "The call with this idempotency key ran, but its result was too large to store; it will not run again."
            }
            Self::HandlerTimeout => {
                "The call ran past the maximum time and was cut off; whether it took effect is unknown."
            }
            Self::HandlerFailed => {
                "The call failed unexpectedly and its idempotency key was released; retrying with the same key is safe."
            }
            Self::ScopeInvalid => {
                "The caller's scope is empty, longer than 255 bytes, or holds a control character."
            }
            Self::BatchNotGuarded => {
                "A JSON-RPC batch may not hold a guarded call: send each guarded call on its own."
            }
            Self::BodyTooLarge { .. } => {
                "The request body is larger than the server accepts (limit bytes); the call did not run."
            }
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RequestInFlight { retry_after } | Self::StoreUnavailable { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The JSON-RPC error response to the call with `id` (`null` when
    /// unknown), `key` echoed in `error.data` when there is one.
    pub fn to_json(&self, id: Option<&RawValue>, key: Option<&str>) -> Bytes {
        self.to_json_with(id, key, serde_json::Map::new())
    }

    /// [`RpcRefusal::to_json`] with more members in `error.data`.
    pub(crate) fn to_json_with(
        &self,
        id: Option<&RawValue>,
        key: Option<&str>,
        mut data: serde_json::Map<String, serde_json::Value>,
    ) -> Bytes {
        data.insert("type".into(), self.problem_type().type_uri().into());
        if let Some(retry_after) = self.retry_after() {
            // Whole seconds, rounded up as `Retry-After` is; never 0, so a
            // client always waits.
            let seconds = retry_after_seconds(retry_after).max(1);
            data.insert("retry_after".into(), seconds.into());
        }
        if let Some(key) = key {
            data.insert("key".into(), key.into());
        }
        if let Self::BodyTooLarge { limit } = self {
            data.insert("limit".into(), (*limit as u64).into());
        }
        let error = serde_json::json!({
            "code": self.code(),
            "message": self.message(),
            "data": data,
        });
        let id = id.map_or("null", RawValue::get);
        Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn refusals_carry_their_problem_and_hint() {
        let json = RpcRefusal::RequestInFlight {
            retry_after: Duration::from_millis(1500),
        }
        .to_json(Some(&id("\"a\"")), Some("k"));
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["id"], "a");
        assert_eq!(value["error"]["code"], -32090);
        assert_eq!(
            value["error"]["data"]["type"],
            "urn:idempotency:request-in-flight"
        );
        assert_eq!(value["error"]["data"]["retry_after"], 2);
        assert_eq!(value["error"]["data"]["key"], "k");
        let none = RpcRefusal::BatchNotGuarded.to_json(None, None);
        let value: serde_json::Value = serde_json::from_slice(&none).unwrap();
        assert!(value["id"].is_null());
    }
}
