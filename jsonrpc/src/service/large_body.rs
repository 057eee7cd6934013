//! The `id` of a call whose body is over the limit, so that its refusal
//! goes under the call's own id (SDK clients drop an answer they cannot
//! match): [`Sniffed`] shows each chunk of the bounded read to an
//! [`IdScanner`], and [`id_of_large_body`] reads on, without keeping, what
//! the read left.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use serde_json::value::RawValue;

/// The most of a body over the limit read to find its call's `id`; past
/// it, the refusal goes with a `null` id.
const LARGE_BODY_SCAN: usize = 64 * 1024 * 1024;

/// A request body that shows each chunk to an [`IdScanner`] on its way to
/// the bounded read, and leaves what the read did not take for
/// [`id_of_large_body`].
pub(crate) struct Sniffed {
    body: Option<Body>,
    shared: Arc<Mutex<Sniff>>,
}

/// What [`Sniffed`] saw, and the body it left.
#[derive(Default)]
pub(crate) struct Sniff {
    scanner: IdScanner,
    rest: Option<Body>,
}

impl Sniffed {
    /// `body`, shown to a scanner as it is read, and what the scanner saw.
    pub(crate) fn wrap(body: Body) -> (Body, Arc<Mutex<Sniff>>) {
        let shared = Arc::new(Mutex::new(Sniff::default()));
        let sniffed = Self {
            body: Some(body),
            shared: Arc::clone(&shared),
        };
        (Body::new(sniffed), shared)
    }
}

impl HttpBody for Sniffed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let mut sniff = this.shared.lock().unwrap_or_else(PoisonError::into_inner);
            sniff.scanner.push(data);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(http_body::SizeHint::default, HttpBody::size_hint)
    }
}

impl Drop for Sniffed {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            let mut sniff = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            sniff.rest = Some(body);
        }
    }
}

/// The `id` of a call whose body is over the limit: from what the bounded
/// read saw, then from the rest of the body, read and not kept (up to
/// [`LARGE_BODY_SCAN`] bytes).
pub(crate) async fn id_of_large_body(sniffed: &Mutex<Sniff>) -> Option<Box<RawValue>> {
    let (mut scanner, rest) = {
        let mut sniff = sniffed.lock().unwrap_or_else(PoisonError::into_inner);
        (std::mem::take(&mut sniff.scanner), sniff.rest.take())
    };
    if !scanner.push(&[])
        && let Some(mut rest) = rest
    {
        let mut read = 0;
        while let Some(Ok(frame)) = rest.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            read += data.len();
            if scanner.push(&data) || read > LARGE_BODY_SCAN {
                break;
            }
        }
    }
    scanner.id()
}

/// Finds the `id` of a JSON-RPC request in a body read chunk by chunk,
/// without keeping the body: only the top-level object's `id` member is
/// kept (up to [`IdScanner::MAX_ID`] bytes). Used to answer a body that is
/// over the limit under its call's own id, which the MCP SDK clients need
/// to match the refusal (the TypeScript SDK writes `id` last).
#[derive(Debug, Default)]
struct IdScanner {
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
    fn push(&mut self, chunk: &[u8]) -> bool {
        for &byte in chunk {
            if self.done.is_some() {
                return true;
            }
            self.step(byte);
        }
        self.done.is_some()
    }

    /// The id, when the body held one at its top level.
    fn id(self) -> Option<Box<RawValue>> {
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
