//! The bucket's watch: one ordered consumer per store (headers only, new
//! messages only) whose every message, from any process, wakes this
//! process's requests waiting for that record, and whose claims' stamps
//! spare this process's completions a read (`stamps.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;

use super::stamps::{LEASE_HEADER, Stamps};
use crate::events::RecordEvents;

/// The watch's task; aborted when the last clone of the store is dropped.
pub(super) struct Watcher(tokio::task::AbortHandle);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Watcher {
    /// Starts watching the bucket of `stream` (subjects under `prefix`).
    pub(super) fn start(
        client: async_nats::Client,
        stream: async_nats::jetstream::stream::Stream<()>,
        prefix: String,
        events: RecordEvents,
        stamps: Arc<Stamps>,
    ) -> Self {
        let task = tokio::spawn(forward_events(client, stream, prefix, events, stamps));
        Self(task.abort_handle())
    }
}

/// Publishes into `events` the record of every message stored in the
/// bucket from now on, and keeps the stamps of claims in `stamps`,
/// starting the consumer again after failures (the ordered consumer itself
/// recreates after a gap or a lost leader), until aborted.
async fn forward_events(
    client: async_nats::Client,
    stream: async_nats::jetstream::stream::Stream<()>,
    prefix: String,
    events: RecordEvents,
    stamps: Arc<Stamps>,
) {
    use async_nats::jetstream::consumer::{DeliverPolicy, push::OrderedConfig};
    loop {
        let consumer = stream
            .create_consumer(OrderedConfig {
                deliver_subject: client.new_inbox(),
                filter_subject: format!("{prefix}>"),
                headers_only: true,
                deliver_policy: DeliverPolicy::New,
                description: Some("idempotency-guard waiters".to_owned()),
                ..Default::default()
            })
            .await;
        if let Ok(consumer) = consumer
            && let Ok(mut messages) = consumer.messages().await
        {
            while let Some(Ok(message)) = messages.next().await {
                if let Ok(info) = message.info() {
                    let lease = message
                        .headers
                        .as_ref()
                        .and_then(|headers| headers.get(LEASE_HEADER.clone()))
                        .map(async_nats::HeaderValue::as_str);
                    stamps.record(info.stream_sequence, lease, info.published);
                }
                // Nobody in this process waits or watches: the record's
                // name is not decoded.
                if !events.is_heard() {
                    continue;
                }
                if let Some((scope, key)) = message
                    .subject
                    .as_str()
                    .strip_prefix(&prefix)
                    .and_then(super::parse_subject)
                {
                    events.publish(&scope, &key);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
