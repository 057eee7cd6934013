//! The request fingerprint and the JSON canonical form it hashes.
//!
//! A fingerprint is SHA-256 over the method, the path and query, and the body.
//! When the request says its body is JSON (`application/json` or
//! `application/*+json`) and the body parses, the body is hashed in canonical
//! form, so the same JSON written differently is the same request:
//!
//! - object members sorted by key (by the key's UTF-8 bytes);
//! - no insignificant whitespace;
//! - strings decoded and written again with the fewest escapes (`\"`, `\\`,
//!   `\b`, `\f`, `\n`, `\r`, `\t`, `\u00XX` for other control characters), so
//!   `"\u0041"` and `"A"` are equal;
//! - numbers copied exactly as written (`1.0` and `1` differ: an API may well
//!   treat them differently, and no precision is ever lost, however many
//!   digits the number has).
//!
//! A body that is not valid JSON, nests deeper than [`MAX_JSON_DEPTH`], holds
//! a lone surrogate escape or repeats a key inside one object is hashed as raw
//! bytes instead: the guard never guesses which duplicate a handler would keep.
//! A raw body is hashed together with its `Content-Type` (the same bytes as
//! `text/plain` and as `application/octet-stream` are two requests); a JSON
//! body with the media type's essence (`application/json` and
//! `application/merge-patch+json` differ, a `charset` parameter does not).
//!
//! # Why not an RFC 8785 (JCS) canonicalizer
//!
//! The JSON Canonicalization Scheme writes numbers the way ECMAScript prints
//! an IEEE 754 double: every number is parsed into a double first. Two
//! different amounts then become one request (`9007199254740993`, which is
//! 2^53 + 1, reads as 2^53), so a retry with another amount would be
//! replayed the first one's answer. The crates that implement it do exactly
//! that, or need serde_json's workspace-wide `arbitrary_precision` feature.
//! The form here keeps every number's digits as written, and is one pass
//! over the bytes with no intermediate tree.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use http::{HeaderMap, HeaderValue, Method, header::CONTENT_TYPE};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

/// The deepest nesting of arrays and objects the canonical form follows.
///
/// Deeper documents are hashed as raw bytes; the bound keeps hostile input
/// from exhausting the stack.
pub const MAX_JSON_DEPTH: usize = 128;

/// A SHA-256 fingerprint of a request, shown as `sha256:<64 lowercase hex>`.
///
/// ```
/// use http::{HeaderMap, Method};
/// use idempotency_guard::Fingerprint;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("content-type", "application/json".parse().unwrap());
/// let a = Fingerprint::of_request(&Method::POST, "/payments", &headers, br#"{"b": 1, "a": 2}"#);
/// let b = Fingerprint::of_request(&Method::POST, "/payments", &headers, br#"{"a":2,"b":1}"#);
/// assert_eq!(a, b);
/// assert!(a.to_string().starts_with("sha256:"));
/// assert_eq!(a.to_string().parse::<Fingerprint>().unwrap(), a);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The text given to [`Fingerprint::from_str`](std::str::FromStr) is not
/// `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a fingerprint is written sha256:<64 lowercase hex digits>")]
pub struct FingerprintParseError;

impl Fingerprint {
    /// Fingerprints a request from its method, path and query, headers and body.
    pub fn of_request(
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_str().as_bytes());
        hasher.update(b"\n");
        hasher.update(path_and_query.as_bytes());
        hasher.update(b"\n");
        let content_type = headers.get(CONTENT_TYPE);
        let canonical = if is_json(content_type) {
            canonical_json(body).ok()
        } else {
            None
        };
        match canonical {
            Some(canonical) => {
                hasher.update(b"json\n");
                hasher.update(media_type_essence(content_type).as_bytes());
                hasher.update(b"\n");
                hasher.update(&canonical);
            }
            None => {
                hasher.update(b"raw\n");
                hasher.update(content_type.map_or(&b""[..], HeaderValue::as_bytes));
                hasher.update(b"\n");
                hasher.update(body);
            }
        }
        Self(hasher.finalize().into())
    }

    /// Fingerprints a payload that is not an HTTP request (a message body):
    /// SHA-256 over its bytes, as they are.
    ///
    /// ```
    /// use idempotency_guard::Fingerprint;
    ///
    /// assert_eq!(Fingerprint::of_bytes(b"order 42"), Fingerprint::of_bytes(b"order 42"));
    /// assert_ne!(Fingerprint::of_bytes(b"order 42"), Fingerprint::of_bytes(b"order 43"));
    /// ```
    pub fn of_bytes(payload: &[u8]) -> Self {
        Self(Sha256::digest(payload).into())
    }

    /// Fingerprints the concatenation of `parts` without copying them into
    /// one buffer: the same digest as [`Fingerprint::of_bytes`] of the
    /// parts joined.
    ///
    /// ```
    /// use idempotency_guard::Fingerprint;
    ///
    /// let joined = Fingerprint::of_bytes(b"/pkg.S/Pay\0message");
    /// assert_eq!(Fingerprint::of_parts(&[b"/pkg.S/Pay", b"\0", b"message"]), joined);
    /// ```
    pub fn of_parts(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    /// Wraps 32 bytes of a SHA-256 digest.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = FingerprintParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix("sha256:").ok_or(FingerprintParseError)?;
        if hex.len() != 64 {
            return Err(FingerprintParseError);
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            *byte = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Ok(Self(bytes))
    }
}

