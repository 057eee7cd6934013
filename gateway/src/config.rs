//! The gateway's configuration: one TOML file, a few environment overrides.
//!
//! Every field but `upstream` and one route has a default; each default
//! says why it is the default. The smallest useful file:
//!
//! ```
//! let config = idempotency_gateway::config::Config::from_toml(r#"
//!     listen = "0.0.0.0:8080"
//!     upstream = "http://127.0.0.1:8000"
//!     store = "sqlite://gateway.db?mode=rwc"
//!     [[routes]]
//!     path = "/payments"
//! "#).unwrap();
//! assert_eq!(config.routes[0].parsed_methods().unwrap(), ["POST", "PATCH"]);
//! ```
//!
//! An MCP server (or an A2A agent) is a route of `type = "jsonrpc"` naming
//! the tools it guards (see [`crate::jsonrpc`]):
//!
//! ```
//! use idempotency_gateway::config::{Config, RouteKind};
//! let config = Config::from_toml(r#"
//!     upstream = "http://127.0.0.1:8000"
//!     [[routes]]
//!     path = "/mcp"
//!     type = "jsonrpc"
//!     tools = ["send_email"]
//!     key_sources = ["header", "meta:idempotencyKey", "argument:idempotency_key"]
//! "#).unwrap();
//! config.validate().unwrap();
//! assert_eq!(config.routes[0].kind, RouteKind::Jsonrpc);
//! assert_eq!(config.routes[0].parsed_methods().unwrap(), ["POST"]);
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode, Uri};
use idempotency_guard::store::EncryptionKeys;
use idempotency_jsonrpc::{KeySource, TOOLS_CALL};
use serde::Deserialize;

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse, or names an unknown field.
    #[error("the configuration does not parse: line {line}, column {column}: {message}")]
    Parse {
        /// The line of the first problem (from 1).
        line: usize,
        /// Its column (from 1).
        column: usize,
        /// What is wrong there, on one line.
        message: String,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// The JWT key cannot be loaded.
    #[error("the JWT key cannot be loaded")]
    JwtKey(#[source] jsonwebtoken::errors::Error),
    /// The encryption keys cannot be read.
    #[error("the encryption keys of {from} cannot be used")]
    EncryptionKeys {
        /// Where they were read: the setting and the variable or file.
        from: String,
        /// Why.
        #[source]
        source: idempotency_guard::store::encrypted::KeysError,
    },
    /// A store setting (`store`, `store_kind`, `redis`) cannot work.
    #[error(transparent)]
    Store(#[from] idempotency_guard::store::SettingsError),
}

/// What the gateway's messages call its store settings: the TOML key, and
/// the environment variable that overrides it.
const STORE_SETTING_NAMES: idempotency_guard::store::SettingNames =
    idempotency_guard::store::SettingNames {
        kind: "store_kind",
        database_url: "`store` (DATABASE_URL)",
        redis_url: "`redis` (REDIS_URL)",
    };

/// The paths the gateway answers itself (the router of
/// [`Gateway`](crate::Gateway) mounts its health, readiness and metrics
/// endpoints on them, in this order); they are never forwarded, and no
/// route may name them.
pub const OWN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the gateway listens. Env override: `LISTEN`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The backend, `http://host:port` (plain HTTP; an optional path is
    /// prefixed to every forwarded path). Env override: `UPSTREAM_URL`.
    pub upstream: String,
    /// The store's database URL: `sqlite://...` or `postgres://...` (also
    /// the PostgreSQL of the tiered store). Env override: `DATABASE_URL`.
    #[serde(default = "default_store")]
    pub store: String,
    /// Which store: `sql` (the database URL), `redis` or `tiered`. Env
    /// override: `STORE_KIND`.
    #[serde(default = "default_store_kind")]
    pub store_kind: String,
    /// Redis, or Redis Cluster when it lists several comma-separated node
    /// URLs. Env override: `REDIS_URL`.
    #[serde(default)]
    pub redis: Option<String>,
    /// The prefix of every Redis key (several gateways can share a Redis).
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// Whether to apply the store's migrations on start.
    #[serde(default = "yes")]
    pub migrate: bool,
    /// Encryption at rest of stored responses: the environment variable
    /// holding the keys (`<id>:<base64 of 32 bytes>` entries, comma- or
    /// newline-separated, the first sealing new records). The keys
    /// themselves never go in this file. When neither this nor
    /// `encryption_keys_file` is set, `IDEMPOTENCY_ENCRYPTION_KEYS` or the
    /// file `IDEMPOTENCY_ENCRYPTION_KEYS_FILE` names turn it on; with none
    /// of them, responses are stored in clear.
    #[serde(default)]
    pub encryption_keys_env: Option<String>,
    /// Encryption at rest: a file holding the keys (the format of
    /// `encryption_keys_env`).
    #[serde(default)]
    pub encryption_keys_file: Option<PathBuf>,
    /// With encryption at rest: whether a stored response without the
    /// sealed marker is refused (503 `store-unavailable`, never replayed)
    /// instead of replayed as it is. Either way such a read is logged and
    /// counted in `idempotency_unsealed_reads_total{refused}`. Set it to
    /// `false` only while records stored in clear before encryption was
    /// turned on age out (their retention), then remove it. Env override:
    /// `IDEMPOTENCY_REQUIRE_SEALED` (`true` or `false`).
    ///
    /// The default value is `true`: a new deployment stores nothing in
    /// clear, so a clear record was planted by whoever can write the store.
    #[serde(default = "yes")]
    pub require_sealed: bool,
    /// The guarded routes; every other request passes through untouched.
    pub routes: Vec<RouteConfig>,
    /// Where a guarded request's scope comes from.
    #[serde(default)]
    pub scope: ScopeConfig,
    /// How requests are forwarded.
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// Body limits of guarded requests.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Leases, retention and what to do with in-flight and abandoned keys.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Deadlines and caps of client connections.
    #[serde(default)]
    pub server: ServerConfig,
}

/// Deadlines and caps of client connections: slow or idle clients cannot
/// hold the gateway's descriptors or memory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// How long a client may take to send a request head (HTTP/1.1); the
    /// connection is closed past it.
    #[serde(default = "default_header_read")]
    pub header_read_seconds: f64,
    /// How long a connection may stay open without a request being
    /// answered on it (fresh, between keep-alive requests).
    #[serde(default = "default_idle")]
    pub idle_seconds: f64,
    /// How long a guarded route's request body may take to arrive after
    /// its head (408 `body-timeout` past it).
    #[serde(default = "default_body")]
    pub body_seconds: f64,
    /// The interval of HTTP/2 keep-alive pings.
    #[serde(default = "default_http2_ping")]
    pub http2_ping_seconds: f64,
    /// How long an HTTP/2 ping may go unanswered before the connection is
    /// closed.
    #[serde(default = "default_http2_ping_timeout")]
    pub http2_ping_timeout_seconds: f64,
    /// The most client connections open at once; lowered to fit the
    /// descriptor limit (see [`idempotency_guard::server`]). At the cap a
    /// new connection closes the oldest idle one.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// The longest request target (path and query), in bytes; longer: 414
    /// `uri-too-long` (problem+json).
    #[serde(default = "default_max_uri_bytes")]
    pub max_uri_bytes: usize,
    /// The most bytes of request header names and values, together; more:
    /// 431 `headers-too-large` (problem+json). Heads far over both limits
    /// are refused by hyper itself, with an empty body (see
    /// [`idempotency_guard::server`]).
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
}

fn default_max_uri_bytes() -> usize {
    // nginx's large_client_header_buffers: one 8k buffer per line.
    8 * 1024
}

fn default_max_header_bytes() -> usize {
    // nginx's large_client_header_buffers: four 8k buffers.
    32 * 1024
}

fn default_header_read() -> f64 {
    // A real client sends its head at once; nginx's client_header_timeout
    // is 60 s, which lets a trickling client hold a socket for a minute.
    10.0
}

fn default_idle() -> f64 {
    // Above the usual client keep-alive (browsers 60 s would be cut, but
    // API clients reconnect); nginx's keepalive_timeout is 75 s.
    60.0
}

fn default_body() -> f64 {
    // 1 MiB (the default body limit) at 35 KiB/s.
    30.0
}

fn default_http2_ping() -> f64 {
    20.0
}

fn default_http2_ping_timeout() -> f64 {
    // hyper's default.
    20.0
}

fn default_max_connections() -> usize {
    // Far above one gateway's useful concurrency; the descriptor limit
    // usually lowers it.
    10_000
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_seconds: default_header_read(),
            idle_seconds: default_idle(),
            body_seconds: default_body(),
            http2_ping_seconds: default_http2_ping(),
            http2_ping_timeout_seconds: default_http2_ping_timeout(),
            max_connections: default_max_connections(),
            max_uri_bytes: default_max_uri_bytes(),
            max_header_bytes: default_max_header_bytes(),
        }
    }
}

