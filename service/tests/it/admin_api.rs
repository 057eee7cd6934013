//! The admin API, through `build_router(...).oneshot(...)`, on every store:
//! who may call it, what each action does to a record, and the audit line
//! each action leaves.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Method, Request, StatusCode};
use idempotency_guard::store::AnyStore;
use idempotency_guard::{IdempotencyLayer, Store};
use idempotency_tests::TestDb;
use serde_json::Value;

use crate::support::{ADMIN_A, ADMIN_ALL, Seed, TOKEN_A, call, get, router, seed};

/// Instantiates the admin API suite for one store.
macro_rules! admin_api {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::admin_api as suite;
            admin_api!(@tests $fixture;
                scope_tokens_cannot_call_admin_endpoints,
                an_admin_of_scope_a_cannot_touch_scope_b,
                deleting_a_completed_key_lets_the_next_request_run_once,
                live_in_flight_records_are_never_deleted_abandoned_ones_need_force_or_release,
                listing_finds_abandoned_keys_page_by_page,
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

const LIST: &str = "/v1/admin/keys";
const FORGET: &str = "/v1/admin/keys/{scope}/{key}";
const RELEASE: &str = "/v1/admin/keys/{scope}/{key}/release";

fn admin_request(method: Method, path: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(Body::empty()).unwrap()
}

fn forget(scope: &str, key: &str, force: bool, token: &str) -> Request<Body> {
    let query = if force { "?force=true" } else { "" };
    admin_request(
        Method::DELETE,
        &format!("/v1/admin/keys/{scope}/{key}{query}"),
        Some(token),
    )
}

fn release(scope: &str, key: &str, token: &str) -> Request<Body> {
    admin_request(
        Method::POST,
        &format!("/v1/admin/keys/{scope}/{key}/release"),
        Some(token),
    )
}

fn problem_name(answer: &idempotency_tests::Answer) -> String {
    answer.json()["type"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("urn:idempotency:")
        .to_owned()
}

/// Collects every log line written while it is the default subscriber of
/// this thread (the tests' handlers run on it: `oneshot` polls them here).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The audit lines, parsed.
    fn audit(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|line| line["target"] == idempotency_service::admin::AUDIT_TARGET)
            .map(|line| line["fields"].clone())
            .collect()
    }
}

fn assert_audit(line: &Value, who: &str, action: &str, scope: &str, key: &str, result: &str) {
    assert_eq!(line["who"], who, "{line}");
    assert_eq!(line["action"], action, "{line}");
    assert_eq!(line["scope"], scope, "{line}");
    assert_eq!(line["key"], key, "{line}");
    assert_eq!(line["result"], result, "{line}");
    let at = line["at"].as_str().unwrap();
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| panic!("`at` is RFC 3339: {at}"));
}

