//! What goes back to the client, written once: the guard's refusals as
//! JSON-RPC error objects, replays under the retry's own `id`, the pure rule
//! that decides whether a server's answer is kept, and the event-stream
//! (SSE) form of an answer. Pure: no I/O, no engine.

use std::time::Duration;

use bytes::Bytes;
use idempotency_guard::engine::Settle;
use idempotency_guard::headers::retry_after_seconds;
use idempotency_guard::problem::{ProblemType, types};
use serde_json::value::RawValue;

use crate::envelope::RawObject;

/// The `_meta` member a replayed result carries, set to `true`.
pub const REPLAYED_META: &str = "io.idempotency/replayed";

/// The `_meta` member a tool sets to `true` on an `isError: true` result to
/// have it stored (a decision, not a failure) instead of released.
pub const FINAL_META: &str = "io.idempotency/final";

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

/// A result, kept: stored and replayed to every retry.
const KEEP: Settle<(), ()> = Settle::Complete {
    response: (),
    reply: (),
};

/// A JSON-RPC error (the call was refused: unknown tool, bad arguments),
/// or a tool result with `isError: true` not marked final: released, so a
/// retry runs it again.
const RELEASE: Settle<(), ()> = Settle::Release {
    reply: (),
    keep_writes: false,
};

/// The pure rule: a response with a `result` is kept unless it is a tool
/// result with `isError: true` whose `_meta` does not set [`FINAL_META`];
/// anything else (an `error`, neither member, not JSON) is released. Never
/// abandoned: an answer that came is known.
pub(crate) fn settle(response: &[u8]) -> Settle<(), ()> {
    #[derive(serde::Deserialize)]
    struct Response {
        result: Option<ToolResult>,
    }
    #[derive(serde::Deserialize)]
    struct ToolResult {
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
        #[serde(rename = "_meta", default)]
        meta: Option<serde_json::Map<String, serde_json::Value>>,
    }
    let Ok(Response {
        result: Some(result),
    }) = serde_json::from_slice::<Response>(response)
    else {
        return RELEASE;
    };
    let is_final = result
        .meta
        .as_ref()
        .and_then(|meta| meta.get(FINAL_META))
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    if result.is_error == Some(true) && !is_final {
        RELEASE
    } else {
        KEEP
    }
}

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

fn raw(text: &str) -> Result<Box<RawValue>, serde_json::Error> {
    RawValue::from_string(text.to_owned())
}

/// One JSON-RPC message as a server-sent event (MCP's form: `event: message`).
pub(crate) fn sse_event(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 32);
    out.extend_from_slice(b"event: message\ndata: ");
    // A JSON text written by this crate or a server has no raw newline
    // outside strings only if compact; split to be safe.
    let text = String::from_utf8_lossy(message);
    let mut lines = text.split('\n');
    if let Some(first) = lines.next() {
        out.extend_from_slice(first.trim_end_matches('\r').as_bytes());
    }
    for line in lines {
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(line.trim_end_matches('\r').as_bytes());
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Reads an event stream as it arrives and finds the final response to one
/// call: the first event whose data is that response. Notifications
/// (progress, logs) and other events are skipped.
#[derive(Debug, Default)]
pub(crate) struct SseScanner {
    pending: Vec<u8>,
}

impl SseScanner {
    /// Adds a chunk of the stream; returns the final response's JSON once
    /// an event holding it has ended.
    pub(crate) fn push(&mut self, chunk: &[u8], id: &RawValue) -> Option<Bytes> {
        self.pending.extend_from_slice(chunk);
        loop {
            let (end, gap) = event_end(&self.pending)?;
            let event: Vec<u8> = self.pending.drain(..end + gap).take(end).collect();
            let data = event_data(&event);
            if is_response_to(&data, id) {
                return Some(Bytes::from(data));
            }
        }
    }
}

/// Where the first complete event ends, and the length of the blank line
/// that ends it.
fn event_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buffer.len() {
        for gap in [&b"\r\n\r\n"[..], b"\n\n", b"\r\r"] {
            if buffer[i..].starts_with(gap) {
                return Some((i, gap.len()));
            }
        }
        i += 1;
    }
    None
}

/// The event's `data:` lines, joined by newlines (the SSE rule).
fn event_data(event: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    let text = String::from_utf8_lossy(event);
    for line in text.split(['\n', '\r']) {
        if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(value.strip_prefix(' ').unwrap_or(value).as_bytes());
        }
    }
    data
}

