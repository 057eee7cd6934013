//! The *settle* step (see the engine's docs): write its end to the store, fenced by its lease, or in
//! its transaction when the work began one.

use std::time::Duration;

use super::Engine;
use super::answer::Settle;
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

/// A failed settlement, and whether the work's writes were rolled back (or
/// may have been: a commit that did not confirm).
pub(super) struct SettleError {
    pub(super) error: StoreError,
    pub(super) rolled_back: bool,
}

/// The run's transaction in transactional mode (`None` otherwise).
pub(super) struct Transaction(pub(super) Option<super::transaction::TransactionSlot>);

impl Transaction {
    /// Whether the run holds its key by its transaction's lock
    /// (single-commit mode): no lease to renew, nothing committed to
    /// release.
    pub(super) fn holds_lock(&self) -> bool {
        self.0.as_ref().is_some_and(|slot| slot.holds_lock())
    }
}

impl<S: Store> Engine<S> {
    /// Writes the end of a run (what to keep, borrowed; a run cut off at the
    /// maximum handler time is abandoned): in the work's transaction when it
    /// began one, else with the fenced store operations. `Ok(true)` when it
    /// went through the transaction (for an abandoned run: the writes were
    /// rolled back and the key released).
    #[cfg_attr(feature = "otel", tracing::instrument(
        name = "idempotency.settle",
        skip_all,
        fields(idempotency.settle.ending = ending.operation()),
    ))]
    pub(super) async fn settle(
        &self,
        lease: &Lease,
        transaction: &Transaction,
        ending: Settle<(), &StoredResponse>,
    ) -> Result<bool, SettleError> {
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
            } => self.complete_with_retries(lease, stored).await,
            Settle::Release { .. } => self.timed("release", self.store.release(lease)).await,
            Settle::Abandon { .. } => {
                self.timed("renew", self.store.renew(lease, Duration::ZERO))
                    .await
            }
        };
        result.map(|()| false).map_err(|error| SettleError {
            error,
            rolled_back: false,
        })
    }

    /// Completes the record, trying again on transient failures: an outcome
    /// that is not stored turns into an unknown outcome for every retry.
    async fn complete_with_retries(
        &self,
        lease: &Lease,
        stored: &StoredResponse,
    ) -> Result<(), StoreError> {
        let mut pause = Duration::from_millis(50);
        for attempt in 0..3 {
            match self
                .timed("complete", self.store.complete(lease, stored))
                .await
            {
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) if attempt < 2 => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                // A resend refused: the attempt that failed may have landed
                // (its answer lost, or it ran after the timeout), which
                // completed the record with this lease. Only this lease can
                // complete a record with its token, so that is success.
                Err(StoreError::LeaseLost) if attempt > 0 => {
                    return match self
                        .timed("get", self.store.get(&lease.scope, &lease.key))
                        .await
                    {
                        Ok(Some(record))
                            if record.lease_token == lease.token
                                && record.state() == crate::record::RecordState::Completed =>
                        {
                            Ok(())
                        }
                        _ => Err(StoreError::LeaseLost),
                    };
                }
                other => return other,
            }
        }
        unreachable!("the last attempt returns")
    }
}
