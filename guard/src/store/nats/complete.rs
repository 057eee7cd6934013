//! The holder's writes: complete, renew, record steps, keep a request and
//! release, each a
//! read from the leader, a check of the lease token, and a write fenced by
//! the revision read; but a completion of this process's own claim, which
//! the store already knows, writes fenced by the claim's revision without
//! reading first (`claimed.rs`, `stamps.rs`).

use std::time::Duration;

use bytes::Bytes;

use super::claim::ms;
use super::codec::{self, Packed, Stored, Time, unix_ms};
use super::requests::Mark;
use super::stamps;
use super::{MARKER_TTL, NatsStore, RACE_ATTEMPTS, REQUEST_TIMEOUT, Slot, Written, ttl};
use crate::fingerprint::Fingerprint;
use crate::record::StoredRequest;
use crate::record::{Record, RecordState, Step, StoredResponse};
use crate::store::{Lease, StoreError};

/// The value that rewrites `stored` keeping its claim's instants, its
/// steps and its stored request, with a response and a lease end of the caller's choice.
fn rewritten<'a>(
    stored: &'a Stored,
    lease_end: Time,
    lease_cap: Time,
    response: Option<&'a StoredResponse>,
) -> Packed<'a> {
    let record = &stored.record;
    Packed {
        fingerprint: Fingerprint::from_bytes(*record.fingerprint.as_bytes()),
        token: record.lease_token,
        transactional: record.transactional,
        created: Time::At(unix_ms(record.created_at)),
        lease_end,
        lease_cap,
        retention_ms: stored.retention_ms,
        method: &record.method,
        path: &record.path,
        response,
        steps: &record.steps,
        steps_cap: Time::Unset,
        steps_before: record.steps.len(),
        request: record.request.as_deref(),
        request_cap: Time::Unset,
        request_before: None,
    }
}

/// The per-message TTL of a rewrite of `stored`: what is left of its
/// retention.
fn remaining_ttl(stored: &Stored) -> String {
    let record = &stored.record;
    ttl(unix_ms(record.expires_at) - unix_ms(record.observed_at))
}

/// Whether `slot` holds `lease`'s record, in flight (its lease ended or not).
fn held<'a>(slot: &'a Slot, lease: &Lease) -> Option<&'a Stored> {
    match slot {
        Slot::Record(stored)
            if stored.record.lease_token == lease.token && stored.record.response.is_none() =>
        {
            Some(stored)
        }
        _ => None,
    }
}

impl NatsStore {
    /// See [`Store::complete`](crate::Store::complete).
    pub(super) async fn complete_record(
        &self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let subject = self.subject(lease.scope.as_str(), lease.key.as_str());
        let mut unknown: Option<StoreError> = None;
        // This process's own claim, its stamp seen: written without a read,
        // fenced by the claim's revision (any write since moved it).
        if let Some(stored) = self.claimed_record(lease).await {
            match self
                .write_completion(&subject, &stored, response, deadline)
                .await?
            {
                Written::Stored(_) => return Ok(()),
                Written::Conflict => {}
                Written::Unknown(error) => unknown = Some(error),
            }
        }
        for _ in 0..RACE_ATTEMPTS {
            let slot = self.read(&lease.scope, &lease.key, deadline).await?;
            let Some(stored) = held(&slot, lease) else {
                // A completion whose answer was lost, read back: it landed.
                if unknown.is_some()
                    && let Slot::Record(stored) = &slot
                    && stored.record.lease_token == lease.token
                    && stored.record.state() == RecordState::Completed
                {
                    return Ok(());
                }
                return Err(StoreError::LeaseLost);
            };
            match self
                .write_completion(&subject, stored, response, deadline)
                .await?
            {
                Written::Stored(_) => return Ok(()),
                Written::Conflict => {}
                Written::Unknown(error) => unknown = Some(error),
            }
        }
        Err(unknown.unwrap_or_else(|| {
            StoreError::Unavailable("the completion kept racing other writes".into())
        }))
    }

    /// The record of `lease`'s claim as the leader holds it, if this
    /// process made the claim, has not written the record since, and the
    /// watch saw the claim's stamp: the value the claim wrote, read at its
    /// stamp (so the record's times are the ones a read would give).
    ///
    /// Not while the connection is down: the client would keep the write
    /// and send it once connected again, long after the caller stopped
    /// waiting (a read, which fails meanwhile, sends nothing that lands).
    async fn claimed_record(&self, lease: &Lease) -> Option<Stored> {
        let claimed = self.inner.claimed.take(lease.token)?;
        if self.inner.client.connection_state() != async_nats::connection::State::Connected {
            return None;
        }
        let stamp = self
            .inner
            .stamps
            .get(claimed.revision, lease.token, stamps::WAIT)
            .await?;
        codec::decode(
            &lease.scope,
            &lease.key,
            &claimed.value,
            stamp,
            claimed.revision,
            stamp,
        )
        .ok()
    }

