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

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use futures_util::{StreamExt, TryStreamExt};
use idempotency_guard::Store;
use idempotency_guard::engine::RunContext;

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

    /// Sets how many messages are handled at once.
    ///
    /// The default value is 16.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
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
        let messages = consumer.messages().await.map_err(nats_error)?;
        let handler = Arc::new(handler);
        let this = &self;
        let handler = &handler;
        messages
            .take_until(shutdown)
            .map_err(nats_error)
            .try_for_each_concurrent(self.concurrency, |message| async move {
                this.handle(message, handler).await
            })
            .await
    }

    /// One message: key, run, verdict, and its translation for JetStream.
    async fn handle<H, Fut, E>(
        &self,
        message: jetstream::Message,
        handler: &Arc<H>,
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
            let verdict = self.inbox.process(incoming.clone(), handler).await;
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
                    tokio::time::sleep(delay).await;
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
