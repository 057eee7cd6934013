//! Every row of the SPEC's table, through a router, on every store.
//!
//! `guard_suite!(name, fixture)` instantiates the suite for one backend.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::stream;
use http::{HeaderValue, Method, Request, StatusCode};
use idempotency_guard::{
    AbandonedPolicy, FailureMode, IdempotencyLayer, InFlightPolicy, RecordState, Store,
};
use idempotency_tests::names;

use crate::support::{Answer, TestDb, abandon, app, call, send};

/// Instantiates the guard suite for one store. The outage tests need a
/// fixture that can make the store unreachable; list them explicitly as
/// `outages: []` for a store that cannot be cut off in tests.
macro_rules! guard_suite {
    ($backend:ident, $fixture:path) => {
        guard_suite!($backend, $fixture, outages: [failing_store_fails_closed, failing_store_fails_open_when_told]);
    };
    ($backend:ident, $fixture:path, outages: [$($outage:ident),*]) => {
        mod $backend {
            use $crate::guard_suite as suite;

            guard_suite!(@tests $fixture;
                unguarded_methods_pass_through,
                missing_key_is_refused,
                optional_key_runs_unguarded,
                invalid_keys_are_refused,
                invalid_scope_is_refused,
                oversized_bodies_are_refused,
                new_key_runs_once_and_replays_byte_for_byte,
                reused_key_with_another_request_is_refused,
                in_flight_duplicate_is_refused_with_retry_after,
                in_flight_duplicate_waits_for_the_replay,
                wait_ends_in_409_at_its_bound,
                abandoned_run_answers_outcome_unknown,
                abandoned_run_runs_again_when_allowed,
                oversized_response_is_sent_once_and_never_replayed,
                unstored_statuses_release_the_key,
                panicking_handler_releases_the_key,
                handler_past_max_time_is_cut_off_and_abandoned,
                lease_is_renewed_while_the_handler_runs,
                concurrent_identical_requests_run_once,
                concurrent_identical_requests_that_wait_all_get_the_same_replay,
                concurrent_distinct_keys_all_run,
                same_key_in_two_scopes_is_two_records,
                disconnected_client_does_not_cancel_the_handler,
                $($outage,)*
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                suite::$test($fixture().await).await;
            }
        )*
    };
}

use crate::support::request;

fn post(key: &str) -> http::request::Builder {
    request(Some(key))
}

fn with_body(builder: http::request::Builder, body: &str) -> Request<Body> {
    builder.body(Body::from(body.to_owned())).unwrap()
}

pub(crate) async fn unguarded_methods_pass_through<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    for method in [Method::GET, Method::PUT] {
        let answer = call(
            &router,
            Request::builder()
                .method(method)
                .uri("/things")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed());
    }
    assert_eq!(runs.get(), 2);
    // PUT becomes guarded when configured.
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()).with_methods([Method::PUT]));
    let answer = call(
        &router,
        Request::put("/things").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(answer.problem(), "key-missing");
    let answer = call(
        &router,
        Request::post("/things").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "POST is no longer guarded"
    );
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn missing_key_is_refused<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    for method in [Method::POST, Method::PATCH] {
        let request = Request::builder()
            .method(method)
            .uri("/things")
            .body(Body::from("{}"))
            .unwrap();
        let answer = call(&router, request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(answer.problem(), "key-missing");
        assert!(answer.json().get("key").is_none());
    }
    assert_eq!(runs.get(), 0);
}

pub(crate) async fn optional_key_runs_unguarded<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()).with_key_required(false));
    for _ in 0..2 {
        let answer = call(&router, with_body(request(None), "{}")).await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed());
    }
    assert_eq!(runs.get(), 2, "no key: each request runs");
    let answer = send(&router, "has space", "{}").await;
    assert_eq!(
        answer.problem(),
        "key-invalid",
        "an invalid key is still refused"
    );
    assert_eq!(runs.get(), 2);
}