    /// Writes `stored` completed with `response`, fenced by its revision
    /// (without the body, or the stored request too, when the value would
    /// exceed the server's `max_payload`).
    async fn write_completion(
        &self,
        subject: &str,
        stored: &Stored,
        response: &StoredResponse,
        deadline: std::time::Instant,
    ) -> Result<Written, StoreError> {
        let lease_end = Time::At(unix_ms(stored.record.lease_expires_at));
        let mut value = codec::encode(&rewritten(stored, lease_end, Time::Unset, Some(response)));
        if !self.fits(subject, value.len()) {
            // The server's max_payload is below the response: stored
            // without its body (replays answer `response-not-stored`),
            // as a response above the guard's own limit is.
            tracing::warn!(
                bucket = %self.inner.bucket,
                size = value.len(),
                max_payload = self.inner.max_payload,
                "a response exceeds the NATS server's max_payload: stored without its body"
            );
            let bodiless = StoredResponse {
                body: None,
                ..response.clone()
            };
            value = codec::encode(&rewritten(stored, lease_end, Time::Unset, Some(&bodiless)));
            if !self.fits(subject, value.len()) {
                // Still too large: the stored request goes (a completed
                // record is never run again from it).
                value = codec::encode(&Packed {
                    request: None,
                    ..rewritten(stored, lease_end, Time::Unset, Some(&bodiless))
                });
            }
        }
        self.write(
            subject,
            stored.revision,
            &remaining_ttl(stored),
            value,
            Mark::Plain,
            deadline,
        )
        .await
    }

    /// See [`Store::renew`](crate::Store::renew).
    pub(super) async fn renew_lease(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        // The record changes (or goes): a completion reads it first.
        self.inner.claimed.take(lease.token);
        let subject = self.subject(lease.scope.as_str(), lease.key.as_str());
        for _ in 0..RACE_ATTEMPTS {
            let slot = self.read(&lease.scope, &lease.key, deadline).await?;
            let Some(stored) = held(&slot, lease) else {
                return Err(StoreError::LeaseLost);
            };
            if stored.record.state() != RecordState::InFlight {
                // Ended: never extended again.
                return Err(StoreError::LeaseLost);
            }
            // Capped at the lease's current end: stamped after it, the
            // renewal is void (see the module's documentation).
            let cap = Time::At(unix_ms(stored.record.lease_expires_at));
            let value = codec::encode(&rewritten(
                stored,
                Time::AfterStamp(ms(duration)),
                cap,
                None,
            ));
            match self
                .write(
                    &subject,
                    stored.revision,
                    &remaining_ttl(stored),
                    value,
                    Mark::Plain,
                    deadline,
                )
                .await?
            {
                Written::Stored(_) => return Ok(()),
                Written::Conflict => {}
                // The engine renews again at its next turn.
                Written::Unknown(error) => return Err(error),
            }
        }
        Err(StoreError::Unavailable(
            "the renewal kept racing other writes".into(),
        ))
    }

    /// See [`Store::record_steps`](crate::Store::record_steps). Fenced
    /// like a renewal: refused once the lease has ended (on the leader's
    /// clock, as read), and capped at the lease's end, so that a write
    /// that lands after it is void (see `codec.rs`). When the write lands
    /// near that end, the record is read back to tell the runner which.
    pub(super) async fn record_steps_held(
        &self,
        lease: &Lease,
        steps: &[Step],
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        // The record changes (or goes): a completion reads it first.
        self.inner.claimed.take(lease.token);
        let subject = self.subject(lease.scope.as_str(), lease.key.as_str());
        let mut unknown: Option<StoreError> = None;
        for _ in 0..RACE_ATTEMPTS {
            let slot = self.read(&lease.scope, &lease.key, deadline).await?;
            let Some(stored) = held(&slot, lease) else {
                return Err(StoreError::LeaseLost);
            };
            if unknown.is_some() && stored.record.steps == steps {
                // A write whose answer was lost, read back: it landed.
                return Ok(());
            }
            if stored.record.state() != RecordState::InFlight {
                return Err(StoreError::LeaseLost);
            }
            let lease_end = stored.record.lease_expires_at;
            let value = codec::encode(&Packed {
                steps,
                steps_cap: Time::At(unix_ms(lease_end)),
                steps_before: stored.record.steps.len(),
                ..rewritten(stored, Time::At(unix_ms(lease_end)), Time::Unset, None)
            });
            if !self.fits(&subject, value.len()) {
                return Err(StoreError::Unsupported(
                    "recorded steps larger than the NATS server's max_payload",
                ));
            }
            match self
                .write(
                    &subject,
                    stored.revision,
                    &remaining_ttl(stored),
                    value,
                    Mark::Plain,
                    deadline,
                )
                .await?
            {
                Written::Stored(_) => {
                    return self
                        .landed_in_time(lease, lease_end, |record| record.steps == steps)
                        .await;
                }
                Written::Conflict => {}
                Written::Unknown(error) => unknown = Some(error),
            }
        }
        Err(unknown.unwrap_or_else(|| {
            StoreError::Unavailable("the steps' write kept racing other writes".into())
        }))
    }

