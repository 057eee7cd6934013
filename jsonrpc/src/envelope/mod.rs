//! The JSON-RPC request envelope, read as little as it needs: which method
//! and tool a call names, its `id`, its key (from the first source that has
//! one) and its fingerprint. Pure: no I/O, no engine.
//!
//! Members are kept as raw JSON text ([`RawValue`]) so that numbers keep
//! their digits and the fingerprint is the guard's canonical form of what the
//! client sent, not of a round trip through `f64`.

mod fingerprint;
mod key;

use std::collections::BTreeSet;

use http::HeaderMap;
use idempotency_guard::{Fingerprint, IdempotencyKey, KeyError};
use serde_json::value::RawValue;

use self::fingerprint::fingerprint;
use self::key::find_key;
pub use self::key::{KeySource, KeySourceError};
use crate::raw::{RawObject, string};

/// The method of an MCP tool call.
pub const TOOLS_CALL: &str = "tools/call";

/// The method of an A2A message send.
pub const MESSAGE_SEND: &str = "message/send";

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
