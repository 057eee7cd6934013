//! Every endpoint, through `build_router(...).oneshot(...)`, on every store.

use http::StatusCode;
use idempotency_guard::Store;
use idempotency_guard::store::AnyStore;
use idempotency_tests::TestDb;
use serde_json::{Value, json};

use crate::support::{FP, Seed, TOKEN_A, TOKEN_B, call, get, lookup_request, router, seed};

/// Instantiates the API suite for one store.
macro_rules! api_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::api_suite as suite;
            api_suite!(@tests $fixture;
                each_state_answers_200_with_every_field,
                absent_key_answers_404_with_advice_retry,
                missing_or_wrong_token_answers_401,
                another_scopes_key_answers_exactly_like_an_absent_one,
                records_that_count_as_absent_answer_404,
                fingerprint_matches_true_and_false,
                invalid_keys_and_fingerprints_answer_400,
                percent_encoded_keys_and_the_key_named_lookup,
                lookup_of_1000_keys_answers_in_order,
                lookup_outside_1_to_1000_keys_is_refused,
                store_down_answers_503_and_readyz_says_so,
                health_metrics_and_document_answer,
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                suite::$test($fixture().await).await;
            }
        )*
    };
}

const KEY: &str = "/v1/keys/{key}";
const LOOKUP: &str = "/v1/keys/lookup";

fn fields(json: &Value) -> Vec<&str> {
    let mut names: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    names
}

pub(crate) async fn each_state_answers_200_with_every_field<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    for (key, state) in [
        ("running", Seed::InFlight),
        ("done", Seed::Completed),
        ("lost", Seed::Abandoned),
        ("huge", Seed::CompletedNotStored),
    ] {
        seed(&db.store, "tenant-a", key, state).await;
    }
    let router = router(db.store.clone().into());
    let expectations = [
        (
            "running",
            "in_flight",
            "wait",
            vec![
                "advice",
                "created_at",
                "expires_at",
                "fingerprint",
                "key",
                "method",
                "path",
                "retry_after_seconds",
                "state",
            ],
        ),
        (
            "done",
            "completed",
            "replay",
            vec![
                "advice",
                "completed_at",
                "created_at",
                "expires_at",
                "fingerprint",
                "key",
                "method",
                "path",
                "response_status",
                "response_stored",
                "state",
            ],
        ),
        (
            "lost",
            "abandoned",
            "reconcile",
            vec![
                "advice",
                "created_at",
                "expires_at",
                "fingerprint",
                "key",
                "method",
                "path",
                "state",
            ],
        ),
        (
            "huge",
            "completed",
            "reconcile",
            vec![
                "advice",
                "completed_at",
                "created_at",
                "expires_at",
                "fingerprint",
                "key",
                "method",
                "path",
                "response_status",
                "response_stored",
                "state",
            ],
        ),
    ];
    for (key, state, advice, expected_fields) in expectations {
        let answer = call(&router, KEY, get(&format!("/v1/keys/{key}"), Some(TOKEN_A))).await;
        assert_eq!(answer.status, StatusCode::OK, "{key}");
        let json = answer.json();
        assert_eq!(
            fields(&json),
            expected_fields,
            "{key}: every SPEC field, and only those that apply"
        );
        assert_eq!(json["key"], key);
        assert_eq!(json["state"], state);
        assert_eq!(json["advice"], advice);
        assert_eq!(json["fingerprint"], FP.to_string());
        assert_eq!(json["method"], "POST");
        assert_eq!(json["path"], "/payments?x=1");
        for time in ["created_at", "expires_at"] {
            let text = json[time].as_str().unwrap();
            assert!(text.ends_with('Z'), "{time} is RFC 3339 in UTC: {text}");
        }
    }
    let done = call(&router, KEY, get("/v1/keys/done", Some(TOKEN_A)))
        .await
        .json();
    assert_eq!(done["response_status"], 201);
    assert_eq!(done["response_stored"], true);
    let running = call(&router, KEY, get("/v1/keys/running", Some(TOKEN_A)))
        .await
        .json();
    assert_eq!(running["retry_after_seconds"], 1);
}

pub(crate) async fn absent_key_answers_404_with_advice_retry<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let router = router(db.store.clone().into());
    let answer = call(&router, KEY, get("/v1/keys/never-sent", Some(TOKEN_A))).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.problem(), "key-not-found");
    let json = answer.json();
    assert_eq!(json["advice"], "retry");
    assert_eq!(json["key"], "never-sent");
}

