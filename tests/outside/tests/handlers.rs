use std::sync::Arc;

use axum::{Router, body::Body, http::Request, http::StatusCode, routing::post};
use idempotency_guard::{IdempotencyLayer, store::sqlite::SqliteStore};
use tokio::sync::{Notify, mpsc};
use tower::ServiceExt as _;

#[tokio::test]
async fn a_retry_never_runs_the_handler_twice() {
    // The handler holds a "slow" payment until the test lets it go.
    let (started, mut running) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let handler = move |body: String| async move {
        if body == "slow" {
            started.send(()).unwrap();
            held.notified().await;
        }
        (StatusCode::CREATED, body)
    };
    let app = Router::new()
        .route("/payments", post(handler))
        .route_layer(IdempotencyLayer::new(SqliteStore::memory().await.unwrap()));
    let pay = |key: &'static str, body: &'static str| {
        let request = Request::post("/payments").header("idempotency-key", key);
        app.clone().oneshot(request.body(Body::from(body)).unwrap())
    };

    let paid = pay("k1", "5 EUR").await.unwrap();
    assert_eq!(paid.status(), StatusCode::CREATED);
    let replay = pay("k1", "5 EUR").await.unwrap(); // the stored 201, the handler not run
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let other_body = pay("k1", "9 EUR").await.unwrap();
    assert_eq!(other_body.status(), StatusCode::CONFLICT); // key-reused
    let first = tokio::spawn(pay("k2", "slow"));
    running.recv().await.unwrap(); // the first is in flight: its duplicate gets 409
    let duplicate = pay("k2", "slow").await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT); // request-in-flight
    gate.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
}
