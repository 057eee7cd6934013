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

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use idempotency_guard::Record;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;

/// The lines a file may hold beyond twice its live marks before a mark
/// compacts it (a few stale lines are not worth a rewrite each).
pub const COMPACT_SLACK: usize = 64;

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
    /// When the record is purged (RFC 3339); absent in lines written
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
    #[serde(flatten)]
    mark: Reconciliation,
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

type Identity = (String, String);

/// A mark as kept in memory: the record's life it names, and the mark.
#[derive(Debug, Clone)]
struct Kept {
    fingerprint: String,
    lease: String,
    expires_at: Option<String>,
    mark: Reconciliation,
}

impl Kept {
    /// Whether the record it names has been purged by `now`.
    fn expired(&self, now: OffsetDateTime) -> bool {
        self.expires_at
            .as_deref()
            .and_then(|at| OffsetDateTime::parse(at, &Rfc3339).ok())
            .is_some_and(|at| at <= now)
    }
}

/// The marks, and how many lines the file holds for them.
#[derive(Debug, Default)]
struct Marks {
    kept: HashMap<Identity, Kept>,
    lines: usize,
}

/// The reconciled marks, in memory and (when configured) in a file.
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

/// How many times a writer opens the file again when a compaction renamed
/// another over it meanwhile (once is the rule; more means a storm of
/// compactions, which a sane deployment does not have).
const REOPENS: usize = 8;

/// Opens `path` for reading and appending (created when missing) and
/// locks it exclusively, making sure the lock is on the file the path
/// names now (not one a compaction renamed another over).
fn open_locked(path: &Path) -> std::io::Result<File> {
    for _ in 0..REOPENS {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        file.lock()?;
        if names(path, &file)? {
            return Ok(file);
        }
    }
    Err(std::io::Error::other(
        "the file was replaced each time it was opened",
    ))
}

/// Whether `path` still names the open `file`.
#[cfg(unix)]
fn names(path: &Path, file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt as _;
    let open = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(named.dev() == open.dev() && named.ino() == open.ino()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Whether `path` still names the open `file` (elsewhere than on Unix, a
/// file open is not renamed over, so it always does).
#[cfg(not(unix))]
fn names(_path: &Path, _file: &File) -> std::io::Result<bool> {
    Ok(true)
}

/// Reads the marks in `file` (open and locked): the last line of each
/// key wins.
fn read(path: &Path, mut file: &File) -> Result<Marks, ReconciledError> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_string(&mut text))
        .map_err(|source| ReconciledError::Io {
            path: path.to_owned(),
            source,
        })?;
    let mut marks = Marks::default();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(line).map_err(|_| ReconciledError::Line {
            path: path.to_owned(),
            line: number + 1,
        })?;
        marks.lines += 1;
        let identity = (line.scope.clone(), line.key.clone());
        marks.kept.insert(identity, line.kept());
    }
    Ok(marks)
}

/// Rewrites `path` (open and locked by the caller) with one line per live
/// mark of `marks`, through a temporary file renamed over it; the expired
/// marks are dropped from `marks` too.
fn compact(path: &Path, marks: &mut Marks) -> Result<(), ReconciledError> {
    let io = |source| ReconciledError::Io {
        path: path.to_owned(),
        source,
    };
    let now = OffsetDateTime::now_utc();
    marks.kept.retain(|_, kept| !kept.expired(now));
    let mut text = String::new();
    let mut identities: Vec<&Identity> = marks.kept.keys().collect();
    identities.sort();
    for identity in identities {
        let line = Line::of(identity, &marks.kept[identity]);
        text.push_str(&serde_json::to_string(&line).unwrap_or_default());
        text.push('\n');
    }
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".compacting-{}", std::process::id()));
    let temporary = path.with_file_name(name);
    let written = std::fs::File::create(&temporary)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io(error));
    }
    marks.lines = marks.kept.len();
    Ok(())
}

impl Line {
    fn kept(self) -> Kept {
        Kept {
            fingerprint: self.fingerprint,
            lease: self.lease,
            expires_at: self.expires_at,
            mark: self.mark,
        }
    }

