//! The idempotency guard for tonic gRPC servers: a unary write method runs
//! at most once per key, and every retry, hedged copy or replayed call with
//! that key gets the first answer back, byte for byte.
//!
//! gRPC clients retry by themselves (a service config's `retryPolicy`
//! resends on `UNAVAILABLE`; hedging sends several copies at once); without
//! a guard each such copy of a write runs it again. This crate is an
//! adapter over the guard's run-once engine ([`idempotency_guard::Engine`]):
//! the same stores, records, key-status service and metrics as the HTTP
//! guard.
//!
//! - [`GrpcIdempotencyLayer`]: a tower layer for `tonic::transport::Server`
//!   that guards the unary methods it is given by full name
//!   (`/pkg.Service/Method`), the key read from the `idempotency-key`
//!   metadata entry (as Yandex Cloud and Nebius key their writes).
//!   Streaming methods pass through untouched.
//! - [`run`]: for a key carried in the request message (Google's AIP-155
//!   `request_id`), called by the typed handler, on the same engine.
//! - Steps and resume: a guarded method reads the run's handle
//!   ([`idempotency_guard::engine::Run`]) from its request's extensions
//!   (`request.extensions().get::<Run>()`), records steps with it, and
//!   answers a step that did not return with [`step_status`] (the key is
//!   left abandoned with its steps); an engine set
//!   `with_abandoned(AbandonedPolicy::Resume)` resumes the retry.
//! - [`tx()`] (PostgreSQL, transactional mode): the method's writes commit
//!   together with its stored answer, or roll back with a released key.
//!
//! # What a call gets
//!
//! | situation | answer | method runs |
//! |---|---|---|
//! | new key | the method's answer, stored before it is sent (if [`outcome::settle`] says so) | yes, once |
//! | same key, same method and message, answer stored | the stored metadata, message and trailers (`grpc-status`, `grpc-message`, `grpc-status-details-bin`), byte for byte, plus `idempotent-replayed: true` | no |
//! | same key, another method or message | `FAILED_PRECONDITION` `key-reused` | no |
//! | same key, first call still running | `UNAVAILABLE` `request-in-flight` + `RetryInfo` (or, with the engine set to wait, the replay once the first ends) | no |
//! | same key, earlier run abandoned or cut off | `FAILED_PRECONDITION` `outcome-unknown`, no `RetryInfo` | no |
//! | same key, earlier run abandoned, engine `with_abandoned(AbandonedPolicy::Resume)` | the method's answer; its recorded steps return without running | yes, resumed |
//! | store unreachable | `UNAVAILABLE` `store-unavailable` + `RetryInfo` | no (fails closed) |
//!
//! The guard's own answers carry `google.rpc.ErrorInfo` (`domain`
//! `idempotency`, `reason` the problem name); the full mapping is in
//! [`refusal`]. Which answers are kept is one table, in [`outcome`]:
//! `OK` and the codes that are a decision are stored; `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNKNOWN`, `CANCELLED` and
//! a failed decode release the key; a handler marks a status final with
//! [`mark_final`].
//!
//! Every `UNAVAILABLE` the guard answers is safe to resend with the same
//! key, and an unknown outcome is `FAILED_PRECONDITION`: a client's
//! `retryPolicy` with `retryableStatusCodes: ["UNAVAILABLE"]` absorbs the
//! in-flight refusal and never resends an unknown outcome (see [`refusal`]
//! for why, and the guide's `docs/guide/grpc.md` for the service config).
//!
//! # Fingerprint
//!
//! SHA-256 over the full method name and the request message bytes (the
//! body's length-prefixed frames as sent; a typed handler's message
//! encoded). A client that compresses its messages sends the same bytes on
//! every retry of one call, so its retries match.
//!
//! # Records and the key-status service
//!
//! A record's method is `POST` and its path the full method name, so the
//! key-status service answers for gRPC keys as for HTTP ones; its
//! `response_status` is 200 (gRPC's HTTP status): the gRPC status is in
//! the stored trailers.

mod engine;
mod exchange;
mod layer;
pub mod outcome;
pub mod refusal;
mod request_id;
#[cfg(feature = "postgres")]
pub mod tx;

pub use layer::{
    CallScope, GrpcIdempotencyLayer, GrpcIdempotencyService, IDEMPOTENCY_KEY_METADATA,
    ResponseFuture,
};
pub use outcome::{
    FINAL_STATUS, OUTCOME_UNKNOWN_STATUS, mark_final, mark_outcome_unknown, step_status,
};
pub use refusal::DOMAIN;
pub use request_id::run;
#[cfg(feature = "postgres")]
pub use tx::tx;
