//! `idempotency-gateway`: the idempotency guard as a reverse proxy, in front
//! of a backend written in any language.
//!
//! The routes the configuration names get exactly what an axum route under
//! [`IdempotencyLayer`](idempotency_guard::IdempotencyLayer) gets (the layer
//! itself is mounted on them): key checks, fingerprints, the run-once
//! engine, bounded bodies, replays with `Idempotent-Replayed: true`, the
//! same problem+json answers, and records the key-status service reads
//! from the same store. Every other request passes through, streamed both
//! ways.
//!
//! # Quick start
//!
//! `gateway.toml`:
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! upstream = "http://127.0.0.1:8000"
//! store = "sqlite://gateway.db?mode=rwc"
//! [[routes]]
//! path = "/payments"
//! ```
//!
//! then `idempotency-gateway --config gateway.toml`. Flags and environment
//! variables override the file: `LISTEN`, `UPSTREAM_URL`, `DATABASE_URL`,
//! `REDIS_URL`, `STORE_KIND`, `IDEMPOTENCY_REQUIRE_SEALED`. See [`config`]
//! for every setting.
//!
//! # MCP servers and A2A agents
//!
//! A route with `type = "jsonrpc"` guards JSON-RPC tool calls instead of
//! whole HTTP requests: MCP `tools/call` for the `tools` it names, and the
//! `rpc_methods` it names (A2A's `message/send`), keyed from the header,
//! `params._meta`, a tool argument or the A2A message id, refusals as
//! JSON-RPC errors with HTTP 200. It is the layer of `idempotency-jsonrpc`
//! in front of the forwarder; see [`jsonrpc`].
//!
//! # A request's path
//!
//! 0. Before any route is matched, a request on a guarded method whose
//!    target or method is not in canonical form, or that carries
//!    `Idempotency-Key` on no guarded route, is refused with a 400
//!    problem, and `CONNECT` with 501 (see [`target`]). Slow and idle
//!    connections are closed by their deadlines, oversized heads answered
//!    414/431 (the guard's [`idempotency_guard::server`], set from
//!    `[server]`).
//! 1. A request on a configured route with a guarded method goes through
//!    [`scope::establish_scope`]: its scope comes from a fixed value, a
//!    header, or the `sub` of a verified JWT. Without one: 401
//!    `unauthorized`, nothing stored.
//! 2. The guard (the layer) checks the key, reads the body (bounded),
//!    computes the fingerprint and claims the key, or answers with a
//!    replay or a 409/400/413/503 problem.
//! 3. The claimed request is forwarded ([`forward::Upstream`]); the answer
//!    goes back to the guard, which stores it or releases the key, then to
//!    the client.
//! 4. Everything else (other paths, other methods) is forwarded as is,
//!    streaming, without the guard.
//!
//! # The upstream's outcomes
//!
//! | what happened upstream | the gateway answers | the key |
//! |---|---|---|
//! | an answer below 500 but 408, 425, 429 | the answer | completed: replays get it |
//! | an answer 5xx, 408, 425, 429, or with `Cache-Control: no-store` | the answer | released: a retry runs |
//! | the connection could not be opened (refused, connect timeout): nothing was sent | 503 `upstream-unavailable` with `Retry-After` | released: a retry runs |
//! | the connection reset or closed after the request was sent, or the answer's body broke off | 502 `upstream-failed` | abandoned: 409 `outcome-unknown`, status service says `reconcile` |
//! | no answer within `proxy.timeout_seconds` after sending | 504 `upstream-timeout` | abandoned |
//! | no end within `policy.max_handler_seconds` | 504 `handler-timeout` (the guard's) | abandoned |
//!
//! 400, 413, 415 and 422 from the upstream are stored like any answer (the
//! gateway cannot tell a validation error from a decision); with
//! `policy.store_client_errors = false` they release the key, as Stripe's
//! rule does for axum extractors.
//!
//! # Forwarding
//!
//! Hop-by-hop headers (`Connection` and those it names, `Keep-Alive`,
//! `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, `Proxy-*`) are dropped
//! both ways; `X-Forwarded-For` and `Forwarded` are appended to,
//! `X-Forwarded-Host` and `X-Forwarded-Proto` set; `Host` is rewritten to
//! the upstream's (or kept, `proxy.host = "keep"`). The upstream client
//! pools keep-alive HTTP/1.1 connections, or speaks HTTP/2 with prior
//! knowledge (`proxy.http2 = true`).
//!
//! # Not supported
//!
//! TLS (terminate it in front; the upstream is `http://`), protocol
//! upgrades (WebSocket), several upstreams (put a balancer behind), and
//! backends that serve `/healthz`, `/readyz` or `/metrics` (the gateway
//! answers those itself).
//!
//! # Shutdown
//!
//! On SIGTERM the gateway stops accepting, lets open requests finish, then
//! waits for every guarded upstream request still running (up to the
//! maximum handler time), so its outcome is stored or released, not lost.

pub mod app;
pub mod config;
pub mod forward;
pub mod jsonrpc;
mod pool;
pub mod scope;
pub mod serve;
pub mod target;

pub use app::{Gateway, GatewayError};
pub use config::{Config, ConfigError, OWN_PATHS};
pub use serve::{serve, shutdown_signal};

/// Describes the proxy's metrics for exporters that show help text (the
/// guard's are described by its own `telemetry::describe`).
pub fn describe_metrics() {
    metrics::describe_counter!(
        forward::UPSTREAM_REQUESTS_TOTAL,
        "Requests forwarded to the upstream, by route and result (answered, unavailable, failed, timeout, bad_target)."
    );
    metrics::describe_histogram!(
        forward::UPSTREAM_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Time from forwarding a request to the upstream's answer head."
    );
}
