//! Batches on Redis ([`BatchedStore`]): the claims (or completions) of a
//! batch go as one pipeline per node, each key answered on its own; a key
//! whose slot moved meanwhile answers `MOVED` or `ASK` and is sent again on
//! its own, and the slot map is read again.

use redis::Value;

use super::{RECORDS, RedisRecords, codec, server_error};
use crate::record::{CorruptRecord, StoredResponse};
use crate::store::{BatchedStore, Claim, ClaimItem, Lease, StoreError};

/// A completion waiting in a batch: the lease and the packed response.
type CompleteItem = (Lease, Vec<u8>);

impl BatchedStore for RedisRecords {
    type Completion = CompleteItem;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> CompleteItem {
        (lease.clone(), codec::encode_response(response))
    }

    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        if let [item] = items.as_slice() {
            return Ok(vec![self.claim_alone(&item.as_new()).await]);
        }
        // One pipeline per node: each claim's `SET … NX GET` and `PTTL`,
        // answered per key.
        let groups = self.groups(items.iter().map(|item| {
            let new = item.as_new();
            self.key_arg(RECORDS, new.scope.as_str(), new.key.as_str())
                .to_bytes()
        }));
        let sent = futures_util::future::join_all(
            groups.iter().map(|group| self.claim_group(&items, group)),
        )
        .await;
        let mut claims: Vec<Option<Result<Claim, StoreError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut moved = false;
        let single = groups.len() == 1;
        for (group, sent) in groups.into_iter().zip(sent) {
            match sent {
                Ok((answers, redirected)) => {
                    moved |= redirected;
                    for (index, claim) in group.into_iter().zip(answers) {
                        claims[index] = Some(claim);
                    }
                }
                Err(error) if single => return Err(error),
                // One primary failed: its claims go on their own (one that
                // landed is found as its own, by its token).
                Err(_) => {
                    for index in group {
                        claims[index] = Some(self.claim_alone(&items[index].as_new()).await);
                    }
                }
            }
        }
        if moved {
            self.refresh_slots().await;
        }
        Ok(claims
            .into_iter()
            .map(|claim| claim.unwrap_or(Err(StoreError::Unsupported("a lost claim"))))
            .collect())
    }

    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        // Completions whose claim's value this store remembers go as
        // `SET … IFEQ`, one pipeline per node; the others (and those whose
        // value changed) by script, concurrently.
        let mut native: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
        let mut results: Vec<Option<Result<(), StoreError>>> = Vec::with_capacity(items.len());
        for (index, (lease, response)) in items.iter().enumerate() {
            results.push(None);
            if !self.native_fence {
                continue;
            }
            let Some(claimed) = self.claimed.take(lease.token) else {
                continue;
            };
            match codec::completed(&claimed.value, claimed.at.elapsed(), response) {
                Ok(done) => native.push((index, done, claimed.value)),
                Err(error) => results[index] = Some(Err(error.into())),
            }
        }
        let record_key = |index: usize| {
            let lease = &items[index].0;
            self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str())
        };
        let groups = self.groups(
            native
                .iter()
                .map(|(index, ..)| record_key(*index).to_bytes()),
        );
        let sent = futures_util::future::join_all(groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            for &n in group {
                let (index, done, claimed) = &native[n];
                pipe.add_command(Self::ifeq_command(&record_key(*index), done, claimed));
            }
            let route = record_key(native[group[0]].0);
            async move { self.send(pipe, &route, true).await }
        }))
        .await;
        let mut moved = false;
        let single = groups.len() == 1;
        for (group, sent) in groups.iter().zip(sent) {
            let acked = match sent {
                Ok(acked) => acked,
                Err(error) if single => return Err(error),
                // One primary failed: the script decides these.
                Err(_) => continue,
            };
            for (&n, answer) in group.iter().zip(&acked.values) {
                let index = native[n].0;
                results[index] = match answer {
                    Value::Okay => Some(acked.replicated()),
                    // Another value: watched, renewed, or another's lease.
                    Value::Nil => None,
                    Value::ServerError(error) if redirected(error) => {
                        moved = true;
                        None
                    }
                    Value::ServerError(error) => Some(Err(server_error(error))),
                    _ => Some(Err(
                        CorruptRecord("SET IFEQ answered an unexpected shape").into()
                    )),
                };
            }
        }
        if moved {
            self.refresh_slots().await;
        }
        let scripted = futures_util::future::join_all(
            items
                .iter()
                .zip(&results)
                .filter(|(_, result)| result.is_none())
                .map(|((lease, response), _)| self.complete_alone(lease, response.clone())),
        )
        .await;
        let mut scripted = scripted.into_iter();
        Ok(results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    scripted
                        .next()
                        .unwrap_or(Err(StoreError::Unsupported("a lost completion")))
                })
            })
            .collect())
    }
}

/// Whether a command answered `MOVED` or `ASK`: its slot is served by
/// another node now, and it did not run.
fn redirected(error: &redis::ServerError) -> bool {
    matches!(
        error.kind(),
        Some(redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask)
    )
}

