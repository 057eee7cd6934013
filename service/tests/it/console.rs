//! The operators' console: off unless configured, served with its
//! Content-Security-Policy, and driven for real in headless Chromium
//! (Debian's, through `playwright-core`; `scripts/console-browser`
//! installs both) against the real service binary.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use idempotency_guard::store::{AnyStore, StoreOptions};
use idempotency_guard::{IdempotencyLayer, Store as _};
use idempotency_tests::names;
use serde_json::Value;

use crate::support::{Seed, get, seed};

const BINARY: &str = env!("CARGO_BIN_EXE_idempotency-service");

const ADMIN_A: &str = "console-admin-of-tenant-a-0123456789";
const ADMIN_B: &str = "console-admin-of-tenant-b-0123456789";
const KEY: &str = "debit-7f3a91";
const XSS_KEY: &str = "<script>window.__pwned=1</script>";
const REASON: &str = "checked the ledger: debit 7f3a91 never posted, the retry may run";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_off_unless_configured_and_served_with_its_policy() {
    let db = idempotency_tests::sqlite().await;
    let store = AnyStore::from(db.store.clone());
    let off = idempotency_service::build_router(idempotency_service::AppState {
        store: store.clone(),
        tokens: Arc::new(crate::support::tokens()),
        metrics: None,
        retry_after: Duration::from_secs(1),
        admin_tokens: Arc::new(crate::support::admin_tokens()),
        reconciled: Arc::new(idempotency_service::Reconciled::in_memory()),
        console: false,
        console_sessions: Arc::new(idempotency_service::ConsoleSessions::default()),
    });
    for path in ["/console", "/console/console.js"] {
        let answer = idempotency_tests::call(&off, get(path, None)).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path} while off");
    }
    let on = crate::support::router(store);
    for (path, content_type) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/console.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
    ] {
        let answer = idempotency_tests::call(&on, get(path, None)).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert_eq!(answer.header("content-type"), Some(content_type));
        let policy = answer.header("content-security-policy").unwrap();
        assert!(
            policy.contains("default-src 'none'") && policy.contains("script-src 'self'"),
            "{policy}"
        );
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(answer.header("x-frame-options"), Some("DENY"));
    }
    let page = idempotency_tests::call(&on, get("/console", None)).await;
    let html = String::from_utf8_lossy(&page.body);
    let inline_handler = html.match_indices(" on").any(|(at, _)| {
        let rest = &html[at + 3..];
        let name = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_lowercase())
                .len();
        name > 0 && rest[name..].starts_with('=')
    });
    assert!(
        !html.contains("<script>") && !inline_handler,
        "no inline script or handler: the policy would block it"
    );
    let script = idempotency_tests::call(&on, get("/console/console.js", None)).await;
    let script = String::from_utf8_lossy(&script.body);
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!script.contains(sink), "the console never uses {sink}");
    }
}

/// A request to the admin API with these headers.
fn with_headers(method: http::Method, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::empty()).unwrap()
}

