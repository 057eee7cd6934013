//! The idempotency guard for agents' tool calls: JSON-RPC 2.0 over HTTP
//! POST (MCP's Streamable HTTP transport, A2A's JSON-RPC binding). A
//! retried `send_email` sends one email.
//!
//! Agent runtimes retry a tool call after a timeout or a reconnect, and a
//! write tool then runs twice. [`JsonRpcLayer`] sits in front of the MCP
//! (or A2A) endpoint, reads only the envelope of each POST, and runs the
//! tools and methods it is given through the guard's run-once engine
//! ([`idempotency_guard::Engine`]).
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idempotency_guard::{Engine, store::sqlite::SqliteStore};
//! use idempotency_jsonrpc::JsonRpcLayer;
//!
//! # async fn mcp() -> &'static str { "" }
//! # async fn f() -> anyhow::Result<()> {
//! let store = SqliteStore::connect("sqlite://idempotency.db?mode=rwc").await?;
//! store.migrate().await?;
//! let app: Router = Router::new()
//!     .route("/mcp", post(mcp))
//!     .route_layer(JsonRpcLayer::new(Engine::new(store)).with_tool("send_email"));
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What is guarded
//!
//! MCP `tools/call` for the tools named with [`JsonRpcLayer::with_tool`]
//! (read-only tools are not named: they pass through and are never stored),
//! and whole methods named with [`JsonRpcLayer::with_method`] (A2A's
//! `message/send`: [`JsonRpcLayer::with_a2a_message_send`]). Everything else
//! passes untouched: other methods, notifications, responses, GET and
//! DELETE, bodies that are not JSON-RPC. A batch holding a guarded call is
//! refused (`batch-not-guarded`): one key cannot answer for several calls.
//!
//! # The key
//!
//! From the first of these that is present ([`KeySource`], order and names
//! configurable with [`JsonRpcLayer::with_key_sources`]):
//!
//! 1. the `Idempotency-Key` HTTP header;
//! 2. `params._meta.idempotencyKey` (SEP-3182's proposal);
//! 3. the tool argument `idempotency_key`, then `requestKey` (what MCP
//!    servers use today);
//! 4. for methods other than `tools/call` (A2A `message/send`),
//!    `params.message.messageId`.
//!
//! A key is 1 to 255 visible ASCII characters and a JSON string; a present
//! but invalid one is refused (`key-invalid`), never skipped for the next
//! source. A guarded call without a key is refused (`key-missing`) by
//! default; [`MissingKey::PassThrough`] lets it run unguarded.
//!
//! # The scope
//!
//! The authenticated principal, through [`JsonRpcLayer::with_scope`] (for
//! example the subject of the `Authorization` bearer, as your
//! authentication established it). Not the `Mcp-Session-Id`: a client that
//! lost its connection reconnects with a new session and retries there; a
//! scope per session would run its retry again.
//!
//! # The fingerprint
//!
//! SHA-256 over the method, the tool name and the guard's canonical JSON
//! ([`idempotency_guard::fingerprint::canonical_json`]: members sorted,
//! numbers as written) of the arguments (for `tools/call`) or of `params`
//! without `_meta` (other methods). Left out: the JSON-RPC `id` (it changes
//! between retries), `_meta` (progress tokens, the SEP-3182 key) and the
//! member that carried the key. The same key with other arguments is
//! refused `key-reused`, and the tool does not run.
//!
//! # What is stored, what is replayed
//!
//! | the server's answer | kept |
//! |---|---|
//! | a `result` | stored |
//! | a tool result with `isError: true` | released (a retry runs again), unless its `_meta` sets `"io.idempotency/final": true` |
//! | a JSON-RPC `error` (unknown tool, invalid arguments) | released |
//! | a non-2xx HTTP status (no session, a server failure) | released |
//! | an event stream that ends or breaks before the final response, or an answer over the stored-response limit | abandoned: `outcome-unknown`, never run again blindly |
//! | a tool result whose `_meta` sets `"io.idempotency/outcome-unknown": true` ([`step_error_result`]), or an HTTP answer marked [`OutcomeUnknown`](idempotency_guard::OutcomeUnknown) | abandoned, with the run's recorded steps |
//!
//! # Steps and resume
//!
//! The server's handler gets the run's handle
//! ([`idempotency_guard::engine::Run`]) in its HTTP request's extensions:
//! an axum handler extracts `run: Run`; an `rmcp` tool takes
//! `Extension(parts): Extension<http::request::Parts>` and reads
//! `parts.extensions.get::<Run>()`. It records steps with it
//! (`run.step(..)`, `run.derived_key(..)`); a step that did not return is
//! answered with [`step_error_result`] (a tool) or the `StepError`'s own
//! response (an axum handler), which leaves the key abandoned with its
//! steps. With the engine set `with_abandoned(AbandonedPolicy::Resume)`,
//! the agent's retry resumes the call: recorded steps return without
//! running, and the agent gets the real answer.
//!
//! The server may answer as JSON or as an event stream (`text/event-stream`):
//! from a stream, the final JSON-RPC response to the call is captured and
//! stored alone; notifications and progress are passed to the first caller
//! (once the final response is in) but never stored or replayed.
//!
//! A retry gets the stored response under **its own `id`** (clients match
//! answers by id), with `Idempotent-Replayed: true` on the HTTP response
//! and `"io.idempotency/replayed": true` in `result._meta`, as JSON or as
//! one SSE event, as its `Accept` asks (both accepted: the form the server
//! used).
//!
//! # Refusals
//!
//! JSON-RPC error objects sent with **HTTP 200** (SDK clients turn other
//! statuses into transport errors and drop `error.data`), with
//! `error.data.type` = `urn:idempotency:<name>`; codes in [`refusal`] (the
//! guard's one refusal vocabulary, `idempotency_guard::engine::Refusal`).
//! A body over the limit gets `body-too-large` the same way, under the
//! call's own `id`, found by reading the rest of the body without keeping
//! it (up to 64 MiB; past that, or when the body has no top-level `id`, the
//! `id` is `null`). The one exception is a full body budget
//! ([`JsonRpcLayer::with_body_budget`]): 503 `body-buffer-full`
//! (problem+json, `Retry-After`), before any byte is read.
//!
//! # Event streams and cancellations
//!
//! A guarded call's answer is complete when stored: it never needs
//! resuming. Servers start each event stream with a priming event (rmcp: an
//! event `id:` and `retry: 3000`) so that a client may resume a lost stream
//! with `GET` and `Last-Event-ID`, which a server cannot serve for a stream
//! that ended (rmcp answers an empty one). So a guarded call's stream is
//! delivered without `id:` and `retry:` fields and without the empty
//! priming event: an SDK client that loses it reports the call failed at
//! once, and its retry with the same key gets the replay. Other streams
//! (other methods, the `GET` stream) pass untouched.
//!
//! A client that stops waiting for a call sends `notifications/cancelled`
//! (both official SDKs do, after their own timeout). For a guarded call
//! still running in the same MCP session (`Mcp-Session-Id`), the layer
//! answers it `202 Accepted` and does not pass it on, as MCP allows a
//! receiver to ignore a cancellation: the tool runs to its end, its result
//! is stored, and the agent's retry with the same key gets
//! `request-in-flight` while it runs, then the replay. Passed on, the
//! server would drop the answer (rmcp lets the tool finish), and the key
//! would answer `outcome-unknown` for the whole retention. A guarded tool
//! that honours cancellation therefore runs to its end.
//!
//! # Metrics
//!
//! Every guarded call is counted once in the guard's
//! `idempotency_requests_total` (see [`idempotency_guard::telemetry`]), as
//! HTTP requests are: `route` = the tool (or, for other methods, the
//! method; `batch` for a refused batch), `outcome` = what the engine did
//! (`executed`, `replayed`, `key-reused`, `in-flight`, `released`,
//! `abandoned`, `store-unavailable`; `rejected` for the layer's own
//! refusals, `unguarded` for a call let through without a key,
//! `caller-gone` when the client left before its answer), `attempt` = the
//! `X-Retry-Attempt` header. Calls that are not guarded are not counted,
//! nor a body refused before its envelope is read.
//!
//! # Behind a proxy
//!
//! An inner service that forwards the call (the gateway's `jsonrpc` route,
//! which mounts this layer in front of its forwarder) marks an answer
//! whose outcome it lost (a reset or a timeout after sending) with
//! [`idempotency_guard::OutcomeUnknown`]: the key is then abandoned, not
//! released, since the tool may have run, and the caller gets the JSON-RPC
//! error `outcome-unknown` with HTTP 200 (not the inner 502 or 504, which
//! an SDK client would turn into a transport error), its `error.data.upstream`
//! naming the inner answer's problem type (`urn:idempotency:upstream-failed`,
//! `urn:idempotency:upstream-timeout`).
//!
//! # Limitations
//!
//! - The events of a guarded call's stream reach the first caller when its
//!   final response has arrived, not one by one (it must be captured before
//!   the outcome is stored).
//! - A replay answers before the MCP server sees the request, so it does not
//!   check that the retry's session exists.

mod accept;
mod config;
mod engine;
mod envelope;
mod layer;
mod outcome;
mod raw;
pub mod refusal;
mod reply;
mod running;
mod service;
mod sse;

pub use config::MissingKey;
pub use envelope::{KeySource, KeySourceError, MESSAGE_SEND, TOOLS_CALL};
pub use layer::JsonRpcLayer;
pub use outcome::{FINAL_META, OUTCOME_UNKNOWN_META, step_error_result};
pub use reply::REPLAYED_META;
pub use service::{JsonRpcService, ResponseFuture};
