//! The command line: subcommands and one flat set of flags, each with an
//! environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The key-status service: tells a client that lost its answer whether its
/// idempotency key already ran.
#[derive(Debug, Parser)]
#[command(name = "idempotency-service", version, about)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every subcommand.
    #[command(flatten)]
    pub config: Config,
}

/// The subcommands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Serve the status API (the default).
    Serve,
    /// Apply pending migrations and exit: safe to run from several deploy
    /// jobs at once; exits non-zero with the reason when it fails.
    Migrate,
}

/// Settings, as flags with environment fallbacks.
#[derive(Debug, Clone, Parser)]
pub struct Config {
    /// The store: `postgres://...` or `sqlite://...` (the same database the
    /// guarded app uses).
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite://idempotency.db")]
    pub database_url: String,
    /// Where the records live: `sql` (the database URL's store), `redis`
    /// (Redis, or Redis Cluster when the Redis URL lists several nodes),
    /// `tiered` (Redis in front of PostgreSQL) or `nats` (a NATS JetStream
    /// KV bucket).
    #[arg(long, env = "STORE", default_value = "sql")]
    pub store: idempotency_guard::store::StoreKind,
    /// Redis: `redis://host:port`, or comma-separated node URLs of a cluster.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// The prefix of every Redis key the store writes.
    #[arg(long, env = "REDIS_PREFIX", default_value = "idem")]
    pub redis_prefix: String,
    /// NATS: `host:port`, or comma-separated servers of a cluster.
    #[arg(long, env = "NATS_URL")]
    pub nats_url: Option<String>,
    /// The NATS KV bucket of the records (the guarded app's).
    #[arg(long, env = "NATS_BUCKET", default_value = idempotency_guard::store::NatsOptions::DEFAULT_BUCKET)]
    pub nats_bucket: String,
    /// The address to listen on.
    #[arg(long, env = "LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// A file of `<scope> <token>` lines (`#` starts a comment).
    #[arg(long, env = "TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// `<scope> <token>` pairs, separated by `;` or newlines, beside (or
    /// instead of) the file.
    #[arg(long, env = "TOKENS", hide_env_values = true)]
    pub tokens: Option<String>,
    /// A file of admin tokens, `<name> <scopes> <token>` per line (`<scopes>`:
    /// comma-separated, or `*` for all); see the admin API's docs.
    #[arg(long, env = "ADMIN_TOKENS_FILE")]
    pub admin_tokens_file: Option<PathBuf>,
    /// `<name> <scopes> <token>` admin triples, separated by `;` or
    /// newlines, beside (or instead of) the file.
    #[arg(long, env = "ADMIN_TOKENS", hide_env_values = true)]
    pub admin_tokens: Option<String>,
    /// Serve the operators' console at `/console` (off by default): a page
    /// that calls the admin API with the admin token the operator types.
    #[arg(long, env = "CONSOLE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub console: bool,
    /// Seconds a console session may go unused before it ends (the operator signs in again).
    #[arg(long, env = "CONSOLE_SESSION_IDLE_SECS", default_value_t = 900)]
    pub console_session_idle_secs: u64,
    /// Seconds a console session lasts at most after its sign-in, used or
    /// not.
    #[arg(long, env = "CONSOLE_SESSION_MAX_SECS", default_value_t = 28_800)]
    pub console_session_max_secs: u64,
    /// Always mark the console's session cookie `Secure` (it is anyway
    /// when the console's page was served over `https://`).
    #[arg(long, env = "CONSOLE_SECURE_COOKIE", default_value_t = false, action = clap::ArgAction::Set)]
    pub console_secure_cookie: bool,
    /// The console's public origin (`https://ops.example.com`): a write
    /// signed in by a console session must carry it as its `Origin`.
    /// Unset: the `Origin`'s host must be the `Host` the request was sent
    /// to.
    #[arg(long, env = "CONSOLE_ORIGIN")]
    pub console_origin: Option<String>,
    /// A file of JSON lines keeping the records operators marked
    /// reconciled (created when missing); without it the marks are kept
    /// in memory and lost at restart.
    #[arg(long, env = "RECONCILED_FILE")]
    pub reconciled_file: Option<PathBuf>,
    /// Seconds between purges of expired records (0: never purge).
    #[arg(long, env = "PURGE_INTERVAL_SECS", default_value_t = 60)]
    pub purge_interval_secs: u64,
    /// Apply pending migrations when serving starts.
    #[arg(long, env = "MIGRATE_ON_START", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate_on_start: bool,
    /// The `retry_after_seconds` hint for in-flight keys.
    #[arg(long, env = "RETRY_AFTER_SECS", default_value_t = 1)]
    pub retry_after_secs: u64,
    /// Seconds a client may take to send a request head (HTTP/1.1); the
    /// connection is closed past it.
    #[arg(long, env = "HEADER_READ_SECS", default_value_t = 10)]
    pub header_read_secs: u64,
    /// Seconds a connection may stay open with no request being answered
    /// on it (fresh, or between keep-alive requests).
    #[arg(long, env = "IDLE_SECS", default_value_t = 60)]
    pub idle_secs: u64,
    /// Seconds a request body may take to arrive after its head (408
    /// `body-timeout` past it).
    #[arg(long, env = "BODY_SECS", default_value_t = 30)]
    pub body_secs: u64,
    /// Seconds between HTTP/2 keep-alive pings.
    #[arg(long, env = "HTTP2_PING_SECS", default_value_t = 20)]
    pub http2_ping_secs: u64,
    /// Seconds an HTTP/2 ping may go unanswered before the connection is
    /// closed.
    #[arg(long, env = "HTTP2_PING_TIMEOUT_SECS", default_value_t = 20)]
    pub http2_ping_timeout_secs: u64,
    /// The most client connections open at once, lowered at start to fit
    /// the descriptor limit (raised to its hard limit); at the cap a new
    /// connection closes the oldest idle one.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// The longest request target (path and query), in bytes (414
    /// `uri-too-long` past it).
    #[arg(long, env = "MAX_URI_BYTES", default_value_t = 8192)]
    pub max_uri_bytes: usize,
    /// The most bytes of request header names and values, together (431
    /// `headers-too-large` past it).
    #[arg(long, env = "MAX_HEADER_BYTES", default_value_t = 32_768)]
    pub max_header_bytes: usize,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "LOG_JSON", default_value_t = false, action = clap::ArgAction::Set)]
    pub log_json: bool,
}

