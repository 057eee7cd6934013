//! The *run* step (see the engine's docs): the work runs, its lease renewed until the outcome is
//! settled, and cut off at the maximum handler time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease_end::LeaseEnd;
use super::transaction::SettleError;
use super::{Answer, Engine, Job, Refusal, Settle, Settled, timed};
use crate::record::StoredResponse;
use crate::store::{Lease, Store, StoreError};
use crate::telemetry::count_lease_lost;

/// The work panicked (its payload dropped: the engine answers
/// `handler-failed`); whether its record held recorded steps by then.
pub(super) struct Panicked {
    /// The run had recorded a step: its key is abandoned, not released.
    pub(super) keeps_steps: bool,
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

/// The renewals of one lease, started only for a run that outlives a third
/// of it (most work finishes and is stored first, and costs one timer).
struct Renewals {
    stop: CancellationToken,
    /// See [`Keeper::settling`].
    settling: Arc<AtomicBool>,
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

/// A run's hold on its lease until its outcome is settled: what is known of
/// the lease's end, and its renewals, started once the run (its work, then
/// its completion's retries) outlives a third of the lease.
pub(super) struct Keeper<'a> {
    /// Shared with the renewals' task, once they start.
    lease: &'a Arc<Lease>,
    route: &'a Arc<str>,
    /// `None` for a key held by its transaction's lock (no lease to renew).
    renew_at: Option<Instant>,
    renewals: Option<Renewals>,
    end: LeaseEnd,
    /// Set once the outcome is being written: a renewal refused from then
    /// on is the completion's doing (or the completion will say the lease
    /// was lost), not a lost lease to report.
    settling: bool,
}

impl<'a> Keeper<'a> {
    /// The lease the run holds.
    pub(super) fn lease(&self) -> &'a Lease {
        self.lease
    }

    /// What the run's lease keeps its outcome's retries to.
    pub(super) fn end(&self) -> &LeaseEnd {
        &self.end
    }

    /// Starts the renewals if the run is past a third of its lease and they
    /// have not started yet.
    pub(super) fn keep_alive<S: Store>(&mut self, engine: &Engine<S>) {
        if self.renew_at.is_some_and(|at| Instant::now() >= at) {
            self.renew(engine);
        }
    }

    /// Starts the renewals, unless they have started or the key has no
    /// lease to renew.
    fn renew<S: Store>(&mut self, engine: &Engine<S>) {
        if self.renewals.is_none() && self.renew_at.is_some() {
            self.renewals = Some(engine.renew_periodically(self));
        }
    }

    /// The outcome is being written from now on.
    fn settling(&mut self) {
        self.settling = true;
        if let Some(renewals) = &self.renewals {
            renewals.settling.store(true, Ordering::SeqCst);
        }
    }

    /// Stops the renewals (if any) and waits for one already sent.
    async fn stop(&mut self) {
        if let Some(renewals) = self.renewals.take() {
            renewals.stop().await;
        }
    }
}

/// The work, pinned in its `Option` until it is dropped.
fn running<F>(work: Pin<&mut Option<F>>) -> Pin<&mut F> {
    work.as_pin_mut()
        .expect("the work is polled only before it is dropped")
}

impl<S: Store> Engine<S> {
    /// Runs the work (already wrapped to catch panics), renewing its lease,
    /// then settles the record and answers. `claim_sent` is when the claim
    /// that took the lease was sent (its lease ends no earlier than a lease
    /// after it).
    pub(super) async fn supervise_and_settle<Fut, T>(
        &self,
        job: &Job,
        lease: Arc<Lease>,
        transaction: Transaction,
        claim_sent: Instant,
        work: Fut,
    ) -> Answer<T>
    where
        Fut: Future<Output = Result<Settle<T>, Panicked>> + Send,
    {
        let started = Instant::now();
        let max = self.inner.config.max_handler_time;
        // A key held by its transaction's lock has no lease to renew.
        let renew = !transaction.holds_lock();
        let first = if renew {
            (self.inner.config.lease / 3).min(max)
        } else {
            max
        };
        let mut keeper = Keeper {
            lease: &lease,
            route: &job.route,
            renew_at: renew.then_some(started + first),
            renewals: None,
            end: LeaseEnd::claimed(claim_sent, self.inner.config.lease),
            settling: false,
        };
        // Pinned in this future's own state (already on the heap, in the
        // hand-off's box), not boxed again: in an `Option`, so that it can
        // be dropped in place.
        let mut work = std::pin::pin!(Some(work));
        let ended = match tokio::time::timeout(first, running(work.as_mut())).await {
            Ok(ended) => Some(ended),
            Err(_) => {
                keeper.renew(self);
                let left = max.saturating_sub(started.elapsed());
                tokio::time::timeout(left, running(work.as_mut()))
                    .await
                    .ok()
            }
        };
        // Drop the work (and with it any transaction handle it held) before
        // the transaction is taken back.
        work.set(None);
        keeper.settling();
        let answer = match ended {
            Some(Ok(settle)) => {
                if matches!(settle, Settle::Abandon { .. }) {
                    // No renewal may land after the lease is ended.
                    keeper.stop().await;
                }
                self.settle_outcome(job, &transaction, settle, &mut keeper)
                    .await
            }
            Some(Err(Panicked { keeps_steps })) => {
                // Once the record holds steps, a release would delete them
                // and a retry would run them again: the lease is ended
                // instead (the key abandoned, resumable).
                let ending = if keeps_steps {
                    tracing::error!(route = %job.route, "the work panicked after a recorded step; its key is abandoned, its steps kept");
                    keeper.stop().await;
                    Settle::Abandon { reply: () }
                } else {
                    tracing::error!(route = %job.route, "the work panicked; its key is released");
                    Settle::Release {
                        reply: (),
                        keep_writes: false,
                    }
                };
                Box::pin(self.settle_logged(job, &transaction, ending, &mut keeper)).await;
                Answer::Refused(Refusal::HandlerFailed {
                    key: job.key.clone(),
                })
            }
            None => {
                tracing::warn!(route = %job.route, "the work exceeded the maximum handler time");
                // No renewal may land after the lease is ended.
                keeper.stop().await;
                let cut_off = Settle::Abandon { reply: () };
                let rolled_back =
                    Box::pin(self.settle_logged(job, &transaction, cut_off, &mut keeper)).await;
                Answer::Refused(Refusal::HandlerTimeout {
                    key: job.key.clone(),
                    rolled_back,
                })
            }
        };
        keeper.stop().await;
        // Wakes waiters, and drops any copy of an older record of the key
        // from the replay cache (which this run does not fill: the first
        // replay does, so a key never replayed costs the cache nothing).
        self.inner
            .store
            .events()
            .publish(job.scope.as_str(), job.key.as_str());
        answer
    }

