//! The guard's test app: a handler that counts its runs, behind the layer.
//! Stores come from the shared fixtures of `idempotency-tests`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, IdempotencyLayer, RecordState, Store};
pub(crate) use idempotency_tests::{Answer, TestDb, call, names};

/// How many times the test handler ran.
#[derive(Clone, Default)]
pub(crate) struct Runs(Arc<AtomicUsize>);

impl Runs {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The test handler. It counts its run first, then reads its orders from
/// request headers (headers are not part of the fingerprint):
/// `x-delay-ms` (sleep), `x-status` (answer this status), `x-panic`,
/// `x-body-bytes` (answer a body of that many bytes), `x-no-store`,
/// `x-final` (mark a 4xx as the handler's own decision, stored).
async fn handler(State(runs): State<Runs>, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let run = runs.0.fetch_add(1, Ordering::SeqCst) + 1;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if let Some(ms) = header("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if header("x-panic").is_some() {
        panic!("the test handler was told to panic");
    }
    let status = header("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    let body = match header("x-body-bytes").and_then(|v| v.parse::<usize>().ok()) {
        Some(size) => Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>()),
        None => Bytes::from(format!(
            r#"{{"run":{run},"echo":{}}}"#,
            serde_json::to_string(&String::from_utf8_lossy(&body)).unwrap()
        )),
    };
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("location", format!("/things/{run}"))
        .header("x-run", run.to_string())
        .header("set-cookie", "session=abc")
        .header("date", "Sun, 06 Nov 1994 08:49:37 GMT");
    if header("x-no-store").is_some() {
        response = response.header("cache-control", "no-store");
    }
    if header("x-final").is_some() {
        response = response.extension(idempotency_guard::FinalResponse);
    }
    response.body(Body::from(body)).unwrap()
}

/// A router with the counting handler on `POST|PATCH|PUT|GET /things`,
/// guarded by `layer`.
pub(crate) fn app<S: Store>(layer: IdempotencyLayer<S>) -> (Router, Runs) {
    let runs = Runs::default();
    let router = Router::new()
        .route(
            "/things",
            post(handler).patch(handler).put(handler).get(handler),
        )
        .route_layer(layer)
        .with_state(runs.clone());
    (router, runs)
}

/// A request builder for `POST /things` with a JSON content type.
pub(crate) fn request(key: Option<&str>) -> http::request::Builder {
    let mut builder = Request::post("/things").header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
}

/// Sends `POST /things` with a key and a JSON body.
pub(crate) async fn send(router: &Router, key: &str, body: &str) -> Answer {
    let request = request(Some(key))
        .body(Body::from(body.to_owned()))
        .unwrap();
    call(router, request).await
}

/// Claims `key` directly in the store with a short lease that nobody
/// renews, as a process that crashed mid-handler leaves it.
pub(crate) async fn abandon<S: Store>(store: &S, key: &str, body: &str, transactional: bool) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let fingerprint = Fingerprint::of_request(&Method::POST, "/things", &headers, body.as_bytes());
    let new = NewRecord {
        scope: names::scope("default"),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/things",
        token: LeaseToken::new(),
        lease: Duration::from_millis(200),
        retention: Duration::from_secs(3600),
        transactional,
    };
    assert!(matches!(
        store.claim(&new).await.unwrap(),
        Claim::Acquired(_)
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let record = store
        .get(names::scope("default"), names::key(key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
}
