//! The claim and the completion of one record, the path every request
//! takes without batching: a claim is `SET … NX PX … GET` alone on one
//! Redis (a fresh key, the common case, costs one command), followed by
//! `PTTL` only when a record exists, or both in one pipeline where a `WAIT`
//! or a cluster's routing sends a pipeline anyway; a completion is the
//! native `SET … IFEQ … KEEPTTL` when this store remembers the claim's
//! value, else the fenced script. The batches of `batch.rs` build their
//! pipelines from the same commands and read their answers with the same
//! [`RedisRecords::claim_answer`].

use std::borrow::Cow;
use std::time::Duration;

use redis::Value;

use super::call::{RecordKey, ScriptCall};
use super::connection::Connection;
use super::replicas::Acked;
use super::scripts::COMPLETE;
use super::{RECORDS, RedisRecords, codec, server_error, wrong_type};
use crate::record::CorruptRecord;
use crate::store::{Claim, Lease, NewRecord, Store, StoreError};

impl RedisRecords {
    /// The claim's pipeline: `SET key <in flight> NX PX <retention> GET`,
    /// then `PTTL key`.
    pub(super) fn claim_commands(
        pipe: &mut redis::Pipeline,
        at: &RecordKey<'_>,
        value: &[u8],
        retention: Duration,
    ) {
        pipe.add_command(Self::claim_set(at, value, retention))
            .add_command(Self::pttl_command(at));
    }

    /// `SET key <in flight> NX PX <retention> GET`: writes the claim unless
    /// a record exists, and answers that record (or nil).
    fn claim_set(at: &RecordKey<'_>, value: &[u8], retention: Duration) -> redis::Cmd {
        // Sized up front: a command that grows its buffers argument by
        // argument reallocates several times per claim.
        let key = at.prefix.len() + at.namespace.len() + at.scope.len() + at.key.len() + 24;
        let mut set = redis::Cmd::with_capacity(7, key + value.len() + 32);
        set.arg("SET")
            .arg(at)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(codec::millis(retention).max(1))
            .arg("GET");
        set
    }

    /// `PTTL key`: how long the record has left.
    fn pttl_command(at: &RecordKey<'_>) -> redis::Cmd {
        let key = at.prefix.len() + at.namespace.len() + at.scope.len() + at.key.len() + 24;
        let mut pttl = redis::Cmd::with_capacity(2, key + 4);
        pttl.arg("PTTL").arg(at);
        pttl
    }

    /// One claim's answers, `[SET … GET's, PTTL's]` as
    /// [`RedisRecords::claim_answer`] reads them. On one Redis without
    /// replica acknowledgements the `SET` goes alone and `PTTL` follows it
    /// only when a record exists (its answer is nil otherwise): a fresh
    /// key costs one command, and the existing record's second round trip
    /// reads the same time left a pipeline would (a pipeline is not atomic
    /// either; a record gone meanwhile answers `-2`, and the key is claimed
    /// again). With `WAIT` or on a cluster, both go in one pipeline.
    async fn claim_round(
        &self,
        at: &RecordKey<'_>,
        value: &[u8],
        retention: Duration,
    ) -> Result<([Value; 2], Acked), StoreError> {
        if let Connection::Single(connection) = &self.connection
            && self.replica_acks.is_none()
        {
            let existing = connection
                .clone()
                .send_packed_command(&Self::claim_set(at, value, retention))
                .await?;
            let left = match existing {
                Value::BulkString(_) => {
                    connection
                        .clone()
                        .send_packed_command(&Self::pttl_command(at))
                        .await?
                }
                _ => Value::Nil,
            };
            return Ok(([existing, left], Acked::unacked()));
        }
        let mut pipe = redis::pipe();
        Self::claim_commands(&mut pipe, at, value, retention);
        let mut acked = self.send(pipe, at, true).await?;
        let mut answers = std::mem::take(&mut acked.values).into_iter();
        match (answers.next(), answers.next()) {
            (Some(existing), Some(left)) => Ok(([existing, left], acked)),
            _ => Err(CorruptRecord("the claim answered too few values").into()),
        }
    }

