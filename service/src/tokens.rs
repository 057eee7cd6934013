//! Bearer tokens: the one parser of the tokens files (scope tokens here,
//! admin tokens in [`crate::admin`]) and the constant-time lookup both use.
//!
//! A tokens file holds one token a line: the holder's fields, then the
//! token (`<scope> <token>`; `<name> <scopes> <token>`). Both kinds share
//! every rule, written once in `TokenTable`:
//!
//! - `#` starts a comment only at the start of a line or after whitespace,
//!   so a token containing `#` (`tokenA-0123456789abcdef#tail`) is taken
//!   whole, never cut to its guessable prefix ([`content_of`]);
//! - a line names exactly its fields, and a token has at least
//!   [`MIN_TOKEN_LEN`] characters;
//! - a token configured twice is refused (it would name two holders).
//!
//! Tokens are compared in constant time: every configured token is
//! compared with the presented one (as SHA-256 digests, so lengths never
//! differ) and no comparison stops early. Tokens are never logged, and a
//! table's `Debug` shows only how many it holds.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The shortest token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The content of one tokens-file line: without its comment (a `#` at
/// the start or after a space), trimmed.
pub(crate) fn content_of(line: &str) -> &str {
    let bytes = line.as_bytes();
    let end = bytes
        .iter()
        .enumerate()
        .find(|&(i, &byte)| byte == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()))
        .map_or(line.len(), |(i, _)| i);
    line[..end].trim()
}

/// Why [`TokenTable::add_lines`] refused a line; each kind of tokens file
/// turns it into its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineFault {
    /// Not the holder's fields and a token.
    Malformed,
    /// The token is shorter than [`MIN_TOKEN_LEN`].
    TooShort,
    /// The holder's fields are refused by the kind of file.
    Holder,
    /// The token is already configured.
    Duplicate,
}

/// A refused line: its number (from 1) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineError {
    /// The line number, from 1.
    pub(crate) line: usize,
    /// Why.
    pub(crate) fault: LineFault,
}

/// Tokens, each mapped to its holder `H` (a scope, an admin), by digest.
#[derive(Clone)]
pub(crate) struct TokenTable<H> {
    entries: Vec<([u8; 32], H)>,
}

impl<H> Default for TokenTable<H> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<H: Clone> TokenTable<H> {
    /// Adds `lines`, each `holder_fields` fields then the token; `holder`
    /// turns the fields into the holder (`None`: refused). Blank and
    /// comment lines are skipped; the checks run in this order: the field
    /// count, the token's length, the holder, the duplicate.
    pub(crate) fn add_lines<'a>(
        &mut self,
        lines: impl Iterator<Item = &'a str>,
        holder_fields: usize,
        holder: impl Fn(&[&str]) -> Option<H>,
    ) -> Result<(), LineError> {
        for (index, text) in lines.enumerate() {
            let refused = |fault| LineError {
                line: index + 1,
                fault,
            };
            let content = content_of(text);
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().take(holder_fields + 2).collect();
            let [holder_part @ .., token] = fields.as_slice() else {
                return Err(refused(LineFault::Malformed));
            };
            if holder_part.len() != holder_fields {
                return Err(refused(LineFault::Malformed));
            }
            if token.len() < MIN_TOKEN_LEN {
                return Err(refused(LineFault::TooShort));
            }
            let holder = holder(holder_part).ok_or(refused(LineFault::Holder))?;
            let digest = digest(token);
            if self.entries.iter().any(|(known, _)| *known == digest) {
                return Err(refused(LineFault::Duplicate));
            }
            self.entries.push((digest, holder));
        }
        Ok(())
    }

    /// How many tokens are configured.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The holder of `presented`, if it is a configured token. Takes the
    /// same time whichever token matches, or none.
    pub(crate) fn holder_of(&self, presented: &str) -> Option<H> {
        let presented = digest(presented);
        let mut found = subtle::Choice::from(0);
        let mut index = 0u64;
        for (i, (known, _)) in self.entries.iter().enumerate() {
            let matches = known.ct_eq(&presented);
            index = u64::conditional_select(&index, &(i as u64), matches);
            found |= matches;
        }
        bool::from(found)
            .then(|| usize::try_from(index).ok())
            .flatten()
            .and_then(|i| self.entries.get(i))
            .map(|(_, holder)| holder.clone())
    }

    /// The holder of an `Authorization: Bearer <token>` header value.
    pub(crate) fn authenticate(&self, authorization: Option<&http::HeaderValue>) -> Option<H> {
        let value = authorization?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.holder_of(token.trim())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The scope a request was authenticated for: the guard's [`Scope`] (1
/// to 255 bytes, no control character), checked once, when the token file
/// is read.
pub(crate) use idempotency_guard::Scope;

/// The configured scope tokens (`<scope> <token>` lines).
#[derive(Clone, Default)]
pub struct Tokens {
    table: TokenTable<Scope>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.table.len())
            .finish_non_exhaustive()
    }
}

