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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orders_inbox::main("orders-consumer", run).await
}

async fn run(settings: orders_inbox::Settings) -> anyhow::Result<()> {
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let store = settings.open().await?;
    let (lease, concurrency) = (settings.lease, settings.concurrency);
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
        "consuming {queue} (records: {}); Ctrl-C to stop",
        settings.describe()
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
