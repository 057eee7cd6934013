//! Resume after SIGKILL, for real: the payments example's resumable debit
//! route (`POST /debits`: steps `reserve`, `charge` at a fake PSP that
//! honours `Idempotency-Key`, `record`) killed at each step boundary and
//! inside each step (`CRASH_POINTS=true` and `X-Crash-At`: the process
//! sends itself SIGKILL there), on PostgreSQL, SQLite, Redis and NATS. After a
//! restart, the client's retry resumes each crashed debit and gets the
//! real answer; another retry gets it stored. Each local step ran once, or
//! twice when the crash cut it between its write and its record (the write
//! keyed by the step's derived key: one row); the PSP charged each debit
//! once, whatever number of requests its charge step made.
//!
//! At CI size each crash point is hit once per store (16 s for the three
//! stores at once); the long run repeats the seven points
//! `RESUME_CRASH_ROUNDS` times (5 rounds, 35 crashes per store: 10 minutes
//! on a loaded 2-core machine):
//!
//! ```sh
//! RESUME_CRASH_ROUNDS=5 cargo test -p idempotency-tests --test e2e resume_crash
//! ```

use std::collections::HashMap;
use std::time::Duration;

use idempotency_tests::programs::{self, Program};
use idempotency_tests::{FakePsp, Process};
use serde_json::json;

/// Where the example kills itself: before the first step, inside each step
/// (its work done, its result not recorded), after each step.
const POINTS: [&str; 7] = [
    "before-reserve",
    "in-reserve",
    "after-reserve",
    "in-charge",
    "after-charge",
    "in-record",
    "after-record",
];

/// The store the guard keeps its records in.
#[derive(Clone, Copy, Debug)]
enum Records {
    Postgres,
    Sqlite,
    Redis,
    Nats,
}

/// One crashed debit: its key, its amount, where it was killed.
struct Crashed {
    key: String,
    amount: i64,
    point: &'static str,
}

