//! Orders from a NATS JetStream stream, each handled once per
//! `Nats-Msg-Id` however often JetStream delivers it
//! (`idempotency-consumer` over this crate's engine, records in SQLite by
//! default).
//!
//! ```text
//! PUBLISH=3 cargo run -p idempotency-consumer --example orders-consumer-nats
//! ```
//!
//! Environment: `NATS_URL` (default `127.0.0.1:4222`), `STREAM` (default
//! `ORDERS`, subjects `ORDERS.>`: work on `ORDERS.new`, set-aside copies
//! on `ORDERS.dead` and `ORDERS.parked`), `DATABASE_URL` (default
//! `sqlite://orders-consumer.db?mode=rwc`), `STORE` (`sql`, `redis` or
//! `tiered`, with `REDIS_URL`), `LEASE_SECS` (default 60: how long a killed
//! consumer's keys stay in flight), `CONCURRENCY` (default 16), `PUBLISH` (publish that many
//! demo orders, then the same orders again once JetStream's own short
//! deduplication window has passed). Ctrl-C stops it.

#[path = "orders_inbox/mod.rs"]
mod orders_inbox;

use std::time::Duration;

use idempotency_consumer::nats::JetStreamConsumer;
use idempotency_consumer::nats::async_nats::{self, jetstream};
use idempotency_consumer::{Inbox, KeySource};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orders_inbox::main("orders-consumer-nats", run).await
}

async fn run(settings: orders_inbox::Settings) -> anyhow::Result<()> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let stream = std::env::var("STREAM").unwrap_or_else(|_| "ORDERS".to_owned());
    let store = settings.open().await?;
    let (lease, concurrency) = (settings.lease, settings.concurrency);
    let context = jetstream::new(async_nats::connect(&url).await?);
    let js_stream = context
        .get_or_create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            // JetStream's own deduplication window is short on purpose here:
            // the guard deduplicates for its whole retention (24 h).
            duplicate_window: Duration::from_secs(1),
            ..Default::default()
        })
        .await?;
    let inbox = Inbox::new(orders_inbox::engine(store, lease).await?);
    let drain = inbox.engine().drain();
    let adapter = JetStreamConsumer::new(inbox, stream.as_str(), context.clone())
        .with_key(KeySource::MessageId)
        .with_concurrency(concurrency);
    // The adapter's settings: a short ack wait (kept alive by heartbeats
    // while a message is in hand) and a few messages in hand per slot.
    let consumer = js_stream
        .get_or_create_consumer(
            "orders-consumer",
            jetstream::consumer::pull::Config {
                filter_subject: format!("{stream}.new"),
                ..adapter.pull_config("orders-consumer")
            },
        )
        .await?;
    let publish: u32 = std::env::var("PUBLISH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    for round in 0..2 {
        if round == 1 && publish > 0 {
            // Past JetStream's window: only the guard catches these.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        for n in 1..=publish {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("order-{n}"));
            let body = format!(r#"{{"order_id":"order-{n}","amount":{}}}"#, n * 100);
            context
                .publish_with_headers(format!("{stream}.new"), headers, body.into())
                .await?
                .await?;
        }
    }
    println!(
        "consuming {stream}.new (records: {}); Ctrl-C to stop",
        settings.describe()
    );
    adapter
        .run(consumer, orders_inbox::handle, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    drain.wait().await;
    Ok(())
}
