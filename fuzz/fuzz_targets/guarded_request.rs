//! Arbitrary requests through the guard on SQLite: the first byte picks the
//! method and content type, the next bytes up to a newline are the key
//! header's raw value, the rest is the body. Nothing may panic, and the
//! guard never answers 500 (the handler never fails).
#![no_main]

use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderValue, Method, Request, StatusCode};
use idempotency_guard::IdempotencyLayer;
use idempotency_guard::store::sqlite::SqliteStore;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

struct Harness {
    runtime: tokio::runtime::Runtime,
    router: Router,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
        let router = runtime.block_on(async {
            let store = SqliteStore::connect(&url).await.unwrap();
            store.migrate().await.unwrap();
            Router::new()
                .route("/p", post(|body: axum::body::Bytes| async move { (StatusCode::CREATED, body) }).patch(|| async { "patched" }))
                .route_layer(IdempotencyLayer::new(store).with_body_limit(4096))
        });
        Harness { runtime, router, _dir: dir }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let (key, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let method = if selector & 1 == 0 { Method::POST } else { Method::PATCH };
    let mut request = Request::builder().method(method).uri("/p");
    if selector & 2 == 0 {
        request = request.header("content-type", "application/json");
    }
    let mut request = request.body(Body::from(body.to_vec())).unwrap();
    if selector & 4 == 0 {
        if let Ok(value) = HeaderValue::from_bytes(key) {
            request.headers_mut().insert("idempotency-key", value);
        }
    }
    let harness = harness();
    let response = harness.runtime.block_on(harness.router.clone().oneshot(request)).unwrap();
    assert_ne!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
});
