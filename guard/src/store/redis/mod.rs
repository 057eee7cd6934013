//! The Redis store: one Redis or Valkey, or a Redis Cluster.
//!
//! Each record is one string value (its layout, and how its times are
//! measured on the server's clock, are in `store/redis/codec.rs`), at a key
//! that encodes the scope with a length prefix (`<prefix>:r:<scope
//! length>:<scope>:<key>`), so no scope or key can collide with another's
//! or reach outside the store's prefix. A claim is one native command,
//! `SET key <in flight> NX PX <retention> GET`, with `PTTL` in the same
//! round trip: no answer means acquired; the old value otherwise, which
//! decides replay, conflict or in flight. Completion, renewal, release and
//! take-over are fenced by the lease token: small Lua scripts
//! (`store/redis/lua/`), or, for completions where the server has it
//! (Valkey 8.1, Redis 8.4; detected when the store connects), the native
//! `SET … IFEQ <the claim's value> KEEPTTL`. Retention is native expiry, so
//! [`Purge::purge`] has nothing to do. Records of release 1 (one hash per
//! record, `store/redis/legacy.rs`) are read and taken over as before.
//!
//! Completions, releases and abandonments of *watched* records are
//! published on `<prefix>:events`; every store subscribes, so a request
//! waiting for an in-flight key in one process is woken by its completion
//! in another. A waiter reads the record after it subscribes and before it
//! waits, and that read (`lua/get.lua`) marks an in-flight record watched
//! (a byte of the value), atomically with the read: an end before the read
//! is seen by the read, an end after it is published. A record nobody read
//! while it ran (every fresh key without a concurrent duplicate) ends
//! without a message, so no process receives one per request.
//!
//! Each claim and completion goes from the caller's task straight onto the
//! multiplexed connection, which already writes the commands of concurrent
//! requests together ([`DEFAULT_BATCHING`] is off: a batch worker on the
//! request path cost more server CPU and context switches than it saved
//! Redis, docs/BENCHMARKS.md). A store that wants group commit anyway
//! turns it on with [`Batched::with_batching`] ([`PIPELINED_BATCHING`]):
//! the claims that queue while one pipeline is on its way then go
//! together in the next (one `SET … NX GET` and `PTTL` per key, answered
//! per key), completions likewise. On a cluster such a batch goes as one
//! pipeline per primary, each key's slot computed here and placed by a map
//! of the cluster's slots (`store/redis/slots.rs`); a key that moved
//! meanwhile answers `MOVED` and is sent again on its own.
//!
//! Durability is Redis's: with `appendonly yes` and `appendfsync always` a
//! crash loses nothing; with the defaults, a Redis crash can forget records,
//! and a retry of a forgotten key runs again.
//!
//! Replication is asynchronous: a primary that dies right after answering a
//! claim may take it along, and the replica promoted in its place lets the
//! retry run the work again. [`RedisStore::with_replica_acks`] makes every
//! claim, take-over and completion wait for replicas (`WAIT`) and fail
//! closed when too few acknowledge it (`store/redis/replicas.rs`; what it
//! still cannot promise is in docs/GUARANTEES.md).
//!
//! The folder, a file per role (each with its tests): this file holds the
//! store's types, its builders, the record keys and [`Store`];
//! `connection.rs` the connection (one Redis or a cluster), how a command
//! or script is sent, the slot map's refresh and the event subscriber;
//! `claim.rs` the claim and completion of one record; `batch.rs` the
//! pipelines of [`BatchedStore`](crate::store::BatchedStore); `admin.rs`
//! the operators' listing and forgetting
//! ([`AdminStore`](crate::store::AdminStore)); `cache.rs` the tiered
//! store's side ([`RecordCache`](crate::store::RecordCache)); `replicas.rs`
//! the `WAIT` behind each write; `scripts.rs` the Lua scripts
//! (`lua/*.lua`); `codec.rs` the record's layout; `call.rs` how a script
//! call or a record key is written; `claimed.rs` the values `IFEQ`
//! compares; `slots.rs` the cluster's slot map; `legacy.rs` release 1's
//! records.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManagerConfig;

