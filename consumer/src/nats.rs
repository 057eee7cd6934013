//! The NATS JetStream consumer: a thin adapter over a pull consumer that
//! turns each message into an [`Incoming`], and the inbox's [`Verdict`]
//! into a confirmed ack, `in_progress` while the key is in flight
//! elsewhere, a nak with delay, or a parked / dead-lettered copy.
//!
//! Attempts are JetStream's own delivery count. A message whose key is in
//! flight elsewhere is kept (with `in_progress`, so its ack wait restarts)
//! and asked about again after the engine's hint, so waiting never uses up
//! its attempts. Copies drop `Nats-Msg-Id` (a stream would deduplicate
//! them against the original) and keep it as `Idempotency-Msg-Id`.
//!
//! After a crash nothing waits long behind the dead consumer: while a
//! message is in hand (running, waiting for its twin, or asking again) it
//! is kept alive with `in_progress` every third of the consumer's ack wait,
//! so the ack wait can be short; [`JetStreamConsumer::pull_config`] gives
//! the consumer settings derived from the adapter's (a 5 s ack wait, and at
//! most [`MESSAGES_PER_SLOT`] messages unacknowledged per handler slot), so
//! a killed consumer's messages come back within seconds, and the server
//! never stops sending because a thousand of them wait for a dead process.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind};
use futures_util::{StreamExt, TryStreamExt};
use idempotency_guard::Store;
use idempotency_guard::engine::RunContext;
use tokio::sync::Semaphore;

use crate::error::ConsumerError;
use crate::inbox::{Inbox, Incoming, Verdict};
use crate::key::{KeySource, ScopeFn, scope_of};

/// The NATS client this adapter is built on, for connecting and publishing.
pub use async_nats;

/// The header a copy carries the original `Nats-Msg-Id` in.
pub const ORIGINAL_ID_HEADER: &str = "Idempotency-Msg-Id";
/// The header that says why a message was parked or dead-lettered.
pub const REASON_HEADER: &str = "Idempotency-Reason";
/// How many times a message whose key is in flight elsewhere is asked
/// about again before it is nak'ed with a delay.
const IN_FLIGHT_ROUNDS: u32 = 30;
/// Messages in hand per handler slot (the pull batch, and the
/// `max_ack_pending` of [`JetStreamConsumer::pull_config`], are this times
/// the concurrency): room for copies that wait without running.
pub const MESSAGES_PER_SLOT: usize = 4;
/// The shortest interval between two `in_progress` heartbeats.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

fn nats_error(error: impl std::error::Error + Send + Sync + 'static) -> ConsumerError {
    ConsumerError::Nats(Box::new(error))
}

/// A JetStream consumer that runs its handler at most once per key.
///
/// ```no_run
/// use idempotency_consumer::{Inbox, KeySource, nats::JetStreamConsumer};
/// use idempotency_guard::{Engine, store::sqlite::SqliteStore};
///
/// # async fn f(consumer: async_nats::jetstream::consumer::PullConsumer, js: async_nats::jetstream::Context) -> anyhow::Result<()> {
/// let store = SqliteStore::connect("sqlite://inbox.db?mode=rwc").await?;
/// store.migrate().await?;
/// JetStreamConsumer::new(Inbox::new(Engine::new(store)), "ORDERS", js)
///     .with_key(KeySource::MessageId)
///     .run(consumer, |message, _run| async move {
///         println!("order {} placed", message.key);
///         Ok::<(), std::convert::Infallible>(())
///     }, std::future::pending())
///     .await?;
/// # Ok(()) }
/// ```
pub struct JetStreamConsumer<S> {
    inbox: Inbox<S>,
    stream: String,
    context: jetstream::Context,
    key: KeySource,
    scope: Option<ScopeFn>,
    concurrency: usize,
    ack_wait: Duration,
    dead_letter_subject: String,
    parked_subject: String,
}