/// A tokens file or string could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read the tokens file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `<scope> <token>`.
    #[error("line {line}: expected `<scope> <token>`")]
    Malformed {
        /// The line number, from 1.
        line: usize,
    },
    /// A token is shorter than [`MIN_TOKEN_LEN`].
    #[error("line {line}: the token is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort {
        /// The line number, from 1.
        line: usize,
    },
    /// A scope is not a valid [`Scope`]: longer than 255 bytes, or
    /// with a control character.
    #[error("line {line}: the scope is not 1 to 255 bytes without control characters")]
    ScopeInvalid {
        /// The line number, from 1.
        line: usize,
    },
    /// The same token appears twice.
    #[error("line {line}: this token is already configured")]
    Duplicate {
        /// The line number, from 1.
        line: usize,
    },
}

impl From<LineError> for TokensError {
    fn from(LineError { line, fault }: LineError) -> Self {
        match fault {
            LineFault::Malformed => Self::Malformed { line },
            LineFault::TooShort => Self::TooShort { line },
            LineFault::Holder => Self::ScopeInvalid { line },
            LineFault::Duplicate => Self::Duplicate { line },
        }
    }
}

impl Tokens {
    /// Reads `<scope> <token>` lines from a file.
    ///
    /// # Errors
    ///
    /// See [`TokensError`].
    pub fn from_file(path: &Path) -> Result<Self, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut tokens = Self::default();
        tokens.add_lines(text.lines())?;
        Ok(tokens)
    }

    /// Adds `<scope> <token>` pairs separated by `;` or newlines.
    ///
    /// # Errors
    ///
    /// See [`TokensError`].
    pub fn add_pairs(&mut self, pairs: &str) -> Result<(), TokensError> {
        self.add_lines(pairs.split(['\n', ';']))
    }

    fn add_lines<'a>(&mut self, lines: impl Iterator<Item = &'a str>) -> Result<(), TokensError> {
        let scope = |fields: &[&str]| Scope::new(fields[0]).ok();
        Ok(self.table.add_lines(lines, 1, scope)?)
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no token is configured (then every request is refused).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The scope of `presented`, if it is a configured token (the tests
    /// ask; requests go through [`Self::authenticate`]).
    #[cfg(test)]
    fn scope_of(&self, presented: &str) -> Option<Scope> {
        self.table.holder_of(presented)
    }

    /// The scope of an `Authorization: Bearer <token>` header value.
    pub(crate) fn authenticate(&self, authorization: Option<&http::HeaderValue>) -> Option<Scope> {
        self.table.authenticate(authorization)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comment_starts_at_a_hash_after_a_space() {
        assert_eq!(
            content_of("tenant-a token-0123456789abcdef  # note"),
            "tenant-a token-0123456789abcdef"
        );
        assert_eq!(
            content_of("tenant-a token-0123456789#abcdef"),
            "tenant-a token-0123456789#abcdef"
        );
        assert_eq!(content_of("# a comment"), "");
    }
    use http::HeaderValue;

    const A: &str = "token-of-tenant-a-0123456789";
    const B: &str = "token-of-tenant-b-0123456789";

    fn tokens() -> Tokens {
        let mut tokens = Tokens::default();
        tokens
            .add_pairs(&format!(
                "# comment\ntenant-a {A}  # trailing\n\n;tenant-b {B}"
            ))
            .unwrap();
        tokens
    }

    #[test]
    fn a_hash_inside_a_token_is_part_of_it_and_only_a_spaced_one_starts_a_comment() {
        let mut tokens = Tokens::default();
        tokens
            .add_pairs("default tokenA-0123456789abcdef#tail\nother tokenB-0123456789abcdef #note")
            .unwrap();
        assert_eq!(
            tokens.scope_of("tokenA-0123456789abcdef#tail"),
            Scope::new("default").ok(),
            "the configured token is accepted"
        );
        assert_eq!(
            tokens.scope_of("tokenA-0123456789abcdef"),
            None,
            "its prefix is not"
        );
        assert_eq!(
            tokens.scope_of("tokenB-0123456789abcdef"),
            Scope::new("other").ok()
        );
    }

    #[test]
    fn maps_each_token_to_its_scope() {
        let tokens = tokens();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.scope_of(A), Scope::new("tenant-a").ok());
        assert_eq!(tokens.scope_of(B), Scope::new("tenant-b").ok());
        assert_eq!(tokens.scope_of("token-of-tenant-c-0123456789"), None);
        assert_eq!(tokens.scope_of(""), None);
    }

    #[test]
    fn reads_bearer_headers_only() {
        let tokens = tokens();
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(
            tokens
                .authenticate(Some(&header(&format!("Bearer {A}"))))
                .is_some()
        );
        assert!(
            tokens
                .authenticate(Some(&header(&format!("bearer {A}"))))
                .is_some()
        );
        assert!(
            tokens
                .authenticate(Some(&header(&format!("Basic {A}"))))
                .is_none()
        );
        assert!(tokens.authenticate(Some(&header("Bearer"))).is_none());
        assert!(tokens.authenticate(None).is_none());
    }

    #[test]
    fn refuses_bad_lines() {
        let mut tokens = Tokens::default();
        assert!(matches!(
            tokens.add_pairs("only-a-scope"),
            Err(TokensError::Malformed { line: 1 })
        ));
        assert!(matches!(
            tokens.add_pairs("a b c"),
            Err(TokensError::Malformed { .. })
        ));
        assert!(matches!(
            tokens.add_pairs("a short"),
            Err(TokensError::TooShort { .. })
        ));
        assert!(matches!(
            tokens.add_pairs(&format!("a {A}\nb {A}")),
            Err(TokensError::Duplicate { line: 2 })
        ));
    }

    #[test]
    fn refuses_a_scope_longer_than_255_bytes_or_with_a_control_character() {
        let mut tokens = Tokens::default();
        assert!(matches!(
            tokens.add_pairs(&format!("a\u{1}b {A}")),
            Err(TokensError::ScopeInvalid { line: 1 })
        ));
        let long = "s".repeat(256);
        assert!(matches!(
            tokens.add_pairs(&format!("{long} {A}")),
            Err(TokensError::ScopeInvalid { line: 1 })
        ));
        tokens
            .add_pairs(&format!("{} {A}", "s".repeat(255)))
            .unwrap();
        assert_eq!(tokens.len(), 1, "255 bytes is a scope");
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        assert!(!format!("{:?}", tokens()).contains("token-of"));
    }

    /// The one table both kinds of file use: the field count is exact, a
    /// token twice is refused across the lines added so far.
    #[test]
    fn the_table_takes_exactly_its_fields_and_each_token_once() {
        let mut table = TokenTable::<String>::default();
        let holder = |fields: &[&str]| Some(fields.join("/"));
        table
            .add_lines(std::iter::once(format!("a b {A}").as_str()), 2, holder)
            .unwrap();
        assert_eq!(table.holder_of(A).as_deref(), Some("a/b"));
        for (line, fault) in [
            (format!("a {B}"), LineFault::Malformed),
            (format!("a b c {B}"), LineFault::Malformed),
            ("a b short".to_owned(), LineFault::TooShort),
            (format!("x y {A}"), LineFault::Duplicate),
        ] {
            assert_eq!(
                table.add_lines(std::iter::once(line.as_str()), 2, holder),
                Err(LineError { line: 1, fault }),
                "{line}"
            );
        }
        assert_eq!(
            table.add_lines(std::iter::once(format!("a b {B}").as_str()), 2, |_| None::<
                String,
            >),
            Err(LineError {
                line: 1,
                fault: LineFault::Holder
            })
        );
        assert_eq!(table.len(), 1);
    }
}