pub(crate) async fn missing_or_wrong_token_answers_401<S: Store + Into<AnyStore>>(db: TestDb<S>) {
    seed(&db.store, "tenant-a", "k", Seed::Completed).await;
    let router = router(db.store.clone().into());
    for token in [None, Some("token-of-nobody-0123456789"), Some("")] {
        let answer = call(&router, KEY, get("/v1/keys/k", token)).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(answer.problem(), "unauthorized");
        assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
        assert!(
            !String::from_utf8_lossy(&answer.body).contains("tenant-a"),
            "nothing about the record leaks"
        );
    }
    let basic = http::Request::get("/v1/keys/k")
        .header("authorization", format!("Basic {TOKEN_A}"))
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(
        call(&router, KEY, basic).await.status,
        StatusCode::UNAUTHORIZED
    );
    let lookup = call(
        &router,
        LOOKUP,
        lookup_request(r#"{"keys":["k"]}"#, "token-of-nobody-0123456789"),
    )
    .await;
    assert_eq!(lookup.status, StatusCode::UNAUTHORIZED);
}

pub(crate) async fn another_scopes_key_answers_exactly_like_an_absent_one<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    seed(&db.store, "tenant-a", "secret", Seed::Completed).await;
    let router = router(db.store.clone().into());
    // Tenant B asks for tenant A's key; then the same question of an empty store.
    let foreign = call(&router, KEY, get("/v1/keys/secret", Some(TOKEN_B))).await;
    let absent_store = idempotency_tests::sqlite().await;
    let empty_router = crate::support::router(absent_store.store.clone().into());
    let absent = call(&empty_router, KEY, get("/v1/keys/secret", Some(TOKEN_B))).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    assert_eq!(foreign.status, absent.status);
    assert_eq!(
        foreign.body, absent.body,
        "the same bytes, not just the same shape"
    );
    let names = |a: &idempotency_tests::Answer| {
        let mut names: Vec<String> = a
            .headers
            .keys()
            .map(|n| n.as_str().to_owned())
            .filter(|n| n != "x-request-id")
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&foreign), names(&absent));
    let lookup = call(
        &router,
        LOOKUP,
        lookup_request(r#"{"keys":["secret"]}"#, TOKEN_B),
    )
    .await;
    assert_eq!(
        lookup.json(),
        json!({"results": [{"key": "secret", "found": false}]})
    );
}

pub(crate) async fn records_that_count_as_absent_answer_404<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    // A transactional run whose lease lapsed committed nothing: nothing ran.
    seed(
        &db.store,
        "tenant-a",
        "rolled-back",
        Seed::TransactionalLapsed,
    )
    .await;
    let router = router(db.store.clone().into());
    let answer = call(&router, KEY, get("/v1/keys/rolled-back", Some(TOKEN_A))).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.json()["advice"], "retry");
}

pub(crate) async fn fingerprint_matches_true_and_false<S: Store + Into<AnyStore>>(db: TestDb<S>) {
    seed(&db.store, "tenant-a", "k", Seed::Completed).await;
    let router = router(db.store.clone().into());
    let same = call(
        &router,
        KEY,
        get(&format!("/v1/keys/k?fingerprint={FP}"), Some(TOKEN_A)),
    )
    .await;
    assert_eq!(same.json()["fingerprint_matches"], true);
    let other = format!("sha256:{}", "0".repeat(64));
    let differs = call(
        &router,
        KEY,
        get(&format!("/v1/keys/k?fingerprint={other}"), Some(TOKEN_A)),
    )
    .await;
    assert_eq!(differs.json()["fingerprint_matches"], false);
    let encoded = call(
        &router,
        KEY,
        get(
            &format!("/v1/keys/k?fingerprint=sha256%3A{}", &FP.to_string()[7..]),
            Some(TOKEN_A),
        ),
    )
    .await;
    assert_eq!(encoded.json()["fingerprint_matches"], true);
}

pub(crate) async fn invalid_keys_and_fingerprints_answer_400<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    seed(&db.store, "tenant-a", "k", Seed::Completed).await;
    let router = router(db.store.clone().into());
    let long = "k".repeat(256);
    for path in [
        format!("/v1/keys/{long}"),
        "/v1/keys/a%20b".into(),
        "/v1/keys/caf%C3%A9".into(),
        "/v1/keys/%FF".into(),
        "/v1/keys/k?fingerprint=md5:abc".into(),
    ] {
        let answer = call(&router, KEY, get(&path, Some(TOKEN_A))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(answer.problem(), "bad-request", "{path}");
    }
}

