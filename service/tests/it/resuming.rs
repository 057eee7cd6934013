//! A key the completer will finish (SPEC §12, issue 52 item 6): the
//! status API says `resuming` (advice `wait`) with the steps it reached;
//! the admin API (and so the console) lists it as "will complete", not as
//! needing a decision, and an operator may still release it; a key the
//! completer gave up on needs a decision again. On the stores that keep
//! steps and stored requests.

use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, StatusCode};
use idempotency_guard::store::AnyStore;
use idempotency_guard::{Step, Store, StoredRequest};
use idempotency_tests::TestDb;

use crate::support::{ADMIN_A, Seed, TOKEN_A, call, get, router, seed};

/// Instantiates the suite for one store.
macro_rules! resuming_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_resumable_key_is_resuming_and_will_complete() {
                $crate::resuming::a_resumable_key_is_resuming_and_will_complete($fixture().await)
                    .await;
            }
        }
    };
}

/// An abandoned key whose run recorded `reserve` and whose route kept its
/// request (given up on or not).
async fn seed_resumable<S: Store>(store: &S, key: &str, gave_up: bool) {
    let lease = seed(store, "tenant-a", key, Seed::InFlight).await;
    let step = Step {
        name: "reserve".into(),
        input: None,
        value: serde_json::json!({"hold": 1}),
    };
    store.record_steps(&lease, &[step]).await.unwrap();
    let mut request = StoredRequest::new("POST", "/payments?x=1", http::HeaderMap::new(), "{}");
    request.attempts = 2;
    request.gave_up = gave_up;
    store.record_request(&lease, Some(&request)).await.unwrap();
    store.renew(&lease, Duration::ZERO).await.unwrap();
}

fn admin(method: Method, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {ADMIN_A}"))
        .body(Body::empty())
        .unwrap()
}

pub(crate) async fn a_resumable_key_is_resuming_and_will_complete<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    seed_resumable(&db.store, "resumable", false).await;
    seed_resumable(&db.store, "given-up", true).await;
    let router = router(db.store.clone().into());

    // The status API: resuming, wait, the steps it reached.
    let answer = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/resumable", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let json = answer.json();
    assert_eq!(json["state"], "resuming", "{json}");
    assert_eq!(json["advice"], "wait");
    assert_eq!(json["steps"], serde_json::json!(["reserve"]));
    assert!(json["retry_after_seconds"].as_u64().unwrap() >= 1);
    // Given up: outcome unknown again, for a person.
    let answer = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/given-up", Some(TOKEN_A)),
    )
    .await;
    let json = answer.json();
    assert_eq!(
        (json["state"].as_str(), json["advice"].as_str()),
        (Some("abandoned"), Some("reconcile"))
    );
    assert_eq!(json["steps"], serde_json::json!(["reserve"]));

    // The admin API: "will complete", no decision needed; its steps and
    // the completer's account.
    let show = "/v1/admin/keys/{scope}/{key}";
    let answer = call(
        &router,
        show,
        admin(Method::GET, "/v1/admin/keys/tenant-a/resumable"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let record = &answer.json()["record"];
    assert_eq!(record["state"], "abandoned");
    assert_eq!(
        (
            record["will_complete"].as_bool(),
            record["needs_decision"].as_bool()
        ),
        (Some(true), Some(false))
    );
    assert_eq!(record["steps"], serde_json::json!(["reserve"]));
    assert_eq!(
        record["completer"],
        serde_json::json!({"attempts": 2, "gave_up": false})
    );
    let answer = call(
        &router,
        show,
        admin(Method::GET, "/v1/admin/keys/tenant-a/given-up"),
    )
    .await;
    let record = &answer.json()["record"];
    assert_eq!(
        (
            record["will_complete"].as_bool(),
            record["needs_decision"].as_bool()
        ),
        (Some(false), Some(true))
    );
    assert_eq!(record["completer"]["gave_up"], true);

    // Needing a decision lists the given-up key alone.
    let list = "/v1/admin/keys";
    let answer = call(
        &router,
        list,
        admin(
            Method::GET,
            "/v1/admin/keys?scope=tenant-a&needs_decision=true",
        ),
    )
    .await;
    let keys: Vec<String> = answer.json()["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["given-up"]);

    // An operator may give up completing it: abandoned again, for a
    // decision; giving up again changes nothing; a missing key is a 404.
    let give_up = "/v1/admin/keys/{scope}/{key}/give-up";
    let path = "/v1/admin/keys/tenant-a/resumable/give-up?reason=psp%20ticket%2042";
    let answer = call(&router, give_up, admin(Method::POST, path)).await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.json()["action"], "give-up");
    let status = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/resumable", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(status.json()["state"], "abandoned");
    let answer = call(
        &router,
        show,
        admin(Method::GET, "/v1/admin/keys/tenant-a/resumable"),
    )
    .await;
    let record = &answer.json()["record"];
    assert_eq!(
        (
            record["will_complete"].as_bool(),
            record["needs_decision"].as_bool()
        ),
        (Some(false), Some(true))
    );
    assert_eq!(
        record["completer"],
        serde_json::json!({"attempts": 2, "gave_up": true})
    );
    assert_eq!(
        record["steps"],
        serde_json::json!(["reserve"]),
        "the steps are kept"
    );
    let answer = call(&router, give_up, admin(Method::POST, path)).await;
    assert_eq!(answer.status, StatusCode::OK);
    let missing = "/v1/admin/keys/tenant-a/no-such-key/give-up?reason=x";
    let answer = call(&router, give_up, admin(Method::POST, missing)).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);

    // An operator may still release it.
    let release = "/v1/admin/keys/{scope}/{key}/release";
    let answer = call(
        &router,
        release,
        admin(
            Method::POST,
            "/v1/admin/keys/tenant-a/resumable/release?reason=stop%20it",
        ),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let answer = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/resumable", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
}
