//! The reconciled file: one JSON line per mark, appended under an
//! exclusive lock, read back at start and compacted through a temporary
//! file renamed over it (see the [module](super)).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{COMPACT_SLACK, ReconciledError, Reconciliation};

/// A line of the file: the record's identity and the mark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Line {
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

/// A mark's key: the scope and the key.
pub(super) type Identity = (String, String);

/// A mark as kept in memory: the record's life it names, and the mark.
#[derive(Debug, Clone)]
pub(super) struct Kept {
    /// The record's fingerprint.
    pub(super) fingerprint: String,
    /// A digest of the record's lease token (see `life`).
    pub(super) lease: String,
    /// When the record is purged (RFC 3339), when known.
    pub(super) expires_at: Option<String>,
    /// The mark.
    pub(super) mark: Reconciliation,
}

impl Kept {
    /// Whether the record it names has been purged by `now`.
    pub(super) fn expired(&self, now: OffsetDateTime) -> bool {
        self.expires_at
            .as_deref()
            .and_then(|at| OffsetDateTime::parse(at, &Rfc3339).ok())
            .is_some_and(|at| at <= now)
    }
}

/// The marks, and how many lines the file holds for them.
#[derive(Debug, Default)]
pub(super) struct Marks {
    /// The last mark of each key.
    pub(super) kept: HashMap<Identity, Kept>,
    /// How many lines the file holds (stale ones included).
    pub(super) lines: usize,
}

/// How many times a writer opens the file again when a compaction renamed
/// another over it meanwhile (once is the rule; more means a storm of
/// compactions, which a sane deployment does not have).
const REOPENS: usize = 8;

/// Opens `path` for reading and appending (created when missing) and
/// locks it exclusively, making sure the lock is on the file the path
/// names now (not one a compaction renamed another over).
pub(super) fn open_locked(path: &Path) -> std::io::Result<File> {
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
pub(super) fn read(path: &Path, mut file: &File) -> Result<Marks, ReconciledError> {
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
pub(super) fn compact(path: &Path, marks: &mut Marks) -> Result<(), ReconciledError> {
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
    pub(super) fn kept(self) -> Kept {
        Kept {
            fingerprint: self.fingerprint,
            lease: self.lease,
            expires_at: self.expires_at,
            mark: self.mark,
        }
    }

    pub(super) fn of((scope, key): &Identity, kept: &Kept) -> Self {
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
    pub(super) fn worth_compacting(&self) -> bool {
        self.lines > 2 * self.kept.len() + COMPACT_SLACK
    }
}
