//! What a handler's response is, as far as storing it goes: the replay
//! marker and the default rule of stored statuses (capturing its body is
//! `layer::body`'s).

use http::{HeaderName, StatusCode};

/// The response header that marks a replay: `Idempotent-Replayed: true`.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// An error from a body, boxed.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default rule for which responses are stored: every status below 500
/// except 408, 425 and 429, which say "try again" rather than "this is the
/// answer".
pub fn default_stored_status(status: StatusCode) -> bool {
    status.as_u16() < 500 && !matches!(status.as_u16(), 408 | 425 | 429)
}

pub(crate) use crate::headers::is_no_store;

pub(crate) use crate::headers::headers_to_store;

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, header};

    #[test]
    fn stores_what_the_spec_says() {
        for code in [200, 201, 204, 301, 400, 404, 409, 422] {
            assert!(
                default_stored_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
        for code in [408, 425, 429, 500, 502, 503, 504] {
            assert!(
                !default_stored_status(StatusCode::from_u16(code).unwrap()),
                "{code}"
            );
        }
    }

    #[test]
    fn no_store_is_found_among_other_directives() {
        let mut headers = HeaderMap::new();
        assert!(!is_no_store(&headers));
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("private, No-Store"),
        );
        assert!(is_no_store(&headers));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        assert!(!is_no_store(&headers));
    }

    #[test]
    fn drops_hop_by_hop_and_excluded_headers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "x-conn-only"),
            ("x-conn-only", "1"),
            ("transfer-encoding", "chunked"),
            ("proxy-connection", "keep-alive"),
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("set-cookie", "a=b"),
            ("location", "/payments/1"),
            ("content-type", "application/json"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let kept = headers_to_store(&headers, &[header::DATE, header::SET_COOKIE]);
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["location", "content-type"]);
    }
}