    /// See [`Store::record_request`](crate::Store::record_request). Fenced
    /// like [`NatsStore::record_steps_held`]: refused once the lease has
    /// ended (on the leader's clock, as read), and capped at the lease's
    /// end, so that a write that lands after it is void and the record
    /// keeps the request it held (see `codec.rs`).
    pub(super) async fn record_request_held(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        // The record changes (or goes): a completion reads it first.
        self.inner.claimed.take(lease.token);
        let subject = self.subject(lease.scope.as_str(), lease.key.as_str());
        let mut unknown: Option<StoreError> = None;
        let kept = |record: &Record| record.request.as_deref() == request;
        for _ in 0..RACE_ATTEMPTS {
            let slot = self.read(&lease.scope, &lease.key, deadline).await?;
            let Some(stored) = held(&slot, lease) else {
                return Err(StoreError::LeaseLost);
            };
            if unknown.is_some() && kept(&stored.record) {
                // A write whose answer was lost, read back: it landed.
                return Ok(());
            }
            if stored.record.state() != RecordState::InFlight {
                return Err(StoreError::LeaseLost);
            }
            let lease_end = stored.record.lease_expires_at;
            let value = codec::encode(&Packed {
                request,
                request_cap: Time::At(unix_ms(lease_end)),
                request_before: stored.record.request.as_deref(),
                ..rewritten(stored, Time::At(unix_ms(lease_end)), Time::Unset, None)
            });
            if !self.fits(&subject, value.len()) {
                return Err(StoreError::Unsupported(
                    "a stored request larger than the NATS server's max_payload",
                ));
            }
            match self
                .write(
                    &subject,
                    stored.revision,
                    &remaining_ttl(stored),
                    value,
                    Mark::Plain,
                    deadline,
                )
                .await?
            {
                Written::Stored(_) => return self.landed_in_time(lease, lease_end, kept).await,
                Written::Conflict => {}
                Written::Unknown(error) => unknown = Some(error),
            }
        }
        Err(unknown.unwrap_or_else(|| {
            StoreError::Unavailable("the request's write kept racing other writes".into())
        }))
    }

    /// Whether a fenced write (steps, a request) that was stored landed
    /// before `lease_end`: surely, when the leader's clock (as estimated,
    /// which errs by less than half a request's timeout) was still that far
    /// before it once the answer came; else as the record, read back, says
    /// (`wrote`: whether it holds what the write wrote).
    async fn landed_in_time(
        &self,
        lease: &Lease,
        lease_end: time::OffsetDateTime,
        wrote: impl Fn(&Record) -> bool,
    ) -> Result<(), StoreError> {
        if self
            .inner
            .clock
            .now()
            .is_some_and(|now| now + REQUEST_TIMEOUT / 2 < lease_end)
        {
            return Ok(());
        }
        let slot = self.read(&lease.scope, &lease.key, self.deadline()).await?;
        match held(&slot, lease) {
            Some(stored) if wrote(&stored.record) => Ok(()),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// See [`Store::release`](crate::Store::release).
    pub(super) async fn release_record(&self, lease: &Lease) -> Result<(), StoreError> {
        let deadline = self.deadline();
        // The record changes (or goes): a completion reads it first.
        self.inner.claimed.take(lease.token);
        let subject = self.subject(lease.scope.as_str(), lease.key.as_str());
        let mut unknown: Option<StoreError> = None;
        for _ in 0..RACE_ATTEMPTS {
            let slot = self.read(&lease.scope, &lease.key, deadline).await?;
            let Some(stored) = held(&slot, lease) else {
                // A release whose answer was lost, read back: the record is
                // gone (only its holder or an operator deletes it).
                if unknown.is_some() && matches!(slot, Slot::Empty | Slot::Marker(_)) {
                    return Ok(());
                }
                return Err(StoreError::LeaseLost);
            };
            match self.delete(&subject, stored.revision, deadline).await? {
                Written::Stored(_) => return Ok(()),
                Written::Conflict => {}
                Written::Unknown(error) => unknown = Some(error),
            }
        }
        Err(unknown.unwrap_or_else(|| {
            StoreError::Unavailable("the release kept racing other writes".into())
        }))
    }

    /// Writes a delete marker on `subject` if it is at `revision`.
    pub(super) async fn delete(
        &self,
        subject: &str,
        revision: u64,
        deadline: std::time::Instant,
    ) -> Result<Written, StoreError> {
        self.write(
            subject,
            revision,
            MARKER_TTL,
            Bytes::new(),
            Mark::Delete,
            deadline,
        )
        .await
    }
}
