//! The record's layout in a NATS JetStream KV bucket: one message per
//! record (the bucket keeps one per subject), written here and nowhere
//! else.
//!
//! # The subject
//!
//! `$KV.<bucket>.=<scope>.=<key>`, scope and key each in URL-safe base64
//! without padding behind a `=` (which base64 never writes, so an empty
//! scope or key still makes a token): every byte of a key is allowed, none
//! can reach another token, and two pairs never meet on one subject.
//!
//! # The value
//!
//! All numbers are big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `N1`, the layout's mark |
//! | 2 | flags: 1 transactional, 2 completed, 4 body stored, 8 steps, 16 request |
//! | 3..35 | the request's fingerprint |
//! | 35..51 | the lease token |
//! | 51..60 | creation: a [`Time`] |
//! | 60..69 | lease end: a [`Time`] |
//! | 69..78 | lease cap: a [`Time`] (`Unset` but after a renewal) |
//! | 78..86 | retention, ms from creation |
//! | 86.. | method (u16 length, bytes), path (u32 length, bytes), then once completed: status (u16), headers (u32 length, bytes), body (u32 length, bytes) when stored |
//! | then | with steps: the steps' cap (a [`Time`]), how many steps the record held before this write (u32), the steps ([`Step::encode_all`]'s JSON, u32 length, bytes) |
//! | then | with a request: the request's cap (a [`Time`]), the request the record held before this write and the request ([`StoredRequest::encode`], each u32 length, bytes; empty for none) |
//!
//! # Steps: at the end, where the reader before them stops
//!
//! The steps come last, behind a flag of their own: the reader of the
//! layout before them (`codec/before_steps.rs`, kept for the test) ignores
//! flags it does not know and never reads past the response, so a process
//! of the previous release reads a record with steps as the same record
//! without them and decides as before (it never resumes, and a take-over of
//! its own writes a value without them).
//!
//! The stored request (the completer's, [`StoredRequest`]) comes after
//! them, behind a flag of its own, where the reader of steps stops in
//! turn: a reader before it (either) reads the same record without it.
//!
//! A step write is fenced like a renewal: its cap is the end of the lease
//! it was sent under, and when its own stamp is past the cap (the lease had
//! ended on the leader's clock when the write landed) the steps it added
//! are void, and the record reads with the steps it held before. So a
//! runner whose lease lapsed records nothing, as on the SQL stores, even
//! when its write was on its way when the lease ended. A request write is
//! fenced the same way: stamped past its cap, the record reads with the
//! request it held before (which the write carries beside the new one; a
//! later rewrite drops it).
//!
//! # Times: the leader's stamps
//!
//! Every message carries the time the stream's leader stored it (`T`, on
//! the leader's clock, replicated with the message). A value never holds
//! the writer's clock: a [`Time`] is either `T` plus a duration (a claim's
//! creation and lease, a renewal's lease) or an instant copied from an
//! earlier message's `T` (a completion keeps its claim's creation and lease
//! end). See the store's module documentation for how they are compared.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use time::OffsetDateTime;

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::CorruptRecord;
use crate::record::StoredRequest;
use crate::record::{LeaseToken, Record, Step, StoredResponse};

const MARK: &[u8; 2] = b"N1";
const TRANSACTIONAL: u8 = 1;
const COMPLETED: u8 = 2;
const BODY: u8 = 4;
const STEPS: u8 = 8;
const REQUEST: u8 = 16;

#[cfg(test)]
mod before_steps;

/// An instant in a value: relative to the message's own stamp, or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// No instant (the lease cap of a value that is not a renewal).
    Unset,
    /// The message's stamp plus this many milliseconds.
    AfterStamp(i64),
    /// This instant, in Unix milliseconds (copied from an earlier stamp).
    At(i64),
}

impl Time {
    fn put(self, out: &mut BytesMut) {
        let (tag, value) = match self {
            Self::Unset => (0, 0),
            Self::AfterStamp(ms) => (1, ms),
            Self::At(ms) => (2, ms),
        };
        out.put_u8(tag);
        out.put_i64(value);
    }

