//! A call's fingerprint: SHA-256 over the method, the tool and the guard's
//! canonical JSON of what the call asks for, without what changes between
//! retries (the `id`, `_meta`) and without the member that carried the key.

use idempotency_guard::Fingerprint;
use idempotency_guard::fingerprint::canonical_json;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::key::KeySource;
use crate::raw::RawObject;

/// SHA-256 over a version tag, the method, the tool and the canonical JSON
/// of what the call asks for: for `tools/call` its `arguments` (absent ones
/// as `{}`), for other methods its `params` without `_meta`; in both without
/// the member that carried the key. The `id` and `_meta` (progress tokens,
/// the SEP-3182 key) never count.
pub(crate) fn fingerprint(
    method: &str,
    tool: Option<&str>,
    params: &RawObject,
    used: Option<&KeySource>,
) -> Fingerprint {
    let payload = if tool.is_some() {
        let dropped = match used {
            Some(KeySource::ToolArgument(name)) => Some(name.as_str()),
            _ => None,
        };
        params.get("arguments").map_or_else(
            || b"{}".to_vec(),
            |arguments| canonical_without(arguments, dropped),
        )
    } else {
        let mut rest = params.clone();
        rest.remove("_meta");
        if used == Some(&KeySource::MessageId)
            && let Some(message) = rest.get("message")
        {
            let message = canonical_without(message, Some("messageId"));
            // Canonical JSON is JSON: it reads back as a raw value.
            if let Ok(message) =
                RawValue::from_string(String::from_utf8_lossy(&message).into_owned())
            {
                rest.insert(String::from("message"), message);
            }
        }
        canonical_object(&rest)
    };
    let mut hasher = Sha256::new();
    hasher.update(b"jsonrpc/1\n");
    hasher.update(method.as_bytes());
    hasher.update(b"\n");
    hasher.update(tool.unwrap_or("").as_bytes());
    hasher.update(b"\n");
    hasher.update(&payload);
    Fingerprint::from_bytes(hasher.finalize().into())
}

/// The canonical form of a raw JSON value without its member `dropped` (when
/// it is an object). A value the canonical form refuses (a repeated key, too
/// deep) is taken as its raw bytes, tagged, so it never equals a canonical
/// one: which duplicate a server keeps is not guessed.
fn canonical_without(value: &RawValue, dropped: Option<&str>) -> Vec<u8> {
    let Ok(canonical) = canonical_json(value.get().as_bytes()) else {
        let mut raw = b"raw\n".to_vec();
        raw.extend_from_slice(value.get().as_bytes());
        return raw;
    };
    let Some(dropped) = dropped else {
        return canonical;
    };
    match serde_json::from_slice::<RawObject>(&canonical) {
        Ok(mut object) => {
            object.remove(dropped);
            canonical_object(&object)
        }
        Err(_) => canonical,
    }
}

/// The canonical form of an object whose members are raw JSON.
fn canonical_object(object: &RawObject) -> Vec<u8> {
    let text = serde_json::to_vec(object).unwrap_or_default();
    canonical_json(&text).unwrap_or(text)
}