    /// A native fenced completion: `SET key <completed> IFEQ <claimed>
    /// KEEPTTL`, its buffers sized up front.
    pub(super) fn ifeq_command(at: &RecordKey<'_>, done: &[u8], claimed: &[u8]) -> redis::Cmd {
        let key = at.prefix.len() + at.namespace.len() + at.scope.len() + at.key.len() + 24;
        let mut set = redis::Cmd::with_capacity(6, key + done.len() + claimed.len() + 32);
        set.arg("SET")
            .arg(at)
            .arg(done)
            .arg("IFEQ")
            .arg(claimed)
            .arg("KEEPTTL");
        set
    }

    /// What one claim's `SET … NX GET` and `PTTL` answered: acquired, the
    /// existing record, or `None` when a release 1 record vanished between
    /// the claim and its read (the caller claims again). `value` is what the
    /// claim wrote, kept (copied, if borrowed) only where completions use
    /// `IFEQ`.
    pub(super) async fn claim_answer(
        &self,
        new: &NewRecord<'_>,
        value: Cow<'_, [u8]>,
        sent_at: std::time::Instant,
        answers: &[Value],
        acked: &Acked,
    ) -> Result<Option<Claim>, StoreError> {
        match answers {
            [Value::Nil, _] => {
                acked.replicated()?;
                if self.native_fence {
                    self.claimed
                        .remember(new.token, value.into_owned(), sent_at);
                }
                Ok(Some(Claim::Acquired(new.lease())))
            }
            // Gone between the claim and its `PTTL`: claim again.
            [Value::BulkString(_), Value::Int(-2)] => Ok(None),
            [Value::BulkString(existing), Value::Int(left)] => {
                let record = codec::decode(
                    new.scope,
                    new.key,
                    existing,
                    *left,
                    time::OffsetDateTime::now_utc(),
                )?;
                if record.lease_token == new.token {
                    // Its own claim, landed by an earlier attempt: the
                    // engine runs on it as if acquired.
                    acked.replicated()?;
                }
                Ok(Some(Claim::Existing(Box::new(record))))
            }
            [Value::ServerError(error), _] if wrong_type(error) => Ok(self
                .get(new.scope, new.key)
                .await?
                .map(|record| Claim::Existing(Box::new(record)))),
            [Value::ServerError(error), _] | [_, Value::ServerError(error)] => {
                Err(server_error(error))
            }
            _ => Err(CorruptRecord("the claim answered an unexpected shape").into()),
        }
    }

    /// One claim on its own.
    pub(super) async fn claim_alone(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        let at = self.key_arg(RECORDS, new.scope.as_str(), new.key.as_str());
        let mut value = codec::claim_value(new);
        // A record deleted between the claim and its read (its `PTTL`, or a
        // release 1 record's own read) leaves the key free: claim again
        // (twice at most, then fail).
        for _ in 0..3 {
            let sent_at = std::time::Instant::now();
            let (answers, acked) = self.claim_round(&at, &value, new.retention).await?;
            // Acquired, the value is kept (on Valkey) as it is, not copied.
            let value = match answers[0] {
                Value::Nil => Cow::Owned(std::mem::take(&mut value)),
                _ => Cow::Borrowed(value.as_slice()),
            };
            if let Some(claim) = self
                .claim_answer(new, value, sent_at, &answers, &acked)
                .await?
            {
                return Ok(claim);
            }
        }
        Err(CorruptRecord("a record kept vanishing under its claim").into())
    }

