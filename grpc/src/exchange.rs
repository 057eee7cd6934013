//! One unary answer as the guard keeps it: the response metadata (headers),
//! the message bytes (the length-prefixed frames of the body, as sent) and
//! the trailers (`grpc-status`, `grpc-message`, `grpc-status-details-bin`
//! and the handler's trailing metadata), captured from the handler's
//! response, packed into a [`StoredResponse`] and sent again byte for byte.
//!
//! Stored layout: the record's status is 200 (gRPC's HTTP status), its
//! headers the response metadata, and its body
//! `[version = 1][flags][u32 big-endian length][message bytes][trailer lines]`,
//! flags bit 0 set when the answer had a trailers frame (an answer with
//! the status in its headers, "trailers-only", has none). Trailer lines
//! are encoded as the record's headers are (`name: value\r\n`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use idempotency_guard::headers::{EXCLUDED_BY_DEFAULT, headers_to_store};
use idempotency_guard::{IDEMPOTENT_REPLAYED, StoredResponse};
use tonic::Code;

use crate::outcome::{FINAL_STATUS, OUTCOME_UNKNOWN_STATUS};

/// A boxed error from a body.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The trailer that carries the status code.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

const VERSION: u8 = 1;
const HAS_TRAILERS: u8 = 1;

/// What is never stored nor replayed: the guard's own rules (the
/// hop-by-hop fields, which HTTP/2 forbids, and
/// [`EXCLUDED_BY_DEFAULT`](idempotency_guard::headers::EXCLUDED_BY_DEFAULT):
/// `Date`, `Set-Cookie`), `Content-Length` (the frames carry their own)
/// and the guard's own markers.
static NOT_KEPT: LazyLock<Vec<HeaderName>> = LazyLock::new(|| {
    let mut names = EXCLUDED_BY_DEFAULT.to_vec();
    names.extend([
        header::CONTENT_LENGTH,
        HeaderName::from_static(FINAL_STATUS),
        HeaderName::from_static(OUTCOME_UNKNOWN_STATUS),
        IDEMPOTENT_REPLAYED.clone(),
    ]);
    names
});

/// One captured answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exchange {
    /// The response metadata.
    pub(crate) headers: HeaderMap,
    /// The body's bytes: the length-prefixed message frames.
    pub(crate) message: Bytes,
    /// The trailers, when the answer had a trailers frame.
    pub(crate) trailers: Option<HeaderMap>,
}

/// How reading a handler's whole answer went (its message and its
/// trailers; the guard's `adapter::Captured` keeps a body alone).
pub(crate) enum AnswerRead {
    /// Read to its end, within the limit.
    Whole(Exchange),
    /// Over the limit: `response` streams the rest to this caller; nothing
    /// can be stored for replay.
    TooLarge(Response<tonic::body::Body>),
    /// The body failed before its end.
    Broken(BoxError),
}

/// Reads `response` to its end, keeping at most `limit` bytes of message.
/// Not the guard's `adapter::capture`: a gRPC answer's status is in its
/// trailers, which are kept here and dropped there.
pub(crate) async fn read_answer<B>(response: Response<B>, limit: usize) -> AnswerRead
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let mut body = Box::pin(body);
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => return AnswerRead::Broken(error.into()),
        };
        match frame.into_data() {
            Ok(data) => {
                size += data.len();
                chunks.push(data);
                if size > limit {
                    let prefix = futures_util::stream::iter(
                        chunks
                            .into_iter()
                            .map(|data| Ok::<_, BoxError>(Frame::data(data))),
                    );
                    let rest =
                        BodyStream::new(body).map(|frame| frame.map_err(Into::<BoxError>::into));
                    let body = tonic::body::Body::new(StreamBody::new(prefix.chain(rest)));
                    return AnswerRead::TooLarge(Response::from_parts(parts, body));
                }
            }
            Err(frame) => {
                if let Ok(map) = frame.into_trailers() {
                    trailers.get_or_insert_with(HeaderMap::new).extend(map);
                }
            }
        }
    }
    let message = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => chunks.concat().into(),
    };
    AnswerRead::Whole(Exchange {
        headers: parts.headers,
        message,
        trailers,
    })
}

