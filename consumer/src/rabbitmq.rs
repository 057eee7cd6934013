//! The RabbitMQ (AMQP 0-9-1) consumer: a thin adapter that turns each
//! delivery into an [`Incoming`], and the inbox's [`Verdict`] into an ack,
//! a delayed requeue, a retry copy or a parked / dead-lettered copy.
//!
//! Attempts are counted in the `x-idempotency-attempt` header: a failed
//! message is published again to its queue with the count raised (then
//! acked), so the count survives on any queue type. Parked and
//! dead-lettered copies keep the payload and properties and carry the
//! reason in `x-idempotency-reason`. Every copy is confirmed by the broker
//! before the original is acked, so a crash in between leaves a duplicate
//! delivery, which the guard answers from the stored outcome.
//!
//! Handler slots and deliveries in hand are counted apart: at most
//! `concurrency` handlers run at once, while the prefetch is
//! [`PREFETCH_PER_SLOT`] times that, so a copy that waits for its twin (in
//! this process) or for a requeue (its twin runs elsewhere) holds no
//! handler slot.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use idempotency_guard::Store;
use idempotency_guard::engine::RunContext;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Semaphore;

use crate::error::ConsumerError;
use crate::inbox::{Inbox, Incoming, Verdict};
use crate::key::{KeySource, ScopeFn, scope_of};

/// The AMQP client this adapter is built on, for connecting and publishing.
pub use lapin;

/// The header that counts a failing message's attempts.
pub const ATTEMPT_HEADER: &str = "x-idempotency-attempt";
/// The header that says why a message was parked or dead-lettered.
pub const REASON_HEADER: &str = "x-idempotency-reason";
/// Deliveries in hand per handler slot (the prefetch is this times the
/// concurrency): room for copies that wait without running.
pub const PREFETCH_PER_SLOT: u16 = 4;

/// A RabbitMQ consumer that runs its handler at most once per key.
///
/// ```no_run
/// use idempotency_consumer::{Inbox, KeySource, rabbitmq::RabbitConsumer};
/// use idempotency_guard::{Engine, store::sqlite::SqliteStore};
///
/// # async fn f() -> anyhow::Result<()> {
/// let store = SqliteStore::connect("sqlite://inbox.db?mode=rwc").await?;
/// store.migrate().await?;
/// let inbox = Inbox::new(Engine::new(store));
/// let connection = lapin::Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", Default::default()).await?;
/// RabbitConsumer::new(inbox, "orders")
///     .with_key(KeySource::MessageId)
///     .run(&connection, |message, _run| async move {
///         println!("order {} placed", message.key);
///         Ok::<(), std::convert::Infallible>(())
///     }, std::future::pending())
///     .await?;
/// # Ok(()) }
/// ```
pub struct RabbitConsumer<S> {
    inbox: Inbox<S>,
    queue: String,
    key: KeySource,
    scope: Option<ScopeFn>,
    concurrency: u16,
    dead_letter_queue: String,
    parked_queue: String,
}

