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
//! use idempotency_client::{Policy, RetryClient, StatusClient};
//!
//! # async fn run() -> Result<(), idempotency_client::RetryError> {
//! let client = RetryClient::new(reqwest::Client::new())
//!     // Declare the endpoints behind the guard: only their writes get keys.
//!     .with_endpoint("create-payment", Policy::guarded_write())
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
//! A write endpoint that is not declared guarded ([`Policy::guarded_write`],
//! or [`Policy::with_guarded`]) gets no key and is retried only on a `429`
//! with `Retry-After`: a server that ignores `Idempotency-Key` never runs a
//! write twice because of this client. A request that sets its own
//! `Idempotency-Key` is a keyed write wherever it goes.
//!
//! What the client does with each outcome ([`ErrorKind`] names the errors):
//!
//! | outcome of an attempt | read (GET, HEAD, OPTIONS, TRACE, or idempotent) | write with a key (guarded endpoint) | write without a key |
//! |---|---|---|---|
//! | 1xx–3xx, 4xx but 408/429 | returned | returned | returned |
//! | 429 with `Retry-After` | resent after max(it, 500 ms) | same | same |
//! | 429 without `Retry-After` | returned | returned | returned |
//! | connect error | resent after backoff | resent after backoff | `UnkeyedWrite` |
//! | 408, 500, 503 | resent after backoff | resent after backoff (same key) | returned |
//! | 502, 504 | resent after backoff | status look-up first | returned |
//! | timeout, dropped connection | resent after backoff | status look-up first | `UnkeyedWrite` |
//! | guard's 409 `request-in-flight` | returned | fetched after its `Retry-After` (`OutcomeStillRunning` when that does not fit) | returned |
//! | guard's 409 `outcome-unknown` | returned | `OutcomeUnknown` | returned |
//!
//! After a status look-up: `replay` fetches the stored answer at once
//! (`Idempotent-Replayed: true`), `wait` asks again after
//! `retry_after_seconds` (or stops with [`ErrorKind::OutcomeStillRunning`]
//! when the deadline is nearer than that), `retry` (404) resends after
//! backoff, `reconcile` stops with [`ErrorKind::OutcomeUnknown`]. Without a
//! status service, or when it fails, the write is resent with the same
//! key: the guard makes that safe.
//!
//! # Limits of a call
//!
//! - **Retries** (every resend but a fetch) take a token of the retry
//!   budget ([`ErrorKind::BudgetExhausted`] otherwise).
//! - **Fetches** (a resend after `replay` advice, or after the guard's
//!   `409 request-in-flight`) take no token: the write ran or runs, its
//!   answer is stored or about to be, so fetching it is no load on a
//!   failing service. They still take an attempt and fit in the deadline.
//! - **Attempts**: at most [`Policy::with_max_attempts`] requests, fetches
//!   included ([`ErrorKind::AttemptsExhausted`]).
//! - **Deadline**: a retry is made only when its whole pause (the backoff's
//!   draw, never shortened to fit) and a whole attempt fit in what is left
//!   of the call's deadline ([`ErrorKind::DeadlineExceeded`] otherwise);
//!   a fetch needs only some deadline left, and its timeout is what is
//!   left.
//! - An open circuit fails at once ([`ErrorKind::CircuitOpen`]).
//! - **Late answers**: an attempt that outlives its timeout is not cut
//!   off; it runs on beside the look-ups, pauses and attempts that follow,
//!   until the deadline, and the first answer the policy hands back wins,
//!   from whichever attempt. A call that gives up waits, until its
//!   deadline, for an attempt still running.
//!
//! Every attempt carries `X-Retry-Attempt`.
//!
//! # Default policies
//!
//! | setting | reads | writes |
//! |---|---|---|
//! | backoff ([`Policy::with_backoff`]) | full jitter, base 500 ms, cap 10 s | full jitter, base 1 s, cap 10 s |
//! | deadline per call ([`Policy::with_deadline`]) | 10 s | 10 s |
//! | attempt timeout ([`Policy::with_attempt_timeout`]): the wait before the call goes on; the attempt keeps running until the deadline and its answer is taken if it comes first | 2 s | 2 s |
//! | attempts ([`Policy::with_max_attempts`]) | 4 | 5 |
//! | 429 floor ([`Policy::with_retry_after_floor`]) | 500 ms | 500 ms |
//! | guarded ([`Policy::with_guarded`]): key per call | — | no ([`Policy::guarded_write`]: yes, a UUID v7 per call, unless the request has one) |
//! | retry budget | the client's, shared ([`RetryClient::with_budget`]) | same |
//! | circuit breaker ([`Policy::with_circuit_breaker`]) | none | none |
//!
//! # The retry budget
//!
//! One rule: every retry takes one token from exactly one bucket. That is
//! the client's shared bucket ([`RetryClient::with_budget`]) unless the
//! endpoint's policy gives it one of its own ([`Policy::with_budget`]),
//! which then replaces the shared one for that endpoint. Each call adds
//! its share of a token to its bucket.
//!
//! The default bucket: a share of 0.1 (one retry per ten calls), at most 10
//! tokens saved, **full at start** (as the AWS SDKs' retry quota and gRPC's
//! retry throttling), so a fresh client, a CLI or a new instance of a
//! fleet retries its first failures. The bound, exactly: over the first
//! `n` calls of a fresh bucket, retries ≤ `share × n + initial` (default
//! `0.1 × n + 10`); over any later run of `n` calls, retries ≤
//! `share × n + cap`. Amplification (requests per call) is therefore at
//! most `1 + share + 10 / n`: 1.110 over 1000 calls at 100 % failure, and
//! `1 + share` over any long window. [`RetryBudget::with_initial`]`(0.0)`
//! makes it `1 + share` from the first call, at the price that a fresh
//! client earns its first retry only after ten calls.
//!
//! That bound holds for retries after server errors and overload answers.
//! Retries after lost answers (a reset, a timeout, a connect error) may
//! also take a floor of 10 per second ([`RetryBudget::with_min_per_sec`],
//! Finagle's `minRetriesPerSec`) while the server answers at least a third
//! of the attempts; and after overload answers (a 429, a 5xx with
//! `Retry-After`) an overload limiter (gRPC's retry throttling, fed by
//! those answers only) stops retries while the server sheds load
//! ([`ErrorKind::Overloaded`]).
//!
//! # Metrics
//!
//! Through the `metrics` facade (see [`telemetry`]):
//! `idempotency_client_calls_total{endpoint, outcome, retried}`,
//! `idempotency_client_attempts_total{endpoint, outcome}`,
//! `idempotency_client_retries_total{endpoint, outcome}`,
//! `idempotency_client_budget_refusals_total{endpoint, budget}`,
//! `idempotency_client_overload_refusals_total{endpoint}`,
//! `idempotency_client_given_up_total{endpoint, class, cause}`,
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
mod late;
mod overload;
mod policy;
mod retry;
mod retry_after;
mod signal;
pub mod status;
pub mod telemetry;

pub use backoff::{Backoff, Jitter};
pub use breaker::CircuitBreaker;
pub use budget::RetryBudget;
pub use error::{ErrorKind, Failure, RetryError};
pub use key::{IDEMPOTENCY_KEY, RETRY_ATTEMPT, new_key};
pub use policy::{Kind, Policy};
pub use retry::RetryClient;
pub use status::{Advice, KeyState, KeyStatus, Status, StatusClient, StatusError};
