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
//! `sqlite://orders-consumer.db?mode=rwc`), `PUBLISH` (publish that many
//! demo orders, then the same orders again once JetStream's own short
//! deduplication window has passed). Ctrl-C stops it.

use std::time::Duration;

use idempotency_consumer::nats::JetStreamConsumer;
use idempotency_consumer::nats::async_nats::{self, jetstream};
use idempotency_consumer::{Inbox, Incoming, KeySource};
use idempotency_guard::Engine;
use idempotency_guard::engine::RunContext;
use idempotency_guard::store::AnyStore;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let stream = std::env::var("STREAM").unwrap_or_else(|_| "ORDERS".to_owned());
    let database = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "sqlite://orders-consumer.db?mode=rwc".to_owned());
    let store = AnyStore::connect(&database).await?;
    store.migrate().await?;
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
    let consumer = js_stream
        .get_or_create_consumer(
            "orders-consumer",
            jetstream::consumer::pull::Config {
                durable_name: Some("orders-consumer".to_owned()),
                filter_subject: format!("{stream}.new"),
                ..Default::default()
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
    println!("consuming {stream}.new (records in {database}); Ctrl-C to stop");
    let inbox = Inbox::new(Engine::new(store));
    let drain = inbox.engine().drain();
    JetStreamConsumer::new(inbox, stream.as_str(), context.clone())
        .with_key(KeySource::MessageId)
        .run(
            consumer,
            |order: Incoming, _run: RunContext| async move {
                println!(
                    "order {} handled: {}",
                    order.key,
                    String::from_utf8_lossy(&order.payload)
                );
                Ok::<(), std::convert::Infallible>(())
            },
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
    drain.wait().await;
    Ok(())
}