impl Exchange {
    /// The answer's status code: from its trailers, or from its headers
    /// for a trailers-only answer; `None` when it has no valid one.
    pub(crate) fn code(&self) -> Option<Code> {
        let value = self
            .trailers
            .as_ref()
            .and_then(|trailers| trailers.get(&GRPC_STATUS))
            .or_else(|| self.headers.get(&GRPC_STATUS))?;
        let code: i32 = value.to_str().ok()?.parse().ok()?;
        (0..=16).contains(&code).then(|| Code::from_i32(code))
    }

    /// Removes the handler's final marker (see [`crate::mark_final`]) from
    /// the answer; answers whether it was there.
    pub(crate) fn take_final_marker(&mut self) -> bool {
        let in_headers = self.headers.remove(FINAL_STATUS).is_some();
        let in_trailers = self
            .trailers
            .as_mut()
            .is_some_and(|trailers| trailers.remove(FINAL_STATUS).is_some());
        in_headers || in_trailers
    }

    /// Removes the handler's outcome-unknown marker (see
    /// [`crate::mark_outcome_unknown`]) from the answer; whether it was there.
    pub(crate) fn take_outcome_unknown_marker(&mut self) -> bool {
        let in_headers = self.headers.remove(OUTCOME_UNKNOWN_STATUS).is_some();
        let in_trailers = self
            .trailers
            .as_mut()
            .is_some_and(|trailers| trailers.remove(OUTCOME_UNKNOWN_STATUS).is_some());
        in_headers || in_trailers
    }

    /// The answer as the store keeps it.
    pub(crate) fn to_stored(&self) -> StoredResponse {
        let mut body = BytesMut::with_capacity(6 + self.message.len() + 128);
        body.put_u8(VERSION);
        body.put_u8(if self.trailers.is_some() {
            HAS_TRAILERS
        } else {
            0
        });
        // A unary message over 4 GiB is far over any stored-response limit.
        body.put_u32(u32::try_from(self.message.len()).unwrap_or(u32::MAX));
        body.put_slice(&self.message);
        if let Some(trailers) = &self.trailers {
            for (name, value) in &kept(trailers) {
                body.put_slice(name.as_str().as_bytes());
                body.put_slice(b": ");
                body.put_slice(value.as_bytes());
                body.put_slice(b"\r\n");
            }
        }
        StoredResponse {
            status: StatusCode::OK,
            headers: kept(&self.headers),
            body: Some(body.freeze()),
        }
    }

    /// The answer kept in `stored`; `None` when it is not one this crate
    /// wrote (corrupt, or the key was used by an HTTP route).
    pub(crate) fn from_stored(stored: StoredResponse) -> Option<Self> {
        let body = stored.body?;
        if body.len() < 6 || body[0] != VERSION {
            return None;
        }
        let flags = body[1];
        let length = u32::from_be_bytes([body[2], body[3], body[4], body[5]]) as usize;
        let end = 6usize
            .checked_add(length)
            .filter(|end| *end <= body.len())?;
        let message = body.slice(6..end);
        let trailers = if flags & HAS_TRAILERS != 0 {
            Some(StoredResponse::decode_headers(&body[end..]).ok()?)
        } else {
            None
        };
        Some(Self {
            headers: stored.headers,
            message,
            trailers,
        })
    }

    /// The answer as a response, marked `idempotent-replayed: true` when
    /// `replayed`, framed as tonic's own server frames it: an answer
    /// without message and trailers (a status in the headers) is
    /// trailers-only, one HEADERS frame with END_STREAM; any other is the
    /// headers, the message, then the trailers that end the stream.
    pub(crate) fn into_response(self, replayed: bool) -> Response<tonic::body::Body> {
        let body = tonic::body::Body::new(AnswerBody {
            message: (!self.message.is_empty()).then_some(self.message),
            trailers: self.trailers,
        });
        let mut response = Response::new(body);
        *response.headers_mut() = self.headers;
        if replayed {
            response.headers_mut().insert(
                IDEMPOTENT_REPLAYED.clone(),
                HeaderValue::from_static("true"),
            );
        }
        response
    }
}

