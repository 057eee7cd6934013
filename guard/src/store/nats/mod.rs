//! The NATS JetStream store: records in a KV bucket replicated by
//! JetStream's Raft groups, so a write is acknowledged only once a majority
//! of the bucket's replicas holds it, and the loss of the node that leads
//! the bucket loses no acknowledged record (see docs/GUARANTEES.md, "NATS
//! JetStream").
//!
//! # The scheme
//!
//! One bucket (a stream `KV_<bucket>` on `$KV.<bucket>.>`, one message
//! kept per subject) holds one message per record; `codec.rs` gives its
//! subject and value. Every write names the revision it expects the
//! record's subject to be at (`Nats-Expected-Last-Subject-Sequence`), which
//! the stream's leader checks and applies in one step:
//!
//! - **claim** = create: a write expecting revision 0 (no message). The
//!   loser reads the winner (from the leader) and reports it. A delete
//!   marker, or a record past its retention, is replaced by a write
//!   expecting its revision.
//! - **complete, renew, record steps, keep a request, release, take over,
//!   forget** = read
//!   the record from the leader, check its lease token (and state, and
//!   times), then write (or write a delete marker, `KV-Operation: DEL`)
//!   expecting the revision read. The revision is the fence: any write in between, a take-over
//!   above all, makes the server refuse it, and the operation reads again.
//! - **complete a claim of this process** = no read: the claim's
//!   acknowledgement gave its revision, the watch saw its stamp
//!   (`stamps.rs`) and the store kept the value it wrote (`claimed.rs`),
//!   which together are the record a read would return; the completion
//!   writes expecting that revision, and reads only if the leader refuses
//!   it (another write came first) or the stamp was not seen yet.
//!
//! # Reads come from the stream's leader
//!
//! Every read that decides (a claim's loser, a replay, a completion's
//! fence, the status service) is a `STREAM.MSG.GET` request, which only
//! the stream's leader answers, never a direct get, which any replica may
//! answer from a state that lags the acknowledged writes. A leader that
//! was just deposed may answer for the short time before it learns so
//! (JetStream's leader lease); see GUARANTEES.
//!
//! # Times: the leader's clock, never two clocks
//!
//! Every message carries the time the leader stored it. A claim's value
//! holds durations from that stamp (the lease, the retention); a renewal
//! holds its duration from its own stamp and, as a cap, the end of the
//! lease it extends: a renewal stamped after that end is void (the lease
//! ended at the cap), so a lapsed lease is never revived, whatever the
//! renewer believed when it sent it. A completion copies its claim's
//! instants. `observed_at`, what a record's times are compared with, is
//! the leader's clock too, estimated from a sample (`clock.rs`): this
//! host's wall clock is never read.
//!
//! Retention: every write carries a per-message TTL (`Nats-TTL`, NATS
//! 2.11 and later) of the record's remaining retention rounded up to whole
//! seconds, so the server deletes the record itself; until then a read
//! treats a record past its retention as gone (as Redis's native expiry
//! does), and a claim replaces it. [`Purge::purge`] has nothing to do.
//!
//! # Waiters
//!
//! Each store keeps one ordered consumer on the bucket (headers only, new
//! messages only): every write to a record, from any process, wakes the
//! requests of this process that wait for it (`watch.rs`).
//!
//! # Unknown outcomes
//!
//! A write refused with 503 (no responders: an election is under way)
//! stored nothing and is sent again for up to [`RETRY_BUDGET`] (and a
//! completion that still fails, by the engine for its completion retry
//! window, 30 s by default: an election is ridden out). A write
//! whose answer timed out may or may not have landed: the operation reads
//! the record from the leader, and a record that carries its own token
//! (the value always carries the claimant's) tells that it did.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use base64::Engine as _;

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{Record, Step, StoredResponse};
use crate::store::{Claim, Lease, LeaseToken, NewRecord, Purge, Store, StoreError};

mod admin;
mod claim;
mod claimed;
mod clock;
mod codec;
mod complete;
mod requests;
mod stamps;
mod watch;

use codec::Stored;