    /// One completion on its own: native `IFEQ` when this store remembers
    /// the claim's value, else (or when the value changed) the script.
    pub(super) async fn complete_alone(
        &self,
        lease: &Lease,
        response: Vec<u8>,
    ) -> Result<(), StoreError> {
        let at = self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str());
        if let Some(claimed) = self
            .native_fence
            .then(|| self.claimed.take(lease.token))
            .flatten()
        {
            let done = codec::completed(&claimed.value, claimed.at.elapsed(), &response)?;
            let set = Self::ifeq_command(&at, &done, &claimed.value);
            let (answer, acked) = if self.replica_acks.is_none() {
                // No `WAIT` to send behind it: the command goes on its
                // own, as the script call does, not in a pipeline of one.
                (self.query(&set).await?, Acked::unacked())
            } else {
                let mut pipe = redis::pipe();
                pipe.add_command(set);
                let mut acked = self.send(pipe, &at, true).await?;
                match std::mem::take(&mut acked.values).into_iter().next() {
                    Some(Value::ServerError(error)) => return Err(server_error(&error)),
                    Some(answer) => (answer, acked),
                    None => return Err(CorruptRecord("SET IFEQ answered nothing").into()),
                }
            };
            match answer {
                Value::Okay => return acked.replicated(),
                // Another value: watched, renewed, or another's lease.
                Value::Nil => {}
                _ => return Err(CorruptRecord("SET IFEQ answered an unexpected shape").into()),
            }
        }
        // The key, the token (16 bytes), the response and the channel, and
        // room for their lengths: one buffer, never grown.
        let size = at.len() + 16 + response.len() + self.channel.len() + 64;
        let mut call = ScriptCall::new(&COMPLETE, 1, size);
        call.arg(&at)
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(response)
            .arg(&*self.channel);
        match self.invoke_acked(&call, &at).await? {
            (Value::Int(1), acked) => acked.replicated(),
            _ => Err(StoreError::LeaseLost),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use redis::Value;

    use super::super::replicas::Acked;
    use super::super::tests::{raw, record, script_calls};
    use super::super::{RedisStore, codec};
    use crate::fingerprint::Fingerprint;
    use crate::key::{IdempotencyKey, Scope};
    use crate::record::{RecordState, StoredResponse};
    use crate::store::{Claim, Store, StoreError};

    /// A fresh key is claimed by one `SET` (no `PTTL` sent); an existing
    /// record is read with the time it has left; a record that vanished
    /// between the claim's `SET` and its `PTTL` (`-2`) is claimed again,
    /// not read as expired.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_reads_the_time_left_only_of_an_existing_record() {
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-claim-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix)
            .await
            .expect("Redis (start one on 127.0.0.1:6379, or set TEST_REDIS_URL)");
        let fingerprint = Fingerprint::from_bytes([6; 32]);
        let new = record("k", &fingerprint, Duration::from_secs(30));
        assert!(matches!(
            store.claim(&new).await.unwrap(),
            Claim::Acquired(_)
        ));
        let again = record("k", &fingerprint, Duration::from_secs(30));
        match store.claim(&again).await.unwrap() {
            Claim::Existing(existing) => {
                assert_eq!(existing.lease_token, new.token);
                assert_eq!(existing.state(), RecordState::InFlight);
                let left = existing.expires_at - existing.observed_at;
                assert!(
                    left > time::Duration::seconds(3000),
                    "the time left is the key's PTTL: {left}"
                );
            }
            Claim::Acquired(_) => panic!("a claimed key was claimed twice"),
        }