impl<S> std::fmt::Debug for JetStreamConsumer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamConsumer")
            .field("stream", &self.stream)
            .field("key", &self.key)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl<S: Store> JetStreamConsumer<S> {
    /// A consumer of `stream`'s messages, keyed by `Nats-Msg-Id`, scoped by
    /// the stream's name; `context` publishes the parked and dead-lettered
    /// copies.
    pub fn new(inbox: Inbox<S>, stream: impl Into<String>, context: jetstream::Context) -> Self {
        let stream = stream.into();
        Self {
            inbox,
            dead_letter_subject: format!("{stream}.dead"),
            parked_subject: format!("{stream}.parked"),
            stream,
            context,
            key: KeySource::MessageId,
            scope: None,
            concurrency: 16,
            ack_wait: Duration::from_secs(5),
        }
    }

    /// Sets where a message's key comes from.
    ///
    /// The default value is [`KeySource::MessageId`] (the `Nats-Msg-Id` header).
    pub fn with_key(mut self, key: KeySource) -> Self {
        self.key = key;
        self
    }

    /// Sets the function that names a message's scope from the stream's
    /// name and the payload.
    ///
    /// The default value is the stream's name.
    pub fn with_scope(
        mut self,
        scope: impl Fn(&str, &[u8]) -> String + Send + Sync + 'static,
    ) -> Self {
        self.scope = Some(Arc::new(scope));
        self
    }

    /// Sets how many handlers run at once; at most [`MESSAGES_PER_SLOT`]
    /// times this many messages are pulled and in hand.
    ///
    /// The default value is 16.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Sets the ack wait of [`JetStreamConsumer::pull_config`]: how soon
    /// JetStream sends again what a dead consumer had in hand (a live one
    /// keeps its messages with `in_progress` heartbeats, whatever its
    /// handler's time).
    ///
    /// The default value is 5 seconds: a killed consumer's messages come
    /// back well within the 10 s the crash tests allow, and a heartbeat
    /// every 1.7 s costs one small publish per message in hand.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait.max(MIN_HEARTBEAT * 3);
        self
    }

    /// The pull consumer's settings this adapter is made for, to create it
    /// with (`stream.get_or_create_consumer(name, consumer.pull_config(name))`):
    /// explicit acks, the adapter's ack wait, and `max_ack_pending` of
    /// [`MESSAGES_PER_SLOT`] times the concurrency. Change any field before
    /// creating the consumer (a filter subject, a `max_deliver`).
    pub fn pull_config(&self, durable_name: impl Into<String>) -> pull::Config {
        pull::Config {
            durable_name: Some(durable_name.into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_ack_pending: i64::try_from(self.concurrency.saturating_mul(MESSAGES_PER_SLOT))
                .unwrap_or(i64::MAX),
            ..pull::Config::default()
        }
    }

    /// Sets the subject poison messages (and messages without a key) are
    /// published to. A stream must capture it.
    ///
    /// The default value is `<stream>.dead`.
    pub fn with_dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = subject.into();
        self
    }

    /// Sets the subject messages of unknown outcome are published to, for a
    /// person. A stream must capture it.
    ///
    /// The default value is `<stream>.parked`.
    pub fn with_parked_subject(mut self, subject: impl Into<String>) -> Self {
        self.parked_subject = subject.into();
        self
    }

    /// Consumes `consumer`'s messages until `shutdown` completes (then lets
    /// the messages in hand finish) or JetStream fails.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Nats`] when the connection fails or a copy is not
    /// stored.
    pub async fn run<H, Fut, E>(
        self,
        consumer: PullConsumer,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumerError>
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let in_hand = self.concurrency.saturating_mul(MESSAGES_PER_SLOT);
        let heartbeat = heartbeat_for(consumer.cached_info().config.ack_wait);
        let messages = consumer
            .stream()
            .max_messages_per_batch(in_hand)
            .messages()
            .await
            .map_err(nats_error)?;
        let handler = Arc::new(handler);
        let permits = Semaphore::new(self.concurrency);
        let this = &self;
        let handler = &handler;
        let permits = &permits;
        messages
            .take_until(shutdown)
            .map_err(nats_error)
            .try_for_each_concurrent(in_hand, |message| async move {
                this.handle(message, handler, permits, heartbeat).await
            })
            .await
    }

    /// One message: key, run, verdict, and its translation for JetStream.
    async fn handle<H, Fut, E>(
        &self,
        message: jetstream::Message,
        handler: &Arc<H>,
        permits: &Semaphore,
        heartbeat: Duration,
    ) -> Result<(), ConsumerError>
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let attempt = message
            .info()
            .ok()
            .and_then(|info| u32::try_from(info.delivered).ok())
            .unwrap_or(1)
            .max(1);
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(name))
                .map(|value| value.as_str().to_owned())
        };
        let key = match &self.key {
            KeySource::MessageId => header("Nats-Msg-Id"),
            KeySource::Header(name) => header(name),
            KeySource::Payload(key) => key(&message.payload),
        };
        let Some(key) = key else {
            let verdict = self.inbox.no_key(&self.stream);
            return self.set_aside(&message, verdict).await;
        };
        let incoming = Incoming {
            source: self.stream.clone(),
            scope: scope_of(self.scope.as_ref(), &self.stream, &message.payload),
            key,
            payload: message.payload.clone(),
            attempt,
        };
        let mut rounds = 0;
        loop {
            let verdict = kept_alive(
                &message,
                heartbeat,
                self.inbox
                    .process_with(incoming.clone(), handler, Some(permits)),
            )
            .await;
            match verdict {
                Verdict::Ack => return message.double_ack().await.map_err(ConsumerError::Nats),
                Verdict::Redeliver {
                    delay,
                    failed: false,
                } if rounds < IN_FLIGHT_ROUNDS => {
                    // Keep it: restart its ack wait, ask again after the hint.
                    rounds += 1;
                    message
                        .ack_with(AckKind::Progress)
                        .await
                        .map_err(ConsumerError::Nats)?;
                    kept_alive(&message, heartbeat, tokio::time::sleep(delay)).await;
                }
                Verdict::Redeliver { delay, .. } => {
                    return message
                        .ack_with(AckKind::Nak(Some(delay)))
                        .await
                        .map_err(ConsumerError::Nats);
                }
                Verdict::Park(_) | Verdict::DeadLetter(_) => {
                    return self.set_aside(&message, verdict).await;
                }
            }
        }
    }

    /// Publishes a parked or dead-lettered copy (stored by a stream), then
    /// acks the original.
    async fn set_aside(
        &self,
        message: &jetstream::Message,
        verdict: Verdict,
    ) -> Result<(), ConsumerError> {
        let subject = match verdict {
            Verdict::Park(_) => &self.parked_subject,
            _ => &self.dead_letter_subject,
        };
        let mut headers = HeaderMap::new();
        if let Some(original) = &message.headers {
            for (name, values) in original.iter() {
                for value in values {
                    if AsRef::<str>::as_ref(name) == "Nats-Msg-Id" {
                        headers.append(ORIGINAL_ID_HEADER, value.clone());
                    } else {
                        headers.append(name.clone(), value.clone());
                    }
                }
            }
        }
        headers.insert(REASON_HEADER, verdict.reason());
        self.context
            .publish_with_headers(subject.clone(), headers, message.payload.clone())
            .await
            .map_err(nats_error)?
            .await
            .map_err(nats_error)?;
        tracing::warn!(stream = %self.stream, to = %subject, reason = verdict.reason(), "message set aside");
        message.double_ack().await.map_err(ConsumerError::Nats)
    }
}

/// The interval of `in_progress` heartbeats for a consumer's ack wait: a
/// third of it, so that two may be lost before JetStream sends the message
/// again (JetStream's default ack wait, 30 s, when the server reports none).
fn heartbeat_for(ack_wait: Duration) -> Duration {
    let ack_wait = if ack_wait.is_zero() {
        Duration::from_secs(30)
    } else {
        ack_wait
    };
    (ack_wait / 3).max(MIN_HEARTBEAT)
}

/// Runs `work` while telling JetStream every `heartbeat` that `message` is
/// still in hand, so its ack wait never runs out under a live consumer.
async fn kept_alive<T>(
    message: &jetstream::Message,
    heartbeat: Duration,
    work: impl Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticks.tick() => {
                if let Err(error) = message.ack_with(AckKind::Progress).await {
                    tracing::debug!(%error, "an in-progress heartbeat was not sent");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_come_three_times_per_ack_wait() {
        assert_eq!(
            heartbeat_for(Duration::from_secs(6)),
            Duration::from_secs(2)
        );
        assert_eq!(heartbeat_for(Duration::ZERO), Duration::from_secs(10));
        assert_eq!(heartbeat_for(Duration::from_millis(30)), MIN_HEARTBEAT);
    }
}
