//! The in-flight values this process's claims wrote, kept until their
//! lease ends here, so that a completion can go as one native `SET key
//! <completed> IFEQ <in flight> KEEPTTL`: the server compares the whole
//! value, so the completer must know it byte for byte.
//!
//! A value is forgotten when its lease is completed, renewed (the value
//! then holds another lease end) or released. A completion that finds no
//! value here, or whose `IFEQ` finds another value (a reader marked the
//! record watched, or the lease was lost), goes as the fenced script,
//! which decides. The table is bounded: past [`MAX_VALUES`] leases, new
//! claims are not remembered and complete by script.

use std::sync::Mutex;
use std::time::Instant;

use crate::record::{LeaseToken, TokenMap};

/// How many in-flight values the table holds at most.
pub(super) const MAX_VALUES: usize = 65_536;

/// A remembered claim: the value it wrote and when (the holder's own
/// monotonic clock, for the completion time it writes).
pub(super) struct ClaimedValue {
    /// The in-flight value, as written.
    pub(super) value: Vec<u8>,
    /// When the claim was sent.
    pub(super) at: Instant,
}

/// In-flight values by lease token.
#[derive(Default)]
pub(super) struct ClaimedValues(Mutex<TokenMap<ClaimedValue>>);

impl ClaimedValues {
    /// Remembers the value a claim of `token` wrote, unless the table is full.
    pub(super) fn remember(&self, token: LeaseToken, value: Vec<u8>, at: Instant) {
        let mut values = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if values.len() < MAX_VALUES {
            values.insert(token, ClaimedValue { value, at });
        }
    }

    /// Takes the value of `token`'s claim out of the table, if it is there.
    pub(super) fn take(&self, token: LeaseToken) -> Option<ClaimedValue> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&token)
    }

    /// How many values the table holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_taken_once_and_the_table_is_bounded() {
        let table = ClaimedValues::default();
        let token = LeaseToken::new();
        table.remember(token, b"v".to_vec(), Instant::now());
        assert_eq!(
            table.take(token).map(|claimed| claimed.value),
            Some(b"v".to_vec())
        );
        assert!(table.take(token).is_none());
        for _ in 0..MAX_VALUES + 10 {
            table.remember(LeaseToken::new(), Vec::new(), Instant::now());
        }
        assert_eq!(table.len(), MAX_VALUES);
    }
}