fn hex_digit(c: u8) -> Result<u8, FingerprintParseError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(FingerprintParseError),
    }
}

/// The media type without parameters, lowercased (`application/json`):
/// borrowed from the header when it is lowercase already, as it nearly
/// always is.
fn media_type_essence(content_type: Option<&HeaderValue>) -> Cow<'_, str> {
    let essence = content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim();
    if essence.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(essence.to_ascii_lowercase())
    } else {
        Cow::Borrowed(essence)
    }
}

/// Whether a content type names JSON: `application/json` or `application/*+json`.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(Ok(value)) = content_type.map(HeaderValue::to_str) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some(subtype) = essence
        .get(..12)
        .filter(|prefix| prefix.eq_ignore_ascii_case("application/"))
        .map(|_| &essence[12..])
    else {
        return false;
    };
    subtype.eq_ignore_ascii_case("json")
        || subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json")
}

/// Why a body has no canonical JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalJsonError {
    /// The text is not valid JSON (RFC 8259) at the given byte offset.
    #[error("invalid JSON at byte {0}")]
    Syntax(usize),
    /// Arrays and objects nest deeper than [`MAX_JSON_DEPTH`].
    #[error("JSON nests deeper than {MAX_JSON_DEPTH} levels")]
    TooDeep,
    /// An object repeats a key, at the given byte offset.
    #[error("an object repeats a key at byte {0}")]
    DuplicateKey(usize),
}

/// Writes a JSON text in canonical form (see the module docs).
///
/// ```
/// use idempotency_guard::fingerprint::canonical_json;
///
/// let canonical = canonical_json(br#" { "b" : [1.50, true], "a" : "\u0041" } "#).unwrap();
/// assert_eq!(canonical, br#"{"a":"A","b":[1.50,true]}"#);
/// ```
///
/// # Errors
///
/// Returns a [`CanonicalJsonError`] when the text is not JSON, nests too
/// deeply or repeats a key inside one object.
pub fn canonical_json(text: &[u8]) -> Result<Vec<u8>, CanonicalJsonError> {
    let mut parser = Parser { text, pos: 0 };
    // Twice the text: an object writes its members' values first, then
    // itself in key order after them (see `Parser::object`), and the
    // canonical form is no longer than the text but for escapes.
    let mut out = Vec::with_capacity(text.len().saturating_mul(2));
    parser.skip_whitespace();
    parser.value(&mut out, 0)?;
    parser.skip_whitespace();
    if parser.pos != text.len() {
        return Err(CanonicalJsonError::Syntax(parser.pos));
    }
    Ok(out)
}

/// An object's member while it is parsed: its key, and where its
/// canonical value lies in the output.
type Member<'a> = (Cow<'a, [u8]>, Range<usize>);

