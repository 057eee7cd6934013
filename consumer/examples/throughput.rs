//! Messages per second through the consumers, with and without the guard,
//! per broker and store; prints a Markdown table (the one in
//! `docs/BENCHMARKS.md`).
//!
//! ```text
//! cargo run --release -p idempotency-consumer --example throughput            # 5,000 messages per cell
//! MESSAGES=20000 cargo run --release -p idempotency-consumer --example throughput
//! ```
//!
//! Each cell: a fresh queue (or stream) holding `MESSAGES` messages with
//! distinct keys, then one consumer (16 at a time, a handler that does
//! nothing) from its start until the last message is handled. Needs
//! RabbitMQ, NATS (JetStream), PostgreSQL and Redis on their usual ports.
//!
//! A second table: executions per second on RabbitMQ × PostgreSQL with a
//! handler that takes 20 ms, when no message has a copy and when 30 % of
//! the messages have a copy published right behind them (a copy waits for
//! its twin without holding a handler slot, then is answered from the
//! stored outcome).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idempotency_consumer::nats::JetStreamConsumer;
use idempotency_consumer::nats::async_nats::{self, jetstream};
use idempotency_consumer::rabbitmq::RabbitConsumer;
use idempotency_consumer::rabbitmq::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idempotency_consumer::rabbitmq::lapin::types::FieldTable;
use idempotency_consumer::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idempotency_consumer::{Inbox, Incoming};
use idempotency_guard::engine::RunContext;
use idempotency_guard::{Engine, Store};
use tokio::sync::Notify;

const CONCURRENCY: u16 = 16;

/// Counts handled messages and wakes the timer at the last one.
#[derive(Clone)]
struct Counter {
    handled: Arc<AtomicUsize>,
    target: usize,
    done: Arc<Notify>,
}

impl Counter {
    fn new(target: usize) -> Self {
        Self {
            handled: Arc::new(AtomicUsize::new(0)),
            target,
            done: Arc::new(Notify::new()),
        }
    }

    fn handled(&self) {
        if self.handled.fetch_add(1, Ordering::SeqCst) + 1 == self.target {
            self.done.notify_one();
        }
    }
}

fn handler(
    counter: Counter,
) -> impl Fn(Incoming, RunContext) -> std::future::Ready<Result<(), String>> + Send + Sync + 'static
{
    move |_message, _run| {
        counter.handled();
        std::future::ready(Ok(()))
    }
}

/// A handler that works for `pause` before it counts the execution.
fn slow_handler(
    counter: Counter,
    pause: Duration,
) -> impl Fn(Incoming, RunContext) -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
+ Send
+ Sync
+ 'static {
    move |_message, _run| {
        let counter = counter.clone();
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            counter.handled();
            Ok(())
        })
    }
}

async fn rabbit_queue(messages: usize) -> anyhow::Result<(Connection, String)> {
    rabbit_queue_with_copies(messages, 0).await
}

/// A queue of `messages` distinct keys; the first `percent_copied` of
/// every hundred have a copy published right behind them.
async fn rabbit_queue_with_copies(
    messages: usize,
    percent_copied: usize,
) -> anyhow::Result<(Connection, String)> {
    let connection = Connection::connect(
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        ConnectionProperties::default(),
    )
    .await?;
    let queue = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut confirms = Vec::with_capacity(messages);
    for n in 0..messages {
        let copies = if n % 100 < percent_copied { 2 } else { 1 };
        for _ in 0..copies {
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    format!("{{\"order\":{n}}}").as_bytes(),
                    BasicProperties::default().with_message_id(format!("order-{n}").into()),
                )
                .await?;
            confirms.push(confirm);
        }
    }
    for confirm in confirms {
        confirm.await?;
    }
    Ok((connection, queue))
}

async fn delete_rabbit(connection: &Connection, queue: &str) -> anyhow::Result<()> {
    let channel = connection.create_channel().await?;
    for name in [
        queue.to_owned(),
        format!("{queue}.dead"),
        format!("{queue}.parked"),
    ] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    Ok(())
}

