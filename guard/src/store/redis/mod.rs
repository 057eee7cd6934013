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

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};

mod call;
mod claimed;
mod codec;
mod legacy;
mod replicas;
mod slots;

use call::{RecordKey, ScriptCall};
use claimed::ClaimedValues;
use replicas::{Acked, ReplicaAcks};
use slots::SlotMap;

use crate::record::CorruptRecord;
use crate::store::batch::{BatchLimits, Batched, BatchedStore, ClaimItem};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError};
use crate::{Record, RecordEvents, StoredResponse};

/// A script: the codec's positions (`codec::lua_layout`) first, then the
/// files under `store/redis/lua/`, in order (shared pieces first).
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| {
            let mut source = codec::lua_layout();
            $(source.push_str(include_str!(concat!("lua/", $file)));)+
            Script::new(&source)
        })
    };
}

static COMPLETE: LazyLock<Script> = script!("fence.lua", "complete.lua");
static RENEW: LazyLock<Script> = script!("fence.lua", "renew.lua");
static RELEASE: LazyLock<Script> = script!("fence.lua", "release.lua");
static GET: LazyLock<Script> = script!("legacy_pack.lua", "legacy.lua", "get.lua");
static TAKE_OVER: LazyLock<Script> = script!("legacy_pack.lua", "legacy.lua", "take_over.lua");
static ADMIN_FORGET: LazyLock<Script> =
    script!("legacy_pack.lua", "legacy.lua", "admin_forget.lua");

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

/// A completion waiting in a batch: the lease and the packed response.
type CompleteItem = (Lease, Vec<u8>);

/// Whether a server error is Redis's `WRONGTYPE`: the key holds a hash, a
/// record of release 1.
fn wrong_type(error: &redis::ServerError) -> bool {
    error.code() == "WRONGTYPE"
}

/// A server error answered inside a pipeline, as a store error.
fn server_error(error: &redis::ServerError) -> StoreError {
    redis::RedisError::from(error.clone()).into()
}

/// The connection: one Redis (reconnecting by itself), or a cluster.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Aborts the event subscriber when the last clone of the store is dropped.
struct Subscriber(tokio::task::AbortHandle);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.abort();
    }
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

/// How long one Redis command may take before it fails.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting may take.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(1);

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> Self {
        Self::Unavailable(Box::new(error))
    }
}

impl RedisStore {
    /// Connects to one Redis (`redis://host:port/db`), keeping records under
    /// `prefix` (for example `idem`). The connection reconnects by itself.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or Redis cannot be reached.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
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

