//! `[limits]`: body limits of guarded requests.

use serde::Deserialize;

/// Body limits of guarded requests (unguarded ones stream, unbounded).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest guarded request body (413 `body-too-large` beyond).
    pub body_bytes: usize,
    /// The largest response stored for replay (larger ones reach the first
    /// caller; replays answer 409 `response-not-stored`).
    pub stored_response_bytes: usize,
    /// The most bytes of guarded request bodies buffered at once, over every
    /// route: a declared `Content-Length` is reserved before the body is
    /// read, a chunked body as it arrives, until the guard answers. Past it:
    /// 503 `body-buffer-full` with `Retry-After`, nothing forwarded. At
    /// least `body_bytes`.
    pub buffered_body_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            // Guarded bodies are buffered to fingerprint and store them.
            body_bytes: 1024 * 1024,
            // The same mebibyte: a replay is as large as what was stored.
            stored_response_bytes: 1024 * 1024,
            // 64 bodies of the default limit at once: far above what honest
            // clients hold; clients holding bodies open then cost at most
            // about 1.5 x 64 MiB + 8 MiB of RSS, where 50 of them took 134
            // MB RSS and 80 took 200 MB without a budget.
            buffered_body_bytes: 64 * 1024 * 1024,
        }
    }
}
