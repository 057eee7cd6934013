//! The record's layout on Redis and Valkey (version 2): one string value
//! per record, written here and nowhere else.
//!
//! # The value
//!
//! All numbers are big-endian; positions are 0-based (the scripts, in Lua,
//! count from 1 and get these positions from [`lua_layout`], so they cannot
//! drift from this file):
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `I2`, the layout's mark |
//! | 2 | state: `f` in flight, `c` completed |
//! | 3 | watched: `1` once a reader may wait for the record's end, else `0` |
//! | 4..20 | the lease token (16 bytes) |
//! | 20..28 | retention: ms from the claim to the record's expiry |
//! | 28..36 | lease end: ms from the claim to the end of the lease |
//! | 36..44 | completion: ms from the claim to the completion (0 in flight) |
//! | 44..48 | the packed request's length |
//! | 48.. | the packed request ([`encode_request`]), then, once completed, the packed response ([`encode_response`]) |
//!
//! # Recorded steps
//!
//! A run's steps (SPEC §12) ride in the packed request: its flag byte
//! gets [`HAS_STEPS`], and the steps ([`Step::encode_all`]) follow the path
//! after a NUL. `lua/record_steps.lua` rewrites them (fenced, the lease
//! live), `lua/take_over.lua` keeps them, and a completion keeps the
//! request as it is. A reader of the layout before steps reads the flag as
//! not transactional (a transactional record records no step) and the
//! steps as the end of the path: it decides on the fingerprint as always,
//! and only shows a longer path (a rolling upgrade needs nothing more).
//!
//! The request a resumable run keeps for the completer rides the same way,
//! behind [`HAS_REQUEST`]: after the path come a NUL, the steps (if any),
//! another NUL and the stored request ([`StoredRequest::encode`]);
//! `lua/record_request.lua` writes it, `lua/take_over.lua` and
//! `lua/record_steps.lua` keep it. Release 1 reads it as the path's end.
//!
//! # Times: durations on the server's clock
//!
//! The claim is one native command, `SET key <in flight> NX PX <retention>
//! GET`: nothing runs on Redis that could read its clock, and no client
//! clock is ever written into a record. So the value holds durations from
//! the claim, and the key's native expiry is the clock: `PTTL`, read in the
//! same round trip as the value, says how long the record has left, so
//! `retention - PTTL` is the time since the claim, measured by the server.
//! A lease has ended when that elapsed time reaches the lease end; renewal
//! (a script) moves the lease end to the elapsed time plus the renewal;
//! completion (a script, or `SET … IFEQ … KEEPTTL`) keeps the expiry.
//!
//! A [`Record`] needs absolute times: [`decode`] places the durations on
//! the reader's clock at the moment of the read (`observed_at`). Every
//! comparison the engine makes (lease end against `observed_at`, expiry
//! against `observed_at`, the replay cache's remaining lifetime) is then a
//! comparison of two durations measured by the server: no two clocks are
//! compared. The absolute creation and completion times a status answer
//! shows are the reader's estimates (off by the reader's clock skew).
//!
//! A value written by the `IFEQ` completion carries the completion time the
//! holder measured on its own monotonic clock since its claim (it cannot
//! read the server's in a native command); it is shown, never compared.
//!
//! # Release 1's hash records
//!
//! The previous layout (one hash per record, `super::legacy`) lives at the
//! same key: a native command on it fails with `WRONGTYPE`, and the store
//! then reads it as release 1 did. An old process that meets a version 2
//! value gets `WRONGTYPE` from its scripts, a store error: it answers 503
//! and never runs the work (docs/RELEASING.md).

use std::time::Duration;

use time::OffsetDateTime;

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::CorruptRecord;
use crate::record::LeaseToken;
use crate::record::StoredRequest;
use crate::record::{Record, Step, StoredResponse};
use crate::store::NewRecord;

/// The layout's mark, the value's first bytes.
pub(super) const MARK: &[u8; 2] = b"I2";
/// The state byte of an in-flight record.
pub(super) const IN_FLIGHT: u8 = b'f';
/// The state byte of a completed record.
pub(super) const COMPLETED: u8 = b'c';