struct Parser<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn error(&self) -> CanonicalJsonError {
        CanonicalJsonError::Syntax(self.pos)
    }

    fn expect(&mut self, byte: u8) -> Result<(), CanonicalJsonError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), CanonicalJsonError> {
        match self.peek() {
            Some(b'{') => self.object(out, depth + 1),
            Some(b'[') => self.array(out, depth + 1),
            Some(b'"') => {
                let decoded = self.string()?;
                write_string(out, &decoded);
                Ok(())
            }
            Some(b't') => self.literal(out, b"true"),
            Some(b'f') => self.literal(out, b"false"),
            Some(b'n') => self.literal(out, b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            _ => Err(self.error()),
        }
    }

    fn literal(&mut self, out: &mut Vec<u8>, word: &[u8]) -> Result<(), CanonicalJsonError> {
        if self.text[self.pos..].starts_with(word) {
            self.pos += word.len();
            out.extend_from_slice(word);
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), CanonicalJsonError> {
        if depth > MAX_JSON_DEPTH {
            return Err(CanonicalJsonError::TooDeep);
        }
        self.expect(b'{')?;
        // Each member's value is written at the end of `out` first, in the
        // text's order; then the object, in key order, after them; then it
        // is moved back over them. Each member's key (borrowed from the text
        // unless it has escapes) and where its value lies stay on the stack
        // for a small object: no allocation per object.
        let mut members: SmallVec<[Member<'_>; 8]> = SmallVec::new();
        let start = out.len();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            out.extend_from_slice(b"{}");
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            let key = self.string()?;
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let from = out.len();
            self.value(out, depth)?;
            members.push((key, from..out.len()));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(self.error()),
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        if members.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return Err(CanonicalJsonError::DuplicateKey(self.pos));
        }
        let values_end = out.len();
        out.push(b'{');
        for (i, (key, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, key);
            out.push(b':');
            out.extend_from_within(value.clone());
        }
        out.push(b'}');
        out.copy_within(values_end.., start);
        out.truncate(out.len() - (values_end - start));
        Ok(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Result<(), CanonicalJsonError> {
        if depth > MAX_JSON_DEPTH {
            return Err(CanonicalJsonError::TooDeep);
        }
        self.expect(b'[')?;
        out.push(b'[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            out.push(b']');
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.value(out, depth)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    out.push(b',');
                }
                Some(b']') => {
                    self.pos += 1;
                    out.push(b']');
                    return Ok(());
                }
                _ => return Err(self.error()),
            }
        }
    }

    /// Validates a number (RFC 8259 grammar) and copies it exactly.
    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), CanonicalJsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error()),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.one_or_more_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.one_or_more_digits()?;
        }
        out.extend_from_slice(&self.text[start..self.pos]);
        Ok(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Result<(), CanonicalJsonError> {
        let start = self.pos;
        self.digits();
        if self.pos == start {
            Err(self.error())
        } else {
            Ok(())
        }
    }

    /// Parses a string and returns its decoded UTF-8 bytes.
    fn string(&mut self) -> Result<Cow<'a, [u8]>, CanonicalJsonError> {
        self.expect(b'"')?;
        let text = self.text;
        // Without escapes, the decoded string is the text itself.
        let start = self.pos;
        let run = text[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            .ok_or(CanonicalJsonError::Syntax(text.len()))?;
        if text[start + run] == b'"' {
            let plain = &text[start..start + run];
            std::str::from_utf8(plain)
                .map_err(|e| CanonicalJsonError::Syntax(start + e.valid_up_to()))?;
            self.pos = start + run + 1;
            return Ok(Cow::Borrowed(plain));
        }
        let mut decoded = Vec::new();
        loop {
            // Copy the run of plain bytes up to the next quote, escape or control byte.
            let run = self.text[self.pos..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .ok_or(CanonicalJsonError::Syntax(self.text.len()))?;
            let plain = &self.text[self.pos..self.pos + run];
            std::str::from_utf8(plain)
                .map_err(|e| CanonicalJsonError::Syntax(self.pos + e.valid_up_to()))?;
            decoded.extend_from_slice(plain);
            self.pos += run;
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Cow::Owned(decoded));
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut decoded)?;
                }
                _ => return Err(self.error()),
            }
        }
    }

    fn escape(&mut self, decoded: &mut Vec<u8>) -> Result<(), CanonicalJsonError> {
        let byte = self.peek().ok_or_else(|| self.error())?;
        self.pos += 1;
        let simple = match byte {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let c = self.unicode_escape()?;
                let mut buf = [0u8; 4];
                decoded.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                return Ok(());
            }
            _ => return Err(CanonicalJsonError::Syntax(self.pos - 1)),
        };
        decoded.push(simple);
        Ok(())
    }

    /// Reads the `XXXX` of a `\uXXXX` escape (and its low surrogate pair).
    fn unicode_escape(&mut self) -> Result<char, CanonicalJsonError> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if !self.text[self.pos..].starts_with(b"\\u") {
                    return Err(self.error());
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(self.error());
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(self.error()),
            _ => first,
        };
        char::from_u32(code).ok_or_else(|| self.error())
    }

    fn hex4(&mut self) -> Result<u32, CanonicalJsonError> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error())?;
        let mut value = 0u32;
        for &d in digits {
            let nibble = (d as char).to_digit(16).ok_or_else(|| self.error())?;
            value = value * 16 + nibble;
        }
        self.pos += 4;
        Ok(value)
    }
}