mod admin;
mod batch;
mod cache;
mod call;
mod claim;
mod claimed;
mod codec;
mod connection;
mod legacy;
mod replicas;
mod scripts;
mod slots;

use call::{RecordKey, ScriptCall};
use claimed::ClaimedValues;
use connection::{CONNECTION_TIMEOUT, Connection, RESPONSE_TIMEOUT, Subscriber, forward_events};
use replicas::ReplicaAcks;
use scripts::{GET, RECORD_REQUEST, RECORD_STEPS, RELEASE, RENEW, TAKE_OVER};
use slots::SlotMap;

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{CorruptRecord, LeaseToken, Record, Step, StoredResponse};
use crate::store::batch::{BatchLimits, Batched};
use crate::store::{Claim, Lease, NewRecord, Purge, Store, StoreError};

/// The default batching on Redis: none. Each claim and completion goes
/// from the caller's task onto the multiplexed connection, which pipelines
/// concurrent requests' commands by itself; a batch worker in between
/// cost 25–35 % of fresh-key throughput on two cores (issue 40's A/B in
/// docs/BENCHMARKS.md).
pub const DEFAULT_BATCHING: BatchLimits = BatchLimits::OFF;

/// Group commit on Redis, for a store that turns it on
/// ([`Batched::with_batching`]): up to 64 claims (or completions) per
/// pipeline, two pipelines of each on their way at once. It saves Redis
/// CPU (one pipeline's bookkeeping for many commands) at the cost of the
/// server's (a hand-off to the batch worker and back).
pub const PIPELINED_BATCHING: BatchLimits = BatchLimits {
    max_batch: 64,
    max_in_flight: 2,
};

/// Whether a server error is Redis's `WRONGTYPE`: the key holds a hash, a
/// record of release 1.
fn wrong_type(error: &redis::ServerError) -> bool {
    error.code() == "WRONGTYPE"
}

/// A server error answered inside a pipeline, as a store error.
fn server_error(error: &redis::ServerError) -> StoreError {
    redis::RedisError::from(error.clone()).into()
}

/// Records in Redis or Redis Cluster: [`RedisRecords`] wrapped in
/// [`Batched`], with batching off unless turned on ([`DEFAULT_BATCHING`],
/// [`PIPELINED_BATCHING`]).
pub type RedisStore = Batched<RedisRecords>;

/// Records in Redis or Redis Cluster, each call on its own: the store that
/// [`RedisStore`] batches.
#[derive(Clone)]
pub struct RedisRecords {
    connection: Connection,
    prefix: Arc<str>,
    channel: Arc<str>,
    events: RecordEvents,
    _subscriber: Arc<Subscriber>,
    /// `WAIT` after every write that decides a run (off: `None`).
    replica_acks: Option<ReplicaAcks>,
    /// Whether completions go as native `SET … IFEQ` (the server has it
    /// and [`RedisStore::with_native_fence`] did not turn it off).
    native_fence: bool,
    /// The in-flight values this store's claims wrote, for `IFEQ`.
    claimed: Arc<ClaimedValues>,
    /// On a cluster, which primary serves which slot (batches go as one
    /// pipeline per primary); `None` on one Redis.
    slots: Option<Arc<SlotMap>>,
}

impl std::fmt::Debug for RedisRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisRecords")
            .field("kind", &kind)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> Self {
        Self::Unavailable(Box::new(error))
    }
}

