//! Fixtures: a fresh store per test on a real server, and a test app whose
//! handler counts its runs.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, IdempotencyLayer, RecordState, Store};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tower::ServiceExt;

/// The PostgreSQL server tests use; each test gets a schema of its own.
pub(crate) fn postgres_url() -> String {
    std::env::var("TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A store on a fresh database that is dropped with it.
pub(crate) struct TestDb<S> {
    pub(crate) store: S,
    cleanup: Cleanup,
}

enum Cleanup {
    PostgresSchema(String),
    SqliteDir(#[allow(dead_code)] tempfile::TempDir),
}

impl<S> Drop for TestDb<S> {
    fn drop(&mut self) {
        if let Cleanup::PostgresSchema(schema) = &self.cleanup {
            let schema = schema.clone();
            // Drop runs inside the test's runtime: clean up from a thread of its own.
            let _ = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    if let Ok(pool) = admin_pool().await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "drop schema if exists \"{schema}\" cascade"
                        )))
                        .execute(&pool)
                        .await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}

async fn admin_pool() -> Result<sqlx::PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&postgres_url())
        .await
}

/// A PostgreSQL store in a fresh schema of the test database, migrated.
pub(crate) async fn postgres() -> TestDb<PostgresStore> {
    let url = postgres_url();
    let admin = admin_pool().await.unwrap_or_else(|error| {
        panic!(
            "PostgreSQL is not answering at {url} ({error}). Start it with \
             `pg_ctlcluster --skip-systemctl-redirect 15 main start`, or point TEST_POSTGRES_URL at a server."
        )
    });
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("create schema \"{schema}\"")))
        .execute(&admin)
        .await
        .expect("create the test schema");
    admin.close().await;
    let options = PgConnectOptions::from_str(&url)
        .expect("TEST_POSTGRES_URL is a postgres URL")
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .expect("connect to the test schema");
    let store = PostgresStore::new(pool);
    store.migrate().await.expect("migrate the test schema");
    TestDb {
        store,
        cleanup: Cleanup::PostgresSchema(schema),
    }
}

/// An SQLite store in a fresh file of a temporary directory, migrated.
pub(crate) async fn sqlite() -> TestDb<SqliteStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("records.db").display());
    let store = SqliteStore::connect(&url)
        .await
        .expect("open the SQLite file");
    store.migrate().await.expect("migrate SQLite");
    TestDb {
        store,
        cleanup: Cleanup::SqliteDir(dir),
    }
}

/// Makes a store unreachable, as if its server went away.
pub(crate) trait Breakable {
    /// Closes the store's connections for good.
    fn break_store(&self) -> impl std::future::Future<Output = ()> + Send;
}

impl Breakable for PostgresStore {
    async fn break_store(&self) {
        self.pool().close().await;
    }
}

impl Breakable for SqliteStore {
    async fn break_store(&self) {
        self.pool().close().await;
    }
}

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
/// `x-body-bytes` (answer a body of that many bytes), `x-no-store`.
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

/// Sends any request.
pub(crate) async fn call(router: &Router, request: Request<Body>) -> Answer {
    let response = router.clone().oneshot(request).await.unwrap();
    Answer::read(response).await
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) async fn read(response: Response<Body>) -> Self {
        let (parts, body) = response.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The problem `type` name after `urn:idempotency:`, checking the
    /// problem's shape on the way.
    pub(crate) fn problem(&self) -> String {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "not a problem: {} {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        let json = self.json();
        assert_eq!(json["status"], self.status.as_u16(), "problem status");
        assert!(
            json["title"].is_string() && json["detail"].is_string(),
            "title and detail"
        );
        json["type"]
            .as_str()
            .and_then(|t| t.strip_prefix("urn:idempotency:"))
            .unwrap_or_else(|| panic!("problem type: {json}"))
            .to_owned()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub(crate) fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// Claims `key` directly in the store with a short lease that nobody
/// renews, as a process that crashed mid-handler leaves it.
pub(crate) async fn abandon<S: Store>(store: &S, key: &str, body: &str, transactional: bool) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let fingerprint = Fingerprint::of_request(&Method::POST, "/things", &headers, body.as_bytes());
    let new = NewRecord {
        scope: "default",
        key,
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
    let record = store.get("default", key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
}
