//! The redelivery storm: a consumer process (RabbitMQ or NATS JetStream)
//! is killed with SIGKILL right after an effect and before its ack, again
//! and again, while a second consumer competes for the first part of the
//! run (and is killed too), and the broker redelivers. With the
//! transactional inbox every message has exactly one effect and nothing
//! is parked; in default mode none has two (abandoned ones are parked and
//! counted), on PostgreSQL, Redis and SQLite; with the guard off the same
//! harness counts the duplicates. Each storm prints how its drain went:
//! when 90 % and 100 % of the effects were applied, and the longest pause
//! between two effects (asserted under 10 s: nothing stalls behind a dead
//! consumer).
//!
//! CI runs 500 messages and 3 kills per storm. The full version:
//!
//! ```text
//! STORM_MESSAGES=10000 STORM_KILLS=10 cargo test -p idempotency-tests --test e2e consumer_storm -- --nocapture
//! ```

use idempotency_tests::programs::{self, Program};
use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::process::{Child, Command};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// How many messages a storm publishes.
fn messages() -> usize {
    setting("STORM_MESSAGES", 500)
}

async fn rabbit() -> Connection {
    let url = idempotency_tests::broker_server::amqp_url();
    Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|error| {
            panic!(
                "RabbitMQ is not answering at {url} ({error}). Unset \
                 TEST_AMQP_URL to let the tests start a private broker, or start the one it names."
            )
        })
}

async fn nats() -> jetstream::Context {
    let url = idempotency_tests::broker_server::nats_url();
    let client = async_nats::connect(&url).await.unwrap_or_else(|error| {
        panic!(
            "NATS is not answering at {url} ({error}). Unset TEST_NATS_URL to let the \
             tests start a private server, or start the one it names."
        )
    });
    jetstream::new(client)
}

/// Which broker a storm runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    Rabbit,
    Nats,
}

/// The queue (RabbitMQ) or stream (JetStream, subjects `<name>.in`,
/// `.parked`, `.dead`, durable pull consumer `storm`) of one storm.
enum Line {
    Rabbit {
        connection: Connection,
        channel: lapin::Channel,
        queue: String,
    },
    Nats {
        context: jetstream::Context,
        stream: String,
    },
}

