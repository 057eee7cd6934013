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
use idempotency_guard::store::{AnyStore, StoreKind, StoreOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let stream = std::env::var("STREAM").unwrap_or_else(|_| "ORDERS".to_owned());
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
        .with_concurrency(usize::try_from(concurrency).unwrap_or(usize::MAX));
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
        "consuming {stream}.new (records: STORE={kind:?}, DATABASE_URL={database}); Ctrl-C to stop"
    );
    adapter
        .run(consumer, orders_inbox::handle, async {
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