fn default_listen() -> SocketAddr {
    // Loopback: a gateway exposed to the world is a decision, not a default.
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn default_store() -> String {
    // An SQLite file beside the process: a first run needs no server.
    "sqlite://idempotency-gateway.db?mode=rwc".to_owned()
}

fn default_store_kind() -> String {
    "sql".to_owned()
}

fn default_redis_prefix() -> String {
    // The layer's and the service's default: they read the same records.
    "idem".to_owned()
}

fn yes() -> bool {
    true
}

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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The path pattern, in axum's syntax: `/payments`, `/orders/{id}/refunds`.
    pub path: String,
    /// `http` (the default) or `jsonrpc`; see [`RouteKind`].
    #[serde(rename = "type", default)]
    pub kind: RouteKind,
    /// The guarded HTTP methods of an `http` route; others on this path pass
    /// through. Unset: POST and PATCH. Not for a `jsonrpc` route, whose
    /// calls come by POST (see [`RouteConfig::parsed_methods`]).
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// Whether a guarded request must carry a key: an `http` route answers
    /// 400 `key-missing` without `Idempotency-Key`, a `jsonrpc` route the
    /// JSON-RPC error `key-missing` (-32094). When not, a request without
    /// a key passes through unguarded.
    #[serde(default = "yes")]
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
    /// `argument:requestKey`, `message-id`.
    #[serde(default)]
    pub key_sources: Option<Vec<String>>,
}

