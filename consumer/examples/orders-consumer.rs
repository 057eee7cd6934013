//! Orders from a RabbitMQ queue, each handled once per message id however
//! often the broker delivers it (`idempotency-consumer` over this crate's
//! engine, records in SQLite by default).
//!
//! ```text
//! PUBLISH=3 cargo run -p idempotency-consumer --example orders-consumer
//! ```
//!
//! Environment: `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`),
//! `QUEUE` (default `orders`), `DATABASE_URL` (default
//! `sqlite://orders-consumer.db?mode=rwc`; `postgres://...` works too),
//! `STORE` (`sql`, `redis` or `tiered`, with `REDIS_URL`), `LEASE_SECS`
//! (default 60: how long a killed consumer's keys stay in flight),
//! `CONCURRENCY` (default 16),
//! `PUBLISH` (publish that many demo orders, each twice, before consuming).
//! Ctrl-C stops it after the orders in hand are done.

#[path = "orders_inbox/mod.rs"]
mod orders_inbox;

use idempotency_consumer::rabbitmq::RabbitConsumer;
use idempotency_consumer::rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idempotency_consumer::rabbitmq::lapin::types::FieldTable;
use idempotency_consumer::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idempotency_consumer::{Inbox, KeySource};
use idempotency_guard::store::{AnyStore, StoreKind, StoreOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let database = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://orders-consumer.db?mode=rwc".to_owned());
    // STORE=sql (DATABASE_URL), redis or tiered (REDIS_URL, REDIS_PREFIX).
    let kind: StoreKind = std::env::var("STORE")
        .unwrap_or_else(|_| "sql".to_owned())
        .parse()
        .map_err(|error: String| anyhow::anyhow!("STORE: {error}"))?;
    let redis_url = std::env::var("REDIS_URL").ok();
    if kind != StoreKind::Sql && redis_url.is_none() {
        anyhow::bail!("STORE={kind:?} needs REDIS_URL (a redis:// URL)");
    }
    let prefix = std::env::var("REDIS_PREFIX").unwrap_or_else(|_| "orders".to_owned());
    let store = AnyStore::open(&StoreOptions {
        kind,
        database_url: &database,
        redis_url: redis_url.as_deref(),
        redis_prefix: &prefix,
        notifications: false,
        encryption: None,
    })
    .await?;
    // How long a killed consumer's keys stay in flight before they turn
    // abandoned (and are parked): the engine's lease.
    let lease = std::time::Duration::from_secs(number("LEASE_SECS", 60)?);
    let concurrency = number("CONCURRENCY", 16)?;
    store.migrate().await?;
    let connection = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, FieldTable::default())
        .await?;
    let publish: u32 = std::env::var("PUBLISH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    for n in 1..=publish {
        // Each order twice: the second is the broker's redelivery, or the
        // producer's retry.
        for _ in 0..2 {
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    format!(r#"{{"order_id":"order-{n}","amount":{}}}"#, n * 100).as_bytes(),
                    BasicProperties::default().with_message_id(format!("order-{n}").into()),
                )
                .await?
                .await?;
        }
    }
    println!(
        "consuming {queue} (records: STORE={kind:?}, DATABASE_URL={database}); Ctrl-C to stop"
    );
    let inbox = Inbox::new(orders_inbox::engine(store, lease).await?);
    let drain = inbox.engine().drain();
    RabbitConsumer::new(inbox, queue.as_str())
        .with_key(KeySource::MessageId)
        .with_concurrency(u16::try_from(concurrency).unwrap_or(u16::MAX))
        .run(&connection, orders_inbox::handle, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    drain.wait().await;
    Ok(())
}

/// A whole number from the environment, or `default` when unset.
fn number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .map_err(|_| anyhow::anyhow!("{name} must be a whole number, not {value:?}")),
        Err(_) => Ok(default),
    }
}
