//! Admin tokens: `<name> <scopes> <token>` lines, read by the service's
//! one tokens-file parser ([`crate::tokens`]), so that a comment, a short
//! or a repeated token follows the same rules as for scope tokens.

use std::path::Path;

use http::HeaderValue;

use crate::tokens::{LineError, LineFault, MIN_TOKEN_LEN, TokenTable};

/// The scopes an admin token may act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scopes {
    /// Every scope (`*`).
    All,
    /// These scopes only.
    Only(Vec<String>),
}

impl Scopes {
    /// Whether `scope` is one of them.
    pub(crate) fn allows(&self, scope: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(scopes) => scopes.iter().any(|s| s == scope),
        }
    }
}

/// The holder of an admin token, as the handlers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admin {
    /// The token's name: who, in audit lines.
    pub name: String,
    /// The scopes it may act on.
    pub scopes: Scopes,
}

/// The configured admin tokens: who may call the admin API
/// (`/v1/admin/...`), and on which scopes.
///
/// Each token is one `<name> <scopes> <token>` line ([`Self::from_file`],
/// `ADMIN_TOKENS_FILE`) or triple ([`Self::add_triples`], `ADMIN_TOKENS`,
/// separated by `;`); `#` starts a comment. `<scopes>` is a
/// comma-separated list of scopes, or `*` for all; `<name>` names the
/// holder in the audit lines (logged on [`AUDIT_TARGET`](crate::AUDIT_TARGET);
/// the token itself never is). Admin tokens and scope tokens are
/// separate: each answers 401 on the other's endpoints.
#[derive(Clone, Default)]
pub struct AdminTokens {
    table: TokenTable<Admin>,
}

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminTokens")
            .field("count", &self.table.len())
            .finish_non_exhaustive()
    }
}

/// An admin tokens file or string could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminTokensError {
    /// The file could not be read.
    #[error("cannot read the admin tokens file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `<name> <scopes> <token>`.
    #[error("admin tokens line {line}: expected `<name> <scopes-comma-separated-or-*> <token>`")]
    Malformed {
        /// The line number, from 1.
        line: usize,
    },
    /// A token is shorter than [`MIN_TOKEN_LEN`].
    #[error("admin tokens line {line}: the token is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort {
        /// The line number, from 1.
        line: usize,
    },
    /// The same token appears twice.
    #[error("admin tokens line {line}: this token is already configured")]
    Duplicate {
        /// The line number, from 1.
        line: usize,
    },
}

impl From<LineError> for AdminTokensError {
    fn from(LineError { line, fault }: LineError) -> Self {
        match fault {
            LineFault::Malformed | LineFault::Holder => Self::Malformed { line },
            LineFault::TooShort => Self::TooShort { line },
            LineFault::Duplicate => Self::Duplicate { line },
        }
    }
}

impl AdminTokens {
    /// Reads `<name> <scopes> <token>` lines from a file.
    ///
    /// # Errors
    ///
    /// See [`AdminTokensError`].
    pub fn from_file(path: &Path) -> Result<Self, AdminTokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| AdminTokensError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut tokens = Self::default();
        tokens.add_lines(text.lines())?;
        Ok(tokens)
    }

    /// Adds `<name> <scopes> <token>` triples separated by `;` or newlines.
    ///
    /// # Errors
    ///
    /// See [`AdminTokensError`].
    pub fn add_triples(&mut self, triples: &str) -> Result<(), AdminTokensError> {
        self.add_lines(triples.split(['\n', ';']))
    }

    fn add_lines<'a>(
        &mut self,
        lines: impl Iterator<Item = &'a str>,
    ) -> Result<(), AdminTokensError> {
        let admin = |fields: &[&str]| {
            Some(Admin {
                name: fields[0].to_owned(),
                scopes: scopes_of(fields[1])?,
            })
        };
        Ok(self.table.add_lines(lines, 2, admin)?)
    }

    /// How many admin tokens are configured.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no admin token is configured (then the admin API refuses
    /// every request).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The admin holding `presented`, if it is a configured token (the
    /// tests ask; requests go through [`Self::authenticate`]).
    #[cfg(test)]
    fn admin_of(&self, presented: &str) -> Option<Admin> {
        self.table.holder_of(presented)
    }

    /// The admin of an `Authorization: Bearer <token>` header value.
    pub(crate) fn authenticate(&self, authorization: Option<&HeaderValue>) -> Option<Admin> {
        self.table.authenticate(authorization)
    }
}

/// `*`, or a comma-separated list of scopes of at most 255 bytes each
/// (`None`: neither).
fn scopes_of(field: &str) -> Option<Scopes> {
    if field == "*" {
        return Some(Scopes::All);
    }
    let list: Vec<String> = field
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if list.is_empty() || list.iter().any(|s| s.len() > 255 || s == "*") {
        return None;
    }
    Some(Scopes::Only(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "admin-token-one-0123456789";
    const T2: &str = "admin-token-two-0123456789";

    #[test]
    fn reads_names_scopes_and_tokens() {
        let mut tokens = AdminTokens::default();
        tokens
            .add_triples(&format!(
                "# ops\nalice * {T1}  # everything\n;bob tenant-a,tenant-b {T2}"
            ))
            .unwrap();
        assert_eq!(tokens.len(), 2);
        let alice = tokens.admin_of(T1).unwrap();
        assert_eq!(
            (alice.name.as_str(), alice.scopes.clone()),
            ("alice", Scopes::All)
        );
        let bob = tokens.admin_of(T2).unwrap();
        assert!(bob.scopes.allows("tenant-b"));
        assert!(!bob.scopes.allows("tenant-c"));
        assert_eq!(tokens.admin_of("admin-token-three-0123456789"), None);
    }

    #[test]
    fn refuses_bad_lines_and_never_shows_tokens() {
        let mut tokens = AdminTokens::default();
        assert!(matches!(
            tokens.add_triples(&format!("alice {T1}")),
            Err(AdminTokensError::Malformed { line: 1 })
        ));
        assert!(matches!(
            tokens.add_triples("alice * short"),
            Err(AdminTokensError::TooShort { .. })
        ));
        assert!(matches!(
            tokens.add_triples(&format!("alice , {T1}")),
            Err(AdminTokensError::Malformed { .. })
        ));
        assert!(matches!(
            tokens.add_triples(&format!("a * {T1}\nb * {T1}")),
            Err(AdminTokensError::Duplicate { line: 2 })
        ));
        assert!(!format!("{tokens:?}").contains("admin-token"));
    }

    /// The rules are the scope tokens' (one parser): a `#` inside a token
    /// is part of it, a spaced one starts a comment.
    #[test]
    fn a_hash_inside_an_admin_token_is_part_of_it() {
        let mut tokens = AdminTokens::default();
        tokens
            .add_triples("alice * admin-token-0123456789#tail\nbob * admin-token-9876543210 #note")
            .unwrap();
        assert_eq!(
            tokens
                .admin_of("admin-token-0123456789#tail")
                .map(|a| a.name),
            Some("alice".to_owned())
        );
        assert_eq!(tokens.admin_of("admin-token-0123456789"), None);
        assert_eq!(
            tokens.admin_of("admin-token-9876543210").map(|a| a.name),
            Some("bob".to_owned())
        );
    }
}