    fn of((scope, key): &Identity, kept: &Kept) -> Self {
        Self {
            scope: scope.clone(),
            key: key.clone(),
            fingerprint: kept.fingerprint.clone(),
            lease: kept.lease.clone(),
            expires_at: kept.expires_at.clone(),
            mark: kept.mark.clone(),
        }
    }
}

impl Marks {
    /// Whether the file holds enough stale lines to be rewritten.
    fn worth_compacting(&self) -> bool {
        self.lines > 2 * self.kept.len() + COMPACT_SLACK
    }
}

impl Reconciled {
    /// Marks kept in memory only (lost at restart).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Marks kept in `path` (created when missing), read now and
    /// compacted when it holds a stale line (see the [module](self)).
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
    pub fn of(&self, record: &Record) -> Option<Reconciliation> {
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
    pub fn mark(&self, record: &Record, mark: Reconciliation) -> Result<(), ReconciledError> {
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

#[cfg(test)]
mod tests {
    use idempotency_guard::{Fingerprint, LeaseToken};
    use time::OffsetDateTime;

    use super::*;

    fn record(key: &str) -> Record {
        let now = OffsetDateTime::now_utc();
        Record {
            scope: idempotency_guard::Scope::new("default").unwrap(),
            key: idempotency_guard::IdempotencyKey::from_raw(key).unwrap(),
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

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_file_is_compacted_at_start_to_the_last_live_mark_of_each_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reconciled.jsonl");
        let marks = Reconciled::from_file(&path).unwrap();
        let twice = record("twice");
        let purged = Record {
            expires_at: OffsetDateTime::now_utc() - time::Duration::seconds(1),
            ..record("purged")
        };
        marks.mark(&twice, mark("first look")).unwrap();
        marks.mark(&twice, mark("second look")).unwrap();
        marks.mark(&purged, mark("refunded")).unwrap();
        // A line of an older service, without `expires_at`.
        let old = record("old");
        let old_line = serde_json::to_value(Line::of(
            &("default".to_owned(), "old".to_owned()),
            &Kept {
                fingerprint: old.fingerprint.to_string(),
                lease: life(&old),
                expires_at: None,
                mark: mark("before compaction"),
            },
        ))
        .unwrap();
        assert!(old_line.get("expires_at").is_none());
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!("{old_line}\n"));
        std::fs::write(&path, text).unwrap();
        assert_eq!(lines(&path).len(), 4);

        let again = Reconciled::from_file(&path).unwrap();
        assert_eq!(again.of(&twice), Some(mark("second look")));
        assert_eq!(again.of(&old), Some(mark("before compaction")));
        assert_eq!(again.of(&purged), None, "its record is purged");
        let left = lines(&path);
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left[1].contains("second look") && !left.iter().any(|l| l.contains("first look")));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left: {leftovers:?}");
    }

    #[test]
    fn marks_compact_the_file_as_they_go_and_keep_another_replicas_marks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reconciled.jsonl");
        let one = Reconciled::from_file(&path).unwrap();
        let other = Reconciled::from_file(&path).unwrap();
        let theirs = record("theirs");
        other.mark(&theirs, mark("the other replica's")).unwrap();
        let again = record("again");
        for n in 0..(COMPACT_SLACK + 8) {
            one.mark(&again, mark(&format!("look {n}"))).unwrap();
        }
        let left = lines(&path).len();
        assert!(
            left < COMPACT_SLACK,
            "compacted while marking: {left} lines"
        );
        assert_eq!(
            one.of(&theirs),
            Some(mark("the other replica's")),
            "read with the compaction"
        );
        // The other replica, still running, appends to the file now there.
        let late = record("late");
        other.mark(&late, mark("after the compaction")).unwrap();
        let restarted = Reconciled::from_file(&path).unwrap();
        assert_eq!(restarted.of(&late), Some(mark("after the compaction")));
        assert_eq!(
            restarted.of(&again),
            Some(mark(&format!("look {}", COMPACT_SLACK + 7)))
        );
        assert_eq!(restarted.of(&theirs), Some(mark("the other replica's")));
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
