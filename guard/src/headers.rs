//! The header rules the guard and its adapters share, written once: which
//! headers belong to one connection (never stored for a replay, never
//! forwarded by a proxy), which are never stored, whether a response says
//! `no-store`, and `Retry-After` in whole seconds.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// The hop-by-hop headers: they describe one connection, never the
/// message, so a stored response drops them and a proxy never forwards
/// them. Beside them, every header the `Connection` header names is one
/// too ([`named_by_connection`]).
///
/// These are RFC 9110 section 7.6.1's (`Connection`, `Proxy-Connection`,
/// `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`), plus `Trailer`
/// (about this message's framing) and `Proxy-Authenticate` /
/// `Proxy-Authorization` (between a client and its proxy, not the
/// origin). `Proxy-Connection` is a non-standard `Connection` sent by old
/// clients: a proxy must drop it, and a stored response is right to drop
/// it too (a replay goes over another connection). `Upgrade` is listed
/// because upgrades (WebSocket) are neither proxied nor replayed.
///
/// The order is [`hop_by_hop_index`]'s. (A `static`: a `const` array
/// would be built and dropped at every use.)
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The index in [`HOP_BY_HOP`] of a hop-by-hop header's name, `None` for
/// any other (a match on the text: cheaper than comparing the names one
/// by one).
pub fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// Whether `name` is one of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_by_hop_index(name).is_some()
}

/// The headers the `Connection` header names (`Connection: x-a, x-b`):
/// hop-by-hop as well. Names that are not valid header names are skipped.
pub fn named_by_connection(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

/// Removes the hop-by-hop headers, and those the `Connection` header
/// names, in place (what a proxy does before forwarding).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests have none, most answers only `Connection: keep-alive`:
    // one pass over the headers notes which are there (a bit each), so
    // only those pay for a hashed removal.
    let mut present = 0u16;
    // Whether a `Connection` value may name other headers (anything but
    // the usual `keep-alive` or `close`).
    let mut names_others = false;
    for (name, value) in headers.iter() {
        if let Some(index) = hop_by_hop_index(name) {
            present |= 1 << index;
            if index == 0 {
                let value = value.as_bytes();
                names_others |= !(value.eq_ignore_ascii_case(b"keep-alive")
                    || value.eq_ignore_ascii_case(b"close"));
            }
        }
    }
    if present == 0 {
        return;
    }
    if names_others {
        for name in &named_by_connection(headers) {
            headers.remove(name);
        }
    }
    for (index, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << index) != 0 {
            headers.remove(name);
        }
    }
}

/// The headers a stored response leaves out beside the hop-by-hop ones,
/// unless configured otherwise (the default of
/// [`IdempotencyLayer::with_excluded_headers`](crate::IdempotencyLayer::with_excluded_headers)):
/// `Date` (stale on replay) and `Set-Cookie` (a session is not a result).
/// Adapters that store answers of their own (gRPC) leave them out too.
pub static EXCLUDED_BY_DEFAULT: [HeaderName; 2] = [header::DATE, header::SET_COOKIE];

/// The headers of a response that are kept for replay: all but hop-by-hop
/// headers ([`HOP_BY_HOP`], and those the `Connection` header names) and
/// `excluded` (usually [`EXCLUDED_BY_DEFAULT`] and an adapter's own).
pub fn headers_to_store(headers: &HeaderMap, excluded: &[HeaderName]) -> HeaderMap {
    let named_by_connection = named_by_connection(headers);
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let dropped =
            is_hop_by_hop(name) || named_by_connection.contains(name) || excluded.contains(name);
        if !dropped {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

/// Whether the response says `Cache-Control: no-store` (among other
/// directives, in any case).
pub fn is_no_store(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|directive| directive.trim().eq_ignore_ascii_case("no-store"))
}

/// `Retry-After` in whole seconds, rounded up so a client never asks early.
pub fn retry_after_value(duration: Duration) -> HeaderValue {
    HeaderValue::from(retry_after_seconds(duration))
}

/// A `Retry-After` hint in whole seconds, rounded up so a client never
/// asks early: the number every adapter renders (the `Retry-After` header
/// of a problem, JSON-RPC's `error.data.retry_after`).
///
/// ```
/// use std::time::Duration;
/// use idempotency_guard::headers::retry_after_seconds;
///
/// assert_eq!(retry_after_seconds(Duration::from_millis(1500)), 2);
/// assert_eq!(retry_after_seconds(Duration::from_secs(3)), 3);
/// ```
pub fn retry_after_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_names_each_hop_by_hop_header_at_its_place() {
        for (index, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(index), "{name}");
        }
        for name in [header::CONTENT_TYPE, header::LOCATION, header::SET_COOKIE] {
            assert!(!is_hop_by_hop(&name), "{name}");
        }
    }

    #[test]
    fn strips_hop_by_hop_headers_and_those_connection_names() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-private"),
            ("proxy-connection", "keep-alive"),
            ("x-private", "secret"),
            ("trailer", "x-checksum"),
            ("content-type", "application/json"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-type"]);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_value(Duration::from_millis(1500)), "2");
        assert_eq!(retry_after_value(Duration::from_secs(3)), "3");
        assert_eq!(retry_after_value(Duration::from_nanos(1)), "1");
        assert_eq!(retry_after_value(Duration::ZERO), "0");
    }
}
