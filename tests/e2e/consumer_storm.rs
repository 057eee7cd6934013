//! The redelivery storm: a RabbitMQ consumer process is killed with SIGKILL
//! right after an effect and before its ack, again and again, and the
//! broker redelivers. With the transactional inbox every message has
//! exactly one effect; in default mode none has two (abandoned ones are
//! parked and counted); with the guard off the same harness counts the
//! duplicates.
//!
//! CI runs 1,000 messages and 3 kills. The full version:
//!
//! ```text
//! STORM_MESSAGES=10000 STORM_KILLS=10 cargo test -p idempotency-tests --test e2e consumer_storm -- --nocapture
//! ```

use idempotency_tests::programs::{self, Program};
use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::process::{Child, Command};

fn amqp_url() -> String {
    std::env::var("TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

async fn rabbit() -> Connection {
    let url = amqp_url();
    Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|error| {
            panic!(
                "RabbitMQ is not answering at {url} ({error}). Start it with \
                 `rabbitmq-server -detached` (Debian package rabbitmq-server), or point TEST_AMQP_URL at a broker."
            )
        })
}

/// What one storm left behind.
struct Outcome {
    /// Effects per key.
    effects: HashMap<String, i64>,
    /// Keys of parked messages.
    parked: Vec<String>,
    /// Messages in the queue's dead-letter queue.
    dead: u32,
    /// How many times the consumer was killed.
    kills: usize,
    /// The queue (the records' scope).
    queue: String,
    /// The database of the effects (and of the records on PostgreSQL), kept
    /// until the outcome is dropped.
    database: Option<idempotency_tests::TestDatabase>,
}

/// Runs one storm: publishes `messages`, kills the consumer `kills` times
/// right after an effect, then lets a last consumer drain the queue.
async fn storm(mode: &str, store_url: &str, redis_prefix: &str) -> Outcome {
    let messages = setting("STORM_MESSAGES", 1000);
    let kills = setting("STORM_KILLS", 3);
    let database = idempotency_tests::postgres_database().await;
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    sqlx::query(
        "create table storm_effects (key text not null, at timestamptz not null default now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store_url = if store_url.is_empty() {
        database.url.clone()
    } else {
        store_url.to_owned()
    };
    let connection = rabbit().await;
    let queue = format!("storm_{}", uuid::Uuid::new_v4().simple());
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongUInt(1_800_000));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for n in 0..messages {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                format!("{{\"order\":{n}}}").as_bytes(),
                BasicProperties::default().with_message_id(format!("order-{n}").into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let start = |crash_at: usize| -> Child {
        Command::new(programs::path(Program::StormConsumer))
            .env("AMQP_URL", amqp_url())
            .env("QUEUE", &queue)
            .env("EFFECTS_URL", &database.url)
            .env("MODE", mode)
            .env("STORE_URL", &store_url)
            .env("REDIS_PREFIX", redis_prefix)
            .env("CRASH_AT", crash_at.to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the storm consumer")
    };
    // Kill points spread over the run: each one a random effect count.
    let per_life = (messages / (kills + 1)).max(2);
    for _ in 0..kills {
        let crash_at =
            1 + usize::try_from(uuid::Uuid::new_v4().as_u128() % per_life as u128).unwrap();
        let mut child = start(crash_at);
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .expect("the consumer reached its kill point")
            .unwrap();
        assert!(!status.success(), "the consumer was killed, not done");
    }
    // The last life drains the queue.
    let mut last = start(0);
    let all: usize = messages;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let mut outcome;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        outcome = read(&pool, &connection, &queue, false).await;
        let settled = outcome.effects.len()
            + outcome
                .parked
                .iter()
                .filter(|key| !outcome.effects.contains_key(*key))
                .count();
        if settled >= all && ready(&connection, &queue).await == 0 {
            // Let requeued copies come back and be answered.
            tokio::time::sleep(Duration::from_secs(3)).await;
            if ready(&connection, &queue).await == 0 {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the storm did not settle: {} effects",
            outcome.effects.len()
        );
    }
    let _ = last.kill().await;
    outcome = read(&pool, &connection, &queue, true).await;
    outcome.kills = kills;
    outcome.queue = queue.clone();
    for name in [
        queue.clone(),
        format!("{queue}.dead"),
        format!("{queue}.parked"),
    ] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    pool.close().await;
    outcome.database = Some(database);
    outcome
}

async fn ready(connection: &Connection, queue: &str) -> u32 {
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let count = channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .map(|queue| queue.message_count())
        .unwrap_or(0);
    let _ = channel.close(200, "done".into()).await;
    count
}

/// Reads the effects, and (when `drain`) the parked keys.
async fn read(pool: &sqlx::PgPool, connection: &Connection, queue: &str, drain: bool) -> Outcome {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("select key, count(*) from storm_effects group by key")
            .fetch_all(pool)
            .await
            .unwrap();
    let parked_queue = format!("{queue}.parked");
    let mut parked = Vec::new();
    let parked_count = ready(connection, &parked_queue).await;
    if drain && parked_count > 0 {
        let channel = connection.create_channel().await.unwrap();
        let options = BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        };
        let mut consumer = channel
            .basic_consume(
                parked_queue.as_str().into(),
                "".into(),
                options,
                FieldTable::default(),
            )
            .await
            .unwrap();
        while parked.len() < parked_count as usize {
            let Ok(Some(Ok(delivery))) =
                tokio::time::timeout(Duration::from_secs(5), consumer.next()).await
            else {
                break;
            };
            parked.push(
                delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
            );
        }
    } else {
        parked = vec![String::new(); parked_count as usize];
    }
    Outcome {
        effects: rows.into_iter().collect(),
        parked,
        dead: ready(connection, &format!("{queue}.dead")).await,
        kills: 0,
        queue: String::new(),
        database: None,
    }
}

fn duplicated(outcome: &Outcome) -> usize {
    outcome.effects.values().filter(|n| **n > 1).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_transactional_inbox_applies_every_message_exactly_once() {
    let outcome = storm("transactional", "", "").await;
    let messages = setting("STORM_MESSAGES", 1000);
    println!(
        "transactional inbox: {} keys, {} duplicated, {} parked, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.parked.len(),
        outcome.kills
    );
    assert_eq!(
        outcome.effects.len(),
        messages,
        "every message had its effect"
    );
    assert_eq!(duplicated(&outcome), 0, "no message had two");
    assert!(
        outcome.parked.is_empty(),
        "nothing is unknown in transactional mode"
    );
    assert_eq!(outcome.dead, 0);
}

async fn default_mode(store_url: &str, prefix: &str) -> Outcome {
    let outcome = storm("default", store_url, prefix).await;
    let messages = setting("STORM_MESSAGES", 1000);
    println!(
        "default mode: {} keys with an effect, {} duplicated, {} parked, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.parked.len(),
        outcome.kills
    );
    assert_eq!(duplicated(&outcome), 0, "no message's effect applied twice");
    // Each kill left at least the message it was handling abandoned: parked, counted.
    assert!(
        outcome.parked.len() >= outcome.kills,
        "{} parked for {} kills",
        outcome.parked.len(),
        outcome.kills
    );
    let parked: HashSet<&String> = outcome.parked.iter().collect();
    let covered = (0..messages).filter(|n| {
        let key = format!("order-{n}");
        outcome.effects.contains_key(&key) || parked.contains(&key)
    });
    assert_eq!(
        covered.count(),
        messages,
        "every message ran once or was parked for a person"
    );
    assert_eq!(outcome.dead, 0);
    drop(parked);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_default_mode_on_postgres_never_applies_twice() {
    let outcome = default_mode("", "").await;
    // An operator asks the status service about a parked message's key
    // (scope: the queue), and about one that ran.
    let database = outcome.database.as_ref().unwrap();
    let token = "token-for-the-storm-queue-0001";
    let tokens = format!("{} {token}", outcome.queue);
    let env = [
        ("DATABASE_URL", database.url.as_str()),
        ("TOKENS", tokens.as_str()),
        ("MIGRATE_ON_START", "false"),
    ];
    let service =
        idempotency_tests::Process::start(&programs::path(Program::StatusService), &env, "/readyz")
            .await;
    let http = reqwest::Client::new();
    let ask = |key: String| {
        let request = http
            .get(format!("http://{}/v1/keys/{key}", service.address))
            .bearer_auth(token);
        async move {
            request
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let parked = outcome.parked.first().expect("a parked message").clone();
    let status = ask(parked).await;
    assert_eq!(status["state"], "abandoned", "{status}");
    assert_eq!(status["advice"], "reconcile", "{status}");
    assert_eq!(status["method"], "MESSAGE", "{status}");
    let ran = (0..)
        .map(|n| format!("order-{n}"))
        .find(|key| outcome.effects.contains_key(key) && !outcome.parked.contains(key))
        .unwrap();
    let status = ask(ran).await;
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["advice"], "replay", "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_default_mode_on_redis_never_applies_twice() {
    let prefix = format!("storm-{}:", uuid::Uuid::new_v4().simple());
    let url = idempotency_tests::fixtures::redis_url();
    redis::Client::open(url.as_str())
        .and_then(|client| client.get_connection())
        .unwrap_or_else(|error| {
            panic!("Redis is not answering at {url} ({error}); start redis-server on 6379")
        });
    let _ = default_mode(&url, &prefix).await;
    // Leave nothing behind (a blocking connection: `SCAN` over a busy
    // shared Redis takes a while).
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut connection = client.get_connection().unwrap();
        idempotency_tests::fixtures::delete_redis_keys(&mut connection, &format!("{prefix}*"))
            .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_without_the_guard_counts_duplicates() {
    let outcome = storm("off", "", "").await;
    println!(
        "guard off: {} keys, {} duplicated, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.kills
    );
    // Every kill came right after an effect and before its ack: the
    // redelivery applied it again. The harness sees it.
    assert!(
        duplicated(&outcome) >= outcome.kills,
        "{} duplicates for {} kills",
        duplicated(&outcome),
        outcome.kills
    );
}