fn default_methods() -> Vec<Method> {
    // The methods that are not idempotent by definition.
    vec![Method::POST, Method::PATCH]
}

impl RouteConfig {
    /// The guarded HTTP methods, parsed: an `http` route's `methods` (POST
    /// and PATCH when unset); for a `jsonrpc` route POST, the method that
    /// carries calls (the others, GET for the server's event stream and
    /// DELETE to end a session, pass through).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for a name that is not a method.
    pub fn parsed_methods(&self) -> Result<Vec<Method>, ConfigError> {
        let Some(methods) = &self.methods else {
            return Ok(match self.kind {
                RouteKind::Http => default_methods(),
                RouteKind::Jsonrpc => vec![Method::POST],
            });
        };
        methods
            .iter()
            .map(|name| {
                Method::from_bytes(name.to_ascii_uppercase().as_bytes()).map_err(|_| {
                    ConfigError::Invalid(format!("route {}: bad method {name:?}", self.path))
                })
            })
            .collect()
    }

    /// A `jsonrpc` route's key sources, parsed (the defaults when unset).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming a source that does not parse.
    pub fn parsed_key_sources(&self) -> Result<Vec<KeySource>, ConfigError> {
        let Some(sources) = &self.key_sources else {
            return Ok(KeySource::defaults());
        };
        sources
            .iter()
            .map(|text| {
                text.parse()
                    .map_err(|error: idempotency_jsonrpc::KeySourceError| {
                        ConfigError::Invalid(format!("route {}: {error}", self.path))
                    })
            })
            .collect()
    }

