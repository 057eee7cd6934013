//! The adapter kit: what every adapter of the engine shares, so that an
//! adapter only translates its world (an axum route, a gRPC method, a
//! JSON-RPC tool call, a webhook, a broker message) into a job and the
//! engine's answer back into its wire.
//!
//! Every adapter takes the same steps, with the same parts:
//!
//! 1. **Key and scope:** [`IdempotencyKey`](crate::IdempotencyKey) and
//!    [`Scope`](crate::Scope) hold the rules (1 to 255 visible ASCII
//!    characters; 1 to 255 bytes, no control character).
//! 2. **A bounded read of the request:** [`read_body`] under the body
//!    limit and a shared [`BodyBudget`]; a [`BodyReadError`] turns into
//!    its refusal with [`BodyReadError::into_refusal`].
//! 3. **The fingerprint:** [`Fingerprint`](crate::Fingerprint).
//! 4. **The run:** a [`Job`](crate::engine::Job) and the work, handed to
//!    [`Engine::run`](crate::Engine::run); the work ends with a
//!    [`Settle`](crate::engine::Settle), whose bare decisions an adapter's
//!    classifier returns as [`Settle::KEEP`](crate::engine::Settle::KEEP),
//!    [`Settle::RELEASE`](crate::engine::Settle::RELEASE) and
//!    [`Settle::ABANDON`](crate::engine::Settle::ABANDON). A kept answer's
//!    body is captured under the stored-response limit with [`capture`]
//!    (and sent on with [`resume`] when too large to keep). The code the
//!    adapter calls gets the run's handle ([`Run`](crate::engine::Run):
//!    steps, derived keys) in its request's extensions ([`hand_run`]); a
//!    step that did not return is answered with [`step_problem`], marked
//!    "outcome unknown" (the key is left abandoned, for a resume).
//! 5. **The answer:** the engine's one [`Answer`](crate::engine::Answer):
//!    ran, a replay, or a [`Refusal`](crate::engine::Refusal), the one
//!    refusal vocabulary. Each adapter renders a refusal in one exhaustive
//!    function of its own: problem+json
//!    ([`Refusal::problem`](crate::engine::Refusal::problem), for the axum
//!    layer, the webhooks and the gateway), a gRPC status with details
//!    (`idempotency_grpc`), a JSON-RPC error object
//!    (`idempotency_jsonrpc`). A refusal added to the vocabulary fails to
//!    compile in each until it is rendered.
//! 6. **Counting:** one [`Tally`](crate::telemetry::Tally) per request
//!    ([`Engine::tally`](crate::Engine::tally)), counted once with the
//!    answer's [`Answer::outcome`](crate::engine::Answer::outcome), or as
//!    `caller-gone` when the request is dropped first.
//!
//! This module holds the parts of steps 2 and 4 that are not the engine's
//! (the bodies, the run's handle); the others live with their concept and are linked above.
//! The kit is the cut along which the guard can split into a core crate
//! and its axum layer.

mod body;
mod run;

pub(crate) use body::capture_response;
pub use body::{BodyBudget, BodyReadError, BodyReservation, Captured, capture, read_body, resume};
pub use run::{hand_run, step_problem};