pub(crate) async fn scope_tokens_cannot_call_admin_endpoints<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-a", "done", Seed::Completed).await;
    let router = router(store.clone());
    for token in [None, Some(TOKEN_A), Some("not-a-token-at-all-0123456789")] {
        let answers = [
            (
                LIST,
                call(
                    &router,
                    LIST,
                    admin_request(Method::GET, "/v1/admin/keys?scope=tenant-a", token),
                )
                .await,
            ),
            (
                FORGET,
                call(
                    &router,
                    FORGET,
                    admin_request(Method::DELETE, "/v1/admin/keys/tenant-a/done", token),
                )
                .await,
            ),
            (
                RELEASE,
                call(
                    &router,
                    RELEASE,
                    admin_request(Method::POST, "/v1/admin/keys/tenant-a/done/release", token),
                )
                .await,
            ),
        ];
        for (path, answer) in answers {
            assert_eq!(
                answer.status,
                StatusCode::UNAUTHORIZED,
                "{path} with {token:?}"
            );
            assert_eq!(problem_name(&answer), "unauthorized");
        }
    }
    assert!(
        store.get("tenant-a", "done").await.unwrap().is_some(),
        "nothing was deleted"
    );
    // And an admin token is no scope token.
    let answer = call(
        &router,
        "/v1/keys/{key}",
        get("/v1/keys/done", Some(ADMIN_ALL)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
}

pub(crate) async fn an_admin_of_scope_a_cannot_touch_scope_b<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-b", "done", Seed::Completed).await;
    seed(&store, "tenant-b", "lost", Seed::Abandoned).await;
    let router = router(store.clone());
    let logs = Logs::default();
    let _capture = logs.capture();

    let answer = call(
        &router,
        LIST,
        admin_request(Method::GET, "/v1/admin/keys?scope=tenant-b", Some(ADMIN_A)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert_eq!(problem_name(&answer), "scope-forbidden");
    let answer = call(&router, FORGET, forget("tenant-b", "done", true, ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    let answer = call(&router, RELEASE, release("tenant-b", "lost", ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(store.get("tenant-b", "done").await.unwrap().is_some());
    assert!(store.get("tenant-b", "lost").await.unwrap().is_some());

    // Its own scope is fine.
    let answer = call(
        &router,
        LIST,
        admin_request(Method::GET, "/v1/admin/keys?scope=tenant-a", Some(ADMIN_A)),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);

    let audit = logs.audit();
    assert_eq!(audit.len(), 4, "one line per action: {audit:?}");
    assert_audit(&audit[0], "alice", "list", "tenant-b", "-", "forbidden");
    assert_audit(
        &audit[1],
        "alice",
        "forget",
        "tenant-b",
        "done",
        "forbidden",
    );
    assert_audit(
        &audit[2],
        "alice",
        "release",
        "tenant-b",
        "lost",
        "forbidden",
    );
    assert_audit(&audit[3], "alice", "list", "tenant-a", "-", "ok");
    assert!(!logs.text().contains(ADMIN_A), "tokens are never logged");
}

pub(crate) async fn deleting_a_completed_key_lets_the_next_request_run_once<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/payments",
            post(move || {
                let counter = counter.clone();
                async move {
                    let run = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("{{\"run\":{run}}}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()));
    let pay = || {
        Request::post("/payments")
            .header("idempotency-key", "order-1")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"amount":1}"#))
            .unwrap()
    };
    let runs_now = || runs.load(std::sync::atomic::Ordering::SeqCst);

    assert_eq!(
        idempotency_tests::call(&app, pay()).await.status,
        StatusCode::CREATED
    );
    let replay = idempotency_tests::call(&app, pay()).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs_now(), 1);

    let logs = Logs::default();
    let capture = logs.capture();
    let service = router(store.clone());
    let answer = call(
        &service,
        FORGET,
        forget("default", "order-1", false, ADMIN_ALL),
    )
    .await;
    drop(capture);
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
    assert_eq!(answer.json()["previous_state"], "completed");
    let audit = logs.audit();
    assert_eq!(audit.len(), 1);
    assert_audit(
        &audit[0],
        "ops",
        "forget",
        "default",
        "order-1",
        "deleted-completed",
    );

    let again = idempotency_tests::call(&app, pay()).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.header("idempotent-replayed"), None, "it ran again");
    assert_eq!(String::from_utf8_lossy(&again.body), r#"{"run":2}"#);
    let replay = idempotency_tests::call(&app, pay()).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs_now(), 2, "the next request ran once, not more");
}

pub(crate) async fn live_in_flight_records_are_never_deleted_abandoned_ones_need_force_or_release<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-a", "running", Seed::InFlight).await;
    seed(&store, "tenant-a", "lost", Seed::Abandoned).await;
    seed(&store, "tenant-a", "lost-too", Seed::Abandoned).await;
    seed(&store, "tenant-a", "done", Seed::Completed).await;
    let router = router(store.clone());
    let logs = Logs::default();
    let _capture = logs.capture();

    for force in [false, true] {
        let answer = call(
            &router,
            FORGET,
            forget("tenant-a", "running", force, ADMIN_A),
        )
        .await;
        assert_eq!(answer.status, StatusCode::CONFLICT, "force={force}");
        assert_eq!(problem_name(&answer), "request-in-flight");
        assert_eq!(answer.json()["key"], "running");
    }
    let answer = call(&router, RELEASE, release("tenant-a", "running", ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert!(store.get("tenant-a", "running").await.unwrap().is_some());

    let answer = call(&router, FORGET, forget("tenant-a", "lost", false, ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(problem_name(&answer), "outcome-unknown");
    let answer = call(&router, FORGET, forget("tenant-a", "lost", true, ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["previous_state"], "abandoned");

    let answer = call(&router, RELEASE, release("tenant-a", "done", ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(problem_name(&answer), "record-completed");
    let answer = call(&router, RELEASE, release("tenant-a", "lost-too", ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["action"], "release");
    let answer = call(&router, RELEASE, release("tenant-a", "lost-too", ADMIN_A)).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    let answer = call(
        &router,
        FORGET,
        forget("tenant-a", "bad%20key", false, ADMIN_A),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);

    let results: Vec<String> = logs
        .audit()
        .iter()
        .map(|line| {
            format!("{} {} {}", line["action"], line["key"], line["result"]).replace('"', "")
        })
        .collect();
    assert_eq!(
        results,
        [
            "forget running refused-in-flight",
            "forget running refused-in-flight",
            "release running refused-in-flight",
            "forget lost refused-abandoned",
            "forget lost deleted-abandoned",
            "release done refused-completed",
            "release lost-too deleted-abandoned",
            "release lost-too not-found",
        ],
        "one audit line per action (a malformed request is no action)"
    );
}

pub(crate) async fn listing_finds_abandoned_keys_page_by_page<S: Store + Into<AnyStore>>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    for key in ["a", "b", "c"] {
        seed(&store, "tenant-a", key, Seed::Abandoned).await;
    }
    seed(&store, "tenant-a", "d", Seed::Completed).await;
    seed(&store, "tenant-b", "e", Seed::Abandoned).await;
    let router = router(store);
    let list = |query: &str| {
        admin_request(
            Method::GET,
            &format!("/v1/admin/keys?{query}"),
            Some(ADMIN_ALL),
        )
    };
    let first = call(
        &router,
        LIST,
        list("scope=tenant-a&state=abandoned&limit=2"),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    let first = first.json();
    let keys = |page: &Value| -> Vec<String> {
        page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(keys(&first), ["a", "b"]);
    assert_eq!(first["records"][0]["state"], "abandoned");
    assert_eq!(first["next"], "b");
    let second = call(
        &router,
        LIST,
        list("scope=tenant-a&state=abandoned&limit=2&after=b"),
    )
    .await
    .json();
    assert_eq!(keys(&second), ["c"]);
    assert!(second.get("next").is_none(), "the last page has no cursor");
    let all = call(&router, LIST, list("scope=tenant-a")).await.json();
    assert_eq!(keys(&all), ["a", "b", "c", "d"]);
    for bad in [
        "scope=tenant-a&state=stuck",
        "scope=tenant-a&limit=0",
        "state=any",
    ] {
        let answer = call(&router, LIST, list(bad)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}
