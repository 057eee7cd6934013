//! The retry storm through the gateway: a fault-injecting proxy between
//! the clients and the gateway drops 30 % of the answers after the backend
//! ran the payment; clients retry with the same key until they hear back.
//! Guarded: every payment runs exactly once. Unguarded (the same clients,
//! the route not named in the configuration): the retries run again, and
//! the backend's table counts the duplicates.
//!
//! The CI run is small (about 150 requests). A big one:
//! `GATEWAY_STORM_CLIENTS=16 GATEWAY_STORM_PAYMENTS=100 cargo test -p idempotency-gateway --test it storm -- --nocapture`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idempotency_tests::proxy::{Faults, FaultyProxy};

use crate::support::{Stack, pay, stack};

const GUARDED: &str = "[[routes]]\npath = \"/payments\"\nmethods = [\"POST\"]\n";
const UNGUARDED: &str = "routes = []\n";

#[derive(Debug, Default)]
struct Tally {
    requests: AtomicU64,
    lost: AtomicU64,
    replays: AtomicU64,
    wrong: AtomicU64,
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the storm; returns the tally, the payments made and the rows per amount.
async fn storm(stack: &Stack) -> (Arc<Tally>, usize, HashMap<i64, u64>) {
    let clients = setting("GATEWAY_STORM_CLIENTS", 6);
    let payments = setting("GATEWAY_STORM_PAYMENTS", 17);
    let proxy = FaultyProxy::start(
        stack.gateway.address,
        Faults::new(1307).with_dropped_responses(0.3),
    )
    .await;
    let url = format!("http://{}/payments", proxy.address);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let tally = Arc::new(Tally::default());
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (http, url, tally) = (http.clone(), url.clone(), Arc::clone(&tally));
            tokio::spawn(async move {
                for payment in 0..payments {
                    let amount = (client * payments + payment + 1) as i64;
                    let key = uuid::Uuid::new_v4().to_string();
                    let body = format!(r#"{{"amount":{amount},"currency":"EUR"}}"#);
                    let mut attempt = 0;
                    loop {
                        attempt += 1;
                        assert!(attempt < 50, "payment {amount}: no answer after 50 tries");
                        tally.requests.fetch_add(1, Ordering::Relaxed);
                        let Ok(answer) = pay(&http, &url, &key, &body).send().await else {
                            tally.lost.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        let status = answer.status().as_u16();
                        let replayed = answer.headers().contains_key("idempotent-replayed");
                        let text = answer.text().await.unwrap_or_default();
                        match status {
                            201 => {
                                let json: serde_json::Value =
                                    serde_json::from_str(&text).unwrap_or_default();
                                if json["amount"] != amount {
                                    tally.wrong.fetch_add(1, Ordering::Relaxed);
                                }
                                if replayed {
                                    tally.replays.fetch_add(1, Ordering::Relaxed);
                                }
                                break;
                            }
                            409 if text.contains("request-in-flight") => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            other => panic!("payment {amount}: unexpected {other}: {text}"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a client");
    }
    let mut rows: HashMap<i64, u64> = HashMap::new();
    for amount in stack.amounts().await {
        *rows.entry(amount).or_default() += 1;
    }
    let counts = proxy.counts();
    println!(
        "storm: {} payments, {} requests, {} answers dropped by the proxy, {} replays, {} rows",
        clients * payments,
        tally.requests.load(Ordering::Relaxed),
        counts.responses_dropped,
        tally.replays.load(Ordering::Relaxed),
        rows.values().sum::<u64>()
    );
    (tally, clients * payments, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_storm_with_30_percent_lost_answers_runs_each_payment_once() {
    let stack = stack(GUARDED, &[]).await;
    let (tally, payments, rows) = storm(&stack).await;
    assert!(
        tally.lost.load(Ordering::Relaxed) > 0,
        "the proxy dropped no answer: the storm proved nothing"
    );
    assert_eq!(
        tally.wrong.load(Ordering::Relaxed),
        0,
        "an answer of another payment"
    );
    assert_eq!(rows.len(), payments, "every payment ran");
    let duplicated: Vec<_> = rows.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "payments that ran twice: {duplicated:?}"
    );
    assert!(
        tally.replays.load(Ordering::Relaxed) > 0,
        "retries of lost answers were replayed"
    );
    let records = stack.records().await;
    assert_eq!(records.len(), payments, "one record per payment");
    assert!(records.iter().all(|(_, _, state)| state == "completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unguarded_storm_counts_the_duplicates_the_retries_made() {
    let stack = stack(UNGUARDED, &[]).await;
    let (tally, payments, rows) = storm(&stack).await;
    let lost = tally.lost.load(Ordering::Relaxed);
    let duplicates: u64 = rows.values().map(|n| n - 1).sum();
    assert_eq!(rows.len(), payments, "every payment ran");
    assert_eq!(
        duplicates, lost,
        "each lost answer's retry ran the payment again"
    );
    assert!(
        duplicates > 0,
        "without the guard the retries duplicate payments"
    );
    assert!(
        stack.records().await.is_empty(),
        "nothing guarded, nothing stored"
    );
}