        let value = raw(&store, "s", "k").await;
        let records = store.direct();
        let answer = |answers: [Value; 2]| {
            let at = std::time::Instant::now();
            let value = value.clone();
            let again = &again;
            async move {
                records
                    .claim_answer(again, Cow::Owned(value), at, &answers, &Acked::unacked())
                    .await
            }
        };
        let vanished = answer([Value::BulkString(value.clone()), Value::Int(-2)]).await;
        assert!(matches!(vanished, Ok(None)), "{vanished:?}");
        let read = answer([Value::BulkString(value.clone()), Value::Int(60_000)]).await;
        assert!(matches!(read, Ok(Some(Claim::Existing(_)))), "{read:?}");
    }

    /// On Valkey a completion is one native `SET … IFEQ`, no script; a
    /// renewed or watched record misses it and completes by the fenced
    /// script, which wakes a waiter in another process's store; a lease
    /// another request took over completes nothing, and the new holder's
    /// completion is native again. A private server, so its script counter
    /// counts this test's commands alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn valkey_completions_take_the_native_fence_unless_the_value_changed() {
        let server = idempotency_tests::RedisServer::start_valkey().await;
        let url = server.url();
        let prefix = format!("test-ifeq-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix).await.unwrap();
        let other = RedisStore::connect(&url, &prefix).await.unwrap();
        assert!(store.native_fence());
        let fingerprint = Fingerprint::from_bytes([5; 32]);
        let response = StoredResponse::from_bytes("done");
        let lease_of = |claim: Claim| match claim {
            Claim::Acquired(lease) => lease,
            Claim::Existing(record) => panic!("a fresh key is acquired, not {record:?}"),
        };

        // Fresh: claim and completion without a script.
        let before = script_calls(&url).await;
        let new = record("plain", &fingerprint, Duration::from_secs(30));
        let lease = lease_of(store.claim(&new).await.unwrap());
        let claimed = raw(&store, "s", "plain").await;
        store.complete(&lease, &response).await.unwrap();
        assert_eq!(
            script_calls(&url).await,
            before,
            "a native claim and completion"
        );
        let completed = raw(&store, "s", "plain").await;
        let view = codec::View::parse(&completed).unwrap();
        assert_eq!(view.state, codec::COMPLETED);
        assert_eq!(
            completed,
            codec::completed(
                &claimed,
                Duration::from_millis(view.completion),
                &codec::encode_response(&response)
            )
            .unwrap()
        );
        assert_eq!(
            store.direct().claimed.len(),
            0,
            "the claimed value was taken"
        );

        // Renewed: the value changed, the script completes it.
        let new = record("renewed", &fingerprint, Duration::from_secs(30));
        let lease = lease_of(store.claim(&new).await.unwrap());
        store.renew(&lease, Duration::from_secs(90)).await.unwrap();
        let before = script_calls(&url).await;
        store.complete(&lease, &response).await.unwrap();
        // The script ran (counted once more when its first call met an empty
        // script cache and was sent again).
        assert!(script_calls(&url).await > before, "the fenced script ran");
        let read = store
            .get(Scope::leaked("s"), IdempotencyKey::leaked("renewed"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.response.as_ref(), Some(&response));

        // Watched by another store: the script completes it and wakes it.
        let new = record("watched", &fingerprint, Duration::from_secs(30));
        let lease = lease_of(store.claim(&new).await.unwrap());
        let waiting = other.events().subscribe("s", "watched");
        let read = other
            .get(Scope::leaked("s"), IdempotencyKey::leaked("watched"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.state(), RecordState::InFlight);
        // The other store's subscriber task starts listening at connect.
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.complete(&lease, &response).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting.changed())
            .await
            .expect("the waiter in the other store is woken by the completion");
        let read = other
            .get(Scope::leaked("s"), IdempotencyKey::leaked("watched"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.response.as_ref(), Some(&response));

        // Taken over: the first holder completes nothing.
        let new = record("taken", &fingerprint, Duration::from_millis(20));
        let first = lease_of(store.claim(&new).await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = record("taken", &fingerprint, Duration::from_secs(30));
        let second = other
            .take_over(first.token, &again)
            .await
            .unwrap()
            .expect("an ended lease is taken over");
        assert!(matches!(
            store
                .complete(&first, &StoredResponse::from_bytes("first"))
                .await,
            Err(StoreError::LeaseLost)
        ));
        let before = script_calls(&url).await;
        other.complete(&second, &response).await.unwrap();
        assert_eq!(
            script_calls(&url).await,
            before,
            "the new holder's native completion"
        );
        let read = store
            .get(Scope::leaked("s"), IdempotencyKey::leaked("taken"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.response.as_ref(), Some(&response));
    }
}
