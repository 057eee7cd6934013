//! A key that a single-commit run holds on PostgreSQL has no committed
//! record, only its advisory lock: the service must say `in_flight` /
//! `wait`, never `retry`, and the admin API must keep it.

use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, StatusCode};
use idempotency_guard::store::LeaseToken;
use idempotency_guard::store::NewRecord;
use idempotency_guard::store::postgres::LockedClaim;
use idempotency_tests::names;

use crate::support::{ADMIN_ALL, FP, TOKEN_A, TOKEN_B, call, get, lookup_request, router};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_by_its_lock_is_in_flight_for_status_lookup_and_admin() {
    let db = idempotency_tests::postgres().await;
    let new = NewRecord {
        scope: names::scope("tenant-a"),
        key: names::key("running"),
        fingerprint: &FP,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: true,
    };
    let LockedClaim::Acquired { transaction, .. } = db
        .store
        .claim_locked(&new, Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("the key was free");
    };
    let router = router(db.store.clone().into());

    let status = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/running", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK);
    let json = status.json();
    assert_eq!(json["state"], "in_flight");
    assert_eq!(json["advice"], "wait");
    assert_eq!(json["retry_after_seconds"], 1);
    assert!(
        json.get("fingerprint").is_none(),
        "nothing else is committed yet: {json}"
    );

    // Another scope's key of the same name is still absent.
    let other = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/running", Some(TOKEN_B)),
    )
    .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);

    let lookup = call(
        &router,
        "/v1/keys/lookup",
        lookup_request(r#"{"keys": ["running", "never"]}"#, TOKEN_A),
    )
    .await;
    let results = lookup.json()["results"].clone();
    assert_eq!(results[0]["state"], "in_flight");
    assert_eq!(results[0]["found"], true);
    assert_eq!(results[1]["found"], false);

    for (method, path, template) in [
        (
            Method::DELETE,
            "/v1/admin/keys/tenant-a/running?force=true&reason=stuck%20debit",
            "/v1/admin/keys/{scope}/{key}",
        ),
        (
            Method::POST,
            "/v1/admin/keys/tenant-a/running/release?reason=stuck%20debit",
            "/v1/admin/keys/{scope}/{key}/release",
        ),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {ADMIN_ALL}"))
            .body(Body::empty())
            .unwrap();
        let answer = call(&router, template, request).await;
        assert_eq!(
            answer.status,
            StatusCode::CONFLICT,
            "{path}: a running key is kept"
        );
    }

    // Rolled back: nothing ran, and the key says so.
    transaction.rollback().await.unwrap();
    let after = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/running", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
    assert_eq!(after.json()["advice"], "retry");
}
