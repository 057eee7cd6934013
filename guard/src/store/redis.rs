//! The Redis store: one Redis, or a Redis Cluster.
//!
//! Each record is one hash, at a key that encodes the scope with a length
//! prefix (`<prefix>:r:<scope length>:<scope>:<key>`), so no scope or key can
//! collide with another's or reach outside the store's prefix. Every
//! operation is one Lua script on that single key: atomic on one Redis, and
//! on a cluster within the key's one hash slot. Times come from the server's
//! own clock (`TIME`), retention from native expiry (`PEXPIREAT`), so
//! [`Purge::purge`] has nothing to do. The scripts live in
//! `store/redis/*.lua`.
//!
//! Completions, releases and abandonments of *watched* records are
//! published on `<prefix>:events`; every store subscribes, so a request
//! waiting for an in-flight key in one process is woken by its completion
//! in another. A waiter reads the record after it subscribes and before it
//! waits, and that read (`get.lua`) marks an in-flight record watched
//! (field `w`), atomically with the read: an end before the read is seen
//! by the read, an end after it is published. A record nobody read while it
//! ran (every fresh key without a concurrent duplicate) ends without a
//! message, so no process receives one per request.
//!
//! Claims and completions of concurrent requests are batched on one Redis
//! ([`crate::store::batch`]): the claims that queue while one script call
//! is on its way go together in the next (`claim_batch.lua`, one answer per
//! key), completions likewise (`complete_batch.lua`, fenced per key). On a
//! cluster, a script may only touch one hash slot, so each claim there is a
//! script of its own. [`RedisStore::with_batching`] tunes or turns it off.
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
use time::OffsetDateTime;

mod call;
mod replicas;

use call::{RecordKey, ScriptCall};
use replicas::ReplicaAcks;

use crate::record::CorruptRecord;
use crate::store::batch::{BatchLimits, BatchStats, BatchedStore, Batches, ClaimItem};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError};
use crate::{Fingerprint, Record, RecordEvents, StoredResponse};

/// The fields of a record's hash, one letter each (Redis keeps and sends
/// every name with every value): `t` lease token, `s` state (`f` in
/// flight, `c` completed), `l` lease end, `e` expiry, `n` creation (Unix
/// ms, the server's clock), `m` the request (fingerprint, transactional
/// flag, method and path, packed by [`encode_request`]), `p` the response
/// (packed by [`encode_response`]) and `c` completion time, once completed.
/// A record may also hold `w` (watched: its end is published), which is not
/// part of the record.
const FIELDS: [&str; 8] = ["t", "s", "l", "e", "n", "m", "p", "c"];

/// A script assembled from the files under `store/redis/`, in order (the
/// shared pieces first: the clock, the fence, the record writer).
macro_rules! script {
    ($($file:literal),+) => {
        LazyLock::new(|| Script::new(concat!($(include_str!(concat!("redis/", $file))),+)))
    };
}

static CLAIM: LazyLock<Script> = script!("now.lua", "write_new.lua", "pack.lua", "claim.lua");
static TAKE_OVER: LazyLock<Script> = script!("now.lua", "write_new.lua", "take_over.lua");
static COMPLETE: LazyLock<Script> = script!("fence.lua", "now.lua", "complete.lua");
static RENEW: LazyLock<Script> = script!("fence.lua", "now.lua", "renew.lua");
static RELEASE: LazyLock<Script> = script!("fence.lua", "release.lua");
static GET: LazyLock<Script> = script!("now.lua", "get.lua");
static CACHE_PUT: LazyLock<Script> = script!("cache_put.lua");
static CLAIM_BATCH: LazyLock<Script> =
    script!("now.lua", "write_new.lua", "pack.lua", "claim_batch.lua");
static COMPLETE_BATCH: LazyLock<Script> = script!("now.lua", "complete_batch.lua");

/// The default batching on one Redis: up to 64 claims (or completions)
/// per script call, two calls of each on their way at once.
pub const DEFAULT_BATCHING: BatchLimits = BatchLimits {
    max_batch: 64,
    max_in_flight: 2,
};

/// A completion waiting in a batch: the lease and the packed response.
type CompleteItem = (Lease, Vec<u8>);