    /// Checks the settings of the route's type: a `jsonrpc` route names a
    /// tool or a method, sets no HTTP `methods`, and its key sources parse;
    /// an `http` route sets none of the `jsonrpc` settings.
    fn validate_kind(&self) -> Result<(), ConfigError> {
        let invalid =
            |what: &str| Err(ConfigError::Invalid(format!("route {}: {what}", self.path)));
        match self.kind {
            RouteKind::Http => {
                if !self.tools.is_empty()
                    || !self.rpc_methods.is_empty()
                    || self.key_sources.is_some()
                {
                    return invalid(
                        "tools, rpc_methods and key_sources are for type = \"jsonrpc\" routes",
                    );
                }
            }
            RouteKind::Jsonrpc => {
                if self.methods.is_some() {
                    return invalid(
                        "a jsonrpc route guards the calls POSTed to it: name tools or rpc_methods, not methods",
                    );
                }
                if self.tools.is_empty() && self.rpc_methods.is_empty() {
                    return invalid("a jsonrpc route names tools or rpc_methods to guard");
                }
                if self.rpc_methods.iter().any(|m| m == TOOLS_CALL) {
                    return invalid(
                        "tools/call is guarded per tool: name the tools in tools, not rpc_methods",
                    );
                }
                if self
                    .tools
                    .iter()
                    .chain(&self.rpc_methods)
                    .any(String::is_empty)
                {
                    return invalid("an empty tool or method name");
                }
                if self.parsed_key_sources()?.is_empty() {
                    return invalid("key_sources is empty: no call could carry a key");
                }
            }
        }
        Ok(())
    }
}

/// Where the scope comes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeConfig {
    /// `fixed`, `header` or `jwt`.
    #[serde(default = "default_scope_from")]
    pub from: String,
    /// The fixed scope (`from = "fixed"`).
    #[serde(default = "default_scope_value")]
    pub value: String,
    /// The header that names the scope (`from = "header"`).
    #[serde(default)]
    pub header: Option<String>,
    /// The JWT algorithm: `HS256`, `HS384`, `HS512`, `RS256`, `RS384`,
    /// `RS512`, `PS256`, `ES256`, `ES384` or `EdDSA`.
    #[serde(default = "default_jwt_algorithm")]
    pub jwt_algorithm: String,
    /// The environment variable holding the HMAC secret (HS*).
    #[serde(default)]
    pub jwt_secret_env: Option<String>,
    /// A PEM file with the public key (RS*, PS*, ES*, EdDSA).
    #[serde(default)]
    pub jwt_public_key_file: Option<PathBuf>,
    /// The required `iss`, if any.
    #[serde(default)]
    pub jwt_issuer: Option<String>,
    /// The required `aud`, if any.
    #[serde(default)]
    pub jwt_audience: Option<String>,
}

fn default_scope_from() -> String {
    // One fixed scope: a backend without tenants needs nothing more.
    "fixed".to_owned()
}

fn default_scope_value() -> String {
    "default".to_owned()
}

fn default_jwt_algorithm() -> String {
    "HS256".to_owned()
}

impl Default for ScopeConfig {
    fn default() -> Self {
        Self {
            from: default_scope_from(),
            value: default_scope_value(),
            header: None,
            jwt_algorithm: default_jwt_algorithm(),
            jwt_secret_env: None,
            jwt_public_key_file: None,
            jwt_issuer: None,
            jwt_audience: None,
        }
    }
}

/// How the `Host` header reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostHeader {
    /// Rewritten to the upstream's authority (as nginx's default
    /// `proxy_set_header Host $proxy_host`); the client's is in
    /// `X-Forwarded-Host`.
    Upstream,
    /// The client's `Host`, kept.
    Keep,
}

/// How requests are forwarded.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Speak HTTP/2 to the upstream (prior knowledge, `h2c`).
    #[serde(default)]
    pub http2: bool,
    /// See [`HostHeader`].
    #[serde(default = "default_host")]
    pub host: HostHeader,
    /// How long a connection to the upstream may take to open.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_seconds: f64,
    /// How long the upstream may take to answer with its status and
    /// headers, once the request was sent. Past it a guarded key becomes
    /// abandoned (the request may have run).
    #[serde(default = "default_upstream_timeout")]
    pub timeout_seconds: f64,
    /// Idle keep-alive connections kept per upstream host.
    #[serde(default = "default_pool_idle")]
    pub pool_max_idle: usize,
    /// How long an idle pooled connection is kept.
    #[serde(default = "default_pool_idle_seconds")]
    pub pool_idle_seconds: f64,
}

fn default_host() -> HostHeader {
    HostHeader::Upstream
}

