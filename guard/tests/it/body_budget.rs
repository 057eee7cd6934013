//! The budget of buffered request bodies (`with_body_budget`,
//! `with_max_buffered_bytes`): a body past it is a 503 `body-buffer-full`
//! with `Retry-After` that runs nothing, and the bytes come back when the
//! guard answers.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::StatusCode;
use idempotency_guard::IdempotencyLayer;
use idempotency_guard::adapter::BodyBudget;
use tokio::sync::mpsc;

use crate::support::{app, call, request, send};

/// A body fed through a channel: it ends when the sender is dropped.
fn fed_body() -> (mpsc::Sender<Result<Bytes, std::io::Error>>, Body) {
    let (tx, rx) = mpsc::channel(8);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    (tx, Body::from_stream(stream))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_past_the_budget_is_refused_and_the_budget_comes_back() {
    let db = idempotency_tests::sqlite().await;
    let budget = BodyBudget::new(1000);
    let (router, runs) =
        app(IdempotencyLayer::new(db.store.clone()).with_body_budget(budget.clone()));

    // 600 declared bytes, 10 sent: the whole 600 is reserved, and held.
    let (feed, body) = fed_body();
    let held = request(Some("held"))
        .header("content-length", "600")
        .body(body)
        .unwrap();
    let held = tokio::spawn({
        let router = router.clone();
        async move { call(&router, held).await }
    });
    feed.send(Ok(Bytes::from(vec![b'a'; 10]))).await.unwrap();
    for _ in 0..100 {
        if budget.in_use() == 600 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(budget.in_use(), 600, "the declared length is reserved");

    // Another 600 does not fit: refused before its body is read.
    let declared = request(Some("refused"))
        .header("content-length", "600")
        .body(Body::from("b".repeat(600)))
        .unwrap();
    let refused = call(&router, declared).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem(), "body-buffer-full");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.json()["key"], "refused");
    assert_eq!(runs.get(), 0, "nothing ran");
    // 300 fits beside the held 600.
    let small = send(&router, "small", &"c".repeat(300)).await;
    assert_eq!(small.status, StatusCode::CREATED, "{:?}", small.body);

    // The held body ends: it runs, and its bytes come back.
    feed.send(Ok(Bytes::from(vec![b'a'; 590]))).await.unwrap();
    drop(feed);
    let held = held.await.unwrap();
    assert_eq!(held.status, StatusCode::CREATED, "{:?}", held.body);
    assert_eq!(budget.in_use(), 0, "every reservation was returned");
    let retried = send(&router, "refused", &"b".repeat(600)).await;
    assert_eq!(
        retried.status,
        StatusCode::CREATED,
        "nothing was stored for the refusal"
    );
    assert_eq!(runs.get(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_is_refused_when_it_outgrows_the_budget() {
    let db = idempotency_tests::sqlite().await;
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()).with_max_buffered_bytes(1000));
    // No Content-Length: reserved as the chunks come, 400 at a time.
    let (feed, body) = fed_body();
    let chunked = tokio::spawn({
        let router = router.clone();
        let request = request(Some("chunked")).body(body).unwrap();
        async move { call(&router, request).await }
    });
    for _ in 0..3 {
        // The third chunk does not fit; the guard stops reading, so the
        // send may fail once it answered.
        let _ = feed.send(Ok(Bytes::from(vec![b'a'; 400]))).await;
    }
    let refused = chunked.await.unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem(), "body-buffer-full");
    assert_eq!(runs.get(), 0);
    drop(feed);
    // Under the budget, a chunked body is read whole.
    let (feed, body) = fed_body();
    let fits = tokio::spawn({
        let router = router.clone();
        let request = request(Some("fits")).body(body).unwrap();
        async move { call(&router, request).await }
    });
    for _ in 0..2 {
        feed.send(Ok(Bytes::from(vec![b'a'; 450]))).await.unwrap();
    }
    drop(feed);
    let fits = fits.await.unwrap();
    assert_eq!(fits.status, StatusCode::CREATED, "{:?}", fits.body);
    assert_eq!(runs.get(), 1);
}
