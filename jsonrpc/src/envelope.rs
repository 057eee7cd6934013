//! The JSON-RPC request envelope, read as little as it needs: which method
//! and tool a call names, its `id`, its key (from the first source that has
//! one) and its fingerprint. Pure: no I/O, no engine.
//!
//! Members are kept as raw JSON text ([`RawValue`]) so that numbers keep
//! their digits and the fingerprint is the guard's canonical form of what the
//! client sent, not of a round trip through `f64`.

use std::collections::{BTreeMap, BTreeSet};

use http::HeaderMap;
use idempotency_guard::fingerprint::canonical_json;
use idempotency_guard::{Fingerprint, IdempotencyKey, KeyError};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// The method of an MCP tool call.
pub const TOOLS_CALL: &str = "tools/call";

/// The method of an A2A message send.
pub const MESSAGE_SEND: &str = "message/send";

/// A JSON object whose members are kept as written.
pub(crate) type RawObject = BTreeMap<String, Box<RawValue>>;

/// Where a guarded call's idempotency key may come from; the layer takes it
/// from the first source, in the configured order, that holds one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// The `Idempotency-Key` HTTP header (the A2A proposal, the Agentic
    /// Commerce Protocol).
    Header,
    /// A member of `params._meta` with this name (`idempotencyKey`, as
    /// MCP's SEP-3182 proposed).
    Meta(String),
    /// A tool argument with this name (`idempotency_key`, `requestKey`:
    /// what MCP servers use today). Only for `tools/call`.
    ToolArgument(String),
    /// A2A's `params.message.messageId`. Not for `tools/call`.
    MessageId,
}

impl KeySource {
    /// The sources in their default order: the header,
    /// `params._meta.idempotencyKey`, the tool arguments `idempotency_key`
    /// and `requestKey`, then A2A's `params.message.messageId`.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::Header,
            Self::Meta(String::from("idempotencyKey")),
            Self::ToolArgument(String::from("idempotency_key")),
            Self::ToolArgument(String::from("requestKey")),
            Self::MessageId,
        ]
    }
}

impl std::fmt::Display for KeySource {
    /// The source as [`KeySource::from_str`](std::str::FromStr) reads it:
    /// `header`, `meta:<name>`, `argument:<name>`, `message-id`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header => f.write_str("header"),
            Self::Meta(name) => write!(f, "meta:{name}"),
            Self::ToolArgument(name) => write!(f, "argument:{name}"),
            Self::MessageId => f.write_str("message-id"),
        }
    }
}

/// A key source's text is not one of `header`, `meta:<name>`,
/// `argument:<name>` or `message-id` (a name is 1 to 255 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key source {0:?}: expected header, meta:<name>, argument:<name> or message-id")]
pub struct KeySourceError(String);

impl std::str::FromStr for KeySource {
    type Err = KeySourceError;

    /// Reads a key source as configuration files write it (the gateway's
    /// `key_sources`): `header` (the `Idempotency-Key` header),
    /// `meta:<name>` (`params._meta.<name>`), `argument:<name>` (a tool
    /// argument), `message-id` (A2A's `params.message.messageId`).
    ///
    /// ```
    /// use idempotency_jsonrpc::KeySource;
    /// assert_eq!("meta:idempotencyKey".parse(), Ok(KeySource::Meta("idempotencyKey".into())));
    /// assert_eq!("argument:requestKey".parse(), Ok(KeySource::ToolArgument("requestKey".into())));
    /// assert!("cookie".parse::<KeySource>().is_err());
    /// ```
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let named = |name: &str| {
            (!name.is_empty() && name.len() <= 255)
                .then(|| name.to_owned())
                .ok_or_else(|| KeySourceError(text.to_owned()))
        };
        match text.split_once(':') {
            None if text == "header" => Ok(Self::Header),
            None if text == "message-id" => Ok(Self::MessageId),
            Some(("meta", name)) => named(name).map(Self::Meta),
            Some(("argument", name)) => named(name).map(Self::ToolArgument),
            _ => Err(KeySourceError(text.to_owned())),
        }
    }
}

/// Which calls are guarded: tools of `tools/call` by name, other methods by
/// name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Guarded {
    pub(crate) tools: BTreeSet<String>,
    pub(crate) methods: BTreeSet<String>,
}

/// What the envelope of one HTTP request body says.
#[derive(Debug)]
pub(crate) enum Envelope {
    /// Not a call the layer guards (another method, a read-only tool, a
    /// notification, a response, or not JSON-RPC at all): passed through.
    NotGuarded,
    /// A batch (a JSON array) holding a guarded call: refused, since one
    /// key cannot guard several calls and their answers.
    GuardedBatch,
    /// A guarded call.
    Call(Call),
}