/// Rewrites a guarded call's event stream without its resumption fields:
/// each event loses its `id:` and `retry:` lines, and an event left with no
/// data (the server's priming event: an `id:`, a `retry:` and an empty
/// `data:`) is dropped. Data, event names and comments pass unchanged.
///
/// Why: a guarded call's answer is complete once stored and is never
/// resumed. An SDK client that saw an event id resumes a lost stream with a
/// `GET` and `Last-Event-ID`, which the server cannot serve for a stream
/// that ended (rmcp answers an empty stream); without an id, the client
/// reports the call as failed at once and its retry gets the replay.
#[derive(Debug, Default)]
pub(crate) struct SseStripper {
    pending: Vec<u8>,
}

impl SseStripper {
    /// Adds a chunk of the stream; returns the events it completed,
    /// stripped.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some((end, gap)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + gap).take(end).collect();
            strip_event(&event, &mut out);
        }
        Bytes::from(out)
    }

    /// The end of the stream: an event it left unfinished, stripped (and
    /// still unfinished: no blank line is added).
    pub(crate) fn finish(self) -> Bytes {
        if self.pending.is_empty() {
            return Bytes::new();
        }
        let mut out = Vec::new();
        let kept = kept_lines(&self.pending);
        if !kept.is_empty() {
            out.extend_from_slice(kept.join(&b'\n').as_slice());
        }
        Bytes::from(out)
    }
}

/// Appends `event` (without its ending blank line) to `out` without its
/// `id` and `retry` fields, unless nothing but empty data is left.
fn strip_event(event: &[u8], out: &mut Vec<u8>) {
    let kept = kept_lines(event);
    let carries = kept.iter().any(|line| {
        line.starts_with(b":")
            || line
                .strip_prefix(b"data:")
                .is_some_and(|value| !value.trim_ascii().is_empty())
    });
    if carries {
        out.extend_from_slice(kept.join(&b'\n').as_slice());
        out.extend_from_slice(b"\n\n");
    }
}

/// The lines of one event that are not an `id` or `retry` field.
fn kept_lines(event: &[u8]) -> Vec<&[u8]> {
    event
        .split(|byte| *byte == b'\n' || *byte == b'\r')
        .filter(|line| !line.is_empty())
        .filter(|line| {
            let field = line.split(|byte| *byte == b':').next().unwrap_or_default();
            // A line starting with a colon is a comment: its field is empty.
            line.starts_with(b":") || (field != b"id" && field != b"retry")
        })
        .collect()
}

/// Finds the `id` of a JSON-RPC request in a body read chunk by chunk,
/// without keeping the body: only the top-level object's `id` member is
/// kept (up to [`IdScanner::MAX_ID`] bytes). Used to answer a body that is
/// over the limit under its call's own id, which the MCP SDK clients need
/// to match the refusal (the TypeScript SDK writes `id` last).
#[derive(Debug, Default)]
pub(crate) struct IdScanner {
    /// Nesting depth: 1 inside the top-level object.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The next string at depth 1 is a member name.
    name_next: bool,
    /// The member name being read (`None`: not reading one, or too long).
    name: Option<Vec<u8>>,
    /// The member name just read is `id`.
    named_id: bool,
    /// The `id` value being read.
    value: Option<Vec<u8>>,
    /// The id found, or `Some(None)` once it cannot be found.
    done: Option<Option<Box<RawValue>>>,
}

impl IdScanner {
    /// The longest id kept.
    const MAX_ID: usize = 256;

    /// Reads a chunk; `true` once the scan is over (found or given up).
    pub(crate) fn push(&mut self, chunk: &[u8]) -> bool {
        for &byte in chunk {
            if self.done.is_some() {
                return true;
            }
            self.step(byte);
        }
        self.done.is_some()
    }

    /// The id, when the body held one at its top level.
    pub(crate) fn id(self) -> Option<Box<RawValue>> {
        self.done.flatten()
    }

