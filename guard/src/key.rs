//! The two names of a record, `(scope, key)`, with their rules in one
//! place: [`IdempotencyKey`] (the `Idempotency-Key` header: parsing and
//! validation) and [`Scope`]. Every adapter builds both before it builds a
//! [`Job`](crate::engine::Job), so none validates on its own.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};

/// The request header that carries the idempotency key.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters (after unquoting).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 visible ASCII characters (0x21 to 0x7E).
///
/// The header may carry the key as an RFC 8941 sf-string (`"abc"`) or as a
/// bare value (`abc`); both parse to the same key.
///
/// ```
/// use idempotency_guard::IdempotencyKey;
///
/// let quoted: IdempotencyKey = "\"order-42\"".parse().unwrap();
/// let bare: IdempotencyKey = "order-42".parse().unwrap();
/// assert_eq!(quoted, bare);
/// assert_eq!(bare.as_str(), "order-42");
/// assert!("".parse::<IdempotencyKey>().is_err());
/// assert!("has space".parse::<IdempotencyKey>().is_err());
/// ```
///
/// Cloning it shares its text (one allocation per key, however many parts
/// of a request hold it).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(Arc<str>);

/// Why a key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The request carried no `Idempotency-Key` field.
    #[error("the request has no Idempotency-Key header")]
    Missing,
    /// The request carried the field more than once.
    #[error("the request has more than one Idempotency-Key header")]
    Repeated,
    /// The value is empty after unquoting.
    #[error("the idempotency key is empty")]
    Empty,
    /// The value is longer than [`MAX_KEY_LEN`] characters after unquoting.
    #[error("the idempotency key is longer than 255 characters")]
    TooLong,
    /// The value holds a character outside visible ASCII (0x21 to 0x7E).
    #[error("the idempotency key holds a character outside visible ASCII (0x21 to 0x7E)")]
    InvalidCharacter,
    /// The value starts with `"` but is not a well-formed RFC 8941 sf-string.
    #[error("the idempotency key is not a well-formed RFC 8941 string")]
    MalformedString,
}

impl IdempotencyKey {
    /// Parses a key from the raw bytes of a header value.
    ///
    /// Surrounding spaces and tabs (optional whitespace in RFC 9110) are
    /// ignored; a value that starts with `"` must be a well-formed sf-string.
    ///
    /// # Errors
    ///
    /// Returns a [`KeyError`] saying what is wrong with the value.
    pub fn parse_bytes(raw: &[u8]) -> Result<Self, KeyError> {
        let raw = trim_ows(raw);
        // A bare value (the common case) is checked where it is and copied
        // once, into the key.
        let unquoted = if raw.first() == Some(&b'"') {
            std::borrow::Cow::Owned(unquote_sf_string(raw)?)
        } else {
            std::borrow::Cow::Borrowed(raw)
        };
        if unquoted.is_empty() {
            return Err(KeyError::Empty);
        }
        if unquoted.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !unquoted.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        // Every byte is visible ASCII, so this cannot fail.
        std::str::from_utf8(&unquoted)
            .map(|text| Self(Arc::from(text)))
            .map_err(|_| KeyError::InvalidCharacter)
    }

