//! The store conformance suite: every store runs these, unchanged.
//!
//! `store_suite!(name, fixture)` instantiates every test for one backend;
//! `fixture` is an async fn returning a `TestDb` of a fresh store.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, RecordState, Store, StoreError, StoredResponse};
use idempotency_tests::names;

/// Instantiates the conformance suite for one store.
macro_rules! store_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::store_suite as suite;

            store_suite!(@tests $fixture;
                claim_is_exclusive_under_200_concurrent_claimers,
                existing_record_is_returned_untouched,
                complete_stores_binary_and_1_mib_bodies,
                response_too_large_to_store_is_completed_without_body,
                renew_extends_the_lease_and_zero_abandons_it,
                release_frees_the_key,
                fencing_refuses_a_holder_after_takeover,
                take_over_refuses_a_live_lease,
                take_over_replaces_an_expired_record,
                purge_removes_expired_records_and_only_those,
                scopes_are_isolated,
                keys_of_255_visible_ascii_characters_round_trip,
                events_wake_a_subscriber,
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let db = $fixture().await;
                suite::$test(db.store.clone()).await;
            }
        )*
    };
}

const FP: Fingerprint = Fingerprint::from_bytes([7; 32]);
const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn new_record<'a>(
    scope: &'a str,
    key: &'a str,
    fingerprint: &'a Fingerprint,
    lease: Duration,
    retention: Duration,
) -> NewRecord<'a> {
    NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint,
        method: "POST",
        path: "/things?x=1",
        token: LeaseToken::new(),
        lease,
        retention,
        transactional: false,
    }
}

async fn acquire<S: Store>(store: &S, new: &NewRecord<'_>) -> Lease {
    match store.claim(new).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(record) => panic!("expected a new claim, found {record:?}"),
    }
}

fn response(body: Option<Bytes>) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append(
        "content-type",
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.append("x-multi", HeaderValue::from_static("1"));
    headers.append("x-multi", HeaderValue::from_static("2"));
    StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body,
    }
}

pub(crate) async fn claim_is_exclusive_under_200_concurrent_claimers<S: Store>(store: S) {
    let claimers: Vec<_> = (0..200)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let new = new_record("s", "contended", &FP, LEASE, DAY);
                store.claim(&new).await
            })
        })
        .collect();
    let mut acquired = 0;
    let mut tokens = HashSet::new();
    for claimer in claimers {
        match claimer.await.unwrap().expect("every claim answers") {
            Claim::Acquired(lease) => {
                acquired += 1;
                tokens.insert(lease.token);
            }
            Claim::Existing(record) => {
                assert_eq!(record.state(), RecordState::InFlight);
                tokens.insert(record.lease_token);
            }
        }
    }
    assert_eq!(acquired, 1, "exactly one claimer wins");
    assert_eq!(tokens.len(), 1, "every loser sees the winner's lease");
}

pub(crate) async fn existing_record_is_returned_untouched<S: Store>(store: S) {
    let lease = acquire(&store, &new_record("s", "k", &FP, LEASE, DAY)).await;
    let other = Fingerprint::from_bytes([9; 32]);
    let second = new_record("s", "k", &other, LEASE, DAY);
    let Claim::Existing(record) = store.claim(&second).await.unwrap() else {
        panic!("a second claim must not win");
    };
    assert_eq!(record.fingerprint, FP, "the first fingerprint is kept");
    assert_eq!(record.lease_token, lease.token);
    assert_eq!(record.method, "POST");
    assert_eq!(record.path, "/things?x=1");
    assert!(record.response.is_none());
    assert!(record.lease_remaining() > Duration::from_secs(20));
    assert!(record.expires_at > record.created_at + Duration::from_secs(86_000));
}

pub(crate) async fn complete_stores_binary_and_1_mib_bodies<S: Store>(store: S) {
    for (key, body) in [
        (
            "binary",
            Bytes::from((0..=255u8).cycle().take(4096).collect::<Vec<u8>>()),
        ),
        ("mebibyte", Bytes::from(vec![0xa5u8; 1024 * 1024])),
        ("empty", Bytes::new()),
    ] {
        let lease = acquire(&store, &new_record("s", key, &FP, LEASE, DAY)).await;
        let stored = response(Some(body.clone()));
        store.complete(&lease, &stored).await.expect("complete");
        let record = store
            .get(names::scope("s"), names::key(key))
            .await
            .unwrap()
            .expect("the record");
        assert_eq!(record.state(), RecordState::Completed);
        assert!(record.completed_at.is_some());
        assert_eq!(
            record.response.as_ref(),
            Some(&stored),
            "{key}: stored byte for byte"
        );
        // A second completion is refused: the record is no longer in flight.
        assert!(matches!(
            store.complete(&lease, &stored).await,
            Err(StoreError::LeaseLost)
        ));
    }
}