/// Writes decoded string bytes as a JSON string with the fewest escapes:
/// runs that need none are copied whole.
fn write_string(out: &mut Vec<u8>, decoded: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let mut rest = decoded;
    while let Some(at) = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
    {
        out.extend_from_slice(&rest[..at]);
        match rest[at] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            control => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(control >> 4)]);
                out.push(HEX[usize::from(control & 0xf)]);
            }
        }
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn canon(text: &str) -> Result<String, CanonicalJsonError> {
        canonical_json(text.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canon(" {\"b\": {\"z\": 1, \"y\": [ 1 , 2 ]}, \"a\": null}\n").unwrap(),
            r#"{"a":null,"b":{"y":[1,2],"z":1}}"#
        );
    }

    #[test]
    fn keeps_numbers_exactly_as_written() {
        let huge = format!("[{}]", "9".repeat(10_000));
        assert_eq!(canon(&huge).unwrap(), huge);
        assert_eq!(
            canon("[1.0, 1, 1e3, -0.5E-7]").unwrap(),
            "[1.0,1,1e3,-0.5E-7]"
        );
        for bad in ["01", "1.", ".5", "-", "1e", "+1", "0x10", "NaN", "Infinity"] {
            assert!(canon(bad).is_err(), "{bad} is not a JSON number");
        }
    }

    #[test]
    fn two_to_the_53_plus_one_is_not_two_to_the_53() {
        // A double cannot tell these apart; RFC 8785 canonicalizers would
        // make them one request.
        let json = |body: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Fingerprint::of_request(&Method::POST, "/payments", &headers, body.as_bytes())
        };
        let (odd, even) = (9_007_199_254_740_993_u64, 9_007_199_254_740_992_u64);
        assert_eq!(odd as f64, even as f64, "the doubles collide");
        assert_ne!(
            json(r#"{"amount": 9007199254740993}"#),
            json(r#"{"amount": 9007199254740992}"#)
        );
        assert_eq!(canon("[9007199254740993]").unwrap(), "[9007199254740993]");
    }

    #[test]
    fn the_content_type_is_part_of_a_raw_body_fingerprint() {
        let with = |content_type: &'static str, body: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            Fingerprint::of_request(&Method::POST, "/upload", &headers, body)
        };
        assert_ne!(
            with("text/plain", b"hello"),
            with("application/octet-stream", b"hello")
        );
        assert_eq!(
            with("application/json", br#"{"a":1}"#),
            with("application/json; charset=utf-8", br#"{ "a": 1 }"#)
        );
        assert_ne!(
            with("application/json", br#"{"a":1}"#),
            with("application/merge-patch+json", br#"{"a":1}"#)
        );
    }

    #[test]
    fn normalizes_string_escapes() {
        assert_eq!(canon(r#""\u0041\/\u00e9""#).unwrap(), "\"A/é\"");
        assert_eq!(canon(r#""\ud83d\ude00""#).unwrap(), "\"😀\"");
        assert_eq!(canon(r#""\u0001\n""#).unwrap(), r#""\u0001\n""#);
        assert!(canon(r#""\ud83d""#).is_err(), "lone high surrogate");
        assert!(canon(r#""\ude00""#).is_err(), "lone low surrogate");
        assert!(canon("\"a\u{1}b\"").is_err(), "raw control character");
        assert!(canonical_json(b"\"\xff\"").is_err(), "invalid UTF-8");
    }

    #[test]
    fn refuses_duplicate_keys() {
        assert!(matches!(
            canon(r#"{"a":1,"a":2}"#),
            Err(CanonicalJsonError::DuplicateKey(_))
        ));
        assert!(matches!(
            canon(r#"{"a":1,"\u0061":1}"#),
            Err(CanonicalJsonError::DuplicateKey(_))
        ));
    }

    #[test]
    fn bounds_nesting_depth_without_overflowing_the_stack() {
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH),
            "]".repeat(MAX_JSON_DEPTH)
        );
        assert!(canon(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(canon(&deep), Err(CanonicalJsonError::TooDeep));
        let deep_objects = "{\"a\":".repeat(100_000);
        assert_eq!(canon(&deep_objects), Err(CanonicalJsonError::TooDeep));
    }

    #[test]
    fn refuses_trailing_garbage_and_empty_input() {
        for bad in [
            "",
            "   ",
            "{} {}",
            "[1,]",
            "{\"a\":1,}",
            "{a:1}",
            "tru",
            "[1 2]",
        ] {
            assert!(canon(bad).is_err(), "{bad:?} is not JSON");
        }
    }

    #[test]
    fn content_type_decides_whether_the_body_is_read_as_json() {
        for (ct, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/problem+json", true),
            ("application/jsonx", false),
            ("text/json", false),
            ("text/plain", false),
        ] {
            assert_eq!(is_json(Some(&HeaderValue::from_static(ct))), json, "{ct}");
        }
        assert!(!is_json(None));
    }

    #[test]
    fn fingerprint_covers_method_path_and_body() {
        let mut json = HeaderMap::new();
        json.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let base = Fingerprint::of_request(&Method::POST, "/p?x=1", &json, br#"{"a":1}"#);
        assert_ne!(
            base,
            Fingerprint::of_request(&Method::PATCH, "/p?x=1", &json, br#"{"a":1}"#)
        );
        assert_ne!(
            base,
            Fingerprint::of_request(&Method::POST, "/p?x=2", &json, br#"{"a":1}"#)
        );
        assert_ne!(
            base,
            Fingerprint::of_request(&Method::POST, "/p?x=1", &json, br#"{"a":2}"#)
        );
        assert_eq!(
            base,
            Fingerprint::of_request(&Method::POST, "/p?x=1", &json, b"{ \"a\" : 1 }")
        );
        // The same bytes sent as text are a different request from the JSON ones.
        let text = HeaderMap::new();
        assert_ne!(
            base,
            Fingerprint::of_request(&Method::POST, "/p?x=1", &text, br#"{"a":1}"#)
        );
        // Invalid JSON under a JSON content type is hashed raw, byte for byte.
        let broken = Fingerprint::of_request(&Method::POST, "/p", &json, b"{oops");
        assert_ne!(
            broken,
            Fingerprint::of_request(&Method::POST, "/p", &json, b"{oops ")
        );
    }

    #[test]
    fn display_and_parse_round_trip() {
        let fp = Fingerprint::from_bytes([0xab; 32]);
        let text = fp.to_string();
        assert_eq!(text, format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(text.parse::<Fingerprint>(), Ok(fp));
        assert!(
            format!("sha256:{}", "AB".repeat(32))
                .parse::<Fingerprint>()
                .is_err()
        );
        assert!("sha256:abc".parse::<Fingerprint>().is_err());
        assert!(
            format!("md5:{}", "ab".repeat(32))
                .parse::<Fingerprint>()
                .is_err()
        );
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // Binary fractions: their shortest decimal form parses back exactly.
            any::<i32>().prop_map(|n| Value::from(f64::from(n) / 8.0 + 0.125)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes a value with whitespace and members in reverse order.
    fn scrambled(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("\n \"{}\" :\t{} ", escape_all(k), scrambled(v)))
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(scrambled).collect();
                format!("[ {} ]", items.join(" ,\n"))
            }
            Value::String(s) => format!("\"{}\"", escape_all(s)),
            other => other.to_string(),
        }
    }

    /// Escapes every character as `\uXXXX`, the opposite of minimal escaping.
    fn escape_all(s: &str) -> String {
        s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
    }

    proptest! {
        #[test]
        fn canonical_form_is_idempotent(value in json_value()) {
            let once = canonical_json(scrambled(&value).as_bytes()).unwrap();
            let twice = canonical_json(&once).unwrap();
            prop_assert_eq!(&once, &twice);
        }

        #[test]
        fn equal_values_have_equal_canonical_forms(value in json_value()) {
            let compact = canonical_json(serde_json::to_string(&value).unwrap().as_bytes()).unwrap();
            let pretty = canonical_json(serde_json::to_string_pretty(&value).unwrap().as_bytes()).unwrap();
            let odd = canonical_json(scrambled(&value).as_bytes()).unwrap();
            prop_assert_eq!(&compact, &pretty);
            prop_assert_eq!(&compact, &odd);
            // The canonical form is JSON and means the same value.
            let back: Value = serde_json::from_slice(&compact).unwrap();
            prop_assert_eq!(back, value);
        }

        #[test]
        fn different_values_have_different_canonical_forms(a in json_value(), b in json_value()) {
            let ca = canonical_json(serde_json::to_string(&a).unwrap().as_bytes()).unwrap();
            let cb = canonical_json(serde_json::to_string(&b).unwrap().as_bytes()).unwrap();
            prop_assert_eq!(a == b, ca == cb);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = canonical_json(&bytes);
        }
    }
}