    fn get(input: &mut &[u8]) -> Result<Self, CorruptRecord> {
        need(input, 9)?;
        let tag = input.get_u8();
        let value = input.get_i64();
        match tag {
            0 => Ok(Self::Unset),
            1 => Ok(Self::AfterStamp(value)),
            2 => Ok(Self::At(value)),
            _ => Err(CorruptRecord("a stored time has an unknown kind")),
        }
    }

    /// The instant, given the message's stamp (Unix ms); `None` if unset.
    fn resolve(self, stamp: i64) -> Option<i64> {
        match self {
            Self::Unset => None,
            Self::AfterStamp(ms) => Some(stamp.saturating_add(ms)),
            Self::At(ms) => Some(ms),
        }
    }
}

/// A record as one value holds it (times unresolved).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Packed<'a> {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) token: LeaseToken,
    pub(crate) transactional: bool,
    pub(crate) created: Time,
    pub(crate) lease_end: Time,
    /// A renewal's cap: when its own stamp is past the cap, the lease it
    /// meant to extend had already ended, and it ends at the cap.
    pub(crate) lease_cap: Time,
    pub(crate) retention_ms: i64,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) response: Option<&'a StoredResponse>,
    /// The steps recorded (written only when there are some).
    pub(crate) steps: &'a [Step],
    /// A step write's cap, the end of the lease it was sent under: stamped
    /// past it, the steps beyond the first `steps_before` are void.
    pub(crate) steps_cap: Time,
    /// How many of `steps` the record held before this write.
    pub(crate) steps_before: usize,
    /// The request kept for the completer, if any.
    pub(crate) request: Option<&'a StoredRequest>,
    /// A request write's cap, the end of the lease it was sent under:
    /// stamped past it, the record holds `request_before` instead.
    pub(crate) request_cap: Time,
    /// The request the record held before this write (a request write's
    /// only; a rewrite leaves it out).
    pub(crate) request_before: Option<&'a StoredRequest>,
}

/// Encodes a value.
pub(crate) fn encode(packed: &Packed<'_>) -> Bytes {
    let body = packed.response.and_then(|r| r.body.as_ref());
    let headers = packed.response.map(StoredResponse::encode_headers);
    let steps = Step::encode_all(packed.steps);
    let requests = (packed.request.is_some() || packed.request_before.is_some()).then(|| {
        [packed.request_before, packed.request]
            .map(|request| request.map(StoredRequest::encode).unwrap_or_default())
    });
    let size = 96
        + 13
        + 17
        + steps.as_ref().map_or(0, Vec::len)
        + requests
            .as_ref()
            .map_or(0, |[before, now]| before.len() + now.len())
        + packed.method.len()
        + packed.path.len()
        + headers.as_ref().map_or(0, Vec::len)
        + body.map_or(0, Bytes::len);
    let mut out = BytesMut::with_capacity(size);
    out.put_slice(MARK);
    let mut flags = 0;
    if packed.transactional {
        flags |= TRANSACTIONAL;
    }
    if packed.response.is_some() {
        flags |= COMPLETED;
    }
    if body.is_some() {
        flags |= BODY;
    }
    if steps.is_some() {
        flags |= STEPS;
    }
    if requests.is_some() {
        flags |= REQUEST;
    }
    out.put_u8(flags);
    out.put_slice(packed.fingerprint.as_bytes());
    out.put_slice(packed.token.as_uuid().as_bytes());
    packed.created.put(&mut out);
    packed.lease_end.put(&mut out);
    packed.lease_cap.put(&mut out);
    out.put_i64(packed.retention_ms);
    put_bytes16(&mut out, packed.method.as_bytes());
    put_bytes32(&mut out, packed.path.as_bytes());
    if let Some(response) = packed.response {
        out.put_u16(response.status.as_u16());
        put_bytes32(&mut out, headers.as_deref().unwrap_or_default());
        if let Some(body) = body {
            put_bytes32(&mut out, body);
        }
    }
    if let Some(steps) = steps {
        packed.steps_cap.put(&mut out);
        out.put_u32(u32::try_from(packed.steps_before).unwrap_or(u32::MAX));
        put_bytes32(&mut out, &steps);
    }
    if let Some([before, now]) = requests {
        packed.request_cap.put(&mut out);
        put_bytes32(&mut out, &before);
        put_bytes32(&mut out, &now);
    }
    out.freeze()
}