pub(crate) async fn response_too_large_to_store_is_completed_without_body<S: Store>(store: S) {
    let lease = acquire(&store, &new_record("s", "huge", &FP, LEASE, DAY)).await;
    store.complete(&lease, &response(None)).await.unwrap();
    let record = store
        .get(names::scope("s"), names::key("huge"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let stored = record.response.unwrap();
    assert_eq!(stored.status, StatusCode::CREATED);
    assert_eq!(stored.body, None);
}

pub(crate) async fn renew_extends_the_lease_and_zero_abandons_it<S: Store>(store: S) {
    let lease = acquire(
        &store,
        &new_record("s", "k", &FP, Duration::from_secs(2), DAY),
    )
    .await;
    store
        .renew(&lease, Duration::from_secs(120))
        .await
        .expect("renew");
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        record.lease_remaining() > Duration::from_secs(100),
        "renewed to 120 s"
    );
    assert_eq!(record.state(), RecordState::InFlight);
    store
        .renew(&lease, Duration::ZERO)
        .await
        .expect("end the lease");
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    // An abandoned record can still be completed by its holder, if nobody took over.
    store
        .complete(&lease, &response(Some(Bytes::from_static(b"late"))))
        .await
        .unwrap();
    assert!(
        matches!(store.renew(&lease, LEASE).await, Err(StoreError::LeaseLost)),
        "completed records are not renewed"
    );
}

pub(crate) async fn release_frees_the_key<S: Store>(store: S) {
    let lease = acquire(&store, &new_record("s", "k", &FP, LEASE, DAY)).await;
    let stranger = Lease {
        token: LeaseToken::new(),
        ..lease.clone()
    };
    assert!(
        matches!(store.release(&stranger).await, Err(StoreError::LeaseLost)),
        "a wrong token releases nothing"
    );
    assert!(
        store
            .get(names::scope("s"), names::key("k"))
            .await
            .unwrap()
            .is_some()
    );
    store.release(&lease).await.expect("release");
    assert!(
        store
            .get(names::scope("s"), names::key("k"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        matches!(store.release(&lease).await, Err(StoreError::LeaseLost)),
        "nothing left to release"
    );
    acquire(&store, &new_record("s", "k", &FP, LEASE, DAY)).await;
}

pub(crate) async fn fencing_refuses_a_holder_after_takeover<S: Store>(store: S) {
    let first = acquire(
        &store,
        &new_record("s", "k", &FP, Duration::from_millis(200), DAY),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    let takeover = new_record("s", "k", &FP, LEASE, DAY);
    let second = store
        .take_over(record.lease_token, &takeover)
        .await
        .unwrap()
        .expect("the lapsed lease is taken over");
    // The first holder can overwrite nothing any more.
    assert!(matches!(
        store
            .complete(&first, &response(Some(Bytes::from_static(b"old"))))
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.renew(&first, LEASE).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.release(&first).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(
        store
            .take_over(first.token, &new_record("s", "k", &FP, LEASE, DAY))
            .await
            .unwrap()
            .is_none()
    );
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_token, second.token);
    assert_eq!(record.state(), RecordState::InFlight);
    store
        .complete(&second, &response(Some(Bytes::from_static(b"new"))))
        .await
        .unwrap();
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response.unwrap().body.unwrap(), "new");
}

pub(crate) async fn take_over_refuses_a_live_lease<S: Store>(store: S) {
    let lease = acquire(&store, &new_record("s", "k", &FP, LEASE, DAY)).await;
    let takeover = new_record("s", "k", &FP, LEASE, DAY);
    assert!(
        store
            .take_over(lease.token, &takeover)
            .await
            .unwrap()
            .is_none(),
        "a live lease is never taken over"
    );
    store
        .complete(&lease, &response(Some(Bytes::new())))
        .await
        .unwrap();
    assert!(
        store
            .take_over(lease.token, &takeover)
            .await
            .unwrap()
            .is_none(),
        "nor a completed record within retention"
    );
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_token, lease.token);
}

pub(crate) async fn take_over_replaces_an_expired_record<S: Store>(store: S) {
    let lease = acquire(
        &store,
        &new_record("s", "k", &FP, LEASE, Duration::from_millis(200)),
    )
    .await;
    store
        .complete(&lease, &response(Some(Bytes::from_static(b"old"))))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let other = Fingerprint::from_bytes([3; 32]);
    let new = new_record("s", "k", &other, LEASE, DAY);
    let lease = match store.claim(&new).await.unwrap() {
        // SQL stores keep an expired record until purged: take it over.
        Claim::Existing(record) => {
            assert!(record.is_expired(), "only an expired record is still there");
            let again = new_record("s", "k", &other, LEASE, DAY);
            store
                .take_over(record.lease_token, &again)
                .await
                .unwrap()
                .expect("take over")
        }
        // Stores with native expiry (Redis) have dropped it already.
        Claim::Acquired(lease) => lease,
    };
    let record = store
        .get(names::scope("s"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_token, lease.token);
    assert_eq!(record.fingerprint, other);
    assert!(record.response.is_none(), "the old response is gone");
    assert!(!record.is_expired());
}

pub(crate) async fn purge_removes_expired_records_and_only_those<
    S: Store + idempotency_guard::Purge,
>(
    store: S,
) {
    // Short enough to wait out, long enough that a completion on a busy
    // machine still finds its record (100 ms was seen to be too short).
    for i in 0..25 {
        let key = format!("short-{i}");
        let lease = acquire(
            &store,
            &new_record("s", &key, &FP, LEASE, Duration::from_millis(400)),
        )
        .await;
        if i % 2 == 0 {
            store
                .complete(&lease, &response(Some(Bytes::new())))
                .await
                .unwrap();
        }
    }
    for i in 0..5 {
        acquire(
            &store,
            &new_record("s", &format!("long-{i}"), &FP, LEASE, DAY),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let purged = idempotency_guard::purge_expired(&store, 10).await.unwrap();
    // SQL stores delete all 25, in batches of 10; stores with native expiry
    // (Redis) have nothing left to delete. Either way they are gone:
    assert!(purged == 25 || purged == 0, "purged {purged}");
    for i in 0..25 {
        assert!(
            store
                .get(names::scope("s"), names::key(&format!("short-{i}")))
                .await
                .unwrap()
                .is_none()
        );
    }
    for i in 0..5 {
        assert!(
            store
                .get(names::scope("s"), names::key(&format!("long-{i}")))
                .await
                .unwrap()
                .is_some(),
            "unexpired records stay"
        );
    }
    assert_eq!(store.purge(10).await.unwrap(), 0);
}

pub(crate) async fn scopes_are_isolated<S: Store>(store: S) {
    let a = acquire(&store, &new_record("tenant-a", "same-key", &FP, LEASE, DAY)).await;
    let other = Fingerprint::from_bytes([4; 32]);
    let b = acquire(
        &store,
        &new_record("tenant-b", "same-key", &other, LEASE, DAY),
    )
    .await;
    assert_ne!(a.token, b.token);
    store
        .complete(&a, &response(Some(Bytes::from_static(b"a"))))
        .await
        .unwrap();
    let record_b = store
        .get(names::scope("tenant-b"), names::key("same-key"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record_b.state(), RecordState::InFlight);
    assert_eq!(record_b.fingerprint, other);
    // A lease of one scope writes nothing in the other.
    let cross = Lease {
        scope: names::scope("tenant-b").clone(),
        ..a.clone()
    };
    assert!(matches!(
        store.release(&cross).await,
        Err(StoreError::LeaseLost)
    ));
    // Scope and key are not concatenated anywhere they could collide.
    acquire(&store, &new_record("tenant-a:same", "key", &FP, LEASE, DAY)).await;
    acquire(&store, &new_record("tenant-a", "same:key", &FP, LEASE, DAY)).await;
    assert!(
        store
            .get(names::scope("tenant"), names::key("-asame-key"))
            .await
            .unwrap()
            .is_none()
    );
}

pub(crate) async fn keys_of_255_visible_ascii_characters_round_trip<S: Store>(store: S) {
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let key: String = visible.chars().cycle().take(255).collect();
    assert_eq!(key.len(), 255);
    let lease = acquire(&store, &new_record("s", &key, &FP, LEASE, DAY)).await;
    store
        .complete(&lease, &response(Some(Bytes::from_static(b"ok"))))
        .await
        .unwrap();
    let record = store
        .get(names::scope("s"), names::key(&key))
        .await
        .unwrap()
        .expect("found by the same key");
    assert_eq!(record.key.as_str(), key);
    // Keys are visible ASCII, so an injection has no spaces.
    for injection in ["'or'1'='1'--", "*", "k\\", "%", "_", "{s}"] {
        let lease = acquire(&store, &new_record("s", injection, &FP, LEASE, DAY)).await;
        assert_eq!(lease.key.as_str(), injection);
        assert!(
            store
                .get(names::scope("s"), names::key(&format!("{injection}x")))
                .await
                .unwrap()
                .is_none()
        );
    }
}

pub(crate) async fn events_wake_a_subscriber<S: Store>(store: S) {
    let subscription = store.events().subscribe("s", "k");
    let publisher = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        publisher.events().publish("s", "k");
    });
    tokio::time::timeout(Duration::from_secs(2), subscription.changed())
        .await
        .expect("the subscriber is woken");
}
