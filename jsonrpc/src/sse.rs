//! The event-stream (SSE) form of answers: one message as an event, the
//! scanner that finds a call's final response in a server's stream, and the
//! stripper that takes the resumption fields out of it. Pure: no I/O.

use bytes::Bytes;
use http::{HeaderMap, header};
use serde_json::value::RawValue;

use crate::reply::is_response_to;

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

/// Whether a response is an event stream (its `Content-Type`).
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
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
}
