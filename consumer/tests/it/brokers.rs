//! Real brokers for the tests: a connection (or a clear failure saying what
//! to start), unique names, counted effects, and polling with a bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

/// RabbitMQ's address for tests: `TEST_AMQP_URL`, the shared broker on
/// 5672, or a private one this process starts.
pub(crate) fn amqp_url() -> String {
    idempotency_tests::broker_server::amqp_url()
}

/// NATS's address for tests: `TEST_NATS_URL`, the shared server on 4222,
/// or a private one this process starts.
pub(crate) fn nats_url() -> String {
    idempotency_tests::broker_server::nats_url()
}

/// A RabbitMQ connection, or a panic that says how to start the broker.
pub(crate) async fn rabbit() -> Connection {
    let url = amqp_url();
    Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|error| {
            panic!(
                "RabbitMQ is not answering at {url} ({error}). Unset \
                 TEST_AMQP_URL to let the tests start a private broker, or start the one it names."
            )
        })
}

/// A NATS connection with JetStream, or a panic that says how to start it.
pub(crate) async fn nats() -> async_nats::Client {
    let url = nats_url();
    async_nats::connect(&url).await.unwrap_or_else(|error| {
        panic!(
            "NATS is not answering at {url} ({error}). Unset \
             TEST_NATS_URL to let the tests start a private server, or start the one it names."
        )
    })
}

/// A fresh name for a queue or stream.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// Deletes a test's queues when dropped, even when the test panicked.
pub(crate) struct QueueCleanup(String);

impl Drop for QueueCleanup {
    fn drop(&mut self) {
        let queue = self.0.clone();
        // Drop runs inside the test's runtime: clean up from a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(connection) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                {
                    delete_queues(&connection, &queue).await;
                    let _ = connection.close(200, "cleaned up".into()).await;
                }
            });
        })
        .join();
    }
}

/// Declares a queue of the test's own and its dead-letter and parked
/// queues; all three are deleted when the returned guard is dropped.
pub(crate) async fn declare_queue(connection: &Connection, queue: &str) -> QueueCleanup {
    let channel = connection.create_channel().await.unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongUInt(600_000));
    channel
        .queue_declare(queue.into(), QueueDeclareOptions::default(), arguments)
        .await
        .unwrap();
    // Its dead-letter and parked queues, as the consumer declares them.
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    for name in [format!("{queue}.dead"), format!("{queue}.parked")] {
        channel
            .queue_declare(name.as_str().into(), durable, FieldTable::default())
            .await
            .unwrap();
    }
    QueueCleanup(queue.to_owned())
}

/// Deletes a queue and its dead-letter and parked queues.
pub(crate) async fn delete_queues(connection: &Connection, queue: &str) {
    let channel = connection.create_channel().await.unwrap();
    for name in [
        queue.to_owned(),
        format!("{queue}.dead"),
        format!("{queue}.parked"),
    ] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

/// How many messages are ready in a queue.
pub(crate) async fn ready(connection: &Connection, queue: &str) -> u32 {
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .map(|queue| queue.message_count())
        .unwrap_or(0)
}

/// Effects applied, per key (the side effect the guard protects).
#[derive(Clone, Default)]
pub(crate) struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    /// Applies the effect of `key` once more.
    pub(crate) fn apply(&self, key: &str) {
        *self.0.lock().unwrap().entry(key.to_owned()).or_default() += 1;
    }

    /// How many times `key`'s effect was applied.
    pub(crate) fn of(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// How many keys had an effect.
    pub(crate) fn keys(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Keys whose effect was applied more than once.
    pub(crate) fn duplicated(&self) -> Vec<(String, u32)> {
        let effects = self.0.lock().unwrap();
        effects
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }
}

/// Waits until `condition` holds, at most `bound`; panics with `what` otherwise.
pub(crate) async fn eventually<F, Fut>(bound: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