fn default_connect_timeout() -> f64 {
    // A connection that takes longer is a backend that is not there.
    5.0
}

fn default_upstream_timeout() -> f64 {
    // As nginx's proxy_read_timeout.
    60.0
}

fn default_pool_idle() -> usize {
    // Enough for a busy gateway; idle ones close after pool_idle_seconds.
    256
}

fn default_pool_idle_seconds() -> f64 {
    // Below the usual backend keep-alive (Node 5 s, gunicorn 2 s is lower:
    // a connection closed by the backend is retried by the pool).
    30.0
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            http2: false,
            host: default_host(),
            connect_timeout_seconds: default_connect_timeout(),
            timeout_seconds: default_upstream_timeout(),
            pool_max_idle: default_pool_idle(),
            pool_idle_seconds: default_pool_idle_seconds(),
        }
    }
}

/// Body limits of guarded requests (unguarded ones stream, unbounded).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest guarded request body (413 `body-too-large` beyond).
    #[serde(default = "mebibyte")]
    pub body_bytes: usize,
    /// The largest response stored for replay (larger ones reach the first
    /// caller; replays answer 409 `response-not-stored`).
    #[serde(default = "mebibyte")]
    pub stored_response_bytes: usize,
    /// The most bytes of guarded request bodies buffered at once, over every
    /// route: a declared `Content-Length` is reserved before the body is
    /// read, a chunked body as it arrives, until the guard answers. Past it:
    /// 503 `body-buffer-full` with `Retry-After`, nothing forwarded. At
    /// least `body_bytes`.
    #[serde(default = "default_buffered_body_bytes")]
    pub buffered_body_bytes: usize,
}

fn mebibyte() -> usize {
    // Guarded bodies are buffered to fingerprint and store them.
    1024 * 1024
}

fn default_buffered_body_bytes() -> usize {
    // 64 bodies of the default limit at once: far above what honest
    // clients hold; clients holding bodies open then cost at most about
    // 1.5 x 64 MiB + 8 MiB of RSS, where 50 of them took 134 MB RSS and 80
    // took 200 MB without a budget.
    64 * 1024 * 1024
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            body_bytes: mebibyte(),
            stored_response_bytes: mebibyte(),
            buffered_body_bytes: default_buffered_body_bytes(),
        }
    }
}

/// Leases, retention and policies, as in the layer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The lease a run holds on its key (renewed while it runs).
    #[serde(default = "default_lease")]
    pub lease_seconds: f64,
    /// How long records live.
    #[serde(default = "default_retention")]
    pub retention_seconds: f64,
    /// The longest an upstream request may run, its body included.
    #[serde(default = "default_max_handler")]
    pub max_handler_seconds: f64,
    /// `reject` (409 `request-in-flight`) or `wait` (for the replay, up to
    /// `in_flight_wait_seconds`).
    #[serde(default = "default_in_flight")]
    pub in_flight: String,
    /// The bound of `in_flight = "wait"`.
    #[serde(default = "default_in_flight_wait")]
    pub in_flight_wait_seconds: f64,
    /// `reject` (409 `outcome-unknown`) or `run-again`.
    #[serde(default = "default_abandoned")]
    pub abandoned: String,
    /// The status of `key-reused` answers (409; the IETF draft says 422).
    #[serde(default = "default_mismatch")]
    pub mismatch_status: u16,
    /// The `Retry-After` hint of 409 `request-in-flight` and 503 answers.
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: f64,
    /// Whether the upstream's 400, 413, 415 and 422 are stored like any
    /// answer. The gateway cannot tell a backend's validation error (nothing
    /// done) from a decision it took after working, so it stores them;
    /// `false` releases them (Stripe's rule), for backends that answer
    /// those only before doing anything.
    #[serde(default = "yes")]
    pub store_client_errors: bool,
    /// What to do with a request on a guarded method that carries
    /// `Idempotency-Key` but matches no guarded route: `refuse` (400
    /// `route-not-guarded`: a misspelled or missing route never runs
    /// unguarded) or `pass` (forwarded unguarded).
    #[serde(default = "default_route_not_guarded")]
    pub route_not_guarded: String,
}