impl RedisRecords {
    /// The claims of `group` (indices into `items`, keys one node serves)
    /// in one pipeline, answered in its order; and whether one answered
    /// `MOVED` or `ASK` (it was sent again on its own).
    async fn claim_group(
        &self,
        items: &[ClaimItem],
        group: &[usize],
    ) -> Result<(Vec<Result<Claim, StoreError>>, bool), StoreError> {
        let mut pipe = redis::pipe();
        let mut values = Vec::with_capacity(group.len());
        for &index in group {
            let new = items[index].as_new();
            let value = codec::claim_value(&new);
            Self::claim_commands(
                &mut pipe,
                &self.key_arg(RECORDS, new.scope.as_str(), new.key.as_str()),
                &value,
                new.retention,
            );
            values.push(value);
        }
        let first = items[group[0]].as_new();
        let sent_at = std::time::Instant::now();
        let acked = self
            .send(
                pipe,
                &self.key_arg(RECORDS, first.scope.as_str(), first.key.as_str()),
                true,
            )
            .await?;
        if acked.values.len() != 2 * group.len() {
            return Err(CorruptRecord("the batch claim answered too few keys").into());
        }
        let mut claims = Vec::with_capacity(group.len());
        let mut moved = false;
        for ((&index, value), answers) in group.iter().zip(values).zip(acked.values.chunks(2)) {
            let new = items[index].as_new();
            if matches!(&answers[0], Value::ServerError(error) if redirected(error)) {
                moved = true;
                claims.push(self.claim_alone(&new).await);
                continue;
            }
            claims.push(
                match self
                    .claim_answer(&new, value.into(), sent_at, answers, &acked)
                    .await
                {
                    Ok(Some(claim)) => Ok(claim),
                    // A release 1 record vanished under it: on its own again.
                    Ok(None) => self.claim_alone(&new).await,
                    Err(error) => Err(error),
                },
            );
        }
        Ok((claims, moved))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::record;
    use super::super::{PIPELINED_BATCHING, RECORDS, RedisStore};
    use crate::fingerprint::Fingerprint;
    use crate::record::RecordState;
    use crate::store::{BatchedStore, Claim, ClaimItem, NewRecord, Store, StoreError};

    /// A setting given after the store is built reaches the claims that go
    /// through its batcher too (`Batched::map` builds the batchers again
    /// over the changed store): asked for a replica's acknowledgement on a
    /// Redis that has none, each of 64 concurrent claims fails
    /// `NotReplicated`, the 63 that went as one batch included.
    #[tokio::test(flavor = "current_thread")]
    async fn a_setting_given_after_connecting_reaches_batched_claims() {
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-map-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix)
            .await
            .unwrap()
            .with_batching(PIPELINED_BATCHING)
            .with_replica_acks(1, Duration::from_millis(5));
        let fingerprint = Fingerprint::from_bytes([3; 32]);
        let names: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
        let records: Vec<NewRecord<'_>> = names
            .iter()
            .map(|name| record(name, &fingerprint, Duration::from_secs(30)))
            .collect();
        let claims =
            futures_util::future::join_all(records.iter().map(|new| store.claim(new))).await;
        let batched = store.batch_stats().claims;
        assert_eq!(batched.items, 64, "{batched:?}");
        assert!(
            batched.largest > 1,
            "some claims went as a batch: {batched:?}"
        );
        for (name, claim) in names.iter().zip(claims) {
            assert!(
                matches!(
                    claim,
                    Err(StoreError::NotReplicated {
                        wanted: 1,
                        acked: 0
                    })
                ),
                "{name}: {claim:?}"
            );
            let mut del = redis::cmd("DEL");
            del.arg(store.direct().key_arg(RECORDS, "s", name));
            store.direct().query(&del).await.unwrap();
        }
    }

    /// On a cluster a batch goes as one pipeline per primary and keeps each
    /// claim's own answer: 200 claims of one key in one pipeline give
    /// exactly one winner and its record to the 199 others; 200 claims over
    /// 40 keys (on every primary) give one winner per key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_batches_answer_each_claim_on_its_own() {
        let urls = idempotency_tests::fixtures::redis_cluster_urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        let prefix = format!("test-pipeline-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect_cluster(&nodes, &prefix).await.unwrap();
        let fingerprint = Fingerprint::from_bytes([9; 32]);
        for keys in [1, 40] {
            let names: Vec<String> = (0..keys).map(|k| format!("k{keys}-{k}")).collect();
            let records: Vec<NewRecord<'_>> = (0..200)
                .map(|i| record(&names[i % keys], &fingerprint, Duration::from_secs(30)))
                .collect();
            let items: Vec<ClaimItem> = records.iter().map(ClaimItem::new).collect();
            let groups = store.direct().groups(items.iter().map(|item| {
                store
                    .direct()
                    .key_arg(RECORDS, item.scope.as_str(), item.key.as_str())
                    .to_bytes()
            }));
            match keys {
                1 => assert_eq!(groups.len(), 1, "one key is one pipeline"),
                _ => assert!(groups.len() > 1, "40 keys reach more than one primary"),
            }
            let claims = store.direct().claim_batch(items).await.unwrap();
            assert_eq!(claims.len(), 200);
            let mut winners = std::collections::HashMap::new();
            for (new, claim) in records.iter().zip(&claims) {
                if let Ok(Claim::Acquired(lease)) = claim {
                    assert_eq!(lease.token, new.token);
                    let earlier = winners.insert(new.key, new.token);
                    assert!(earlier.is_none(), "two winners for {}", new.key);
                }
            }
            assert_eq!(winners.len(), keys, "one winner per key");
            for (new, claim) in records.iter().zip(claims) {
                if let Claim::Existing(existing) = claim.unwrap() {
                    assert_eq!(existing.lease_token, winners[new.key], "{}", new.key);
                    assert_eq!(existing.state(), RecordState::InFlight);
                }
            }
            for name in &names {
                let mut del = redis::cmd("DEL");
                del.arg(store.direct().key_arg(RECORDS, "s", name));
                store.direct().query(&del).await.unwrap();
            }
        }
    }
}
