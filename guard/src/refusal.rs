//! [`Refusal`]: every reason the guard answers instead of the work, in
//! every adapter, declared once (its docs hold the table).

use std::time::Duration;

use crate::key::{IdempotencyKey, KeyError};

/// Why the guard answered instead of the work (or cannot vouch for its
/// run): the one refusal vocabulary of every adapter.
///
/// The engine refuses a run it cannot vouch for (the key reused, in
/// flight, abandoned, the store down, the work cut off or failed); an
/// adapter refuses a request before the engine sees it (no key, a bad
/// key or scope, a body too large, unreadable, or over the buffer budget;
/// a batch that holds a guarded call; no layer in front of a typed
/// handler). Both are this one enum, so a reason means the same thing on
/// HTTP, gRPC, JSON-RPC and the brokers, and a reason added here is a
/// compile error in every adapter until it is rendered: each adapter
/// renders refusals in one exhaustive function of its own, with no
/// fallback arm.
///
/// | variant | problem (`urn:idempotency:…`) | who refuses |
/// |---|---|---|
/// | [`KeyMissing`](Refusal::KeyMissing) | `key-missing` | adapter |
/// | [`KeyInvalid`](Refusal::KeyInvalid) | `key-invalid` | adapter |
/// | [`ScopeInvalid`](Refusal::ScopeInvalid) | `scope-invalid` | adapter |
/// | [`BodyTooLarge`](Refusal::BodyTooLarge) | `body-too-large` | adapter |
/// | [`BodyUnreadable`](Refusal::BodyUnreadable) | `body-unreadable` | adapter |
/// | [`BodyBufferFull`](Refusal::BodyBufferFull) | `body-buffer-full` | adapter |
/// | [`BatchNotGuarded`](Refusal::BatchNotGuarded) | `batch-not-guarded` | JSON-RPC |
/// | [`LayerMissing`](Refusal::LayerMissing) | `layer-missing` | gRPC typed handler |
/// | [`TransactionUnavailable`](Refusal::TransactionUnavailable) | `transaction-unavailable` | transactional extractor |
/// | [`KeyReused`](Refusal::KeyReused) | `key-reused` | engine |
/// | [`RequestInFlight`](Refusal::RequestInFlight) | `request-in-flight` | engine |
/// | [`OutcomeUnknown`](Refusal::OutcomeUnknown) | `outcome-unknown` | engine |
/// | [`ResponseNotStored`](Refusal::ResponseNotStored) | `response-not-stored` | engine |
/// | [`StoreUnavailable`](Refusal::StoreUnavailable) | `store-unavailable` | engine |
/// | [`HandlerTimeout`](Refusal::HandlerTimeout) | `handler-timeout` | engine |
/// | [`HandlerFailed`](Refusal::HandlerFailed) | `handler-failed` | engine, adapter |
///
/// Each variant's problem type (status, title, headers) is
/// [`Refusal::problem_type`] (in `problem/refusal.rs`, where the
/// problem+json rendering lives: the engine stays free of HTTP). The key
/// rides along as the typed [`IdempotencyKey`] (an `Arc` clone, never a
/// copy of its text); an invalid key is never echoed.
///
/// An error (`std::error::Error`), so `?` takes it into `anyhow::Error` or
/// `Box<dyn Error>`; match on it to tell a retry later from a conflict.
///
/// Not `#[non_exhaustive]`, on purpose: an adapter's rendering matches
/// every variant without a fallback, so a reason added here breaks every
/// adapter's build until it is rendered (a new variant is a breaking
/// change, announced in the changelog).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request has no key and the route requires one.
    #[error("the request has no idempotency key and this route requires one")]
    KeyMissing,
    /// The key is malformed or repeated (never echoed).
    #[error("the idempotency key is invalid: {0}")]
    KeyInvalid(KeyError),
    /// The app's scope function gave an empty scope, one longer than 255
    /// bytes, or one with a control character.
    #[error("the request's scope is invalid")]
    ScopeInvalid,
    /// The request body exceeds the limit.
    #[error("the request body exceeds the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request body could not be read to its end.
    #[error("the request body could not be read to its end")]
    BodyUnreadable,
    /// The bodies being buffered already fill the adapter's budget
    /// (`BodyBudget`); nothing ran.
    #[error("the request bodies buffer is full; try again in {retry_after:?}")]
    BodyBufferFull {
        /// The key, when it was read before the body.
        key: Option<IdempotencyKey>,
        /// When to try again.
        retry_after: Duration,
    },
    /// A JSON-RPC batch holds a guarded call.
    #[error("a batch may not hold a guarded call")]
    BatchNotGuarded,
    /// A typed handler's helper found no layer in front of it (so no scope).
    #[error("no idempotency layer is in front of this handler")]
    LayerMissing,
    /// The work asked for the run's transaction outside transactional mode,
    /// or while the transaction is taken.
    #[error("the run's transaction is not available")]
    TransactionUnavailable,
    /// The key was used with another request (another fingerprint).
    #[error("the key was used with another request")]
    KeyReused {
        /// The key.
        key: IdempotencyKey,
    },
    /// The first request with this key is still running.
    #[error("the first request with this key is still running; ask again in {retry_after:?}")]
    RequestInFlight {
        /// The key.
        key: IdempotencyKey,
        /// When to ask again.
        retry_after: Duration,
    },
    /// An earlier run was abandoned: its effects are unknown.
    #[error("an earlier run with this key was abandoned: its outcome is unknown")]
    OutcomeUnknown {
        /// The key.
        key: IdempotencyKey,
    },
    /// The earlier run's outcome was too large to store.
    #[error("the earlier run's outcome was too large to store")]
    ResponseNotStored {
        /// The key.
        key: IdempotencyKey,
    },
    /// The store failed or did not answer; the work did not run.
    #[error("the store is unavailable; the work did not run; try again in {retry_after:?}")]
    StoreUnavailable {
        /// The key, when the request had one.
        key: Option<IdempotencyKey>,
        /// When to try again.
        retry_after: Duration,
    },
    /// The work ran past the maximum handler time and was cut off.
    #[error(
        "the work ran past the maximum handler time and was cut off (rolled back: {rolled_back})"
    )]
    HandlerTimeout {
        /// The key.
        key: IdempotencyKey,
        /// Whether its writes were rolled back with the record
        /// (transactional mode): then a retry runs it again, safely.
        rolled_back: bool,
    },
    /// The work panicked, failed, or its answer broke off (or its
    /// transactional completion failed and was rolled back); the key was
    /// released.
    #[error("the work failed; the key was released")]
    HandlerFailed {
        /// The key.
        key: IdempotencyKey,
    },
}

