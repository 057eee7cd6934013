//! The store's connection: one Redis (a connection manager that
//! reconnects by itself) or a Redis Cluster; how one command or script
//! call is sent (a script Redis does not know yet is loaded and sent
//! again); the cluster's slot map, read again after a redirection; and the
//! subscriber that turns the store's published events into wake-ups.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use super::call::ScriptCall;
use super::{RedisRecords, parse_record_key};
use crate::events::RecordEvents;
use crate::store::StoreError;

/// The connection: one Redis (reconnecting by itself), or a cluster.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Aborts the event subscriber when the last clone of the store is dropped.
pub(super) struct Subscriber(pub(super) tokio::task::AbortHandle);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a command the store sends on its own may take before it
/// fails: the probe when it connects, and every command on a cluster
/// (whose client routes by it). On one Redis the connection itself arms no
/// timer per command: each call the engine makes runs under its store
/// timeout already, and a second timer per command cost 2.5k instructions
/// per fresh request (docs/BENCHMARKS.md, issue 56).
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting may take.
pub(super) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

impl RedisRecords {
    /// Whether the server takes `SET … IFEQ` (Valkey 8.1, Redis 8.4): a
    /// probe on a key of the store's own that never exists, so it never
    /// writes; an older server answers a syntax error.
    pub(super) async fn has_ifeq(&self) -> Result<bool, StoreError> {
        tokio::time::timeout(RESPONSE_TIMEOUT, self.probe_ifeq())
            .await
            .map_err(|_| StoreError::Timeout(RESPONSE_TIMEOUT))?
    }

    async fn probe_ifeq(&self) -> Result<bool, StoreError> {
        let mut probe = redis::cmd("SET");
        probe
            .arg(format!("{}:probe:ifeq", self.prefix))
            .arg("")
            .arg("IFEQ")
            .arg("never")
            .arg("PX")
            .arg(1);
        match self.query(&probe).await {
            Ok(_) => Ok(true),
            Err(error)
                if error.kind()
                    == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                Ok(false)
            }
            Err(error) if error.code().is_some() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    pub(super) async fn invoke(&self, call: &ScriptCall) -> Result<Value, StoreError> {
        match self.query(call.command()).await {
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // Redis does not know the script yet (or forgot it: a
                // restart, `SCRIPT FLUSH`): load it and send the call again.
                self.load(call).await?;
                Ok(self.query(call.command()).await?)
            }
            answer => Ok(answer?),
        }
    }

    /// Loads a call's script into Redis (on a cluster: every primary).
    pub(super) async fn load(&self, call: &ScriptCall) -> redis::RedisResult<()> {
        match &self.connection {
            Connection::Single(connection) => {
                call.script().load_async(&mut connection.clone()).await?
            }
            Connection::Cluster(connection) => {
                call.script().load_async(&mut connection.clone()).await?
            }
        };
        Ok(())
    }

    /// Sends one command.
    pub(super) async fn query(&self, command: &redis::Cmd) -> redis::RedisResult<Value> {
        match &self.connection {
            // The manager's own method, not `Cmd::query_async`: that goes
            // through `ConnectionLike`, which boxes a future of about
            // 1.4 kB for every command.
            Connection::Single(connection) => connection
                .clone()
                .send_packed_command(command)
                .await?
                .extract_error(),
            Connection::Cluster(connection) => command.query_async(&mut connection.clone()).await,
        }
    }

    /// Reads the cluster's slot map again (`CLUSTER SLOTS`); on failure the
    /// old map stays (a stale one costs round trips, never a result).
    pub(super) async fn refresh_slots(&self) {
        let Some(slots) = &self.slots else { return };
        match self
            .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await
        {
            Ok(answer) => slots.update(&answer),
            Err(error) => tracing::debug!(%error, "CLUSTER SLOTS failed; the slot map stays"),
        }
    }

    /// The indices of `keys`, grouped per node that serves them: one group
    /// on one Redis, one per primary on a cluster.
    /// (`keys` is evaluated only on a cluster.)
    pub(super) fn groups(&self, keys: impl ExactSizeIterator<Item = Vec<u8>>) -> Vec<Vec<usize>> {
        match &self.slots {
            Some(slots) => slots.groups(keys),
            None if keys.len() == 0 => Vec::new(),
            None => vec![(0..keys.len()).collect()],
        }
    }
}

/// Forwards the store's published events into `events`, reconnecting after
/// failures, until aborted.
pub(super) async fn forward_events(
    client: redis::Client,
    channel: Arc<str>,
    prefix: Arc<str>,
    events: RecordEvents,
) {
    loop {
        if let Ok(mut pubsub) = client.get_async_pubsub().await
            && pubsub.subscribe(&*channel).await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                if let Some((scope, key)) = parse_record_key(&prefix, message.get_payload_bytes()) {
                    events.publish(&scope, &key);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::RedisStore;
    use super::super::tests::{info, server_has_ifeq};

    /// The probe finds `SET … IFEQ` on Valkey 8.1 and on Redis 8.4 or
    /// later, and not on older Redis (7.0 here); the switch turns it off.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_native_fence_is_found_where_the_server_has_it() {
        let prefix = format!("test-probe-{}", uuid::Uuid::new_v4().simple());
        let redis_url = idempotency_tests::fixtures::redis_url();
        let redis = RedisStore::connect(&redis_url, &prefix).await.unwrap();
        let server = info(&redis_url, "server").await;
        assert_eq!(redis.native_fence(), server_has_ifeq(&server), "{server}");
        let valkey_url = idempotency_tests::fixtures::valkey_url();
        let valkey = RedisStore::connect(&valkey_url, &prefix).await.unwrap();
        assert!(server_has_ifeq(&info(&valkey_url, "server").await));
        assert!(valkey.native_fence());
        assert!(!valkey.with_native_fence(false).native_fence());
    }
}