const STATE_AT: usize = 2;
const WATCHED_AT: usize = 3;
const TOKEN_AT: usize = 4;
const RETENTION_AT: usize = 20;
const LEASE_END_AT: usize = 28;
const COMPLETION_AT: usize = 36;
const REQUEST_LEN_AT: usize = 44;
/// The fixed part's length: the packed request starts here.
pub(super) const HEADER_LEN: usize = 48;

/// The longest duration a value holds, in ms: 2^53 - 1, the largest
/// integer Lua's numbers (doubles) hold exactly (about 285,000 years).
pub(super) const MAX_MILLIS: u64 = (1 << 53) - 1;

/// A duration in whole ms, clamped to [`MAX_MILLIS`].
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .min(MAX_MILLIS)
}

/// The positions the scripts use, as Lua locals (1-based), put in front of
/// every script (`super::script`).
pub(super) fn lua_layout() -> String {
    format!(
        "local MARK, IN_FLIGHT, COMPLETED = '{mark}', '{in_flight}', '{completed}'\n\
         local STATE, WATCHED, TOKEN, TOKEN_END = {state}, {watched}, {token}, {token_end}\n\
         local RETENTION, LEASE_END, COMPLETION = {retention}, {lease_end}, {completion}\n\
         local REQUEST_LEN, HEADER = {request_len}, {header}\n\
         local HAS_STEPS, HAS_REQUEST = {has_steps}, {has_request}\n",
        mark = std::str::from_utf8(MARK).unwrap_or("I2"),
        in_flight = char::from(IN_FLIGHT),
        completed = char::from(COMPLETED),
        state = STATE_AT + 1,
        watched = WATCHED_AT + 1,
        token = TOKEN_AT + 1,
        token_end = RETENTION_AT,
        retention = RETENTION_AT + 1,
        lease_end = LEASE_END_AT + 1,
        completion = COMPLETION_AT + 1,
        request_len = REQUEST_LEN_AT + 1,
        header = HEADER_LEN,
        has_steps = HAS_STEPS,
        has_request = HAS_REQUEST,
    )
}

/// The fixed part of a value, followed by the packed request.
fn header(
    state: u8,
    token: LeaseToken,
    retention: u64,
    lease_end: u64,
    completion: u64,
    request: &[u8],
    extra: usize,
) -> Vec<u8> {
    let mut value = fixed_part(
        state,
        token,
        [retention, lease_end, completion],
        request.len(),
        extra,
    );
    value.extend_from_slice(request);
    value
}

/// The fixed part of a value alone, ending with the length of the packed
/// request that follows it, in a buffer with room for that request and
/// `extra` bytes more. `times` are the retention, the lease's end and the
/// completion, in milliseconds.
fn fixed_part(
    state: u8,
    token: LeaseToken,
    times: [u64; 3],
    request_len: usize,
    extra: usize,
) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEADER_LEN + request_len + extra);
    value.extend_from_slice(MARK);
    value.push(state);
    value.push(b'0');
    value.extend_from_slice(token.as_uuid().as_bytes());
    for number in times {
        value.extend_from_slice(&number.min(MAX_MILLIS).to_be_bytes());
    }
    let length = u32::try_from(request_len).unwrap_or(u32::MAX);
    value.extend_from_slice(&length.to_be_bytes());
    value
}

/// The value a claim writes: in flight, not watched, leased for `lease`
/// from the claim, expiring `retention` after it (the key's `PX`).
#[cfg(test)]
pub(super) fn in_flight(
    token: LeaseToken,
    lease: Duration,
    retention: Duration,
    request: &[u8],
) -> Vec<u8> {
    header(
        IN_FLIGHT,
        token,
        millis(retention),
        millis(lease),
        0,
        request,
        0,
    )
}

/// The value `new`'s claim writes (the in-flight value of its request,
/// packed as [`encode_request`] packs it), built in one buffer.
pub(super) fn claim_value(new: &NewRecord<'_>) -> Vec<u8> {
    let mut value = fixed_part(
        IN_FLIGHT,
        new.token,
        [millis(new.retention), millis(new.lease), 0],
        request_len(new.method, new.path),
        0,
    );
    write_request(
        &mut value,
        new.fingerprint,
        new.transactional,
        new.method,
        new.path,
    );
    value
}