    /// Whether the server takes `SET … IFEQ` (Valkey 8.1, Redis 8.4): a
    /// probe on a key of the store's own that never exists, so it never
    /// writes; an older server answers a syntax error.
    async fn has_ifeq(&self) -> Result<bool, StoreError> {
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

    async fn invoke(&self, call: &ScriptCall) -> Result<Value, StoreError> {
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
    async fn load(&self, call: &ScriptCall) -> redis::RedisResult<()> {
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
    async fn query(&self, command: &redis::Cmd) -> redis::RedisResult<Value> {
        match &self.connection {
            Connection::Single(connection) => command.query_async(&mut connection.clone()).await,
            Connection::Cluster(connection) => command.query_async(&mut connection.clone()).await,
        }
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

    /// Reads a cached completed record (tiered store): the value and its
    /// `PTTL`, native. A release 1 hash there reads as a miss (the
    /// PostgreSQL record behind it is the truth).
    async fn cache_get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let at = self.key_arg(CACHED, scope, key);
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
            .arg(self.key_arg(CACHED, &record.scope, &record.key))
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

    /// Reads the cluster's slot map again (`CLUSTER SLOTS`); on failure the
    /// old map stays (a stale one costs round trips, never a result).
    async fn refresh_slots(&self) {
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
    fn groups(&self, keys: impl ExactSizeIterator<Item = Vec<u8>>) -> Vec<Vec<usize>> {
        match &self.slots {
            Some(slots) => slots.groups(keys),
            None if keys.len() == 0 => Vec::new(),
            None => vec![(0..keys.len()).collect()],
        }
    }

    async fn fenced(&self, call: &ScriptCall) -> Result<(), StoreError> {
        match self.invoke(call).await? {
            Value::Int(1) => Ok(()),
            _ => Err(StoreError::LeaseLost),
        }
    }

    /// The claim's pipeline: `SET key <in flight> NX PX <retention> GET`,
    /// then `PTTL key`.
    fn claim_commands(
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
    fn ifeq_command(at: &RecordKey<'_>, done: &[u8], claimed: &[u8]) -> redis::Cmd {
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
    /// the claim and its read (the caller claims again).
    async fn claim_answer(
        &self,
        new: &NewRecord<'_>,
        value: Vec<u8>,
        sent_at: std::time::Instant,
        answers: &[Value],
        acked: &Acked,
    ) -> Result<Option<Claim>, StoreError> {
        match answers {
            [Value::Nil, _] => {
                acked.replicated()?;
                if self.native_fence {
                    self.claimed.remember(new.token, value, sent_at);
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
    async fn claim_alone(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
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
                .claim_answer(new, value.clone(), sent_at, &acked.values, &acked)
                .await?
            {
                return Ok(claim);
            }
        }
        Err(CorruptRecord("a release 1 record kept vanishing under its claim").into())
    }

    /// One completion on its own: native `IFEQ` when this store remembers
    /// the claim's value, else (or when the value changed) the script.
    async fn complete_alone(&self, lease: &Lease, response: Vec<u8>) -> Result<(), StoreError> {
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
        let mut call = ScriptCall::new(&COMPLETE, 1, 80 + response.len());
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

/// The namespace of records (`r`) and of the tiered store's cached
/// completed records (`c`).
const RECORDS: &str = "r";
const CACHED: &str = "c";

/// `n` in decimal, written at the end of `digits`.
fn decimal(n: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[at..]
}

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

/// Forwards the store's published events into `events`, reconnecting after
/// failures, until aborted.
async fn forward_events(
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

fn int(value: &Value) -> Result<i64, CorruptRecord> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(CorruptRecord("a script returned a non-integer")),
    }
}

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
            self.key_arg(RECORDS, new.scope, new.key).to_bytes()
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
            self.key_arg(RECORDS, &lease.scope, &lease.key)
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
            let request =
                codec::encode_request(new.fingerprint, new.transactional, new.method, new.path);
            let value = codec::in_flight(new.token, new.lease, new.retention, &request);
            Self::claim_commands(
                &mut pipe,
                &self.key_arg(RECORDS, new.scope, new.key),
                &value,
                new.retention,
            );
            values.push(value);
        }
        let first = items[group[0]].as_new();
        let sent_at = std::time::Instant::now();
        let acked = self
            .send(pipe, &self.key_arg(RECORDS, first.scope, first.key), true)
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
                    .claim_answer(&new, value, sent_at, answers, &acked)
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

impl Store for RedisRecords {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.claim_alone(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        let at = self.key_arg(RECORDS, new.scope, new.key);
        let request =
            codec::encode_request(new.fingerprint, new.transactional, new.method, new.path);
        let value = codec::in_flight(new.token, new.lease, new.retention, &request);
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
        call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(codec::millis(duration))
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.claimed.take(lease.token);
        let mut call = ScriptCall::new(&RELEASE, 1, 80);
        call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let mut call = ScriptCall::new(&GET, 1, 64);
        call.arg(self.key_arg(RECORDS, scope, key));
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
        scope: &str,
        keys: &[&str],
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

// ---------------------------------------------------------------------------
// Operators' operations (`AdminStore`): listing and forgetting records.
// ---------------------------------------------------------------------------

/// How many records a listing reads per round of scripts.
const ADMIN_READ_CHUNK: usize = 100;

/// Escapes the glob characters of `text` for `SCAN ... MATCH`.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl RedisRecords {
    /// Every Redis key matching `pattern`: `SCAN` on one Redis; on a
    /// cluster, `SCAN` on every primary in turn (the primaries named by
    /// `CLUSTER NODES`), never `KEYS`, so no node is blocked while it
    /// walks its keys.
    async fn admin_keys(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let scan = |cursor: u64| {
            let mut command = redis::cmd("SCAN");
            command
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            command
        };
        let shape = || CorruptRecord("SCAN returned an unexpected shape");
        let mut keys = Vec::new();
        match &self.connection {
            Connection::Single(connection) => {
                let mut connection = connection.clone();
                let mut cursor: u64 = 0;
                loop {
                    let (next, batch): (u64, Vec<Vec<u8>>) =
                        scan(cursor).query_async(&mut connection).await?;
                    keys.extend(batch);
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
            }
            Connection::Cluster(connection) => {
                let mut connection = connection.clone();
                let mut nodes = redis::cmd("CLUSTER");
                nodes.arg("NODES");
                let nodes: String = redis::from_redis_value(
                    connection
                        .route_command(
                            nodes,
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                        )
                        .await?,
                )
                .map_err(|_| CorruptRecord("CLUSTER NODES returned an unexpected shape"))?;
                for (host, port) in primaries(&nodes) {
                    let mut cursor: u64 = 0;
                    loop {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let (next, batch): (u64, Vec<Vec<u8>>) = redis::from_redis_value(
                            connection.route_command(scan(cursor), route).await?,
                        )
                        .map_err(|_| shape())?;
                        keys.extend(batch);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(keys)
            }
        }
    }
}

/// The addresses of the live primaries in a `CLUSTER NODES` answer (one
/// line per node: id, `host:port@bus-port`, flags, …).
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_id, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|flag| flag.starts_with("fail")) {
                return None;
            }
            let address = address.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

impl RedisRecords {
    /// Deletes the cached copy of a record (tiered store), if any.
    async fn cache_forget(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("DEL");
        command.arg(self.key_arg(CACHED, scope, key));
        self.query(&command).await?;
        Ok(())
    }
}

/// The tiered store's cache: completed records under their own keys.
impl crate::store::tiered::RecordCache for RedisRecords {
    async fn get_completed(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
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

impl crate::store::admin::AdminStore for RedisRecords {
    async fn list(
        &self,
        scope: &str,
        filter: crate::store::admin::StateFilter,
        page: crate::store::admin::PageRequest<'_>,
    ) -> Result<crate::store::admin::Page, StoreError> {
        let limit = page.clamped_limit();
        let wanted = usize::try_from(limit).unwrap_or(usize::MAX) + 1;
        let pattern = format!(
            "{}:{RECORDS}:{}:{}:*",
            glob_escape(&self.prefix),
            scope.len(),
            glob_escape(scope)
        );
        let mut keys: Vec<String> = self
            .admin_keys(&pattern)
            .await?
            .iter()
            .filter_map(|raw| parse_record_key(&self.prefix, raw))
            .filter(|(found_scope, key)| {
                found_scope == scope && page.after.is_none_or(|after| key.as_str() > after)
            })
            .map(|(_, key)| key)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut records = Vec::new();
        for chunk in keys.chunks(ADMIN_READ_CHUNK) {
            let read =
                futures_util::future::try_join_all(chunk.iter().map(|key| self.get(scope, key)))
                    .await?;
            records.extend(read.into_iter().flatten().filter(|r| filter.accepts(r)));
            if records.len() >= wanted {
                break;
            }
        }
        Ok(crate::store::admin::Page::from_overfetch(records, limit))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: crate::store::admin::ForgetRule,
    ) -> Result<crate::store::admin::Forgotten, StoreError> {
        use crate::RecordState;
        use crate::store::admin::Forgotten;
        let flag = |state| if rule.allows(state) { "1" } else { "0" };
        let mut call = ScriptCall::new(&ADMIN_FORGET, 1, 80);
        call.arg(self.key_arg(RECORDS, scope, key))
            .arg(flag(RecordState::Completed))
            .arg(flag(RecordState::Abandoned))
            .arg(&*self.channel);
        let reply: (i64, String) = redis::from_redis_value(self.invoke(&call).await?)
            .map_err(|_| CorruptRecord("the forget script returned an unexpected shape"))?;
        let state = match reply.1.as_str() {
            "c" => RecordState::Completed,
            "a" => RecordState::Abandoned,
            _ => RecordState::InFlight,
        };
        match reply.0 {
            0 => Ok(Forgotten::Missing),
            1 => {
                // Other processes hear of it by pub/sub; this one at once
                // (its replay cache must not answer for the deleted record
                // while the message is on its way back).
                self.events.publish(scope, key);
                Ok(Forgotten::Deleted(state))
            }
            2 => Ok(Forgotten::Refused(state)),
            _ => Err(CorruptRecord("the forget script returned an unexpected shape").into()),
        }
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

    #[test]
    fn cluster_nodes_name_their_live_primaries() {
        let nodes = "a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922\n\
                     c3 127.0.0.1:7104@17104 slave a1 0 0 1 connected\n\
                     d4 10.0.0.9:7103@17103 master,fail - 0 0 3 disconnected\n";
        assert_eq!(
            primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 7101),
                ("127.0.0.1".to_owned(), 7102)
            ]
        );
    }

    /// The raw value of a record, read with a plain command.
    async fn raw(store: &RedisStore, scope: &str, key: &str) -> Vec<u8> {
        let mut command = redis::cmd("GET");
        command.arg(store.direct().key_arg(RECORDS, scope, key));
        match store.direct().query(&command).await.unwrap() {
            Value::BulkString(value) => value,
            other => panic!("no value: {other:?}"),
        }
    }

    /// The scripts write what the codec reads, byte for byte: a claim's
    /// value, a renewal's lease end, a reader's watched mark and a
    /// scripted completion are exactly the values `codec` builds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_redis_scripts_write_the_codec_layout() {
        let url = idempotency_tests::fixtures::redis_url();
        let prefix = format!("test-codec-{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, &prefix)
            .await
            .unwrap()
            .with_native_fence(false);
        let fingerprint = crate::Fingerprint::from_bytes([3; 32]);
        let new = NewRecord {
            scope: "s",
            key: "k",
            fingerprint: &fingerprint,
            method: "POST",
            path: "/orders?x=1",
            token: LeaseToken::new(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            transactional: false,
        };
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        let request = codec::encode_request(&fingerprint, false, "POST", "/orders?x=1");
        let claimed = raw(&store, "s", "k").await;
        assert_eq!(
            claimed,
            codec::in_flight(new.token, new.lease, new.retention, &request)
        );

        store.renew(&lease, Duration::from_secs(120)).await.unwrap();
        let renewed = raw(&store, "s", "k").await;
        let view = codec::View::parse(&renewed).unwrap();
        assert!(
            (120_000..125_000).contains(&view.lease_end),
            "{}",
            view.lease_end
        );
        assert_eq!(renewed[..28], claimed[..28]);
        assert_eq!(renewed[36..], claimed[36..]);

        let read = store.get("s", "k").await.unwrap().unwrap();
        assert_eq!(read.state(), crate::RecordState::InFlight);
        let watched = raw(&store, "s", "k").await;
        assert!(codec::View::parse(&watched).unwrap().watched);
        assert_eq!(watched[..3], renewed[..3]);
        assert_eq!(watched[4..], renewed[4..]);

        let response = StoredResponse::from_bytes("done");
        store.complete(&lease, &response).await.unwrap();
        let completed = raw(&store, "s", "k").await;
        let view = codec::View::parse(&completed).unwrap();
        assert_eq!(view.state, codec::COMPLETED);
        assert!(view.completion < 5_000, "{}", view.completion);
        assert_eq!(
            completed,
            codec::completed(
                &renewed,
                Duration::from_millis(view.completion),
                &codec::encode_response(&response)
            )
            .unwrap()
        );
        let record = store.get("s", "k").await.unwrap().unwrap();
        assert_eq!(record.response, Some(response));
        let mut del = redis::cmd("DEL");
        del.arg(store.direct().key_arg(RECORDS, "s", "k"));
        store.direct().query(&del).await.unwrap();
    }

    /// Whether a server's `INFO server` names a release with `SET … IFEQ`:
    /// Valkey 8.1 or later, Redis 8.4 or later.
    fn server_has_ifeq(info: &str) -> bool {
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

    async fn info(url: &str, section: &str) -> String {
        let client = redis::Client::open(url).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut connection)
            .await
            .unwrap()
    }

    /// How many scripts the server has run (`INFO commandstats`).
    async fn script_calls(url: &str) -> u64 {
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

    fn record<'a>(
        key: &'a str,
        fingerprint: &'a crate::Fingerprint,
        lease: Duration,
    ) -> NewRecord<'a> {
        NewRecord {
            scope: "s",
            key,
            fingerprint,
            method: "POST",
            path: "/orders",
            token: LeaseToken::new(),
            lease,
            retention: Duration::from_secs(3600),
            transactional: false,
        }
    }

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
        let fingerprint = crate::Fingerprint::from_bytes([3; 32]);
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
        let fingerprint = crate::Fingerprint::from_bytes([5; 32]);
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
        assert_eq!(read.state(), crate::RecordState::InFlight);
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
        let fingerprint = crate::Fingerprint::from_bytes([9; 32]);
        for keys in [1, 40] {
            let names: Vec<String> = (0..keys).map(|k| format!("k{keys}-{k}")).collect();
            let records: Vec<NewRecord<'_>> = (0..200)
                .map(|i| record(&names[i % keys], &fingerprint, Duration::from_secs(30)))
                .collect();
            let items: Vec<ClaimItem> = records.iter().map(ClaimItem::new).collect();
            let groups = store.direct().groups(items.iter().map(|item| {
                store
                    .direct()
                    .key_arg(RECORDS, &item.scope, &item.key)
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
                    assert_eq!(existing.state(), crate::RecordState::InFlight);
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
