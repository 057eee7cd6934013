//! Odd requests to the service: bad input is a 400 before the store is
//! asked, and a wrong method is a problem, not an empty body.

use axum::body::Body;
use http::{Method, Request};
use idempotency_guard::store::AnyStore;

use crate::support::{ADMIN_ALL, router};

fn admin(method: Method, path: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {ADMIN_ALL}"))
        .body(Body::empty())
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_an_admin_scope_or_cursor_is_a_bad_request_on_postgres() {
    let db = idempotency_tests::postgres().await;
    let app = router(AnyStore::from(db.store.clone()));
    for path in [
        "/v1/admin/keys?scope=a%00b",
        "/v1/admin/keys?scope=tenant-a&after=k%00",
        "/v1/admin/keys/a%00b/key",
    ] {
        let method = if path.contains('?') {
            Method::GET
        } else {
            Method::DELETE
        };
        let answer = idempotency_tests::call(&app, admin(method, path)).await;
        assert_eq!(answer.status.as_u16(), 400, "{path}: {:?}", answer.json());
        assert_eq!(answer.problem(), "bad-request", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_a_405_problem_before_any_token_check() {
    let db = idempotency_tests::sqlite().await;
    let app = router(AnyStore::from(db.store.clone()));
    for (method, path) in [
        (Method::PUT, "/v1/admin/keys/a/b"),
        (Method::DELETE, "/v1/keys/k"),
        (Method::POST, "/healthz"),
    ] {
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::empty())
            .expect("a request");
        let answer = idempotency_tests::call(&app, request).await;
        assert_eq!(answer.status.as_u16(), 405, "{method} {path}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json"),
            "{method} {path}"
        );
        assert_eq!(answer.problem(), "method-not-allowed", "{method} {path}");
    }
}

/// The token of the `default` scope in the binary's tests.
const TOKEN: &str = "token-of-the-default-scope-01";

/// Starts the service binary over a fresh SQLite file, with `env`, and its
/// descriptor limit (soft and hard) at `limit` when given, through
/// `sh -c 'ulimit -n'`.
async fn service_binary(
    dir: &tempfile::TempDir,
    limit: Option<u32>,
    env: &[(&str, &str)],
) -> idempotency_tests::Process {
    let script = dir.path().join("service.sh");
    let ulimit = limit.map_or_else(String::new, |limit| {
        format!("ulimit -n {limit} || exit 1\n")
    });
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{ulimit}exec '{}'\n",
            env!("CARGO_BIN_EXE_idempotency-service")
        ),
    )
    .expect("write the wrapper");
    let _ = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status();
    let database = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("service.db").display()
    );
    let tokens = format!("default {TOKEN}");
    let mut all = vec![
        ("DATABASE_URL", database.as_str()),
        ("TOKENS", tokens.as_str()),
        ("PURGE_INTERVAL_SECS", "0"),
    ];
    all.extend_from_slice(env);
    idempotency_tests::Process::start(script.to_str().expect("a UTF-8 path"), &all, "/healthz")
        .await
}

/// `GET /v1/keys/{key}` with the token, over a fresh connection.
async fn ask(to: std::net::SocketAddr, key: &str) -> idempotency_tests::raw_http::RawAnswer {
    let head =
        format!("GET /v1/keys/{key} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {TOKEN}");
    idempotency_tests::raw_http::send(to, head.as_bytes(), b"", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_starve_a_client_under_a_low_descriptor_limit() {
    use idempotency_tests::raw_http::{closed_within, slow_head};
    use std::time::Duration;
    use tokio::net::TcpStream;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let service = service_binary(
        &dir,
        Some(256),
        &[("HEADER_READ_SECS", "2"), ("IDLE_SECS", "3")],
    )
    .await;
    let to = service.address;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(to).await.expect("connect"));
    }
    let mut slow = Vec::new();
    for _ in 0..50 {
        slow.push(slow_head(to).await);
    }
    // A normal client is answered promptly (a functional deadline: without
    // the cap the descriptors were gone and it got no answer in 10 s).
    let answer = tokio::time::timeout(Duration::from_secs(1), ask(to, "normal-client"))
        .await
        .expect("a normal client is answered within 1 s");
    assert_eq!(answer.status, 404);
    assert_eq!(answer.problem().as_deref(), Some("key-not-found"));

    // Every idle and slow connection is closed: the oldest at once (the
    // cap), the rest after their deadline (3 s idle, 2 s for a head).
    let idle = idle
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, Duration::from_secs(15))));
    let slow = slow
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, Duration::from_secs(15))));
    let (mut open_idle, mut open_slow) = (0, 0);
    for close in idle.collect::<Vec<_>>() {
        open_idle += usize::from(!close.await.expect("joined"));
    }
    for close in slow.collect::<Vec<_>>() {
        open_slow += usize::from(!close.await.expect("joined"));
    }
    assert_eq!(
        (open_idle, open_slow),
        (0, 0),
        "idle and slow connections left open"
    );
    // Under the cap, too, each is closed by its own deadline.
    let idle = TcpStream::connect(to).await.expect("connect");
    let slow = slow_head(to).await;
    assert!(
        closed_within(idle, Duration::from_secs(15)).await,
        "an idle connection is closed"
    );
    assert!(
        closed_within(slow, Duration::from_secs(15)).await,
        "a slow head is closed"
    );
    assert_eq!(
        ask(to, "after").await.status,
        404,
        "the service still serves"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_a_408_and_oversized_heads_are_414_and_431_problems() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let service = service_binary(&dir, None, &[("BODY_SECS", "1")]).await;
    let to = service.address;
    // 10 of the 40 bytes announced, then nothing: the deadline ends it.
    let head = format!(
        "POST /v1/keys/lookup HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: 40"
    );
    let answer =
        idempotency_tests::raw_http::send(to, head.as_bytes(), br#"{"keys": "#, false).await;
    assert_eq!(answer.status, 408);
    assert_eq!(answer.problem().as_deref(), Some("body-timeout"));
    assert_eq!(answer.header("connection"), Some("close"));
    idempotency_tests::raw_http::assert_default_head_bounds(to, "/healthz").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_service_with_idle_and_slow_connections_open() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut service = service_binary(&dir, None, &[]).await;
    let to = service.address;
    // An idle connection, a keep-alive one after its answer, a slow head.
    let _idle = tokio::net::TcpStream::connect(to).await.expect("connect");
    let _slow = idempotency_tests::raw_http::slow_head(to).await;
    assert_eq!(ask(to, "before").await.status, 404);
    let pid = service.pid().expect("a pid").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(signalled.success());
    // The slow head is cut by the 10 s header-read deadline at the latest.
    let status = tokio::time::timeout(Duration::from_secs(15), service.wait())
        .await
        .expect("the service exits after SIGTERM");
    assert!(status.success(), "the service exited with {status}");
}
