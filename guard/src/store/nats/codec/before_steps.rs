//! The reader of the layout before recorded steps (the value's decoder as
//! it stood before steps, kept verbatim but for this header and its
//! imports): the rolling-upgrade tests decode values this release writes
//! with it, as a process of the previous release would.

use bytes::{Buf, Bytes};
use time::OffsetDateTime;

use super::{Stored, from_unix_ms, unix_ms};
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::{CorruptRecord, LeaseToken, Record, StoredResponse};

const MARK: &[u8; 2] = b"N1";
const TRANSACTIONAL: u8 = 1;
const COMPLETED: u8 = 2;
const BODY: u8 = 4;

/// An instant in a value: relative to the message's own stamp, or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Time {
    /// No instant (the lease cap of a value that is not a renewal).
    Unset,
    /// The message's stamp plus this many milliseconds.
    AfterStamp(i64),
    /// This instant, in Unix milliseconds (copied from an earlier stamp).
    At(i64),
}

impl Time {
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
        steps: Vec::new(),
        request: None,
    };
    Ok(Stored {
        record,
        revision,
        retention_ms,
    })
}