pub(crate) async fn invalid_keys_are_refused<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let long = "k".repeat(256);
    let values: Vec<HeaderValue> = vec![
        HeaderValue::from_static(""),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static("a b"),
        HeaderValue::from_static("a\tb"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        HeaderValue::from_static("\"unterminated"),
        HeaderValue::from_static("\"bad\\escape\""),
        HeaderValue::from_static("\"\""),
    ];
    for value in values {
        let mut request = with_body(request(None), "{}");
        request
            .headers_mut()
            .insert("idempotency-key", value.clone());
        let answer = call(&router, request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{value:?}");
        assert_eq!(answer.problem(), "key-invalid", "{value:?}");
    }
    let mut twice = with_body(post("one"), "{}");
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("two"));
    let answer = call(&router, twice).await;
    assert_eq!(answer.problem(), "key-invalid");
    assert_eq!(runs.get(), 0);
    assert!(
        db.store
            .get(names::scope("default"), names::key("one"))
            .await
            .unwrap()
            .is_none(),
        "no record is left behind"
    );
    // The longest valid key, and a quoted one, are fine.
    let max = "k".repeat(255);
    assert_eq!(send(&router, &max, "{}").await.status, StatusCode::CREATED);
    assert_eq!(
        send(&router, "\"quoted\"", "{}").await.status,
        StatusCode::CREATED
    );
    assert!(
        send(&router, "quoted", "{}").await.replayed(),
        "the quoted and bare forms are one key"
    );
}

pub(crate) async fn invalid_scope_is_refused<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone()).with_scope(|parts| {
        parts
            .headers
            .get("x-tenant")
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    });
    let (router, runs) = app(layer);
    let answer = send(&router, "k", "{}").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.problem(), "scope-invalid");
    let mut request = with_body(post("k"), "{}");
    request
        .headers_mut()
        .insert("x-tenant", HeaderValue::from_str(&"t".repeat(256)).unwrap());
    assert_eq!(call(&router, request).await.problem(), "scope-invalid");
    assert_eq!(runs.get(), 0);
}

pub(crate) async fn oversized_bodies_are_refused<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()).with_body_limit(1024));
    let big = "x".repeat(2048);
    let answer = call(&router, with_body(post("declared"), &big)).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.problem(), "body-too-large");
    // No Content-Length: the limit still holds while streaming.
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        (0..16).map(|_| Ok(Bytes::from(vec![b'y'; 128]))).collect();
    let streamed = post("streamed")
        .body(Body::from_stream(stream::iter(chunks)))
        .unwrap();
    assert!(streamed.headers().get("content-length").is_none());
    let answer = call(&router, streamed).await;
    assert_eq!(answer.problem(), "body-too-large");
    assert_eq!(runs.get(), 0);
    assert!(
        db.store
            .get(names::scope("default"), names::key("streamed"))
            .await
            .unwrap()
            .is_none()
    );
    let fits = "z".repeat(1024);
    assert_eq!(
        call(&router, with_body(post("fits"), &fits)).await.status,
        StatusCode::CREATED
    );
}

