//! The retry-storm harness: the classic incident, reproduced.
//!
//! During a network blip the answers of writes that already ran are lost,
//! and clients retry. Here a [`FaultyProxy`] in front of the payments
//! example drops a share of answers after the payment ran and resets some
//! connections before the request reaches it; `clients` clients each make
//! `payments` payments with fresh keys, and after each lost answer ask the
//! key-status service and follow its advice (`replay` or `retry`: send the
//! same request again; `wait`: wait and ask again; `reconcile`: give up on
//! it as unknown).
//!
//! Each payment has a unique amount, so the `payments` table tells, per
//! logical payment, how many times it ran. With the guard every payment
//! runs once and every client ends with its own payment's answer; with the
//! guard off (`IDEMPOTENCY_GUARD=off`) the same harness counts the
//! duplicates the retries made.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idempotency_client::status::{Advice, StatusClient};

use crate::Process;
use crate::proxy::{Faults, FaultyProxy};

/// What to run.
#[derive(Debug, Clone)]
pub struct StormConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// Payments each client makes, one after another.
    pub payments: usize,
    /// The share of answers dropped after the payment ran.
    pub drop: f64,
    /// The share of connections reset before the request is forwarded.
    pub reset: f64,
    /// Whether the app runs the guard.
    pub guard: bool,
    /// Where the payments (and records) live; `None`: a fresh SQLite file.
    pub database_url: Option<String>,
    /// The seed of the proxy's faults.
    pub seed: u64,
    /// How long a client waits for an answer before it counts it as lost.
    pub timeout: Duration,
}

impl Default for StormConfig {
    fn default() -> Self {
        Self {
            clients: 8,
            payments: 25,
            drop: 0.3,
            reset: 0.05,
            guard: true,
            database_url: None,
            seed: 42,
            timeout: Duration::from_secs(5),
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct StormReport {
    /// Logical payments the clients made.
    pub payments: u64,
    /// HTTP requests the clients sent (first tries and retries).
    pub requests: u64,
    /// Requests beyond the first try of each payment.
    pub retries: u64,
    /// Answers marked `Idempotent-Replayed: true`.
    pub replays: u64,
    /// Questions asked of the status service.
    pub status_lookups: u64,
    /// Answers the proxy dropped after the payment ran.
    pub answers_dropped: u64,
    /// Connections the proxy reset before forwarding.
    pub resets: u64,
    /// Payments that ended with their own 201 answer.
    pub completed: u64,
    /// Payments that ended `outcome-unknown` (advice `reconcile`).
    pub unknown: u64,
    /// Answers that belonged to another payment (must be 0).
    pub wrong_answers: u64,
    /// Rows in `payments`.
    pub rows: u64,
    /// Logical payments with more than one row.
    pub duplicated_payments: u64,
    /// Rows beyond the first of each logical payment.
    pub duplicate_rows: u64,
    /// Wall time of the storm.
    pub elapsed: Duration,
}

impl StormReport {
    /// Requests sent per logical payment.
    pub fn amplification(&self) -> f64 {
        self.requests as f64 / self.payments.max(1) as f64
    }
}

impl std::fmt::Display for StormReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "payments            {}", self.payments)?;
        writeln!(f, "requests sent       {}", self.requests)?;
        writeln!(f, "retries             {}", self.retries)?;
        writeln!(f, "replays served      {}", self.replays)?;
        writeln!(f, "status look-ups     {}", self.status_lookups)?;
        writeln!(f, "answers dropped     {}", self.answers_dropped)?;
        writeln!(f, "connections reset   {}", self.resets)?;
        writeln!(f, "completed           {}", self.completed)?;
        writeln!(f, "outcome unknown     {}", self.unknown)?;
        writeln!(f, "wrong answers       {}", self.wrong_answers)?;
        writeln!(f, "rows in payments    {}", self.rows)?;
        writeln!(f, "duplicated payments {}", self.duplicated_payments)?;
        writeln!(f, "duplicate rows      {}", self.duplicate_rows)?;
        writeln!(f, "amplification       {:.3}", self.amplification())?;
        write!(f, "elapsed             {:.1?}", self.elapsed)
    }
}

const TOKEN: &str = "token-of-the-storm-harness-01";

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    replays: AtomicU64,
    lookups: AtomicU64,
    completed: AtomicU64,
    unknown: AtomicU64,
    wrong: AtomicU64,
}