fn default_route_not_guarded() -> String {
    // Fail closed: the client asked for a guard.
    "refuse".to_owned()
}

fn default_lease() -> f64 {
    60.0
}
fn default_retention() -> f64 {
    24.0 * 3600.0
}
fn default_max_handler() -> f64 {
    600.0
}
fn default_in_flight() -> String {
    "reject".to_owned()
}
fn default_in_flight_wait() -> f64 {
    10.0
}
fn default_abandoned() -> String {
    "reject".to_owned()
}
fn default_mismatch() -> u16 {
    409
}
fn default_retry_after() -> f64 {
    1.0
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            lease_seconds: default_lease(),
            retention_seconds: default_retention(),
            max_handler_seconds: default_max_handler(),
            in_flight: default_in_flight(),
            in_flight_wait_seconds: default_in_flight_wait(),
            abandoned: default_abandoned(),
            mismatch_status: default_mismatch(),
            retry_after_seconds: default_retry_after(),
            store_client_errors: true,
            route_not_guarded: default_route_not_guarded(),
        }
    }
}

/// A number of seconds from the configuration as a duration.
///
/// # Errors
///
/// [`ConfigError::Invalid`] for a negative, infinite or NaN value.
pub fn seconds(name: &str, value: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| ConfigError::Invalid(format!("{name} = {value} is not a duration")))
}

impl Config {
    /// The encryption keys of stored responses, if encryption at rest is
    /// on: from `encryption_keys_env`, else `encryption_keys_file`, else
    /// the environment (`IDEMPOTENCY_ENCRYPTION_KEYS`,
    /// `IDEMPOTENCY_ENCRYPTION_KEYS_FILE`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::EncryptionKeys`] when the keys named cannot be read
    /// or parsed (a named variable that is unset included).
    pub fn encryption_keys(&self) -> Result<Option<EncryptionKeys>, ConfigError> {
        use idempotency_guard::store::encrypted::{KEYS_FILE_VARIABLE, KEYS_VARIABLE};
        let (keys, from) = match (&self.encryption_keys_env, &self.encryption_keys_file) {
            (Some(name), _) => (
                EncryptionKeys::from_env(name).map(Some),
                format!("encryption_keys_env (the variable {name})"),
            ),
            (None, Some(path)) => (
                EncryptionKeys::from_file(path).map(Some),
                format!("encryption_keys_file ({})", path.display()),
            ),
            (None, None) => (
                EncryptionKeys::from_environment(),
                format!("{KEYS_VARIABLE} or {KEYS_FILE_VARIABLE}"),
            ),
        };
        keys.map_err(|source| ConfigError::EncryptionKeys { from, source })
    }

