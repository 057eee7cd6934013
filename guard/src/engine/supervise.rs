//! The *run* step (see the engine's docs): the work runs, its lease renewed until the outcome is
//! settled, and cut off at the maximum handler time.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::settle::{SettleError, Transaction};
use super::{Answer, Engine, Job, Refusal, Settle, Settled, timed};
use crate::record::StoredResponse;
use crate::store::{Lease, Store, StoreError};
use crate::telemetry::count_lease_lost;

/// The renewals of one lease, started only for work that outlives a third
/// of it (most work finishes first and costs one timer).
struct Renewals {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Renewals {
    /// Stops renewing and waits for a renewal already sent to come back, so
    /// none lands after what the caller writes next.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

impl<S: Store> Engine<S> {
    /// Runs the work (already wrapped to catch panics), renewing its lease,
    /// then settles the record and answers.
    pub(super) async fn supervise_and_settle<Fut, T>(
        &self,
        job: &Job,
        lease: Lease,
        transaction: Transaction,
        mut work: Pin<Box<Fut>>,
    ) -> Answer<T>
    where
        Fut: Future<Output = Result<Settle<T>, Box<dyn Any + Send>>> + Send,
    {
        let started = Instant::now();
        let max = self.config.max_handler_time;
        // A key held by its transaction's lock has no lease to renew.
        let renew = !transaction.holds_lock();
        let first = if renew {
            (self.config.lease / 3).min(max)
        } else {
            max
        };
        let mut renewals = None;
        let ended = match tokio::time::timeout(first, &mut work).await {
            Ok(ended) => Some(ended),
            Err(_) => {
                if renew {
                    renewals = Some(self.renew_periodically(&lease, &job.route));
                }
                let left = max.saturating_sub(started.elapsed());
                tokio::time::timeout(left, &mut work).await.ok()
            }
        };
        // Drop the work (and with it any transaction handle it held) before
        // the transaction is taken back.
        drop(work);
        let answer = match ended {
            Some(Ok(settle)) => {
                if matches!(settle, Settle::Abandon { .. })
                    && let Some(renewals) = renewals.take()
                {
                    // No renewal may land after the lease is ended.
                    renewals.stop().await;
                }
                self.settle_outcome(job, &lease, &transaction, settle).await
            }
            Some(Err(_panic)) => {
                tracing::error!(route = %job.route, "the work panicked; its key is released");
                let ending = Settle::Release {
                    reply: (),
                    keep_writes: false,
                };
                Box::pin(self.settle_logged(job, &lease, &transaction, ending)).await;
                Answer::Refused(Refusal::Failed)
            }
            None => {
                tracing::warn!(route = %job.route, "the work exceeded the maximum handler time");
                // No renewal may land after the lease is ended.
                if let Some(renewals) = renewals.take() {
                    renewals.stop().await;
                }
                let cut_off = Settle::Abandon { reply: () };
                let rolled_back =
                    Box::pin(self.settle_logged(job, &lease, &transaction, cut_off)).await;
                Answer::Refused(Refusal::TimedOut { rolled_back })
            }
        };
        if let Some(renewals) = renewals {
            renewals.stop().await;
        }
        // Wakes waiters, and drops any copy of an older record of the key
        // from the replay cache (which this run does not fill: the first
        // replay does, so a key never replayed costs the cache nothing).
        self.store
            .events()
            .publish(job.scope.as_str(), job.key.as_str());
        answer
    }

    /// Stores or releases what the work settled on.
    async fn settle_outcome<T>(
        &self,
        job: &Job,
        lease: &Lease,
        transaction: &Transaction,
        settle: Settle<T>,
    ) -> Answer<T> {
        let (response, reply) = match settle {
            Settle::Complete { response, reply } => (response, reply),
            Settle::Release { reply, keep_writes } => {
                let ending = Settle::Release {
                    reply: (),
                    keep_writes,
                };
                Box::pin(self.settle_logged(job, lease, transaction, ending)).await;
                return Answer::Ran {
                    reply,
                    settled: Settled::Released,
                };
            }
            Settle::Abandon { reply } => {
                let ending = Settle::Abandon { reply: () };
                let rolled_back =
                    Box::pin(self.settle_logged(job, lease, transaction, ending)).await;
                let settled = if rolled_back {
                    Settled::Released
                } else {
                    Settled::Abandoned
                };
                return Answer::Ran { reply, settled };
            }
        };
        match self
            .settle(
                lease,
                transaction,
                Settle::Complete {
                    response: &response,
                    reply: (),
                },
            )
            .await
        {
            Ok(_) => Answer::Ran {
                reply,
                settled: Settled::Stored,
            },
            Err(SettleError {
                error,
                rolled_back: true,
            }) => {
                // The work's writes did not commit: this answer must not say
                // they did. A retry is safe either way.
                tracing::error!(error = %error, route = %job.route, "transactional completion failed; writes rolled back");
                let retry_after = self.config.policy.retry_after;
                if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&job.route, "complete");
                    Answer::Refused(Refusal::InFlight { retry_after })
                } else {
                    self.release_in_background(lease.clone());
                    Answer::Refused(Refusal::StoreUnavailable { retry_after })
                }
            }
            Err(SettleError {
                error,
                rolled_back: false,
            }) => {
                // The work ran and its effects stand: this caller gets its
                // reply, though retries will not find it.
                if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&job.route, "complete");
                }
                tracing::error!(error = %error, route = %job.route, "the outcome could not be stored");
                Answer::Ran {
                    reply,
                    settled: Settled::NotStored,
                }
            }
        }
    }

    /// Settles a run that has nothing to store, logging what fails (the
    /// record then lapses into abandoned, which is safe). Returns whether
    /// the work's writes were rolled back with the record.
    async fn settle_logged(
        &self,
        job: &Job,
        lease: &Lease,
        transaction: &Transaction,
        ending: Settle<(), &StoredResponse>,
    ) -> bool {
        let operation = ending.operation();
        match self.settle(lease, transaction, ending).await {
            Ok(via_transaction) => via_transaction,
            Err(SettleError { error, rolled_back }) => {
                if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&job.route, operation);
                }
                tracing::warn!(error = %error, route = %job.route, "could not settle the record after the work");
                rolled_back
            }
        }
    }

    /// Renews the lease at once, then every third of its length, until
    /// stopped or lost.
    fn renew_periodically(&self, lease: &Lease, route: &str) -> Renewals {
        let stop = CancellationToken::new();
        let store = self.store.clone();
        let lease = lease.clone();
        let length = self.config.lease;
        let timeout = self.config.store_timeout;
        let route = route.to_owned();
        let stopped = stop.clone();
        let metrics = Arc::clone(&self.metrics);
        let task = self.tracker.spawn(async move {
            let period = length / 3;
            loop {
                match timed(&metrics, "renew", timeout, store.renew(&lease, length)).await {
                    Ok(()) => {}
                    Err(StoreError::LeaseLost) => {
                        count_lease_lost(&route, "renew");
                        tracing::error!(
                            "lease lost while the work runs; its completion will be refused"
                        );
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(error = %error, "lease renewal failed; will try again");
                    }
                }
                tokio::select! {
                    () = stopped.cancelled() => return,
                    () = tokio::time::sleep(period) => {}
                }
            }
        });
        Renewals { stop, task }
    }
}