fn put_bytes16(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u16(u16::try_from(bytes.len()).unwrap_or(u16::MAX));
    out.put_slice(&bytes[..bytes.len().min(usize::from(u16::MAX))]);
}

fn put_bytes32(out: &mut BytesMut, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.put_u32(len);
    out.put_slice(&bytes[..len as usize]);
}

fn need(input: &[u8], n: usize) -> Result<(), CorruptRecord> {
    if input.len() < n {
        Err(CorruptRecord("a stored record is truncated"))
    } else {
        Ok(())
    }
}

fn get_bytes<'a>(input: &mut &'a [u8], wide: bool) -> Result<&'a [u8], CorruptRecord> {
    let len = if wide {
        need(input, 4)?;
        input.get_u32() as usize
    } else {
        need(input, 2)?;
        usize::from(input.get_u16())
    };
    need(input, len)?;
    let (bytes, rest) = input.split_at(len);
    *input = rest;
    Ok(bytes)
}

fn utf8(bytes: &[u8]) -> Result<String, CorruptRecord> {
    String::from_utf8(bytes.to_vec()).map_err(|_| CorruptRecord("a stored text is not UTF-8"))
}

/// A record read back, with what the store's writes need beside it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// The record, its times resolved and `observed_at` the reader's
    /// estimate of the leader's clock.
    pub(crate) record: Record,
    /// The message's stream sequence: the revision the next write of this
    /// record names (the fence).
    pub(crate) revision: u64,
    /// The retention, ms from creation (a take-over and a completion keep
    /// the absolute expiry, a renewal needs it for the message's TTL).
    pub(crate) retention_ms: i64,
}

/// Unix milliseconds of an instant.
pub(crate) fn unix_ms(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// The instant of Unix milliseconds.
pub(crate) fn from_unix_ms(ms: i64) -> Result<OffsetDateTime, CorruptRecord> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map_err(|_| CorruptRecord("a stored time is out of range"))
}