/// How long one request to NATS may take before its outcome is unknown.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one operation sends a write or read again, by default, while
/// the bucket answers 503 or not at all (its stream is electing a
/// leader): below the engine's store timeout (5 s by default), so that the
/// engine sees the failure and decides; it sends a completion again for its
/// completion retry window (30 s by default), which outlasts an election.
/// See [`NatsStore::with_retry_budget`].
pub const RETRY_BUDGET: Duration = Duration::from_secs(4);
/// How many times one operation reads and writes again after another
/// write won the race for the record's revision.
const RACE_ATTEMPTS: usize = 16;
/// How many reads of one [`Store::get_many`] are in flight at once.
const GET_MANY_IN_FLIGHT: usize = 64;
/// How long a delete marker (a released or forgotten record) stays.
const MARKER_TTL: &str = "1s";
/// The oldest server with per-message TTL.
const MIN_SERVER: (u64, u64) = (2, 11);

/// Records in a NATS JetStream KV bucket; see the module's documentation.
///
/// Cloning shares the connection, the bucket's consumer of events and the
/// registry of waiters.
#[derive(Clone)]
pub struct NatsStore {
    inner: Arc<Inner>,
    events: RecordEvents,
    /// How long one operation sends its reads and writes again while the
    /// bucket elects a leader.
    retry_budget: Duration,
}

struct Inner {
    /// The connection (its state: see `complete.rs`).
    client: async_nats::Client,
    context: jetstream::Context,
    stream: jetstream::stream::Stream<()>,
    stream_name: String,
    bucket: String,
    /// `$KV.<bucket>.`
    prefix: String,
    replicas: usize,
    max_payload: usize,
    clock: clock::LeaderClock,
    /// This process's claims not finished yet (`claimed.rs`).
    claimed: claimed::ClaimedRecords,
    /// The stamps of the latest claims, as the watch saw them (`stamps.rs`).
    stamps: Arc<stamps::Stamps>,
    _watcher: watch::Watcher,
}

impl std::fmt::Debug for NatsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsStore")
            .field("bucket", &self.inner.bucket)
            .field("replicas", &self.inner.replicas)
            .finish_non_exhaustive()
    }
}

/// What a record's subject holds, as the leader reads it.
#[derive(Debug)]
enum Slot {
    /// No message.
    Empty,
    /// A delete marker at this revision.
    Marker(u64),
    /// A record (maybe past its retention).
    Record(Box<Stored>),
}

impl Slot {
    /// The record, unless there is none or it is past its retention.
    fn live(self) -> Option<Record> {
        match self {
            Slot::Record(stored) if !stored.record.is_expired() => Some(stored.record),
            _ => None,
        }
    }
}

