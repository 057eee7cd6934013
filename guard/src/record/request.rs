//! The request a resumable run keeps in its record ([`StoredRequest`]), so
//! that the completer ([`crate::engine::Completer`]) can finish an
//! abandoned run without waiting for the client: its method, path, the
//! headers the route names, its body, and the completer's own account
//! (attempts made, given up).
//!
//! Stores keep it as one opaque value ([`StoredRequest::encode`]): a
//! nullable column on SQLite and PostgreSQL (migration 0003), behind a flag
//! bit in Redis's packed request and in the NATS record's value. The encrypted store seals it (method,
//! path, headers and body; the account stays in clear).

use bytes::Bytes;
use http::HeaderMap;

use super::{CorruptRecord, StoredResponse};

/// The mark and version of the encoding.
const MARK: &[u8; 3] = b"RQ1";
/// The flag bit of a request the completer gave up on.
const GAVE_UP: u8 = 1;
/// The flag bit of a sealed request (its body holds the sealed rest).
const SEALED: u8 = 2;

/// A request kept with its claim, to be run again by the completer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredRequest {
    /// The request's method.
    pub method: String,
    /// The request's path and query.
    pub path: String,
    /// The headers kept (the idempotency key, the content type and those
    /// the route names).
    pub headers: HeaderMap,
    /// The body (bounded by the route's body limit).
    pub body: Bytes,
    /// How many times the completer took the run over.
    pub attempts: u32,
    /// Whether the completer gave up on it (its attempts ran out): the key
    /// then needs a person's decision, as any abandoned key.
    pub gave_up: bool,
    /// Whether `body` holds the sealed method, path, headers and body (an
    /// encrypted store's inner store sees it so).
    pub(crate) sealed: bool,
}

impl StoredRequest {
    /// A request to keep, not attempted yet.
    pub fn new(
        method: impl Into<String>,
        path: impl Into<String>,
        headers: HeaderMap,
        body: impl Into<Bytes>,
    ) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            headers,
            body: body.into(),
            attempts: 0,
            gave_up: false,
            sealed: false,
        }
    }

    /// A sealed request: `sealed` is what the encrypted store made of the
    /// method, path, headers and body.
    pub(crate) fn sealed(sealed: Vec<u8>, attempts: u32, gave_up: bool) -> Self {
        Self {
            method: String::new(),
            path: String::new(),
            headers: HeaderMap::new(),
            body: Bytes::from(sealed),
            attempts,
            gave_up,
            sealed: true,
        }
    }

    /// The encoding stores keep: `RQ1`, flags, attempts (u32), the method
    /// (u8 length), the path (u32 length), the headers as HTTP/1.1 field
    /// lines (u32 length), the body.
    pub fn encode(&self) -> Vec<u8> {
        let headers = StoredResponse {
            status: http::StatusCode::OK,
            headers: self.headers.clone(),
            body: None,
        }
        .encode_headers();
        let mut out = Vec::with_capacity(
            16 + self.method.len() + self.path.len() + headers.len() + self.body.len(),
        );
        out.extend_from_slice(MARK);
        let mut flags = 0;
        if self.gave_up {
            flags |= GAVE_UP;
        }
        if self.sealed {
            flags |= SEALED;
        }
        out.push(flags);
        out.extend_from_slice(&self.attempts.to_be_bytes());
        let method = &self.method.as_bytes()[..self.method.len().min(255)];
        out.push(u8::try_from(method.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(method);
        for part in [self.path.as_bytes(), headers.as_slice()] {
            out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// Decodes what [`StoredRequest::encode`] wrote.
    ///
    /// # Errors
    ///
    /// [`CorruptRecord`] when the bytes are not a stored request.
    pub fn decode(bytes: &[u8]) -> Result<Self, CorruptRecord> {
        let corrupt = CorruptRecord("the stored request is invalid");
        let rest = bytes.strip_prefix(MARK.as_slice()).ok_or(corrupt)?;
        let (&flags, rest) = rest.split_first().ok_or(corrupt)?;
        let (attempts, rest) = rest.split_first_chunk::<4>().ok_or(corrupt)?;
        let (&method_len, rest) = rest.split_first().ok_or(corrupt)?;
        let (method, rest) = rest
            .split_at_checked(usize::from(method_len))
            .ok_or(corrupt)?;
        let mut rest = rest;
        let mut parts = [&[][..]; 2];
        for part in &mut parts {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or(corrupt)?;
            let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|_| corrupt)?;
            let (bytes, tail) = tail.split_at_checked(len).ok_or(corrupt)?;
            *part = bytes;
            rest = tail;
        }
        let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| corrupt);
        Ok(Self {
            method: text(method)?,
            path: text(parts[0])?,
            headers: StoredResponse::decode_headers(parts[1])?,
            body: Bytes::copy_from_slice(rest),
            attempts: u32::from_be_bytes(*attempts),
            gave_up: flags & GAVE_UP != 0,
            sealed: flags & SEALED != 0,
        })
    }

    /// Decodes a stored value that may be absent (a nullable column).
    ///
    /// # Errors
    ///
    /// As [`StoredRequest::decode`].
    pub(crate) fn decode_optional(
        bytes: Option<&[u8]>,
    ) -> Result<Option<Box<Self>>, CorruptRecord> {
        match bytes {
            None | Some([]) => Ok(None),
            Some(bytes) => Self::decode(bytes).map(|request| Some(Box::new(request))),
        }
    }

    /// Whether the method, path, headers and body are sealed (read through
    /// a store without the key).
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_request_round_trips() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "k-1".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        let mut request = StoredRequest::new("POST", "/debits?x=1", headers, &b"{\"a\":\0 1}"[..]);
        assert_eq!(StoredRequest::decode(&request.encode()).unwrap(), request);
        request.attempts = 7;
        request.gave_up = true;
        assert_eq!(StoredRequest::decode(&request.encode()).unwrap(), request);
        let sealed = StoredRequest::sealed(vec![0, 1, 2], 2, false);
        let decoded = StoredRequest::decode(&sealed.encode()).unwrap();
        assert!(decoded.is_sealed());
        assert_eq!(decoded, sealed);
    }

    #[test]
    fn other_bytes_are_corrupt() {
        let good = StoredRequest::new("POST", "/p", HeaderMap::new(), "b").encode();
        assert!(StoredRequest::decode(b"").is_err());
        assert!(StoredRequest::decode(b"RQ2").is_err());
        assert!(StoredRequest::decode(&good[..good.len() - 6]).is_err());
        assert_eq!(StoredRequest::decode_optional(None), Ok(None));
    }
}
