//! The JSON-RPC response of a guarded call: which message answers it, and
//! the stored one replayed under a retry's own `id`. Pure: no I/O, no
//! engine.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::raw::{RawObject, raw};

/// The `_meta` member a replayed result carries, set to `true`.
pub const REPLAYED_META: &str = "io.idempotency/replayed";

/// Whether a JSON-RPC message is the response to the call with `id`: it
/// carries that id and a `result` or an `error`.
pub(crate) fn is_response_to(message: &[u8], id: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Message {
        id: Option<serde_json::Value>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    let Ok(message) = serde_json::from_slice::<Message>(message) else {
        return false;
    };
    let wanted = serde_json::from_str::<serde_json::Value>(id.get()).ok();
    (message.result.is_some() || message.error.is_some())
        && message.id.is_some()
        && message.id == wanted
}

/// The stored response with the retry's own `id` and
/// `result._meta["io.idempotency/replayed"] = true`.
///
/// # Errors
///
/// When the stored bytes are not a JSON object (a record this crate did not
/// write).
pub(crate) fn replayed(stored: &[u8], id: &RawValue) -> Result<Bytes, serde_json::Error> {
    let mut response: RawObject = serde_json::from_slice(stored)?;
    response.insert(String::from("id"), id.to_owned());
    if let Some(result) = response.get("result") {
        let mut result: RawObject = serde_json::from_str(result.get())?;
        let mut meta: RawObject = match result.get("_meta") {
            Some(meta) => serde_json::from_str(meta.get())?,
            None => RawObject::new(),
        };
        meta.insert(String::from(REPLAYED_META), raw("true")?);
        result.insert(String::from("_meta"), raw(&serde_json::to_string(&meta)?)?);
        response.insert(
            String::from("result"),
            raw(&serde_json::to_string(&result)?)?,
        );
    }
    Ok(Bytes::from(serde_json::to_vec(&response)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn a_replay_has_the_retrys_id_and_the_marker() {
        let stored = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"sent 1"}],"amount":1.50,"_meta":{"x":1}}}"#;
        let replay = replayed(stored, &id("\"retry-2\"")).unwrap();
        let text = std::str::from_utf8(&replay).unwrap();
        assert!(text.contains("1.50"), "numbers keep their digits: {text}");
        let value: serde_json::Value = serde_json::from_slice(&replay).unwrap();
        assert_eq!(value["id"], "retry-2");
        assert_eq!(value["result"]["_meta"][REPLAYED_META], true);
        assert_eq!(value["result"]["_meta"]["x"], 1);
        assert_eq!(value["result"]["content"][0]["text"], "sent 1");
    }
}
