//! The claims this process made and has not finished yet: for each lease
//! token, the stream sequence its claim was stored at (the revision every
//! later write names) and the value it wrote. With the claim's stamp
//! (`stamps.rs`), they are the record as the leader would read it back, so
//! a completion writes at once, fenced by that revision, without reading
//! first. Any other write of the record in between (a renewal, steps, a
//! take-over by another process) moved its revision: the leader refuses the
//! completion and it reads the record, as it did before.
//!
//! A claim is forgotten when its lease is completed, renewed, given steps
//! or a request, or released. The table is bounded: past [`MAX_CLAIMS`]
//! leases, new claims are not remembered and complete by reading first.

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

use crate::record::{LeaseToken, TokenMap};

/// How many claims the table holds at most.
const MAX_CLAIMS: usize = 65_536;

/// A claim this process's lease holds.
pub(super) struct Claimed {
    /// The stream sequence the claim was stored at.
    pub(super) revision: u64,
    /// The value it wrote.
    pub(super) value: Bytes,
}

/// Claims by lease token.
#[derive(Default)]
pub(super) struct ClaimedRecords(Mutex<TokenMap<Claimed>>);

impl ClaimedRecords {
    /// Remembers the claim of `token`, unless the table is full.
    pub(super) fn remember(&self, token: LeaseToken, revision: u64, value: Bytes) {
        let mut claims = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.len() < MAX_CLAIMS {
            claims.insert(token, Claimed { revision, value });
        }
    }

    /// Takes the claim of `token` out of the table, if it is there.
    pub(super) fn take(&self, token: LeaseToken) -> Option<Claimed> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_taken_once_and_the_table_is_bounded() {
        let table = ClaimedRecords::default();
        let token = LeaseToken::new();
        table.remember(token, 3, Bytes::from_static(b"v"));
        let claimed = table.take(token).unwrap();
        assert_eq!((claimed.revision, &claimed.value[..]), (3, &b"v"[..]));
        assert!(table.take(token).is_none());
        for n in 0..MAX_CLAIMS + 10 {
            table.remember(LeaseToken::new(), n as u64, Bytes::new());
        }
        let held = table.0.lock().unwrap().len();
        assert_eq!(held, MAX_CLAIMS);
    }
}