pub(crate) async fn percent_encoded_keys_and_the_key_named_lookup<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    seed(&db.store, "tenant-a", "a/b?c#d%e", Seed::Completed).await;
    seed(&db.store, "tenant-a", "lookup", Seed::InFlight).await;
    let router = router(db.store.clone().into());
    let answer = call(
        &router,
        KEY,
        get("/v1/keys/a%2Fb%3Fc%23d%25e", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["key"], "a/b?c#d%e");
    let answer = call(&router, LOOKUP, get("/v1/keys/lookup", Some(TOKEN_A))).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["state"], "in_flight");
}

pub(crate) async fn lookup_of_1000_keys_answers_in_order<S: Store + Into<AnyStore>>(db: TestDb<S>) {
    let keys: Vec<String> = (0..1000).map(|i| format!("key-{i:04}")).collect();
    for key in keys.iter().step_by(3) {
        seed(&db.store, "tenant-a", key, Seed::Completed).await;
    }
    seed(&db.store, "tenant-b", "key-0001", Seed::Completed).await;
    let router = router(db.store.clone().into());
    let mut shuffled = keys.clone();
    shuffled.reverse();
    let body = json!({ "keys": shuffled }).to_string();
    let answer = call(&router, LOOKUP, lookup_request(&body, TOKEN_A)).await;
    assert_eq!(answer.status, StatusCode::OK);
    let results = answer.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 1000);
    for (result, key) in results.iter().zip(&shuffled) {
        assert_eq!(result["key"], key.as_str(), "in the order asked");
        let index: usize = key[4..].parse().unwrap();
        let found = index.is_multiple_of(3);
        assert_eq!(result["found"], found, "{key}");
        if found {
            assert_eq!(result["state"], "completed");
            assert_eq!(result["advice"], "replay");
        } else {
            assert_eq!(
                result.as_object().unwrap().len(),
                2,
                "{{key, found: false}} only"
            );
        }
    }
}

pub(crate) async fn lookup_outside_1_to_1000_keys_is_refused<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let router = router(db.store.clone().into());
    let too_many =
        json!({ "keys": (0..1001).map(|i| format!("k{i}")).collect::<Vec<_>>() }).to_string();
    let invalid_key = json!({ "keys": ["ok", "not ok"] }).to_string();
    for body in [
        too_many.as_str(),
        r#"{"keys":[]}"#,
        r#"{"keys":"k"}"#,
        "not json",
        r#"{"nokeys":1}"#,
        invalid_key.as_str(),
    ] {
        let answer = call(&router, LOOKUP, lookup_request(body, TOKEN_A)).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{}",
            &body[..body.len().min(40)]
        );
        assert_eq!(answer.problem(), "bad-request");
    }
    let huge = format!(r#"{{"keys":["{}"]}}"#, "k".repeat(2 * 1024 * 1024));
    let answer = call(&router, LOOKUP, lookup_request(&huge, TOKEN_A)).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.problem(), "body-too-large");
}

pub(crate) async fn store_down_answers_503_and_readyz_says_so<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let router = router(db.store.clone().into());
    assert_eq!(
        call(&router, "/readyz", get("/readyz", None)).await.status,
        StatusCode::OK
    );
    db.break_store().await;
    let ready = call(&router, "/readyz", get("/readyz", None)).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.problem(), "store-unavailable");
    assert_eq!(
        call(&router, "/healthz", get("/healthz", None))
            .await
            .status,
        StatusCode::OK,
        "the process is still up"
    );
    let key = call(&router, KEY, get("/v1/keys/k", Some(TOKEN_A))).await;
    assert_eq!(key.status, StatusCode::SERVICE_UNAVAILABLE);
    let lookup = call(
        &router,
        LOOKUP,
        lookup_request(r#"{"keys":["k"]}"#, TOKEN_A),
    )
    .await;
    assert_eq!(lookup.status, StatusCode::SERVICE_UNAVAILABLE);
}

pub(crate) async fn health_metrics_and_document_answer<S: Store + Into<AnyStore>>(db: TestDb<S>) {
    let router = router(db.store.clone().into());
    let health = call(&router, "/healthz", get("/healthz", None)).await;
    assert_eq!(health.json(), json!({"status": "ok"}));
    let metrics = call(&router, "/metrics", get("/metrics", None)).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let document = call(&router, "/openapi.json", get("/openapi.json", None)).await;
    assert_eq!(document.json()["openapi"], "3.1.0");
    assert!(
        document.header("x-request-id").is_some(),
        "every answer carries a request id"
    );
}
