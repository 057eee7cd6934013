//! The classic incident, once: a payment runs but its response never
//! reaches the client. The client asks the status service, follows its
//! advice, retries with the same key, gets the stored response, and the
//! payment exists once.

use idempotency_tests::programs::{self, Program};
use std::time::Duration;

use idempotency_client::status::{Advice, StatusClient};
use idempotency_tests::Process;
use serde_json::Value;

const TOKEN: &str = "token-of-tenant-acme-0123456789";

async fn lost_response_is_recovered(database_url: &str) {
    let app = Process::start(
        &programs::path(Program::Payments),
        &[("DATABASE_URL", database_url)],
        "/metrics",
    )
    .await;
    let tokens = format!("acme {TOKEN}");
    let env = [
        ("DATABASE_URL", database_url),
        ("TOKENS", tokens.as_str()),
        ("MIGRATE_ON_START", "false"),
    ];
    let service = Process::start(&programs::path(Program::StatusService), &env, "/readyz").await;
    let status = StatusClient::new(format!("http://{}", service.address), TOKEN);
    let http = reqwest::Client::new();
    let payments = format!("http://{}/payments", app.address);
    let send = |timeout: Duration| {
        http.post(&payments)
            .header("content-type", "application/json")
            .header("idempotency-key", "order-lost-1")
            .header("x-tenant", "acme")
            .body(r#"{"amount": 4200, "currency": "EUR", "delay_ms": 600}"#)
            .timeout(timeout)
            .send()
    };

    // The response is lost: the client gives up before it comes back.
    let lost = send(Duration::from_millis(150)).await;
    assert!(
        lost.is_err_and(|e| e.is_timeout()),
        "the first answer never arrives"
    );

    // The client asks before it retries, and follows the advice.
    let mut asked = Vec::new();
    let advice = loop {
        let details = status
            .details("order-lost-1", None)
            .await
            .unwrap()
            .expect("the key has a record");
        asked.push(details.advice);
        match details.advice {
            Advice::Wait => {
                tokio::time::sleep(Duration::from_secs(
                    details.retry_after_seconds.unwrap_or(1),
                ))
                .await
            }
            other => break (other, details),
        }
        assert!(asked.len() < 20, "still running after 20 asks");
    };
    let (advice, details) = advice;
    assert_eq!(advice, Advice::Replay, "it ran: replay with the same key");
    assert_eq!(details.response_status, Some(201));
    assert_eq!(details.path.as_deref(), Some("/payments"));

    // The retry with the same key gets the stored response.
    let retry = send(Duration::from_secs(5)).await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let location = retry.headers()["location"].to_str().unwrap().to_owned();
    let paid: Value = retry.json().await.unwrap();
    assert_eq!(paid["amount"], 4200);

    // The payment exists, once.
    let shown: Value = http
        .get(format!("http://{}{location}", app.address))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown, paid);
    let other_id = paid["id"].as_i64().unwrap() + 1;
    let next = http
        .get(format!("http://{}/payments/{other_id}", app.address))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 404, "no second payment was made");
    drop(service);
    drop(app);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_in_transactional_mode() {
    let database = idempotency_tests::postgres_database().await;
    lost_response_is_recovered(&database.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    lost_response_is_recovered(&url).await;
}