pub(crate) async fn new_key_runs_once_and_replays_byte_for_byte<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let first = send(&router, "order-1", r#"{"amount":100,"currency":"EUR"}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        first.header("idempotent-replayed").is_none(),
        "absent on a first execution"
    );
    assert_eq!(
        first.header("set-cookie"),
        Some("session=abc"),
        "the first caller gets every header"
    );
    let record = db
        .store
        .get(names::scope("default"), names::key("order-1"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(
        record.state(),
        RecordState::Completed,
        "stored before it was sent"
    );

    // The same JSON written differently is the same request.
    let replay = send(
        &router,
        "order-1",
        "{ \"currency\" : \"EUR\",\n \"amount\": 100 }",
    )
    .await;
    assert_eq!(replay.status, first.status);
    assert_eq!(replay.body, first.body, "byte for byte");
    assert!(replay.replayed());
    for name in ["content-type", "location", "x-run"] {
        assert_eq!(replay.header(name), first.header(name), "{name}");
    }
    assert!(
        replay.header("set-cookie").is_none(),
        "Set-Cookie is not stored"
    );
    assert!(replay.header("date").is_none(), "Date is not stored");
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn reused_key_with_another_request_is_refused<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    assert_eq!(
        send(&router, "k", r#"{"amount":1}"#).await.status,
        StatusCode::CREATED
    );
    let answer = send(&router, "k", r#"{"amount":2}"#).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.problem(), "key-reused");
    assert_eq!(answer.json()["key"], "k");
    let other_query = with_body(post("k").uri("/things?again=1"), r#"{"amount":1}"#);
    assert_eq!(call(&router, other_query).await.problem(), "key-reused");
    assert_eq!(runs.get(), 1);
    let (router, _) = app(IdempotencyLayer::new(db.store.clone())
        .with_mismatch_status(StatusCode::UNPROCESSABLE_ENTITY));
    let answer = send(&router, "k", r#"{"amount":3}"#).await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(answer.problem(), "key-reused");
}

pub(crate) async fn in_flight_duplicate_is_refused_with_retry_after<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            call(
                &router,
                with_body(post("k").header("x-delay-ms", "600"), "{}"),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let answer = send(&router, "k", "{}").await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.problem(), "request-in-flight");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.json()["key"], "k");
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn in_flight_duplicate_waits_for_the_replay<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_in_flight(InFlightPolicy::Wait(Duration::from_secs(10)));
    let (router, runs) = app(layer);
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            call(
                &router,
                with_body(post("k").header("x-delay-ms", "400"), "{}"),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let waited = send(&router, "k", "{}").await;
    let first = slow.await.unwrap();
    assert_eq!(waited.status, StatusCode::CREATED);
    assert!(waited.replayed());
    assert_eq!(waited.body, first.body);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the completion, well before the bound"
    );
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn wait_ends_in_409_at_its_bound<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_in_flight(InFlightPolicy::Wait(Duration::from_millis(200)));
    let (router, runs) = app(layer);
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            call(
                &router,
                with_body(post("k").header("x-delay-ms", "1500"), "{}"),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = send(&router, "k", "{}").await;
    assert_eq!(answer.problem(), "request-in-flight");
    assert!(answer.header("retry-after").is_some());
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn abandoned_run_answers_outcome_unknown<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    abandon(&db.store, "crashed", "{}", false).await;
    let answer = send(&router, "crashed", "{}").await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.problem(), "outcome-unknown");
    assert_eq!(answer.json()["key"], "crashed");
    assert_eq!(runs.get(), 0);
}

pub(crate) async fn abandoned_run_runs_again_when_allowed<S: Store>(db: TestDb<S>) {
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_abandoned(AbandonedPolicy::RunAgain));
    abandon(&db.store, "crashed", "{}", false).await;
    let answers =
        futures_util::future::join_all((0..10).map(|_| send(&router, "crashed", "{}"))).await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.status, StatusCode::CREATED | StatusCode::CONFLICT))
    );
    assert_eq!(
        runs.get(),
        1,
        "the takeover runs once, however many retries race for it"
    );
    assert!(send(&router, "crashed", "{}").await.replayed());
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn oversized_response_is_sent_once_and_never_replayed<S: Store>(db: TestDb<S>) {
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_stored_response_limit(1000));
    let first = call(
        &router,
        with_body(post("big").header("x-body-bytes", "5000"), "{}"),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body.len(), 5000, "the first caller gets all of it");
    assert!(
        first
            .body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 251) as u8)
    );
    let second = send(&router, "big", "{}").await;
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert_eq!(second.problem(), "response-not-stored");
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn failing_store_fails_closed<S: Store>(db: TestDb<S>) {
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_store_timeout(Duration::from_secs(2)));
    db.break_store().await;
    let answer = send(&router, "k", "{}").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem(), "store-unavailable");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.json()["key"], "k");
    assert_eq!(runs.get(), 0, "the handler did not run");
}

