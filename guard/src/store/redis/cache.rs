//! The tiered store's side of Redis ([`RecordCache`]): copies of completed
//! records under keys of their own (`<prefix>:c:…`), written whole with
//! their time to live, and the announcement that wakes waiters in every
//! process.

use std::time::Duration;

use redis::Value;

use super::{CACHED, RECORDS, RedisRecords, codec, server_error, wrong_type};
use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::{CorruptRecord, Record};
use crate::store::{RecordCache, Store, StoreError};

impl RedisRecords {
    /// Reads a cached completed record (tiered store): the value and its
    /// `PTTL`, native. A release 1 hash there reads as a miss (the
    /// PostgreSQL record behind it is the truth).
    async fn cache_get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Record>, StoreError> {
        let at = self.key_arg(CACHED, scope.as_str(), key.as_str());
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&at).cmd("PTTL").arg(&at);
        let sent = self.send(pipe, &at, false).await?;
        match sent.values.as_slice() {
            [Value::Nil, _] => Ok(None),
            [Value::ServerError(error), _] if wrong_type(error) => Ok(None),
            [Value::BulkString(value), Value::Int(left)] => Ok(Some(codec::decode(
                scope,
                key,
                value,
                *left,
                time::OffsetDateTime::now_utc(),
            )?)),
            [Value::ServerError(error), _] | [_, Value::ServerError(error)] => {
                Err(server_error(error))
            }
            _ => Err(CorruptRecord("GET and PTTL answered an unexpected shape").into()),
        }
    }

    /// Caches a completed record for `ttl` (tiered store), one native `SET`.
    async fn cache_put(&self, record: &Record, ttl: Duration) -> Result<(), StoreError> {
        let Some(response) = &record.response else {
            return Ok(());
        };
        let ttl = ttl.max(Duration::from_millis(1));
        let value = codec::cached(record, &codec::encode_response(response), ttl);
        let mut command = redis::cmd("SET");
        command
            .arg(self.key_arg(CACHED, record.scope.as_str(), record.key.as_str()))
            .arg(value)
            .arg("PX")
            .arg(codec::millis(ttl));
        self.query(&command).await?;
        Ok(())
    }

    /// Announces that a record changed (tiered store), waking waiters in
    /// every process.
    async fn announce(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("PUBLISH");
        command
            .arg(&*self.channel)
            .arg(self.key_arg(RECORDS, scope, key));
        self.query(&command).await?;
        Ok(())
    }

    /// Deletes the cached copy of a record (tiered store), if any.
    async fn cache_forget(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("DEL");
        command.arg(self.key_arg(CACHED, scope, key));
        self.query(&command).await?;
        Ok(())
    }
}

/// The tiered store's cache: completed records under their own keys.
impl RecordCache for RedisRecords {
    async fn get_completed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<Record>, StoreError> {
        self.cache_get(scope, key).await
    }

    async fn put_completed(&self, record: &Record, ttl: Duration) -> Result<(), StoreError> {
        self.cache_put(record, ttl).await
    }

    async fn forget(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        self.cache_forget(scope, key).await
    }

    async fn announce(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        RedisRecords::announce(self, scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        Store::events(self)
    }
}