    /// Validates a key given as it is stored (already unquoted), as in the
    /// status service's path: 1 to 255 visible ASCII characters.
    ///
    /// # Errors
    ///
    /// [`KeyError::Empty`], [`KeyError::TooLong`] or [`KeyError::InvalidCharacter`].
    pub fn from_raw(raw: &str) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !raw.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(KeyError::InvalidCharacter);
        }
        Ok(Self(Arc::from(raw)))
    }

    /// A key the guard made of visible ASCII itself (a step's derived key,
    /// hex): no validation to fail.
    pub(crate) fn from_hex(hex: String) -> Self {
        debug_assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()) && !hex.is_empty());
        Self(Arc::from(hex))
    }

    /// The key `raw`, for the rest of the test process (leaked): a unit
    /// test's `NewRecord` borrows it, and helpers return one.
    #[cfg(test)]
    pub(crate) fn leaked(raw: &str) -> &'static Self {
        Box::leak(Box::new(
            Self::from_raw(raw).expect("a test's key is valid"),
        ))
    }

    /// Reads the key from request headers.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] when there is no `Idempotency-Key` field,
    /// [`KeyError::Repeated`] when there are several, and the parse error of
    /// [`IdempotencyKey::parse_bytes`] otherwise.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, KeyError> {
        let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
        let first = values.next().ok_or(KeyError::Missing)?;
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse_bytes(first.as_bytes())
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Consumes the key and returns its string (a copy: the text is
    /// shared).
    pub fn into_string(self) -> String {
        String::from(&*self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_bytes(s.as_bytes())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// Unquotes an RFC 8941 sf-string: `"` chars `"`, where chars are 0x20 to
/// 0x7E and `\` escapes only `"` and `\`.
fn unquote_sf_string(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let Some(inner) = raw.strip_prefix(b"\"") else {
        return Err(KeyError::MalformedString);
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(KeyError::MalformedString),
            },
            b'"' => {
                // The closing quote must be the last byte.
                return if bytes.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::MalformedString)
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Err(KeyError::MalformedString)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    #[test]
    fn accepts_bare_and_quoted_forms() {
        assert_eq!(IdempotencyKey::parse_bytes(b"abc").unwrap().as_str(), "abc");
        assert_eq!(
            IdempotencyKey::parse_bytes(b"\"abc\"").unwrap().as_str(),
            "abc"
        );
        assert_eq!(
            IdempotencyKey::parse_bytes(br#""a\"b\\c""#)
                .unwrap()
                .as_str(),
            r#"a"b\c"#
        );
        assert_eq!(
            IdempotencyKey::parse_bytes(b"  \tabc \t").unwrap().as_str(),
            "abc"
        );
    }

    #[test]
    fn refuses_what_the_spec_refuses() {
        let cases: &[(&[u8], KeyError)] = &[
            (b"", KeyError::Empty),
            (b"\"\"", KeyError::Empty),
            (b"a b", KeyError::InvalidCharacter),
            (b"\"a b\"", KeyError::InvalidCharacter),
            (b"a\x01b", KeyError::InvalidCharacter),
            (b"caf\xc3\xa9", KeyError::InvalidCharacter),
            (b"\"abc", KeyError::MalformedString),
            (b"\"ab\"c\"", KeyError::MalformedString),
            (b"\"a\\xb\"", KeyError::MalformedString),
            (b"\"a\x7fb\"", KeyError::InvalidCharacter),
        ];
        for (raw, expected) in cases {
            assert_eq!(
                IdempotencyKey::parse_bytes(raw),
                Err(*expected),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn length_bound_is_255_characters_after_unquoting() {
        let max = "k".repeat(255);
        assert!(IdempotencyKey::parse_bytes(max.as_bytes()).is_ok());
        assert!(IdempotencyKey::parse_bytes(format!("\"{max}\"").as_bytes()).is_ok());
        let over = "k".repeat(256);
        assert_eq!(
            IdempotencyKey::parse_bytes(over.as_bytes()),
            Err(KeyError::TooLong)
        );
    }

    #[test]
    fn every_visible_ascii_character_is_a_valid_key_character() {
        let all: String = (0x21u8..=0x7e).map(char::from).collect();
        assert_eq!(
            IdempotencyKey::parse_bytes(all.as_bytes())
                .unwrap()
                .as_str(),
            all
        );
    }

    #[test]
    fn headers_with_zero_or_two_fields_are_refused() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyError::Missing)
        );
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert!(IdempotencyKey::from_headers(&headers).is_ok());
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyError::Repeated)
        );
    }

    proptest! {
        #[test]
        fn any_visible_ascii_string_round_trips_bare_and_quoted(s in "[!-~]{1,255}") {
            // A value that starts with a quote is read as an sf-string.
            prop_assume!(!s.starts_with('"'));
            let bare = IdempotencyKey::parse_bytes(s.as_bytes()).unwrap();
            prop_assert_eq!(bare.as_str(), s.as_str());
            let quoted = format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
            let unquoted = IdempotencyKey::parse_bytes(quoted.as_bytes()).unwrap();
            prop_assert_eq!(unquoted, bare);
        }

        #[test]
        fn parsing_never_panics_and_accepts_only_valid_keys(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(key) = IdempotencyKey::parse_bytes(&raw) {
                let len = key.as_str().len();
                prop_assert!((1..=255).contains(&len));
                prop_assert!(key.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
        }
    }
}

/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 255;

/// A validated scope: the namespace of a key (a tenant, a principal, a
/// queue), 1 to 255 bytes of UTF-8 with no control character (the rule
/// every store can hold: PostgreSQL's check constraint, and no NUL).
///
/// ```
/// use idempotency_guard::Scope;
///
/// let scope = Scope::new("tenant-a").unwrap();
/// assert_eq!(scope.as_str(), "tenant-a");
/// assert!(Scope::new("").is_err());
/// assert!(Scope::new("x".repeat(256)).is_err());
/// assert!(Scope::new("nul\0inside").is_err());
/// ```
///
/// Cloning it shares its text, as a key's does (a store's lease and the
/// request's job hold the same scope).
#[derive(Clone)]
pub struct Scope(ScopeText);

/// Where a scope's text lives: a constant ([`Scope::DEFAULT`]) or one
/// shared allocation, so that no clone of either copies it.
#[derive(Clone)]
enum ScopeText {
    Static(&'static str),
    Shared(Arc<str>),
}

/// Why a scope was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope is empty.
    #[error("the scope is empty")]
    Empty,
    /// The scope is longer than [`MAX_SCOPE_LEN`] bytes.
    #[error("the scope is longer than 255 bytes")]
    TooLong,
    /// The scope holds a control character.
    #[error("the scope holds a control character")]
    ControlCharacter,
}

impl Scope {
    /// Validates `scope`: 1 to 255 bytes, no control character.
    ///
    /// # Errors
    ///
    /// The [`ScopeError`] saying what is wrong.
    pub fn new(scope: impl Into<String>) -> Result<Self, ScopeError> {
        let scope = scope.into();
        Self::from_text(&scope)
    }

    /// Validates `scope` and copies it into its one shared allocation.
    fn from_text(scope: &str) -> Result<Self, ScopeError> {
        if scope.is_empty() {
            return Err(ScopeError::Empty);
        }
        if scope.len() > MAX_SCOPE_LEN {
            return Err(ScopeError::TooLong);
        }
        if scope.chars().any(char::is_control) {
            return Err(ScopeError::ControlCharacter);
        }
        Ok(Self(ScopeText::Shared(Arc::from(scope))))
    }

    /// The scope `text`, for the rest of the test process (leaked): a
    /// unit test's `NewRecord` borrows it, and helpers return one.
    #[cfg(test)]
    pub(crate) fn leaked(text: &str) -> &'static Self {
        Box::leak(Box::new(Self::new(text).expect("a test's scope is valid")))
    }

    /// `default`, the layer's scope when none is set: a constant, so a
    /// request in it allocates nothing for its scope.
    pub(crate) const DEFAULT: Self = Self(ScopeText::Static("default"));

    /// The scope as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            ScopeText::Static(text) => text,
            ScopeText::Shared(text) => text,
        }
    }

    /// Consumes the scope and returns its string (a copy: the text is
    /// shared).
    pub fn into_string(self) -> String {
        String::from(self.as_str())
    }
}

// Equality, order and hash are the text's, whichever way it is held: the
// constant `default` equals a parsed `default`.
impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Scope {}

impl PartialOrd for Scope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for Scope {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_text(s)
    }
}

