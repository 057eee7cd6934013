//! The bodies an adapter buffers, each bounded: the request's, read whole
//! to fingerprint it ([`read_body`], under the body limit and a
//! [`BodyBudget`]), and a kept response's, captured for storage
//! ([`capture`], under the stored-response limit, with [`resume`] to send
//! on a body too large to keep). The axum layer, the JSON-RPC and gRPC
//! adapters and the webhook receivers read their bodies here.
//!
//! [`BodyBudget`] bounds the bytes of guarded request bodies being buffered
//! at once, so many clients each holding a body open cannot take the
//! process's memory. A body that declares its `Content-Length` reserves all
//! of it before a byte is read (a client past the budget is told at once,
//! before it sends its body); a chunked body reserves as its chunks arrive.
//! The reservation is held while the request is guarded (its body read, the
//! route run) and returned when the guard answers. Past the budget the
//! answer is 503 `body-buffer-full` with `Retry-After`, and nothing runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::{StreamExt, stream};
use http::{HeaderMap, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, BodyStream, LengthLimitError, Limited};

use crate::key::IdempotencyKey;
use crate::refusal::Refusal;
use crate::response::BoxError;

/// The bytes of guarded request bodies that may be buffered at once,
/// shared by every layer given a clone of it (one budget for all the
/// routes of a process).
///
/// ```
/// use idempotency_guard::adapter::BodyBudget;
///
/// let budget = BodyBudget::new(64 * 1024 * 1024);
/// assert_eq!(budget.total(), 64 * 1024 * 1024);
/// assert_eq!(budget.in_use(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct BodyBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                total: bytes,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.inner.total
    }

    /// The bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` from the budget, if it has them.
    fn take(&self, bytes: usize) -> bool {
        let total = self.inner.total;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&after| after <= total)
            })
            .is_ok()
    }

    /// Reserves `bytes`; `None` when the budget does not have them.
    fn reserve(&self, bytes: usize) -> Option<BodyReservation> {
        self.take(bytes).then(|| BodyReservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes of a [`BodyBudget`] held by one request body ([`read_body`]),
/// returned when dropped: keep it until the request is answered.
#[derive(Debug)]
#[must_use = "the bytes are returned to the budget when it is dropped"]
pub struct BodyReservation {
    budget: BodyBudget,
    bytes: usize,
}

impl BodyReservation {
    /// Makes the reservation at least `bytes`; `false` when the budget
    /// does not have the difference.
    fn cover(&mut self, bytes: usize) -> bool {
        let Some(more) = bytes.checked_sub(self.bytes).filter(|&more| more > 0) else {
            return true;
        };
        if !self.budget.take(more) {
            return false;
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        self.budget
            .inner
            .used
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Why a request body was not read ([`read_body`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyReadError {
    /// Over the limit (declared or read): 413 `body-too-large`.
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body failed before its end: 400 `body-unreadable`.
    Unreadable,
    /// The budget has no room for it: 503 `body-buffer-full`.
    BufferFull,
}

impl BodyReadError {
    /// The refusal to answer with; `key` (when known) and `retry_after`
    /// go into a `body-buffer-full` answer.
    pub fn into_refusal(self, key: Option<IdempotencyKey>, retry_after: Duration) -> Refusal {
        match self {
            Self::TooLarge { limit } => Refusal::BodyTooLarge { limit },
            Self::Unreadable => Refusal::BodyUnreadable,
            Self::BufferFull => Refusal::BodyBufferFull { key, retry_after },
        }
    }
}

/// The declared `Content-Length`, refused when over `limit`.
fn declared_length(headers: &HeaderMap, limit: usize) -> Result<Option<usize>, BodyReadError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(length) if length > limit as u64 => Err(BodyReadError::TooLarge { limit }),
        // Not over a `usize` limit: it fits.
        Some(length) => Ok(usize::try_from(length).ok()),
        None => Ok(None),
    }
}

/// The error of a body read that failed with `error`.
fn read_failure(error: &BoxError, limit: usize) -> BodyReadError {
    if error.is::<LengthLimitError>() {
        BodyReadError::TooLarge { limit }
    } else {
        BodyReadError::Unreadable
    }
}

/// Reads a request body whole, up to `limit` bytes (a `Content-Length`
/// over it is refused before any byte is read), within `budget` when there
/// is one: a declared length is reserved before any byte is read, a
/// chunked body as its chunks arrive, and the bytes are copied into one
/// buffer as they come (each chunk freed at once), so what is held is what
/// is reserved. Every adapter that buffers request bodies (the axum layer,
/// the JSON-RPC and gRPC adapters, the webhook receivers) reads them here.
///
/// # Errors
///
/// [`BodyReadError`]: too large, broken, or no room in the budget.
pub async fn read_body<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    budget: Option<&BodyBudget>,
) -> Result<(Bytes, Option<BodyReservation>), BodyReadError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = declared_length(headers, limit)?;
    let Some(budget) = budget else {
        // A body of one data frame (the usual one) is kept as it came, with
        // no buffer to collect it in; more frames are joined in one buffer
        // sized by the declared length.
        let mut body = std::pin::pin!(Limited::new(body, limit));
        let mut whole = Bytes::new();
        let mut joined: Option<BytesMut> = None;
        while let Some(frame) = body.as_mut().frame().await {
            let frame = frame.map_err(|error| read_failure(&error, limit))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match &mut joined {
                Some(buffer) => buffer.extend_from_slice(&data),
                None if whole.is_empty() => whole = data,
                None => {
                    let size = declared.unwrap_or(0).max(whole.len() + data.len());
                    let mut buffer = BytesMut::with_capacity(size);
                    buffer.extend_from_slice(&whole);
                    buffer.extend_from_slice(&data);
                    joined = Some(buffer);
                }
            }
        }
        return Ok((joined.map_or(whole, BytesMut::freeze), None));
    };
    let mut reservation = budget
        .reserve(declared.unwrap_or(0))
        .ok_or(BodyReadError::BufferFull)?;
    let mut buffer = BytesMut::with_capacity(declared.unwrap_or(0));
    let mut body = std::pin::pin!(Limited::new(body, limit));
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|error| read_failure(&error, limit))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !reservation.cover(buffer.len() + data.len()) {
            return Err(BodyReadError::BufferFull);
        }
        buffer.extend_from_slice(&data);
    }
    Ok((buffer.freeze(), Some(reservation)))
}

/// A response body read up to the stored-response limit ([`capture`]).
#[derive(Debug)]
pub enum Captured<B> {
    /// The whole body fit.
    Whole(Bytes),
    /// The body exceeds the limit: what was read, and the rest still unread
    /// (send both on with [`resume`]; nothing can be stored).
    TooLarge {
        /// The bytes read so far (a little over the limit).
        prefix: Bytes,
        /// The body, positioned after `prefix`.
        rest: B,
    },
    /// The body failed before its end or the limit.
    Broken {
        /// The bytes read before it failed.
        prefix: Bytes,
        /// The body's error.
        error: BoxError,
    },
}

/// Reads a response body until its end or until it exceeds `limit` bytes,
/// for storage. Trailers are not kept.
pub async fn capture<B>(mut body: B, limit: usize) -> Captured<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut read = Read::default();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                return Captured::Broken {
                    prefix: read.into_bytes(),
                    error: error.into(),
                };
            }
        };
        if let Ok(data) = frame.into_data() {
            read.push(data);
            if read.len() > limit {
                return Captured::TooLarge {
                    prefix: read.into_bytes(),
                    rest: body,
                };
            }
        }
    }
    Captured::Whole(read.into_bytes())
}

