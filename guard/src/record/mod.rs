//! What a store holds for one `(scope, key)`: [`Record`], its [`RecordState`],
//! the [`LeaseToken`] that fences its writes, the [`StoredResponse`]
//! replayed to retries and the [`StoredRequest`] a completer runs again
//! (`request.rs`).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use time::OffsetDateTime;

use std::fmt;

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};

mod request;
#[cfg(any(feature = "redis", feature = "nats"))]
mod tokens;

pub use request::StoredRequest;
#[cfg(any(feature = "redis", feature = "nats"))]
pub(crate) use tokens::TokenMap;

/// The random token that identifies one lease on a record.
///
/// Every write after the claim (complete, renew, release, take over) names
/// the token it holds; a store refuses the write when the record's token is
/// another one. That fence is what keeps a holder that lost its lease from
/// overwriting the record of the request that took over.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(uuid::Uuid);

impl LeaseToken {
    /// Draws a new random token.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// Wraps a token read from a store.
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }

    /// The token as a UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

/// The state of a record, as the status service reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// A request holds the lease and its handler is running.
    InFlight,
    /// The handler finished and its response was stored.
    Completed,
    /// The lease lapsed (or the handler was cut off) before the handler
    /// finished: whether its effects happened is unknown.
    Abandoned,
}

impl RecordState {
    /// The state's name in the status API: `in_flight`, `completed` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Abandoned => "abandoned",
        }
    }
}

/// One stored record, as read from a store at [`Record::observed_at`].
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The namespace the key lives in.
    pub scope: Scope,
    /// The idempotency key.
    pub key: IdempotencyKey,
    /// The fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// The method of that request.
    pub method: String,
    /// The path and query of that request.
    pub path: String,
    /// The token of the current (or last) lease on the record.
    pub lease_token: LeaseToken,
    /// When the current lease ends unless it is renewed.
    pub lease_expires_at: OffsetDateTime,
    /// Whether the record was claimed in transactional mode: then a lapsed
    /// lease means nothing was committed.
    pub transactional: bool,
    /// The stored response, once the handler finished.
    pub response: Option<StoredResponse>,
    /// When the key was claimed.
    pub created_at: OffsetDateTime,
    /// When the response was stored.
    pub completed_at: Option<OffsetDateTime>,
    /// When the record may be purged; from then on the key is free again.
    pub expires_at: OffsetDateTime,
    /// The store's clock when the record was read. Every time comparison on
    /// the record uses this clock, never the reader's.
    pub observed_at: OffsetDateTime,
    /// The steps its run recorded, in order (empty for a run that records
    /// none): what a resumed run gets back without running them.
    pub steps: Vec<Step>,
    /// The request kept with the claim of a resumable run, for the
    /// completer ([`crate::engine::Completer`]); `None` when the route
    /// keeps none.
    pub request: Option<Box<StoredRequest>>,
}

impl Record {
    /// The record's state: completed once a response is stored, abandoned
    /// when in flight and its lease has ended, in flight otherwise.
    pub fn state(&self) -> RecordState {
        if self.response.is_some() {
            RecordState::Completed
        } else if self.lease_expires_at <= self.observed_at {
            RecordState::Abandoned
        } else {
            RecordState::InFlight
        }
    }

    /// Whether the record outlived its retention: it is as good as absent.
    pub fn is_expired(&self) -> bool {
        self.expires_at <= self.observed_at
    }

    /// How long the current lease still runs (zero once it has ended).
    pub fn lease_remaining(&self) -> std::time::Duration {
        (self.lease_expires_at - self.observed_at)
            .try_into()
            .unwrap_or_default()
    }
}

/// A handler's response as stored for replay: status, headers and body.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The headers kept for replay (hop-by-hop headers, `Date` and
    /// `Set-Cookie` are left out by default).
    pub headers: HeaderMap,
    /// The body, or `None` when it exceeded the stored-response limit: the
    /// first caller got it, replays answer `response-not-stored`.
    pub body: Option<Bytes>,
}

impl StoredResponse {
    /// An outcome that is only bytes (a message consumer's result, a JSON
    /// value): status 200, no headers.
    pub fn from_bytes(body: impl Into<Bytes>) -> Self {
        Self {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Some(body.into()),
        }
    }

    /// Encodes the headers as HTTP/1.1 field lines (`name: value\r\n`), the
    /// form stores keep them in. Field values cannot hold CR or LF, so the
    /// encoding is unambiguous and binary-safe.
    pub fn encode_headers(&self) -> Vec<u8> {
        // Sized up front: one allocation, not one per doubling.
        let mut out = Vec::with_capacity(self.encoded_headers_len());
        self.encode_headers_into(&mut out);
        out
    }

    /// How many bytes [`StoredResponse::encode_headers`] writes.
    pub fn encoded_headers_len(&self) -> usize {
        self.headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum()
    }