/// RabbitMQ, through the guard on `store` (or without it).
async fn rabbit<S: Store>(store: Option<S>, messages: usize) -> anyhow::Result<f64> {
    let (connection, queue) = rabbit_queue(messages).await?;
    let counter = Counter::new(messages);
    let started = Instant::now();
    let done = counter.done.clone();
    match store {
        Some(store) => {
            let consumer = RabbitConsumer::new(Inbox::new(Engine::new(store)), queue.as_str())
                .with_concurrency(CONCURRENCY);
            consumer
                .run(&connection, handler(counter), async move {
                    done.notified().await
                })
                .await?;
        }
        None => {
            let channel = connection.create_channel().await?;
            channel
                .basic_qos(CONCURRENCY, BasicQosOptions::default())
                .await?;
            let deliveries = channel
                .basic_consume(
                    queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            deliveries
                .take_until(done.notified())
                .for_each_concurrent(usize::from(CONCURRENCY), |delivery| {
                    let counter = counter.clone();
                    async move {
                        if let Ok(delivery) = delivery {
                            counter.handled();
                            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
                        }
                    }
                })
                .await;
        }
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    delete_rabbit(&connection, &queue).await?;
    Ok(rate)
}

/// Executions per second on RabbitMQ through the guard on `store`, with a
/// handler that takes `pause`, when `percent_copied` of the messages have
/// a copy right behind them.
async fn rabbit_with_copies<S: Store>(
    store: S,
    messages: usize,
    percent_copied: usize,
    pause: Duration,
) -> anyhow::Result<f64> {
    let (connection, queue) = rabbit_queue_with_copies(messages, percent_copied).await?;
    let counter = Counter::new(messages);
    let started = Instant::now();
    let done = counter.done.clone();
    RabbitConsumer::new(Inbox::new(Engine::new(store)), queue.as_str())
        .with_concurrency(CONCURRENCY)
        .run(&connection, slow_handler(counter, pause), async move {
            done.notified().await
        })
        .await?;
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    delete_rabbit(&connection, &queue).await?;
    Ok(rate)
}

/// NATS JetStream, through the guard on `store` (or without it).
async fn nats<S: Store>(store: Option<S>, messages: usize) -> anyhow::Result<f64> {
    let context = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
    let name = format!("BENCH_{}", uuid::Uuid::new_v4().simple());
    let stream = context
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await?;
    let mut acks = Vec::with_capacity(messages);
    for n in 0..messages {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("order-{n}"));
        acks.push(
            context
                .publish_with_headers(
                    format!("{name}.in"),
                    headers,
                    format!("{{\"order\":{n}}}").into(),
                )
                .await?,
        );
    }
    for ack in acks {
        ack.await?;
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("bench".to_owned()),
            filter_subject: format!("{name}.in"),
            ..Default::default()
        })
        .await?;
    let counter = Counter::new(messages);
    let started = Instant::now();
    let done = counter.done.clone();
    match store {
        Some(store) => {
            JetStreamConsumer::new(
                Inbox::new(Engine::new(store)),
                name.as_str(),
                context.clone(),
            )
            .with_concurrency(usize::from(CONCURRENCY))
            .run(
                consumer,
                handler(counter),
                async move { done.notified().await },
            )
            .await?;
        }
        None => {
            let messages_stream = consumer.messages().await?;
            messages_stream
                .take_until(done.notified())
                .for_each_concurrent(usize::from(CONCURRENCY), |message| {
                    let counter = counter.clone();
                    async move {
                        if let Ok(message) = message {
                            counter.handled();
                            let _ = message.double_ack().await;
                        }
                    }
                })
                .await;
        }
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    context.delete_stream(&name).await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let messages: usize = std::env::var("MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    println!("| broker | store | messages/s | of unguarded |");
    println!("|---|---|---|---|");
    for broker in ["RabbitMQ", "NATS JetStream"] {
        let run = |rate: anyhow::Result<f64>| rate;
        let none = if broker == "RabbitMQ" {
            run(rabbit::<idempotency_guard::store::sqlite::SqliteStore>(None, messages).await)?
        } else {
            run(nats::<idempotency_guard::store::sqlite::SqliteStore>(None, messages).await)?
        };
        println!("| {broker} | none (guard off) | {none:.0} | 1.00 |");
        for store in ["SQLite", "PostgreSQL", "Redis"] {
            let rate = match (broker, store) {
                ("RabbitMQ", "SQLite") => {
                    let db = idempotency_tests::sqlite().await;
                    rabbit(Some(db.store.clone()), messages).await
                }?,
                ("RabbitMQ", "PostgreSQL") => {
                    let db = idempotency_tests::postgres().await;
                    rabbit(Some(db.store.clone()), messages).await
                }?,
                ("RabbitMQ", _) => {
                    let db = idempotency_tests::redis().await;
                    rabbit(Some(db.store.clone()), messages).await
                }?,
                (_, "SQLite") => {
                    let db = idempotency_tests::sqlite().await;
                    nats(Some(db.store.clone()), messages).await
                }?,
                (_, "PostgreSQL") => {
                    let db = idempotency_tests::postgres().await;
                    nats(Some(db.store.clone()), messages).await
                }?,
                _ => {
                    let db = idempotency_tests::redis().await;
                    nats(Some(db.store.clone()), messages).await
                }?,
            };
            println!("| {broker} | {store} | {rate:.0} | {:.2} |", rate / none);
        }
    }
    let copied_messages = (messages / 5).max(100);
    let pause = Duration::from_millis(20);
    println!();
    println!(
        "Copies right behind their first: RabbitMQ x PostgreSQL, {copied_messages} messages, \
         a 20 ms handler, 16 at a time"
    );
    println!();
    println!("| copies | executions/s | of none copied |");
    println!("|---|---|---|");
    let db = idempotency_tests::postgres().await;
    let none = rabbit_with_copies(db.store.clone(), copied_messages, 0, pause).await?;
    println!("| none | {none:.0} | 1.00 |");
    let db = idempotency_tests::postgres().await;
    let some = rabbit_with_copies(db.store.clone(), copied_messages, 30, pause).await?;
    println!("| 30 % of the messages | {some:.0} | {:.2} |", some / none);
    Ok(())
}
