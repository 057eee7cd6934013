//! `[proxy]`: how requests are forwarded.

use std::time::Duration;

use serde::Deserialize;

use super::de;

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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Speak HTTP/2 to the upstream (prior knowledge, `h2c`).
    pub http2: bool,
    /// See [`HostHeader`].
    pub host: HostHeader,
    /// How long a connection to the upstream may take to open. TOML:
    /// `connect_timeout_seconds`.
    #[serde(rename = "connect_timeout_seconds", deserialize_with = "de::seconds")]
    pub connect_timeout: Duration,
    /// How long the upstream may take to answer with its status and
    /// headers, once the request was sent. Past it a guarded key becomes
    /// abandoned (the request may have run). TOML: `timeout_seconds`.
    #[serde(rename = "timeout_seconds", deserialize_with = "de::seconds")]
    pub timeout: Duration,
    /// Idle keep-alive connections kept per upstream host.
    pub pool_max_idle: usize,
    /// How long an idle pooled connection is kept. TOML:
    /// `pool_idle_seconds`.
    #[serde(rename = "pool_idle_seconds", deserialize_with = "de::seconds")]
    pub pool_idle: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            // HTTP/1.1 is what every backend speaks.
            http2: false,
            // A backend routing by virtual host expects its own name.
            host: HostHeader::Upstream,
            // A connection that takes longer is a backend that is not there.
            connect_timeout: Duration::from_secs(5),
            // As nginx's proxy_read_timeout.
            timeout: Duration::from_secs(60),
            // Enough for a busy gateway; idle ones close after pool_idle.
            pool_max_idle: 256,
            // Below the usual backend keep-alive (Node 5 s, gunicorn 2 s is
            // lower: a connection closed by the backend is retried by the
            // pool).
            pool_idle: Duration::from_secs(30),
        }
    }
}
