//! The `jsonrpc` route type: an MCP server (Streamable HTTP) or an A2A
//! agent, in any language, behind the guard for agents' tool calls.
//!
//! ```toml
//! [[routes]]
//! path = "/mcp"
//! type = "jsonrpc"
//! tools = ["send_email"]            # MCP tools/call of these tools
//! rpc_methods = ["message/send"]    # and every call of these methods (A2A)
//! key_sources = ["header", "meta:idempotencyKey", "argument:idempotency_key"]
//! key_required = true               # false: a call without a key runs unguarded
//! ```
//!
//! The route is the [`JsonRpcLayer`] of `idempotency-jsonrpc`, the same
//! layer an axum app mounts, in front of the gateway's forwarder instead of
//! an app's handler: envelope parsing, keys, fingerprints, event-stream
//! capture, replays under the retry's own `id` and refusals as JSON-RPC
//! errors are that crate's, written once. The gateway adds what it adds to
//! every route: the scope (`[scope]`, established before the layer runs,
//! 401 without one), the limits (`[limits]`), the engine's policy
//! (`[policy]`: lease, retention, in-flight, abandoned; `mismatch_status`
//! and `store_client_errors` do not apply, refusals are JSON-RPC errors
//! with HTTP 200), and what the upstream's failures mean:
//!
//! | upstream | the client gets | the key |
//! |---|---|---|
//! | a JSON-RPC `result` (JSON or event stream) | the answer | stored, replayed under the retry's `id` |
//! | a JSON-RPC `error`, a tool result with `isError: true` (not marked final), a non-2xx answer | the answer | released: a retry runs |
//! | connection refused, nothing sent | 503 `upstream-unavailable` | released |
//! | reset or timeout after the request was sent | the JSON-RPC error `outcome-unknown` (-32092, HTTP 200; `data.upstream` = `urn:idempotency:upstream-failed` or `upstream-timeout`) | abandoned: `outcome-unknown` (-32092) |
//! | an event stream that ends before the call's response, or an answer over `limits.stored_response_bytes` | what arrived | abandoned |
//!
//! Every POST to the route is read whole (up to `limits.body_bytes`, 413
//! beyond; within the budget of `limits.buffered_body_bytes` shared with
//! the other guarded routes, 503 `body-buffer-full` past it) to find its
//! envelope; the calls not guarded (other tools,
//! `initialize`, notifications) are then forwarded as they came, and their
//! answers stream back. GET (the server's event stream) and DELETE (the end
//! of a session) pass through untouched, without a scope.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::from_fn_with_state;
use axum::routing::any;
use http::{Method, Response};
use idempotency_guard::Engine;
use idempotency_guard::adapter::BodyBudget;
use idempotency_guard::store::AnyStore;
use idempotency_jsonrpc::{JsonRpcLayer, MissingKey};

use crate::config::{LimitsConfig, RouteConfig};
use crate::forward::{RouteMetrics, Upstream};
use crate::scope::{Scope, ScopeGate, ScopeSource, establish_scope};

/// The forwarder behind the layer of one `jsonrpc` route.
#[derive(Clone)]
struct JsonRpcProxy {
    metrics: RouteMetrics,
    upstream: Upstream,
}

/// Forwards a request of a `jsonrpc` route, streaming its answer: the
/// layer reads a guarded call's answer itself (bounded), to capture the
/// call's response from JSON or from an event stream, and sees the
/// forwarder's failures after sending as unknown outcomes.
async fn forward(State(proxy): State<JsonRpcProxy>, request: Request) -> Response<Body> {
    proxy
        .upstream
        .forward(request, &proxy.metrics, false, 0)
        .await
}

/// The scope [`establish_scope`] put in the request's extensions; empty
/// without one (the layer refuses an empty scope, `scope-invalid`).
fn scope_of(parts: &http::request::Parts) -> String {
    parts
        .extensions
        .get::<Scope>()
        .map(|scope| scope.0.clone())
        .unwrap_or_default()
}

/// The router of one `jsonrpc` route: scope middleware, then the
/// [`JsonRpcLayer`] configured from the route, then the forwarder.
pub(crate) fn router(
    route: &RouteConfig,
    engine: &Engine<AnyStore>,
    upstream: &Upstream,
    scope: &Arc<ScopeSource>,
    limits: &LimitsConfig,
    budget: &BodyBudget,
) -> Router {
    let missing_key = if route.key_required {
        MissingKey::Refuse
    } else {
        MissingKey::PassThrough
    };
    let mut layer = JsonRpcLayer::new(engine.clone())
        .with_key_sources(route.key_sources_or_default())
        .with_missing_key(missing_key)
        .with_scope(scope_of)
        .with_body_limit(limits.body_bytes)
        .with_body_budget(budget.clone())
        .with_stored_response_limit(limits.stored_response_bytes);
    for tool in &route.tools {
        layer = layer.with_tool(tool.as_str());
    }
    for method in &route.rpc_methods {
        layer = layer.with_method(method.as_str());
    }
    let proxy = JsonRpcProxy {
        metrics: RouteMetrics::new(&route.path),
        upstream: upstream.clone(),
    };
    // Only a POST carries a call: a scope is needed for POSTs alone.
    let gate = ScopeGate {
        source: Arc::clone(scope),
        methods: Arc::from([Method::POST]),
    };
    Router::new()
        .route(&route.path, any(forward).with_state(proxy))
        .route_layer(layer)
        .route_layer(from_fn_with_state(gate, establish_scope))
}