impl RedisStore {
    /// Connects to one Redis (`redis://host:port/db`), keeping records under
    /// `prefix` (for example `idem`). The connection reconnects by itself.
    /// Its commands carry no timeout of their own: the engine bounds each
    /// call with its store timeout, and a caller of its own bounds its
    /// calls (see [`Store`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or Redis cannot
    /// be reached; [`StoreError::Timeout`] when it does not answer the
    /// store's probe within 2 s.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        // No timer per command (redis-rs arms one by default): the engine
        // bounds each of its calls with its store timeout, and a caller of
        // its own bounds its calls (see `Store`).
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_number_of_retries(2);
        let manager = client.get_connection_manager_with_config(config).await?;
        RedisRecords::with_connection(Connection::Single(manager), client, prefix).await
    }

    /// Connects to a Redis Cluster through any of its nodes
    /// (`redis://host:port` each), keeping records under `prefix`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no node can be reached.
    pub async fn connect_cluster(urls: &[&str], prefix: &str) -> Result<Self, StoreError> {
        let first = urls
            .first()
            .ok_or(StoreError::Unsupported("a cluster without nodes"))?;
        let cluster = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .response_timeout(RESPONSE_TIMEOUT)
            .connection_timeout(CONNECTION_TIMEOUT)
            .retries(2)
            .build()?;
        let connection = cluster.get_async_connection().await?;
        // Classic pub/sub reaches every node of a cluster: one node will do.
        let subscriber = redis::Client::open(*first)?;
        RedisRecords::with_connection(Connection::Cluster(connection), subscriber, prefix).await
    }

    /// Completions as native `SET … IFEQ` when the server has it (the
    /// default, detected when the store connects), or always as a fenced
    /// script (`false`). Both are atomic and fenced by the lease token; the
    /// native command costs the server less than half the script's time.
    pub fn with_native_fence(self, on: bool) -> Self {
        self.map(|mut direct| {
            direct.native_fence = on && direct.native_fence;
            direct
        })
    }

    /// Whether completions go as native `SET … IFEQ`
    /// ([`RedisStore::with_native_fence`]).
    pub fn native_fence(&self) -> bool {
        self.direct().native_fence
    }

    /// Makes every claim, take-over and completion wait until `replicas`
    /// replicas have it (`WAIT`, sent behind the script on the same
    /// connection; on a cluster, to the primary of the record's hash
    /// slot), for at most `timeout` (clamped to 1 ms ..= 1 s). A claim that
    /// too few acknowledge fails with [`StoreError::NotReplicated`]: the
    /// engine releases it, fenced, and answers 503 `store-unavailable`;
    /// the work never runs on a claim a failover may lose. A completion
    /// that too few acknowledge has run: its caller gets the reply and the
    /// error is logged. `0` turns it off.
    ///
    /// The default value is off: on a single Redis there is no replica to
    /// wait for, and without one a `WAIT` for one fails every claim.
    ///
    /// Each write costs a round trip from the primary to its replicas
    /// (docs/BENCHMARKS.md). It closes the window of asynchronous
    /// replication only for the replicas that acknowledged: set
    /// `replicas` to every replica a failover may promote, or make the
    /// failover choose the most up-to-date one (Sentinel and Redis Cluster
    /// prefer it, but do not guarantee it), and mind that a replica
    /// acknowledges a write it holds in memory (docs/GUARANTEES.md).
    ///
    /// ```
    /// # async fn example() -> Result<(), idempotency_guard::store::StoreError> {
    /// use std::time::Duration;
    /// use idempotency_guard::store::redis::RedisStore;
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379", "idem")
    ///     .await?
    ///     .with_replica_acks(1, Duration::from_millis(100));
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_replica_acks(self, replicas: u32, timeout: Duration) -> Self {
        self.map(|mut direct| {
            direct.replica_acks = ReplicaAcks::new(replicas, timeout);
            direct
        })
    }
}

impl RedisRecords {
    async fn with_connection(
        connection: Connection,
        subscriber: redis::Client,
        prefix: &str,
    ) -> Result<RedisStore, StoreError> {
        let events = RecordEvents::new();
        let channel: Arc<str> = format!("{prefix}:events").into();
        let task = tokio::spawn(forward_events(
            subscriber,
            channel.clone(),
            prefix.into(),
            events.clone(),
        ));
        let mut store = Self {
            connection,
            prefix: prefix.into(),
            channel,
            events,
            _subscriber: Arc::new(Subscriber(task.abort_handle())),
            replica_acks: None,
            native_fence: false,
            claimed: Arc::new(ClaimedValues::default()),
            slots: None,
        };
        store.native_fence = store.has_ifeq().await?;
        if matches!(store.connection, Connection::Cluster(_)) {
            let slots = Arc::new(SlotMap::default());
            store.slots = Some(slots);
            store.refresh_slots().await;
        }
        Ok(Batched::wrap(store, DEFAULT_BATCHING))
    }

