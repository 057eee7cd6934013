//! A caller that goes away while its claim is held up in the store (behind
//! a lock): the claim lands after the caller left, and the engine still
//! owns it (a background release, fenced by the claim's token). The key
//! ends free (or completed), never stranded in flight or "outcome unknown".

use std::time::Duration;

use http::StatusCode;
use idempotency_guard::store::LeaseToken;
use idempotency_guard::{IdempotencyLayer, RecordState, Store};
use idempotency_tests::names;

use crate::support::{app, send};

/// Waits until the record of `key` is settled (completed or gone). The
/// claim that was held up lands as soon as the lock goes; the guard then
/// either finishes the run or releases the claim in the background (every
/// quarter second): give it a second before looking.
async fn settled<S: Store>(store: &S, key: &str) -> Option<RecordState> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..100 {
        let state = store
            .get(names::scope("default"), names::key(key))
            .await
            .unwrap()
            .map(|record| record.state());
        if state != Some(RecordState::InFlight) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the record of {key} stayed in flight: nobody owns the claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_gone_while_sqlite_write_lock_holds_the_claim() {
    let db = idempotency_tests::sqlite().await;
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    let mut blocker = db.store.pool().acquire().await.unwrap();
    sqlx::query("begin immediate")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let gone = tokio::time::timeout(Duration::from_millis(400), send(&router, "held", "{}")).await;
    assert!(gone.is_err(), "the claim was not held up by the write lock");
    sqlx::query("commit").execute(&mut *blocker).await.unwrap();
    drop(blocker);
    let state = settled(&db.store, "held").await;
    assert_ne!(state, Some(RecordState::Abandoned), "the key was stranded");
    let retry = send(&router, "held", "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(runs.get(), 1, "the handler ran {} times", runs.get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_gone_while_postgres_row_lock_holds_the_claim() {
    let db = idempotency_tests::postgres().await;
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()));
    // An uncommitted insert of the same key: the claim's insert waits for it.
    let mut blocker = db.store.pool().begin().await.unwrap();
    sqlx::query(
        "insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
         values ('default', 'held', $1, 'POST', '/things', 'in_flight', $2,
                 now() + interval '1 minute', false, now(), now() + interval '1 hour')",
    )
    .bind(vec![0_u8; 32])
    .bind(LeaseToken::new().as_uuid())
    .execute(&mut *blocker)
    .await
    .unwrap();
    let gone = tokio::time::timeout(Duration::from_millis(400), send(&router, "held", "{}")).await;
    assert!(gone.is_err(), "the claim was not held up by the row lock");
    blocker.rollback().await.unwrap();
    let state = settled(&db.store, "held").await;
    assert_ne!(state, Some(RecordState::Abandoned), "the key was stranded");
    let retry = send(&router, "held", "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(runs.get(), 1, "the handler ran {} times", runs.get());
}

/// A caller that goes away before the answer is counted once, as
/// `caller-gone` (the run it started still ends: its retry replays); a
/// request the guard does not guard is not counted when its caller goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_is_counted_as_caller_gone() {
    use axum::Router;
    use axum::routing::post;
    use idempotency_guard::telemetry::REQUESTS_TOTAL;
    use tower::ServiceExt;

    crate::metrics_probe::install();
    let db = idempotency_tests::sqlite().await;
    let route = "/caller-gone";
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    // Each handler says when it starts: the client gives up then, after the
    // claim (a fixed timeout could end before the claim on a loaded machine).
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let (counted, post_started, get_started) = (runs.clone(), started.clone(), started.clone());
    let router = Router::new()
        .route(
            route,
            post(move || {
                let (runs, started) = (counted.clone(), post_started.clone());
                async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    (StatusCode::CREATED, "made")
                }
            })
            .get(move || {
                let started = get_started.clone();
                async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "read"
                }
            }),
        )
        .layer(IdempotencyLayer::new(db.store.clone()));
    let request = |method: &str| {
        http::Request::builder()
            .method(method)
            .uri(route)
            .header("idempotency-key", "gone-early")
            .header("x-retry-attempt", "0")
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    let count = |outcome: &str| {
        crate::metrics_probe::counter(REQUESTS_TOTAL, &[("route", route), ("outcome", outcome)])
    };
    let all = || crate::metrics_probe::counter(REQUESTS_TOTAL, &[("route", route)]);
    // Sends `method` and drops the response future once its handler runs:
    // what hyper does when the client goes away.
    let give_up_once_running = |method: &'static str| {
        let (router, started) = (router.clone(), started.clone());
        async move {
            let mut call = std::pin::pin!(router.oneshot(request(method)));
            tokio::select! {
                answer = &mut call => panic!("{method} answered before the client gave up: {answer:?}"),
                () = started.notified() => {}
            }
        }
    };

    give_up_once_running("POST").await;
    assert_eq!(count("caller-gone"), 1);
    assert_eq!(all(), 1, "counted once");

    give_up_once_running("GET").await;
    assert_eq!(
        all(),
        1,
        "a request the guard does not guard is not counted"
    );

    // The run went on; its retry replays its answer, counted as a replay.
    for _ in 0..200 {
        if runs.load(std::sync::atomic::Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the run went on without its caller"
    );
    // Its completion is one store write after the handler's end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = router.clone().oneshot(request("POST")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(count("replayed"), 1);
    assert_eq!(all(), 2);
}

/// From its hand-off on, the layer's run is the drain's: while its caller
/// waits (the run inline in the caller's box) and after the caller went
/// away (the whole box moved into a task); the drain waits for it, and its
/// record ends completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_holds_a_run_while_its_caller_waits_and_after_it_left() {
    use tower::ServiceExt;

    let db = idempotency_tests::sqlite().await;
    let layer = IdempotencyLayer::new(db.store.clone());
    let drain = layer.drain();
    let (router, runs) = app(layer);
    assert_eq!(drain.running(), 0);
    let request = http::Request::post("/things")
        .header("idempotency-key", "drained")
        .header("content-type", "application/json")
        .header("x-delay-ms", "700")
        .body(axum::body::Body::from("{}"))
        .unwrap();
    let mut answer = Box::pin(router.clone().oneshot(request));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs.get() == 0 {
        tokio::select! {
            _ = &mut answer => panic!("answered before the handler ended"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler started within 10 s"
        );
    }
    assert!(
        drain.running() >= 1,
        "the run its caller waits for is the drain's"
    );
    drop(answer);
    assert!(
        drain.running() >= 1,
        "the run whose caller left is the drain's"
    );
    assert!(drain.clone().wait().await, "the run ended within the bound");
    assert_eq!(drain.running(), 0);
    let state = db
        .store
        .get(names::scope("default"), names::key("drained"))
        .await
        .unwrap()
        .map(|record| record.state());
    assert_eq!(
        state,
        Some(RecordState::Completed),
        "the drain waited for the completion"
    );
    let retry = send(&router, "drained", "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(runs.get(), 1, "the handler ran {} times", runs.get());
}