/// Signing in exchanges the admin token for a session cookie the admin
/// API takes instead of it; its writes need the console's `Origin`;
/// signing out ends it on the server; scripts' bearer tokens work as
/// before.
#[tokio::test]
async fn a_console_session_is_a_cookie_the_server_can_end() {
    use crate::support::{ADMIN_ALL, call};
    use http::Method;
    let db = idempotency_tests::sqlite().await;
    let store = AnyStore::from(db.store.clone());
    seed(&store, "tenant-a", "pay-1", Seed::Abandoned).await;
    let router = crate::support::router(store.clone());
    let bearer = format!("Bearer {ADMIN_ALL}");
    const HOST: &str = "ops.example.com:8080";
    const ORIGIN: &str = "http://ops.example.com:8080";

    let signed_in = call(
        &router,
        "/v1/admin/session",
        with_headers(
            Method::POST,
            "/v1/admin/session",
            &[
                ("authorization", &bearer),
                ("host", HOST),
                ("origin", ORIGIN),
            ],
        ),
    )
    .await;
    assert_eq!(signed_in.status, StatusCode::OK);
    assert_eq!(signed_in.json()["name"], "ops");
    let set_cookie = signed_in.header("set-cookie").unwrap().to_owned();
    let (pair, attributes) = set_cookie.split_once(';').unwrap();
    assert_eq!(
        attributes.trim(),
        "Path=/v1/admin; HttpOnly; SameSite=Strict",
        "no Secure over plain HTTP"
    );
    let (name, id) = pair.split_once('=').unwrap();
    assert_eq!(name, "idempotency-console");
    assert_eq!(id.len(), 64);
    assert!(!set_cookie.contains(ADMIN_ALL));
    let cookie = pair.to_owned();

    // Reads with the cookie alone.
    let whoami = call(
        &router,
        "/v1/admin/whoami",
        with_headers(Method::GET, "/v1/admin/whoami", &[("cookie", &cookie)]),
    )
    .await;
    assert_eq!(whoami.status, StatusCode::OK);
    assert_eq!(whoami.json()["name"], "ops");

    // Writes need the console's origin: a foreign or missing one is
    // refused before anything is done.
    let release = "/v1/admin/keys/tenant-a/pay-1/release?reason=checked%20the%20ledger";
    for origin in [Some("http://evil.example"), Some("null"), None] {
        let mut headers = vec![("cookie", cookie.as_str()), ("host", HOST)];
        if let Some(origin) = origin {
            headers.push(("origin", origin));
        }
        let refused = call(
            &router,
            "/v1/admin/keys/{scope}/{key}/release",
            with_headers(Method::POST, release, &headers),
        )
        .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{origin:?}");
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(refused.json()["type"], "urn:idempotency:origin-refused");
    }
    assert!(
        store
            .get(names::scope("tenant-a"), names::key("pay-1"))
            .await
            .unwrap()
            .is_some(),
        "nothing was released"
    );
    let released = call(
        &router,
        "/v1/admin/keys/{scope}/{key}/release",
        with_headers(
            Method::POST,
            release,
            &[("cookie", &cookie), ("host", HOST), ("origin", ORIGIN)],
        ),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "the console's own origin");

    // A session does not sign in again: that takes the token.
    let again = call(
        &router,
        "/v1/admin/session",
        with_headers(
            Method::POST,
            "/v1/admin/session",
            &[("cookie", &cookie), ("host", HOST), ("origin", ORIGIN)],
        ),
    )
    .await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);

    // Signing out ends the session on the server.
    let out = idempotency_tests::call(
        &router,
        with_headers(
            Method::DELETE,
            "/v1/admin/session",
            &[("cookie", &cookie), ("host", HOST), ("origin", ORIGIN)],
        ),
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert!(
        out.header("set-cookie")
            .unwrap()
            .starts_with("idempotency-console=; ")
            && out.header("set-cookie").unwrap().contains("Max-Age=0")
    );
    let replayed = call(
        &router,
        "/v1/admin/whoami",
        with_headers(Method::GET, "/v1/admin/whoami", &[("cookie", &cookie)]),
    )
    .await;
    assert_eq!(
        replayed.status,
        StatusCode::UNAUTHORIZED,
        "the old cookie is refused"
    );
    assert_eq!(
        replayed.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        replayed.json()["detail"]
            .as_str()
            .unwrap()
            .contains("session ended")
    );

    // Served over TLS (the page's origin is https), the cookie is Secure.
    let tls = call(
        &router,
        "/v1/admin/session",
        with_headers(
            Method::POST,
            "/v1/admin/session",
            &[
                ("authorization", &bearer),
                ("origin", "https://ops.example.com"),
            ],
        ),
    )
    .await;
    assert!(
        tls.header("set-cookie").unwrap().ends_with("; Secure"),
        "{:?}",
        tls.header("set-cookie")
    );

    // Scripts: a bearer token writes without an Origin, as before.
    seed(&store, "tenant-a", "pay-2", Seed::Abandoned).await;
    let scripted = call(
        &router,
        "/v1/admin/keys/{scope}/{key}/release",
        with_headers(
            Method::POST,
            "/v1/admin/keys/tenant-a/pay-2/release?reason=scripted",
            &[("authorization", &bearer)],
        ),
    )
    .await;
    assert_eq!(scripted.status, StatusCode::OK);

    // A session unused past its idle time ends on the server too.
    let brief = idempotency_service::build_router(idempotency_service::AppState {
        store: store.clone(),
        tokens: Arc::new(crate::support::tokens()),
        metrics: None,
        retry_after: Duration::from_secs(1),
        admin_tokens: Arc::new(crate::support::admin_tokens()),
        reconciled: Arc::new(idempotency_service::Reconciled::in_memory()),
        console: true,
        console_sessions: Arc::new(idempotency_service::ConsoleSessions::new(
            idempotency_service::SessionSettings {
                idle: Duration::from_secs(1),
                ..Default::default()
            },
        )),
    });
    let signed_in = call(
        &brief,
        "/v1/admin/session",
        with_headers(
            Method::POST,
            "/v1/admin/session",
            &[("authorization", &bearer)],
        ),
    )
    .await;
    let cookie = signed_in
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let whoami = || with_headers(Method::GET, "/v1/admin/whoami", &[("cookie", &cookie)]);
    assert_eq!(
        call(&brief, "/v1/admin/whoami", whoami()).await.status,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let expired = call(&brief, "/v1/admin/whoami", whoami()).await;
    assert_eq!(
        expired.status,
        StatusCode::UNAUTHORIZED,
        "idle past its 1 s"
    );
    assert_eq!(
        expired.header("content-type"),
        Some("application/problem+json")
    );

    // With the console off there is no sign-in, and no cookie counts.
    let off = idempotency_service::build_router(idempotency_service::AppState {
        store: store.clone(),
        tokens: Arc::new(crate::support::tokens()),
        metrics: None,
        retry_after: Duration::from_secs(1),
        admin_tokens: Arc::new(crate::support::admin_tokens()),
        reconciled: Arc::new(idempotency_service::Reconciled::in_memory()),
        console: false,
        console_sessions: Arc::new(idempotency_service::ConsoleSessions::default()),
    });
    let no_sign_in = idempotency_tests::call(
        &off,
        with_headers(
            Method::POST,
            "/v1/admin/session",
            &[("authorization", &bearer)],
        ),
    )
    .await;
    assert_eq!(no_sign_in.status, StatusCode::NOT_FOUND);
}

/// The status code and body of a `GET` over a raw connection.
async fn http_get(address: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    Some((status, text))
}

/// Stores a completed debit whose answer holds a card number and a cookie.
async fn complete_with_a_card(store: &AnyStore, key: &str) {
    use idempotency_guard::StoredResponse;
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
    let new = NewRecord {
        scope: names::scope("default"),
        key: names::key(key),
        fingerprint: &crate::support::FP,
        method: "POST",
        path: "/debits",
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("location", "/debits/dbt_0003".parse().unwrap());
    headers.insert("set-cookie", "session=cookie-value-0123".parse().unwrap());
    let body = r#"{"id":"dbt_0003","amount":4200,"currency":"EUR","card":{"number":"4111111111111111"},"note":"paid from DE89370400440532013000","status":"<b>posted</b>"}"#;
    let response = StoredResponse {
        status: StatusCode::CREATED,
        headers,
        body: Some(bytes::Bytes::from_static(body.as_bytes())),
    };
    store.complete(&lease, &response).await.unwrap();
}

/// Leaves `key` of `scope` abandoned after a `POST` to `path`.
async fn abandon(store: &AnyStore, scope: &str, key: &str, path: &str) {
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
    let new = NewRecord {
        scope: names::scope(scope),
        key: names::key(key),
        fingerprint: &crate::support::FP,
        method: "POST",
        path,
        token: LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    store.renew(&lease, Duration::ZERO).await.unwrap();
}

/// The key a completer will finish, in the console's list.
const RESUMING_KEY: &str = "debit-resuming";

/// Leaves `key` of `scope` abandoned with two recorded steps and its
/// request kept for the completer (one attempt made): a key that will
/// complete. `false` on a store that keeps no steps (NATS, for now).
async fn seed_resumable(store: &AnyStore, scope: &str, key: &str) -> bool {
    use idempotency_guard::store::StoreError;
    use idempotency_guard::{Step, StoredRequest};
    let lease = seed(store, scope, key, Seed::InFlight).await;
    let steps: Vec<Step> = ["reserve", "charge"]
        .into_iter()
        .map(|name| Step {
            name: name.into(),
            input: None,
            value: serde_json::json!(1),
        })
        .collect();
    match store.record_steps(&lease, &steps).await {
        Ok(()) => {}
        Err(StoreError::Unsupported(_)) => {
            store.release(&lease).await.unwrap();
            return false;
        }
        Err(error) => panic!("{error}"),
    }
    let mut request = StoredRequest::new("POST", "/debits", http::HeaderMap::new(), "{}");
    request.attempts = 1;
    store.record_request(&lease, Some(&request)).await.unwrap();
    store.renew(&lease, Duration::ZERO).await.unwrap();
    true
}

/// A scope whose records on [`SCAN_PATH`] come after 600 others: more
/// than one listing request of the console's page (50) reads (500).
const SCAN_SCOPE: &str = "tenant-scan";
/// The route the console filters by in [`SCAN_SCOPE`].
const SCAN_PATH: &str = "/payments";

/// The audit lines (JSON logs) the service wrote to `log`.
fn audit_lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == idempotency_service::AUDIT_TARGET)
        .map(|line| line["fields"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_releases_an_abandoned_key_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let database_url = format!("sqlite://{}?mode=rwc", dir.path().join("s.db").display());
    let store = AnyStore::open(&StoreOptions::sql(&database_url))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    releases_in_a_browser(store, &[("DATABASE_URL", database_url.as_str())]).await;
}

/// The same on NATS JetStream (`STORE=nats`): the listing, release,
/// reconcile and forget the console drives go through the NATS store's
/// admin operations, on a fresh bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_releases_an_abandoned_key_in_a_real_browser_on_nats() {
    let nats = idempotency_tests::nats().await;
    let url = tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
        .await
        .unwrap();
    releases_in_a_browser(
        AnyStore::from(nats.store.clone()),
        &[
            ("STORE", "nats"),
            ("NATS_URL", url.as_str()),
            ("NATS_BUCKET", nats.store.bucket()),
        ],
    )
    .await;
}

/// Seeds `store`, starts the service binary on it (`store_env` says
/// which store), and drives the console in a browser.
async fn releases_in_a_browser(store: AnyStore, store_env: &[(&str, &str)]) {
    let tests = idempotency_tests::console_browser::dir();
    let dir = tempfile::tempdir().unwrap();

    // The app: a guarded create-debit endpoint over the same store.
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/debits",
            post(move || {
                let counter = counter.clone();
                async move {
                    let run = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("{{\"run\":{run}}}"))
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()));
    let debit = || {
        Request::post("/debits")
            .header("idempotency-key", KEY)
            .header("content-type", "application/json")
            .body(Body::from(r#"{"amount":4200}"#))
            .unwrap()
    };
    // A scope where a filter's matches come late (seeded first: the
    // in-flight key below must still be in flight when the browser looks).
    for n in 0..600 {
        abandon(&store, SCAN_SCOPE, &format!("a-{n:04}"), "/refunds").await;
    }
    for n in 0..10 {
        abandon(&store, SCAN_SCOPE, &format!("z-{n:04}"), SCAN_PATH).await;
    }
    // What an incident leaves: a debit whose run lost its lease (outcome
    // unknown), a key holding markup, completed ones; and another
    // tenant's abandoned key.
    seed(&store, "default", KEY, Seed::Abandoned).await;
    seed(&store, "default", XSS_KEY, Seed::Abandoned).await;
    seed(&store, "default", "debit-0001", Seed::Completed).await;
    seed(&store, "default", "debit-0002", Seed::InFlight).await;
    seed(&store, "tenant-b", "debit-b-0001", Seed::Abandoned).await;
    complete_with_a_card(&store, "debit-0003").await;
    // A debit the completer will finish (where the store keeps steps).
    let resuming = seed_resumable(&store, "default", RESUMING_KEY).await;
    let before = idempotency_tests::call(&app, debit()).await;
    assert_eq!(
        before.status,
        StatusCode::CONFLICT,
        "an abandoned key refuses the retry: {}",
        String::from_utf8_lossy(&before.body)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The real service, console on, logging JSON to a file.
    let address = idempotency_tests::process::free_address();
    let log = dir.path().join("service.log");
    let reconciled = dir.path().join("reconciled.jsonl");
    let mut service = tokio::process::Command::new(BINARY)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(store_env.iter().copied())
        .env("LISTEN", address.to_string())
        .env("TOKENS", "default scope-token-of-default-0123456789")
        .env(
            "ADMIN_TOKENS",
            format!("ops default,{SCAN_SCOPE} {ADMIN_A};bob tenant-b {ADMIN_B}"),
        )
        .env("CONSOLE", "true")
        .env("RECONCILED_FILE", &reconciled)
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut ready = false;
    for _ in 0..300 {
        if let Ok(Some(status)) = service.try_wait() {
            panic!(
                "the service exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if http_get(address, "/healthz").await.map(|(s, _)| s) == Some(200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the service did not answer /healthz within 30 s");

    // The browser.
    let mut node = tokio::process::Command::new("node");
    node.arg("console.mjs")
        .current_dir(&tests)
        .env("BASE_URL", format!("http://{address}"))
        .env("TOKEN_A", ADMIN_A)
        .env("TOKEN_B", ADMIN_B)
        .env("SCOPE", "default")
        .env("KEY", KEY)
        .env("XSS_KEY", XSS_KEY)
        .env("REASON", REASON)
        .env("SCAN_SCOPE", SCAN_SCOPE)
        .env("SCAN_PATH", SCAN_PATH)
        .env("RESUMING_KEY", if resuming { RESUMING_KEY } else { "" })
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .kill_on_drop(true);
    if let Ok(shots) = std::env::var("CONSOLE_SCREENSHOTS") {
        node.env("SCREENSHOTS", shots);
    }
    let output = tokio::time::timeout(Duration::from_secs(180), node.output())
        .await
        .expect("the browser script finished within 3 minutes")
        .expect("node runs (install Node.js)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser script failed: {}\n{stdout}\nservice log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("one JSON line: {stdout}"));
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .unwrap_or_else(|| panic!("an array: {value}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };

    // Signed in: the keys that need a decision first, the rest apart.
    assert!(
        seen["csp"]
            .as_str()
            .unwrap_or("")
            .contains("default-src 'none'"),
        "{seen}"
    );
    assert_eq!(seen["scope"], "default");
    assert_eq!(strings(&seen["needsBefore"]), [XSS_KEY, KEY]);
    let mut rest = vec!["debit-0001", "debit-0002", "debit-0003"];
    if resuming {
        rest.push(RESUMING_KEY);
    }
    assert_eq!(strings(&seen["restBefore"]), rest);
    // A key that will complete: not among those needing a decision, its
    // badge says so, its page shows its steps; it may still be released.
    if resuming {
        let page = &seen["resuming"];
        assert_eq!(page["listBadge"], "will complete", "{page}");
        assert!(
            page["badge"].as_str().unwrap().starts_with("will complete"),
            "{page}"
        );
        assert_eq!(strings(&page["steps"]), ["reserve", "charge"], "{page}");
        assert!(
            page["request"]
                .as_str()
                .unwrap()
                .contains("1 attempt so far"),
            "{page}"
        );
        assert_eq!(
            (
                &page["releaseEnabled"],
                &page["reconcileEnabled"],
                &page["giveUpEnabled"]
            ),
            (&Value::Bool(true), &Value::Bool(false), &Value::Bool(true)),
            "{page}"
        );
    }
    // The key holding markup rendered as text, and ran nothing.
    assert_eq!(seen["xssRendered"], true, "{seen}");
    assert_eq!(seen["injectedElements"], 0);
    assert_eq!(seen["pwned"], Value::Null);
    assert_eq!(seen["pwnedAfter"], Value::Null);
    assert_eq!(seen["xssKeyPage"], XSS_KEY);
    assert_eq!(seen["dialogs"], serde_json::json!([]));
    assert_eq!(seen["pageErrors"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["cspViolations"], serde_json::json!([]), "{seen}");

    // The key's page: its life and its request.
    let key_page = &seen["keyPage"];
    assert_eq!(key_page["key"], KEY);
    // An abandoned key no completer finishes: nothing to give up.
    assert_eq!(key_page["giveUpEnabled"], false, "{key_page}");
    let life = strings(&key_page["life"]);
    assert!(life[0].starts_with("claimed"), "{life:?}");
    assert!(
        life.iter().any(|s| s.starts_with("lease expired")),
        "{life:?}"
    );
    let request = key_page["request"].as_str().unwrap();
    assert!(
        request.contains("POST")
            && request.contains("/payments?x=1")
            && request.contains("sha256:"),
        "{request}"
    );
    assert!(
        key_page["badge"]
            .as_str()
            .unwrap()
            .contains("Outcome unknown")
    );
    assert_eq!(key_page["releaseEnabled"], true);
    assert!(
        seen["noReason"].as_str().unwrap().contains("reason"),
        "{seen}"
    );
    assert!(seen["released"].as_str().unwrap().contains("Released"));
    // The key's page lists the release among its decisions, as text.
    let trail = &seen["trailAfterRelease"];
    let rows = trail["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{trail}");
    let cells = strings(&rows[0]);
    assert!(cells[0].ends_with("UTC"), "when: {cells:?}");
    assert_eq!(
        cells[1..],
        ["ops", "release", REASON, "deleted-abandoned"],
        "who, what, why, result"
    );
    assert_eq!(trail["elements"], 0, "{trail}");
    assert_eq!(strings(&seen["needsAfter"]), [XSS_KEY]);

    // A completed debit's page: its stored answer, redacted.
    let answer = &seen["answerPage"];
    let body = answer["body"].as_str().unwrap();
    assert!(body.contains("dbt_0003") && body.contains("4200"), "{body}");
    assert!(body.contains("\"card\": \"[redacted]\""), "{body}");
    assert!(
        body.contains("3000") && !body.contains("89370400440532013000"),
        "{body}"
    );
    assert!(
        body.contains("<b>posted</b>"),
        "markup in a body is text: {body}"
    );
    assert_eq!(answer["bold"], 0, "no element made of the body");
    let headers = answer["headers"].as_str().unwrap();
    assert!(
        headers.contains("location") && headers.contains("/debits/dbt_0003"),
        "{headers}"
    );
    assert!(
        headers.contains("set-cookie") && !headers.contains("cookie-value-0123"),
        "{headers}"
    );
    assert!(answer["response"].as_str().unwrap().contains("201"));

    // Finance's CSV: what still needs a decision.
    let csv = seen["csv"].as_str().unwrap();
    assert!(csv.starts_with("scope,key,state,needs_decision"), "{csv}");
    assert!(csv.contains(&format!("\"{XSS_KEY}\"")), "{csv}");
    assert!(!csv.contains(KEY), "released: no longer in the list: {csv}");

    // Marked reconciled: kept, listed with the rest; a completed key forgotten.
    assert!(
        seen["reconciledBadge"]
            .as_str()
            .unwrap()
            .contains("Reconciled by ops"),
        "{seen}"
    );
    assert!(
        strings(&seen["reconciledLife"])
            .iter()
            .any(|s| s.starts_with("reconciled")),
        "{seen}"
    );
    assert!(
        seen["needsReconciled"]
            .as_str()
            .unwrap()
            .contains("Nothing needs a decision"),
        "{seen}"
    );
    let mut rest = vec![XSS_KEY, "debit-0001", "debit-0002", "debit-0003"];
    if resuming {
        rest.push(RESUMING_KEY);
    }
    assert_eq!(strings(&seen["restReconciled"]), rest);
    assert!(
        seen["forgot"]
            .as_str()
            .unwrap()
            .contains("Forgot debit-0001")
    );
    assert!(
        store
            .get(names::scope("default"), names::key(XSS_KEY))
            .await
            .unwrap()
            .is_some(),
        "reconciled: kept"
    );
    assert!(
        store
            .get(names::scope("default"), names::key("debit-0001"))
            .await
            .unwrap()
            .is_none(),
        "forgotten"
    );
    let marks = std::fs::read_to_string(&reconciled).unwrap();
    assert!(
        marks.contains("customer confirmed one debit") && marks.contains("\"by\":\"ops\""),
        "the mark is kept in RECONCILED_FILE: {marks}"
    );

    // Signed in, the page holds no token: the session is an HttpOnly,
    // SameSite=Strict cookie the script cannot read.
    assert_eq!(seen["tokenKept"], 0, "{seen}");
    assert_eq!(seen["storageKeys"], serde_json::json!([]), "{seen}");
    assert_eq!(seen["scriptCookies"], "", "{seen}");
    assert_eq!(
        seen["cookie"],
        serde_json::json!({"httpOnly": true, "sameSite": "Strict", "secure": false, "path": "/v1/admin", "holdsToken": false}),
        "{seen}"
    );
    // Replayed outside the browser, the cookie reads; its writes need the
    // console's Origin (problem+json 403 without it).
    let replay = &seen["replay"];
    assert_eq!(replay["read"]["status"], 200, "{replay}");
    for refused in ["foreign", "noOrigin"] {
        assert_eq!(replay[refused]["status"], 403, "{refused}: {replay}");
        assert_eq!(replay[refused]["type"], "application/problem+json");
        assert!(
            replay[refused]["body"]
                .as_str()
                .unwrap()
                .contains("urn:idempotency:origin-refused"),
            "{replay}"
        );
    }
    assert_eq!(
        replay["sameOrigin"]["status"], 404,
        "the console's own Origin passes (the key does not exist): {replay}"
    );
    // Signed out: the server ended the session; the old cookie is refused.
    let signed_out = &seen["signedOut"];
    assert_eq!(signed_out["replay"]["status"], 401, "{signed_out}");
    assert_eq!(
        signed_out["replay"]["type"], "application/problem+json",
        "{signed_out}"
    );
    assert_eq!(signed_out["cookieLeft"], false, "{signed_out}");

    // The filtered list found its matches past 600 other records without
    // a click, showed its progress, and said "nothing" only at the end.
    let scan = &seen["scan"];
    let expected: Vec<String> = (0..10).map(|n| format!("z-{n:04}")).collect();
    assert_eq!(strings(&scan["needs"]), expected, "{scan}");
    assert_eq!(scan["pagerButtons"], 0, "{scan}");
    let needs_drawn = strings(&scan["drawn"]["needs"]);
    assert!(
        needs_drawn
            .iter()
            .all(|text| !text.contains("Nothing needs a decision")),
        "{needs_drawn:?}"
    );
    assert!(
        needs_drawn
            .iter()
            .any(|text| text.contains("Scanning… 500 records read, 0 matches so far")),
        "a progress line while scanning: {needs_drawn:?}"
    );
    let rest_drawn = strings(&scan["drawn"]["rest"]);
    let (last, before) = rest_drawn.split_last().unwrap();
    assert_eq!(last, "No records.", "{rest_drawn:?}");
    assert!(
        before.iter().all(|text| text.starts_with("Scanning…")),
        "only progress before the end: {rest_drawn:?}"
    );
    assert!(
        before.iter().any(|text| text.contains("500 records read")),
        "{rest_drawn:?}"
    );

    // On a phone, no page is wider than the screen.
    let phone = &seen["phone"];
    for page in ["login", "list", "scanList", "keyPage", "answerPage"] {
        let width = phone[page].as_u64().unwrap_or_else(|| panic!("{phone}"));
        assert!(width <= 375, "{page} is {width} px wide at 375: {phone}");
    }
    assert_eq!(phone["stacked"], true, "the key's columns stack: {phone}");

    // tenant-b's admin sees nothing of it.
    let other = &seen["other"];
    assert_eq!(other["scope"], "tenant-b");
    assert_eq!(strings(&other["needs"]), ["debit-b-0001"]);
    assert_eq!(strings(&other["rest"]), Vec::<String>::new());
    assert!(
        other["forcedScope"]
            .as_str()
            .unwrap()
            .contains("may not act on scope"),
        "{other}"
    );
    assert_eq!(strings(&other["forcedRows"]), Vec::<String>::new());
    assert!(
        other["forcedKey"]
            .as_str()
            .unwrap()
            .contains("may not act on scope")
    );
    assert_eq!(other["forcedKeyShown"], "");
    let shown = other["page"].as_str().unwrap();
    assert!(
        !shown.contains(KEY) && !shown.contains("__pwned"),
        "{shown}"
    );

    // The audit line of the release, with who and why.
    let audit = audit_lines(&log);
    let release: Vec<&Value> = audit
        .iter()
        .filter(|line| line["action"] == "release")
        .collect();
    assert_eq!(release.len(), 1, "{audit:?}");
    assert_eq!(release[0]["who"], "ops");
    assert_eq!(release[0]["scope"], "default");
    assert_eq!(release[0]["key"], KEY);
    assert_eq!(release[0]["reason"], REASON);
    assert_eq!(release[0]["result"], "deleted-abandoned");
    for (action, key, reason, result) in [
        (
            "reconcile",
            XSS_KEY,
            "customer confirmed one debit; keep the record",
            "reconciled",
        ),
        (
            "forget",
            "debit-0001",
            "test debit, replay no longer wanted",
            "deleted-completed",
        ),
    ] {
        assert!(
            audit.iter().any(|line| line["action"] == action
                && line["key"] == key
                && line["reason"] == reason
                && line["result"] == result
                && line["who"] == "ops"),
            "the {action} line: {audit:?}"
        );
    }
    assert!(
        audit.iter().any(|line| line["who"] == "bob"
            && line["scope"] == "default"
            && line["result"] == "forbidden"),
        "bob's refused attempts are audited: {audit:?}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log_text.contains(ADMIN_A) && !log_text.contains(ADMIN_B),
        "tokens are never logged"
    );

    // And the client's retry runs, once.
    let retry = idempotency_tests::call(&app, debit()).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(String::from_utf8_lossy(&retry.body), r#"{"run":1}"#);
    let replay = idempotency_tests::call(&app, debit()).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    service.kill().await.unwrap();
}
