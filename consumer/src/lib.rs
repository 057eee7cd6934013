//! Run once beyond HTTP: message consumers and webhook receivers over the
//! idempotency guard's engine.
//!
//! A broker redelivers a message whose ack was lost; a consumer crashes
//! after its side effect and before its ack; a webhook sender retries on any
//! timeout. Each adapter here translates its world into a scope, a key, a
//! fingerprint and some work for [`idempotency_guard::Engine`], and the
//! engine's answer back into its world.
//!
//! # Consumers
//!
//! - [`rabbitmq::RabbitConsumer`] (feature `rabbitmq`) and
//!   [`nats::JetStreamConsumer`] (feature `nats`).
//! - The key comes from a [`KeySource`]: the message id (`message-id` on
//!   AMQP, `Nats-Msg-Id` on NATS), a header, or a function of the payload.
//!   The fingerprint is the payload's SHA-256; the scope is the queue's or
//!   stream's name, or a function.
//! - Every message gets one [`Verdict`] from one pure policy:
//!
//! | the engine's answer | verdict | RabbitMQ | JetStream |
//! |---|---|---|---|
//! | ran now, outcome stored | ack | ack after the outcome is stored | ack (confirmed) after it is stored |
//! | ran before (replay) | ack, handler not run | ack | ack |
//! | in flight elsewhere, or store down | redeliver later | held for the hint, then nack with requeue | `in_progress`, held for the hint, asked again; nak with delay after 30 rounds |
//! | handler failed (error, panic), key released | retry, counted | copy with `x-idempotency-attempt` + 1 after the retry delay, ack | nak with the retry delay (the delivery count counts) |
//! | failed on attempt N (default 5), or no key | dead-letter | confirmed copy to `<queue>.dead`, ack | copy to `<stream>.dead`, ack |
//! | earlier run abandoned (outcome unknown), key reused for another payload | park, for a person | confirmed copy to `<queue>.parked`, ack | copy to `<stream>.parked`, ack |
//! | this run abandoned after a recorded step, the engine resuming (`with_abandoned(AbandonedPolicy::Resume)`) | retry, counted: the copy resumes from the steps; parked on attempt N | as a failed handler's | as a failed handler's |
//!
//! A parked message never runs again by itself: an operator looks its
//! record up with the status service (scope = the queue or stream, key =
//! the message's key), reconciles, and deletes or releases the record
//! before republishing it.
//!
//! # The transactional inbox (PostgreSQL)
//!
//! Over an engine in transactional mode whose records are transactional
//! from their claim, the handler writes through
//! [`idempotency_guard::engine::RunContext::tx`]: its writes, the stored
//! outcome and the dedup record commit in one transaction, so a crash
//! anywhere leaves either all of them or none, and the redelivery runs
//! exactly once (it takes the dead run's key over once its lease lapses).
//!
//! ```no_run
//! # use idempotency_guard::{Engine, store::postgres::PostgresStore};
//! # async fn f(store: PostgresStore) {
//! let engine = Engine::new(store)
//!     .with_transactional_mode(true)
//!     // Every effect goes through the run's transaction: a run that died
//!     // before committing is taken over, never parked.
//!     .with_transactional_claims(true);
//! let inbox = idempotency_consumer::Inbox::new(engine);
//! # }
//! ```
//!
//! # Webhooks
//!
//! [`webhook::WebhookLayer`] (feature `webhook`) verifies a Standard
//! Webhooks, GitHub or Stripe signature before anything is stored, and
//! hands a key the signature covers (`webhook-id`, the body's digest,
//! Stripe's event id) on as the `Idempotency-Key` of the
//! [`idempotency_guard::IdempotencyLayer`] behind it: a repeat delivery,
//! or a captured one resent under a fresh id header, gets the stored 2xx
//! without running.

mod error;
mod inbox;
mod key;
mod local;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "webhook")]
pub mod webhook;

pub use error::ConsumerError;
pub use inbox::{DeadReason, Inbox, Incoming, MESSAGES_TOTAL, ParkReason, Verdict};
pub use key::{KeySource, PayloadKey, ScopeFn};
