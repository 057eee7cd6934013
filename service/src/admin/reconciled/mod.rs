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
//! each line is one `write`, appended under an exclusive lock of the
//! file).
//!
//! # Compaction
//!
//! Each mark is one more line, and a mark outlives its use: the key is
//! marked again (the later line wins), or its record expires (purged at
//! its `expires_at`, which the line carries). So the file is compacted:
//! at start, and whenever it holds more than twice as many lines as live
//! marks (plus [`COMPACT_SLACK`]), it is read again under the lock (with
//! what other replicas appended), reduced to the last mark of each key
//! whose record has not expired, written to a temporary file beside it
//! and renamed over it. A replica that opened the old file before the
//! rename finds, once it holds the lock, that the path names another
//! file, and opens it again, so no mark is appended to a file that is
//! gone. Lines written before `expires_at` was recorded are kept until
//! their key is marked again.

mod file;
#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use idempotency_guard::Record;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;

use file::{Kept, Line, Marks, compact, open_locked, read};

/// The lines a file may hold beyond twice its live marks before a mark
/// compacts it (a few stale lines are not worth a rewrite each).
pub(crate) const COMPACT_SLACK: usize = 64;

/// One record reconciled by an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct Reconciliation {
    /// When it was marked (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub at: String,
    /// Who marked it (the admin token's name).
    pub by: String,
    /// The operator's reason.
    pub reason: String,
}

/// Why the reconciled file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconciledError {
    /// The file could not be read, appended to or compacted.
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

/// The reconciled marks, in memory and (when configured) in a file.
///
/// An operator's mark (`POST /v1/admin/keys/{scope}/{key}/reconcile`)
/// takes an abandoned record off the list of those needing a decision.
/// It names one life of the key (its fingerprint and a digest of its
/// lease token), not the key: once the key is claimed again, the old
/// mark no longer applies. The service keeps the marks, not the store: in
/// an append-only file of JSON lines (`RECONCILED_FILE`; several replicas
/// may share it, each line appended under an exclusive lock), compacted
/// at start and whenever it holds more than twice as many lines as live
/// marks; without a file, in memory (lost at restart).
#[derive(Debug, Default)]
pub struct Reconciled {
    path: Option<PathBuf>,
    marks: Mutex<Marks>,
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

    /// Marks kept in `path` (created when missing), read now and
    /// compacted when it holds a stale line (see [`Reconciled`]).
    ///
    /// # Errors
    ///
    /// When the file cannot be read, locked or rewritten, or holds a line
    /// that is not a mark.
    pub fn from_file(path: &Path) -> Result<Self, ReconciledError> {
        let file = open_locked(path).map_err(|source| ReconciledError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut marks = read(path, &file)?;
        let now = OffsetDateTime::now_utc();
        if marks.lines > marks.kept.len() || marks.kept.values().any(|kept| kept.expired(now)) {
            compact(path, &mut marks)?;
        }
        drop(file);
        Ok(Self {
            path: Some(path.to_owned()),
            marks: Mutex::new(marks),
        })
    }

    /// The mark of `record`'s life, if an operator reconciled it.
    pub(crate) fn of(&self, record: &Record) -> Option<Reconciliation> {
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = marks.kept.get(&(
            record.scope.as_str().to_owned(),
            record.key.as_str().to_owned(),
        ))?;
        (kept.fingerprint == record.fingerprint.to_string() && kept.lease == life(record))
            .then(|| kept.mark.clone())
    }

    /// Marks `record` reconciled (appended to the file first, when there
    /// is one, and the file compacted when it is worth it).
    ///
    /// # Errors
    ///
    /// When the file cannot be appended to (the mark is then not taken).
    /// A compaction that fails leaves the file as it was, the mark in it.
    pub(crate) fn mark(
        &self,
        record: &Record,
        mark: Reconciliation,
    ) -> Result<(), ReconciledError> {
        let identity = (
            record.scope.as_str().to_owned(),
            record.key.as_str().to_owned(),
        );
        let kept = Kept {
            fingerprint: record.fingerprint.to_string(),
            lease: life(record),
            expires_at: record.expires_at.format(&Rfc3339).ok(),
            mark,
        };
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(path) = &self.path else {
            marks.kept.insert(identity, kept);
            return Ok(());
        };
        let io = |source| ReconciledError::Io {
            path: path.clone(),
            source,
        };
        let mut text = serde_json::to_string(&Line::of(&identity, &kept)).unwrap_or_default();
        text.push('\n');
        let mut file = open_locked(path).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        marks.lines += 1;
        marks.kept.insert(identity, kept);
        if marks.worth_compacting() {
            // Read again: other replicas may have appended marks.
            let compacted = read(path, &file).and_then(|mut all| {
                compact(path, &mut all)?;
                Ok(all)
            });
            match compacted {
                Ok(all) => *marks = all,
                Err(error) => tracing::warn!(error = %error, "cannot compact the reconciled file"),
            }
        }
        Ok(())
    }
}
