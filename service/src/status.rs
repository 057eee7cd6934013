//! What the service says about a record: a pure mapping from the record
//! (read with the store's clock) to the [`KeyStatus`] answer.

use std::time::Duration;

use idempotency_client::status::{Advice, KeyState, KeyStatus};
use idempotency_guard::{Fingerprint, Record, RecordState};

/// The status of `record`, or `None` when the record counts as absent:
/// past its retention, or a transactional-mode run whose lease lapsed
/// (its writes were rolled back with it: nothing ran).
pub fn key_status(
    record: &Record,
    fingerprint: Option<&Fingerprint>,
    retry_after: Duration,
) -> Option<KeyStatus> {
    if record.is_expired() {
        return None;
    }
    let state = record.state();
    if state == RecordState::Abandoned && record.transactional {
        return None;
    }
    let response = record.response.as_ref();
    let (state, advice) = match state {
        RecordState::InFlight => (KeyState::InFlight, Advice::Wait),
        // A response too large to store cannot be replayed: reconcile.
        RecordState::Completed if response.is_some_and(|r| r.body.is_none()) => {
            (KeyState::Completed, Advice::Reconcile)
        }
        RecordState::Completed => (KeyState::Completed, Advice::Replay),
        // The route keeps its request for the completer, which has not
        // given up on it: it will complete (or the client's retry resumes it).
        RecordState::Abandoned if resumes(record) => (KeyState::Resuming, Advice::Wait),
        RecordState::Abandoned => (KeyState::Abandoned, Advice::Reconcile),
    };
    let retry_after_seconds = match state {
        KeyState::InFlight => {
            let wait = retry_after.min(record.lease_remaining());
            Some((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1))
        }
        KeyState::Resuming => {
            Some((retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1))
        }
        _ => None,
    };
    Some(KeyStatus {
        key: record.key.as_str().to_owned(),
        state,
        advice,
        fingerprint: Some(record.fingerprint.to_string()),
        method: Some(record.method.clone()),
        path: Some(record.path.clone()),
        response_status: response.map(|r| r.status.as_u16()),
        response_stored: response.map(|r| r.body.is_some()),
        created_at: Some(record.created_at),
        completed_at: record.completed_at,
        expires_at: Some(record.expires_at),
        retry_after_seconds,
        fingerprint_matches: fingerprint.map(|f| *f == record.fingerprint),
        found: None,
        steps: (!record.steps.is_empty())
            .then(|| record.steps.iter().map(|step| step.name.clone()).collect()),
    })
}

/// Whether the abandoned `record` will complete by itself: its route keeps
/// its request for the completer ([`Record::request`]), which has not given
/// up on it. Shared with the admin API's "will complete".
pub(crate) fn resumes(record: &Record) -> bool {
    !record.transactional
        && record
            .request
            .as_deref()
            .is_some_and(|request| !request.gave_up)
}

