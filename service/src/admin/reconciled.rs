//! The reconciled marks: which abandoned records an operator reconciled
//! and kept (`POST /v1/admin/keys/{scope}/{key}/reconcile`), so that they
//! no longer count as needing a decision.
//!
//! A mark names one record's life, not a key: the scope, the key, the
//! fingerprint and (a SHA-256 of) the lease token of the record it was
//! taken on. Once that record is released or forgotten and the key is
//! claimed again, the new record has another lease token and the old mark
//! no longer applies to it. (Not the claim time: Redis derives it from the
//! key's remaining TTL at each read, so it moves by a millisecond or so.)
//!
//! # Why the service keeps them, not the store
//!
//! A flag stored with the record would need a column in both SQL schemas
//! (a migration each), a field in the Redis hash and every Lua script that
//! rewrites it, and the tiered, encrypted and batched wrappers to carry
//! it, for a fact that changes no request's answer (a reconciled record
//! still answers `outcome-unknown` until it is released, forgotten or
//! expires). The service keeps them instead, in an append-only file of
//! JSON lines (`RECONCILED_FILE`), read at start; without a file they are
//! kept in memory and lost at restart (the service warns). Several
//! replicas that should share marks share the file (one writer at a time:
//! each line is one `write`, appended).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use idempotency_guard::Record;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One record reconciled by an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reconciliation {
    /// When it was marked (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub at: String,
    /// Who marked it (the admin token's name).
    pub by: String,
    /// The operator's reason.
    pub reason: String,
}

/// A line of the file: the record's identity and the mark.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    scope: String,
    key: String,
    fingerprint: String,
    lease: String,
    #[serde(flatten)]
    mark: Reconciliation,
}

/// Why the reconciled file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconciledError {
    /// The file could not be read or appended to.
    #[error("cannot use the reconciled file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of the file is not a mark.
    #[error("{path}:{line}: not a reconciled mark")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number (from 1).
        line: usize,
    },
}

type Identity = (String, String);

/// The reconciled marks, in memory and (when configured) in a file.
#[derive(Debug, Default)]
pub struct Reconciled {
    path: Option<PathBuf>,
    marks: Mutex<HashMap<Identity, (String, String, Reconciliation)>>,
}

/// The record's life: a digest of its lease token (the token itself is a
/// capability on the record, so it is not written down).
fn life(record: &Record) -> String {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(record.lease_token.as_uuid().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Reconciled {
    /// Marks kept in memory only (lost at restart).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Marks kept in `path` (created when missing), read now.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or holds a line that is not a mark.
    pub fn from_file(path: &Path) -> Result<Self, ReconciledError> {
        let io = |source| ReconciledError::Io {
            path: path.to_owned(),
            source,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(io(error)),
        };
        let mut marks = HashMap::new();
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(line).map_err(|_| ReconciledError::Line {
                path: path.to_owned(),
                line: number + 1,
            })?;
            marks.insert(
                (line.scope, line.key),
                (line.fingerprint, line.lease, line.mark),
            );
        }
        // Fail at start, not at the first mark, when the file cannot be
        // appended to.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        Ok(Self {
            path: Some(path.to_owned()),
            marks: Mutex::new(marks),
        })
    }

    /// The mark of `record`'s life, if an operator reconciled it.
    pub fn of(&self, record: &Record) -> Option<Reconciliation> {
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let (fingerprint, lease, mark) = marks.get(&(record.scope.clone(), record.key.clone()))?;
        (*fingerprint == record.fingerprint.to_string() && *lease == life(record))
            .then(|| mark.clone())
    }

    /// Marks `record` reconciled (appended to the file first, when there
    /// is one).
    ///
    /// # Errors
    ///
    /// When the file cannot be appended to (the mark is then not taken).
    pub fn mark(&self, record: &Record, mark: Reconciliation) -> Result<(), ReconciledError> {
        let line = Line {
            scope: record.scope.clone(),
            key: record.key.clone(),
            fingerprint: record.fingerprint.to_string(),
            lease: life(record),
            mark,
        };
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(path) = &self.path {
            let mut text = serde_json::to_string(&line).unwrap_or_default();
            text.push('\n');
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut file| file.write_all(text.as_bytes()))
                .map_err(|source| ReconciledError::Io {
                    path: path.clone(),
                    source,
                })?;
        }
        marks.insert(
            (line.scope, line.key),
            (line.fingerprint, line.lease, line.mark),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use idempotency_guard::{Fingerprint, LeaseToken};
    use time::OffsetDateTime;

    use super::*;

    fn record(key: &str) -> Record {
        let now = OffsetDateTime::now_utc();
        Record {
            scope: "default".to_owned(),
            key: key.to_owned(),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            method: "POST".to_owned(),
            path: "/debits".to_owned(),
            lease_token: LeaseToken::new(),
            lease_expires_at: now,
            transactional: false,
            response: None,
            created_at: now,
            completed_at: None,
            expires_at: now + time::Duration::hours(1),
            observed_at: now,
        }
    }

    fn mark(reason: &str) -> Reconciliation {
        Reconciliation {
            at: "2026-01-31T12:00:00Z".to_owned(),
            by: "ops".to_owned(),
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn marks_survive_a_restart_and_name_one_life_of_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reconciled.jsonl");
        let lost = record("lost");
        let marks = Reconciled::from_file(&path).unwrap();
        assert_eq!(marks.of(&lost), None);
        marks.mark(&lost, mark("refunded")).unwrap();
        assert_eq!(marks.of(&lost), Some(mark("refunded")));

        let again = Reconciled::from_file(&path).unwrap();
        assert_eq!(again.of(&lost), Some(mark("refunded")), "read back");
        let claimed_again = Record {
            lease_token: LeaseToken::new(),
            ..lost.clone()
        };
        assert_eq!(again.of(&claimed_again), None, "a new life of the key");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains(&lost.lease_token.as_uuid().to_string()),
            "the lease token itself is not written: {text}"
        );
    }

    #[test]
    fn a_line_that_is_not_a_mark_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reconciled.jsonl");
        std::fs::write(&path, "{\"scope\":\"a\"}\n").unwrap();
        let error = Reconciled::from_file(&path).unwrap_err();
        assert!(error.to_string().contains(":1:"), "{error}");
    }
}
