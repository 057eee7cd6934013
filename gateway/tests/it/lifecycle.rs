//! Graceful shutdown drains guarded runs whose clients left; HTTP/2 to the
//! upstream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::{get, post};

use crate::support::{pay, stack, start_gateway};

/// Whether the process `pid` still runs (a zombie has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|status| {
            !status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_guarded_run_whose_client_left_and_stores_its_answer() {
    let stack = stack("[[routes]]\npath = \"/slow\"\n", &[]).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .expect("an HTTP client");
    let sent = pay(&impatient, &stack.url("/slow?seconds=2"), "drain-1", "{}")
        .send()
        .await;
    assert!(
        sent.is_err(),
        "the client gave up before the backend answered"
    );
    assert_eq!(
        stack.executions("/slow").await,
        1,
        "the backend has the request"
    );

    let pid = stack.gateway.pid().expect("the gateway's pid");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let mut waited = 0;
    while running(pid) && waited < 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(!running(pid), "the gateway exits once drained");
    assert!(
        waited >= 5,
        "it waited for the backend's answer ({waited} ticks)"
    );
    assert_eq!(
        stack.advice("drain-1").await,
        (200, "replay".to_owned()),
        "the run's answer was stored before the gateway exited"
    );
}

/// An HTTP/2-only (h2c) upstream that says which version it got.
async fn h2_upstream(executions: Arc<AtomicU64>) -> SocketAddr {
    let app = Router::new()
        .route(
            "/payments",
            post(move |request: Request| async move {
                executions.fetch_add(1, Ordering::SeqCst);
                (
                    http::StatusCode::CREATED,
                    format!("{:?}", request.version()),
                )
            }),
        )
        .route(
            "/version",
            get(|request: Request| async move { format!("{:?}", request.version()) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_to_the_upstream_carries_guarded_and_unguarded_requests() {
    let executions = Arc::new(AtomicU64::new(0));
    let upstream = h2_upstream(Arc::clone(&executions)).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let config = "[[routes]]\npath = \"/payments\"\n[proxy]\nhttp2 = true\n";
    let gateway = start_gateway(&dir, upstream, &store_url, config, &[]).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", gateway.address);
    for replayed in [false, true] {
        let answer = pay(&http, &format!("{base}/payments"), "h2-1", "{}")
            .send()
            .await
            .expect("an answer");
        assert_eq!(answer.status(), 201);
        assert_eq!(
            answer.headers().contains_key("idempotent-replayed"),
            replayed
        );
        assert_eq!(answer.text().await.expect("a body"), "HTTP/2.0");
    }
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    let version = http
        .get(format!("{base}/version"))
        .send()
        .await
        .expect("an answer")
        .text()
        .await
        .expect("a body");
    assert_eq!(version, "HTTP/2.0");
}