    /// Parses a configuration from TOML text.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for bad TOML or an unknown field.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|error: toml::de::Error| {
            // toml's own message spans lines (a snippet with a caret): keep
            // its first line's words and give the position as numbers.
            let start = error.span().map_or(0, |span| span.start.min(text.len()));
            let before = &text[..start];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |at| at + 1) + 1;
            let message = error
                .message()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            ConfigError::Parse {
                line,
                column,
                message,
            }
        })
    }

    /// What the configuration alone can tell, without a server or the
    /// upstream: [`Config::validate`], the store settings (the URL each
    /// store kind needs and its scheme) and the encryption keys.
    /// [`Gateway::check`](crate::Gateway::check) adds the scope source.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] found.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.validate()?;
        let mut options = idempotency_guard::store::StoreOptions::sql(&self.store);
        options.kind = self.store_kind.parse().map_err(ConfigError::Invalid)?;
        options.redis_url = self.redis.as_deref();
        options.check(STORE_SETTING_NAMES)?;
        self.encryption_keys()?;
        Ok(())
    }

    /// Reads a configuration file.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// The upstream URL, parsed: `http://host[:port][/prefix]`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for another scheme or a URL without host.
    pub fn upstream_uri(&self) -> Result<Uri, ConfigError> {
        let uri: Uri = self.upstream.parse().map_err(|_| {
            ConfigError::Invalid(format!("upstream {:?} is not a URL", self.upstream))
        })?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(ConfigError::Invalid(format!(
                "upstream {:?}: expected http://host[:port] (TLS to the upstream is not supported)",
                self.upstream
            )));
        }
        Ok(uri)
    }

    /// Checks what parsing cannot: at least one route, no path twice, no
    /// route on the gateway's own paths, methods and statuses that exist,
    /// durations that are durations.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the first problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.upstream_uri()?;
        let mut seen = std::collections::HashSet::new();
        for route in &self.routes {
            if !route.path.starts_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "route {:?}: a path starts with /",
                    route.path
                )));
            }
            if OWN_PATHS.contains(&route.path.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "route {}: the gateway answers that path itself",
                    route.path
                )));
            }
            if !seen.insert(route.path.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "route {}: named twice",
                    route.path
                )));
            }
            if route.parsed_methods()?.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "route {}: no methods",
                    route.path
                )));
            }
            route.validate_kind()?;
        }
        StatusCode::from_u16(self.policy.mismatch_status)
            .map_err(|_| ConfigError::Invalid("policy.mismatch_status".to_owned()))?;
        let p = &self.policy;
        if seconds("policy.lease_seconds", p.lease_seconds)? < Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "policy.lease_seconds must be at least 1".to_owned(),
            ));
        }
        for (name, value) in [
            ("policy.retention_seconds", p.retention_seconds),
            ("policy.max_handler_seconds", p.max_handler_seconds),
            ("policy.in_flight_wait_seconds", p.in_flight_wait_seconds),
            ("policy.retry_after_seconds", p.retry_after_seconds),
            (
                "proxy.connect_timeout_seconds",
                self.proxy.connect_timeout_seconds,
            ),
            ("proxy.timeout_seconds", self.proxy.timeout_seconds),
            ("proxy.pool_idle_seconds", self.proxy.pool_idle_seconds),
            (
                "server.header_read_seconds",
                self.server.header_read_seconds,
            ),
            ("server.idle_seconds", self.server.idle_seconds),
            ("server.body_seconds", self.server.body_seconds),
            ("server.http2_ping_seconds", self.server.http2_ping_seconds),
            (
                "server.http2_ping_timeout_seconds",
                self.server.http2_ping_timeout_seconds,
            ),
        ] {
            seconds(name, value)?;
        }
        // The engine's rule (a running request's record must outlive it):
        // checked here, so a bad value is this one line and exit 2, never
        // the engine's panic when the layer is built.
        if seconds("policy.retention_seconds", p.retention_seconds)?
            <= seconds("policy.max_handler_seconds", p.max_handler_seconds)?
                + seconds("policy.lease_seconds", p.lease_seconds)?
        {
            return Err(ConfigError::Invalid(
                "policy.retention_seconds must exceed policy.max_handler_seconds + policy.lease_seconds"
                    .to_owned(),
            ));
        }
        if !matches!(p.in_flight.as_str(), "reject" | "wait") {
            return Err(ConfigError::Invalid(
                "policy.in_flight: reject or wait".to_owned(),
            ));
        }
        if !matches!(p.route_not_guarded.as_str(), "refuse" | "pass") {
            return Err(ConfigError::Invalid(
                "policy.route_not_guarded: refuse or pass".to_owned(),
            ));
        }
        if self.server.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "server.max_connections must be at least 1".to_owned(),
            ));
        }
        if self.server.max_uri_bytes == 0 || self.server.max_header_bytes == 0 {
            return Err(ConfigError::Invalid(
                "server.max_uri_bytes and server.max_header_bytes must be at least 1".to_owned(),
            ));
        }
        if self.limits.buffered_body_bytes < self.limits.body_bytes {
            return Err(ConfigError::Invalid(format!(
                "limits.buffered_body_bytes ({}) must be at least limits.body_bytes ({}): a body at the limit could never be read",
                self.limits.buffered_body_bytes, self.limits.body_bytes
            )));
        }
        if !matches!(p.abandoned.as_str(), "reject" | "run-again") {
            return Err(ConfigError::Invalid(
                "policy.abandoned: reject or run-again".to_owned(),
            ));
        }
        self.store_kind
            .parse::<idempotency_guard::store::StoreKind>()
            .map_err(ConfigError::Invalid)?;
        Ok(())
    }
}