/// The value an `IFEQ` completion writes over `in_flight` (the value its
/// claim wrote, unchanged since): completed `completion` after the claim,
/// with `response` (packed).
///
/// # Errors
///
/// [`CorruptRecord`] when `in_flight` is not an in-flight value.
pub(super) fn completed(
    in_flight: &[u8],
    completion: Duration,
    response: &[u8],
) -> Result<Vec<u8>, CorruptRecord> {
    let view = View::parse(in_flight)?;
    let mut value = header(
        COMPLETED,
        view.token,
        view.retention,
        view.lease_end,
        millis(completion),
        view.request,
        response.len(),
    );
    value.extend_from_slice(response);
    Ok(value)
}

/// The value of a completed record copied from another store (the tiered
/// store's cache), to live `ttl` from now: its durations are the record's
/// own, measured on its store's clock, shifted so that the copy's `PTTL`
/// reads as the time the copy has left.
pub(super) fn cached(record: &Record, response: &[u8], ttl: Duration) -> Vec<u8> {
    let since_claim = |at: OffsetDateTime| -> u64 {
        let elapsed = at - record.created_at;
        u64::try_from(elapsed.whole_milliseconds().max(0)).unwrap_or(MAX_MILLIS)
    };
    let elapsed = since_claim(record.observed_at);
    let mut value = header(
        COMPLETED,
        record.lease_token,
        elapsed.saturating_add(millis(ttl)),
        since_claim(record.lease_expires_at),
        since_claim(record.completed_at.unwrap_or(record.observed_at)),
        &encode_request(
            &record.fingerprint,
            record.transactional,
            &record.method,
            &record.path,
        ),
        response.len(),
    );
    value.extend_from_slice(response);
    value
}

/// A value's fields, borrowed.
#[derive(Debug, PartialEq)]
pub(super) struct View<'a> {
    /// [`IN_FLIGHT`] or [`COMPLETED`].
    pub(super) state: u8,
    /// Whether a reader marked the record watched.
    pub(super) watched: bool,
    pub(super) token: LeaseToken,
    pub(super) retention: u64,
    pub(super) lease_end: u64,
    pub(super) completion: u64,
    /// The packed request.
    pub(super) request: &'a [u8],
    /// The packed response (empty in flight).
    pub(super) response: &'a [u8],
}

impl<'a> View<'a> {
    /// Reads a value's fields.
    ///
    /// # Errors
    ///
    /// [`CorruptRecord`] when it is not a version 2 value.
    pub(super) fn parse(value: &'a [u8]) -> Result<Self, CorruptRecord> {
        let corrupt = CorruptRecord("the record is not a version 2 value");
        if value.len() < HEADER_LEN || !value.starts_with(MARK) {
            return Err(corrupt);
        }
        let number = |at: usize| -> u64 {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&value[at..at + 8]);
            u64::from_be_bytes(bytes)
        };
        let state = value[STATE_AT];
        if state != IN_FLIGHT && state != COMPLETED {
            return Err(corrupt);
        }
        let token = uuid::Uuid::from_slice(&value[TOKEN_AT..RETENTION_AT]).map_err(|_| corrupt)?;
        let mut length = [0; 4];
        length.copy_from_slice(&value[REQUEST_LEN_AT..HEADER_LEN]);
        let request_end = HEADER_LEN
            .checked_add(usize::try_from(u32::from_be_bytes(length)).map_err(|_| corrupt)?)
            .ok_or(corrupt)?;
        let request = value.get(HEADER_LEN..request_end).ok_or(corrupt)?;
        let response = &value[request_end..];
        if state == IN_FLIGHT && !response.is_empty() {
            return Err(corrupt);
        }
        Ok(Self {
            state,
            watched: value[WATCHED_AT] == b'1',
            token: LeaseToken::from_uuid(token),
            retention: number(RETENTION_AT),
            lease_end: number(LEASE_END_AT),
            completion: number(COMPLETION_AT),
            request,
            response,
        })
    }
}