/// A setting that cannot work, found before anything starts: the message
/// names the variable and what it expects.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A store setting (`STORE`, `DATABASE_URL`, `REDIS_URL`), checked by
    /// the guard's one set of rules.
    #[error(transparent)]
    Store(#[from] idempotency_guard::store::SettingsError),
    /// A connection deadline or limit of 0.
    #[error("{variable} must be at least 1")]
    Zero {
        /// The variable.
        variable: &'static str,
    },
    /// `CONSOLE_ORIGIN` is not an origin.
    #[error("CONSOLE_ORIGIN must be an origin: http(s)://host[:port], no path (got {value:?})")]
    ConsoleOrigin {
        /// What was given.
        value: String,
    },
}

impl Config {
    /// Checks the settings that can be checked without a server.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] found.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (variable, value) in [
            ("HEADER_READ_SECS", self.header_read_secs),
            ("IDLE_SECS", self.idle_secs),
            ("BODY_SECS", self.body_secs),
            ("HTTP2_PING_SECS", self.http2_ping_secs),
            ("HTTP2_PING_TIMEOUT_SECS", self.http2_ping_timeout_secs),
            ("MAX_CONNECTIONS", self.max_connections as u64),
            ("MAX_URI_BYTES", self.max_uri_bytes as u64),
            ("MAX_HEADER_BYTES", self.max_header_bytes as u64),
            ("CONSOLE_SESSION_IDLE_SECS", self.console_session_idle_secs),
            ("CONSOLE_SESSION_MAX_SECS", self.console_session_max_secs),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { variable });
            }
        }
        if let Some(origin) = &self.console_origin {
            let host = origin
                .strip_prefix("https://")
                .or_else(|| origin.strip_prefix("http://"))
                .map(|host| host.trim_end_matches('/'));
            if host.is_none_or(|host| host.is_empty() || host.contains(['/', '?', '#', ' '])) {
                return Err(ConfigError::ConsoleOrigin {
                    value: origin.clone(),
                });
            }
        }
        use idempotency_guard::store::{SettingNames, StoreOptions};
        let mut options = StoreOptions::sql(&self.database_url);
        options.kind = self.store;
        options.redis_url = self.redis_url.as_deref();
        options.nats = self.nats();
        options.check(SettingNames::ENVIRONMENT)?;
        Ok(())
    }

    /// The NATS store's settings, when a NATS URL is set.
    pub fn nats(&self) -> Option<idempotency_guard::store::NatsOptions<'_>> {
        self.nats_url
            .as_deref()
            .map(|url| idempotency_guard::store::NatsOptions {
                url,
                bucket: &self.nats_bucket,
                replicas: None,
            })
    }

    /// How the console's sessions expire and are checked.
    pub fn console_sessions(&self) -> crate::admin::SessionSettings {
        use std::time::Duration;
        crate::admin::SessionSettings {
            idle: Duration::from_secs(self.console_session_idle_secs),
            lifetime: Duration::from_secs(self.console_session_max_secs),
            secure_cookie: self.console_secure_cookie,
            origin: self.console_origin.clone(),
        }
    }

    /// The connection bounds of the server (the same as the gateway's
    /// `[server]` and their defaults).
    pub fn server(&self) -> idempotency_guard::server::Server {
        use std::time::Duration;
        idempotency_guard::server::Server::new()
            .with_header_read_timeout(Duration::from_secs(self.header_read_secs))
            .with_idle_timeout(Duration::from_secs(self.idle_secs))
            .with_http2_keep_alive(
                Duration::from_secs(self.http2_ping_secs),
                Duration::from_secs(self.http2_ping_timeout_secs),
            )
            .with_max_connections(self.max_connections.max(1))
            .with_max_uri_bytes(self.max_uri_bytes)
            .with_max_header_bytes(self.max_header_bytes)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn config(args: &[&str]) -> Config {
        Cli::try_parse_from(std::iter::once("idempotency-service").chain(args.iter().copied()))
            .unwrap()
            .config
    }

    #[test]
    fn the_console_session_settings_default_and_are_checked() {
        assert_eq!(
            config(&[]).console_sessions(),
            crate::admin::SessionSettings::default(),
            "the flags' defaults are the settings' own"
        );
        for good in ["https://ops.example.com", "http://127.0.0.1:8080/"] {
            assert!(
                config(&["--console-origin", good]).check().is_ok(),
                "{good}"
            );
        }
        for bad in [
            "ops.example.com",
            "https://ops.example.com/console",
            "https://",
        ] {
            assert!(
                matches!(
                    config(&["--console-origin", bad]).check(),
                    Err(ConfigError::ConsoleOrigin { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            config(&["--console-session-idle-secs", "0"]).check(),
            Err(ConfigError::Zero {
                variable: "CONSOLE_SESSION_IDLE_SECS"
            })
        ));
    }
}
