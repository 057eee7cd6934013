//! The guard's refusals ([`Refusal`], the one vocabulary of every adapter)
//! as JSON-RPC error objects: their codes, messages and `error.data`
//! ([`to_json`]). Self-contained: it names nothing else in this crate.
//!
//! A refusal is sent with HTTP 200 (SDK clients turn other statuses into
//! transport errors and lose `error.data`):
//!
//! | problem (`error.data.type`) | `error.code` | `data` also has |
//! |---|---|---|
//! | `urn:idempotency:request-in-flight` | -32090 | `retry_after` (seconds), `key` |
//! | `urn:idempotency:key-reused` | -32091 | `key` |
//! | `urn:idempotency:outcome-unknown` | -32092 | `key` |
//! | `urn:idempotency:store-unavailable` | -32093 | `retry_after` (seconds), `key` |
//! | `urn:idempotency:key-missing` | -32094 | |
//! | `urn:idempotency:key-invalid` | -32095 | |
//! | `urn:idempotency:response-not-stored` | -32096 | `key` |
//! | `urn:idempotency:handler-timeout` | -32097 | `key` |
//! | `urn:idempotency:handler-failed` | -32098 | `key` |
//! | `urn:idempotency:scope-invalid` | -32099 | |
//! | `urn:idempotency:body-buffer-full` | -32089 | `retry_after` (seconds), `key` when read |
//! | `urn:idempotency:batch-not-guarded` | -32600 (Invalid Request) | |
//! | `urn:idempotency:body-too-large` | -32600 (Invalid Request) | `limit` (bytes) |
//! | `urn:idempotency:body-unreadable` | -32600 (Invalid Request) | |
//! | `urn:idempotency:layer-missing` | -32603 (Internal error) | |
//! | `urn:idempotency:transaction-unavailable` | -32603 (Internal error) | |
//!
//! The guard's own codes are in JSON-RPC's block for implementation-defined
//! server errors (-32000 to -32099), clear of those MCP and its SDKs use
//! (-32000 connection closed, -32001 request timeout, -32002 resource not
//! found, -32042 URL elicitation). The layer answers a full body budget and
//! a body that breaks off before the envelope is read with problem+json
//! instead (no call is named yet); their codes serve a server that renders
//! them itself.

use bytes::Bytes;
use idempotency_guard::engine::Refusal;
use idempotency_guard::headers::retry_after_seconds;
use serde_json::value::RawValue;

/// The JSON-RPC `error.code` of `refusal` (see the [module docs](self)):
/// one exhaustive mapping, so a refusal added to the vocabulary is a
/// compile error here until it has its code.
pub fn code(refusal: &Refusal) -> i64 {
    match refusal {
        Refusal::RequestInFlight { .. } => -32090,
        Refusal::KeyReused { .. } => -32091,
        Refusal::OutcomeUnknown { .. } => -32092,
        Refusal::StoreUnavailable { .. } => -32093,
        Refusal::KeyMissing => -32094,
        Refusal::KeyInvalid(_) => -32095,
        Refusal::ResponseNotStored { .. } => -32096,
        Refusal::HandlerTimeout { .. } => -32097,
        Refusal::HandlerFailed { .. } => -32098,
        Refusal::ScopeInvalid => -32099,
        Refusal::BodyBufferFull { .. } => -32089,
        Refusal::BatchNotGuarded | Refusal::BodyTooLarge { .. } | Refusal::BodyUnreadable => -32600,
        Refusal::LayerMissing | Refusal::TransactionUnavailable => -32603,
    }
}

fn message(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::RequestInFlight { .. } => {
            "A call with this idempotency key is still running; retry after retry_after seconds to get its result."
        }
        Refusal::KeyReused { .. } => {
            "This idempotency key was already used with a different call (tool or arguments); use a new key for a new operation."
        }
        Refusal::OutcomeUnknown { .. } => {
            "An earlier call with this idempotency key started but never completed; whether it took effect is unknown. Reconcile, do not resend blindly."
        }
        Refusal::StoreUnavailable { .. } => {
            "The idempotency store is unavailable, so the call did not run; retry later with the same key."
        }
        Refusal::KeyMissing => {
            "This tool call needs an idempotency key (the Idempotency-Key header, params._meta.idempotencyKey or a key argument)."
        }
        Refusal::KeyInvalid(_) => {
            "The idempotency key is invalid: 1 to 255 visible ASCII characters, a JSON string, sent once."
        }
        Refusal::ResponseNotStored { .. } => {
            "The call with this idempotency key ran, but its result was too large to store; it will not run again."
        }
        Refusal::HandlerTimeout { .. } => {
            "The call ran past the maximum time and was cut off; whether it took effect is unknown."
        }
        Refusal::HandlerFailed { .. } => {
            "The call failed unexpectedly and its idempotency key was released; retrying with the same key is safe."
        }
        Refusal::ScopeInvalid => {
            "The caller's scope is empty, longer than 255 bytes, or holds a control character."
        }
        Refusal::BodyBufferFull { .. } => {
            "The server is holding as many request bodies as it may at once, so the call did not run; retry after retry_after seconds with the same key."
        }
        Refusal::BatchNotGuarded => {
            "A JSON-RPC batch may not hold a guarded call: send each guarded call on its own."
        }
        Refusal::BodyTooLarge { .. } => {
            "The request body is larger than the server accepts (limit bytes); the call did not run."
        }
        Refusal::BodyUnreadable => {
            "The request body could not be read to its end; the call did not run."
        }
        Refusal::LayerMissing => {
            "The server has no idempotency layer in front of this call, so its scope is unknown."
        }
        Refusal::TransactionUnavailable => {
            "The call asked for its transaction, but it is not guarded in transactional mode or the transaction is in use."
        }
    }
}

