//! The claim path: claim (a create, or the replacement of a delete marker
//! or of a record past its retention) and take-over.

use std::time::Duration;

use super::codec::{self, Packed, Time};
use super::requests::Mark;
use super::{NatsStore, RACE_ATTEMPTS, Slot, Written, ttl};
use crate::fingerprint::Fingerprint;
use crate::record::RecordState;
use crate::store::{Claim, Lease, LeaseToken, NewRecord, StoreError};

/// A duration in whole milliseconds, saturating.
pub(super) fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The value a claim (or a take-over) writes: times from its own stamp.
fn claimed<'a>(new: &'a NewRecord<'_>) -> Packed<'a> {
    Packed {
        fingerprint: Fingerprint::from_bytes(*new.fingerprint.as_bytes()),
        token: new.token,
        transactional: new.transactional,
        created: Time::AfterStamp(0),
        lease_end: Time::AfterStamp(ms(new.lease)),
        lease_cap: Time::Unset,
        retention_ms: ms(new.retention),
        method: new.method,
        path: new.path,
        response: None,
        steps: &[],
        steps_cap: Time::Unset,
        steps_before: 0,
        request: None,
        request_cap: Time::Unset,
        request_before: None,
    }
}

impl NatsStore {
    /// See [`Store::claim`](crate::Store::claim).
    pub(super) async fn claim_record(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        let deadline = self.deadline();
        let subject = self.subject(new.scope.as_str(), new.key.as_str());
        let value = codec::encode(&claimed(new));
        let ttl = ttl(ms(new.retention));
        let mut expected = 0;
        let mut unknown = None;
        for _ in 0..RACE_ATTEMPTS {
            match self
                .write(
                    &subject,
                    expected,
                    &ttl,
                    value.clone(),
                    Mark::Claim(new.token),
                    deadline,
                )
                .await?
            {
                Written::Stored(revision) => {
                    // For the completion: it writes without reading.
                    self.inner.claimed.remember(new.token, revision, value);
                    return Ok(Claim::Acquired(new.lease()));
                }
                Written::Conflict => {}
                // It may have landed: the read below tells (the value
                // carries this claim's token).
                Written::Unknown(error) => unknown = Some(error),
            }
            match self.read(new.scope, new.key, deadline).await? {
                Slot::Empty => expected = 0,
                Slot::Marker(revision) => expected = revision,
                Slot::Record(stored) if stored.record.lease_token == new.token => {
                    return Ok(Claim::Acquired(new.lease()));
                }
                // Past its retention: as good as gone (the server deletes
                // it within seconds); replaced in one fenced write.
                Slot::Record(stored) if stored.record.is_expired() => expected = stored.revision,
                Slot::Record(stored) => return Ok(Claim::Existing(Box::new(stored.record))),
            }
        }
        Err(unknown.unwrap_or_else(|| {
            StoreError::Unavailable("the claim kept racing other writes of its record".into())
        }))
    }

    /// See [`Store::take_over`](crate::Store::take_over). The record's
    /// steps and stored request stay for the run that resumes it, unless it
    /// is past its retention (as on every store).
    pub(super) async fn take_over_record(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        let deadline = self.deadline();
        let Slot::Record(stored) = self.read(new.scope, new.key, deadline).await? else {
            return Ok(None);
        };
        let record = &stored.record;
        let lapsed = record.is_expired() || record.state() == RecordState::Abandoned;
        if record.lease_token != previous || !lapsed {
            return Ok(None);
        }
        let before = stored.revision;
        let subject = self.subject(new.scope.as_str(), new.key.as_str());
        let (steps, request) = if record.is_expired() {
            (&[][..], None)
        } else {
            (&record.steps[..], record.request.as_deref())
        };
        let value = codec::encode(&Packed {
            steps,
            request,
            ..claimed(new)
        });
        match self
            .write(
                &subject,
                stored.revision,
                &ttl(ms(new.retention)),
                value.clone(),
                Mark::Claim(new.token),
                deadline,
            )
            .await?
        {
            Written::Stored(revision) => {
                self.inner.claimed.remember(new.token, revision, value);
                Ok(Some(new.lease()))
            }
            Written::Conflict => Ok(None),
            Written::Unknown(error) => match self.read(new.scope, new.key, deadline).await? {
                Slot::Record(stored) if stored.record.lease_token == new.token => {
                    Ok(Some(new.lease()))
                }
                // Unchanged: the write did not land (as far as the leader
                // knows); the outcome stays unknown to the caller.
                Slot::Record(stored) if stored.revision == before => Err(error),
                // Changed by another write: not this take-over's.
                _ => Ok(None),
            },
        }
    }
}
