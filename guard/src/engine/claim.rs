//! The *claim* and *decide* steps of a run (see the engine's docs): claim
//! the key, or decide about its existing record.
//!
//! Every claim and takeover of one run uses the same lease token, so a
//! record that carries it is this run's own, whatever the reply that was
//! lost on the way (a client library that retried a timed-out script gets
//! `Existing` back for its own first attempt).

use std::time::Duration;

use tokio::time::Instant;

use super::cache::{Hit, lives};
use super::release::PendingClaim;
// `claim::Acquired` is where the engine (and its docs) name it.
pub(super) use super::transaction::Acquired;
use super::transaction::Resume;
use super::{Answer, Engine, Job, Refusal};
use crate::decision::{AbandonedPolicy, Decision, InFlightPolicy, decide};
use crate::record::{LeaseToken, Record, RecordState};
use crate::store::{Claim, NewRecord, Store, StoreError};

/// How many times one run claims again after losing a race (the record
/// changed between two reads) before it answers in-flight.
const MAX_CLAIM_ROUNDS: usize = 8;

impl<S: Store> Engine<S> {
    fn new_record<'a>(&self, job: &'a Job, token: LeaseToken) -> NewRecord<'a> {
        NewRecord {
            scope: &job.scope,
            key: &job.key,
            fingerprint: &job.fingerprint,
            method: &job.method,
            path: &job.path,
            token,
            lease: self.inner.config.lease,
            retention: self.inner.config.retention,
            // Marked when the work begins its transaction, not before: a
            // run that never does is an ordinary one (see `Tx`); unless the
            // engine was told every write goes through it.
            transactional: self.claims_transactional(),
        }
    }

    /// Claims `job`'s key, taking over or waiting as the policy says.
    #[cfg_attr(
        feature = "otel",
        tracing::instrument(name = "idempotency.claim", skip_all)
    )]
    pub(super) async fn acquire<T>(&self, job: &Job) -> Acquired<T> {
        if let Some(answer) = self.cached(job) {
            return Acquired::Answer(answer);
        }
        let token = LeaseToken::new();
        let new = self.new_record(job, token);
        let wait_until = match self.inner.config.policy.in_flight {
            InFlightPolicy::Wait(bound) => Instant::now() + bound,
            InFlightPolicy::Reject => Instant::now(),
        };
        for _ in 0..MAX_CLAIM_ROUNDS {
            let claimed = match self.claim_once(&new, wait_until).await {
                Ok(claimed) => claimed,
                Err(acquired) => return acquired,
            };
            let mut record = match claimed {
                Ok(Claim::Acquired(lease)) => return Acquired::Lease(lease),
                Ok(Claim::Existing(record)) if record.lease_token == token => {
                    // Our own claim, landed by an earlier attempt whose reply
                    // was lost (or our own take-over: its steps are the ones
                    // it kept to resume, and none unless the policy resumes).
                    if self.resumes_steps(&record) && !record.steps.is_empty() {
                        return Acquired::Resumed(new.lease(), Resume::of(*record));
                    }
                    return Acquired::Lease(new.lease());
                }
                Ok(Claim::Existing(record)) => *record,
                Err(error) => return self.sent_and_failed(&new, "claim", error),
            };
            // Decide about the record, waiting for it where the policy waits.
            loop {
                let wait_left = wait_until.saturating_duration_since(Instant::now());
                let refuse = |refusal| Acquired::Answer(Answer::Refused(refusal));
                match decide(
                    &record,
                    &job.fingerprint,
                    &self.inner.config.policy,
                    wait_left,
                ) {
                    Decision::Replay => return Acquired::Answer(self.replay(job, record)),
                    Decision::ResponseNotStored => {
                        return refuse(Refusal::ResponseNotStored {
                            key: job.key.clone(),
                        });
                    }
                    Decision::KeyReused => {
                        return refuse(Refusal::KeyReused {
                            key: job.key.clone(),
                        });
                    }
                    Decision::InFlight { retry_after } => {
                        return refuse(Refusal::RequestInFlight {
                            key: job.key.clone(),
                            retry_after,
                        });
                    }
                    Decision::OutcomeUnknown => {
                        return refuse(Refusal::OutcomeUnknown {
                            key: job.key.clone(),
                        });
                    }
                    // The rare paths (waiting, taking over) are boxed, so
                    // that their futures do not enlarge every request's.
                    Decision::Wait => {
                        match Box::pin(self.wait_for_change(job, &record, wait_left)).await {
                            Ok(Some(changed)) => record = changed,
                            Ok(None) => break, // released meanwhile: claim again
                            Err(error) => {
                                tracing::warn!(error = %error, "idempotency store failed while waiting");
                                return Acquired::StoreFailed;
                            }
                        }
                    }
                    Decision::TakeOver => {
                        let pending = PendingClaim::arm(self, &new);
                        let taken = Box::pin(self.timed(
                            "take_over",
                            self.inner.store.take_over(record.lease_token, &new),
                        ))
                        .await;
                        pending.disarm();
                        match taken {
                            Ok(Some(lease)) => {
                                return Box::pin(self.taken_over(lease, record)).await;
                            }
                            // Changed meanwhile (perhaps by this very takeover,
                            // retried): claim again, which recognizes our token.
                            Ok(None) => break,
                            Err(error) => return self.sent_and_failed(&new, "take_over", error),
                        }
                    }
                }
            }
        }
        Acquired::InFlight
    }

    /// Whether a run that takes `record` over resumes its steps: when the
    /// policy resumes abandoned runs, and always for a transactional record
    /// (its steps committed with their writes, everything else was rolled
    /// back: the run goes on from its last step, which is what the default
    /// policy's take-over of it means).
    fn resumes_steps(&self, record: &Record) -> bool {
        self.inner.config.policy.abandoned == AbandonedPolicy::Resume || record.transactional
    }

    /// The run that took `record` over: a resumed one when it resumes steps
    /// ([`Engine::resumes_steps`]) and `record` was abandoned within its
    /// retention, with the steps the take-over kept, read back under the
    /// new lease (a stale runner's step that committed between the read
    /// that decided and the take-over is among them; `model/resume.pml`'s
    /// control `steps-from-claim`). A run that does not resume clears steps
    /// the store kept (a take-over within retention keeps them), so that no
    /// later resume mixes them with its own.
    async fn taken_over<T>(&self, lease: crate::store::Lease, record: Record) -> Acquired<T> {
        let resumes = self.resumes_steps(&record)
            && !record.is_expired()
            && record.state() == RecordState::Abandoned;
        if resumes {
            let kept = self
                .timed("get", self.inner.store.get(&lease.scope, &lease.key))
                .await;
            return match kept {
                Ok(Some(kept)) if kept.lease_token == lease.token => {
                    Acquired::Resumed(lease, Resume::of(kept))
                }
                other => {
                    // Which steps it holds is unknown: run none of them.
                    if let Err(error) = other {
                        tracing::warn!(error = %error, "the steps of the run taken over could not be read");
                    }
                    let ended = self
                        .timed("renew", self.inner.store.renew(&lease, Duration::ZERO))
                        .await;
                    if let Err(error) = ended {
                        tracing::warn!(error = %error, "the lease of an unread take-over was not ended");
                    }
                    Acquired::StoreFailed
                }
            };
        }
        if !record.steps.is_empty() && !record.is_expired() {
            let cleared = self
                .timed("record_steps", self.inner.store.record_steps(&lease, &[]))
                .await;
            if let Err(error) = cleared {
                // The run's first step replaces them anyway.
                tracing::warn!(error = %error, "the steps of the run taken over were not cleared");
            }
        }
        Acquired::Lease(lease)
    }

    /// The replay cache's answer for `job`, if it holds its key.
    fn cached<T>(&self, job: &Job) -> Option<Answer<T>> {
        let cache = self.replay_cache()?;
        match cache.get(job.scope.as_str(), job.key.as_str(), &job.fingerprint)? {
            Hit::Replay(stored) => Some(Answer::Replay(stored)),
            Hit::Reused => Some(Answer::Refused(Refusal::KeyReused {
                key: job.key.clone(),
            })),
        }
    }

    /// The replay of a completed `record` (kept in the replay cache too),
    /// or `response-not-stored` when it kept no body.
    fn replay<T>(&self, job: &Job, record: Record) -> Answer<T> {
        let Some(stored) = record.response.filter(|stored| stored.body.is_some()) else {
            return Answer::Refused(Refusal::ResponseNotStored {
                key: job.key.clone(),
            });
        };
        if let Some(cache) = self.replay_cache() {
            cache.put(
                job.scope.as_str(),
                job.key.as_str(),
                record.fingerprint,
                stored.clone(),
                lives(record.expires_at, record.observed_at),
            );
        }
        Answer::Replay(stored)
    }

    /// The claim as a committed record (every mode but single-commit),
    /// released in the background if the caller goes away meanwhile.
    pub(super) async fn claim_committed(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        let pending = PendingClaim::arm(self, new);
        let claimed = self.timed("claim", self.inner.store.claim(new)).await;
        pending.disarm();
        claimed
    }

    /// A claim or takeover failed after it may have been sent: it may have
    /// landed (a reply lost, a commit whose answer never came) or may still
    /// land (queued behind a lock, a commit waiting for a synchronous
    /// standby). Follow it to its end and free the key if it landed.
    fn sent_and_failed<T>(
        &self,
        new: &NewRecord<'_>,
        operation: &str,
        error: StoreError,
    ) -> Acquired<T> {
        tracing::warn!(error = %error, operation, "idempotency store failed; releasing the claim in case it landed");
        self.follow_in_background(new);
        Acquired::StoreFailed
    }

    /// Waits (up to `wait_left`) until the in-flight `record` changes, and
    /// reads it again. `None` when the record is gone.
    async fn wait_for_change(
        &self,
        job: &Job,
        record: &Record,
        wait_left: Duration,
    ) -> Result<Option<Record>, StoreError> {
        // Subscribe before reading again, so a completion in between is seen.
        let subscription = self
            .inner
            .store
            .events()
            .subscribe(job.scope.as_str(), job.key.as_str());
        let current = self
            .timed("get", self.inner.store.get(&job.scope, &job.key))
            .await?;
        match current {
            Some(current)
                if current.lease_token == record.lease_token
                    && current.state() == RecordState::InFlight =>
            {
                // Still the same run: wait for its end, bounded by the wait
                // and by its lease (a crashed holder publishes nothing).
                let bound = wait_left.min(current.lease_remaining());
                let _ = tokio::time::timeout(bound, subscription.changed()).await;
                self.timed("get", self.inner.store.get(&job.scope, &job.key))
                    .await
            }
            other => Ok(other),
        }
    }
}