/// A captured answer's body: its message, then its trailers. It reports
/// its end and its exact size, so hyper ends the stream on the last frame
/// it has (on the headers when it has none: trailers-only); a body that
/// cannot tell its end (a `StreamBody`) makes hyper send an empty DATA
/// frame with END_STREAM after a status in the headers, which gRPC C-core
/// clients (`grpcio`) read as `UNKNOWN`.
struct AnswerBody {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl HttpBody for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.message.take() {
            Some(message) => Some(Frame::data(message)),
            None => self.trailers.take().map(Frame::trailers),
        };
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.message.as_ref().map_or(0, |m| m.len() as u64))
    }
}

/// The fields of `map` that are kept.
fn kept(map: &HeaderMap) -> HeaderMap {
    headers_to_store(map, &NOT_KEPT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(trailers: bool) -> Exchange {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("x-request-cost", HeaderValue::from_static("3"));
        headers.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Dec 2026 21:00:00 GMT"),
        );
        let trailers = trailers.then(|| {
            let mut map = HeaderMap::new();
            map.insert("grpc-status", HeaderValue::from_static("0"));
            map.insert("grpc-message", HeaderValue::from_static("ok%20then"));
            map.insert(
                "grpc-status-details-bin",
                HeaderValue::from_static("CAUSBG5vcGU"),
            );
            map.append("x-trail", HeaderValue::from_static("a"));
            map.append("x-trail", HeaderValue::from_static("b"));
            map
        });
        Exchange {
            headers,
            message: Bytes::from_static(b"\0\0\0\0\x03abc"),
            trailers,
        }
    }

    #[test]
    fn a_stored_answer_comes_back_byte_for_byte_less_what_is_not_kept() {
        for with_trailers in [true, false] {
            let original = exchange(with_trailers);
            let back = Exchange::from_stored(original.to_stored()).unwrap();
            assert_eq!(back.message, original.message);
            assert_eq!(back.trailers, original.trailers);
            assert!(back.headers.get(header::DATE).is_none());
            assert_eq!(back.headers.get("x-request-cost").unwrap(), "3");
            assert_eq!(back.headers.len(), original.headers.len() - 1);
        }
    }

    #[test]
    fn the_code_comes_from_the_trailers_or_the_headers() {
        assert_eq!(exchange(true).code(), Some(Code::Ok));
        let mut only = exchange(false);
        assert_eq!(only.code(), None);
        only.headers
            .insert("grpc-status", HeaderValue::from_static("9"));
        assert_eq!(only.code(), Some(Code::FailedPrecondition));
        only.headers
            .insert("grpc-status", HeaderValue::from_static("99"));
        assert_eq!(only.code(), None);
    }

    #[test]
    fn the_final_marker_is_taken_out() {
        let mut answer = exchange(true);
        assert!(!answer.take_final_marker());
        if let Some(trailers) = answer.trailers.as_mut() {
            trailers.insert(FINAL_STATUS, HeaderValue::from_static("true"));
        }
        assert!(answer.take_final_marker());
        assert!(
            answer
                .trailers
                .as_ref()
                .unwrap()
                .get(FINAL_STATUS)
                .is_none()
        );
    }

    #[test]
    fn an_answer_body_reports_its_end_so_a_status_alone_is_trailers_only() {
        let body = |message: &'static [u8], trailers: bool| AnswerBody {
            message: (!message.is_empty()).then(|| Bytes::from_static(message)),
            trailers: trailers.then(HeaderMap::new),
        };
        // A status in the headers, nothing else: ended before any frame.
        assert!(body(b"", false).is_end_stream());
        assert_eq!(body(b"", false).size_hint().exact(), Some(0));
        // A message and trailers: the data, then the trailers, then the end.
        let mut answer = body(b"\0\0\0\0\x01a", true);
        assert!(!answer.is_end_stream());
        assert_eq!(answer.size_hint().exact(), Some(6));
        // Every frame is ready at once: polled without a runtime.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut frames = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut answer).poll_frame(&mut cx) {
            frames.push(frame.unwrap());
        }
        assert_eq!(frames.len(), 2);
        assert!(frames[0].is_data());
        assert!(frames[1].is_trailers());
        assert!(answer.is_end_stream());
    }

    #[test]
    fn a_record_this_crate_did_not_write_is_refused() {
        assert!(Exchange::from_stored(StoredResponse::from_bytes("{}")).is_none());
        let mut truncated = exchange(true).to_stored();
        truncated.body = truncated.body.map(|b| b.slice(..8));
        assert!(Exchange::from_stored(truncated).is_none());
    }
}
