//! Webhook receivers in front of the guard, on real stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use idempotency_consumer::webhook::{WebhookLayer, sign_standard_webhook};
use idempotency_guard::{IdempotencyLayer, Store};
use idempotency_tests::call;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SCOPE: &str = "webhooks:orders";

fn app<S: Store>(store: S, runs: Arc<AtomicU32>) -> Router {
    Router::new()
        .route(
            "/webhooks/orders",
            post(move || {
                let runs = Arc::clone(&runs);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::OK, format!("received, run {n}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(store).with_scope(|_| SCOPE.into()))
        .route_layer(WebhookLayer::standard_webhooks(SECRET).unwrap())
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn delivery(
    id: Option<&str>,
    timestamp: i64,
    signature: Option<&str>,
    body: &'static str,
) -> Request<Body> {
    let mut request = Request::post("/webhooks/orders").header("content-type", "application/json");
    if let Some(id) = id {
        request = request.header("webhook-id", id);
    }
    request = request.header("webhook-timestamp", timestamp.to_string());
    if let Some(signature) = signature {
        request = request.header("webhook-signature", signature);
    }
    request.body(Body::from(body)).unwrap()
}

pub(crate) async fn a_valid_delivery_runs_once_and_replays<S: Store>(store: S) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let body = r#"{"type":"order.paid","order":"o-1"}"#;
    let ts = now();
    let signature = sign_standard_webhook(SECRET, &id, ts, body.as_bytes()).unwrap();
    let first = call(&app, delivery(Some(&id), ts, Some(&signature), body)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.as_ref(), b"received, run 1");
    assert!(!first.replayed());
    // The sender retries (same id, re-signed at a later second): the stored 2xx.
    let later = ts + 1;
    let resigned = sign_standard_webhook(SECRET, &id, later, body.as_bytes()).unwrap();
    let again = call(&app, delivery(Some(&id), later, Some(&resigned), body)).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body.as_ref(), b"received, run 1");
    assert!(again.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(store.get(SCOPE, &id).await.unwrap().is_some());
}

pub(crate) async fn refused_deliveries_store_nothing<S: Store>(store: S) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = app(store.clone(), Arc::clone(&runs));
    let body = r#"{"type":"order.paid","order":"o-2"}"#;
    let ts = now();
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let good = sign_standard_webhook(SECRET, &id, ts, body.as_bytes()).unwrap();
    let forged = sign_standard_webhook(
        "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==",
        &id,
        ts,
        body.as_bytes(),
    )
    .unwrap();
    let old = ts - 3600;
    let signed_old = sign_standard_webhook(SECRET, &id, old, body.as_bytes()).unwrap();
    let cases = [
        (
            delivery(Some(&id), ts, Some(&forged), body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        (
            delivery(Some(&id), ts, None, body),
            StatusCode::UNAUTHORIZED,
            "webhook-signature-invalid",
        ),
        (
            delivery(Some(&id), old, Some(&signed_old), body),
            StatusCode::BAD_REQUEST,
            "webhook-timestamp-expired",
        ),
        (
            delivery(None, ts, Some(&good), body),
            StatusCode::BAD_REQUEST,
            "webhook-id-missing",
        ),
    ];
    for (request, status, problem) in cases {
        let answer = call(&app, request).await;
        assert_eq!(answer.status, status, "{problem}");
        assert_eq!(answer.problem(), problem);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert!(
        store.get(SCOPE, &id).await.unwrap().is_none(),
        "nothing was stored"
    );
}
