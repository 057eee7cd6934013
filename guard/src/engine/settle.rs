//! The *settle* step (see the engine's docs): write its end to the store, fenced by its lease, or in
//! its transaction when the work began one.

use std::time::Duration;

use tokio::time::Instant;

use super::answer::Settle;
use super::retry::RetrySchedule;
use super::supervise::{Keeper, Transaction};
use super::transaction::SettleError;
use super::{Engine, timed};
use crate::record::StoredResponse;
use crate::store::{Lease, Store, StoreError};

impl<T> Settle<T, &StoredResponse> {
    /// The store operation that writes this ending, for the lease-lost
    /// metric (an abandoned run's lease is ended by a renewal to zero).
    pub(super) fn operation(&self) -> &'static str {
        match self {
            Self::Complete { .. } => "complete",
            Self::Release { .. } => "release",
            Self::Abandon { .. } => "renew",
        }
    }
}

impl<S: Store> Engine<S> {
    /// Writes the end of a run (what to keep, borrowed; a run cut off at the
    /// maximum handler time is abandoned): in the work's transaction when it
    /// began one, else with the fenced store operations. `Ok(true)` when it
    /// went through the transaction (for an abandoned run: the writes were
    /// rolled back and the key released). `keeper` holds the lease meanwhile
    /// and bounds a completion's retries.
    #[cfg_attr(feature = "otel", tracing::instrument(
        name = "idempotency.settle",
        skip_all,
        fields(idempotency.settle.ending = ending.operation()),
    ))]
    pub(super) async fn settle(
        &self,
        transaction: &Transaction,
        ending: Settle<(), &StoredResponse>,
        keeper: &mut Keeper<'_>,
    ) -> Result<bool, SettleError> {
        let lease = keeper.lease();
        let ending = match &transaction.0 {
            Some(slot) => match self.settle_in_slot(lease, slot, ending).await {
                Ok(settled) => return settled,
                Err(ending) => ending,
            },
            None => ending,
        };
        // Without a transaction, what the work wrote stands either way.
        let result = match ending {
            Settle::Complete {
                response: stored, ..
            } => self.complete_with_retries(lease, stored, keeper).await,
            Settle::Release { .. } => self.timed("release", self.inner.store.release(lease)).await,
            Settle::Abandon { .. } => {
                self.timed("renew", self.inner.store.renew(lease, Duration::ZERO))
                    .await
            }
        };
        result.map(|()| false).map_err(|error| SettleError {
            error,
            rolled_back: false,
        })
    }

    /// Completes the record, trying again on transient failures for as
    /// long as the retry schedule (`retry.rs`) allows: an outcome that is
    /// not stored turns into an unknown outcome for every retry.
    async fn complete_with_retries(
        &self,
        lease: &Lease,
        stored: &StoredResponse,
        keeper: &mut Keeper<'_>,
    ) -> Result<(), StoreError> {
        let schedule = RetrySchedule {
            window: self.inner.config.completion_retry_window,
            attempt_timeout: self.inner.config.store_timeout,
            lease: self.inner.config.lease,
        };
        let first = Instant::now();
        let mut failed = 0u32;
        // The first attempt has the whole store timeout; a resend, what the
        // schedule gives it.
        let mut timeout = self.inner.config.store_timeout;
        // Once a resend is refused, only a read can tell whether an earlier
        // attempt landed.
        let mut verifying = false;
        loop {
            let result = if verifying {
                self.landed(lease, timeout).await
            } else {
                let sent = timed(
                    &self.inner.metrics,
                    "complete",
                    timeout,
                    self.inner.store.complete(lease, stored),
                );
                match sent.await {
                    // A resend refused: the attempt that failed may have
                    // landed (its answer lost, or it ran after the timeout),
                    // which completed the record with this lease. Only this
                    // lease can complete a record with its token, so that is
                    // success.
                    Err(StoreError::LeaseLost) if failed > 0 => {
                        verifying = true;
                        self.landed(lease, timeout).await
                    }
                    other => other,
                }
            };
            match result {
                Err(error @ (StoreError::Unavailable(_) | StoreError::Timeout(_))) => {
                    failed += 1;
                    // Renewals go on while the completion is retried.
                    keeper.keep_alive(self);
                    let now = Instant::now();
                    let elapsed = now.saturating_duration_since(first);
                    let Some(next) = schedule.next(failed, elapsed, keeper.end().left(now)) else {
                        return Err(error);
                    };
                    tracing::debug!(error = %error, attempts = failed, "completion failed; sending it again");
                    tokio::time::sleep(next.pause).await;
                    timeout = next.timeout;
                }
                other => return other,
            }
        }
    }

    /// Whether this lease's completion landed, read back: `LeaseLost` when
    /// the record is not completed with its token.
    async fn landed(&self, lease: &Lease, timeout: Duration) -> Result<(), StoreError> {
        match timed(
            &self.inner.metrics,
            "get",
            timeout,
            self.inner.store.get(&lease.scope, &lease.key),
        )
        .await?
        {
            Some(record)
                if record.lease_token == lease.token
                    && record.state() == crate::record::RecordState::Completed =>
            {
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }
}