/// The record a value holds, read when its key had `pttl` ms left (`PTTL`
/// in the same round trip; negative when the key vanished meanwhile, read
/// as no time left), placed at `observed_at` on the reader's clock (see
/// the module's documentation).
///
/// # Errors
///
/// [`CorruptRecord`] when the value is not a version 2 value.
pub(super) fn decode(
    scope: &Scope,
    key: &IdempotencyKey,
    value: &[u8],
    pttl: i64,
    observed_at: OffsetDateTime,
) -> Result<Record, CorruptRecord> {
    let view = View::parse(value)?;
    let left = u64::try_from(pttl.max(0)).unwrap_or(0).min(view.retention);
    let since_claim = view.retention - left;
    let at = |millis: u64| -> OffsetDateTime {
        let offset = i64::try_from(millis).unwrap_or(i64::MAX);
        observed_at - time::Duration::milliseconds(i64::try_from(since_claim).unwrap_or(0))
            + time::Duration::milliseconds(offset)
    };
    let (fingerprint, transactional, method, path) = decode_request(view.request)?;
    let (steps, request) = decode_tail(view.request)?;
    let completed = view.state == COMPLETED;
    Ok(Record {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint,
        method,
        path,
        lease_token: view.token,
        lease_expires_at: at(view.lease_end),
        transactional,
        response: completed
            .then(|| decode_response(view.response))
            .transpose()?,
        created_at: at(0),
        completed_at: completed.then(|| at(view.completion)),
        expires_at: at(view.retention),
        observed_at,
        steps,
        request,
    })
}

/// Packs the immutable part of a record: fingerprint (32 bytes), the
/// transactional flag (1), the method's length (1), the method, the path.
/// Release 1 packed its requests the same way (its hash's `m` field).
pub(super) fn encode_request(
    fingerprint: &Fingerprint,
    transactional: bool,
    method: &str,
    path: &str,
) -> Vec<u8> {
    let mut packed = Vec::with_capacity(request_len(method, path));
    write_request(&mut packed, fingerprint, transactional, method, path);
    packed
}

/// How many bytes [`encode_request`] packs a request into.
fn request_len(method: &str, path: &str) -> usize {
    34 + method.len().min(255) + path.len()
}

