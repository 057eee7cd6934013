//! The gateway's configuration: one TOML file, a few environment overrides.
//!
//! Every field but `upstream` and one route has a default; each default
//! says why it is the default (each section's in its one `impl Default`).
//! Values are typed when the file is read: choices are enums, durations
//! (`*_seconds`, an integer or not) [`Duration`](std::time::Duration)s, statuses
//! [`StatusCode`](http::StatusCode)s, methods [`Method`](http::Method)s, so a
//! bad value is a parse error naming its line and column, and
//! [`Config::validate`] is left with the rules that tie settings together.
//! One file per section: [`RouteConfig`], [`ScopeConfig`], [`ProxyConfig`],
//! [`LimitsConfig`], [`PolicyConfig`], [`ServerConfig`]. The smallest
//! useful file:
//!
//! ```
//! let config = idempotency_gateway::config::Config::from_toml(r#"
//!     listen = "0.0.0.0:8080"
//!     upstream = "http://127.0.0.1:8000"
//!     store = "sqlite://gateway.db?mode=rwc"
//!     [[routes]]
//!     path = "/payments"
//! "#).unwrap();
//! assert_eq!(config.routes[0].guarded_methods(), ["POST", "PATCH"]);
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
//! assert_eq!(config.routes[0].guarded_methods(), ["POST"]);
//! ```

mod de;
mod error;
mod limits;
mod policy;
mod proxy;
mod route;
mod scope;
mod server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http::Uri;
use idempotency_guard::store::StoreKind;
use idempotency_guard::store::encrypted::EncryptionKeys;
use serde::Deserialize;

pub use error::ConfigError;
pub use limits::LimitsConfig;
pub use policy::{Abandoned, InFlight, PolicyConfig, RouteNotGuarded};
pub use proxy::{HostHeader, ProxyConfig};
pub use route::{OWN_PATHS, RouteConfig, RouteKind};
pub use scope::{ScopeConfig, ScopeFrom};
pub use server::ServerConfig;

/// What the gateway's messages call its store settings: the TOML key, and
/// the environment variable that overrides it.
const STORE_SETTING_NAMES: idempotency_guard::store::SettingNames =
    idempotency_guard::store::SettingNames {
        kind: "store_kind",
        database_url: "`store` (DATABASE_URL)",
        redis_url: "`redis` (REDIS_URL)",
        nats_url: "`nats` (NATS_URL)",
    };

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the gateway listens. Env override: `LISTEN`.
    #[serde(default = "listen")]
    pub listen: SocketAddr,
    /// The backend, `http://host:port` (plain HTTP; an optional path is
    /// prefixed to every forwarded path). Env override: `UPSTREAM_URL`.
    pub upstream: String,
    /// The store's database URL: `sqlite://...` or `postgres://...` (also
    /// the PostgreSQL of the tiered store). Env override: `DATABASE_URL`.
    #[serde(default = "store")]
    pub store: String,
    /// Which store: `sql` (the database URL, the default), `redis`,
    /// `tiered` or `nats`. Env override: `STORE_KIND`.
    #[serde(default, deserialize_with = "de::parsed")]
    pub store_kind: StoreKind,
    /// Redis, or Redis Cluster when it lists several comma-separated node
    /// URLs. Env override: `REDIS_URL`.
    #[serde(default)]
    pub redis: Option<String>,
    /// The prefix of every Redis key (several gateways can share a Redis).
    #[serde(default = "redis_prefix")]
    pub redis_prefix: String,
    /// NATS (`store_kind = "nats"`): one server or several comma-separated
    /// (`host:port`). Env override: `NATS_URL`.
    #[serde(default)]
    pub nats: Option<String>,
    /// The NATS KV bucket of the records (created if missing).
    #[serde(default = "nats_bucket")]
    pub nats_bucket: String,
    /// Whether to apply the store's migrations on start.
    #[serde(default = "migrate")]
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
    #[serde(default = "require_sealed")]
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

fn listen() -> SocketAddr {
    // Loopback: a gateway exposed to the world is a decision, not a default.
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn store() -> String {
    // An SQLite file beside the process: a first run needs no server.
    "sqlite://idempotency-gateway.db?mode=rwc".to_owned()
}

fn redis_prefix() -> String {
    // The layer's and the service's default: they read the same records.
    "idem".to_owned()
}

fn nats_bucket() -> String {
    idempotency_guard::store::NatsOptions::DEFAULT_BUCKET.to_owned()
}

fn migrate() -> bool {
    // The migrations are idempotent: a first run needs no other step.
    true
}

fn require_sealed() -> bool {
    // See the field: a new deployment stores nothing in clear.
    true
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

    /// Parses a configuration from TOML text, every value typed.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] for bad TOML, an unknown field, or a value
    /// its setting cannot take (a choice not among its choices, a negative
    /// duration, a status or method that does not exist), with the line
    /// and column of the value.
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
        options.kind = self.store_kind;
        options.redis_url = self.redis.as_deref();
        options.nats = self.nats_options();
        options.check(STORE_SETTING_NAMES)?;
        self.encryption_keys()?;
        Ok(())
    }

    /// The NATS store's settings (`nats`, `nats_bucket`), when `nats` is set.
    pub fn nats_options(&self) -> Option<idempotency_guard::store::NatsOptions<'_>> {
        self.nats
            .as_deref()
            .map(|url| idempotency_guard::store::NatsOptions {
                url,
                bucket: &self.nats_bucket,
                replicas: None,
            })
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

    /// Checks what parsing cannot: the upstream URL, no path twice, no route on the gateway's own paths, a route's
    /// settings that fit its type, and the rules that tie settings
    /// together (a lease of at least a second, records that outlive a
    /// run, a buffer budget that holds one body, nonzero caps).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the first problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.upstream_uri()?;
        let mut seen = std::collections::HashSet::new();
        for route in &self.routes {
            route.validate_path()?;
            if !seen.insert(route.path.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "route {}: named twice",
                    route.path
                )));
            }
            route.validate_settings()?;
        }
        let p = &self.policy;
        if p.lease < std::time::Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "policy.lease_seconds must be at least 1".to_owned(),
            ));
        }
        // The engine's rule (a running request's record must outlive it):
        // checked here, so a bad value is this one line and exit 2, never
        // the engine's panic when the layer is built.
        if p.retention <= p.max_handler_time.saturating_add(p.lease) {
            return Err(ConfigError::Invalid(
                "policy.retention_seconds must exceed policy.max_handler_seconds + policy.lease_seconds"
                    .to_owned(),
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
        Ok(())
    }
}

#[cfg(test)]
mod tests;
