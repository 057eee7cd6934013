//! Clients for write APIs behind the idempotency guard.
//!
//! - [`RetryClient`]: retries that cannot multiply a failure, and that ask
//!   before resending a write.
//! - [`status`]: the key-status service's wire types and [`StatusClient`],
//!   which asks whether a write already ran before it is sent again.
//!
//! # Calling a guarded API safely
//!
//! ```no_run
//! use idempotency_client::{RetryClient, StatusClient};
//!
//! # async fn run() -> Result<(), idempotency_client::RetryError> {
//! let client = RetryClient::new(reqwest::Client::new())
//!     .with_status_client(StatusClient::new("http://127.0.0.1:8080", "token-of-tenant-a"));
//! let payment = serde_json::json!({"amount": 4200, "currency": "EUR"});
//! // One logical write: one Idempotency-Key (a UUID v7), sent with every attempt.
//! let response = client
//!     .send("create-payment", |http| http.post("http://127.0.0.1:3000/payments").json(&payment))
//!     .await?;
//! # drop(response); Ok(()) }
//! ```
//!
//! The closure builds the request afresh for each attempt, so a body is
//! never reused after it was consumed. The endpoint name (`create-payment`)
//! picks the policy, the retry budget and the circuit breaker, and labels
//! the metrics; use one name per operation, never a URL with ids in it.
//!
//! What the client does with each outcome ([`ErrorKind`] names the errors):
//!
//! | outcome of an attempt | read (GET, HEAD, OPTIONS, TRACE, or idempotent) | write with a key | write without a key |
//! |---|---|---|---|
//! | 1xx–3xx, 4xx but 408/429 | returned | returned | returned |
//! | 429 with `Retry-After` | resent after max(it, 500 ms) | same | returned |
//! | 429 without `Retry-After` | returned | returned | returned |
//! | connect error | resent after backoff | resent after backoff | `UnkeyedWrite` |
//! | 408, 500, 503 | resent after backoff | resent after backoff (same key) | returned |
//! | 502, 504 | resent after backoff | status look-up first | returned |
//! | timeout, dropped connection | resent after backoff | status look-up first | `UnkeyedWrite` |
//! | guard's 409 `request-in-flight` | returned | resent after its `Retry-After` | returned |
//! | guard's 409 `outcome-unknown` | returned | `OutcomeUnknown` | returned |
//!
//! After a status look-up: `replay` resends at once (the stored answer
//! comes back, `Idempotent-Replayed: true`), `wait` asks again after
//! `retry_after_seconds`, `retry` (404) resends after backoff,
//! `reconcile` stops with [`ErrorKind::OutcomeUnknown`]. Without a status
//! service, or when it fails, the write is resent with the same key: the
//! guard makes that safe.
//!
//! Every resend needs a token of the client's retry budget and of the
//! endpoint's ([`ErrorKind::BudgetExhausted`] otherwise), an attempt left
//! ([`ErrorKind::AttemptsExhausted`]), and enough of the call's deadline
//! left for the pause and a whole attempt
//! ([`ErrorKind::DeadlineExceeded`]). An open circuit fails at once
//! ([`ErrorKind::CircuitOpen`]). Every attempt carries `X-Retry-Attempt`.
//!
//! # Default policies
//!
//! | setting | reads | writes |
//! |---|---|---|
//! | backoff ([`Policy::with_backoff`]) | full jitter, base 500 ms, cap 10 s | full jitter, base 1 s, cap 10 s |
//! | deadline per call ([`Policy::with_deadline`]) | 3 s | 2 s |
//! | attempt timeout ([`Policy::with_attempt_timeout`]) | 1 s | 800 ms |
//! | attempts ([`Policy::with_max_attempts`]) | 3 | 3 |
//! | 429 floor ([`Policy::with_retry_after_floor`]) | 500 ms | 500 ms |
//! | key ([`Policy::with_generated_keys`]) | none | a UUID v7 per call, unless the request has one |
//! | endpoint budget ([`Policy::with_budget`]) | 10% of calls, at most 10 saved, empty at start | same |
//! | circuit breaker ([`Policy::with_circuit_breaker`]) | none | none |
//! | client budget ([`RetryClient::with_budget`]) | 10% of calls, at most 100 saved, empty at start | shared |
//!
//! The budget is a token bucket: each call adds its share of a token, each
//! retry takes a whole one. Over any `n` calls, retries are at most
//! `share × n` (plus the initial tokens, 0 by default), so the
//! amplification factor (requests per call) stays at or below `1 + share`
//! whatever fails. The price: a fresh client earns its first retry after
//! ten calls; give it [`RetryBudget::with_initial`] tokens if that matters
//! more than the bound.
//!
//! # Metrics
//!
//! Through the `metrics` facade (see [`telemetry`]):
//! `idempotency_client_calls_total{endpoint, outcome, retried}`,
//! `idempotency_client_attempts_total{endpoint, outcome}`,
//! `idempotency_client_retries_total{endpoint, outcome}`,
//! `idempotency_client_budget_refusals_total{endpoint, budget}`,
//! `idempotency_client_status_checks_total{endpoint, advice}`.
//!
//! ```text
//! # Amplification factor: requests sent per logical call.
//! sum(rate(idempotency_client_attempts_total[5m])) / sum(rate(idempotency_client_calls_total[5m]))
//! # Retry rate: the share of requests that are retries.
//! sum(rate(idempotency_client_retries_total[5m])) / sum(rate(idempotency_client_attempts_total[5m]))
//! # Retry success rate: retries that got a success.
//! sum(rate(idempotency_client_retries_total{outcome="success"}[5m])) / sum(rate(idempotency_client_retries_total[5m]))
//! ```

// docs.rs (`--cfg docsrs`, nightly) marks each feature-gated item with its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod breaker;
mod budget;
mod deadline;
mod decision;
mod error;
mod key;
mod policy;
mod retry;
mod retry_after;
pub mod status;
pub mod telemetry;

pub use backoff::Backoff;
pub use breaker::CircuitBreaker;
pub use budget::RetryBudget;
pub use error::{ErrorKind, Failure, RetryError};
pub use key::{IDEMPOTENCY_KEY, RETRY_ATTEMPT, new_key};
pub use policy::{Kind, Policy};
pub use retry::RetryClient;
pub use status::{Advice, KeyState, KeyStatus, Status, StatusClient, StatusError};