/// Packs the immutable part of a record: fingerprint (32 bytes), the
/// transactional flag (1), the method's length (1), the method, the path.
fn encode_request(
    fingerprint: &Fingerprint,
    transactional: bool,
    method: &str,
    path: &str,
) -> Vec<u8> {
    let method = &method.as_bytes()[..method.len().min(255)];
    let mut packed = Vec::with_capacity(34 + method.len() + path.len());
    packed.extend_from_slice(fingerprint.as_bytes());
    packed.push(u8::from(transactional));
    packed.push(u8::try_from(method.len()).unwrap_or(u8::MAX));
    packed.extend_from_slice(method);
    packed.extend_from_slice(path.as_bytes());
    packed
}

/// The fingerprint, transactional flag, method and path of a packed request.
fn decode_request(packed: &[u8]) -> Result<(Fingerprint, bool, String, String), CorruptRecord> {
    let corrupt = CorruptRecord("the packed request is invalid");
    let fingerprint: [u8; 32] = packed
        .get(..32)
        .and_then(|f| f.try_into().ok())
        .ok_or(corrupt)?;
    let transactional = *packed.get(32).ok_or(corrupt)? == 1;
    let method_len = usize::from(*packed.get(33).ok_or(corrupt)?);
    let method = packed.get(34..34 + method_len).ok_or(corrupt)?;
    let path = packed.get(34 + method_len..).ok_or(corrupt)?;
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| corrupt);
    Ok((
        Fingerprint::from_bytes(fingerprint),
        transactional,
        text(method)?,
        text(path)?,
    ))
}