/// Decodes the value of `(scope, key)` stored at `stamp` (the message's
/// time) with sequence `revision`, read when the leader's clock showed
/// about `observed_at`.
pub(crate) fn decode(
    scope: &Scope,
    key: &IdempotencyKey,
    value: &[u8],
    stamp: OffsetDateTime,
    revision: u64,
    observed_at: OffsetDateTime,
) -> Result<Stored, CorruptRecord> {
    let mut input = value;
    need(input, 86)?;
    if &input[..2] != MARK {
        return Err(CorruptRecord("a stored record has an unknown layout"));
    }
    input.advance(2);
    let flags = input.get_u8();
    let mut fingerprint = [0u8; 32];
    input.copy_to_slice(&mut fingerprint);
    let mut token = [0u8; 16];
    input.copy_to_slice(&mut token);
    let created = Time::get(&mut input)?;
    let lease_end = Time::get(&mut input)?;
    let lease_cap = Time::get(&mut input)?;
    need(input, 8)?;
    let retention_ms = input.get_i64();
    let method = utf8(get_bytes(&mut input, false)?)?;
    let path = utf8(get_bytes(&mut input, true)?)?;
    let response = if flags & COMPLETED != 0 {
        need(input, 2)?;
        let status = i64::from(input.get_u16());
        let headers = get_bytes(&mut input, true)?;
        let body = if flags & BODY != 0 {
            Some(Bytes::copy_from_slice(get_bytes(&mut input, true)?))
        } else {
            None
        };
        Some(StoredResponse::decode(status, headers, body)?)
    } else {
        None
    };
    let stamp_ms = unix_ms(stamp);
    let mut steps = Vec::new();
    if flags & STEPS != 0 {
        let cap = Time::get(&mut input)?;
        need(input, 4)?;
        let before = input.get_u32() as usize;
        steps = Step::decode_all(Some(get_bytes(&mut input, true)?))?;
        if let Some(cap) = cap.resolve(stamp_ms)
            && stamp_ms > cap
        {
            // Landed after the lease it was sent under had ended: void.
            steps.truncate(before);
        }
    }
    let mut request = None;
    if flags & REQUEST != 0 {
        let cap = Time::get(&mut input)?;
        let before = get_bytes(&mut input, true)?;
        let now = get_bytes(&mut input, true)?;
        let late = cap.resolve(stamp_ms).is_some_and(|cap| stamp_ms > cap);
        // Landed after the lease it was sent under had ended: void.
        let kept = if late { before } else { now };
        if !kept.is_empty() {
            request = Some(Box::new(StoredRequest::decode(kept)?));
        }
    }
    let created_ms = created
        .resolve(stamp_ms)
        .ok_or(CorruptRecord("a stored record has no creation time"))?;
    let mut lease_end_ms = lease_end
        .resolve(stamp_ms)
        .ok_or(CorruptRecord("a stored record has no lease end"))?;
    if let Some(cap) = lease_cap.resolve(stamp_ms)
        && stamp_ms > cap
    {
        // The renewal landed after the lease it extends had ended: void.
        lease_end_ms = cap;
    }
    let record = Record {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes(fingerprint),
        method,
        path,
        lease_token: LeaseToken::from_uuid(uuid::Uuid::from_bytes(token)),
        lease_expires_at: from_unix_ms(lease_end_ms)?,
        transactional: flags & TRANSACTIONAL != 0,
        completed_at: response
            .is_some()
            .then(|| from_unix_ms(stamp_ms))
            .transpose()?,
        response,
        created_at: from_unix_ms(created_ms)?,
        expires_at: from_unix_ms(created_ms.saturating_add(retention_ms))?,
        observed_at,
        steps,
        request,
    };
    Ok(Stored {
        record,
        revision,
        retention_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, StatusCode};

    fn packed(response: Option<&StoredResponse>) -> Packed<'_> {
        Packed {
            fingerprint: Fingerprint::from_bytes([7; 32]),
            token: LeaseToken::new(),
            transactional: true,
            created: Time::AfterStamp(0),
            lease_end: Time::AfterStamp(30_000),
            lease_cap: Time::Unset,
            retention_ms: 86_400_000,
            method: "POST",
            path: "/things?x=1",
            response,
            steps: &[],
            steps_cap: Time::Unset,
            steps_before: 0,
            request: None,
            request_cap: Time::Unset,
            request_before: None,
        }
    }

    fn steps() -> Vec<Step> {
        vec![
            Step {
                name: "reserve".into(),
                input: Some("ab".repeat(32)),
                value: serde_json::json!({"hold": 7}),
            },
            Step {
                name: "charge".into(),
                input: None,
                value: serde_json::json!("ch_1"),
            },
        ]
    }

    fn request(body: &str, attempts: u32) -> StoredRequest {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let mut request = StoredRequest::new("POST", "/debits?x=1", headers, body.to_owned());
        request.attempts = attempts;
        request
    }

    fn decode_at(value: &[u8], stamp: i64) -> Result<Stored, CorruptRecord> {
        decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            value,
            at(stamp),
            3,
            at(stamp + 1),
        )
    }

    /// Steps ride at the end of the value, and the stored request after
    /// them, each behind a flag of its own: a reader of the layout before
    /// them (the previous release's, kept in `before_steps.rs`) reads the
    /// same record without them, in flight, abandoned or completed, and so
    /// decides as before; this one reads them back.
    #[test]
    fn recorded_steps_are_read_apart_here_and_ignored_by_a_reader_before_them() {
        let steps = steps();
        let kept = request("{\"amount\":5}", 1);
        let earlier = request("{\"amount\":5}", 0);
        let response = StoredResponse::from_bytes("done");
        let bodiless = StoredResponse {
            body: None,
            ..response.clone()
        };
        let with_request = [false, true].into_iter().flat_map(|request| {
            [
                (false, None),
                (true, None),
                (false, Some(&response)),
                (false, Some(&bodiless)),
            ]
            .map(|(transactional, response)| (request, transactional, response))
        });
        for (with_request, transactional, response) in with_request {
            let mut value = packed(response);
            value.transactional = transactional;
            value.steps = &steps;
            value.steps_cap = Time::At(40_000);
            value.steps_before = 1;
            if with_request {
                value.request = Some(&kept);
                value.request_cap = Time::At(40_000);
                value.request_before = Some(&earlier);
            }
            let encoded = encode(&value);
            for stamp in [5_000, 60_000] {
                let here = decode_at(&encoded, stamp).unwrap();
                let before = before_steps::decode(
                    Scope::leaked("s"),
                    IdempotencyKey::leaked("k"),
                    &encoded,
                    at(stamp),
                    3,
                    at(stamp + 1),
                )
                .unwrap();
                let mut without = here.record.clone();
                without.steps.clear();
                without.request = None;
                assert_eq!(before.record, without);
                assert_eq!(before.record.state(), here.record.state());
                assert_eq!(before.record.transactional, transactional);
                assert_eq!(before.record.path, "/things?x=1");
                assert_eq!(before.retention_ms, here.retention_ms);
                // The reader of steps (before the request) ignores the flag
                // and stops after the steps: as this one, the flag cleared.
                let mut unflagged = encoded.to_vec();
                unflagged[2] &= !REQUEST;
                let mut without_request = here.record.clone();
                without_request.request = None;
                assert_eq!(
                    decode_at(&unflagged, stamp).unwrap().record,
                    without_request
                );
            }
            let here = decode_at(&encoded, 5_000).unwrap().record;
            assert_eq!(here.steps, steps);
            assert_eq!(here.request.as_deref(), value.request);
            // The same value without steps and request: the reader before
            // them reads the two alike.
            let plain = encode(&Packed {
                steps: &[],
                request: None,
                request_before: None,
                ..value.clone()
            });
            assert_eq!(
                decode_at(&plain, 5_000).unwrap().record,
                before_steps::decode(
                    Scope::leaked("s"),
                    IdempotencyKey::leaked("k"),
                    &encoded,
                    at(5_000),
                    3,
                    at(5_001),
                )
                .unwrap()
                .record
            );
        }
    }

    /// A request write is fenced like a step write: stamped after the
    /// lease it was sent under, the record holds the request before it
    /// (none, or the earlier one); a rewrite that copies it has no cap.
    #[test]
    fn a_request_write_stamped_after_its_lease_ended_is_void() {
        let earlier = request("{}", 1);
        let kept = request("{}", 2);
        for before in [None, Some(&earlier)] {
            let mut value = packed(None);
            value.created = Time::At(0);
            value.lease_end = Time::At(10_000);
            value.request = Some(&kept);
            value.request_cap = Time::At(10_000);
            value.request_before = before;
            let encoded = encode(&value);
            for (stamp, expected) in [
                (9_999, Some(&kept)),
                (10_000, Some(&kept)),
                (10_001, before),
            ] {
                let record = decode_at(&encoded, stamp).unwrap().record;
                assert_eq!(record.request.as_deref(), expected, "{stamp}");
            }
        }
        // A write that clears it, late, leaves the earlier one.
        let mut value = packed(None);
        value.request_cap = Time::At(10_000);
        value.request_before = Some(&earlier);
        let cleared = encode(&value);
        assert_eq!(decode_at(&cleared, 9_000).unwrap().record.request, None);
        assert_eq!(
            decode_at(&cleared, 10_001)
                .unwrap()
                .record
                .request
                .as_deref(),
            Some(&earlier)
        );
        // A rewrite that copies it (a renewal, a completion) has no cap.
        let mut value = packed(None);
        value.request = Some(&kept);
        let copied = encode(&value);
        assert_eq!(
            decode_at(&copied, 99_999)
                .unwrap()
                .record
                .request
                .as_deref(),
            Some(&kept)
        );
    }

    #[test]
    fn a_step_write_stamped_after_its_lease_ended_is_void() {
        let steps = steps();
        let mut value = packed(None);
        value.created = Time::At(0);
        value.lease_end = Time::At(10_000);
        value.steps = &steps;
        value.steps_cap = Time::At(10_000);
        value.steps_before = 1;
        let encoded = encode(&value);
        assert_eq!(decode_at(&encoded, 9_999).unwrap().record.steps, steps);
        assert_eq!(decode_at(&encoded, 10_000).unwrap().record.steps, steps);
        assert_eq!(
            decode_at(&encoded, 10_001).unwrap().record.steps,
            steps[..1]
        );
        // A rewrite that copies them (a renewal, a completion) has no cap.
        value.steps_cap = Time::Unset;
        value.steps_before = 2;
        let copied = encode(&value);
        assert_eq!(decode_at(&copied, 99_999).unwrap().record.steps, steps);
    }

    fn at(ms: i64) -> OffsetDateTime {
        from_unix_ms(ms).unwrap()
    }

    #[test]
    fn a_claim_resolves_its_times_on_its_own_stamp() {
        let value = packed(None);
        let stored = decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &encode(&value),
            at(1_000_000),
            42,
            at(1_000_500),
        )
        .unwrap();
        let record = &stored.record;
        assert_eq!(stored.revision, 42);
        assert_eq!(record.created_at, at(1_000_000));
        assert_eq!(record.lease_expires_at, at(1_030_000));
        assert_eq!(record.expires_at, at(1_000_000 + 86_400_000));
        assert_eq!(record.lease_token, value.token);
        assert!(record.transactional);
        assert_eq!(record.path, "/things?x=1");
        assert_eq!(record.response, None);
        assert_eq!(record.completed_at, None);
    }

    #[test]
    fn a_completion_keeps_its_claims_times_and_round_trips_the_response() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        for body in [
            Some(Bytes::from_static(b"\x00\xffbody")),
            Some(Bytes::new()),
            None,
        ] {
            let response = StoredResponse {
                status: StatusCode::CREATED,
                headers: headers.clone(),
                body,
            };
            let mut value = packed(Some(&response));
            value.created = Time::At(5_000);
            value.lease_end = Time::At(35_000);
            let stored = decode(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &encode(&value),
                at(9_000),
                1,
                at(9_001),
            )
            .unwrap();
            assert_eq!(stored.record.created_at, at(5_000));
            assert_eq!(stored.record.lease_expires_at, at(35_000));
            assert_eq!(stored.record.completed_at, Some(at(9_000)));
            assert_eq!(stored.record.response.as_ref(), Some(&response));
        }
    }

    #[test]
    fn a_renewal_stamped_after_its_cap_ends_the_lease_at_the_cap() {
        let mut value = packed(None);
        value.created = Time::At(0);
        value.lease_end = Time::AfterStamp(60_000);
        value.lease_cap = Time::At(10_000);
        let in_time = decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &encode(&value),
            at(9_999),
            2,
            at(9_999),
        )
        .unwrap();
        assert_eq!(in_time.record.lease_expires_at, at(69_999));
        let late = decode(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &encode(&value),
            at(10_001),
            2,
            at(10_001),
        )
        .unwrap();
        assert_eq!(late.record.lease_expires_at, at(10_000));
    }

    #[test]
    fn damaged_values_are_corrupt_not_panics() {
        let steps = steps();
        let kept = request("{}", 0);
        let with_steps = encode(&Packed {
            steps: &steps,
            request: Some(&kept),
            request_before: Some(&kept),
            ..packed(None)
        });
        for len in 0..with_steps.len() {
            assert!(decode_at(&with_steps[..len], 0).is_err(), "{len}");
        }
        let value = encode(&packed(None));
        for len in 0..value.len() {
            assert!(
                decode(
                    Scope::leaked("s"),
                    IdempotencyKey::leaked("k"),
                    &value[..len],
                    at(0),
                    1,
                    at(0)
                )
                .is_err(),
                "{len}"
            );
        }
        let mut other = value.to_vec();
        other[0] = b'X';
        assert!(
            decode(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &other,
                at(0),
                1,
                at(0)
            )
            .is_err()
        );
    }
}