/// Appends the packed request ([`encode_request`]) to `out`.
fn write_request(
    out: &mut Vec<u8>,
    fingerprint: &Fingerprint,
    transactional: bool,
    method: &str,
    path: &str,
) {
    let method = &method.as_bytes()[..method.len().min(255)];
    out.extend_from_slice(fingerprint.as_bytes());
    out.push(u8::from(transactional));
    out.push(u8::try_from(method.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(method);
    out.extend_from_slice(path.as_bytes());
}

/// The flag byte's bit of a transactional record (release 1 and version 2
/// wrote 0 or 1, and read `== 1`).
const TRANSACTIONAL: u8 = 1;
/// The flag byte's bit of a record with recorded steps: they follow the
/// path, after a NUL (no path holds one). A reader before steps reads the
/// byte as not transactional (steps are never recorded on a transactional
/// record) and the steps as the path's end: it shows a longer path, and
/// decides as it always did (the fingerprint is what it compares).
const HAS_STEPS: u8 = 2;

/// The flag byte's bit of a record with a stored request (the completer's,
/// [`StoredRequest::encode`]): after the path come a NUL, the steps (none
/// when [`HAS_STEPS`] is clear; JSON holds no NUL), another NUL and the
/// stored request, to the end.
const HAS_REQUEST: u8 = 4;

/// The path, the encoded steps and the encoded stored request after it,
/// as `flags` says.
fn path_and_tail(rest: &[u8], flags: u8) -> (&[u8], Option<&[u8]>, Option<&[u8]>) {
    if flags & (HAS_STEPS | HAS_REQUEST) == 0 {
        return (rest, None, None);
    }
    let Some(nul) = rest.iter().position(|&b| b == 0) else {
        return (rest, None, None);
    };
    let (path, tail) = (&rest[..nul], &rest[nul + 1..]);
    if flags & HAS_REQUEST == 0 {
        return (path, Some(tail), None);
    }
    match tail.iter().position(|&b| b == 0) {
        Some(second) => (
            path,
            (flags & HAS_STEPS != 0).then_some(&tail[..second]),
            Some(&tail[second + 1..]),
        ),
        None => (path, Some(tail), None),
    }
}

/// The steps recorded in a packed request ([`Step::encode_all`], behind
/// [`HAS_STEPS`]; written by `lua/record_steps.lua`) and the request it
/// keeps (behind [`HAS_REQUEST`]; written by `lua/record_request.lua`).
///
/// # Errors
///
/// [`CorruptRecord`] when the request, its steps or the stored request do
/// not decode.
pub(super) fn decode_tail(
    packed: &[u8],
) -> Result<(Vec<Step>, Option<Box<StoredRequest>>), CorruptRecord> {
    let corrupt = CorruptRecord("the packed request is invalid");
    let flags = *packed.get(32).ok_or(corrupt)?;
    let method_len = usize::from(*packed.get(33).ok_or(corrupt)?);
    let (_, steps, request) = path_and_tail(packed.get(34 + method_len..).ok_or(corrupt)?, flags);
    Ok((
        Step::decode_all(steps)?,
        StoredRequest::decode_optional(request)?,
    ))
}

/// The fingerprint, transactional flag, method and path of a packed request.
pub(super) fn decode_request(
    packed: &[u8],
) -> Result<(Fingerprint, bool, String, String), CorruptRecord> {
    let corrupt = CorruptRecord("the packed request is invalid");
    let fingerprint: [u8; 32] = packed
        .get(..32)
        .and_then(|f| f.try_into().ok())
        .ok_or(corrupt)?;
    let flags = *packed.get(32).ok_or(corrupt)?;
    let transactional = flags & TRANSACTIONAL == TRANSACTIONAL;
    let method_len = usize::from(*packed.get(33).ok_or(corrupt)?);
    let method = packed.get(34..34 + method_len).ok_or(corrupt)?;
    let (path, _, _) = path_and_tail(packed.get(34 + method_len..).ok_or(corrupt)?, flags);
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| corrupt);
    Ok((
        Fingerprint::from_bytes(fingerprint),
        transactional,
        text(method)?,
        text(path)?,
    ))
}

/// Packs a response: status (2 bytes), whether the body is stored (1), the
/// headers' length (4), the headers, the body. Release 1 packed its
/// responses the same way (its hash's `p` field).
pub(super) fn encode_response(response: &StoredResponse) -> Vec<u8> {
    // One buffer: the headers are written into it, not encoded apart and copied.
    let headers_len = response.encoded_headers_len();
    let body = response.body.as_deref().unwrap_or_default();
    let mut packed = Vec::with_capacity(7 + headers_len + body.len());
    packed.extend_from_slice(&response.status.as_u16().to_be_bytes());
    packed.push(u8::from(response.body.is_some()));
    packed.extend_from_slice(&u32::try_from(headers_len).unwrap_or(u32::MAX).to_be_bytes());
    response.encode_headers_into(&mut packed);
    packed.extend_from_slice(body);
    packed
}

/// The response packed by [`encode_response`].
pub(super) fn decode_response(packed: &[u8]) -> Result<StoredResponse, CorruptRecord> {
    let corrupt = CorruptRecord("the packed response is invalid");
    let status = u16::from_be_bytes(
        packed
            .get(..2)
            .and_then(|b| b.try_into().ok())
            .ok_or(corrupt)?,
    );
    let stored = *packed.get(2).ok_or(corrupt)? == 1;
    let headers_len = u32::from_be_bytes(
        packed
            .get(3..7)
            .and_then(|b| b.try_into().ok())
            .ok_or(corrupt)?,
    );
    let headers_end = 7usize
        .checked_add(usize::try_from(headers_len).map_err(|_| corrupt)?)
        .ok_or(corrupt)?;
    let headers = packed.get(7..headers_end).ok_or(corrupt)?;
    let body = packed.get(headers_end..).ok_or(corrupt)?;
    let body = stored.then(|| bytes::Bytes::copy_from_slice(body));
    StoredResponse::decode(i64::from(status), headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(body: Option<&'static [u8]>) -> StoredResponse {
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", http::HeaderValue::from_static("1"));
        headers.append("x-a", http::HeaderValue::from_static("two"));
        StoredResponse {
            status: http::StatusCode::CREATED,
            headers,
            body: body.map(bytes::Bytes::from_static),
        }
    }

    #[test]
    fn packed_requests_and_responses_round_trip() {
        let fingerprint = Fingerprint::from_bytes([9; 32]);
        let packed = encode_request(&fingerprint, true, "PATCH", "/a?b=c");
        assert_eq!(
            decode_request(&packed).unwrap(),
            (fingerprint, true, "PATCH".into(), "/a?b=c".into())
        );
        for body in [Some(&b"\x00\xffbody"[..]), Some(&b""[..]), None] {
            let response = response(body);
            assert_eq!(
                decode_response(&encode_response(&response)).unwrap(),
                response
            );
        }
        assert!(decode_request(b"short").is_err());
        assert!(decode_response(b"\x00").is_err());
        assert!(decode_response(b"\x00\xc8\x01\xff\xff\xff\xff").is_err());
    }

    /// A small deterministic generator (xorshift), so the property test
    /// needs no crate and fails the same way every run.
    struct Draw(u64);

    impl Draw {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bytes(&mut self, max: u64) -> Vec<u8> {
            (0..self.below(max + 1))
                .map(|_| self.next().to_le_bytes()[0])
                .collect()
        }
    }

    /// Any in-flight or completed value decodes to the record it was
    /// written for, at any point of its life, and the times decode as
    /// the same durations from the claim.
    #[test]
    fn values_round_trip_through_decode() {
        let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
        let observed_at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        for round in 0..2000 {
            let token = LeaseToken::from_uuid(uuid::Uuid::from_u64_pair(draw.next(), draw.next()));
            let retention = 1 + draw.below(30 * 86_400_000);
            let lease = draw.below(retention * 2);
            let fingerprint = Fingerprint::from_bytes([u8::try_from(round % 251).unwrap(); 32]);
            let method = String::from_utf8_lossy(&draw.bytes(12)).into_owned();
            let path = String::from_utf8_lossy(&draw.bytes(64)).into_owned();
            let transactional = draw.below(2) == 1;
            let request = encode_request(&fingerprint, transactional, &method, &path);
            let pending = in_flight(
                token,
                Duration::from_millis(lease),
                Duration::from_millis(retention),
                &request,
            );
            let elapsed = draw.below(retention + 1);
            let pttl = i64::try_from(retention - elapsed).unwrap();
            let record = decode(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &pending,
                pttl,
                observed_at,
            )
            .unwrap();
            assert_eq!(record.lease_token, token);
            assert_eq!(
                (record.fingerprint, record.transactional),
                (fingerprint, transactional)
            );
            assert_eq!(
                (record.method.as_str(), record.path.as_str()),
                (method.as_str(), path.as_str())
            );
            assert_eq!(record.response, None);
            let ms = |d: time::Duration| i64::try_from(d.whole_milliseconds()).unwrap();
            assert_eq!(
                ms(record.observed_at - record.created_at),
                i64::try_from(elapsed).unwrap()
            );
            assert_eq!(ms(record.expires_at - record.observed_at), pttl);
            assert_eq!(
                ms(record.lease_expires_at - record.created_at),
                i64::try_from(lease).unwrap()
            );
            assert_eq!(
                record.state() == crate::record::RecordState::Abandoned,
                lease <= elapsed
            );

            let body = draw.bytes(300);
            let stored = StoredResponse {
                status: http::StatusCode::OK,
                headers: response(None).headers,
                body: (draw.below(4) != 0).then(|| bytes::Bytes::from(body)),
            };
            let completion = draw.below(elapsed + 1);
            let done = completed(
                &pending,
                Duration::from_millis(completion),
                &encode_response(&stored),
            )
            .unwrap();
            let record = decode(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &done,
                pttl,
                observed_at,
            )
            .unwrap();
            assert_eq!(record.response.as_ref(), Some(&stored));
            assert_eq!(
                ms(record.completed_at.unwrap() - record.created_at),
                i64::try_from(completion).unwrap()
            );
            assert_eq!(View::parse(&done).unwrap().request, request.as_slice());
        }
    }

    /// A claim's value, built in one buffer, is the in-flight value of its
    /// packed request.
    #[test]
    fn a_claim_value_is_the_in_flight_value_of_its_request() {
        let fingerprint = Fingerprint::from_bytes([3; 32]);
        for (method, path, transactional) in [("POST", "/orders?x=1", false), ("", "", true)] {
            let new = NewRecord {
                scope: Scope::leaked("s"),
                key: IdempotencyKey::leaked("k"),
                fingerprint: &fingerprint,
                method,
                path,
                token: LeaseToken::new(),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(3600),
                transactional,
            };
            let request = encode_request(&fingerprint, transactional, method, path);
            assert_eq!(
                claim_value(&new),
                in_flight(new.token, new.lease, new.retention, &request)
            );
        }
    }

    /// A response packed with its headers written in place reads back the same.
    #[test]
    fn a_packed_response_keeps_its_headers() {
        let mut response = StoredResponse::from_bytes("body");
        response
            .headers
            .insert("content-type", http::HeaderValue::from_static("text/plain"));
        response
            .headers
            .append("x-a", http::HeaderValue::from_static("1"));
        response
            .headers
            .append("x-a", http::HeaderValue::from_static("2"));
        let packed = encode_response(&response);
        assert_eq!(decode_response(&packed).unwrap(), response);
    }

    #[test]
    fn other_values_are_corrupt() {
        let request = encode_request(&Fingerprint::from_bytes([1; 32]), false, "POST", "/p");
        let token = LeaseToken::new();
        let good = in_flight(
            token,
            Duration::from_secs(1),
            Duration::from_secs(9),
            &request,
        );
        let now = OffsetDateTime::now_utc();
        assert!(
            decode(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &good,
                5000,
                now
            )
            .is_ok()
        );
        let mut wrong_mark = good.clone();
        wrong_mark[1] = b'1';
        let mut wrong_state = good.clone();
        wrong_state[STATE_AT] = b'x';
        let mut long_request = good.clone();
        long_request[REQUEST_LEN_AT] = 0xff;
        let mut trailing = good.clone();
        trailing.push(0);
        for bad in [
            &good[..HEADER_LEN - 1],
            &good[..good.len() - 1],
            &wrong_mark,
            &wrong_state,
            &long_request,
            &trailing,
            b"",
        ] {
            assert!(
                decode(
                    Scope::leaked("s"),
                    IdempotencyKey::leaked("k"),
                    bad,
                    5000,
                    now
                )
                .is_err(),
                "{bad:?}"
            );
        }
        assert!(completed(&trailing, Duration::ZERO, b"").is_err());
    }

    /// Negative `PTTL` (the key vanished between the value and its `PTTL`)
    /// reads as no time left: expired, never as time to spare.
    #[test]
    fn a_vanished_key_reads_as_expired() {
        let request = encode_request(&Fingerprint::from_bytes([1; 32]), false, "POST", "/p");
        let value = in_flight(
            LeaseToken::new(),
            Duration::from_secs(60),
            Duration::from_secs(90),
            &request,
        );
        let record = decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &value,
            -2,
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert!(record.is_expired());
        let record = decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &value,
            90_000,
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert!(!record.is_expired());
        assert_eq!(record.state(), crate::record::RecordState::InFlight);
    }

    #[test]
    fn the_lua_layout_names_the_codec_positions() {
        let layout = lua_layout();
        assert!(layout.contains("local MARK, IN_FLIGHT, COMPLETED = 'I2', 'f', 'c'"));
        assert!(layout.contains("local STATE, WATCHED, TOKEN, TOKEN_END = 3, 4, 5, 20"));
        assert!(layout.contains("local RETENTION, LEASE_END, COMPLETION = 21, 29, 37"));
        assert!(layout.contains("local REQUEST_LEN, HEADER = 45, 48"));
    }
}