/// The status of a key with no committed record that a single-commit run
/// holds (its advisory lock is taken): in flight, and nothing else is known
/// until it commits.
pub(crate) fn held_status(key: &str, retry_after: Duration) -> KeyStatus {
    let wait = retry_after.max(Duration::from_secs(1));
    KeyStatus {
        key: key.to_owned(),
        state: KeyState::InFlight,
        advice: Advice::Wait,
        fingerprint: None,
        method: None,
        path: None,
        response_status: None,
        response_stored: None,
        created_at: None,
        completed_at: None,
        expires_at: None,
        retry_after_seconds: Some(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)),
        fingerprint_matches: None,
        found: None,
        steps: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};
    use idempotency_guard::StoredResponse;
    use idempotency_guard::store::LeaseToken;
    use time::OffsetDateTime;

    fn record(state: RecordState, transactional: bool) -> Record {
        let now = OffsetDateTime::now_utc();
        let secs = time::Duration::seconds;
        let (lease_expires_at, response) = match state {
            RecordState::InFlight => (now + secs(30), None),
            RecordState::Abandoned => (now - secs(1), None),
            RecordState::Completed => (
                now + secs(30),
                Some(StoredResponse {
                    status: StatusCode::CREATED,
                    headers: HeaderMap::new(),
                    body: Some(Vec::new().into()),
                }),
            ),
        };
        Record {
            scope: idempotency_guard::Scope::new("s").unwrap(),
            key: idempotency_guard::IdempotencyKey::from_raw("k").unwrap(),
            fingerprint: Fingerprint::from_bytes([1; 32]),
            method: "POST".into(),
            path: "/p".into(),
            lease_token: LeaseToken::new(),
            lease_expires_at,
            transactional,
            response,
            created_at: now - secs(5),
            completed_at: (state == RecordState::Completed).then_some(now),
            expires_at: now + secs(3600),
            observed_at: now,
            steps: Vec::new(),
            request: None,
        }
    }

    #[test]
    fn each_state_has_its_advice_and_fields() {
        let second = Duration::from_secs(1);
        let running = key_status(&record(RecordState::InFlight, false), None, second).unwrap();
        assert_eq!(
            (running.state, running.advice, running.retry_after_seconds),
            (KeyState::InFlight, Advice::Wait, Some(1))
        );
        assert_eq!(running.response_status, None);
        let done = key_status(&record(RecordState::Completed, false), None, second).unwrap();
        assert_eq!(
            (done.state, done.advice),
            (KeyState::Completed, Advice::Replay)
        );
        assert_eq!(
            (
                done.response_status,
                done.response_stored,
                done.retry_after_seconds
            ),
            (Some(201), Some(true), None)
        );
        assert!(done.completed_at.is_some());
        let lost = key_status(&record(RecordState::Abandoned, false), None, second).unwrap();
        assert_eq!(
            (lost.state, lost.advice),
            (KeyState::Abandoned, Advice::Reconcile)
        );
    }

    #[test]
    fn a_key_the_completer_will_finish_is_resuming_with_its_steps() {
        let second = Duration::from_secs(1);
        let mut resumable = record(RecordState::Abandoned, false);
        resumable.steps = vec![idempotency_guard::Step {
            name: "reserve".into(),
            input: None,
            value: serde_json::json!(1),
        }];
        // Steps alone do not say the run resumes: outcome unknown.
        let lost = key_status(&resumable, None, second).unwrap();
        assert_eq!(
            (lost.state, lost.advice, lost.retry_after_seconds),
            (KeyState::Abandoned, Advice::Reconcile, None)
        );
        assert_eq!(lost.steps, Some(vec!["reserve".to_owned()]));
        // Its request kept for the completer: it will complete.
        let mut request =
            idempotency_guard::StoredRequest::new("POST", "/p", HeaderMap::new(), "b");
        resumable.request = Some(Box::new(request.clone()));
        let resuming = key_status(&resumable, None, second).unwrap();
        assert_eq!(
            (
                resuming.state,
                resuming.advice,
                resuming.retry_after_seconds
            ),
            (KeyState::Resuming, Advice::Wait, Some(1))
        );
        assert_eq!(resuming.steps, Some(vec!["reserve".to_owned()]));
        // Given up: back to a person's decision.
        request.gave_up = true;
        resumable.request = Some(Box::new(request));
        let given_up = key_status(&resumable, None, second).unwrap();
        assert_eq!(
            (given_up.state, given_up.advice),
            (KeyState::Abandoned, Advice::Reconcile)
        );
        let none = key_status(&record(RecordState::Completed, false), None, second).unwrap();
        assert_eq!(none.steps, None);
    }

    #[test]
    fn transactional_lapses_and_expired_records_count_as_absent() {
        assert!(
            key_status(
                &record(RecordState::Abandoned, true),
                None,
                Duration::from_secs(1)
            )
            .is_none()
        );
        let mut expired = record(RecordState::Completed, false);
        expired.expires_at = expired.observed_at;
        assert!(key_status(&expired, None, Duration::from_secs(1)).is_none());
    }

    #[test]
    fn reports_whether_the_fingerprint_matches() {
        let r = record(RecordState::Completed, false);
        let same = Fingerprint::from_bytes([1; 32]);
        let other = Fingerprint::from_bytes([2; 32]);
        assert_eq!(
            key_status(&r, Some(&same), Duration::ZERO)
                .unwrap()
                .fingerprint_matches,
            Some(true)
        );
        assert_eq!(
            key_status(&r, Some(&other), Duration::ZERO)
                .unwrap()
                .fingerprint_matches,
            Some(false)
        );
        assert_eq!(
            key_status(&r, None, Duration::ZERO)
                .unwrap()
                .fingerprint_matches,
            None
        );
    }
}