/// One guarded call.
#[derive(Debug)]
pub(crate) struct Call {
    /// The call's `id`, as written (a retry sends another one).
    pub(crate) id: Box<RawValue>,
    /// The JSON-RPC method.
    pub(crate) method: String,
    /// The tool's name, for `tools/call`.
    pub(crate) tool: Option<String>,
    /// The key, from the first source holding one; `Err(KeyError::Missing)`
    /// when none does.
    pub(crate) key: Result<IdempotencyKey, KeyError>,
    /// Method, tool and canonical arguments, without the key.
    pub(crate) fingerprint: Fingerprint,
}

/// A request object's members the layer reads.
#[derive(serde::Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    id: Option<Box<RawValue>>,
    params: Option<Box<RawValue>>,
}

/// Reads the envelope of a request body.
pub(crate) fn read(
    body: &[u8],
    headers: &HeaderMap,
    guarded: &Guarded,
    sources: &[KeySource],
) -> Envelope {
    let text = match std::str::from_utf8(body) {
        Ok(text) => text.trim_start(),
        Err(_) => return Envelope::NotGuarded,
    };
    if text.starts_with('[') {
        let Ok(batch) = serde_json::from_str::<Vec<Box<RawValue>>>(text) else {
            return Envelope::NotGuarded;
        };
        let any_guarded = batch.iter().any(|member| {
            matches!(
                read_one(member.get(), headers, guarded, sources),
                Envelope::Call(_)
            )
        });
        return if any_guarded {
            Envelope::GuardedBatch
        } else {
            Envelope::NotGuarded
        };
    }
    read_one(text, headers, guarded, sources)
}

fn read_one(text: &str, headers: &HeaderMap, guarded: &Guarded, sources: &[KeySource]) -> Envelope {
    let Ok(request) = serde_json::from_str::<Request<'_>>(text) else {
        return Envelope::NotGuarded;
    };
    // A notification (no `id`) has no answer to store or replay.
    let (Some(method), Some(id)) = (request.method, request.id) else {
        return Envelope::NotGuarded;
    };
    let params: RawObject = match request
        .params
        .as_deref()
        .map(|p| serde_json::from_str(p.get()))
    {
        Some(Ok(params)) => params,
        // Positional (array) or malformed params: nothing to read a tool from.
        Some(Err(_)) => return Envelope::NotGuarded,
        None => RawObject::new(),
    };
    let tool = if method == TOOLS_CALL {
        let Some(name) = params.get("name").and_then(|n| string(n)) else {
            return Envelope::NotGuarded;
        };
        if !guarded.tools.contains(&name) {
            return Envelope::NotGuarded;
        }
        Some(name)
    } else if guarded.methods.contains(method.as_ref()) {
        None
    } else {
        return Envelope::NotGuarded;
    };
    let found = find_key(headers, &params, tool.is_some(), sources);
    let fingerprint = fingerprint(&method, tool.as_deref(), &params, found.used.as_ref());
    Envelope::Call(Call {
        id,
        method: method.into_owned(),
        tool,
        key: found.key,
        fingerprint,
    })
}

/// A JSON string member's value, or `None` for any other JSON.
fn string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

/// The key and the source it came from.
struct Found {
    key: Result<IdempotencyKey, KeyError>,
    used: Option<KeySource>,
}

fn find_key(
    headers: &HeaderMap,
    params: &RawObject,
    is_tool: bool,
    sources: &[KeySource],
) -> Found {
    for source in sources {
        let raw = match source {
            KeySource::Header => match IdempotencyKey::from_headers(headers) {
                Err(KeyError::Missing) => continue,
                key => {
                    return Found {
                        key,
                        used: Some(source.clone()),
                    };
                }
            },
            KeySource::Meta(name) => member(params, "_meta", name),
            KeySource::ToolArgument(name) if is_tool => member(params, "arguments", name),
            KeySource::MessageId if !is_tool => member(params, "message", "messageId"),
            KeySource::ToolArgument(_) | KeySource::MessageId => None,
        };
        let Some(raw) = raw else { continue };
        // A key that is not a JSON string is as invalid as a malformed one.
        let key = string(&raw)
            .ok_or(KeyError::InvalidCharacter)
            .and_then(|text| IdempotencyKey::from_raw(&text));
        return Found {
            key,
            used: Some(source.clone()),
        };
    }
    Found {
        key: Err(KeyError::Missing),
        used: None,
    }
}

/// `params.<object>.<name>`, when `params.<object>` is an object holding it.
fn member(params: &RawObject, object: &str, name: &str) -> Option<Box<RawValue>> {
    let inner: RawObject = serde_json::from_str(params.get(object)?.get()).ok()?;
    inner.get(name).cloned()
}

