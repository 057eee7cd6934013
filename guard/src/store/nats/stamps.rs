//! The stamps of the bucket's latest messages, as the watch sees them: each
//! delivery of the bucket's ordered consumer names the message's stream
//! sequence and the instant the stream's leader stored it, and a claim of
//! this process carries its lease token in a header (`Idem-Lease`). So a
//! completion of this process's own claim finds its claim's stamp here,
//! the one instant its value needs (a claim's times count from its stamp,
//! and a completion copies them), instead of reading the record back from
//! the leader: one round trip less per fresh request.
//!
//! The table keeps the last [`SLOTS`] messages' stamps, one slot per
//! sequence modulo its size, each with the token its claim carried, so a
//! slot is used only by the claim that wrote it: a sequence of a bucket
//! deleted and made again, or a slot that a later message took, is not
//! found, and the completion reads the record from the leader as before.
//!
//! The leader sends a claim's acknowledgement and its delivery to the watch
//! at the same moment, but the completion may come first (a handler that
//! answers at once): it then waits for the watch, at most [`WAIT`], while
//! the watch has not passed the claim's sequence and is less than
//! [`MAX_GAP`] messages behind it (a watch that stopped is not waited for).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::{HeaderName, HeaderValue};
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::record::LeaseToken;

/// The header in which a claim (or a take-over) names its lease token
/// (a static name: no allocation to send or look it up).
pub(super) static LEASE_HEADER: HeaderName = HeaderName::from_static("Idem-Lease");

/// How many of the latest messages' stamps are kept.
const SLOTS: usize = 4096;

/// How long a completion waits for the watch to see its claim, at most,
/// before it reads the record instead (a read takes a round trip to the
/// leader, about a millisecond on one machine's loopback).
pub(super) const WAIT: Duration = Duration::from_millis(2);

/// How far behind a claim's sequence the watch may be for a completion to
/// wait for it.
const MAX_GAP: u64 = 1024;

/// A message's stamp, by its stream sequence.
#[derive(Clone, Copy)]
struct Slot {
    sequence: u64,
    token: u128,
    stamp: OffsetDateTime,
}

/// The stamps of the latest claims the watch saw; see the module's
/// documentation.
pub(super) struct Stamps {
    table: Mutex<Table>,
    /// Told of every message the watch sees.
    seen: Notify,
}

/// The slots, and the latest sequence the watch saw.
struct Table {
    latest: u64,
    slots: Box<[Slot]>,
}

impl Default for Stamps {
    fn default() -> Self {
        let empty = Slot {
            // Stream sequences start at 1.
            sequence: 0,
            token: 0,
            stamp: OffsetDateTime::UNIX_EPOCH,
        };
        Self {
            table: Mutex::new(Table {
                latest: 0,
                slots: vec![empty; SLOTS].into_boxed_slice(),
            }),
            seen: Notify::new(),
        }
    }
}

/// What the table says of a claim's sequence.
enum Lookup {
    /// Its stamp.
    Found(OffsetDateTime),
    /// The watch has not seen it yet and is close behind.
    Behind,
    /// Not found, and not worth waiting for.
    Missing,
}

/// The header value that names `token`: its 32 hex digits.
pub(super) fn lease_header(token: LeaseToken) -> HeaderValue {
    let mut text = [0_u8; 32];
    let hex = token.as_uuid().simple().encode_lower(&mut text);
    HeaderValue::from(&*hex)
}

/// The token a header value names, if it is one [`lease_header`] wrote.
fn parse_lease(value: &str) -> Option<u128> {
    if value.len() != 32 {
        return None;
    }
    u128::from_str_radix(value, 16).ok()
}

impl Stamps {
    /// Keeps the stamp of the message at `sequence`, whose `Idem-Lease`
    /// header (if any) is `lease`.
    pub(super) fn record(&self, sequence: u64, lease: Option<&str>, stamp: OffsetDateTime) {
        {
            let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            table.latest = table.latest.max(sequence);
            if let Some(token) = lease.and_then(parse_lease) {
                let index = slot_of(sequence, table.slots.len());
                table.slots[index] = Slot {
                    sequence,
                    token,
                    stamp,
                };
            }
        }
        self.seen.notify_waiters();
    }