    /// Appends the headers, encoded as [`StoredResponse::encode_headers`]
    /// encodes them, to `out` (a store's buffer for the whole record).
    pub fn encode_headers_into(&self, out: &mut Vec<u8>) {
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Rebuilds a stored response from what a store keeps: the status as
    /// an integer, the encoded headers and the body (`None` when it was
    /// too large to store).
    ///
    /// # Errors
    ///
    /// Returns [`CorruptRecord`] for an invalid status or header line.
    pub fn decode(status: i64, headers: &[u8], body: Option<Bytes>) -> Result<Self, CorruptRecord> {
        let status = u16::try_from(status)
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .ok_or(CorruptRecord("the stored status is invalid"))?;
        Ok(Self {
            status,
            headers: Self::decode_headers(headers)?,
            body,
        })
    }

    /// Decodes headers written by [`StoredResponse::encode_headers`].
    ///
    /// # Errors
    ///
    /// Returns [`CorruptRecord`] when a line is not a valid header field.
    pub fn decode_headers(encoded: &[u8]) -> Result<HeaderMap, CorruptRecord> {
        let mut headers = HeaderMap::new();
        for line in encoded.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let colon = line
                .windows(2)
                .position(|w| w == b": ")
                .ok_or(CorruptRecord("a stored header line has no ': '"))?;
            let name = HeaderName::from_bytes(&line[..colon])
                .map_err(|_| CorruptRecord("a stored header name is invalid"))?;
            let value = HeaderValue::from_bytes(&line[colon + 2..])
                .map_err(|_| CorruptRecord("a stored header value is invalid"))?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// One step a run recorded ([`crate::engine::Run::step`]): its name, a
/// hash of its input when it was given one, and its result as JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// The step's name, as the run asked for it.
    #[serde(rename = "n")]
    pub name: String,
    /// The hex SHA-256 of the step's input, when the run gave one
    /// ([`crate::engine::Run::step_with_input`]).
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The step's result, as `serde_json` wrote it (sealed, a JSON string,
    /// in an encrypted store).
    #[serde(rename = "v")]
    pub value: serde_json::Value,
}

impl Step {
    /// Encodes a run's steps as stores keep them: a JSON array, or nothing
    /// at all when the run recorded none.
    pub fn encode_all(steps: &[Step]) -> Option<Vec<u8>> {
        if steps.is_empty() {
            return None;
        }
        serde_json::to_vec(steps).ok()
    }

    /// Decodes what [`Step::encode_all`] wrote (nothing is no steps).
    ///
    /// # Errors
    ///
    /// [`CorruptRecord`] when the bytes are not a list of steps.
    pub fn decode_all(encoded: Option<&[u8]>) -> Result<Vec<Step>, CorruptRecord> {
        match encoded {
            None | Some([]) => Ok(Vec::new()),
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|_| CorruptRecord("the recorded steps are not a list of steps")),
        }
    }
}

/// A record read from a store could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("corrupt record: {0}")]
pub struct CorruptRecord(pub &'static str);

/// A key read back from a store, validated again: a stored key that breaks
/// the rule is a corrupt record, not a panic.
pub(crate) fn stored_key(raw: &str) -> Result<IdempotencyKey, CorruptRecord> {
    IdempotencyKey::from_raw(raw).map_err(|_| CorruptRecord("the stored key is invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::Duration;

    fn record(lease_left: Duration, response: Option<StoredResponse>) -> Record {
        let now = OffsetDateTime::now_utc();
        Record {
            scope: Scope::new("s").unwrap(),
            key: IdempotencyKey::from_raw("k").unwrap(),
            fingerprint: Fingerprint::from_bytes([0; 32]),
            method: "POST".into(),
            path: "/".into(),
            lease_token: LeaseToken::new(),
            lease_expires_at: now + lease_left,
            transactional: false,
            response,
            created_at: now,
            completed_at: None,
            expires_at: now + Duration::days(1),
            observed_at: now,
            steps: Vec::new(),
            request: None,
        }
    }

    #[test]
    fn state_is_derived_from_response_and_lease() {
        let done = StoredResponse {
            status: StatusCode::CREATED,
            headers: HeaderMap::new(),
            body: Some(Bytes::new()),
        };
        assert_eq!(
            record(Duration::seconds(5), None).state(),
            RecordState::InFlight
        );
        assert_eq!(record(Duration::ZERO, None).state(), RecordState::Abandoned);
        assert_eq!(
            record(Duration::seconds(-5), None).state(),
            RecordState::Abandoned
        );
        assert_eq!(
            record(Duration::seconds(-5), Some(done)).state(),
            RecordState::Completed
        );
        assert_eq!(
            record(Duration::seconds(-5), None).lease_remaining(),
            std::time::Duration::ZERO
        );
    }

    #[test]
    fn headers_round_trip_including_repeated_and_opaque_values() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2: two"));
        headers.append("x-bin", HeaderValue::from_bytes(b"\xff\xfe ok").unwrap());
        headers.append("x-empty", HeaderValue::from_static(""));
        let response = StoredResponse {
            status: StatusCode::OK,
            headers: headers.clone(),
            body: None,
        };
        let decoded = StoredResponse::decode_headers(&response.encode_headers()).unwrap();
        assert_eq!(decoded, headers);
        assert!(StoredResponse::decode_headers(b"no colon here\r\n").is_err());
    }
}