/// SHA-256 over a version tag, the method, the tool and the canonical JSON
/// of what the call asks for: for `tools/call` its `arguments` (absent ones
/// as `{}`), for other methods its `params` without `_meta`; in both without
/// the member that carried the key. The `id` and `_meta` (progress tokens,
/// the SEP-3182 key) never count.
fn fingerprint(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn guarded() -> Guarded {
        Guarded {
            tools: ["send_email".to_owned()].into(),
            methods: [MESSAGE_SEND.to_owned()].into(),
        }
    }

    fn call(body: &str, headers: &HeaderMap) -> Call {
        match read(body.as_bytes(), headers, &guarded(), &KeySource::defaults()) {
            Envelope::Call(call) => call,
            other => panic!("not a guarded call: {other:?}"),
        }
    }

    fn tool_call(id: u32, arguments: &str, meta: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"send_email","arguments":{arguments}{meta}}}}}"#
        )
    }

    #[test]
    fn the_id_the_meta_and_the_key_argument_leave_the_fingerprint_alone() {
        let none = HeaderMap::new();
        let a = call(
            &tool_call(
                1,
                r#"{"to":"a@example.com","idempotency_key":"k-1","n":1.50}"#,
                "",
            ),
            &none,
        );
        let b = call(
            &tool_call(
                7,
                r#"{ "n" : 1.50, "idempotency_key":"k-1", "to":"a@example.com" }"#,
                r#","_meta":{"progressToken":"p-9"}"#,
            ),
            &none,
        );
        assert_eq!(a.key.as_ref().map(IdempotencyKey::as_str), Ok("k-1"));
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.id.get(), "1");
        assert_eq!(b.id.get(), "7");
        let other = call(
            &tool_call(
                1,
                r#"{"to":"b@example.com","idempotency_key":"k-1","n":1.50}"#,
                "",
            ),
            &none,
        );
        assert_ne!(a.fingerprint, other.fingerprint);
        let digits = call(
            &tool_call(
                1,
                r#"{"to":"a@example.com","idempotency_key":"k-1","n":1.5}"#,
                "",
            ),
            &none,
        );
        assert_ne!(
            a.fingerprint, digits.fingerprint,
            "numbers keep their digits"
        );
    }

    #[test]
    fn the_key_comes_from_the_first_source_that_has_one() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "from-header".parse().unwrap());
        let body = tool_call(
            1,
            r#"{"idempotency_key":"from-argument"}"#,
            r#","_meta":{"idempotencyKey":"from-meta"}"#,
        );
        assert_eq!(call(&body, &headers).key.unwrap().as_str(), "from-header");
        assert_eq!(
            call(&body, &HeaderMap::new()).key.unwrap().as_str(),
            "from-meta"
        );
        let body = tool_call(1, r#"{"requestKey":"from-request-key"}"#, "");
        assert_eq!(
            call(&body, &HeaderMap::new()).key.unwrap().as_str(),
            "from-request-key"
        );
        let body = tool_call(1, r#"{"to":"x"}"#, "");
        assert_eq!(call(&body, &HeaderMap::new()).key, Err(KeyError::Missing));
        let body = tool_call(1, r#"{"idempotency_key":42}"#, "");
        assert!(matches!(
            call(&body, &HeaderMap::new()).key,
            Err(KeyError::InvalidCharacter)
        ));
        let body = tool_call(1, r#"{"idempotency_key":"has space"}"#, "");
        assert!(call(&body, &HeaderMap::new()).key.is_err());
    }

    #[test]
    fn key_sources_read_back_what_they_write() {
        for source in KeySource::defaults() {
            assert_eq!(source.to_string().parse::<KeySource>(), Ok(source));
        }
        for bad in ["", "meta:", "argument", "Header", "query:k", "message-id:x"] {
            assert!(bad.parse::<KeySource>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a2a_message_send_is_keyed_on_its_message_id() {
        let send = |id: u32, message_id: &str, text: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"message/send","params":{{"message":{{"role":"user","messageId":"{message_id}","parts":[{{"kind":"text","text":"{text}"}}]}}}}}}"#
            )
        };
        let a = call(&send(1, "m-1", "hello"), &HeaderMap::new());
        let b = call(&send(2, "m-1", "hello"), &HeaderMap::new());
        assert_eq!(a.key.as_ref().unwrap().as_str(), "m-1");
        assert_eq!(a.tool, None);
        assert_eq!(a.fingerprint, b.fingerprint);
        let c = call(&send(2, "m-1", "other"), &HeaderMap::new());
        assert_ne!(a.fingerprint, c.fingerprint);
    }

    #[test]
    fn other_methods_tools_notifications_and_garbage_pass() {
        let none = HeaderMap::new();
        let pass = |body: &str| {
            matches!(
                read(body.as_bytes(), &none, &guarded(), &KeySource::defaults()),
                Envelope::NotGuarded
            )
        };
        assert!(pass(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#));
        assert!(pass(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count_emails"}}"#
        ));
        assert!(pass(
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email"}}"#
        ));
        assert!(pass("not json"));
        assert!(pass(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        let batch = format!("[{}]", tool_call(1, "{}", ""));
        assert!(matches!(
            read(batch.as_bytes(), &none, &guarded(), &KeySource::defaults()),
            Envelope::GuardedBatch
        ));
    }
}
