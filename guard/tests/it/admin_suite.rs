//! The operators' conformance suite ([`AdminStore`]): every store runs
//! these, unchanged.
//!
//! `admin_suite!(name, fixture)` instantiates every test for one backend.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idempotency_guard::store::admin::{ForgetRule, Forgotten, PageRequest, StateFilter};
use idempotency_guard::store::{AdminStore, Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, RecordState, StoredResponse};
use idempotency_tests::names;

/// Instantiates the admin suite for one store.
macro_rules! admin_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::admin_suite as suite;

            admin_suite!(@tests $fixture;
                list_filters_by_state_and_pages_by_key,
                forget_follows_the_rule_and_never_deletes_a_live_lease,
                a_forgotten_key_can_be_claimed_again,
                scopes_are_isolated_in_listings_and_forgets,
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

const FP: Fingerprint = Fingerprint::from_bytes([5; 32]);
const DAY: Duration = Duration::from_secs(86_400);

fn new_record<'a>(scope: &'a str, key: &'a str, transactional: bool) -> NewRecord<'a> {
    NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint: &FP,
        method: "POST",
        path: "/admin-suite",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: DAY,
        transactional,
    }
}

async fn claim<S: AdminStore>(store: &S, scope: &str, key: &str, transactional: bool) -> Lease {
    match store
        .claim(&new_record(scope, key, transactional))
        .await
        .expect("claim")
    {
        Claim::Acquired(lease) => lease,
        Claim::Existing(record) => panic!("expected a new claim, found {record:?}"),
    }
}

async fn completed<S: AdminStore>(store: &S, scope: &str, key: &str) {
    let lease = claim(store, scope, key, false).await;
    let response = StoredResponse {
        status: StatusCode::CREATED,
        headers: HeaderMap::new(),
        body: Some(Bytes::from_static(b"{}")),
    };
    store.complete(&lease, &response).await.expect("complete");
}

async fn abandoned<S: AdminStore>(store: &S, scope: &str, key: &str, transactional: bool) {
    let lease = claim(store, scope, key, transactional).await;
    store.renew(&lease, Duration::ZERO).await.expect("abandon");
}

async fn keys<S: AdminStore>(store: &S, scope: &str, filter: StateFilter) -> Vec<String> {
    let page = store
        .list(
            scope,
            filter,
            PageRequest {
                after: None,
                limit: 1000,
            },
        )
        .await
        .expect("list");
    assert_eq!(page.next, None, "one page holds them all");
    page.records
        .into_iter()
        .map(|r| r.key.into_string())
        .collect()
}

pub(crate) async fn list_filters_by_state_and_pages_by_key<S: AdminStore>(store: S) {
    completed(&store, "s", "a-done").await;
    let _live = claim(&store, "s", "b-running", false).await;
    abandoned(&store, "s", "c-lost", false).await;
    abandoned(&store, "s", "d-lost-tx", true).await;
    completed(&store, "s", "e-done").await;

    assert_eq!(
        keys(&store, "s", StateFilter::Any).await,
        ["a-done", "b-running", "c-lost", "d-lost-tx", "e-done"]
    );
    assert_eq!(
        keys(&store, "s", StateFilter::Completed).await,
        ["a-done", "e-done"]
    );
    assert_eq!(
        keys(&store, "s", StateFilter::InFlight).await,
        ["b-running"]
    );
    assert_eq!(
        keys(&store, "s", StateFilter::Abandoned).await,
        ["c-lost"],
        "a transactional lapse is not stuck: the next request takes it over"
    );

    // Pages of two, following the cursor.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .list(
                "s",
                StateFilter::Any,
                PageRequest {
                    after: after.as_deref(),
                    limit: 2,
                },
            )
            .await
            .expect("list a page");
        pages += 1;
        assert!(page.records.len() <= 2);
        seen.extend(page.records.iter().map(|r| r.key.as_str().to_owned()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        ["a-done", "b-running", "c-lost", "d-lost-tx", "e-done"]
    );
}

pub(crate) async fn forget_follows_the_rule_and_never_deletes_a_live_lease<S: AdminStore>(
    store: S,
) {
    completed(&store, "s", "done").await;
    abandoned(&store, "s", "lost", false).await;
    let _live = claim(&store, "s", "running", false).await;

    for rule in [
        ForgetRule::Completed,
        ForgetRule::Abandoned,
        ForgetRule::CompletedOrAbandoned,
    ] {
        assert_eq!(
            store.forget("s", "running", rule).await.unwrap(),
            Forgotten::Refused(RecordState::InFlight),
            "{rule:?} must keep a live lease"
        );
    }
    assert!(
        store
            .get(names::scope("s"), names::key("running"))
            .await
            .unwrap()
            .is_some()
    );

    assert_eq!(
        store
            .forget("s", "done", ForgetRule::Abandoned)
            .await
            .unwrap(),
        Forgotten::Refused(RecordState::Completed)
    );
    assert_eq!(
        store
            .forget("s", "lost", ForgetRule::Completed)
            .await
            .unwrap(),
        Forgotten::Refused(RecordState::Abandoned)
    );
    assert_eq!(
        store
            .forget("s", "done", ForgetRule::Completed)
            .await
            .unwrap(),
        Forgotten::Deleted(RecordState::Completed)
    );
    assert_eq!(
        store
            .forget("s", "lost", ForgetRule::CompletedOrAbandoned)
            .await
            .unwrap(),
        Forgotten::Deleted(RecordState::Abandoned)
    );
    assert!(
        store
            .get(names::scope("s"), names::key("done"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get(names::scope("s"), names::key("lost"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store
            .forget("s", "done", ForgetRule::Completed)
            .await
            .unwrap(),
        Forgotten::Missing
    );
}

pub(crate) async fn a_forgotten_key_can_be_claimed_again<S: AdminStore>(store: S) {
    completed(&store, "s", "k").await;
    // A replay read (fills the tiered store's cache) before the forget.
    assert!(
        store
            .get(names::scope("s"), names::key("k"))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        store.forget("s", "k", ForgetRule::Completed).await.unwrap(),
        Forgotten::Deleted(RecordState::Completed)
    );
    assert!(
        matches!(
            store.claim(&new_record("s", "k", false)).await.unwrap(),
            Claim::Acquired(_)
        ),
        "the next request with the key runs"
    );
}

pub(crate) async fn scopes_are_isolated_in_listings_and_forgets<S: AdminStore>(store: S) {
    completed(&store, "tenant-a", "k").await;
    completed(&store, "tenant-a:x", "y").await;
    completed(&store, "tenant-*", "k").await;
    assert_eq!(keys(&store, "tenant-a", StateFilter::Any).await, ["k"]);
    assert_eq!(keys(&store, "tenant-*", StateFilter::Any).await, ["k"]);
    assert!(keys(&store, "tenant-b", StateFilter::Any).await.is_empty());
    assert_eq!(
        store
            .forget("tenant-b", "k", ForgetRule::Completed)
            .await
            .unwrap(),
        Forgotten::Missing
    );
    assert!(
        store
            .get(names::scope("tenant-a"), names::key("k"))
            .await
            .unwrap()
            .is_some()
    );
}
