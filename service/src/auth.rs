//! Bearer tokens, each mapped to one scope.
//!
//! Tokens are compared in constant time: every configured token is compared
//! with the presented one (as SHA-256 digests, so lengths never differ) and
//! no comparison stops early. Tokens are never logged.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The shortest token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The scope a request was authenticated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(pub String);

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.entries.len())
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
    /// A scope is longer than 255 bytes.
    #[error("line {line}: the scope is longer than 255 bytes")]
    ScopeTooLong {
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
        for (index, line) in lines.enumerate() {
            let line_number = index + 1;
            let content = crate::tokens::content_of(line);
            if content.is_empty() {
                continue;
            }
            let mut fields = content.split_whitespace();
            let (Some(scope), Some(token), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(TokensError::Malformed { line: line_number });
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(TokensError::TooShort { line: line_number });
            }
            if scope.len() > 255 {
                return Err(TokensError::ScopeTooLong { line: line_number });
            }
            let digest = digest(token);
            if self.entries.iter().any(|(known, _)| *known == digest) {
                return Err(TokensError::Duplicate { line: line_number });
            }
            self.entries.push((digest, scope.to_owned()));
        }
        Ok(())
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is configured (then every request is refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The scope of `presented`, if it is a configured token. Takes the
    /// same time whichever token matches, or none.
    pub fn scope_of(&self, presented: &str) -> Option<Scope> {
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
            .map(|(_, scope)| Scope(scope.clone()))
    }

    /// The scope of an `Authorization: Bearer <token>` header value.
    pub fn authenticate(&self, authorization: Option<&http::HeaderValue>) -> Option<Scope> {
        let value = authorization?.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.scope_of(token.trim())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
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
            Some(Scope("default".into())),
            "the configured token is accepted"
        );
        assert_eq!(
            tokens.scope_of("tokenA-0123456789abcdef"),
            None,
            "its prefix is not"
        );
        assert_eq!(
            tokens.scope_of("tokenB-0123456789abcdef"),
            Some(Scope("other".into()))
        );
    }

    #[test]
    fn maps_each_token_to_its_scope() {
        let tokens = tokens();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.scope_of(A), Some(Scope("tenant-a".into())));
        assert_eq!(tokens.scope_of(B), Some(Scope("tenant-b".into())));
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
    fn debug_output_never_shows_tokens() {
        assert!(!format!("{:?}", tokens()).contains("token-of"));
    }
}