impl Refusal {
    /// The key this refusal is about, when the request had a valid one (an
    /// invalid key is never echoed).
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::KeyReused { key }
            | Self::RequestInFlight { key, .. }
            | Self::OutcomeUnknown { key }
            | Self::ResponseNotStored { key }
            | Self::HandlerTimeout { key, .. }
            | Self::HandlerFailed { key } => Some(key),
            Self::StoreUnavailable { key, .. } | Self::BodyBufferFull { key, .. } => key.as_ref(),
            Self::KeyMissing
            | Self::KeyInvalid(_)
            | Self::ScopeInvalid
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable
            | Self::BatchNotGuarded
            | Self::LayerMissing
            | Self::TransactionUnavailable => None,
        }
    }

    /// How long the caller should wait before it asks again, for the
    /// refusals that invite a retry of the same request (`Retry-After`,
    /// gRPC's `RetryInfo`, JSON-RPC's `retry_after`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RequestInFlight { retry_after, .. }
            | Self::StoreUnavailable { retry_after, .. }
            | Self::BodyBufferFull { retry_after, .. } => Some(*retry_after),
            Self::KeyMissing
            | Self::KeyInvalid(_)
            | Self::ScopeInvalid
            | Self::BodyTooLarge { .. }
            | Self::BodyUnreadable
            | Self::BatchNotGuarded
            | Self::LayerMissing
            | Self::TransactionUnavailable
            | Self::KeyReused { .. }
            | Self::OutcomeUnknown { .. }
            | Self::ResponseNotStored { .. }
            | Self::HandlerTimeout { .. }
            | Self::HandlerFailed { .. } => None,
        }
    }
}
