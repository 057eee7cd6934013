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
use idempotency_tests::{TestDb, names};
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
                reconciled_records_leave_the_needs_decision_list_and_the_csv,
                a_record_shows_its_life_request_and_redacted_response,
                listings_filter_by_method_route_and_time_across_pages,
                a_decision_without_a_reason_is_refused_and_changes_nothing,
                the_trail_keeps_who_when_why_and_result_after_the_record_is_gone,
            );
        }
    };
    ($backend:ident, $fixture:path; $($test:ident),+ $(,)?) => {
        mod $backend {
            use $crate::admin_api as suite;
            admin_api!(@tests $fixture; $($test),+);
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

/// The reason every action of these tests gives (percent-encoded).
const REASON: &str = "reason=ledger%20checked";

fn forget(scope: &str, key: &str, force: bool, token: &str) -> Request<Body> {
    let query = if force {
        format!("?force=true&{REASON}")
    } else {
        format!("?{REASON}")
    };
    admin_request(
        Method::DELETE,
        &format!("/v1/admin/keys/{scope}/{key}{query}"),
        Some(token),
    )
}

fn release(scope: &str, key: &str, token: &str) -> Request<Body> {
    admin_request(
        Method::POST,
        &format!("/v1/admin/keys/{scope}/{key}/release?{REASON}"),
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
            .filter(|line| line["target"] == idempotency_service::AUDIT_TARGET)
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
        store
            .get(names::scope("tenant-a"), names::key("done"))
            .await
            .unwrap()
            .is_some(),
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
    assert!(
        store
            .get(names::scope("tenant-b"), names::key("done"))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .get(names::scope("tenant-b"), names::key("lost"))
            .await
            .unwrap()
            .is_some()
    );

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
    assert!(
        store
            .get(names::scope("tenant-a"), names::key("running"))
            .await
            .unwrap()
            .is_some()
    );

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

const SHOW: &str = "/v1/admin/keys/{scope}/{key}";
const RECONCILE: &str = "/v1/admin/keys/{scope}/{key}/reconcile";
const EXPORT: &str = "/v1/admin/keys.csv";

fn keys_of(page: &Value) -> Vec<String> {
    page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) async fn reconciled_records_leave_the_needs_decision_list_and_the_csv<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-a", "lost-1", Seed::Abandoned).await;
    seed(&store, "tenant-a", "lost-2", Seed::Abandoned).await;
    seed(&store, "tenant-a", "=HYPERLINK(1)", Seed::Abandoned).await;
    seed(&store, "tenant-a", "done", Seed::Completed).await;
    seed(&store, "tenant-a", "running", Seed::InFlight).await;
    seed(&store, "tenant-a", "tx-lapsed", Seed::TransactionalLapsed).await;
    seed(&store, "tenant-b", "lost-b", Seed::Abandoned).await;
    let router = router(store.clone());
    let logs = Logs::default();
    let _capture = logs.capture();
    let get_as = |path: &str, token: &str| admin_request(Method::GET, path, Some(token));
    let post_as = |path: &str, token: &str| admin_request(Method::POST, path, Some(token));

    let needs = call(
        &router,
        LIST,
        get_as("/v1/admin/keys?scope=tenant-a&needs_decision=true", ADMIN_A),
    )
    .await
    .json();
    assert_eq!(keys_of(&needs), ["=HYPERLINK(1)", "lost-1", "lost-2"]);
    assert_eq!(needs["records"][0]["needs_decision"], true);

    // A reason is required, and bounded.
    for query in ["", "?reason=", "?reason=a%0Ab"] {
        let answer = call(
            &router,
            RECONCILE,
            post_as(
                &format!("/v1/admin/keys/tenant-a/lost-1/reconcile{query}"),
                ADMIN_A,
            ),
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
        assert_eq!(problem_name(&answer), "reason-required", "{query}");
    }
    let marked = call(
        &router,
        RECONCILE,
        post_as(
            "/v1/admin/keys/tenant-a/lost-1/reconcile?reason=refunded%20by%20finance%20%23412",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(marked.status, StatusCode::OK, "{}", marked.json());
    let marked = marked.json();
    assert_eq!(marked["needs_decision"], false);
    assert_eq!(marked["state"], "abandoned", "kept as it was");
    assert_eq!(marked["reconciled"]["by"], "alice");
    assert_eq!(marked["reconciled"]["reason"], "refunded by finance #412");
    assert!(
        store
            .get(names::scope("tenant-a"), names::key("lost-1"))
            .await
            .unwrap()
            .is_some(),
        "reconciling keeps the record"
    );

    for (key, status, problem) in [
        ("done", StatusCode::CONFLICT, "record-completed"),
        ("running", StatusCode::CONFLICT, "request-in-flight"),
        ("missing", StatusCode::NOT_FOUND, "key-not-found"),
    ] {
        let answer = call(
            &router,
            RECONCILE,
            post_as(
                &format!("/v1/admin/keys/tenant-a/{key}/reconcile?reason=x"),
                ADMIN_A,
            ),
        )
        .await;
        assert_eq!(answer.status, status, "{key}");
        assert_eq!(problem_name(&answer), problem, "{key}");
    }
    let answer = call(
        &router,
        RECONCILE,
        post_as("/v1/admin/keys/tenant-b/lost-b/reconcile?reason=x", ADMIN_A),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);

    let needs = call(
        &router,
        LIST,
        get_as("/v1/admin/keys?scope=tenant-a&needs_decision=true", ADMIN_A),
    )
    .await
    .json();
    assert_eq!(keys_of(&needs), ["=HYPERLINK(1)", "lost-2"]);
    let rest = call(
        &router,
        LIST,
        get_as(
            "/v1/admin/keys?scope=tenant-a&needs_decision=false",
            ADMIN_A,
        ),
    )
    .await
    .json();
    assert_eq!(
        keys_of(&rest),
        ["done", "lost-1", "running", "tx-lapsed"],
        "the rest: reconciled, completed, in flight, and a transactional lapse (nothing ran)"
    );
    let answer = call(
        &router,
        LIST,
        get_as(
            "/v1/admin/keys?scope=tenant-a&needs_decision=true&state=completed",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        keys_of(&answer.json()),
        Vec::<String>::new(),
        "completed records never need a decision"
    );

    let csv = call(
        &router,
        EXPORT,
        get_as(
            "/v1/admin/keys.csv?scope=tenant-a&needs_decision=true",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(csv.status, StatusCode::OK);
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = String::from_utf8(csv.body.to_vec()).unwrap();
    let lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("scope,key,state,needs_decision,method,path,fingerprint"));
    assert!(
        lines[1].starts_with(
            r#""tenant-a","'=HYPERLINK(1)","abandoned","true","POST","/payments?x=1","sha256:"#
        ),
        "a cell that a spreadsheet would run is defused: {}",
        lines[1]
    );
    assert!(lines[2].contains(r#""lost-2""#));
    assert!(
        !text.contains("lost-1"),
        "reconciled: not in finance's list"
    );
    let all = call(
        &router,
        EXPORT,
        get_as("/v1/admin/keys.csv?scope=tenant-a", ADMIN_A),
    )
    .await;
    let all = String::from_utf8(all.body.to_vec()).unwrap();
    assert!(all.contains(r#""lost-1","abandoned","false""#), "{all}");
    assert!(
        all.contains(r#""alice","refunded by finance #412""#),
        "{all}"
    );
    let answer = call(
        &router,
        EXPORT,
        get_as(
            "/v1/admin/keys.csv?scope=tenant-b&needs_decision=true",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);

    let audit = logs.audit();
    let reconciled: Vec<&Value> = audit
        .iter()
        .filter(|line| line["action"] == "reconcile" && line["result"] == "reconciled")
        .collect();
    assert_eq!(reconciled.len(), 1);
    assert_audit(
        reconciled[0],
        "alice",
        "reconcile",
        "tenant-a",
        "lost-1",
        "reconciled",
    );
    assert_eq!(reconciled[0]["reason"], "refunded by finance #412");
    assert!(
        audit
            .iter()
            .any(|line| line["action"] == "export" && line["result"] == "forbidden"),
        "a refused export is audited"
    );
}

pub(crate) async fn a_record_shows_its_life_request_and_redacted_response<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    use idempotency_guard::StoredResponse;
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
    let store: AnyStore = db.store.clone().into();
    let complete = |key: &'static str, headers: http::HeaderMap, body: &'static [u8]| {
        let store = store.clone();
        async move {
            let new = NewRecord {
                scope: names::scope("tenant-a"),
                key: names::key(key),
                fingerprint: &crate::support::FP,
                method: "POST",
                path: "/payments",
                token: LeaseToken::new(),
                lease: std::time::Duration::from_secs(60),
                retention: std::time::Duration::from_secs(3600),
                transactional: false,
            };
            let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
                panic!("claimed twice");
            };
            let response = StoredResponse {
                status: StatusCode::CREATED,
                headers,
                body: Some(bytes::Bytes::from_static(body)),
            };
            store.complete(&lease, &response).await.unwrap();
        }
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("set-cookie", "session=s3cr3t".parse().unwrap());
    headers.insert("location", "/payments/pay_1".parse().unwrap());
    complete(
        "paid",
        headers,
        br#"{"id":"pay_1","card":{"number":"4111111111111111"},"note":"account 12345678901234","amount":1250}"#,
    )
    .await;
    let mut sealed = http::HeaderMap::new();
    sealed.insert("idempotency-sealed", "v1 k1".parse().unwrap());
    complete("sealed", sealed, b"\x8a\x01ciphertext").await;
    seed(&store, "tenant-a", "lost", Seed::Abandoned).await;
    let router = router(store.clone());
    let logs = Logs::default();
    let _capture = logs.capture();
    let show = |key: &str, token: &str| {
        admin_request(
            Method::GET,
            &format!("/v1/admin/keys/tenant-a/{key}"),
            Some(token),
        )
    };

    let paid = call(&router, SHOW, show("paid", ADMIN_A)).await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.json());
    let paid = paid.json();
    assert_eq!(paid["record"]["method"], "POST");
    assert_eq!(paid["record"]["path"], "/payments");
    assert_eq!(
        paid["record"]["fingerprint"],
        crate::support::FP.to_string()
    );
    assert_eq!(paid["record"]["needs_decision"], false);
    let events: Vec<&str> = paid["life"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["claimed", "completed", "expires"]);
    let response = &paid["response"];
    assert_eq!(response["status"], 201);
    assert_eq!(response["sealed"], false);
    let header = |name: &str| {
        response["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name)
            .map(|h| h["value"].as_str().unwrap().to_owned())
    };
    assert_eq!(header("set-cookie").as_deref(), Some("[redacted]"));
    assert_eq!(header("location").as_deref(), Some("/payments/pay_1"));
    let preview = response["body"]["preview"].as_str().unwrap();
    assert!(
        preview.contains("pay_1") && preview.contains("1250"),
        "{preview}"
    );
    assert!(!preview.contains("4111111111111111"), "{preview}");
    assert!(!preview.contains("12345678901234"), "{preview}");
    assert!(
        preview.contains("[redacted]") && preview.contains("1234"),
        "{preview}"
    );

    let sealed = call(&router, SHOW, show("sealed", ADMIN_A)).await.json();
    assert_eq!(sealed["response"]["sealed"], true);
    assert_eq!(sealed["response"]["status"], 201);
    assert_eq!(sealed["response"]["headers"], serde_json::json!([]));
    assert!(sealed["response"]["body"].get("preview").is_none());

    let lost = call(&router, SHOW, show("lost", ADMIN_A)).await.json();
    assert_eq!(lost["record"]["needs_decision"], true);
    assert!(lost.get("response").is_none());
    let events: Vec<&str> = lost["life"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["claimed", "lease_expired", "expires"]);

    assert_eq!(
        call(&router, SHOW, show("missing", ADMIN_A)).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&router, SHOW, show("bad%20key", ADMIN_A)).await.status,
        StatusCode::BAD_REQUEST
    );
    let other = call(
        &router,
        SHOW,
        admin_request(Method::GET, "/v1/admin/keys/tenant-b/paid", Some(ADMIN_A)),
    )
    .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);

    // The release's reason reaches its audit line.
    let released = call(
        &router,
        RELEASE,
        admin_request(
            Method::POST,
            "/v1/admin/keys/tenant-a/lost/release?reason=charged%20once%2C%20confirmed",
            Some(ADMIN_A),
        ),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK);
    let audit = logs.audit();
    let line = audit.iter().find(|l| l["action"] == "release").unwrap();
    assert_audit(
        line,
        "alice",
        "release",
        "tenant-a",
        "lost",
        "deleted-abandoned",
    );
    assert_eq!(line["reason"], "charged once, confirmed");
    let shown = audit.iter().find(|l| l["action"] == "show").unwrap();
    assert_eq!(shown["reason"], "-");

    let me = call(
        &router,
        "/v1/admin/whoami",
        admin_request(Method::GET, "/v1/admin/whoami", Some(ADMIN_A)),
    )
    .await
    .json();
    assert_eq!(
        me,
        serde_json::json!({"name": "alice", "scopes": ["tenant-a"]})
    );
    let me = call(
        &router,
        "/v1/admin/whoami",
        admin_request(Method::GET, "/v1/admin/whoami", Some(TOKEN_A)),
    )
    .await;
    assert_eq!(
        me.status,
        StatusCode::UNAUTHORIZED,
        "a scope token is no admin"
    );
}

pub(crate) async fn listings_filter_by_method_route_and_time_across_pages<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
    let store: AnyStore = db.store.clone().into();
    // Ten keys; the even ones are refunds (PUT /refunds/..), the odd ones
    // payments (POST /payments).
    for n in 0..10 {
        let key = format!("k{n:02}");
        let (method, path) = if n % 2 == 0 {
            ("PUT", format!("/refunds/{n}"))
        } else {
            ("POST", "/payments".to_owned())
        };
        let new = NewRecord {
            scope: names::scope("tenant-a"),
            key: names::key(&key),
            fingerprint: &crate::support::FP,
            method,
            path: &path,
            token: LeaseToken::new(),
            lease: std::time::Duration::from_secs(60),
            retention: std::time::Duration::from_secs(3600),
            transactional: false,
        };
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("claimed twice");
        };
        store
            .renew(&lease, std::time::Duration::ZERO)
            .await
            .unwrap();
    }
    let router = router(store);
    let list = |query: &str| {
        admin_request(
            Method::GET,
            &format!("/v1/admin/keys?scope=tenant-a&{query}"),
            Some(ADMIN_A),
        )
    };
    // Page by page through a filter that leaves half the records out.
    let mut seen = Vec::new();
    let mut after = String::new();
    for _ in 0..10 {
        let page = call(
            &router,
            LIST,
            list(&format!("path_prefix=/refunds/&limit=2{after}")),
        )
        .await
        .json();
        seen.extend(keys_of(&page));
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["k00", "k02", "k04", "k06", "k08"]);
    let posts = call(&router, LIST, list("method=post&needs_decision=true"))
        .await
        .json();
    assert_eq!(keys_of(&posts), ["k01", "k03", "k05", "k07", "k09"]);
    let future = call(&router, LIST, list("created_after=2999-01-01T00:00:00Z"))
        .await
        .json();
    assert_eq!(keys_of(&future), Vec::<String>::new());
    let past = call(
        &router,
        LIST,
        list("created_after=2000-01-01T00:00:00Z&created_before=2999-01-01T00:00:00Z&limit=3"),
    )
    .await
    .json();
    assert_eq!(keys_of(&past), ["k00", "k01", "k02"]);
    for bad in [
        "created_after=yesterday",
        "method=",
        "path_prefix=",
        "needs_decision=maybe",
    ] {
        let answer = call(&router, LIST, list(bad)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

const DECISIONS: &str = "/v1/admin/keys/{scope}/{key}/decisions";

/// The decisions on `key` of `scope`, as `token` reads them.
async fn decisions(router: &Router, scope: &str, key: &str, token: &str) -> Vec<Value> {
    let answer = call(
        router,
        DECISIONS,
        admin_request(
            Method::GET,
            &format!("/v1/admin/keys/{scope}/{key}/decisions"),
            Some(token),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
    assert_eq!(answer.json()["truncated"], false);
    answer.json()["decisions"].as_array().unwrap().clone()
}

pub(crate) async fn a_decision_without_a_reason_is_refused_and_changes_nothing<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-a", "lost", Seed::Abandoned).await;
    seed(&store, "tenant-a", "done", Seed::Completed).await;
    let router = router(store.clone());
    let logs = Logs::default();
    let _capture = logs.capture();
    let long = "r".repeat(501);
    let at_most = "r".repeat(500);
    for query in [
        String::new(),
        "?reason=".to_owned(),
        "?reason=a%0Ab".to_owned(),
        "?reason=tab%09inside".to_owned(),
        format!("?reason={long}"),
    ] {
        for (template, method, path) in [
            (
                RELEASE,
                Method::POST,
                "/v1/admin/keys/tenant-a/lost/release",
            ),
            (FORGET, Method::DELETE, "/v1/admin/keys/tenant-a/done"),
            (
                RECONCILE,
                Method::POST,
                "/v1/admin/keys/tenant-a/lost/reconcile",
            ),
        ] {
            let uri = format!("{path}{query}");
            let answer = call(
                &router,
                template,
                admin_request(method.clone(), &uri, Some(ADMIN_A)),
            )
            .await;
            assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
            assert_eq!(
                answer.header("content-type"),
                Some("application/problem+json")
            );
            assert_eq!(problem_name(&answer), "reason-required", "{uri}");
        }
    }
    // `force` without a reason is no reason either.
    let answer = call(
        &router,
        FORGET,
        admin_request(
            Method::DELETE,
            "/v1/admin/keys/tenant-a/lost?force=true",
            Some(ADMIN_A),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
    for key in ["lost", "done"] {
        assert!(
            store
                .get(names::scope("tenant-a"), names::key(key))
                .await
                .unwrap()
                .is_some(),
            "{key} is still there"
        );
    }
    let lost = call(
        &router,
        SHOW,
        admin_request(Method::GET, "/v1/admin/keys/tenant-a/lost", Some(ADMIN_A)),
    )
    .await
    .json();
    assert_eq!(lost["record"]["needs_decision"], true, "not reconciled");
    assert_eq!(
        decisions(&router, "tenant-a", "lost", ADMIN_A).await,
        Vec::<Value>::new()
    );
    assert_eq!(
        decisions(&router, "tenant-a", "done", ADMIN_A).await,
        Vec::<Value>::new()
    );
    assert!(
        logs.audit()
            .iter()
            .all(|line| line["action"] == "show" || line["action"] == "decisions"),
        "a refused call is no decision: {:?}",
        logs.audit()
    );
    // 500 characters are a reason.
    let answer = call(
        &router,
        RELEASE,
        admin_request(
            Method::POST,
            &format!("/v1/admin/keys/tenant-a/lost/release?reason={at_most}"),
            Some(ADMIN_A),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
}

pub(crate) async fn the_trail_keeps_who_when_why_and_result_after_the_record_is_gone<
    S: Store + Into<AnyStore>,
>(
    db: TestDb<S>,
) {
    use idempotency_guard::store::AdminStore as _;
    use idempotency_guard::store::admin::{PageRequest, StateFilter};
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;
    let store: AnyStore = db.store.clone().into();
    seed(&store, "tenant-a", "lost", Seed::Abandoned).await;
    seed(&store, "tenant-a", "lost-2", Seed::Abandoned).await;
    seed(&store, "tenant-b", "lost-b", Seed::Abandoned).await;
    let router = router(store.clone());
    let post = |path: &str, token: &str| admin_request(Method::POST, path, Some(token));
    let before = OffsetDateTime::now_utc();

    // Alice marks it reconciled, then releases it: the record is gone.
    let marked = call(
        &router,
        RECONCILE,
        post(
            "/v1/admin/keys/tenant-a/lost/reconcile?reason=refund%20%23412%20%3Cb%3Eissued%3C%2Fb%3E",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(marked.status, StatusCode::OK, "{}", marked.json());
    let released = call(
        &router,
        RELEASE,
        post(
            "/v1/admin/keys/tenant-a/lost/release?reason=ledger%20shows%20no%20debit%3B%20retry%20may%20run",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.json());
    assert!(
        store
            .get(names::scope("tenant-a"), names::key("lost"))
            .await
            .unwrap()
            .is_none(),
        "released: the record is gone"
    );
    // A refused one: released again, there is nothing to release.
    let again = call(
        &router,
        RELEASE,
        post(
            "/v1/admin/keys/tenant-a/lost/release?reason=twice",
            ADMIN_ALL,
        ),
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    let after = OffsetDateTime::now_utc();

    // Read back by a fresh service over the same store: kept with the
    // store, not in the service.
    let restarted = crate::support::router(store.clone());
    let trail = decisions(&restarted, "tenant-a", "lost", ADMIN_A).await;
    let summary: Vec<(String, String, String, String)> = trail
        .iter()
        .map(|d| {
            let text = |name: &str| d[name].as_str().unwrap().to_owned();
            (text("who"), text("action"), text("reason"), text("result"))
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "alice".to_owned(),
                "reconcile".to_owned(),
                "refund #412 <b>issued</b>".to_owned(),
                "reconciled".to_owned()
            ),
            (
                "alice".to_owned(),
                "release".to_owned(),
                "ledger shows no debit; retry may run".to_owned(),
                "deleted-abandoned".to_owned()
            ),
            (
                "ops".to_owned(),
                "release".to_owned(),
                "twice".to_owned(),
                "not-found".to_owned()
            ),
        ]
    );
    let mut previous = before - time::Duration::seconds(1);
    for decision in &trail {
        assert_eq!(decision["scope"], "tenant-a");
        assert_eq!(decision["key"], "lost");
        let at = OffsetDateTime::parse(decision["at"].as_str().unwrap(), &Rfc3339).unwrap();
        assert!(
            at >= previous && at <= after + time::Duration::seconds(1),
            "{decision}"
        );
        previous = at;
        let expires =
            OffsetDateTime::parse(decision["expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
        assert!(
            expires - at >= time::Duration::days(399),
            "kept long past the record's retention (an hour): {decision}"
        );
    }
    // Another key's trail is its own.
    assert_eq!(
        decisions(&restarted, "tenant-a", "lost-2", ADMIN_A).await,
        Vec::<Value>::new()
    );

    // A refused decision on another tenant is kept in that tenant's trail,
    // which alice may not read.
    let forbidden = call(
        &router,
        RELEASE,
        post(
            "/v1/admin/keys/tenant-b/lost-b/release?reason=oops",
            ADMIN_A,
        ),
    )
    .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let read = call(
        &router,
        DECISIONS,
        admin_request(
            Method::GET,
            "/v1/admin/keys/tenant-b/lost-b/decisions",
            Some(ADMIN_A),
        ),
    )
    .await;
    assert_eq!(read.status, StatusCode::FORBIDDEN);
    let trail_b = decisions(&router, "tenant-b", "lost-b", ADMIN_ALL).await;
    assert_eq!(trail_b.len(), 1, "{trail_b:?}");
    assert_eq!(trail_b[0]["who"], "alice");
    assert_eq!(trail_b[0]["result"], "forbidden");
    assert!(
        store
            .get(names::scope("tenant-b"), names::key("lost-b"))
            .await
            .unwrap()
            .is_some()
    );

    // The entries are records of the tenant's trail scope, in the store;
    // no admin action changes them.
    let page = store
        .list(
            "idempotency.audit:tenant-a",
            StateFilter::Any,
            PageRequest {
                after: None,
                limit: 100,
            },
        )
        .await
        .unwrap();
    assert_eq!(page.records.len(), 3, "{:?}", page.records);
    assert!(page.records.iter().all(|r| r.method == "AUDIT"));
    let entry = page.records[0].key.as_str().to_owned();
    let answer = call(
        &router,
        FORGET,
        admin_request(
            Method::DELETE,
            &format!("/v1/admin/keys/idempotency.audit%3Atenant-a/{entry}?{REASON}"),
            Some(ADMIN_ALL),
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.json());
    assert_eq!(
        decisions(&router, "tenant-a", "lost", ADMIN_ALL)
            .await
            .len(),
        3,
        "the trail is whole"
    );
}