    /// Stores or releases what the work settled on.
    async fn settle_outcome<T>(
        &self,
        job: &Job,
        transaction: &Transaction,
        settle: Settle<T>,
        keeper: &mut Keeper<'_>,
    ) -> Answer<T> {
        let lease = keeper.lease;
        let (response, reply) = match settle {
            Settle::Complete { response, reply } => (response, reply),
            Settle::Release { reply, keep_writes } => {
                let ending = Settle::Release {
                    reply: (),
                    keep_writes,
                };
                Box::pin(self.settle_logged(job, transaction, ending, keeper)).await;
                return Answer::Ran {
                    reply,
                    settled: Settled::Released,
                };
            }
            Settle::Abandon { reply } => {
                let ending = Settle::Abandon { reply: () };
                let rolled_back =
                    Box::pin(self.settle_logged(job, transaction, ending, keeper)).await;
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
                transaction,
                Settle::Complete {
                    response: &response,
                    reply: (),
                },
                keeper,
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
                let retry_after = self.inner.config.policy.retry_after;
                if matches!(error, StoreError::LeaseLost) {
                    count_lease_lost(&job.route, "complete");
                    Answer::Refused(Refusal::RequestInFlight {
                        key: job.key.clone(),
                        retry_after,
                    })
                } else {
                    self.release_in_background(Arc::clone(lease));
                    Answer::Refused(Refusal::StoreUnavailable {
                        key: Some(job.key.clone()),
                        retry_after,
                    })
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
                if matches!(error, StoreError::NotReplicated { .. }) {
                    tracing::error!(error = %error, route = %job.route, "the outcome is stored on the primary but not acknowledged by enough replicas: a failover may lose it");
                } else {
                    tracing::error!(error = %error, route = %job.route, "the outcome could not be stored");
                }
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
        transaction: &Transaction,
        ending: Settle<(), &StoredResponse>,
        keeper: &mut Keeper<'_>,
    ) -> bool {
        let operation = ending.operation();
        match self.settle(transaction, ending, keeper).await {
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
    /// stopped or lost; each renewal answered in time moves the lease's
    /// known end on.
    fn renew_periodically(&self, keeper: &mut Keeper<'_>) -> Renewals {
        let stop = CancellationToken::new();
        let store = self.inner.store.clone();
        let lease = Arc::clone(keeper.lease);
        let end = keeper.end.share();
        let settling = Arc::new(AtomicBool::new(keeper.settling));
        let flag = Arc::clone(&settling);
        let length = self.inner.config.lease;
        let timeout = self.inner.config.store_timeout;
        let route = Arc::clone(keeper.route);
        let stopped = stop.clone();
        let metrics = Arc::clone(&self.inner.metrics);
        let task = self.inner.tracker.spawn(async move {
            let period = length / 3;
            loop {
                let sent = Instant::now();
                match timed(&metrics, "renew", timeout, store.renew(&lease, length)).await {
                    Ok(()) => end.renewed(sent, Instant::now(), length),
                    // Refused once the outcome is being written: the
                    // completion (or release) got there first, or its own
                    // answer reports the lost lease.
                    Err(StoreError::LeaseLost) if flag.load(Ordering::SeqCst) => return,
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
        Renewals {
            stop,
            settling,
            task,
        }
    }
}