impl TryFrom<String> for Scope {
    type Error = ScopeError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for Scope {
    type Error = ScopeError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::from_text(s)
    }
}

impl AsRef<str> for Scope {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scope").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    #[test]
    fn the_scope_rule_as_a_table() {
        let rows: [(String, Result<(), ScopeError>); 8] = [
            ("tenant-a".into(), Ok(())),
            ("x".repeat(255), Ok(())),
            ("é".repeat(127), Ok(())),
            ("é".repeat(128), Err(ScopeError::TooLong)),
            (String::new(), Err(ScopeError::Empty)),
            ("x".repeat(256), Err(ScopeError::TooLong)),
            ("a\0b".into(), Err(ScopeError::ControlCharacter)),
            ("tab\there".into(), Err(ScopeError::ControlCharacter)),
        ];
        for (scope, expected) in rows {
            assert_eq!(Scope::new(scope.clone()).map(|_| ()), expected, "{scope:?}");
        }
    }

    #[test]
    fn the_constant_and_a_parsed_scope_are_the_same_scope() {
        let parsed = Scope::new("default").unwrap();
        assert_eq!(Scope::DEFAULT, parsed);
        use std::hash::BuildHasher;
        let state = std::hash::RandomState::new();
        assert_eq!(state.hash_one(&Scope::DEFAULT), state.hash_one(&parsed));
        assert_eq!(format!("{:?}", Scope::DEFAULT), r#"Scope("default")"#);
    }

    #[test]
    fn a_clone_shares_the_text() {
        let scope = Scope::new("tenant-a").unwrap();
        assert_eq!(scope.clone().as_str().as_ptr(), scope.as_str().as_ptr());
    }
}
