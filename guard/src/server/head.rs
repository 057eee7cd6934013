//! The bounds of a request head: a target over `max_uri_bytes` is a 414
//! `uri-too-long`, header fields over `max_header_bytes` a 431
//! `headers-too-large`, both problem+json, answered before the service
//! sees the request.
//!
//! hyper reads the head first, under a hard bound set above these
//! ([`HeadLimits::hard_limit`]); what it refuses itself it answers with an
//! empty body (see the [module docs](super)).

use axum::body::Body;
use axum::response::IntoResponse;
use http::{HeaderValue, Request, Response, Version, header};

use crate::problem::types;

/// The most header fields hyper parses in an HTTP/1.1 head (its default);
/// a head with more is answered by hyper itself, 431 with no body.
pub(crate) const HYPER_MAX_HEADERS: usize = 100;

/// The bounds of a request head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadLimits {
    /// The longest request target (path and query), in bytes.
    pub(crate) max_uri_bytes: usize,
    /// The most bytes of header names and values, together.
    pub(crate) max_header_bytes: usize,
}

impl HeadLimits {
    /// The bound under which hyper reads a head (HTTP/1.1: its read buffer,
    /// `max_buf_size`; HTTP/2: `SETTINGS_MAX_HEADER_LIST_SIZE`): room for a target at the
    /// limit and twice the header bytes, so a head somewhat over a limit
    /// still reaches [`HeadLimits::refusal`] and gets its problem+json.
    pub(crate) fn hard_limit(self) -> usize {
        self.max_uri_bytes
            .saturating_add(self.max_header_bytes.saturating_mul(2))
            .saturating_add(HYPER_MAX_HEADERS * 4)
            .max(8192)
    }

    /// The answer to a request whose head is over a bound, if it is.
    pub(crate) fn refusal<B>(self, request: &Request<B>) -> Option<Response<Body>> {
        let target = request
            .uri()
            .path_and_query()
            .map_or(0, |target| target.as_str().len());
        let mut refusal = if target > self.max_uri_bytes {
            types::URI_TOO_LONG.problem(format!(
                "The request target is longer than {} bytes.",
                self.max_uri_bytes
            ))
        } else {
            let bytes: usize = request
                .headers()
                .iter()
                .map(|(name, value)| name.as_str().len() + value.len())
                .sum();
            if bytes <= self.max_header_bytes {
                return None;
            }
            types::HEADERS_TOO_LARGE.problem(format!(
                "The request's header names and values add up to more than {} bytes.",
                self.max_header_bytes
            ))
        }
        .into_response();
        if request.version() <= Version::HTTP_11 {
            // The body, if any, is not read: the connection cannot be reused.
            refusal
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Some(refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    const LIMITS: HeadLimits = HeadLimits {
        max_uri_bytes: 64,
        max_header_bytes: 100,
    };

    fn request(target: &str, header_bytes: usize) -> Request<()> {
        Request::builder()
            .uri(target)
            .header("x-padding", "a".repeat(header_bytes - "x-padding".len()))
            .body(())
            .expect("a request")
    }

    #[test]
    fn a_head_at_its_limits_passes_and_one_byte_over_is_refused() {
        assert!(LIMITS.refusal(&request("/", 100)).is_none());
        let target = format!("/{}", "a".repeat(63));
        assert!(LIMITS.refusal(&request(&target, 100)).is_none());
        let long = format!("/{}", "a".repeat(64));
        let refused = LIMITS.refusal(&request(&long, 10)).expect("refused");
        assert_eq!(refused.status(), StatusCode::URI_TOO_LONG);
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        let refused = LIMITS.refusal(&request("/", 101)).expect("refused");
        assert_eq!(
            refused.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        assert_eq!(
            refused.headers()[header::CONTENT_TYPE],
            crate::problem::PROBLEM_JSON
        );
    }

    #[test]
    fn the_hard_limit_leaves_room_above_the_checked_ones() {
        assert!(LIMITS.hard_limit() >= 8192);
        let defaults = HeadLimits {
            max_uri_bytes: 8192,
            max_header_bytes: 32 * 1024,
        };
        assert_eq!(defaults.hard_limit(), 8192 + 64 * 1024 + 400);
    }
}
