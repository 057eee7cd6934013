//! `[[routes]]`: the guarded routes, HTTP or JSON-RPC.

use http::Method;
use idempotency_jsonrpc::{KeySource, TOOLS_CALL};
use serde::Deserialize;

use super::de;
use super::error::ConfigError;

/// The paths the gateway answers itself (the router of
/// [`Gateway`](crate::Gateway) mounts its health, readiness and metrics
/// endpoints on them, in this order); they are never forwarded, and no
/// route may name them.
pub const OWN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// What a route guards: HTTP requests (the axum layer's rules) or JSON-RPC
/// tool calls (the `idempotency-jsonrpc` layer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// Every request of the route's `methods`, keyed by `Idempotency-Key`.
    #[default]
    Http,
    /// JSON-RPC 2.0 over HTTP POST (an MCP server's Streamable HTTP
    /// endpoint, an A2A agent): only the calls of the named `tools` and
    /// `rpc_methods` are guarded, keyed from the first of `key_sources`.
    Jsonrpc,
}

/// One guarded route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The path pattern, in axum's syntax: `/payments`, `/orders/{id}/refunds`.
    pub path: String,
    /// `http` (the default) or `jsonrpc`; see [`RouteKind`].
    #[serde(rename = "type", default)]
    pub kind: RouteKind,
    /// The guarded HTTP methods of an `http` route, in any case; others on
    /// this path pass through. Unset: POST and PATCH. Not for a `jsonrpc`
    /// route, whose calls come by POST (see [`RouteConfig::guarded_methods`]).
    #[serde(default, deserialize_with = "de::methods")]
    pub methods: Option<Vec<Method>>,
    /// Whether a guarded request must carry a key: an `http` route answers
    /// 400 `key-missing` without `Idempotency-Key`, a `jsonrpc` route the
    /// JSON-RPC error `key-missing` (-32094). When not, a request without
    /// a key passes through unguarded.
    #[serde(default = "key_required")]
    pub key_required: bool,
    /// A `jsonrpc` route's guarded MCP tools: `tools/call` with
    /// `params.name` among them (read-only tools are not named: they pass,
    /// never stored).
    #[serde(default)]
    pub tools: Vec<String>,
    /// A `jsonrpc` route's guarded JSON-RPC methods other than `tools/call`
    /// (A2A's `message/send`), every call of them.
    #[serde(default)]
    pub rpc_methods: Vec<String>,
    /// A `jsonrpc` route's key sources, in order (the first holding a key
    /// wins): `header` (`Idempotency-Key`), `meta:<name>`
    /// (`params._meta.<name>`), `argument:<name>` (a tool argument),
    /// `message-id` (A2A's `params.message.messageId`). Unset: `header`,
    /// `meta:idempotencyKey`, `argument:idempotency_key`,
    /// `argument:requestKey`, `message-id` (see
    /// [`RouteConfig::key_sources_or_default`]).
    #[serde(default, deserialize_with = "de::parsed_list")]
    pub key_sources: Option<Vec<KeySource>>,
}

fn key_required() -> bool {
    // Fail closed: a route is guarded because its requests must not run
    // twice, and a request without a key could.
    true
}

impl RouteConfig {
    /// The guarded HTTP methods: an `http` route's `methods`, POST and
    /// PATCH (the methods that are not idempotent by definition) when
    /// unset; for a `jsonrpc` route POST, the method that carries calls
    /// (the others, GET for the server's event stream and DELETE to end a
    /// session, pass through).
    pub fn guarded_methods(&self) -> Vec<Method> {
        match (&self.methods, self.kind) {
            (Some(methods), _) => methods.clone(),
            (None, RouteKind::Http) => vec![Method::POST, Method::PATCH],
            (None, RouteKind::Jsonrpc) => vec![Method::POST],
        }
    }

    /// A `jsonrpc` route's key sources (the defaults when unset).
    pub fn key_sources_or_default(&self) -> Vec<KeySource> {
        self.key_sources.clone().unwrap_or_else(KeySource::defaults)
    }

    /// Checks the route's path: it starts with `/` and is not one of the
    /// gateway's own.
    pub(super) fn validate_path(&self) -> Result<(), ConfigError> {
        if !self.path.starts_with('/') {
            return Err(ConfigError::Invalid(format!(
                "route {:?}: a path starts with /",
                self.path
            )));
        }
        if OWN_PATHS.contains(&self.path.as_str()) {
            return Err(self.invalid("the gateway answers that path itself"));
        }
        Ok(())
    }

    /// Checks the settings of the route's type: an `http` route guards a
    /// method and sets none of the `jsonrpc` settings; a `jsonrpc` route
    /// names a tool or a method, sets no HTTP `methods`, and has a key
    /// source.
    pub(super) fn validate_settings(&self) -> Result<(), ConfigError> {
        if self.guarded_methods().is_empty() {
            return Err(self.invalid("no methods"));
        }
        match self.kind {
            RouteKind::Http => {
                if !self.tools.is_empty()
                    || !self.rpc_methods.is_empty()
                    || self.key_sources.is_some()
                {
                    return Err(self.invalid(
                        "tools, rpc_methods and key_sources are for type = \"jsonrpc\" routes",
                    ));
                }
            }
            RouteKind::Jsonrpc => {
                if self.methods.is_some() {
                    return Err(self.invalid(
                        "a jsonrpc route guards the calls POSTed to it: name tools or rpc_methods, not methods",
                    ));
                }
                if self.tools.is_empty() && self.rpc_methods.is_empty() {
                    return Err(self.invalid("a jsonrpc route names tools or rpc_methods to guard"));
                }
                if self.rpc_methods.iter().any(|m| m == TOOLS_CALL) {
                    return Err(self.invalid(
                        "tools/call is guarded per tool: name the tools in tools, not rpc_methods",
                    ));
                }
                if self
                    .tools
                    .iter()
                    .chain(&self.rpc_methods)
                    .any(String::is_empty)
                {
                    return Err(self.invalid("an empty tool or method name"));
                }
                if self.key_sources_or_default().is_empty() {
                    return Err(self.invalid("key_sources is empty: no call could carry a key"));
                }
            }
        }
        Ok(())
    }

    /// The route's error: its path, then what is wrong.
    fn invalid(&self, what: &str) -> ConfigError {
        ConfigError::Invalid(format!("route {}: {what}", self.path))
    }
}
