//! A consumer process for the redelivery storm (`tests/e2e/consumer_storm.rs`,
//! which builds and starts it): it consumes a RabbitMQ queue or a NATS JetStream stream, applies one
//! effect per message (a row in `storm_effects` of a PostgreSQL database),
//! and kills itself with SIGKILL right after its `CRASH_AT`-th effect,
//! before that message's ack.
//!
//! Environment: `BROKER` (`rabbitmq`, the default, or `nats`), `AMQP_URL`
//! or `NATS_URL`, `QUEUE` (the queue, or the stream whose durable pull
//! consumer `storm` the test created), `EFFECTS_URL` (PostgreSQL with the
//! `storm_effects` table), `MODE` (`transactional`: the inbox on
//! PostgreSQL, effect in the run's transaction; `single-commit`: the same
//! in single-commit mode, the key held by an advisory lock and claim,
//! effect and outcome committed once; `default`: the guard,
//! effect committed at once; `off`: no guard, RabbitMQ only), `STORE_URL`
//! (`postgres://`, `redis://` or `sqlite:`), `REDIS_PREFIX`, `CRASH_AT`
//! (0: never), `LEASE_MS` (the engine's lease; default 1,000).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt;
use idempotency_consumer::nats::JetStreamConsumer;
use idempotency_consumer::nats::async_nats::{self, jetstream::consumer::PullConsumer};
use idempotency_consumer::rabbitmq::RabbitConsumer;
use idempotency_consumer::rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions,
};
use idempotency_consumer::rabbitmq::lapin::types::FieldTable;
use idempotency_consumer::rabbitmq::lapin::{Connection, ConnectionProperties};
use idempotency_consumer::{Inbox, Incoming};
use idempotency_guard::engine::RunContext;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::{Engine, Store};
use sqlx::PgPool;

/// The settings, from the environment.
struct Settings {
    broker: String,
    broker_url: String,
    queue: String,
    lease: Duration,
    mode: String,
    store_url: String,
    redis_prefix: String,
    crash_at: u64,
}

fn env(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

/// Counts effects and kills the process right after the `crash_at`-th.
#[derive(Clone)]
struct Crash {
    effects: Arc<AtomicU64>,
    at: u64,
}

impl Crash {
    fn after_effect(&self) {
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.at {
            // SIGKILL, not a clean exit: no ack, no settle, no drain.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &std::process::id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

async fn insert(connection: &mut sqlx::PgConnection, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query("insert into storm_effects (key) values ($1)")
        .bind(key)
        .execute(connection)
        .await
        .map(|_| ())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let broker = std::env::var("BROKER").unwrap_or_else(|_| "rabbitmq".to_owned());
    let broker_url = match broker.as_str() {
        "rabbitmq" => env("AMQP_URL")?,
        "nats" => env("NATS_URL")?,
        other => anyhow::bail!("BROKER must be rabbitmq or nats, not {other}"),
    };
    let settings = Settings {
        broker,
        broker_url,
        queue: env("QUEUE")?,
        lease: Duration::from_millis(
            std::env::var("LEASE_MS")
                .ok()
                .map(|ms| ms.parse())
                .transpose()?
                .unwrap_or(1000),
        ),
        mode: env("MODE")?,
        store_url: std::env::var("STORE_URL").unwrap_or_default(),
        redis_prefix: std::env::var("REDIS_PREFIX").unwrap_or_default(),
        crash_at: env("CRASH_AT")?.parse()?,
    };
    let effects = PgPool::connect(&env("EFFECTS_URL")?).await?;
    let crash = Crash {
        effects: Arc::new(AtomicU64::new(0)),
        at: settings.crash_at,
    };
    match settings.mode.as_str() {
        "off" => {
            anyhow::ensure!(
                settings.broker == "rabbitmq",
                "MODE=off is for RabbitMQ only"
            );
            let connection =
                Connection::connect(&settings.broker_url, ConnectionProperties::default()).await?;
            unguarded(&connection, &settings.queue, effects, crash).await
        }
        mode @ ("transactional" | "single-commit") => {
            let store = PostgresStore::connect(&settings.store_url, 16).await?;
            store.migrate().await?;
            let engine = engine(store, settings.lease)
                .with_transactional_mode(true)
                .with_transactional_claims(true)
                .with_single_commit(mode == "single-commit");
            let handler = move |message: Incoming, run: RunContext| {
                let crash = crash.clone();
                async move {
                    let mut tx = run.tx().await.map_err(|error| error.to_string())?;
                    insert(&mut tx, &message.key)
                        .await
                        .map_err(|error| error.to_string())?;
                    crash.after_effect();
                    Ok::<(), String>(())
                }
            };
            consume(engine, &settings, handler).await
        }
        "default" => {
            let handler = move |message: Incoming, _run: RunContext| {
                let effects = effects.clone();
                let crash = crash.clone();
                async move {
                    let mut connection =
                        effects.acquire().await.map_err(|error| error.to_string())?;
                    insert(&mut connection, &message.key)
                        .await
                        .map_err(|error| error.to_string())?;
                    crash.after_effect();
                    Ok::<(), String>(())
                }
            };
            if settings.store_url.starts_with("redis") {
                let store =
                    RedisStore::connect(&settings.store_url, &settings.redis_prefix).await?;
                consume(engine(store, settings.lease), &settings, handler).await
            } else if settings.store_url.starts_with("sqlite") {
                let store = SqliteStore::connect(&settings.store_url).await?;
                store.migrate().await?;
                consume(engine(store, settings.lease), &settings, handler).await
            } else {
                let store = PostgresStore::connect(&settings.store_url, 16).await?;
                store.migrate().await?;
                consume(engine(store, settings.lease), &settings, handler).await
            }
        }
        other => {
            anyhow::bail!("MODE must be transactional, single-commit, default or off, not {other}")
        }
    }
}

/// A short lease (1 s by default), so a killed consumer's keys lapse soon.
fn engine<S: Store>(store: S, lease: Duration) -> Engine<S> {
    Engine::new(store)
        .with_lease(lease)
        .with_retry_after(Duration::from_millis(200))
}

async fn consume<S, H, Fut>(
    engine: Engine<S>,
    settings: &Settings,
    handler: H,
) -> anyhow::Result<()>
where
    S: Store,
    H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let inbox = Inbox::new(engine).with_retry_delay(Duration::from_millis(100));
    if settings.broker == "nats" {
        let client = async_nats::connect(&settings.broker_url).await?;
        let context = async_nats::jetstream::new(client);
        let pull: PullConsumer = context
            .get_stream(&settings.queue)
            .await?
            .get_consumer("storm")
            .await
            .map_err(|error| anyhow::anyhow!("the durable consumer storm: {error}"))?;
        JetStreamConsumer::new(inbox, settings.queue.as_str(), context)
            .with_concurrency(16)
            .run(pull, handler, std::future::pending())
            .await?;
    } else {
        let connection =
            Connection::connect(&settings.broker_url, ConnectionProperties::default()).await?;
        RabbitConsumer::new(inbox, settings.queue.as_str())
            .with_concurrency(16)
            .run(&connection, handler, std::future::pending())
            .await?;
    }
    Ok(())
}

/// The same work without the guard: effect, then ack.
async fn unguarded(
    connection: &Connection,
    queue: &str,
    effects: PgPool,
    crash: Crash,
) -> anyhow::Result<()> {
    let channel = connection.create_channel().await?;
    channel.basic_qos(16, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let key = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned())
            .unwrap_or_default();
        let mut connection = effects.acquire().await?;
        insert(&mut connection, &key).await?;
        crash.after_effect();
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}