/// Runs the storm: starts the example app (`app_program`) and the status
/// service (`service_program`) on one database, the proxy in front of the
/// app, and the clients; then counts rows.
///
/// # Panics
///
/// When a process does not start, or a payment gets an answer the harness
/// does not expect (the message says which).
pub async fn run(config: &StormConfig, app_program: &str, service_program: &str) -> StormReport {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = config
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("storm.db").display()));
    let guard = if config.guard { "on" } else { "off" };
    let app_env = [
        ("DATABASE_URL", url.as_str()),
        ("IDEMPOTENCY_GUARD", guard),
        ("RUST_LOG", "off"),
    ];
    let app = Process::start(app_program, &app_env, "/metrics").await;
    let tokens = format!("default {TOKEN}");
    let service_env = [
        ("DATABASE_URL", url.as_str()),
        ("TOKENS", tokens.as_str()),
        ("MIGRATE_ON_START", "false"),
    ];
    let service = Process::start(service_program, &service_env, "/readyz").await;
    let faults = Faults::new(config.seed)
        .with_dropped_responses(config.drop)
        .with_resets(config.reset);
    let proxy = FaultyProxy::start(app.address, faults).await;

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(config.timeout)
        .build()
        .expect("an HTTP client");
    let status = StatusClient::new(format!("http://{}", service.address), TOKEN);
    let counters = Arc::new(Counters::default());
    let url_of_payments = format!("http://{}/payments", proxy.address);
    let started = Instant::now();
    let clients: Vec<_> = (0..config.clients)
        .map(|client| {
            let (http, status, counters, url) = (
                http.clone(),
                status.clone(),
                Arc::clone(&counters),
                url_of_payments.clone(),
            );
            let payments = config.payments;
            tokio::spawn(async move {
                for payment in 0..payments {
                    let amount = (client * payments + payment + 1) as i64;
                    pay(&http, &status, &url, amount, &counters).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a client task");
    }
    let elapsed = started.elapsed();

    let (rows, by_amount) = count_rows(&url).await;
    let counts = proxy.counts();
    drop((app, service));
    StormReport {
        payments: (config.clients * config.payments) as u64,
        requests: counters.requests.load(Ordering::Relaxed),
        retries: counters.retries.load(Ordering::Relaxed),
        replays: counters.replays.load(Ordering::Relaxed),
        status_lookups: counters.lookups.load(Ordering::Relaxed),
        answers_dropped: counts.responses_dropped,
        resets: counts.resets,
        completed: counters.completed.load(Ordering::Relaxed),
        unknown: counters.unknown.load(Ordering::Relaxed),
        wrong_answers: counters.wrong.load(Ordering::Relaxed),
        rows,
        duplicated_payments: by_amount.values().filter(|&&n| n > 1).count() as u64,
        duplicate_rows: by_amount.values().map(|&n| n.saturating_sub(1)).sum(),
        elapsed,
    }
}

/// One logical payment, retried until it has an answer.
async fn pay(
    http: &reqwest::Client,
    status: &StatusClient,
    url: &str,
    amount: i64,
    counters: &Counters,
) {
    let key = uuid::Uuid::now_v7().to_string();
    let body = format!(r#"{{"amount":{amount},"currency":"EUR"}}"#);
    for attempt in 0..100u32 {
        if attempt > 0 {
            counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let sent = http
            .post(url)
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .header("x-retry-attempt", attempt.to_string())
            .body(body.clone())
            .send()
            .await;
        let lost = match sent {
            Ok(answer) => {
                let code = answer.status().as_u16();
                let replayed = answer.headers().contains_key("idempotent-replayed");
                let text = answer.text().await.unwrap_or_default();
                match code {
                    201 => {
                        if replayed {
                            counters.replays.fetch_add(1, Ordering::Relaxed);
                        }
                        let own = serde_json::from_str::<serde_json::Value>(&text)
                            .is_ok_and(|json| json["amount"] == amount);
                        let counter = if own {
                            &counters.completed
                        } else {
                            &counters.wrong
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    409 if text.contains("request-in-flight") => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        false
                    }
                    409 if text.contains("outcome-unknown") => {
                        counters.unknown.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    503 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        false
                    }
                    other => panic!("payment {amount}: unexpected answer {other}: {text}"),
                }
            }
            // The answer never came (dropped, reset, or timed out).
            Err(_) => true,
        };
        if lost {
            // Ask before resending, and follow the advice.
            loop {
                counters.lookups.fetch_add(1, Ordering::Relaxed);
                match status.details(&key, None).await {
                    Ok(Some(details)) => match details.advice {
                        Advice::Wait => {
                            let wait = details.retry_after_seconds.unwrap_or(1);
                            tokio::time::sleep(Duration::from_millis(250 * wait)).await;
                        }
                        Advice::Replay | Advice::Retry => break,
                        Advice::Reconcile => {
                            counters.unknown.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    },
                    // No record: it never ran, resending is safe.
                    Ok(None) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
    }
    panic!("payment {amount}: no answer after 100 tries");
}

/// Rows in `payments`, and rows per amount (one amount per logical payment).
async fn count_rows(url: &str) -> (u64, HashMap<i64, u64>) {
    let amounts: Vec<i64> = if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url)
            .await
            .expect("connect to count rows");
        let rows = sqlx::query_scalar("select amount from payments")
            .fetch_all(&pool)
            .await
            .expect("count rows");
        pool.close().await;
        rows
    } else {
        let pool = sqlx::SqlitePool::connect(url)
            .await
            .expect("open to count rows");
        let rows = sqlx::query_scalar("select amount from payments")
            .fetch_all(&pool)
            .await
            .expect("count rows");
        pool.close().await;
        rows
    };
    let mut by_amount: HashMap<i64, u64> = HashMap::new();
    for amount in &amounts {
        *by_amount.entry(*amount).or_default() += 1;
    }
    (amounts.len() as u64, by_amount)
}
