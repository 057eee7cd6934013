//! What the PostgreSQL and SQLite stores share: the fence check of a
//! conditional write, durations as the milliseconds their columns hold, and
//! the bound of a claim's retries after a race.

use std::time::Duration;

use crate::store::StoreError;

/// How often one claim is tried again after a race it cannot see through:
/// on PostgreSQL, a conflicting row committed after the statement's
/// snapshot (it then sees neither its own insert nor the other row); on
/// SQLite, a conflicting record that vanished (released) before it could
/// be read.
pub(crate) const CLAIM_ATTEMPTS: usize = 16;

/// A duration in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A fenced write changed one row, or its lease was lost.
pub(crate) fn fenced(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_is_the_fence_held_and_any_other_count_a_lost_lease() {
        assert!(fenced(1).is_ok());
        assert!(matches!(fenced(0), Err(StoreError::LeaseLost)));
        assert!(matches!(fenced(2), Err(StoreError::LeaseLost)));
        assert_eq!(millis(Duration::from_micros(1_999)), 1);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }
}