/// The JSON-RPC error response to the call with `id` (`null` when
/// unknown): the code and message of `refusal`, and in `error.data` its
/// problem `type`, its key (when there is one), `retry_after` and `limit`
/// where they apply.
pub fn to_json(refusal: &Refusal, id: Option<&RawValue>) -> Bytes {
    to_json_with(refusal, id, serde_json::Map::new())
}

/// [`to_json`] with more members in `error.data`.
pub(crate) fn to_json_with(
    refusal: &Refusal,
    id: Option<&RawValue>,
    mut data: serde_json::Map<String, serde_json::Value>,
) -> Bytes {
    data.insert("type".into(), refusal.problem_type().type_uri().into());
    if let Some(retry_after) = refusal.retry_after() {
        // Whole seconds, rounded up as `Retry-After` is; never 0, so a
        // client always waits.
        let seconds = retry_after_seconds(retry_after).max(1);
        data.insert("retry_after".into(), seconds.into());
    }
    if let Some(key) = refusal.key() {
        data.insert("key".into(), key.as_str().into());
    }
    if let Refusal::BodyTooLarge { limit } = refusal {
        data.insert("limit".into(), (*limit as u64).into());
    }
    let error = serde_json::json!({
        "code": code(refusal),
        "message": message(refusal),
        "data": data,
    });
    let id = id.map_or("null", RawValue::get);
    Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idempotency_guard::IdempotencyKey;

    use super::*;

    fn id(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn refusals_carry_their_problem_and_hint() {
        let refusal = Refusal::RequestInFlight {
            key: IdempotencyKey::from_raw("k").unwrap(),
            retry_after: Duration::from_millis(1500),
        };
        let json = to_json(&refusal, Some(&id("\"a\"")));
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["id"], "a");
        assert_eq!(value["error"]["code"], -32090);
        assert_eq!(
            value["error"]["data"]["type"],
            "urn:idempotency:request-in-flight"
        );
        assert_eq!(value["error"]["data"]["retry_after"], 2);
        assert_eq!(value["error"]["data"]["key"], "k");
        let none = to_json(&Refusal::BatchNotGuarded, None);
        let value: serde_json::Value = serde_json::from_slice(&none).unwrap();
        assert!(value["id"].is_null());
        assert!(value["error"]["data"].get("key").is_none());
    }

    #[test]
    fn each_guard_code_names_one_problem() {
        let key = || IdempotencyKey::from_raw("k").unwrap();
        let second = Duration::from_secs(1);
        let refusals = [
            Refusal::RequestInFlight {
                key: key(),
                retry_after: second,
            },
            Refusal::KeyReused { key: key() },
            Refusal::OutcomeUnknown { key: key() },
            Refusal::StoreUnavailable {
                key: Some(key()),
                retry_after: second,
            },
            Refusal::KeyMissing,
            Refusal::KeyInvalid(idempotency_guard::KeyError::Empty),
            Refusal::ResponseNotStored { key: key() },
            Refusal::HandlerTimeout {
                key: key(),
                rolled_back: false,
            },
            Refusal::HandlerFailed { key: key() },
            Refusal::ScopeInvalid,
            Refusal::BodyBufferFull {
                key: None,
                retry_after: second,
            },
        ];
        let mut seen = std::collections::HashMap::new();
        for refusal in &refusals {
            let code = code(refusal);
            assert!((-32099..=-32000).contains(&code), "{refusal:?}");
            let name = refusal.name();
            assert_eq!(*seen.entry(code).or_insert(name), name, "{code}");
        }
    }
}