/// How a write ended.
#[derive(Debug)]
enum Written {
    /// Stored at this revision (the message's stream sequence).
    Stored(u64),
    /// The record's subject was not at the revision named: nothing written.
    Conflict,
    /// The answer never came: it may or may not have landed.
    Unknown(StoreError),
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

/// The server version's major and minor numbers (`2.15.1` is `(2, 15)`).
fn version(text: &str) -> Option<(u64, u64)> {
    let mut parts = text.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether a bucket name is one NATS takes (`[A-Za-z0-9_-]+`).
fn valid_bucket(bucket: &str) -> bool {
    !bucket.is_empty()
        && bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The token of a scope or key in a subject: `=` and URL-safe base64.
fn token(text: &str) -> String {
    let mut out = String::with_capacity(1 + text.len().div_ceil(3) * 4);
    out.push('=');
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(text, &mut out);
    out
}

/// The text of a subject's token, if it is one [`token`] wrote.
fn untoken(token: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.strip_prefix('=')?)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// The scope and key of a record's subject after the bucket's prefix.
fn parse_subject(rest: &str) -> Option<(String, String)> {
    let (scope, key) = rest.split_once('.')?;
    Some((untoken(scope)?, untoken(key)?))
}

/// The per-message TTL that keeps a record until `remaining_ms` from now:
/// whole seconds, rounded up, one more for the error of the clock's
/// estimate, at least one (the server's minimum).
fn ttl(remaining_ms: i64) -> String {
    let seconds = remaining_ms.max(0).div_euclid(1000) + 2;
    format!("{seconds}s")
}

impl NatsStore {
    /// Connects to NATS (`url`: one server, or several separated by commas,
    /// `nats://host:port` or `host:port`) and opens the KV bucket `bucket`,
    /// creating it if missing: with 3 replicas when the server is part of a
    /// cluster, else 1 (see [`NatsStore::connect_with_replicas`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when NATS cannot be reached or the
    /// bucket cannot be opened; [`StoreError::Unsupported`] for a server
    /// older than 2.11 (no per-message TTL), an invalid bucket name, or an
    /// existing bucket without per-message TTL.
    pub async fn connect(url: &str, bucket: &str) -> Result<Self, StoreError> {
        Self::connect_with_replicas(url, bucket, None).await
    }

    /// Like [`NatsStore::connect`], the bucket created (if missing) with
    /// `replicas` replicas (1 to 5; `None`: 3 on a cluster, else 1). An
    /// existing bucket keeps its own.
    ///
    /// # Errors
    ///
    /// As [`NatsStore::connect`].
    pub async fn connect_with_replicas(
        url: &str,
        bucket: &str,
        replicas: Option<usize>,
    ) -> Result<Self, StoreError> {
        // async-nats takes a string as one address: split the list.
        let servers: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let client = async_nats::ConnectOptions::new()
            .name("idempotency-guard")
            .connection_timeout(REQUEST_TIMEOUT)
            .request_timeout(Some(REQUEST_TIMEOUT))
            .connect(servers.as_slice())
            .await
            .map_err(unavailable)?;
        Self::open(client, bucket, replicas).await
    }

    /// Opens the bucket over a client of your own (its options kept; the
    /// store's requests time out after [`REQUEST_TIMEOUT`]).
    ///
    /// # Errors
    ///
    /// As [`NatsStore::connect`].
    pub async fn open(
        client: async_nats::Client,
        bucket: &str,
        replicas: Option<usize>,
    ) -> Result<Self, StoreError> {
        if !valid_bucket(bucket) {
            return Err(StoreError::Unsupported(
                "a NATS bucket name outside [A-Za-z0-9_-]",
            ));
        }
        let info = client.server_info();
        if version(&info.version).is_none_or(|v| v < MIN_SERVER) {
            return Err(StoreError::Unsupported(
                "a NATS server older than 2.11 (the store needs per-message TTL)",
            ));
        }
        let replicas = replicas.unwrap_or(if info.cluster.is_some() { 3 } else { 1 });
        let max_payload = info.max_payload;
        let mut context = jetstream::new(client.clone());
        context.set_timeout(REQUEST_TIMEOUT);
        let stream_name = format!("KV_{bucket}");
        let prefix = format!("$KV.{bucket}.");
        let created = context
            .get_or_create_stream(bucket_config(&stream_name, &prefix, replicas))
            .await
            .map_err(unavailable)?;
        let config = &created.cached_info().config;
        if !config.allow_message_ttl {
            return Err(StoreError::Unsupported(
                "a NATS bucket created without per-message TTL (allow_msg_ttl)",
            ));
        }
        let replicas = config.num_replicas;
        let stream = context
            .get_stream_no_info(&stream_name)
            .await
            .map_err(unavailable)?;
        let events = RecordEvents::new();
        let stamps = Arc::new(stamps::Stamps::default());
        let watcher = watch::Watcher::start(
            client.clone(),
            stream.clone(),
            prefix.clone(),
            events.clone(),
            stamps.clone(),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                context,
                stream,
                stream_name,
                bucket: bucket.to_owned(),
                prefix,
                replicas,
                max_payload,
                clock: clock::LeaderClock::default(),
                claimed: claimed::ClaimedRecords::default(),
                stamps,
                _watcher: watcher,
            }),
            events,
            retry_budget: RETRY_BUDGET,
        })
    }

    /// Sets how long one operation sends its reads and writes again while
    /// the bucket elects a leader (default [`RETRY_BUDGET`], 4 s). An
    /// election takes about 5 to 8 s. With the defaults, a claim it holds
    /// up answers 503 `store-unavailable` after this budget (the client
    /// retries), and a completion it holds up is sent again by the engine
    /// for its completion retry window (`Engine::with_completion_retry_window`,
    /// 30 s), so it is stored once the new leader answers. Raise this above
    /// an election to have claims wait it out instead of answering 503, and
    /// keep the engine's store timeout (`Engine::with_store_timeout`) above
    /// it.
    #[must_use]
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// When an operation that starts now gives up.
    fn deadline(&self) -> Instant {
        Instant::now() + self.retry_budget
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.inner.bucket
    }

