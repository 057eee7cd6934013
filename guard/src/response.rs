//! Capturing a handler's response for storage, and replaying a stored one.

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, stream};
use http::{HeaderName, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, BodyStream};

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

/// A response body read up to the stored-response limit.
pub(crate) enum Captured<B> {
    /// The whole body fit.
    Whole(Bytes),
    /// The body exceeds the limit: what was read, and the rest still unread.
    TooLarge {
        /// The bytes read so far (a little over the limit).
        prefix: Bytes,
        /// The body, positioned after `prefix`.
        rest: B,
    },
}

/// Reads a response body until its end or until it exceeds `limit` bytes.
/// Trailers are not kept.
pub(crate) async fn capture<B>(mut body: B, limit: usize) -> Result<Captured<B>, BoxError>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
            if buffer.len() > limit {
                return Ok(Captured::TooLarge {
                    prefix: buffer.freeze(),
                    rest: body,
                });
            }
        }
    }
    Ok(Captured::Whole(buffer.freeze()))
}

/// A body that sends `prefix` and then streams the rest of `rest`.
pub(crate) fn resume<B>(prefix: Bytes, rest: B) -> Body
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let rest = BodyStream::new(rest)
        .map(|frame| frame.map_err(Into::<BoxError>::into))
        .filter_map(|frame| {
            // Data frames go on; trailers are dropped.
            std::future::ready(match frame {
                Ok(frame) => frame.into_data().ok().map(Ok),
                Err(error) => Some(Err(error)),
            })
        });
    Body::from_stream(stream::once(async move { Ok::<_, BoxError>(prefix) }).chain(rest))
}

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

    #[tokio::test]
    async fn captures_small_bodies_whole_and_streams_large_ones_on() {
        let small = capture(Body::from("hello"), 5).await.unwrap();
        assert!(matches!(small, Captured::Whole(ref b) if b == "hello"));
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            (0..4).map(|i| Ok(Bytes::from(vec![b'a' + i; 4]))).collect();
        let large = Body::from_stream(stream::iter(chunks));
        match capture(large, 6).await.unwrap() {
            Captured::TooLarge { prefix, rest } => {
                assert_eq!(prefix, "aaaabbbb");
                let all = resume(prefix, rest).collect().await.unwrap().to_bytes();
                assert_eq!(all, "aaaabbbbccccdddd");
            }
            Captured::Whole(_) => panic!("a body over the limit was captured whole"),
        }
    }
}
