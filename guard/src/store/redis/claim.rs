//! The claim and the completion of one record, the path every request
//! takes without batching: a claim is `SET … NX PX … GET` and `PTTL` in
//! one round trip; a completion is the native `SET … IFEQ … KEEPTTL` when
//! this store remembers the claim's value, else the fenced script. The
//! batches of `batch.rs` build their pipelines from the same commands and
//! read their answers with the same [`RedisRecords::claim_answer`].

use std::borrow::Cow;
use std::time::Duration;

use redis::Value;

use super::call::{RecordKey, ScriptCall};
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
        let mut pttl = redis::Cmd::with_capacity(2, key + 4);
        pttl.arg("PTTL").arg(at);
        pipe.add_command(set).add_command(pttl);
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
        let at = self.key_arg(RECORDS, new.scope, new.key);
        let request =
            codec::encode_request(new.fingerprint, new.transactional, new.method, new.path);
        let value = codec::in_flight(new.token, new.lease, new.retention, &request);
        // A release 1 record that is deleted between the claim and its read
        // leaves the key free: claim again (twice at most, then fail).
        for _ in 0..3 {
            let mut pipe = redis::pipe();
            Self::claim_commands(&mut pipe, &at, &value, new.retention);
            let sent_at = std::time::Instant::now();
            let acked = self.send(pipe, &at, true).await?;
            if let Some(claim) = self
                .claim_answer(new, Cow::Borrowed(&value), sent_at, &acked.values, &acked)
                .await?
            {
                return Ok(claim);
            }
        }
        Err(CorruptRecord("a release 1 record kept vanishing under its claim").into())
    }

    /// One completion on its own: native `IFEQ` when this store remembers
    /// the claim's value, else (or when the value changed) the script.
    pub(super) async fn complete_alone(
        &self,
        lease: &Lease,
        response: Vec<u8>,
    ) -> Result<(), StoreError> {
        let at = self.key_arg(RECORDS, &lease.scope, &lease.key);
        if let Some(claimed) = self
            .native_fence
            .then(|| self.claimed.take(lease.token))
            .flatten()
        {
            let done = codec::completed(&claimed.value, claimed.at.elapsed(), &response)?;
            let mut pipe = redis::pipe();
            pipe.add_command(Self::ifeq_command(&at, &done, &claimed.value));
            let acked = self.send(pipe, &at, true).await?;
            match acked.values.first() {
                Some(Value::Okay) => return acked.replicated(),
                // Another value: watched, renewed, or another's lease.
                Some(Value::Nil) => {}
                Some(Value::ServerError(error)) => return Err(server_error(error)),
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
    use std::time::Duration;

    use super::super::tests::{raw, record, script_calls};
    use super::super::{RedisStore, codec};
    use crate::fingerprint::Fingerprint;
    use crate::record::{RecordState, StoredResponse};
    use crate::store::{Claim, Store, StoreError};

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
        let read = store.get("s", "renewed").await.unwrap().unwrap();
        assert_eq!(read.response.as_ref(), Some(&response));

        // Watched by another store: the script completes it and wakes it.
        let new = record("watched", &fingerprint, Duration::from_secs(30));
        let lease = lease_of(store.claim(&new).await.unwrap());
        let waiting = other.events().subscribe("s", "watched");
        let read = other.get("s", "watched").await.unwrap().unwrap();
        assert_eq!(read.state(), RecordState::InFlight);
        // The other store's subscriber task starts listening at connect.
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.complete(&lease, &response).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting.changed())
            .await
            .expect("the waiter in the other store is woken by the completion");
        let read = other.get("s", "watched").await.unwrap().unwrap();
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
        let read = store.get("s", "taken").await.unwrap().unwrap();
        assert_eq!(read.response.as_ref(), Some(&response));
    }
}