/// The bytes [`capture`] has read: the first chunk as it came (a body of
/// one chunk, as most responses are, is neither copied nor allocated
/// again), the chunks joined in one buffer from the second on.
#[derive(Default)]
enum Read {
    #[default]
    Nothing,
    One(Bytes),
    Joined(BytesMut),
}

impl Read {
    fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Self::Nothing => Self::One(data),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                Self::Joined(joined)
            }
            Self::Joined(mut joined) => {
                joined.extend_from_slice(&data);
                Self::Joined(joined)
            }
        };
    }

    fn len(&self) -> usize {
        match self {
            Self::Nothing => 0,
            Self::One(bytes) => bytes.len(),
            Self::Joined(joined) => joined.len(),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Self::Nothing => Bytes::new(),
            Self::One(bytes) => bytes,
            Self::Joined(joined) => joined.freeze(),
        }
    }
}

/// A body that sends `prefix` and then streams the rest of `rest` (its
/// data: trailers are dropped).
pub fn resume<B>(prefix: Bytes, rest: B) -> Body
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

/// Captures a kept response's body for storage, up to `limit` bytes: the
/// copy to store (`None` when the body is larger: it is sent on, but not
/// stored) and the body that goes on to the caller.
///
/// # Errors
///
/// The body's own error, when it fails before its end or the limit.
pub(crate) async fn capture_response<B>(
    body: B,
    limit: usize,
) -> Result<(Option<Bytes>, Body), BoxError>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // As a `Body` (what an axum route answers already: then it is not
    // boxed again), which is `Unpin` as `capture` needs.
    Ok(match capture(Body::new(body), limit).await {
        Captured::Whole(bytes) => (Some(bytes.clone()), Body::from(bytes)),
        Captured::TooLarge { prefix, rest } => (None, resume(prefix, rest)),
        Captured::Broken { error, .. } => return Err(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned_when_dropped() {
        let budget = BodyBudget::new(100);
        let first = budget.reserve(60).expect("room");
        assert!(budget.reserve(41).is_none(), "past the budget");
        let mut second = budget.reserve(40).expect("room");
        assert_eq!(budget.in_use(), 100);
        assert!(second.cover(40), "covered already");
        assert!(!second.cover(41), "no room to grow");
        drop(first);
        assert!(second.cover(100));
        assert_eq!(budget.in_use(), 100);
        drop(second);
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn captures_small_bodies_whole_and_streams_large_ones_on() {
        let small = capture(Body::from("hello"), 5).await;
        assert!(matches!(small, Captured::Whole(ref b) if b == "hello"));
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            (0..4).map(|i| Ok(Bytes::from(vec![b'a' + i; 4]))).collect();
        let large = Body::from_stream(stream::iter(chunks));
        match capture(large, 6).await {
            Captured::TooLarge { prefix, rest } => {
                assert_eq!(prefix, "aaaabbbb");
                let all = resume(prefix, rest).collect().await.unwrap().to_bytes();
                assert_eq!(all, "aaaabbbbccccdddd");
            }
            other => panic!("a body over the limit was not streamed on: {other:?}"),
        }
    }

    /// A request body of one frame is kept as it came; several frames are
    /// joined in order (with or without a declared length, an empty frame
    /// among them); one over the limit is refused.
    #[tokio::test]
    async fn request_bodies_are_read_whole_in_one_frame_or_many() {
        let none = HeaderMap::new();
        let (one, _) = read_body(Body::from("hello"), &none, 100, None)
            .await
            .unwrap();
        assert_eq!(one, "hello");
        let parts = |parts: &[&'static str]| {
            let chunks: Vec<Result<Bytes, std::io::Error>> = parts
                .iter()
                .map(|part| Ok(Bytes::from_static(part.as_bytes())))
                .collect();
            Body::from_stream(stream::iter(chunks))
        };
        let (many, _) = read_body(parts(&["ab", "", "cd", "e"]), &none, 100, None)
            .await
            .unwrap();
        assert_eq!(many, "abcde");
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, http::HeaderValue::from_static("5"));
        let (sized, _) = read_body(parts(&["", "abc", "de"]), &declared, 100, None)
            .await
            .unwrap();
        assert_eq!(sized, "abcde");
        assert!(matches!(
            read_body(parts(&["abc", "def"]), &none, 5, None).await,
            Err(BodyReadError::TooLarge { .. })
        ));
    }

    #[tokio::test]
    async fn a_broken_body_keeps_what_was_read() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"abc")),
            Err(std::io::Error::other("reset")),
        ];
        match capture(Body::from_stream(stream::iter(chunks)), 100).await {
            Captured::Broken { prefix, .. } => assert_eq!(prefix, "abc"),
            other => panic!("a broken body was not reported: {other:?}"),
        }
    }
}
