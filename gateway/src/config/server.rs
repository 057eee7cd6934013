//! `[server]`: deadlines and caps of client connections.

use std::time::Duration;

use serde::Deserialize;

use super::de;

/// Deadlines and caps of client connections: slow or idle clients cannot
/// hold the gateway's descriptors or memory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// How long a client may take to send a request head (HTTP/1.1); the
    /// connection is closed past it. TOML: `header_read_seconds`.
    #[serde(rename = "header_read_seconds", deserialize_with = "de::seconds")]
    pub header_read: Duration,
    /// How long a connection may stay open without a request being
    /// answered on it (fresh, between keep-alive requests). TOML:
    /// `idle_seconds`.
    #[serde(rename = "idle_seconds", deserialize_with = "de::seconds")]
    pub idle: Duration,
    /// How long a guarded route's request body may take to arrive after
    /// its head (408 `body-timeout` past it). TOML: `body_seconds`.
    #[serde(rename = "body_seconds", deserialize_with = "de::seconds")]
    pub body: Duration,
    /// The interval of HTTP/2 keep-alive pings. TOML:
    /// `http2_ping_seconds`.
    #[serde(rename = "http2_ping_seconds", deserialize_with = "de::seconds")]
    pub http2_ping: Duration,
    /// How long an HTTP/2 ping may go unanswered before the connection is
    /// closed. TOML: `http2_ping_timeout_seconds`.
    #[serde(
        rename = "http2_ping_timeout_seconds",
        deserialize_with = "de::seconds"
    )]
    pub http2_ping_timeout: Duration,
    /// The most client connections open at once; lowered to fit the
    /// descriptor limit (see [`idempotency_guard::server`]). At the cap a
    /// new connection closes the oldest idle one.
    pub max_connections: usize,
    /// The longest request target (path and query), in bytes; longer: 414
    /// `uri-too-long` (problem+json).
    pub max_uri_bytes: usize,
    /// The most bytes of request header names and values, together; more:
    /// 431 `headers-too-large` (problem+json). Heads far over both limits
    /// are refused by hyper itself, with an empty body (see
    /// [`idempotency_guard::server`]).
    pub max_header_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            // A real client sends its head at once; nginx's
            // client_header_timeout is 60 s, which lets a trickling client
            // hold a socket for a minute.
            header_read: Duration::from_secs(10),
            // Above the usual client keep-alive (browsers' 60 s would be
            // cut, but API clients reconnect); nginx's keepalive_timeout is
            // 75 s.
            idle: Duration::from_secs(60),
            // 1 MiB (the default body limit) at 35 KiB/s.
            body: Duration::from_secs(30),
            // With the timeout below, a dead peer is found within 40 s.
            http2_ping: Duration::from_secs(20),
            // hyper's default.
            http2_ping_timeout: Duration::from_secs(20),
            // Far above one gateway's useful concurrency; the descriptor
            // limit usually lowers it.
            max_connections: 10_000,
            // nginx's large_client_header_buffers: one 8k buffer per line.
            max_uri_bytes: 8 * 1024,
            // nginx's large_client_header_buffers: four 8k buffers.
            max_header_bytes: 32 * 1024,
        }
    }
}
