//! Release 1's records: one hash per record, read (never written) by this
//! release, so that records written before an upgrade answer as before
//! for their whole retention (docs/RELEASING.md). `lua/legacy.lua` reads
//! one and packs its fields (`lua/legacy_pack.lua`); this decodes them.

use time::OffsetDateTime;

use super::codec::{decode_request, decode_response};
use crate::key::{IdempotencyKey, Scope};
use crate::record::CorruptRecord;
use crate::record::LeaseToken;
use crate::record::Record;
use crate::store::StoreError;

/// The fields of a release 1 hash, one letter each: `t` lease token, `s`
/// state (`f` in flight, `c` completed), `l` lease end, `e` expiry, `n`
/// creation (Unix ms, the server's clock), `m` the packed request, `p` the
/// packed response and `c` completion time, once completed. A record may
/// also hold `w` (watched), which is not part of the record.
const FIELDS: [&str; 8] = ["t", "s", "l", "e", "n", "m", "p", "c"];

/// A missing field's length in packed fields.
const MISSING: u32 = u32::MAX;

fn from_millis(millis: i64) -> Result<OffsetDateTime, CorruptRecord> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000)
        .map_err(|_| CorruptRecord("a stored time is out of range"))
}

/// The integer written in decimal in `bytes` (an optional `-`, then
/// digits), as Redis sends numbers; `None` for anything else or on
/// overflow. Parsed from the bytes directly: through `str::from_utf8` and
/// `parse`, a replay's eight numbers cost about a thousand instructions.
fn decimal_value(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = i64::from(byte.checked_sub(b'0').filter(|digit| *digit < 10)?);
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// A record from the fields packed by `lua/legacy_pack.lua` (the eight lengths as
/// 4-byte big-endian numbers, [`MISSING`] for a missing field, then the
/// present fields' bytes in order), read at `now`; `None` when the record
/// does not exist.
pub(super) fn record_from_packed(
    scope: &Scope,
    key: &IdempotencyKey,
    packed: &[u8],
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let corrupt = CorruptRecord("the packed record is invalid");
    let (lengths, mut values) = packed.split_at_checked(4 * FIELDS.len()).ok_or(corrupt)?;
    let mut fields = [None; FIELDS.len()];
    for (field, length) in fields.iter_mut().zip(lengths.chunks_exact(4)) {
        let length = u32::from_be_bytes(length.try_into().map_err(|_| corrupt)?);
        if length == MISSING {
            continue;
        }
        let length = usize::try_from(length).map_err(|_| corrupt)?;
        let (value, rest) = values.split_at_checked(length).ok_or(corrupt)?;
        *field = Some(value);
        values = rest;
    }
    if !values.is_empty() {
        return Err(corrupt.into());
    }
    record_from(scope, key, &fields, now)
}

/// A record from the values of [`FIELDS`], in order; `None` when the record
/// does not exist (no lease token).
fn record_from(
    scope: &Scope,
    key: &IdempotencyKey,
    fields: &[Option<&[u8]>; FIELDS.len()],
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let field = |name: &str| -> Option<&[u8]> {
        let index = FIELDS.iter().position(|f| *f == name)?;
        fields[index]
    };
    let Some(token) = field("t") else {
        return Ok(None);
    };
    let missing = CorruptRecord("a record field is missing");
    let number = |name: &str| -> Result<i64, CorruptRecord> {
        decimal_value(field(name).ok_or(missing)?).ok_or(CorruptRecord("a number field is invalid"))
    };
    let token = uuid::Uuid::from_slice(token)
        .map_err(|_| CorruptRecord("the lease token is not 16 bytes"))?;
    let (fingerprint, transactional, method, path) = decode_request(field("m").ok_or(missing)?)?;
    let completed = field("s") == Some(b"c".as_slice());
    let response = completed
        .then(|| decode_response(field("p").ok_or(missing)?))
        .transpose()?;
    Ok(Some(Record {
        scope: scope.clone(),
        key: key.clone(),
        fingerprint,
        method,
        path,
        lease_token: LeaseToken::from_uuid(token),
        lease_expires_at: from_millis(number("l")?)?,
        transactional,
        response,
        created_at: from_millis(number("n")?)?,
        completed_at: completed
            .then(|| number("c").and_then(from_millis))
            .transpose()?,
        expires_at: from_millis(number("e")?)?,
        observed_at: from_millis(now)?,
        steps: Vec::new(),
        request: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;
    use crate::record::StoredResponse;
    use crate::store::redis::codec::{encode_request, encode_response};

    #[test]
    fn decimal_values_parse_as_str_parse_does() {
        for text in [
            "0",
            "7",
            "-7",
            "1764547200123",
            "-0",
            "9223372036854775807",
            "-9223372036854775808",
        ] {
            assert_eq!(
                decimal_value(text.as_bytes()),
                text.parse::<i64>().ok(),
                "{text}"
            );
        }
        for text in [
            "",
            "-",
            "+1",
            "1a",
            " 1",
            "9223372036854775808",
            "-9223372036854775809",
            "1.5",
        ] {
            assert_eq!(decimal_value(text.as_bytes()), None, "{text}");
        }
    }

    /// Packs fields as `lua/legacy_pack.lua` does.
    fn pack(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut packed = Vec::new();
        for field in fields {
            let length = field.map_or(MISSING, |value| u32::try_from(value.len()).unwrap());
            packed.extend_from_slice(&length.to_be_bytes());
        }
        for value in fields.iter().flatten() {
            packed.extend_from_slice(value);
        }
        packed
    }

    #[test]
    fn packed_fields_decode_to_the_record() {
        let token = uuid::Uuid::new_v4();
        let request = encode_request(&Fingerprint::from_bytes([7; 32]), false, "POST", "/p:~");
        let response = encode_response(&StoredResponse::from_bytes("12:~ok"));
        // t s l e n m p c; any bytes inside values are data.
        let completed: [Option<&[u8]>; 8] = [
            Some(token.as_bytes()),
            Some(b"c"),
            Some(b"1700000060000"),
            Some(b"1700086400000"),
            Some(b"1700000000000"),
            Some(&request),
            Some(&response),
            Some(b"1700000001000"),
        ];
        let record = record_from_packed(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &pack(&completed),
            1_700_000_002_000,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            record.response.unwrap().body.as_deref(),
            Some(&b"12:~ok"[..])
        );
        assert_eq!(record.path, "/p:~");
        assert_eq!(record.lease_token.as_uuid(), token);
        assert_eq!(record.created_at.unix_timestamp(), 1_700_000_000);
        assert_eq!(record.expires_at.unix_timestamp(), 1_700_086_400);
        let mut in_flight = completed;
        in_flight[1] = Some(b"f");
        in_flight[6] = None;
        in_flight[7] = None;
        let record = record_from_packed(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &pack(&in_flight),
            1_700_000_002_000,
        )
        .unwrap()
        .unwrap();
        assert_eq!(record.state(), crate::record::RecordState::InFlight);
        let record = record_from_packed(
            Scope::leaked("s"),
            IdempotencyKey::leaked("k"),
            &pack(&in_flight),
            1_700_000_060_000,
        )
        .unwrap()
        .unwrap();
        assert_eq!(record.state(), crate::record::RecordState::Abandoned);
        // No token: no record.
        assert_eq!(
            record_from_packed(
                Scope::leaked("s"),
                IdempotencyKey::leaked("k"),
                &pack(&[None; 8]),
                0
            )
            .unwrap(),
            None
        );
        // Truncated, too long, too few fields, lengths cut short: corrupt.
        let whole = pack(&completed);
        for bad in [
            &whole[..whole.len() - 1],
            &[whole.as_slice(), b"~"].concat()[..],
            &pack(&completed[..7])[..],
            &whole[..30],
        ] {
            assert!(
                record_from_packed(Scope::leaked("s"), IdempotencyKey::leaked("k"), bad, 0)
                    .is_err(),
                "{bad:?}"
            );
        }
    }
}
