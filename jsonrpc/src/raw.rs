//! JSON kept as written: objects whose members are raw JSON text
//! ([`RawValue`]), so that numbers keep their digits through a read and a
//! write (the fingerprint, a replay's new `id`).

use std::collections::BTreeMap;

use serde_json::value::RawValue;

/// A JSON object whose members are kept as written.
pub(crate) type RawObject = BTreeMap<String, Box<RawValue>>;

/// A JSON string member's value, or `None` for any other JSON.
pub(crate) fn string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

/// `params.<object>.<name>`, when `params.<object>` is an object holding it.
pub(crate) fn member(params: &RawObject, object: &str, name: &str) -> Option<Box<RawValue>> {
    let inner: RawObject = serde_json::from_str(params.get(object)?.get()).ok()?;
    inner.get(name).cloned()
}

/// A JSON text as a raw value.
pub(crate) fn raw(text: &str) -> Result<Box<RawValue>, serde_json::Error> {
    RawValue::from_string(text.to_owned())
}