impl Line {
    async fn open(broker: Broker, name: &str) -> Self {
        match broker {
            Broker::Rabbit => {
                let connection = rabbit().await;
                let channel = connection.create_channel().await.unwrap();
                let mut arguments = FieldTable::default();
                arguments.insert("x-expires".into(), AMQPValue::LongUInt(1_800_000));
                channel
                    .queue_declare(name.into(), QueueDeclareOptions::default(), arguments)
                    .await
                    .unwrap();
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                Self::Rabbit {
                    connection,
                    channel,
                    queue: name.to_owned(),
                }
            }
            Broker::Nats => {
                let context = nats().await;
                let stream = context
                    .create_stream(jetstream::stream::Config {
                        name: name.to_owned(),
                        subjects: ["in", "parked", "dead"]
                            .map(|tail| format!("{name}.{tail}"))
                            .to_vec(),
                        max_age: Duration::from_secs(1800),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                // As `JetStreamConsumer::pull_config` makes it for 16 slots,
                // with a 2 s ack wait (twice the storm's 1 s lease).
                stream
                    .create_consumer(jetstream::consumer::pull::Config {
                        durable_name: Some("storm".to_owned()),
                        filter_subject: format!("{name}.in"),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(2),
                        max_ack_pending: 64,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                Self::Nats {
                    context,
                    stream: name.to_owned(),
                }
            }
        }
    }

    /// Publishes order `n` (its key `order-<n>`), confirmed.
    async fn publish(&self, n: usize) {
        let payload = format!("{{\"order\":{n}}}");
        match self {
            Self::Rabbit { channel, queue, .. } => {
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        payload.as_bytes(),
                        BasicProperties::default().with_message_id(format!("order-{n}").into()),
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            Self::Nats { context, stream } => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("order-{n}").as_str());
                context
                    .publish_with_headers(format!("{stream}.in"), headers, payload.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
        }
    }

    /// What a consumer process needs to reach the broker.
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Rabbit { .. } => vec![
                ("BROKER", "rabbitmq".to_owned()),
                ("AMQP_URL", idempotency_tests::broker_server::amqp_url()),
            ],
            Self::Nats { .. } => vec![
                ("BROKER", "nats".to_owned()),
                ("NATS_URL", idempotency_tests::broker_server::nats_url()),
            ],
        }
    }

    /// Messages not yet settled: ready in the queue (RabbitMQ), or pending
    /// and unacknowledged (JetStream).
    async fn outstanding(&self) -> u64 {
        match self {
            Self::Rabbit {
                connection, queue, ..
            } => u64::from(ready(connection, queue).await),
            Self::Nats { context, stream } => {
                let mut consumer: jetstream::consumer::PullConsumer = context
                    .get_stream(stream)
                    .await
                    .unwrap()
                    .get_consumer("storm")
                    .await
                    .unwrap();
                let info = consumer.info().await.unwrap();
                info.num_pending + info.num_ack_pending as u64
            }
        }
    }

    /// How many messages are set aside under `tail` (`parked`, `dead`).
    async fn set_aside_count(&self, tail: &str) -> usize {
        match self {
            Self::Rabbit {
                connection, queue, ..
            } => ready(connection, &format!("{queue}.{tail}")).await as usize,
            Self::Nats { context, stream } => {
                let mut consumer: jetstream::consumer::PullConsumer = context
                    .get_stream(stream)
                    .await
                    .unwrap()
                    .create_consumer(jetstream::consumer::pull::Config {
                        filter_subject: format!("{stream}.{tail}"),
                        ack_policy: jetstream::consumer::AckPolicy::None,
                        inactive_threshold: Duration::from_secs(5),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let pending = consumer.info().await.unwrap().num_pending;
                usize::try_from(pending).unwrap()
            }
        }
    }

    /// The keys of the messages set aside under `tail` (`parked`, `dead`).
    async fn set_aside(&self, tail: &str) -> Vec<String> {
        match self {
            Self::Rabbit {
                connection, queue, ..
            } => {
                let from = format!("{queue}.{tail}");
                if ready(connection, &from).await == 0 {
                    // Also when the queue does not exist (the guard off).
                    return Vec::new();
                }
                // One message at a time (`basic.get`): a consumer would be
                // sent every message, those parked while it reads included,
                // and lose the ones it had not read when it closes.
                let channel = connection.create_channel().await.unwrap();
                let options = BasicGetOptions { no_ack: true };
                let mut keys = Vec::new();
                while let Ok(Some(message)) = channel.basic_get(from.as_str().into(), options).await
                {
                    keys.push(
                        message
                            .delivery
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|id| id.to_string())
                            .unwrap_or_default(),
                    );
                }
                let _ = channel.close(200, "done".into()).await;
                keys
            }
            Self::Nats { context, stream } => {
                let consumer: jetstream::consumer::PullConsumer = context
                    .get_stream(stream)
                    .await
                    .unwrap()
                    .create_consumer(jetstream::consumer::pull::Config {
                        filter_subject: format!("{stream}.{tail}"),
                        ack_policy: jetstream::consumer::AckPolicy::None,
                        inactive_threshold: Duration::from_secs(5),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let mut messages = consumer
                    .fetch()
                    .max_messages(100_000)
                    .messages()
                    .await
                    .unwrap();
                let mut keys = Vec::new();
                while let Ok(Some(Ok(message))) =
                    tokio::time::timeout(Duration::from_secs(2), messages.next()).await
                {
                    // The consumer's copies keep the original id in this header.
                    let original = "Idempotency-Msg-Id";
                    keys.push(
                        message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get(original))
                            .map(|value| value.as_str().to_owned())
                            .unwrap_or_default(),
                    );
                }
                keys
            }
        }
    }

    async fn delete(&self) {
        match self {
            Self::Rabbit { channel, queue, .. } => {
                for name in [
                    queue.clone(),
                    format!("{queue}.dead"),
                    format!("{queue}.parked"),
                ] {
                    let _ = channel
                        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
            }
            Self::Nats { context, stream } => {
                let _ = context.delete_stream(stream).await;
            }
        }
    }
}

/// What one storm left behind.
struct Outcome {
    /// Effects per key.
    effects: HashMap<String, i64>,
    /// Keys of parked messages.
    parked: Vec<String>,
    /// Messages set aside as dead letters.
    dead: usize,
    /// How many times a consumer was killed.
    kills: usize,
    /// The queue or stream (the records' scope).
    queue: String,
    /// The longest pause between two effects, in seconds.
    longest_pause: f64,
    /// The database of the effects (and of the records on PostgreSQL), kept
    /// until the outcome is dropped.
    database: Option<idempotency_tests::TestDatabase>,
    /// The SQLite store's directory, kept until the outcome is dropped.
    _sqlite_dir: Option<tempfile::TempDir>,
}

/// The store a storm keeps its records in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Records {
    /// The effects' PostgreSQL database.
    Postgres,
    /// A key prefix of the test Redis.
    Redis,
    /// A SQLite file shared by the consumer processes.
    Sqlite,
}

/// Runs one storm: publishes the messages, kills the consumer `kills`
/// times right after an effect (a second consumer competes during the
/// first life, and is killed at its end), then lets a last consumer drain.
async fn storm(broker: Broker, mode: &str, records: Records) -> Outcome {
    let messages = messages();
    let kills = setting("STORM_KILLS", 3);
    let database = idempotency_tests::postgres_database().await;
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    sqlx::query(
        "create table storm_effects (key text not null, at timestamptz not null default clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let redis_prefix = format!("storm-{}:", uuid::Uuid::new_v4().simple());
    let sqlite_dir = tempfile::tempdir().unwrap();
    let store_url = match records {
        Records::Postgres => database.url.clone(),
        Records::Redis => idempotency_tests::fixtures::redis_url(),
        Records::Sqlite => format!(
            "sqlite://{}?mode=rwc",
            sqlite_dir.path().join("records.db").display()
        ),
    };
    let queue = format!("storm_{}", uuid::Uuid::new_v4().simple());
    let line = Line::open(broker, &queue).await;
    for n in 0..messages {
        line.publish(n).await;
    }
    let start = |crash_at: usize| -> Child {
        let mut command = Command::new(programs::path(Program::StormConsumer));
        command
            .envs(line.env())
            .env("QUEUE", &queue)
            .env("EFFECTS_URL", &database.url)
            .env("MODE", mode)
            .env("STORE_URL", &store_url)
            .env("REDIS_PREFIX", &redis_prefix)
            .env("CRASH_AT", crash_at.to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command.spawn().expect("start the storm consumer")
    };
    // Kill points spread over the run: each one a random effect count.
    let per_life = (messages / (kills + 1) / 2).max(2);
    let mut competitor = (mode != "off").then(|| start(0));
    let mut killed = 0;
    for _ in 0..kills {
        let crash_at =
            1 + usize::try_from(uuid::Uuid::new_v4().as_u128() % per_life as u128).unwrap();
        let mut child = start(crash_at);
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .expect("the consumer reached its kill point")
            .unwrap();
        assert!(!status.success(), "the consumer was killed, not done");
        killed += 1;
        if let Some(mut competitor) = competitor.take() {
            // The competitor dies too, wherever it is.
            let _ = competitor.kill().await;
            killed += 1;
        }
    }
    // The last life drains.
    let mut last = start(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    // The keys parked so far: read from RabbitMQ's parking queue as they
    // come (reading takes them out), from JetStream's stream again each time.
    let mut parked_seen: Vec<String> = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let applied: Vec<String> = sqlx::query_scalar("select distinct key from storm_effects")
            .fetch_all(&pool)
            .await
            .unwrap();
        if line.set_aside_count("parked").await > 0 {
            parked_seen.extend(line.set_aside("parked").await);
            parked_seen.sort();
            parked_seen.dedup();
        }
        // A key both applied and parked (its effect ran, then its consumer
        // died before the completion) counts once; so do two parked copies.
        // RabbitMQ's count leaves out the messages a consumer holds
        // unacknowledged: the union is what says every message was seen to.
        let settled: HashSet<&String> = applied.iter().chain(&parked_seen).collect();
        let (effects, parked) = (applied.len(), parked_seen.len());
        if settled.len() >= messages && line.outstanding().await == 0 {
            // Let requeued copies come back and be answered.
            tokio::time::sleep(Duration::from_secs(3)).await;
            if line.outstanding().await == 0 {
                break;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let missing: Vec<String> = (0..messages)
                .map(|n| format!("order-{n}"))
                .filter(|key| !settled.contains(key))
                .take(10)
                .collect();
            panic!(
                "the storm did not settle: {effects} effects, {parked} parked, {} seen to of {messages}; \
                 {} outstanding, {} dead; missing (first 10): {missing:?}",
                settled.len(),
                line.outstanding().await,
                line.set_aside_count("dead").await,
            );
        }
    }
    let _ = last.kill().await;
    let rows: Vec<(String, i64)> =
        sqlx::query_as("select key, count(*) from storm_effects group by key")
            .fetch_all(&pool)
            .await
            .unwrap();
    let (p90, p100, longest_pause): (f64, f64, f64) = sqlx::query_as(
        "with t as (select extract(epoch from at - min(at) over ())::float8 as s from storm_effects), \
              g as (select s - lag(s) over (order by s) as gap from t) \
         select (select percentile_cont(0.9) within group (order by s) from t), \
                (select max(s) from t), \
                coalesce((select max(gap) from g), 0)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    println!(
        "{broker:?} x {records:?}, {mode}: drain: 90 % of the effects by {p90:.2} s, 100 % by {p100:.2} s \
         ({:.2}x), longest pause between two effects {longest_pause:.2} s",
        if p90 > 0.0 { p100 / p90 } else { 0.0 }
    );
    let mut parked = parked_seen;
    parked.extend(line.set_aside("parked").await);
    // A key parked twice (two copies of one abandoned message) counts once.
    parked.sort();
    parked.dedup();
    let dead = line.set_aside("dead").await.len();
    line.delete().await;
    pool.close().await;
    if records == Records::Redis {
        let url = store_url.clone();
        let prefix = redis_prefix.clone();
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
    Outcome {
        effects: rows.into_iter().collect(),
        parked,
        dead,
        kills: killed,
        queue,
        longest_pause,
        database: Some(database),
        _sqlite_dir: Some(sqlite_dir),
    }
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

fn duplicated(outcome: &Outcome) -> usize {
    outcome.effects.values().filter(|n| **n > 1).count()
}

/// The transactional inbox (PostgreSQL): every message exactly once, and
/// nothing parked, whatever the kills.
async fn transactional(broker: Broker, mode: &str) {
    let outcome = storm(broker, mode, Records::Postgres).await;
    println!(
        "{broker:?}, {mode} inbox: {} keys, {} duplicated, {} parked, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.parked.len(),
        outcome.kills
    );
    assert_eq!(
        outcome.effects.len(),
        messages(),
        "every message had its effect"
    );
    assert_eq!(duplicated(&outcome), 0, "no message had two");
    assert!(
        outcome.parked.is_empty(),
        "nothing is unknown in transactional mode: {:?}",
        outcome.parked
    );
    assert_eq!(outcome.dead, 0);
    assert_drained(&outcome);
}

/// Nothing stalled behind a dead consumer: its messages came back within
/// seconds (JetStream: the 2 s ack wait; RabbitMQ: at once), its keys
/// lapsed with the 1 s lease.
fn assert_drained(outcome: &Outcome) {
    assert!(
        outcome.longest_pause < 10.0,
        "the effects paused for {:.1} s: something waited behind a dead consumer",
        outcome.longest_pause
    );
}

async fn default_mode(broker: Broker, records: Records) -> Outcome {
    let outcome = storm(broker, "default", records).await;
    let messages = messages();
    println!(
        "{broker:?} x {records:?}, default mode: {} keys with an effect, {} duplicated, {} parked, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.parked.len(),
        outcome.kills
    );
    assert_eq!(duplicated(&outcome), 0, "no message's effect applied twice");
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
    assert_drained(&outcome);
    drop(parked);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_transactional_inbox_applies_every_message_exactly_once() {
    transactional(Broker::Rabbit, "transactional").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_nats_transactional_inbox_applies_every_message_exactly_once() {
    transactional(Broker::Nats, "transactional").await;
}

/// The inbox in single-commit mode: the key held by an advisory lock, the
/// claim, the effect and the outcome committed once; a kill leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_single_commit_inbox_applies_every_message_exactly_once() {
    transactional(Broker::Rabbit, "single-commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_nats_single_commit_inbox_applies_every_message_exactly_once() {
    transactional(Broker::Nats, "single-commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_default_mode_on_postgres_never_applies_twice() {
    let outcome = default_mode(Broker::Rabbit, Records::Postgres).await;
    // Each timed kill came right after an effect, before its settle: that
    // message's key was abandoned, parked, counted.
    assert!(
        outcome.parked.len() >= outcome.kills - 1,
        "{} parked for {} kills",
        outcome.parked.len(),
        outcome.kills
    );
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
    default_mode(Broker::Rabbit, Records::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_default_mode_on_sqlite_never_applies_twice() {
    default_mode(Broker::Rabbit, Records::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_nats_default_mode_on_postgres_never_applies_twice() {
    default_mode(Broker::Nats, Records::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_nats_default_mode_on_redis_never_applies_twice() {
    default_mode(Broker::Nats, Records::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_nats_default_mode_on_sqlite_never_applies_twice() {
    default_mode(Broker::Nats, Records::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_storm_without_the_guard_counts_duplicates() {
    let outcome = storm(Broker::Rabbit, "off", Records::Postgres).await;
    println!(
        "guard off: {} keys, {} duplicated, {} kills",
        outcome.effects.len(),
        duplicated(&outcome),
        outcome.kills
    );
    // Every kill came right after an effect and before its ack: the
    // redelivery applied it again (one key twice, or more when the next
    // life died right after that same redelivery). The harness sees it.
    let extra: i64 = outcome.effects.values().map(|n| n - 1).sum();
    assert!(
        usize::try_from(extra).unwrap() >= outcome.kills,
        "{extra} extra effects for {} kills",
        outcome.kills
    );
}