/// Packs a response: status (2 bytes, big-endian), whether the body is
/// stored (1), the headers' length (4), the headers, the body.
fn encode_response(response: &StoredResponse) -> Vec<u8> {
    let headers = response.encode_headers();
    let body = response.body.as_deref().unwrap_or_default();
    let mut packed = Vec::with_capacity(7 + headers.len() + body.len());
    packed.extend_from_slice(&response.status.as_u16().to_be_bytes());
    packed.push(u8::from(response.body.is_some()));
    packed.extend_from_slice(
        &u32::try_from(headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    packed.extend_from_slice(&headers);
    packed.extend_from_slice(body);
    packed
}

fn decode_response(packed: &[u8]) -> Result<StoredResponse, CorruptRecord> {
    let corrupt = CorruptRecord("the packed response is invalid");
    let status = u16::from_be_bytes(
        packed
            .get(..2)
            .and_then(|b| b.try_into().ok())
            .ok_or(corrupt)?,
    );
    let stored = *packed.get(2).ok_or(corrupt)? == 1;
    let headers_len = u32::from_be_bytes(
        packed
            .get(3..7)
            .and_then(|b| b.try_into().ok())
            .ok_or(corrupt)?,
    );
    let headers_end = 7 + usize::try_from(headers_len).map_err(|_| corrupt)?;
    let headers = packed.get(7..headers_end).ok_or(corrupt)?;
    let body = packed.get(headers_end..).ok_or(corrupt)?;
    let body = stored.then(|| bytes::Bytes::copy_from_slice(body));
    StoredResponse::decode(i64::from(status), headers, body)
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

/// Records in Redis or Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: Arc<str>,
    channel: Arc<str>,
    events: RecordEvents,
    _subscriber: Arc<Subscriber>,
    batches: Option<Arc<Batches<CompleteItem>>>,
    /// `WAIT` after every write that decides a run (off: `None`).
    replica_acks: Option<ReplicaAcks>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
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
        Ok(Self::with_connection(
            Connection::Single(manager),
            client,
            prefix,
        ))
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
        Ok(Self::with_connection(
            Connection::Cluster(connection),
            subscriber,
            prefix,
        ))
    }

    fn with_connection(connection: Connection, subscriber: redis::Client, prefix: &str) -> Self {
        let events = RecordEvents::new();
        let channel: Arc<str> = format!("{prefix}:events").into();
        let task = tokio::spawn(forward_events(
            subscriber,
            channel.clone(),
            prefix.into(),
            events.clone(),
        ));
        Self {
            connection,
            prefix: prefix.into(),
            channel,
            events,
            _subscriber: Arc::new(Subscriber(task.abort_handle())),
            batches: None,
            replica_acks: None,
        }
        .with_batching(DEFAULT_BATCHING)
    }

    /// Sets how concurrent claims and completions are batched on one
    /// Redis; [`BatchLimits::OFF`] sends each as a script call of its own.
    /// A cluster never batches (a script touches one hash slot).
    pub fn with_batching(mut self, limits: BatchLimits) -> Self {
        self.batches = None;
        if limits.enabled() && matches!(self.connection, Connection::Single(_)) {
            let batches = Batches::new(self.clone(), limits);
            self.batches = Some(Arc::new(batches));
        }
        self
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
    pub fn with_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = ReplicaAcks::new(replicas, timeout);
        // The batchers hold a copy of the store: give them this setting too.
        match self.batches.as_ref().map(|batches| batches.limits()) {
            Some(limits) => self.with_batching(limits),
            None => self,
        }
    }

    /// How many batches (and claims and completions in them) this store
    /// has sent.
    pub fn batch_stats(&self) -> BatchStats {
        self.batches
            .as_ref()
            .map(|batches| batches.stats())
            .unwrap_or_default()
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

    /// Reads a cached completed record (tiered store).
    pub(crate) async fn cache_get(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<Record>, StoreError> {
        let mut call = ScriptCall::new(&GET, 1, 64);
        call.arg(self.key_arg(CACHED, scope, key));
        match self.invoke(&call).await? {
            Value::Array(reply) if reply.len() == 2 => {
                record_from_fields(scope, key, &reply[1], int(&reply[0])?)
            }
            _ => Err(CorruptRecord("the get script returned an unexpected shape").into()),
        }
    }

    /// Caches a completed record for `ttl` (tiered store).
    pub(crate) async fn cache_put(&self, record: &Record, ttl: Duration) -> Result<(), StoreError> {
        let Some(response) = &record.response else {
            return Ok(());
        };
        let millis_of = |at: OffsetDateTime| {
            i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
        };
        let mut call = ScriptCall::new(&CACHE_PUT, 1, 256);
        call.arg(self.key_arg(CACHED, &record.scope, &record.key))
            .arg(millis(ttl).max(1))
            .arg("t")
            .arg(record.lease_token.as_uuid().as_bytes().as_slice())
            .arg("s")
            .arg("c")
            .arg("l")
            .arg(millis_of(record.lease_expires_at))
            .arg("e")
            .arg(millis_of(record.expires_at))
            .arg("n")
            .arg(millis_of(record.created_at))
            .arg("m")
            .arg(encode_request(
                &record.fingerprint,
                record.transactional,
                &record.method,
                &record.path,
            ))
            .arg("p")
            .arg(encode_response(response))
            .arg("c")
            .arg(millis_of(record.completed_at.unwrap_or(record.observed_at)));
        self.invoke(&call).await.map(drop)
    }

    /// Announces that a record changed (tiered store), waking waiters in
    /// every process.
    pub(crate) async fn announce(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("PUBLISH");
        command
            .arg(&*self.channel)
            .arg(self.key_arg(RECORDS, scope, key));
        self.query(&command).await?;
        Ok(())
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

/// `<prefix>:<namespace>:<scope length>:<scope>:<key>`: the length prefix
/// makes the encoding injective, so scope `a:b` with key `c` never meets
/// scope `a` with key `b:c`. Commands write it with [`RecordKey`], without
/// building it first; this builds the same bytes, for the tests.
#[cfg(test)]
fn record_key(prefix: &str, namespace: &str, scope: &str, key: &str) -> Vec<u8> {
    // Built by hand: `format!` costs more than the rest of a claim's
    // encoding, and this runs for every store call.
    let mut out = Vec::with_capacity(prefix.len() + namespace.len() + scope.len() + key.len() + 24);
    for part in [prefix.as_bytes(), b":", namespace.as_bytes(), b":"] {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(decimal(scope.len(), &mut [0; 20]));
    for part in [b":".as_slice(), scope.as_bytes(), b":", key.as_bytes()] {
        out.extend_from_slice(part);
    }
    out
}

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

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn from_millis(millis: i64) -> Result<OffsetDateTime, CorruptRecord> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000)
        .map_err(|_| CorruptRecord("a stored time is out of range"))
}

fn int(value: &Value) -> Result<i64, CorruptRecord> {
    match value {
        Value::Int(n) => Ok(*n),
        _ => Err(CorruptRecord("a script returned a non-integer")),
    }
}

/// A record from the values of [`FIELDS`] (`HMGET`), read at `now` (the
/// server's clock); `None` when the record does not exist.
fn record_from_fields(
    scope: &str,
    key: &str,
    fields: &Value,
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let Value::Array(values) = fields else {
        return Err(CorruptRecord("HMGET did not return an array").into());
    };
    let mut fields = [None; FIELDS.len()];
    for (field, value) in fields.iter_mut().zip(values) {
        if let Value::BulkString(bytes) = value {
            *field = Some(bytes.as_slice());
        }
    }
    record_from(scope, key, &fields, now)
}

/// The integer written in decimal in `bytes` (an optional `-`, then
/// digits), as Redis sends numbers; `None` for anything else or on
/// overflow. Parsed from the bytes directly: through `str::from_utf8` and
/// `parse`, a replay's eight numbers cost about a thousand instructions.
fn decimal_value(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = i64::from(byte.checked_sub(b'0').filter(|digit| *digit < 10)?);
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// A missing field's length in a packed record.
const MISSING: u32 = u32::MAX;

/// A record from the fields packed by `pack.lua` (the eight lengths as
/// 4-byte big-endian numbers, [`MISSING`] for a missing field, then the
/// present fields' bytes in order), read at `now`; `None` when the record
/// does not exist.
fn record_from_packed(
    scope: &str,
    key: &str,
    packed: &[u8],
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let corrupt = CorruptRecord("the packed record is invalid");
    let (lengths, mut values) = packed.split_at_checked(4 * FIELDS.len()).ok_or(corrupt)?;
    let mut fields = [None; FIELDS.len()];
    for (field, length) in fields.iter_mut().zip(lengths.chunks_exact(4)) {
        let length = u32::from_be_bytes(length.try_into().map_err(|_| corrupt)?);
        if length == MISSING {
            continue;
        }
        let length = usize::try_from(length).map_err(|_| corrupt)?;
        let (value, rest) = values.split_at_checked(length).ok_or(corrupt)?;
        *field = Some(value);
        values = rest;
    }
    if !values.is_empty() {
        return Err(corrupt.into());
    }
    record_from(scope, key, &fields, now)
}

/// A record from the values of [`FIELDS`], in order; `None` when the record
/// does not exist (no lease token).
fn record_from(
    scope: &str,
    key: &str,
    fields: &[Option<&[u8]>; FIELDS.len()],
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let field = |name: &str| -> Option<&[u8]> {
        let index = FIELDS.iter().position(|f| *f == name)?;
        fields[index]
    };
    let Some(token) = field("t") else {
        return Ok(None);
    };
    let missing = CorruptRecord("a record field is missing");
    let number = |name: &str| -> Result<i64, CorruptRecord> {
        decimal_value(field(name).ok_or(missing)?).ok_or(CorruptRecord("a number field is invalid"))
    };
    let token = uuid::Uuid::from_slice(token)
        .map_err(|_| CorruptRecord("the lease token is not 16 bytes"))?;
    let (fingerprint, transactional, method, path) = decode_request(field("m").ok_or(missing)?)?;
    let completed = field("s") == Some(b"c".as_slice());
    let response = completed
        .then(|| decode_response(field("p").ok_or(missing)?))
        .transpose()?;
    Ok(Some(Record {
        scope: scope.to_owned(),
        key: key.to_owned(),
        fingerprint,
        method,
        path,
        lease_token: LeaseToken::from_uuid(token),
        lease_expires_at: from_millis(number("l")?)?,
        transactional,
        response,
        created_at: from_millis(number("n")?)?,
        completed_at: completed
            .then(|| number("c").and_then(from_millis))
            .transpose()?,
        expires_at: from_millis(number("e")?)?,
        observed_at: from_millis(now)?,
    }))
}

impl BatchedStore for RedisStore {
    type Completion = CompleteItem;

    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        // A batch of one (no load): the single-claim statement, which is
        // cheaper to run than the batch's.
        if let [item] = items.as_slice() {
            return Ok(vec![self.claim(&item.as_new()).await]);
        }
        let mut call = ScriptCall::new(&CLAIM_BATCH, items.len(), items.len() * 160);
        for item in &items {
            call.arg(self.key_arg(RECORDS, &item.scope, &item.key));
        }
        for item in &items {
            call.arg(item.token.as_uuid().as_bytes().as_slice())
                .arg(millis(item.lease))
                .arg(millis(item.retention))
                .arg(encode_request(
                    &item.fingerprint,
                    item.transactional,
                    &item.method,
                    &item.path,
                ));
        }
        let shape = || CorruptRecord("the batch claim script returned an unexpected shape");
        let acked = self.invoke_acked(&call).await?;
        let Value::Array(reply) = &acked.value else {
            return Err(shape().into());
        };
        let [now, Value::Array(answers)] = reply.as_slice() else {
            return Err(shape().into());
        };
        let now = int(now)?;
        if answers.len() != items.len() {
            return Err(shape().into());
        }
        Ok(items
            .iter()
            .zip(answers)
            .map(|(item, answer)| match answer {
                Value::Int(1) => {
                    acked.replicated()?;
                    Ok(Claim::Acquired(item.as_new().lease()))
                }
                Value::BulkString(packed) => {
                    let record = record_from_packed(&item.scope, &item.key, packed, now)?
                        .ok_or(CorruptRecord("the existing record vanished"))?;
                    if record.lease_token == item.token {
                        // Its own claim, landed by an earlier attempt.
                        acked.replicated()?;
                    }
                    Ok(Claim::Existing(Box::new(record)))
                }
                _ => Err(shape().into()),
            })
            .collect())
    }

    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let size = items.iter().map(|(_, response)| 80 + response.len()).sum();
        let mut call = ScriptCall::new(&COMPLETE_BATCH, items.len(), size);
        for (lease, _) in &items {
            call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key));
        }
        call.arg(&*self.channel);
        for (lease, response) in &items {
            call.arg(lease.token.as_uuid().as_bytes().as_slice())
                .arg(response.as_slice());
        }
        let acked = self.invoke_acked(&call).await?;
        let Value::Array(answers) = &acked.value else {
            return Err(CorruptRecord("the batch complete script returned no array").into());
        };
        if answers.len() != items.len() {
            return Err(CorruptRecord("the batch complete script answered too few keys").into());
        }
        Ok(answers
            .iter()
            .map(|answer| match answer {
                Value::Int(1) => acked.replicated(),
                _ => Err(StoreError::LeaseLost),
            })
            .collect())
    }
}

impl Store for RedisStore {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        // A lone claim (no load) goes by itself with what it borrows; under
        // load it is queued for the next batch.
        let _lone = match &self.batches {
            Some(batches) => match batches.claims.lone() {
                Some(lone) => Some(lone),
                None => return batches.claims.queue_and_wait(ClaimItem::new(new)).await,
            },
            None => None,
        };
        let mut call = ScriptCall::new(&CLAIM, 1, 160);
        call.arg(self.key_arg(RECORDS, new.scope, new.key))
            .arg(new.token.as_uuid().as_bytes().as_slice())
            .arg(millis(new.lease))
            .arg(millis(new.retention))
            .arg(encode_request(
                new.fingerprint,
                new.transactional,
                new.method,
                new.path,
            ));
        let acked = self.invoke_acked(&call).await?;
        let Value::Array(reply) = &acked.value else {
            return Err(CorruptRecord("the claim script returned no array").into());
        };
        match reply.as_slice() {
            [acquired, _] if int(acquired)? == 1 => {
                acked.replicated()?;
                Ok(Claim::Acquired(new.lease()))
            }
            [_, now, Value::BulkString(packed)] => {
                let record = record_from_packed(new.scope, new.key, packed, int(now)?)?
                    .ok_or(CorruptRecord("the existing record vanished"))?;
                if record.lease_token == new.token {
                    // Its own claim, landed by an earlier attempt: the
                    // engine runs on it as if acquired.
                    acked.replicated()?;
                }
                Ok(Claim::Existing(Box::new(record)))
            }
            _ => Err(CorruptRecord("the claim script returned an unexpected shape").into()),
        }
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        let mut call = ScriptCall::new(&TAKE_OVER, 1, 180);
        call.arg(self.key_arg(RECORDS, new.scope, new.key))
            .arg(previous.as_uuid().as_bytes().as_slice())
            .arg(new.token.as_uuid().as_bytes().as_slice())
            .arg(millis(new.lease))
            .arg(millis(new.retention))
            .arg(encode_request(
                new.fingerprint,
                new.transactional,
                new.method,
                new.path,
            ));
        let acked = self.invoke_acked(&call).await?;
        if !matches!(acked.value, Value::Int(1)) {
            return Ok(None);
        }
        acked.replicated()?;
        Ok(Some(new.lease()))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let response = encode_response(response);
        // As for claims: by itself when alone, else in the next batch.
        let _lone = match &self.batches {
            Some(batches) => match batches.completions.lone() {
                Some(lone) => Some(lone),
                None => {
                    return batches
                        .completions
                        .queue_and_wait((lease.clone(), response))
                        .await;
                }
            },
            None => None,
        };
        let mut call = ScriptCall::new(&COMPLETE, 1, 80 + response.len());
        call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(response)
            .arg(&*self.channel);
        match self.invoke_acked(&call).await? {
            acked if matches!(acked.value, Value::Int(1)) => acked.replicated(),
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let mut call = ScriptCall::new(&RENEW, 1, 80);
        call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(millis(duration))
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut call = ScriptCall::new(&RELEASE, 1, 80);
        call.arg(self.key_arg(RECORDS, &lease.scope, &lease.key))
            .arg(lease.token.as_uuid().as_bytes().as_slice())
            .arg(&*self.channel);
        self.fenced(&call).await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let mut call = ScriptCall::new(&GET, 1, 64);
        call.arg(self.key_arg(RECORDS, scope, key));
        match self.invoke(&call).await? {
            Value::Array(reply) if reply.len() == 2 => {
                record_from_fields(scope, key, &reply[1], int(&reply[0])?)
            }
            _ => Err(CorruptRecord("the get script returned an unexpected shape").into()),
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

impl Purge for RedisStore {
    async fn purge(&self, _limit: u32) -> Result<u64, StoreError> {
        // Records expire natively at the end of their retention.
        Ok(0)
    }
}

// ---------------------------------------------------------------------------
// Operators' operations (`AdminStore`): listing and forgetting records.
// ---------------------------------------------------------------------------

/// See `lua/admin_forget.lua`.
static ADMIN_FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/admin_forget.lua")));

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

impl RedisStore {
    /// Every Redis key matching `pattern`: `SCAN` on one Redis; on a
    /// cluster, `KEYS` on every primary (a cluster offers no cursor across
    /// nodes), which blocks each primary while it walks its keys: an
    /// admin listing is an occasional operator's action, not a hot path.
    async fn admin_keys(&self, pattern: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        match &self.connection {
            Connection::Single(connection) => {
                let mut connection = connection.clone();
                let mut keys = Vec::new();
                let mut cursor: u64 = 0;
                loop {
                    let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut connection)
                        .await?;
                    keys.extend(batch);
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
            }
            Connection::Cluster(connection) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let mut command = redis::cmd("KEYS");
                command.arg(pattern);
                let value = connection
                    .clone()
                    .route_command(
                        command,
                        RoutingInfo::MultiNode((
                            MultipleNodeRoutingInfo::AllMasters,
                            Some(ResponsePolicy::CombineArrays),
                        )),
                    )
                    .await?;
                redis::from_redis_value(value)
                    .map_err(|_| CorruptRecord("KEYS returned an unexpected shape").into())
            }
        }
    }
}

impl RedisStore {
    /// Deletes the cached copy of a record (tiered store), if any.
    pub(crate) async fn cache_forget(&self, scope: &str, key: &str) -> Result<(), StoreError> {
        let mut command = redis::cmd("DEL");
        command.arg(self.key_arg(CACHED, scope, key));
        self.query(&command).await?;
        Ok(())
    }
}

impl crate::store::admin::AdminStore for RedisStore {
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
            1 => Ok(Forgotten::Deleted(state)),
            2 => Ok(Forgotten::Refused(state)),
            _ => Err(CorruptRecord("the forget script returned an unexpected shape").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_values_parse_as_str_parse_does() {
        for text in [
            "0",
            "7",
            "-7",
            "1764547200123",
            "-0",
            "9223372036854775807",
            "-9223372036854775808",
        ] {
            assert_eq!(
                decimal_value(text.as_bytes()),
                text.parse::<i64>().ok(),
                "{text}"
            );
        }
        for text in [
            "",
            "-",
            "+1",
            "1a",
            " 1",
            "9223372036854775808",
            "-9223372036854775809",
            "1.5",
        ] {
            assert_eq!(decimal_value(text.as_bytes()), None, "{text}");
        }
    }

    /// Packs fields as `pack.lua` does.
    fn pack(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut packed = Vec::new();
        for field in fields {
            let length = field.map_or(MISSING, |value| u32::try_from(value.len()).unwrap());
            packed.extend_from_slice(&length.to_be_bytes());
        }
        for value in fields.iter().flatten() {
            packed.extend_from_slice(value);
        }
        packed
    }

    #[test]
    fn packed_records_decode_like_their_fields() {
        let token = uuid::Uuid::new_v4();
        let request = encode_request(&Fingerprint::from_bytes([7; 32]), false, "POST", "/p:~");
        let response = encode_response(&StoredResponse::from_bytes("12:~ok"));
        // t s l e n m p c; any bytes inside values are data.
        let completed: [Option<&[u8]>; 8] = [
            Some(token.as_bytes()),
            Some(b"c"),
            Some(b"1700000060000"),
            Some(b"1700086400000"),
            Some(b"1700000000000"),
            Some(&request),
            Some(&response),
            Some(b"1700000001000"),
        ];
        let in_flight: [Option<&[u8]>; 8] = [
            completed[0],
            Some(b"f"),
            completed[2],
            completed[3],
            completed[4],
            completed[5],
            None,
            None,
        ];
        for fields in [completed, in_flight] {
            let as_array = Value::Array(
                fields
                    .iter()
                    .map(|f| f.map_or(Value::Nil, |v| Value::BulkString(v.to_vec())))
                    .collect(),
            );
            let unpacked = record_from_packed("s", "k", &pack(&fields), 1_700_000_002_000).unwrap();
            let expected = record_from_fields("s", "k", &as_array, 1_700_000_002_000).unwrap();
            assert!(unpacked.is_some());
            assert_eq!(unpacked, expected);
        }
        let record = record_from_packed("s", "k", &pack(&completed), 0)
            .unwrap()
            .unwrap();
        assert_eq!(
            record.response.unwrap().body.as_deref(),
            Some(&b"12:~ok"[..])
        );
        assert_eq!(record.path, "/p:~");
        // No token: no record.
        let gone = pack(&[None; 8]);
        assert_eq!(record_from_packed("s", "k", &gone, 0).unwrap(), None);
        // Truncated, too long, too few fields, lengths cut short: corrupt.
        let whole = pack(&completed);
        for bad in [
            &whole[..whole.len() - 1],
            &[whole.as_slice(), b"~"].concat()[..],
            &pack(&completed[..7])[..],
            &whole[..30],
        ] {
            assert!(record_from_packed("s", "k", bad, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn packed_requests_and_responses_round_trip() {
        let fingerprint = Fingerprint::from_bytes([9; 32]);
        let packed = encode_request(&fingerprint, true, "PATCH", "/a?b=c");
        assert_eq!(
            decode_request(&packed).unwrap(),
            (fingerprint, true, "PATCH".into(), "/a?b=c".into())
        );
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", http::HeaderValue::from_static("1"));
        for body in [
            Some(bytes::Bytes::from_static(b"\x00\xffbody")),
            Some(bytes::Bytes::new()),
            None,
        ] {
            let response = StoredResponse {
                status: http::StatusCode::CREATED,
                headers: headers.clone(),
                body,
            };
            assert_eq!(
                decode_response(&encode_response(&response)).unwrap(),
                response
            );
        }
        assert!(decode_request(b"short").is_err());
        assert!(decode_response(b"\x00").is_err());
    }

    #[test]
    fn record_keys_are_injective_and_parse_back() {
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
}