    /// A record's key, to write into a script call.
    fn key_arg<'a>(&'a self, namespace: &'a str, scope: &'a str, key: &'a str) -> RecordKey<'a> {
        RecordKey {
            prefix: &self.prefix,
            namespace,
            scope,
            key,
        }
    }

    async fn fenced(&self, call: &ScriptCall) -> Result<(), StoreError> {
        match self.invoke(call).await? {
            Value::Int(1) => Ok(()),
            _ => Err(StoreError::LeaseLost),
        }
    }
}

/// The namespace of records (`r`) and of the tiered store's cached
/// completed records (`c`).
const RECORDS: &str = "r";
const CACHED: &str = "c";

/// The scope and key of a record (or cache) key, if it is one of `prefix`.
fn parse_record_key(prefix: &str, raw: &[u8]) -> Option<(String, String)> {
    let rest = std::str::from_utf8(raw).ok()?.strip_prefix(prefix)?;
    let rest = rest
        .strip_prefix(":r:")
        .or_else(|| rest.strip_prefix(":c:"))?;
    let (length, rest) = rest.split_once(':')?;
    let length: usize = length.parse().ok()?;
    let scope = rest.get(..length)?;
    let key = rest.get(length..)?.strip_prefix(':')?;
    Some((scope.to_owned(), key.to_owned()))
}

fn int(value: &Value) -> Result<i64, CorruptRecord> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(CorruptRecord("a script returned a non-integer")),
    }
}

impl Store for RedisRecords {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.claim_alone(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        let at = self.key_arg(RECORDS, new.scope.as_str(), new.key.as_str());
        let value = codec::claim_value(new);
        let mut call = ScriptCall::new(&TAKE_OVER, 1, 120 + value.len());
        call.arg(&at)
            .arg(previous.as_uuid().as_bytes().as_slice())
            .arg(value.as_slice())
            .arg(codec::millis(new.retention).max(1));
        let sent_at = std::time::Instant::now();
        let (answer, acked) = self.invoke_acked(&call, &at).await?;
        if !matches!(answer, Value::Int(1)) {
            return Ok(None);
        }
        acked.replicated()?;
        if self.native_fence {
            self.claimed.remember(new.token, value, sent_at);
        }
        Ok(Some(new.lease()))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.complete_alone(lease, codec::encode_response(response))
            .await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        // The value changes (its lease end): completions go by script.
        self.claimed.take(lease.token);
        let mut call = ScriptCall::new(&RENEW, 1, 80);
        call.arg(self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str()))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(codec::millis(duration))
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        // The value changes (its packed request): completions go by script.
        self.claimed.take(lease.token);
        let at = self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str());
        let encoded = Step::encode_all(steps).unwrap_or_default();
        let mut call = ScriptCall::new(&RECORD_STEPS, 1, 80 + encoded.len());
        call.arg(&at)
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(encoded.as_slice());
        let (answer, acked) = self.invoke_acked(&call, &at).await?;
        if !matches!(answer, Value::Int(1)) {
            return Err(StoreError::LeaseLost);
        }
        acked.replicated()
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        // The value changes (its packed request): completions go by script.
        self.claimed.take(lease.token);
        let at = self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str());
        let encoded = request.map(StoredRequest::encode).unwrap_or_default();
        let mut call = ScriptCall::new(&RECORD_REQUEST, 1, 80 + encoded.len());
        call.arg(&at)
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(encoded.as_slice());
        let (answer, acked) = self.invoke_acked(&call, &at).await?;
        if !matches!(answer, Value::Int(1)) {
            return Err(StoreError::LeaseLost);
        }
        acked.replicated()
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.claimed.take(lease.token);
        let mut call = ScriptCall::new(&RELEASE, 1, 80);
        call.arg(self.key_arg(RECORDS, lease.scope.as_str(), lease.key.as_str()))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        let mut call = ScriptCall::new(&GET, 1, 64);
        call.arg(self.key_arg(RECORDS, scope.as_str(), key.as_str()));
        let shape = || CorruptRecord("the get script returned an unexpected shape");
        match self.invoke(&call).await? {
            Value::Array(reply) => match reply.as_slice() {
                [Value::Int(0)] => Ok(None),
                [Value::Int(2), Value::Int(left), Value::BulkString(value)] => Ok(Some(
                    codec::decode(scope, key, value, *left, time::OffsetDateTime::now_utc())?,
                )),
                [Value::Int(1), now, Value::BulkString(packed)] => {
                    legacy::record_from_packed(scope, key, packed, int(now)?)
                }
                _ => Err(shape().into()),
            },
            _ => Err(shape().into()),
        }
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        // One script per key, all in flight at once on the multiplexed
        // connection (on a cluster, the keys live in many slots).
        futures_util::future::try_join_all(keys.iter().map(|key| self.get(scope, key))).await
    }

    fn events(&self) -> &RecordEvents {
        &self.events
    }
}