impl<S> std::fmt::Debug for RabbitConsumer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitConsumer")
            .field("queue", &self.queue)
            .field("key", &self.key)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl<S: Store> RabbitConsumer<S> {
    /// A consumer of `queue` (which must exist), keyed by the message id,
    /// scoped by the queue's name.
    pub fn new(inbox: Inbox<S>, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        Self {
            inbox,
            dead_letter_queue: format!("{queue}.dead"),
            parked_queue: format!("{queue}.parked"),
            queue,
            key: KeySource::MessageId,
            scope: None,
            concurrency: 16,
        }
    }

    /// Sets where a message's key comes from.
    ///
    /// The default value is [`KeySource::MessageId`] (the `message-id` property).
    pub fn with_key(mut self, key: KeySource) -> Self {
        self.key = key;
        self
    }

    /// Sets the function that names a message's scope from the queue's
    /// name and the payload.
    ///
    /// The default value is the queue's name.
    pub fn with_scope(
        mut self,
        scope: impl Fn(&str, &[u8]) -> String + Send + Sync + 'static,
    ) -> Self {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// Sets how many handlers run at once; the prefetch is
    /// [`PREFETCH_PER_SLOT`] times this.
    ///
    /// The default value is 16.
    pub fn with_concurrency(mut self, concurrency: u16) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Sets the queue that poison messages (and messages without a key) go to.
    ///
    /// The default value is `<queue>.dead`.
    pub fn with_dead_letter_queue(mut self, queue: impl Into<String>) -> Self {
        self.dead_letter_queue = queue.into();
        self
    }

    /// Sets the queue that messages of unknown outcome go to, for a person.
    ///
    /// The default value is `<queue>.parked`.
    pub fn with_parked_queue(mut self, queue: impl Into<String>) -> Self {
        self.parked_queue = queue.into();
        self
    }

    /// Consumes until `shutdown` completes (then lets the messages in hand
    /// finish) or the connection fails. Declares the dead-letter and parked
    /// queues (durable).
    ///
    /// # Errors
    ///
    /// [`ConsumerError`] when the connection or a channel fails, or the
    /// broker refuses a copy.
    pub async fn run<H, Fut, E>(
        self,
        connection: &Connection,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumerError>
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let consume = connection.create_channel().await?;
        let publish = connection.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        for queue in [&self.dead_letter_queue, &self.parked_queue] {
            let options = QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            };
            publish
                .queue_declare(queue.as_str().into(), options, FieldTable::default())
                .await?;
        }
        let prefetch = self.concurrency.saturating_mul(PREFETCH_PER_SLOT);
        consume
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let deliveries = consume
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let handler = Arc::new(handler);
        let permits = Semaphore::new(usize::from(self.concurrency));
        let this = &self;
        let publish = &publish;
        let handler = &handler;
        let permits = &permits;
        deliveries
            .take_until(shutdown)
            .map_err(ConsumerError::from)
            .try_for_each_concurrent(usize::from(prefetch), |delivery| async move {
                this.handle(publish, delivery, handler, permits).await
            })
            .await
    }

    /// One delivery: key, run, verdict, and its translation for the broker.
    async fn handle<H, Fut, E>(
        &self,
        publish: &Channel,
        delivery: Delivery,
        handler: &Arc<H>,
        permits: &Semaphore,
    ) -> Result<(), ConsumerError>
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let attempt = attempt_of(&delivery.properties);
        let key = match &self.key {
            KeySource::MessageId => delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned()),
            KeySource::Header(name) => header_text(&delivery.properties, name),
            KeySource::Payload(key) => key(&delivery.data),
        };
        let verdict = match key {
            None => self.inbox.no_key(&self.queue),
            Some(key) => {
                let incoming = Incoming {
                    source: self.queue.clone(),
                    scope: scope_of(self.scope.as_ref(), &self.queue, &delivery.data),
                    key,
                    payload: delivery.data.clone().into(),
                    attempt,
                };
                self.inbox
                    .process_with(incoming, handler, Some(permits))
                    .await
            }
        };
        match verdict {
            Verdict::Ack => {}
            Verdict::Redeliver {
                delay,
                failed: false,
            } => {
                // Its twin runs elsewhere: held back, then requeued without
                // counting an attempt, by a task of its own, so that the
                // wait holds neither a handler slot nor a delivery slot.
                // (Should the channel close first, the broker requeues it.)
                let acker = delivery.acker.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let requeue = BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    };
                    if let Err(error) = acker.nack(requeue).await {
                        tracing::debug!(%error, "a held-back delivery was not requeued; the broker requeues it when the channel closes");
                    }
                });
                return Ok(());
            }
            Verdict::Redeliver {
                delay,
                failed: true,
            } => {
                tokio::time::sleep(delay).await;
                let properties = with_header(
                    &delivery.properties,
                    ATTEMPT_HEADER,
                    AMQPValue::LongUInt(attempt.saturating_add(1)),
                );
                publish_confirmed(publish, &self.queue, &delivery.data, properties).await?;
            }
            Verdict::Park(_) | Verdict::DeadLetter(_) => {
                let queue = match verdict {
                    Verdict::Park(_) => &self.parked_queue,
                    _ => &self.dead_letter_queue,
                };
                // A long string: RabbitMQ refuses short strings in tables.
                let properties = with_header(
                    &delivery.properties,
                    REASON_HEADER,
                    AMQPValue::LongString(verdict.reason().into()),
                );
                publish_confirmed(publish, queue, &delivery.data, properties).await?;
                tracing::warn!(queue = %self.queue, to = %queue, reason = verdict.reason(), "message set aside");
            }
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }
}

/// Publishes to `queue` (through the default exchange) and waits for the
/// broker's confirmation.
async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> Result<(), ConsumerError> {
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            properties,
        )
        .await?
        .await?;
    if confirm.is_ack() {
        Ok(())
    } else {
        Err(ConsumerError::NotConfirmed(queue.to_owned()))
    }
}

/// The properties with one header set.
fn with_header(properties: &BasicProperties, name: &str, value: AMQPValue) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(name.into(), value);
    properties.clone().with_headers(headers)
}

/// The attempt a delivery is (1 unless a retry copy says otherwise).
fn attempt_of(properties: &BasicProperties) -> u32 {
    let value = properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(ATTEMPT_HEADER).cloned());
    let attempt = match value {
        Some(AMQPValue::LongUInt(n)) => i64::from(n),
        Some(AMQPValue::LongInt(n)) => i64::from(n),
        Some(AMQPValue::LongLongInt(n)) => n,
        Some(AMQPValue::ShortUInt(n)) => i64::from(n),
        Some(AMQPValue::ShortInt(n)) => i64::from(n),
        _ => 1,
    };
    u32::try_from(attempt).unwrap_or(1).max(1)
}

/// A header's value as text.
fn header_text(properties: &BasicProperties, name: &str) -> Option<String> {
    let headers = properties.headers().as_ref()?;
    match headers.inner().get(name)? {
        AMQPValue::ShortString(text) => Some(text.as_str().to_owned()),
        AMQPValue::LongString(text) => String::from_utf8(text.as_bytes().to_vec()).ok(),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_start_at_one_and_read_the_header() {
        assert_eq!(attempt_of(&BasicProperties::default()), 1);
        let three = with_header(
            &BasicProperties::default(),
            ATTEMPT_HEADER,
            AMQPValue::LongUInt(3),
        );
        assert_eq!(attempt_of(&three), 3);
        let nonsense = with_header(
            &BasicProperties::default(),
            ATTEMPT_HEADER,
            AMQPValue::LongInt(-4),
        );
        assert_eq!(attempt_of(&nonsense), 1);
    }
}
