//! Crashes and outages, for real: the example app killed with SIGKILL
//! mid-payment, and its PostgreSQL stopped mid-run.

use idempotency_tests::programs::{self, Program};
use std::time::Duration;

use idempotency_client::status::{Advice, StatusClient};
use idempotency_tests::{PostgresServer, Process};
use serde_json::json;

const TOKEN: &str = "token-of-the-default-scope-01";

fn payment(amount: i64, delay_ms: u64) -> String {
    json!({"amount": amount, "currency": "EUR", "delay_ms": delay_ms}).to_string()
}

async fn pay(
    http: &reqwest::Client,
    app: &Process,
    key: &str,
    body: &str,
) -> reqwest::Result<reqwest::Response> {
    http.post(format!("http://{}/payments", app.address))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
}

async fn count_payments(database_url: &str) -> i64 {
    if database_url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(database_url).await.unwrap();
        let count = sqlx::query_scalar("select count(*) from payments")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        count
    } else {
        let pool = sqlx::SqlitePool::connect(database_url).await.unwrap();
        let count = sqlx::query_scalar("select count(*) from payments")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        count
    }
}

/// Pays five keys to completion, then starts ten slow payments and kills
/// the app with SIGKILL while they run. Returns the restarted app.
async fn crash_mid_payment(
    database_url: &str,
    single_commit: &str,
    http: &reqwest::Client,
) -> Process {
    let env = [
        ("DATABASE_URL", database_url),
        ("LEASE_SECS", "1"),
        ("SINGLE_COMMIT", single_commit),
    ];
    let app = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
    for i in 0..5 {
        let done = pay(http, &app, &format!("done-{i}"), &payment(100 + i, 0))
            .await
            .unwrap();
        assert_eq!(done.status(), 201);
    }
    let in_flight: Vec<_> = (0..10)
        .map(|i| {
            let (http, address) = (http.clone(), app.address);
            tokio::spawn(async move {
                http.post(format!("http://{address}/payments"))
                    .header("content-type", "application/json")
                    .header("idempotency-key", format!("crashed-{i}"))
                    .body(payment(200 + i, 2000))
                    .send()
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    app.kill().await;
    for request in in_flight {
        assert!(
            request.await.unwrap().is_err(),
            "no answer comes from a killed process"
        );
    }
    let restarted = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
    // Let the dead process's leases (1 s) lapse.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    restarted
}

/// The payments example's default on PostgreSQL: single-commit mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_in_single_commit_mode_every_retried_payment_exists_once() {
    every_retried_payment_exists_once("true").await;
}

/// Transactional mode with a committed claim and a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_in_transactional_mode_every_retried_payment_exists_once() {
    every_retried_payment_exists_once("false").await;
}

async fn every_retried_payment_exists_once(single_commit: &str) {
    let database = idempotency_tests::postgres_database().await;
    let http = reqwest::Client::new();
    let app = crash_mid_payment(&database.url, single_commit, &http).await;
    let env = [
        ("DATABASE_URL", database.url.as_str()),
        ("TOKENS", &format!("default {TOKEN}")),
        ("MIGRATE_ON_START", "false"),
    ];
    let service = Process::start(&programs::path(Program::StatusService), &env, "/readyz").await;
    let status = StatusClient::new(format!("http://{}", service.address), TOKEN);

    // Nothing of a crashed transactional run survives: the status service
    // says it never ran, so resending is safe.
    for i in 0..10 {
        assert_eq!(
            status.details(&format!("crashed-{i}"), None).await.unwrap(),
            None,
            "crashed-{i}: advice retry"
        );
    }
    assert_eq!(
        count_payments(&database.url).await,
        5,
        "the crashed payments were rolled back"
    );
    let retries = (0..10).map(|i| {
        let (http, app) = (http.clone(), &app);
        async move {
            let answer = pay(&http, app, &format!("crashed-{i}"), &payment(200 + i, 2000))
                .await
                .unwrap();
            (
                answer.status().as_u16(),
                answer.headers().contains_key("idempotent-replayed"),
            )
        }
    });
    for (status, replayed) in futures_util::future::join_all(retries).await {
        assert_eq!(
            (status, replayed),
            (201, false),
            "each crashed payment runs once, now"
        );
    }
    for i in 0..5 {
        let replay = pay(&http, &app, &format!("done-{i}"), &payment(100 + i, 0))
            .await
            .unwrap();
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        count_payments(&database.url).await,
        15,
        "every payment exists exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_in_default_mode_abandoned_keys_say_outcome_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let http = reqwest::Client::new();
    let app = crash_mid_payment(&url, "true", &http).await;
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("TOKENS", &format!("default {TOKEN}")),
        ("MIGRATE_ON_START", "false"),
    ];
    let service = Process::start(&programs::path(Program::StatusService), &env, "/readyz").await;
    let status = StatusClient::new(format!("http://{}", service.address), TOKEN);

    for i in 0..10 {
        let key = format!("crashed-{i}");
        let details = status
            .details(&key, None)
            .await
            .unwrap()
            .expect("the record survives the crash");
        assert_eq!(
            details.advice,
            Advice::Reconcile,
            "{key}: outcome unknown, do not resend blindly"
        );
        let retry = pay(&http, &app, &key, &payment(200 + i, 2000))
            .await
            .unwrap();
        assert_eq!(retry.status(), 409);
        let problem: serde_json::Value = retry.json().await.unwrap();
        assert_eq!(problem["type"], "urn:idempotency:outcome-unknown", "{key}");
    }
    for i in 0..5 {
        let key = format!("done-{i}");
        assert_eq!(
            status.details(&key, None).await.unwrap().unwrap().advice,
            Advice::Replay
        );
        let replay = pay(&http, &app, &key, &payment(100 + i, 0)).await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        count_payments(&url).await,
        5,
        "nothing was lost and nothing doubled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_run_fails_closed_and_the_app_recovers() {
    let server = PostgresServer::start();
    let admin = sqlx::PgPool::connect(&server.url("postgres"))
        .await
        .unwrap();
    sqlx::query("create database payments")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = server.url("payments");
    let env = [("DATABASE_URL", url.as_str()), ("STORE_TIMEOUT_MS", "1000")];
    let app = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Four clients pay continuously while PostgreSQL goes down and comes
    // back, and for three seconds after it answers again (however long its
    // crash recovery took on a busy machine).
    let stop_at: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>> =
        std::sync::Arc::default();
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let (http, address) = (http.clone(), app.address);
            let stop_at = std::sync::Arc::clone(&stop_at);
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                let started = std::time::Instant::now();
                let mut n = 0;
                let going = || {
                    let stop = *stop_at.lock().unwrap();
                    started.elapsed() < Duration::from_secs(60)
                        && stop.is_none_or(|stop| std::time::Instant::now() < stop)
                };
                while going() {
                    n += 1;
                    let answer = http
                        .post(format!("http://{address}/payments"))
                        .header("content-type", "application/json")
                        .header("idempotency-key", format!("c{client}-{n}"))
                        .body(payment(n, 20))
                        .send()
                        .await
                        .expect("the app answers, even with its database down");
                    let status = answer.status().as_u16();
                    let body = answer.text().await.unwrap_or_default();
                    statuses.push((status, body));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.stop();
    // Down longer than the guard's 1 s store timeout.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    server.start_again();
    *stop_at.lock().unwrap() = Some(std::time::Instant::now() + Duration::from_secs(3));

    let mut created: i64 = 0;
    let mut refused = 0;
    for client in clients {
        let statuses = client.await.unwrap();
        for (status, body) in &statuses {
            match status {
                201 => created += 1,
                // The guard failing closed before the handler, or the
                // handler (already guarded) losing its database mid-run.
                503 => {
                    assert!(
                        body.contains("urn:idempotency:store-unavailable")
                            || body == "database unavailable, retry later",
                        "{body}"
                    );
                    refused += 1;
                }
                other => panic!("unexpected {other}: {body}"),
            }
        }
        let last = statuses.last().unwrap();
        let tail = &statuses[statuses.len().saturating_sub(4)..];
        assert_eq!(
            last.0, 201,
            "the app recovered without a restart; its last answers: {tail:?}"
        );
    }
    assert!(refused > 0, "the outage was real");
    assert!(created > 0);
    // Transactional mode: a payment exists exactly when its record completed
    // (both commit together). Every 201 is one; a 503 whose commit reached
    // the disk just as the server died may be one too (a retry replays it).
    let payments = count_payments(&url).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let completed: i64 =
        sqlx::query_scalar("select count(*) from idempotency_records where state = 'completed'")
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert_eq!(
        payments, completed,
        "no payment without its record: nothing ran unguarded or twice"
    );
    assert!(
        payments >= created && payments <= created + 4,
        "{payments} payments for {created} answers"
    );
    let metrics = http
        .get(format!("http://{}/metrics", app.address))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains("outcome=\"unguarded\""),
        "nothing ran without the guard"
    );
    assert!(metrics.contains("outcome=\"store-unavailable\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_payment_finish() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let app = Process::start(
        &programs::path(Program::Payments),
        &[("DATABASE_URL", url.as_str())],
        "/metrics",
    )
    .await;
    let http = reqwest::Client::new();
    let slow = tokio::spawn({
        let (http, address) = (http.clone(), app.address);
        async move {
            http.post(format!("http://{address}/payments"))
                .header("content-type", "application/json")
                .header("idempotency-key", "finishing")
                .body(payment(7, 800))
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = app.pid().unwrap().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(signalled.success());
    let answer = slow
        .await
        .unwrap()
        .expect("the in-flight payment gets its answer");
    assert_eq!(
        answer.status(),
        201,
        "graceful shutdown finished the request"
    );
    assert_eq!(count_payments(&url).await, 1);
    // The process exits once its requests are done.
    let mut exited = false;
    for _ in 0..50 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
        {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exited, "the app exited after SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_payment_whose_client_left() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let env = [("DATABASE_URL", url.as_str())];
    let app = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
    // The client gives up after 300 ms; the payment takes 1.5 s.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = pay(&impatient, &app, "left-early", &payment(9, 1500)).await;
    assert!(gone.is_err(), "the client was meant to time out");
    let pid = app.pid().unwrap().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(signalled.success());
    let mut exited = false;
    for _ in 0..100 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z "))
        {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exited, "the app did not exit after SIGTERM");
    assert_eq!(
        count_payments(&url).await,
        1,
        "the app exited before the payment whose client left was written"
    );
    app.kill().await;
    // After a restart, the retry gets the stored answer.
    let app = Process::start(&programs::path(Program::Payments), &env, "/metrics").await;
    let http = reqwest::Client::new();
    let retry = pay(&http, &app, "left-early", &payment(9, 1500))
        .await
        .unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(
        retry
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true"),
        "the retry after the restart was not a replay"
    );
    assert_eq!(count_payments(&url).await, 1);
}