impl Purge for RedisRecords {
    async fn purge(&self, _limit: u32) -> Result<u64, StoreError> {
        // Records expire natively at the end of their retention.
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_are_injective_and_parse_back() {
        let record_key = |prefix, namespace, scope, key| {
            RecordKey {
                prefix,
                namespace,
                scope,
                key,
            }
            .to_bytes()
        };
        let a = record_key("idem", RECORDS, "a:b", "c");
        let b = record_key("idem", RECORDS, "a", "b:c");
        assert_ne!(a, b);
        assert_eq!(a, b"idem:r:3:a:b:c");
        assert_eq!(
            parse_record_key("idem", &a),
            Some(("a:b".into(), "c".into()))
        );
        assert_eq!(
            parse_record_key("idem", &b),
            Some(("a".into(), "b:c".into()))
        );
        assert_eq!(parse_record_key("other", &a), None);
        assert_eq!(parse_record_key("idem", b"idem:r:99:short:k"), None);
        let braces = record_key("idem", CACHED, "{t}", "k}{");
        assert_eq!(
            parse_record_key("idem", &braces),
            Some(("{t}".into(), "k}{".into()))
        );
    }

    /// The raw value of a record, read with a plain command.
    pub(super) async fn raw(store: &RedisStore, scope: &str, key: &str) -> Vec<u8> {
        let mut command = redis::cmd("GET");
        command.arg(store.direct().key_arg(RECORDS, scope, key));
        match store.direct().query(&command).await.unwrap() {
            Value::BulkString(value) => value,
            other => panic!("no value: {other:?}"),
        }
    }

    /// Whether a server's `INFO server` names a release with `SET … IFEQ`:
    /// Valkey 8.1 or later, Redis 8.4 or later.
    pub(super) fn server_has_ifeq(info: &str) -> bool {
        let version = |field: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(field))
                .map(|version| {
                    let mut parts = version.trim().split('.').map(|n| n.parse::<u32>().unwrap());
                    (parts.next().unwrap(), parts.next().unwrap())
                })
        };
        match version("valkey_version:") {
            Some(valkey) => valkey >= (8, 1),
            None => version("redis_version:").expect("a redis_version") >= (8, 4),
        }
    }

    pub(super) async fn info(url: &str, section: &str) -> String {
        let client = redis::Client::open(url).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut connection)
            .await
            .unwrap()
    }

    /// How many scripts the server has run (`INFO commandstats`).
    pub(super) async fn script_calls(url: &str) -> u64 {
        info(url, "commandstats")
            .await
            .lines()
            .filter(|line| {
                [
                    "eval",
                    "evalsha",
                    "eval_ro",
                    "evalsha_ro",
                    "fcall",
                    "fcall_ro",
                ]
                .iter()
                .any(|name| line.starts_with(&format!("cmdstat_{name}:")))
            })
            .map(|line| {
                let calls = line.split("calls=").nth(1).unwrap();
                calls.split(',').next().unwrap().parse::<u64>().unwrap()
            })
            .sum()
    }

    pub(super) fn record<'a>(
        key: &'a str,
        fingerprint: &'a crate::fingerprint::Fingerprint,
        lease: Duration,
    ) -> NewRecord<'a> {
        NewRecord {
            scope: Scope::leaked("s"),
            key: IdempotencyKey::leaked(key),
            fingerprint,
            method: "POST",
            path: "/orders",
            token: LeaseToken::new(),
            lease,
            retention: Duration::from_secs(3600),
            transactional: false,
        }
    }
}
