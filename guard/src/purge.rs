//! Deleting records past their retention, in batches.

use std::time::Duration;

use crate::store::{Purge, StoreError};

/// Deletes every expired record, `batch` at a time (so no statement holds
/// locks for long); returns how many were deleted.
///
/// # Errors
///
/// The first store error; records deleted before it stay deleted.
pub async fn purge_expired<S: Purge>(store: &S, batch: u32) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = store.purge(batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Purges expired records every `interval`, forever; spawn it as a task.
/// Failures are logged and tried again at the next interval.
pub async fn purge_periodically<S: Purge>(store: S, interval: Duration, batch: u32) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match purge_expired(&store, batch).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "purged expired idempotency records"),
            Err(error) => {
                tracing::warn!(error = %error, "purging expired idempotency records failed")
            }
        }
    }
}