    /// How many replicas the bucket's stream has.
    pub fn replicas(&self) -> usize {
        self.inner.replicas
    }

    /// The subject of a record.
    fn subject(&self, scope: &str, key: &str) -> String {
        format!("{}{}.{}", self.inner.prefix, token(scope), token(key))
    }
}

/// The stream of a bucket: as `nats kv add` makes it (one message per
/// subject, rollups allowed, direct gets allowed for other tools though
/// this store never reads through them), with per-message TTL.
fn bucket_config(name: &str, prefix: &str, replicas: usize) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{prefix}>")],
        max_messages_per_subject: 1,
        discard: jetstream::stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        num_replicas: replicas,
        storage: jetstream::stream::StorageType::File,
        allow_message_ttl: true,
        description: Some("idempotency-guard records".to_owned()),
        ..Default::default()
    }
}

impl Store for NatsStore {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.claim_record(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.take_over_record(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.complete_record(lease, response).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.renew_lease(lease, duration).await
    }

    /// The steps ride in the record's value (`codec.rs`), written like a
    /// renewal: fenced by the revision read, refused once the lease has
    /// ended, void if the write lands after it (the leader's clock).
    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        self.record_steps_held(lease, steps).await
    }

    /// The request rides in the record's value after the steps
    /// (`codec.rs`), written like the steps: fenced by the revision read,
    /// refused once the lease has ended, void if the write lands after it
    /// (the leader's clock).
    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        self.record_request_held(lease, request).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.release_record(lease).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        Ok(self.read(scope, key, self.deadline()).await?.live())
    }

    /// Reads the keys from the leader `GET_MANY_IN_FLIGHT` (64) at a time,
    /// within one retry budget: a status lookup of 1000 keys is not 1000
    /// round trips one after the other.
    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        use futures_util::{StreamExt as _, TryStreamExt as _};
        let deadline = self.deadline();
        // Made up front (they start when polled): a closure in the stream
        // would not be `Send` for every lifetime of its key.
        let reads: Vec<_> = keys
            .iter()
            .map(|key| self.read(scope, key, deadline))
            .collect();
        let slots: Vec<Slot> = futures_util::stream::iter(reads)
            .buffered(GET_MANY_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(slots.into_iter().map(Slot::live).collect())
    }

    fn events(&self) -> &RecordEvents {
        &self.events
    }
}

/// NATS deletes records itself (per-message TTL), and reads treat one past
/// its retention as gone until then: nothing to purge.
impl Purge for NatsStore {
    async fn purge(&self, _limit: u32) -> Result<u64, StoreError> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_injective_and_parse_back() {
        let pairs = [
            ("s", "k"),
            ("", ""),
            ("tenant-a:same", "key"),
            ("tenant-a", "same:key"),
            ("a.b", "*"),
            ("s", ">"),
            ("s", "' or 1=1 --"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (scope, key) in pairs {
            let rest = format!("{}.{}", token(scope), token(key));
            assert!(
                rest.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=.".contains(&b))
            );
            assert_eq!(rest.matches('.').count(), 1, "{rest}");
            assert_eq!(
                parse_subject(&rest),
                Some((scope.to_owned(), key.to_owned()))
            );
            assert!(seen.insert(rest));
        }
        assert_eq!(parse_subject("=czE"), None);
        assert_eq!(parse_subject("nope.=czE"), None);
    }

    #[test]
    fn ttls_cover_the_retention_in_whole_seconds() {
        assert_eq!(ttl(0), "2s");
        assert_eq!(ttl(-5), "2s");
        assert_eq!(ttl(400), "2s");
        assert_eq!(ttl(1_000), "3s");
        assert_eq!(ttl(86_400_000), "86402s");
    }

    #[test]
    fn versions_and_bucket_names_are_checked() {
        assert_eq!(version("2.15.1"), Some((2, 15)));
        assert_eq!(version("v2.9.10"), Some((2, 9)));
        assert!(version("2.9.10").unwrap() < MIN_SERVER);
        assert!(version("2.11.0").unwrap() >= MIN_SERVER);
        assert!(valid_bucket("idem_payments-1"));
        assert!(!valid_bucket(""));
        assert!(!valid_bucket("a.b"));
        assert!(!valid_bucket("a*"));
    }
}
