//! The store's two kinds of request: reads from the stream's leader
//! (`STREAM.MSG.GET`, never a direct get) and writes fenced by the revision
//! they expect, each sent again while the bucket elects a leader; and the
//! sample of the leader's clock that every read is compared with.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::header::{self, HeaderValue};
use async_nats::jetstream::context::PublishErrorKind;
use bytes::Bytes;
use time::OffsetDateTime;

use super::stamps::{LEASE_HEADER, lease_header};
use super::{NatsStore, Slot, Written, codec, unavailable};
use crate::key::{IdempotencyKey, Scope};
use crate::record::LeaseToken;
use crate::store::StoreError;

/// What a write's headers say beside its fence and its TTL.
#[derive(Debug, Clone, Copy)]
pub(super) enum Mark {
    /// Nothing more: a rewrite of a record.
    Plain,
    /// A claim (or a take-over) of this lease: the watch keeps its stamp
    /// (`stamps.rs`).
    Claim(LeaseToken),
    /// A delete marker (`KV-Operation: DEL`, the value empty).
    Delete,
}

impl NatsStore {
    /// The leader's clock now (a new sample when the last is old).
    pub(super) async fn leader_now(&self, deadline: Instant) -> Result<OffsetDateTime, StoreError> {
        if let Some(now) = self.inner.clock.now() {
            return Ok(now);
        }
        let subject = format!("STREAM.INFO.{}", self.inner.stream_name);
        let mut pause = Duration::from_millis(50);
        loop {
            let sent = Instant::now();
            let answer: Result<serde_json::Value, _> =
                self.inner.context.request(subject.clone(), &()).await;
            let received = Instant::now();
            let failure = match answer {
                Ok(value) => {
                    let ts = value
                        .get("ts")
                        .and_then(serde_json::Value::as_str)
                        .and_then(|ts| {
                            OffsetDateTime::parse(
                                ts,
                                &time::format_description::well_known::Rfc3339,
                            )
                            .ok()
                        });
                    match ts {
                        Some(leader) => {
                            self.inner.clock.record(sent, received, leader);
                            return Ok(leader + received.saturating_duration_since(sent) / 2);
                        }
                        None => StoreError::Unavailable(
                            format!("the bucket's stream info has no server time: {value}").into(),
                        ),
                    }
                }
                Err(error) => unavailable(error),
            };
            if Instant::now() + pause > deadline {
                return Err(failure);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Reads a record's subject from the stream's leader, sending the read
    /// again while it fails, until `deadline`.
    pub(super) async fn read(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        deadline: Instant,
    ) -> Result<Slot, StoreError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let subject = self.subject(scope.as_str(), key.as_str());
        let mut pause = Duration::from_millis(50);
        loop {
            let answer = self
                .inner
                .stream
                .get_last_raw_message_by_subject(&subject)
                .await;
            let failure = match answer {
                Ok(message) => {
                    // The leader stored the message before it answered.
                    let observed_at = self.leader_now(deadline).await?.max(message.time);
                    let operation = message
                        .headers
                        .get("KV-Operation")
                        .map(|v| v.as_str().to_owned());
                    if matches!(operation.as_deref(), Some("DEL" | "PURGE")) {
                        return Ok(Slot::Marker(message.sequence));
                    }
                    let stored = codec::decode(
                        scope,
                        key,
                        &message.payload,
                        message.time,
                        message.sequence,
                        observed_at,
                    )?;
                    return Ok(Slot::Record(Box::new(stored)));
                }
                Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {
                    return Ok(Slot::Empty);
                }
                Err(error) => unavailable(error),
            };
            // A failed read may mean a new leader: its clock is sampled anew.
            self.inner.clock.forget();
            if Instant::now() + pause > deadline {
                return Err(failure);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Writes `value` (or a delete marker, `value` empty and
    /// [`Mark::Delete`]) to `subject` if the subject is at `expected` (0: no
    /// message), with a per-message TTL; sends it again while the bucket
    /// answers 503, until `deadline`.
    pub(super) async fn write(
        &self,
        subject: &str,
        expected: u64,
        ttl: &str,
        value: Bytes,
        mark: Mark,
        deadline: Instant,
    ) -> Result<Written, StoreError> {
        let mut pause = Duration::from_millis(50);
        loop {
            // The names as the client's constants (no parse); the
            // revision written once (one allocation, not a string copied).
            let mut headers = HeaderMap::new();
            headers.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                HeaderValue::from(expected),
            );
            headers.insert(header::NATS_MESSAGE_TTL, ttl);
            match mark {
                Mark::Plain => {}
                Mark::Claim(token) => headers.insert(LEASE_HEADER.clone(), lease_header(token)),
                Mark::Delete => headers.insert("KV-Operation", "DEL"),
            }
            let sent = self
                .inner
                .context
                .publish_with_headers(subject.to_owned(), headers, value.clone())
                .await;
            let acked = match sent {
                Ok(ack) => ack.await,
                Err(error) => Err(error),
            };
            let error = match acked {
                Ok(ack) => return Ok(Written::Stored(ack.sequence)),
                Err(error) => error,
            };
            match error.kind() {
                PublishErrorKind::WrongLastSequence => return Ok(Written::Conflict),
                PublishErrorKind::MaxPayloadExceeded => {
                    return Err(StoreError::Unavailable(Box::new(error)));
                }
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                    self.inner.clock.forget();
                    return Ok(Written::Unknown(unavailable(error)));
                }
                // No responders (an election), or refused before it was sent.
                _ => {
                    self.inner.clock.forget();
                    if Instant::now() + pause > deadline {
                        return Err(unavailable(error));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Whether a value of `size` bytes fits in one message.
    pub(super) fn fits(&self, subject: &str, size: usize) -> bool {
        // Headers: the expected revision, the TTL, a claim's lease and
        // their names.
        size + subject.len() + 128 <= self.inner.max_payload
    }
}