    /// The stamp of the message at `sequence`, if the watch saw it and
    /// `token`'s claim wrote it; waits for the watch at most `wait` while
    /// it is close behind (see the module's documentation).
    pub(super) async fn get(
        &self,
        sequence: u64,
        token: LeaseToken,
        wait: Duration,
    ) -> Option<OffsetDateTime> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let seen = self.seen.notified();
            tokio::pin!(seen);
            // Registered before the look-up: a message recorded after it
            // wakes the wait.
            seen.as_mut().enable();
            match self.lookup(sequence, token) {
                Lookup::Found(stamp) => return Some(stamp),
                Lookup::Missing => return None,
                Lookup::Behind => {}
            }
            tokio::time::timeout_at(until, seen).await.ok()?;
        }
    }

    fn lookup(&self, sequence: u64, token: LeaseToken) -> Lookup {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = table.slots[slot_of(sequence, table.slots.len())];
        if slot.sequence == sequence && slot.token == token.as_uuid().as_u128() {
            Lookup::Found(slot.stamp)
        } else if table.latest < sequence && sequence - table.latest <= MAX_GAP {
            Lookup::Behind
        } else {
            Lookup::Missing
        }
    }
}

/// The slot of `sequence` in a table of `len` slots.
fn slot_of(sequence: u64, len: usize) -> usize {
    // `len` fits in a u64 and the remainder in a usize.
    usize::try_from(sequence % len as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(stamps: &Stamps, sequence: u64, token: LeaseToken) -> Option<OffsetDateTime> {
        match stamps.lookup(sequence, token) {
            Lookup::Found(stamp) => Some(stamp),
            Lookup::Behind | Lookup::Missing => None,
        }
    }

    #[test]
    fn a_stamp_is_found_by_its_sequence_and_its_claims_token_only() {
        let stamps = Stamps::default();
        let token = LeaseToken::new();
        let header = lease_header(token);
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        stamps.record(7, Some(header.as_str()), at);
        assert_eq!(found(&stamps, 7, token), Some(at));
        assert_eq!(found(&stamps, 8, token), None, "another sequence");
        assert_eq!(found(&stamps, 7, LeaseToken::new()), None, "another claim");
        // A later message in the same slot takes it.
        stamps.record(7 + SLOTS as u64, Some(header.as_str()), at);
        assert_eq!(found(&stamps, 7, token), None);
        // A message without the header (a completion, a marker) is not kept.
        stamps.record(SLOTS as u64 + 9, None, at);
        stamps.record(SLOTS as u64 + 10, Some("not a token"), at);
        assert_eq!(found(&stamps, SLOTS as u64 + 9, token), None);
        assert_eq!(found(&stamps, SLOTS as u64 + 10, token), None);
    }

    #[tokio::test]
    async fn a_completion_waits_for_a_watch_close_behind_and_no_other() {
        let stamps = std::sync::Arc::new(Stamps::default());
        let token = LeaseToken::new();
        let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        stamps.record(1, None, at);
        // Passed: the watch saw sequence 1 and it was not this claim's.
        assert!(matches!(stamps.lookup(1, token), Lookup::Missing));
        // Far ahead of the watch: not waited for.
        assert!(matches!(stamps.lookup(2 + MAX_GAP, token), Lookup::Missing));
        // Close behind: the wait ends when the watch records the claim.
        assert!(matches!(stamps.lookup(2, token), Lookup::Behind));
        let recorder = stamps.clone();
        let header = lease_header(token);
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            recorder.record(2, Some(header.as_str()), at);
        });
        let stamp = stamps.get(2, token, Duration::from_secs(60)).await;
        assert_eq!(stamp, Some(at));
    }
}
