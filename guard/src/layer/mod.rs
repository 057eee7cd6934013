//! [`IdempotencyLayer`]: the engine as a tower layer for axum routes.
//!
//! The layer is a thin adapter. For a guarded request it reads the key,
//! the scope and the body (bounded), computes the fingerprint, and hands the
//! engine a [`Job`](crate::engine::Job) and the work: call the route, then
//! capture its response for storage. The engine's [`Answer`](crate::engine::Answer)
//! becomes the response: the route's own, a replay, or a problem+json
//! rejection. See `layer/service.rs` for the request path and [`crate::engine`] for
//! what happens to the record.
//!
//! # What is stored, what releases the key
//!
//! | the route answered | stored | key |
//! |---|---|---|
//! | a status below 500 but 408, 425, 429 (configurable) | yes | completed |
//! | 400, 413, 415 or 422 not marked [`FinalResponse`] (an extractor rejected the request before the handler started: Stripe's rule) | no | released: the corrected request runs |
//! | 400, 413, 415 or 422 with [`FinalResponse`] in its extensions (the handler decided it) | yes | completed |
//! | 5xx, 408, 425, 429, `Cache-Control: no-store`, a panic, a broken body | no | released |
//! | anything carrying [`OutcomeUnknown`] in its extensions | no | abandoned (released in transactional mode when the run began its transaction) |
//! | nothing before the maximum handler time | no | abandoned (released in transactional mode when the run began its transaction) |
//!
//! # Files
//!
//! One file per role, as tower-http's `limit/`: `layer.rs` ([`IdempotencyLayer`]
//! and its builders), `config.rs` (the layer's own settings, read by the
//! service), `service.rs` ([`IdempotencyService`]: the request
//! path), `future.rs` ([`ResponseFuture`]), `classify.rs` (the table above
//! as one pure function of the response's head: keep, release or abandon,
//! as the engine's own `Settle<(), ()>`), `markers.rs` ([`FinalResponse`], [`OutcomeUnknown`])
//! `steps.rs` (the [`Run`](crate::engine::Run) extractor, and the answer
//! of a [`StepError`](crate::engine::StepError)) and `tx.rs` (the
//! [`Tx`](crate::Tx) extractor, with PostgreSQL). The
//! bounded bodies every adapter reads ([`read_body`](crate::adapter::read_body),
//! [`capture`](crate::adapter::capture)) are the adapter kit's,
//! [`crate::adapter`].
//!
//! # Settings: the layer's own, and the engine's written once
//!
//! The layer's own settings (methods, key, scope, body limits, stored
//! statuses and headers, replay policy, mismatch status) are its `with_*`
//! methods. The engine's settings (lease, retention, maximum handler time,
//! in-flight and abandoned policies, `Retry-After`, failure mode, store
//! timeout, replay cache, transactional modes) are builders of the same
//! names on the layer too, so `IdempotencyLayer::new(store).with_lease(..)`
//! works as it always did; but they are not copied here. The engine writes
//! each builder once, docs included, in a list its macro hands to a
//! callback (`engine_settings!` in `engine/config.rs`,
//! `transactional_settings!` in `engine/transaction/`), and the layer
//! expands that list into forwarders. A new engine setting is one edit, in
//! the engine, and the layer has it with the engine's docs. (A closure, as
//! in `layer.map_engine(|e| e.with_lease(..))`, would have needed every
//! caller in the workspace rewritten for no gain in what can be
//! configured.) An engine configured beforehand, or shared with other
//! adapters, is taken as it is by [`IdempotencyLayer::with_engine`].

mod classify;
mod config;
mod future;
// The layer type's own file, named as tower-http names it (`limit/layer.rs`).
#[allow(clippy::module_inception)]
mod layer;
mod markers;
mod service;
mod steps;
#[cfg(feature = "postgres")]
mod tx;

pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use markers::{FinalResponse, OutcomeUnknown};
pub use service::IdempotencyService;