fn rounds() -> usize {
    std::env::var("RESUME_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1)
}

async fn debit(
    http: &reqwest::Client,
    app: &Process,
    key: &str,
    amount: i64,
    crash_at: Option<&str>,
) -> reqwest::Result<reqwest::Response> {
    let mut request = http
        .post(format!("http://{}/debits", app.address))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(json!({"amount": amount, "currency": "EUR"}).to_string());
    if let Some(point) = crash_at {
        request = request.header("x-crash-at", point);
    }
    request.send().await
}

/// A hold's row: amount, executions of `reserve`.
type Reserved = (i64, i64);
/// A debit's row: amount, executions of `record`, id, charge.
type Recorded = (i64, i64, i64, String);

/// Per debit amount: (executions of `reserve`, executions of `record`,
/// the recorded debit's id and charge), from the example's tables.
async fn local_steps(database_url: &str) -> HashMap<i64, (i64, i64, i64, String)> {
    const RESERVED: &str = "select amount, executions from reservations";
    const RECORDED: &str = "select amount, executions, id, charge from debits";
    let (reserved, recorded): (Vec<Reserved>, Vec<Recorded>) =
        if database_url.starts_with("postgres") {
            let pool = sqlx::PgPool::connect(database_url).await.unwrap();
            let reserved = sqlx::query_as(RESERVED).fetch_all(&pool).await.unwrap();
            let recorded = sqlx::query_as(RECORDED).fetch_all(&pool).await.unwrap();
            pool.close().await;
            (reserved, recorded)
        } else {
            let pool = sqlx::SqlitePool::connect(database_url).await.unwrap();
            let reserved = sqlx::query_as(RESERVED).fetch_all(&pool).await.unwrap();
            let recorded = sqlx::query_as(RECORDED).fetch_all(&pool).await.unwrap();
            pool.close().await;
            (reserved, recorded)
        };
    let reserved: HashMap<i64, i64> = reserved.into_iter().collect();
    assert_eq!(
        reserved.len(),
        recorded.len(),
        "one hold per recorded debit"
    );
    recorded
        .into_iter()
        .map(|(amount, executions, id, charge)| {
            let holds = reserved.get(&amount).copied().unwrap_or(0);
            (amount, (holds, executions, id, charge))
        })
        .collect()
}

/// How often a step runs when the crash hit `point`: twice for the step
/// the crash cut between its work and its record, once otherwise; once
/// always for a local step on PostgreSQL, where it is transactional (its
/// write commits with its record, or neither does).
fn expected(step: &str, point: &str, records: Records) -> i64 {
    let transactional = matches!(records, Records::Postgres) && step != "charge";
    if point == format!("in-{step}") && !transactional {
        2
    } else {
        1
    }
}

async fn every_crashed_debit_resumes_once(records: Records) {
    let psp = FakePsp::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite_url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("payments.db").display()
    );
    let postgres = match records {
        Records::Postgres => Some(idempotency_tests::postgres_database().await),
        Records::Sqlite | Records::Redis | Records::Nats => None,
    };
    let database_url = postgres.as_ref().map_or(sqlite_url, |db| db.url.clone());
    let prefix = format!("e2e-resume-{}", uuid::Uuid::new_v4().simple());
    let mut env = vec![
        ("DATABASE_URL", database_url.clone()),
        ("PSP_URL", psp.url()),
        ("CRASH_POINTS", "true".to_owned()),
        ("LEASE_SECS", "1".to_owned()),
        ("RUST_LOG", "off".to_owned()),
    ];
    if let Records::Redis = records {
        env.push(("STORE", "redis".to_owned()));
        env.push(("REDIS_URL", idempotency_tests::fixtures::redis_url()));
        env.push(("REDIS_PREFIX", prefix.clone()));
    }
    // The NATS store needs a server of 2.11 or later: the tests' own.
    let nats_url = match records {
        Records::Nats => {
            tokio::task::spawn_blocking(idempotency_tests::nats_server::nats_store_url)
                .await
                .expect("find the NATS server")
        }
        _ => String::new(),
    };
    if let Records::Nats = records {
        // A bucket of its own (the prefix), deleted below.
        env.push(("STORE", "nats".to_owned()));
        env.push(("NATS_URL", nats_url.clone()));
        env.push(("NATS_BUCKET", prefix.clone()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let program = programs::path(Program::Payments);
    // No pooled connections: each crash leaves the old ones dead.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();

    let mut app = Process::start(&program, &env, "/metrics").await;
    let address = app.address;
    let mut crashed = Vec::new();
    for round in 0..rounds() {
        for (n, point) in POINTS.into_iter().enumerate() {
            let key = format!("debit-{round}-{point}");
            let amount = 1000 * (round as i64 + 1) + n as i64;
            let cut = debit(&http, &app, &key, amount, Some(point)).await;
            assert!(cut.is_err(), "{point}: a killed process answers nothing");
            let status = app.wait().await;
            assert!(!status.success(), "{point}: the app was killed: {status}");
            app = Process::start_at(&program, address, &env, "/metrics").await;
            crashed.push(Crashed { key, amount, point });
        }
    }
    // The dead runs' leases (1 s) lapse: each key is abandoned.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let mut answers = HashMap::new();
    for chunk in crashed.chunks(7) {
        let resumed = chunk.iter().map(|c| {
            let (http, app) = (http.clone(), &app);
            async move {
                let answer = debit(&http, app, &c.key, c.amount, None).await.unwrap();
                let replayed = answer.headers().contains_key("idempotent-replayed");
                let status = answer.status().as_u16();
                let body = answer.text().await.unwrap();
                (status, replayed, body)
            }
        });
        for (c, (status, replayed, body)) in chunk
            .iter()
            .zip(futures_util::future::join_all(resumed).await)
        {
            assert_eq!(
                (status, replayed),
                (201, false),
                "{}: the retry resumes the crashed debit: {body}",
                c.point
            );
            answers.insert(c.key.clone(), body);
        }
    }
    // Each key is now completed: another retry gets the stored answer.
    for c in &crashed {
        let again = debit(&http, &app, &c.key, c.amount, None).await.unwrap();
        assert_eq!(again.status(), 201, "{}", c.point);
        assert_eq!(
            again
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "{}: the second retry is a replay",
            c.point
        );
        assert_eq!(
            again.text().await.unwrap(),
            answers[&c.key],
            "{}: the stored answer",
            c.point
        );
    }

    let charges = psp.charges();
    let steps = local_steps(&database_url).await;
    assert_eq!(
        charges.len(),
        crashed.len(),
        "one charge per debit: {charges:?}"
    );
    for c in &crashed {
        let answer: serde_json::Value = serde_json::from_str(&answers[&c.key]).unwrap();
        let charged: Vec<_> = charges.iter().filter(|ch| ch.amount == c.amount).collect();
        assert_eq!(charged.len(), 1, "{}: charged once: {charged:?}", c.point);
        let charge = charged[0];
        assert_eq!(
            charge.requests,
            expected("charge", c.point, records) as u64,
            "{}: the charge step's requests, all with its derived key",
            c.point
        );
        let (reserved, recorded, id, recorded_charge) = steps
            .get(&c.amount)
            .unwrap_or_else(|| panic!("{}: the debit is recorded", c.point));
        assert_eq!(
            *reserved,
            expected("reserve", c.point, records),
            "{}: reserve",
            c.point
        );
        assert_eq!(
            *recorded,
            expected("record", c.point, records),
            "{}: record",
            c.point
        );
        assert_eq!(recorded_charge, &charge.id, "{}", c.point);
        assert_eq!(
            answer,
            json!({"id": id, "tenant": "default", "amount": c.amount, "currency": "EUR", "charge": charge.id}),
            "{}: the right answer",
            c.point
        );
    }
    app.kill().await;
    if let Records::Redis = records {
        let client = redis::Client::open(idempotency_tests::fixtures::redis_url()).unwrap();
        let mut connection = client.get_connection().unwrap();
        let _ =
            idempotency_tests::fixtures::delete_redis_keys(&mut connection, &format!("{prefix}:*"));
    }
    if let Records::Nats = records {
        let client = async_nats::connect(nats_url.as_str()).await.unwrap();
        let _ = async_nats::jetstream::new(client)
            .delete_stream(format!("KV_{prefix}"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_crash_on_postgres_every_crashed_debit_completes_once() {
    every_crashed_debit_resumes_once(Records::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_crash_on_sqlite_every_crashed_debit_completes_once() {
    every_crashed_debit_resumes_once(Records::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_crash_on_redis_every_crashed_debit_completes_once() {
    every_crashed_debit_resumes_once(Records::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_crash_on_nats_every_crashed_debit_completes_once() {
    every_crashed_debit_resumes_once(Records::Nats).await;
}
