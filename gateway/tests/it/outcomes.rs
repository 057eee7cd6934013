//! The upstream's outcomes, each as the crate docs' table says: killed
//! mid-request (abandoned), refusing connections (released), timing out
//! (abandoned), failing with 500 (released).

use std::time::Duration;

use idempotency_tests::process::free_address;

use crate::support::{pay, stack, start_backend, start_gateway};

const SLOW_AND_FAIL: &str = "[[routes]]\npath = \"/slow\"\n[[routes]]\npath = \"/fail\"\n";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

async fn problem_of(answer: reqwest::Response) -> (u16, String) {
    let status = answer.status().as_u16();
    let json: serde_json::Value = answer.json().await.unwrap_or_default();
    (status, json["type"].as_str().unwrap_or("").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_killed_mid_request_abandons_the_key_and_the_status_service_says_reconcile() {
    let mut stack = stack(SLOW_AND_FAIL, &[]).await;
    let http = client();
    let url = stack.url("/slow");
    let first = tokio::spawn({
        let http = http.clone();
        async move { pay(&http, &url, "killed-1", "{}").send().await }
    });
    // Wait until the backend has the request (it recorded the execution).
    for _ in 0..100 {
        if stack.executions("/slow").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        stack.executions("/slow").await,
        1,
        "the backend got the request"
    );
    stack.backend.take().expect("the backend").kill().await;

    let answer = first.await.expect("the task").expect("the gateway answers");
    assert_eq!(
        problem_of(answer).await,
        (502, "urn:idempotency:upstream-failed".to_owned())
    );
    let again = pay(&http, &stack.url("/slow"), "killed-1", "{}")
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        problem_of(again).await,
        (409, "urn:idempotency:outcome-unknown".to_owned())
    );
    assert_eq!(
        stack.advice("killed-1").await,
        (200, "reconcile".to_owned())
    );
    assert_eq!(stack.executions("/slow").await, 1, "nothing ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_refusing_connections_answers_503_and_releases_the_key() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let backend_address = free_address();
    let store_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("gateway.db").display()
    );
    let routes = "[[routes]]\npath = \"/payments\"\n";
    let gateway = start_gateway(&dir, backend_address, &store_url, routes, &[]).await;
    let http = client();
    let base = format!("http://{}", gateway.address);
    let ready = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "not ready without an upstream");
    let body = r#"{"amount":7}"#;
    let answer = pay(&http, &format!("{base}/payments"), "refused-1", body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.headers()["retry-after"], "1");
    assert_eq!(
        problem_of(answer).await,
        (503, "urn:idempotency:upstream-unavailable".to_owned())
    );

    // Released: the status service has no record, and once the backend is
    // up the same key runs.
    let stack_like = crate::support::Stack {
        backend: None,
        backend_address,
        gateway,
        store_url,
        backend_db: dir.path().join("backend.db"),
        _dir: dir,
    };
    assert_eq!(
        stack_like.advice("refused-1").await,
        (404, "retry".to_owned())
    );
    assert!(stack_like.records().await.is_empty(), "nothing stored");
    let backend = start_backend(&stack_like.backend_db, Some(backend_address)).await;
    let ready = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "ready with an upstream");
    let answer = pay(&http, &format!("{base}/payments"), "refused-1", body)
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 201);
    assert!(!answer.headers().contains_key("idempotent-replayed"));
    assert_eq!(stack_like.executions("/payments").await, 1);
    drop(backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_after_sending_abandons_the_key() {
    let routes = format!("{SLOW_AND_FAIL}[proxy]\ntimeout_seconds = 1\n");
    let stack = stack(&routes, &[]).await;
    let http = client();
    let answer = pay(&http, &stack.url("/slow"), "timeout-1", "{}")
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        problem_of(answer).await,
        (504, "urn:idempotency:upstream-timeout".to_owned())
    );
    let again = pay(&http, &stack.url("/slow"), "timeout-1", "{}")
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        problem_of(again).await,
        (409, "urn:idempotency:outcome-unknown".to_owned())
    );
    assert_eq!(
        stack.advice("timeout-1").await,
        (200, "reconcile".to_owned())
    );
    assert_eq!(stack.executions("/slow").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_500_releases_the_key_and_a_retry_runs() {
    let stack = stack(SLOW_AND_FAIL, &[]).await;
    let http = client();
    for _ in 0..2 {
        let answer = pay(&http, &stack.url("/fail"), "fail-1", "{}")
            .send()
            .await
            .expect("an answer");
        assert_eq!(answer.status(), 500);
        assert!(!answer.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(
        stack.executions("/fail").await,
        2,
        "released: the retry ran"
    );
    assert_eq!(stack.advice("fail-1").await, (404, "retry".to_owned()));

    // Both kinds of metrics on /metrics: the guard's and the proxy's.
    let metrics = http
        .get(stack.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("a body");
    assert!(
        metrics.contains(r#"idempotency_requests_total{route="/fail",outcome="released""#),
        "the guard's counters: {metrics}"
    );
    assert!(
        metrics.contains(
            r#"idempotency_gateway_upstream_requests_total{route="/fail",result="answered"} 2"#
        ),
        "the proxy's counters: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_timeout_counts_from_each_request_on_a_pooled_connection() {
    // Unguarded requests on one pooled upstream connection, whose timer
    // is moved at each request and passes its deadline while idle.
    let routes = "[[routes]]\npath = \"/payments\"\n[proxy]\ntimeout_seconds = 1\n";
    let stack = stack(routes, &[]).await;
    let http = client();
    let status = |answer: reqwest::Response| answer.status().as_u16();
    let echo = || http.get(stack.url("/echo")).send();
    assert_eq!(status(echo().await.expect("an answer")), 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status(echo().await.expect("an answer")),
        200,
        "a timer that passed while idle does not fail the next request"
    );
    let slow = |seconds: &str| {
        http.post(stack.url(&format!("/slow?seconds={seconds}")))
            .body("{}")
            .send()
    };
    assert_eq!(status(slow("0.5").await.expect("an answer")), 201);
    let started = std::time::Instant::now();
    let answer = slow("3").await.expect("an answer");
    let elapsed = started.elapsed();
    assert_eq!(
        problem_of(answer).await,
        (504, "urn:idempotency:upstream-timeout".to_owned())
    );
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(2500),
        "timed out after {elapsed:?}"
    );
}