pub(crate) async fn failing_store_fails_open_when_told<S: Store>(db: TestDb<S>) {
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_failure_mode(FailureMode::Open));
    db.break_store().await;
    let answer = send(&router, "k", "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn unstored_statuses_release_the_key<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let mut expected_runs = 0;
    for status in ["500", "503", "408", "425", "429"] {
        let key = format!("released-{status}");
        let answer = call(
            &router,
            with_body(post(&key).header("x-status", status), "{}"),
        )
        .await;
        assert_eq!(answer.status.as_str(), status);
        assert!(
            db.store
                .get(names::scope("default"), names::key(&key))
                .await
                .unwrap()
                .is_none(),
            "{status}: released"
        );
        let retry = send(&router, &key, "{}").await;
        assert_eq!(
            retry.status,
            StatusCode::CREATED,
            "{status}: the retry runs"
        );
        expected_runs += 2;
    }
    let answer = call(
        &router,
        with_body(post("no-store").header("x-no-store", "1"), "{}"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(
        db.store
            .get(names::scope("default"), names::key("no-store"))
            .await
            .unwrap()
            .is_none(),
        "no-store: released"
    );
    assert!(!send(&router, "no-store", "{}").await.replayed());
    expected_runs += 2;
    // A 4xx answer is an answer: it is stored and replayed.
    for (key, status, marked) in [("conflict", "409", false), ("declined", "422", true)] {
        let mut request = post(key).header("x-status", status);
        if marked {
            request = request.header("x-final", "1");
        }
        let answer = call(&router, with_body(request, "{}")).await;
        assert_eq!(answer.status.as_str(), status);
        let replay = send(&router, key, "{}").await;
        assert_eq!(replay.status.as_str(), status, "{status}: replayed");
        assert!(replay.replayed(), "{status}: replayed");
        expected_runs += 1;
    }
    // An unmarked 400/413/415/422 is taken for an extractor's rejection
    // (nothing ran): released, so the corrected request runs (Stripe's rule).
    let answer = call(
        &router,
        with_body(post("rejected").header("x-status", "422"), "{}"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        db.store
            .get(names::scope("default"), names::key("rejected"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        send(&router, "rejected", "{}").await.status,
        StatusCode::CREATED
    );
    expected_runs += 2;
    assert_eq!(runs.get(), expected_runs);
}

pub(crate) async fn panicking_handler_releases_the_key<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let answer = call(
        &router,
        with_body(post("boom").header("x-panic", "1"), "{}"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.problem(), "handler-failed");
    assert!(
        db.store
            .get(names::scope("default"), names::key("boom"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        send(&router, "boom", "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(runs.get(), 2);
}

pub(crate) async fn handler_past_max_time_is_cut_off_and_abandoned<S: Store>(db: TestDb<S>) {
    let layer =
        IdempotencyLayer::new(db.store.clone()).with_max_handler_time(Duration::from_millis(300));
    let (router, runs) = app(layer);
    let started = std::time::Instant::now();
    let answer = call(
        &router,
        with_body(post("slow").header("x-delay-ms", "5000"), "{}"),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "cut off near the bound"
    );
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(answer.problem(), "handler-timeout");
    let record = db
        .store
        .get(names::scope("default"), names::key("slow"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(
        send(&router, "slow", "{}").await.problem(),
        "outcome-unknown"
    );
    assert_eq!(runs.get(), 1);
}

pub(crate) async fn lease_is_renewed_while_the_handler_runs<S: Store>(db: TestDb<S>) {
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_lease(Duration::from_secs(1)));
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            call(
                &router,
                with_body(post("long").header("x-delay-ms", "2600"), "{}"),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let record = db
        .store
        .get(names::scope("default"), names::key("long"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state(),
        RecordState::InFlight,
        "renewed past its first second"
    );
    assert_eq!(
        send(&router, "long", "{}").await.problem(),
        "request-in-flight"
    );
    assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
    assert!(send(&router, "long", "{}").await.replayed());
    assert_eq!(runs.get(), 1);
}

async fn fire(
    router: &axum::Router,
    n: usize,
    key: impl Fn(usize) -> String,
    delay_ms: &str,
) -> Vec<Answer> {
    let requests = (0..n).map(|i| {
        let router = router.clone();
        let request = with_body(
            post(&key(i)).header("x-delay-ms", delay_ms),
            r#"{"amount":5}"#,
        );
        tokio::spawn(async move { call(&router, request).await })
    });
    let mut answers = Vec::with_capacity(n);
    for handle in requests.collect::<Vec<_>>() {
        answers.push(handle.await.unwrap());
    }
    answers
}

pub(crate) async fn concurrent_identical_requests_run_once<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let answers = fire(&router, 200, |_| "same".into(), "300").await;
    assert_eq!(runs.get(), 1, "the handler ran exactly once");
    let executed: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .collect();
    assert_eq!(executed.len(), 1, "one answer is the execution");
    for answer in &answers {
        match answer.status {
            StatusCode::CREATED => assert_eq!(answer.body, executed[0].body),
            StatusCode::CONFLICT => assert_eq!(answer.problem(), "request-in-flight"),
            other => panic!(
                "unexpected {other}: {}",
                String::from_utf8_lossy(&answer.body)
            ),
        }
    }
}

pub(crate) async fn concurrent_identical_requests_that_wait_all_get_the_same_replay<S: Store>(
    db: TestDb<S>,
) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_in_flight(InFlightPolicy::Wait(Duration::from_secs(20)));
    let (router, runs) = app(layer);
    let answers = fire(&router, 200, |_| "same".into(), "300").await;
    assert_eq!(runs.get(), 1);
    let first = &answers
        .iter()
        .find(|a| !a.replayed())
        .expect("one execution")
        .body;
    for answer in &answers {
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(&answer.body, first, "byte-identical");
    }
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 199);
}

pub(crate) async fn concurrent_distinct_keys_all_run<S: Store>(db: TestDb<S>) {
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let answers = fire(&router, 200, |i| format!("key-{i}"), "10").await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == StatusCode::CREATED && !a.replayed())
    );
    assert_eq!(runs.get(), 200);
}

pub(crate) async fn same_key_in_two_scopes_is_two_records<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone()).with_scope(|parts| {
        parts
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("default")
            .to_owned()
    });
    let (router, runs) = app(layer);
    let a = call(
        &router,
        with_body(post("shared").header("x-tenant", "a"), "{}"),
    )
    .await;
    let b = call(
        &router,
        with_body(post("shared").header("x-tenant", "b"), r#"{"other":true}"#),
    )
    .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(
        !a.replayed() && !b.replayed(),
        "neither sees the other's record"
    );
    assert_ne!(a.body, b.body);
    assert_eq!(runs.get(), 2);
    assert!(
        db.store
            .get(names::scope("a"), names::key("shared"))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        db.store
            .get(names::scope("b"), names::key("shared"))
            .await
            .unwrap()
            .is_some()
    );
    let replay = call(
        &router,
        with_body(post("shared").header("x-tenant", "a"), "{}"),
    )
    .await;
    assert_eq!(replay.body, a.body);
}

pub(crate) async fn disconnected_client_does_not_cancel_the_handler<S: Store>(db: TestDb<S>) {
    use tower::ServiceExt;
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let request = with_body(post("gone").header("x-delay-ms", "1000"), "{}");
    // The request is driven until its handler runs (on a loaded machine the
    // claim may take longer than any fixed wait: a client gone before it
    // landed has the claim released, and nothing runs), then dropped, as
    // hyper drops it when the client goes away.
    let mut answer = Box::pin(router.clone().oneshot(request));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs.get() == 0 {
        tokio::select! {
            _ = &mut answer => panic!("answered before the client went away"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler started within 10 s"
        );
    }
    drop(answer);
    // The handler sleeps 1 s; on a loaded machine its completion may take
    // longer to be stored, so poll (bounded) instead of one fixed wait.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let record = loop {
        let record = db
            .store
            .get(names::scope("default"), names::key("gone"))
            .await
            .unwrap()
            .expect("the record");
        if record.state() == RecordState::Completed || tokio::time::Instant::now() > deadline {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        record.state(),
        RecordState::Completed,
        "the handler finished and its answer was stored (within 10 s)"
    );
    let retry = send(&router, "gone", "{}").await;
    assert!(retry.replayed());
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(runs.get(), 1);
}
