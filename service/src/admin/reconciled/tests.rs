//! The reconciled marks: kept across restarts, per life of a key, compacted.

use idempotency_guard::Fingerprint;
use idempotency_guard::store::LeaseToken;
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
        steps: Vec::new(),
        request: None,
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