    fn step(&mut self, byte: u8) {
        if let Some(value) = self.value.as_mut() {
            let ends = !self.in_string && self.depth == 1 && (byte == b',' || byte == b'}');
            if ends {
                let text = String::from_utf8_lossy(value).trim().to_owned();
                let id = RawValue::from_string(text).ok().filter(|raw| {
                    let first = raw.get().as_bytes().first().copied().unwrap_or(b' ');
                    first == b'"' || first == b'-' || first.is_ascii_digit() || raw.get() == "null"
                });
                self.done = Some(id);
                return;
            }
            value.push(byte);
            if value.len() > Self::MAX_ID {
                self.done = Some(None);
                return;
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if byte == b'\\' {
                self.escaped = true;
            } else if byte == b'"' {
                self.in_string = false;
                if let Some(name) = self.name.take() {
                    self.named_id = name == b"id";
                }
            } else if let Some(name) = self.name.as_mut() {
                name.push(byte);
                if name.len() > 2 {
                    self.name = None;
                }
            }
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.name_next {
                    self.name = Some(Vec::new());
                    self.name_next = false;
                }
            }
            b'{' if self.depth == 0 => {
                self.depth = 1;
                self.name_next = true;
            }
            // Not an object (a batch, a scalar): no call id to find.
            byte if self.depth == 0 && !byte.is_ascii_whitespace() => self.done = Some(None),
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    self.done = Some(None);
                }
            }
            b',' if self.depth == 1 => {
                self.name_next = true;
                self.named_id = false;
            }
            b':' if self.depth == 1 && self.named_id => {
                self.named_id = false;
                self.value = Some(Vec::new());
            }
            _ => {}
        }
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

    #[test]
    fn what_is_kept_truth_table() {
        let cases = [
            (r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#, KEEP),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":false}}"#,
                KEEP,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true}}"#,
                RELEASE,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":{"isError":true,"_meta":{"io.idempotency/final":true}}}"#,
                KEEP,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#,
                RELEASE,
            ),
            ("not json", RELEASE),
            (r#"{"jsonrpc":"2.0","id":1}"#, RELEASE),
            (r#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task"}}"#, KEEP),
        ];
        for (response, expected) in cases {
            assert_eq!(settle(response.as_bytes()), expected, "{response}");
        }
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

    #[test]
    fn the_scanner_finds_the_final_response_across_chunks() {
        let mut scanner = SseScanner::default();
        let id = id("5");
        let progress = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n";
        assert_eq!(scanner.push(progress, &id), None);
        let other = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\r\n\r\n";
        assert_eq!(scanner.push(other, &id), None);
        assert_eq!(
            scanner.push(b"id: 3\nevent: message\ndata: {\"jsonrpc\":", &id),
            None
        );
        let found = scanner.push(b"\"2.0\",\"id\":5,\"result\":{\"ok\":true}}\n\n", &id);
        assert_eq!(
            found.as_deref(),
            Some(&br#"{"jsonrpc":"2.0","id":5,"result":{"ok":true}}"#[..])
        );
        let event = sse_event(br#"{"a":1}"#);
        assert_eq!(&event[..], b"event: message\ndata: {\"a\":1}\n\n");
    }

    #[test]
    fn the_stripper_drops_resumption_fields_and_the_priming_event() {
        let mut stripper = SseStripper::default();
        let priming = stripper.push(b"data:\nid: 0\nretry: 3000\n\n");
        assert_eq!(&priming[..], b"", "the priming event carries nothing else");
        let first = stripper
            .push(b"event: message\ndata: {\"a\":1}\nid: 0/1\n\n: ping\n\nid: 0/2\ndata: {\"b\"");
        assert_eq!(&first[..], b"event: message\ndata: {\"a\":1}\n\n: ping\n\n");
        let second = stripper.push(b":2}\r\n\r\n");
        assert_eq!(&second[..], b"data: {\"b\":2}\n\n");
        assert_eq!(&stripper.push(b"id: 9\ndata: {\"c\"")[..], b"");
        assert_eq!(&stripper.finish()[..], b"data: {\"c\"");
    }

    #[test]
    fn the_id_scanner_finds_the_top_level_id_wherever_it_is() {
        let scan = |chunks: &[&str]| {
            let mut scanner = IdScanner::default();
            for chunk in chunks {
                if scanner.push(chunk.as_bytes()) {
                    break;
                }
            }
            scanner.id().map(|id| id.get().to_owned())
        };
        let last = r#"{"method":"tools/call","params":{"id":"inner","arguments":{"s":"a\"id\":9,"}},"jsonrpc":"2.0","id":7}"#;
        assert_eq!(scan(&[last]).as_deref(), Some("7"));
        let split: Vec<String> = last.chars().map(String::from).collect();
        let split: Vec<&str> = split.iter().map(String::as_str).collect();
        assert_eq!(scan(&split).as_deref(), Some("7"), "one byte at a time");
        assert_eq!(
            scan(&[r#" { "jsonrpc" : "2.0" , "id" : "abc-1" , "params":{}}"#]).as_deref(),
            Some(r#""abc-1""#)
        );
        assert_eq!(scan(&[r#"{"jsonrpc":"2.0","method":"x"}"#]), None);
        assert_eq!(scan(&[r#"[{"id":1}]"#]), None, "a batch has no one id");
        assert_eq!(scan(&[r#"{"id":{"x":1}}"#]), None, "not an id");
        assert_eq!(scan(&[r#"{"jsonrpc":"2.0","id":"#]), None, "cut off");
    }
}
