//! Where records live: the contracts every store implements, in this file,
//! and the stores, one folder or file each.
//!
//! Every operation is one atomic step in its store. None of them decides
//! policy: the engine reads what [`Store::claim`] returns and asks
//! `decision::decide` (a pure function) what to do.
//!
//! # The contracts
//!
//! | trait | implemented by | called by | names a record by |
//! |---|---|---|---|
//! | [`Store`] | each backend's direct store and every wrapper | the engine | [`Scope`] and [`IdempotencyKey`] (in [`NewRecord`], [`Lease`], [`Record`] and `get`) |
//! | [`Purge`] | every store | [`purge_expired`](crate::purge_expired) | (none: by expiry) |
//! | `TransactionalStore` (PostgreSQL) | the stores with PostgreSQL behind them | the engine, in transactional mode | the [`Lease`] |
//! | [`AdminStore`] | every store | the key-status service's admin API | text (`&str`), as the operator gave it |
//! | [`BatchedStore`] (+ [`ClaimItem`]) | each backend's direct store | [`Batched`](batch::Batched) alone | [`Scope`] and [`IdempotencyKey`] |
//! | `RecordCache` (Redis) | the Redis store | `TieredStore` alone | typed to read, text to write |
//!
//! Each trait's own documentation says more on both sides. The record they
//! trade in, and the [`LeaseToken`] that fences its writes, live in
//! `record.rs`.
//!
//! The scope and key stay typed down to the store: a [`NewRecord`] borrows
//! the request's own, and a [`Lease`], a queued [`ClaimItem`] or a
//! [`Record`] read back share their text (a clone of either is a reference
//! count). A store writes them with `as_str()`, in the layout it always
//! had; a store that reads a scope or key back validates it again, and one
//! that breaks its rule is a [`CorruptRecord`](crate::record::CorruptRecord).
//!
//! # How a store is laid out
//!
//! A backend is a folder, one file per role, each with its tests
//! (`postgres/`, `sqlite/` and `redis/` are the models):
//!
//! - `mod.rs`: the module documentation (the data model, what one
//!   operation costs, durability); the direct store (`PostgresRecords`),
//!   the public alias that batches it (`pub type PostgresStore =
//!   Batched<PostgresRecords>`) and the builders on that alias; the
//!   [`Store`] and [`Purge`] implementations, with the statements or
//!   scripts they send.
//! - `batch.rs`: the [`BatchedStore`] implementation (many claims or
//!   completions in one statement, transaction or pipeline) and what only
//!   it sends.
//! - `admin.rs`: the [`AdminStore`] implementation (the operators'
//!   listing and forgetting) and what only it sends.
//! - a file for each piece of the backend's own: the record's layout
//!   (`redis/codec.rs`), scripts (`redis/scripts.rs`, `redis/lua/`), the
//!   single-claim path (`redis/claim.rs`), the connection
//!   (`redis/connection.rs`), replica acknowledgements
//!   (`redis/replicas.rs`), the tiered store's side (`redis/cache.rs`),
//!   single-commit mode (`postgres/single_commit.rs`).
//!
//! A store imports the contracts from this file and the record from
//! `crate::record`, never another backend; what the two SQL stores share
//! is in `sql.rs`. No file here is over about 600 lines unless its first
//! lines say why. A new backend also joins [`AnyStore`] (`any/mod.rs`: its
//! [`Backend`] variant) and the conformance suites in `guard/tests/it/`.

use std::future::Future;
use std::time::Duration;

use crate::events::RecordEvents;
use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{Record, Step, StoredResponse};

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod tiered;

mod any;
pub use any::{AnyStore, Backend, NatsOptions, StoreKind, StoreOptions};

mod settings;
pub use settings::{SettingNames, SettingsError};

pub mod admin;
use admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter};

pub mod batch;

pub mod encrypted;

/// The token that fences a lease's writes (declared with the record it
/// belongs to; its one public path is this one, beside the lease).
pub use crate::record::LeaseToken;

/// A held lease: the right to complete, renew or release one record.
///
/// Its scope and key share the request's text: making a lease copies
/// neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The record's scope.
    pub scope: Scope,
    /// The record's key.
    pub key: IdempotencyKey,
    /// The token every later write is fenced by.
    pub token: LeaseToken,
}

/// What a request asks the store to create when it claims a key.
#[derive(Debug, Clone)]
pub struct NewRecord<'a> {
    /// The namespace of the key.
    pub scope: &'a Scope,
    /// The idempotency key.
    pub key: &'a IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// The request's method.
    pub method: &'a str,
    /// The request's path and query.
    pub path: &'a str,
    /// The token of the lease this claim takes.
    pub token: LeaseToken,
    /// How long the lease lasts before it must be renewed.
    pub lease: Duration,
    /// How long the record lives after creation.
    pub retention: Duration,
    /// Whether the handler's effects commit together with the record.
    pub transactional: bool,
}

impl NewRecord<'_> {
    /// The lease this claim holds once it succeeds (its scope and key
    /// share the claim's text).
    pub fn lease(&self) -> Lease {
        Lease {
            scope: self.scope.clone(),
            key: self.key.clone(),
            token: self.token,
        }
    }
}

/// The result of [`Store::claim`].
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// No record existed: this request now holds the lease and must run.
    Acquired(Lease),
    /// A record already exists; the caller decides what it means.
    Existing(Box<Record>),
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease named in the write is no longer the record's: another
    /// request took over, or the record was released or purged.
    #[error("the lease was lost: the record now belongs to another request or is gone")]
    LeaseLost,
    /// The store could not be reached, or failed while answering.
    #[error("the store is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The store did not answer within the configured bound.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// A record read back could not be decoded.
    #[error(transparent)]
    Corrupt(#[from] crate::record::CorruptRecord),
    /// The operation needs a capability this store does not have.
    #[error("this store does not support {0}")]
    Unsupported(&'static str),
    /// The write stands on the primary but reached fewer replicas than the
    /// store waits for (Redis `WAIT`, see
    /// `RedisStore::with_replica_acks`) within its timeout: a failover
    /// may lose it. The engine treats a claim that ends so as failed (it
    /// releases it, fenced, and answers 503 `store-unavailable`) and does
    /// not send the same completion again.
    #[error("the write reached {acked} of the {wanted} replicas it waits for")]
    NotReplicated {
        /// The replicas the store waits for.
        wanted: u32,
        /// The replicas that acknowledged the write in time.
        acked: u32,
    },
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "sqlite"))))]
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::Unavailable(Box::new(error))
    }
}

impl StoreError {
    /// The same error for every item of a failed batch (a store's source
    /// error is not `Clone`: its message is kept).
    pub(crate) fn for_each_item(&self) -> StoreError {
        match self {
            StoreError::LeaseLost => StoreError::LeaseLost,
            StoreError::Timeout(bound) => StoreError::Timeout(*bound),
            StoreError::Corrupt(corrupt) => StoreError::Corrupt(*corrupt),
            StoreError::Unsupported(what) => StoreError::Unsupported(what),
            StoreError::NotReplicated { wanted, acked } => StoreError::NotReplicated {
                wanted: *wanted,
                acked: *acked,
            },
            StoreError::Unavailable(source) => {
                StoreError::Unavailable(format!("the batch failed: {source}").into())
            }
        }
    }
}

/// The atomic operations the engine needs from a place that keeps records.
///
/// Capabilities that not every caller needs are traits of their own:
/// [`Purge`] and, with PostgreSQL, [`TransactionalStore`].
///
/// Implementations must make each method one atomic step: `claim` creates
/// the record or reports the existing one, never both for two callers;
/// `take_over`, `complete`, `renew` and `release` change the record only
/// when it still carries the named lease token. The conformance suite in
/// `tests/it/store_suite.rs` holds every implementation to this.
///
/// Records are named by their typed [`Scope`] and [`IdempotencyKey`],
/// never by text: the engine passes the request's own (borrowed in
/// [`NewRecord`], shared in [`Lease`]), and what a store returns carries
/// them the same way.
///
/// Implemented by each backend's direct store (`PostgresRecords`,
/// `SqliteRecords`, `RedisRecords`) and by every store that wraps another
/// ([`Batched`](batch::Batched), [`EncryptedStore`](encrypted::EncryptedStore),
/// `TieredStore`, [`AnyStore`]). Called by the
/// engine: the claim and take-over (`engine/claim.rs`), renewals
/// (`engine/supervise.rs`), the completion or release (`engine/settle.rs`,
/// `engine/release.rs`) and the reads of a waiting request; the status
/// service reads through [`Store::get`] and [`Store::get_many`].
///
/// A call may wait as long as its backend does: the caller bounds it. The
/// engine runs each of its calls under its store timeout
/// (`with_store_timeout`, 5 s by default) and the status service under its
/// own; code that calls a store directly wraps the call in
/// `tokio::time::timeout`. (The PostgreSQL and Redis stores arm no timer
/// per statement or command; NATS bounds each request with its client's.)
pub trait Store: Clone + Send + Sync + 'static {
    /// Creates the record for `new` if `(scope, key)` has none, and returns
    /// the lease; otherwise returns the existing record untouched.
    ///
    /// A record past its retention is still returned (the caller then takes
    /// it over): purging is [`Purge::purge`]'s job.
    fn claim(&self, new: &NewRecord<'_>) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Replaces the record whose lease token is `previous` with `new`, but
    /// only if that record is past its retention or its lease has ended.
    ///
    /// Returns `None` when the record changed meanwhile (another request
    /// took it over, completed it, or it is gone): the caller claims again.
    fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// Stores the handler's response and marks the record completed.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    fn complete(
        &self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends the lease to `duration` from now. A zero duration ends the
    /// lease at once without releasing the record: it becomes abandoned.
    /// A lease that has already ended is never extended again.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`, is
    /// no longer in flight, or its lease has ended.
    fn renew(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the steps of the run holding `lease`: the whole list, in
    /// order, replacing the one stored (a run only ever appends, so a write
    /// sent again after a lost reply is harmless). Read back in
    /// [`Record::steps`].
    ///
    /// Fenced like [`Store::renew`]: only while the record is in flight
    /// under `lease` and its lease has not ended, so a runner whose lease
    /// lapsed (or was taken over) cannot record. [`Store::take_over`] of a
    /// record within its retention keeps its steps (a resumed run gets them
    /// back); of an expired record, drops them.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`, is
    /// no longer in flight, or its lease has ended;
    /// [`StoreError::Unsupported`] for steps the store cannot hold (on
    /// NATS, a list larger than the server's `max_payload`).
    fn record_steps(
        &self,
        lease: &Lease,
        steps: &[Step],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Keeps `request` in the record held by `lease` (`None` clears it):
    /// the request of a resumable run, for the completer
    /// ([`Completer`](crate::engine::Completer)). Read back in
    /// [`Record::request`]. Fenced like [`Store::record_steps`], and kept
    /// like the steps: by a take-over within the retention and by the
    /// completion.
    ///
    /// The default answers [`StoreError::Unsupported`] (stores outside
    /// this crate): the engine then runs as before, and the
    /// completer finds nothing to complete for that key.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`, is
    /// no longer in flight, or its lease has ended.
    fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (lease, request);
        std::future::ready(Err(StoreError::Unsupported(
            "stored requests (the completer; not on this store yet)",
        )))
    }

    /// Deletes the in-flight record held by `lease`, so the key may run again.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Waits (at most `wait`) until no claim or takeover carrying `lease`'s
    /// token, sent earlier and never answered, can still land in the store;
    /// writes nothing. The engine calls it before its last release of such
    /// a claim (`engine/release.rs`), so a claim that lands late is freed,
    /// never stranded.
    ///
    /// The default answers at once: a write to this store is decided once
    /// it was answered or lost, and the engine's releases during twice the
    /// store timeout cover one still on its way. PostgreSQL overrides it: a
    /// commit waiting for a synchronous standby stays invisible for as long
    /// as the standby does not answer, and `settle` waits behind it.
    ///
    /// # Errors
    ///
    /// Any [`StoreError`] when the store did not answer within `wait`: the
    /// engine asks again.
    fn settle(
        &self,
        lease: &Lease,
        wait: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (lease, wait);
        std::future::ready(Ok(()))
    }

    /// Reads the record of `(scope, key)`, if any (expired ones included).
    fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Reads the records of many keys of one scope, in the order of `keys`.
    ///
    /// The default reads them one by one; stores override it with one
    /// round trip.
    fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> impl Future<Output = Result<Vec<Option<Record>>, StoreError>> + Send {
        async move {
            let mut records = Vec::with_capacity(keys.len());
            for key in keys {
                records.push(self.get(scope, key).await?);
            }
            Ok(records)
        }
    }

    /// The registry that wakes requests waiting for an in-flight record.
    fn events(&self) -> &RecordEvents;
}

/// A store that can delete the records past their retention.
///
/// Implemented by every store here (Redis expires records by itself and
/// answers 0; the wrappers pass it to the store they wrap). Called by
/// [`purge_expired`](crate::purge_expired) and
/// [`purge_periodically`](crate::purge_periodically), which the app or the
/// status service runs.
pub trait Purge: Store {
    /// Deletes up to `limit` records past their retention; returns how many.
    fn purge(&self, limit: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A store with PostgreSQL behind it, for transactional mode.
///
/// Implemented by [`PostgresStore`](postgres::PostgresStore),
/// `TieredStore` and [`AnyStore`] (which answers
/// `None` when its backend has no PostgreSQL). Called by the engine's
/// transactional half (`engine/transaction/postgres.rs`) and by
/// `IdempotencyLayer::with_transactional_mode`, which requires it.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub trait TransactionalStore: Store {
    /// The PostgreSQL store whose transactions commit the work's writes
    /// together with its record; `None` for a runtime choice of store
    /// ([`AnyStore`]) that has none.
    fn postgres(&self) -> Option<&postgres::PostgresStore>;

    /// Called after a run's transaction committed its completion (outside
    /// the store's own calls): a store that wakes other processes by other
    /// means than PostgreSQL's `NOTIFY` (the tiered store's Redis) does it
    /// here. The default does nothing.
    fn committed(&self, lease: &Lease) -> impl Future<Output = ()> + Send {
        let _ = lease;
        async {}
    }
}

/// Operators' operations on records: listing and forgetting.
///
/// Implemented by every store: each backend's direct store (its
/// `admin.rs`), the wrappers, which pass it on (the tiered store also
/// deletes the cached copy), and [`AnyStore`]; the conformance suite in
/// `tests/it/admin_suite.rs` holds each to the same behaviour. Called by
/// the key-status service's admin API (`/v1/admin/keys`): list a scope's
/// records (to find stuck, abandoned keys), and forget one record so that
/// its key may run again. The types it trades in are in [`admin`].
///
/// Every operation is one atomic step, like the core trait's: a forget
/// decides and deletes in one statement (SQL) or one script (Redis), so a
/// record that a request claims, renews or completes at the same moment is
/// never deleted on the strength of a state it no longer has. A record
/// whose lease is live is never forgotten, whatever the rule: its handler
/// is running, and deleting the record would let a retry run beside it.
pub trait AdminStore: Store {
    /// Lists the records of `scope` that pass `filter` and are not past
    /// their retention, by key in byte order, one page at a time.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Deletes the record of `(scope, key)` if `rule` allows its state, in
    /// one atomic step, and wakes requests waiting for it.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send;

    /// Which of `keys` of `scope` a run holds without any committed record,
    /// one answer per key in order: PostgreSQL's single-commit mode holds a
    /// running key by an advisory lock alone, so a key without a record
    /// may still be in flight. Stores without such runs answer `false`
    /// for every key (the default).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        let _ = scope;
        let held = vec![false; keys.len()];
        async move { Ok(held) }
    }
}

/// A store that can send many claims, or many completions, at once: one
/// result per item, in the order of the items.
///
/// Implemented by each backend's direct store, the one that sends every
/// call on its own (`PostgresRecords`, `SqliteRecords`, `RedisRecords`,
/// in their `batch.rs`). Called by [`Batched`](batch::Batched) alone,
/// which wraps such a store and feeds it the batches its batchers gather
/// (`store/batch/`); nothing else sends a batch. A backend's public store
/// is `Batched` over its direct store (`pub type PostgresStore =
/// Batched<PostgresRecords>`).
///
/// Each item gets the answer it would get alone, fencing included; when the
/// whole batch fails (the store is unreachable, the statement failed), the
/// method answers one error and nothing was written for any item.
pub trait BatchedStore: Store {
    /// A completion waiting in a batch, in the store's own encoding.
    type Completion: Send + 'static;

    /// The completion of `lease` with `response`, as a batch carries it.
    fn completion(&self, lease: &Lease, response: &StoredResponse) -> Self::Completion;

    /// Claims every item: the batch's one statement, script or transaction.
    fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> impl Future<Output = Result<Vec<Result<Claim, StoreError>>, StoreError>> + Send;

    /// Completes every item, fenced per item.
    fn complete_batch(
        &self,
        items: Vec<Self::Completion>,
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;
}

/// A claim waiting in a batch: an owned [`NewRecord`].
///
/// Made by [`Batched`](batch::Batched) when a claim queues for the next
/// batch (the caller's [`NewRecord`] borrows from its request); read by a
/// backend's [`BatchedStore::claim_batch`], through its fields inside the
/// crate or as a [`NewRecord`] again ([`ClaimItem::as_new`]).
#[derive(Debug, Clone)]
pub struct ClaimItem {
    pub(crate) scope: Scope,
    pub(crate) key: IdempotencyKey,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) token: LeaseToken,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) transactional: bool,
}

impl ClaimItem {
    /// An owned copy of `new` (its scope and key shared, not copied).
    pub fn new(new: &NewRecord<'_>) -> Self {
        Self {
            scope: new.scope.clone(),
            key: new.key.clone(),
            fingerprint: *new.fingerprint,
            method: new.method.to_owned(),
            path: new.path.to_owned(),
            token: new.token,
            lease: new.lease,
            retention: new.retention,
            transactional: new.transactional,
        }
    }

    /// The claim as the store's [`Store::claim`] takes it.
    pub fn as_new(&self) -> NewRecord<'_> {
        NewRecord {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            token: self.token,
            lease: self.lease,
            retention: self.retention,
            transactional: self.transactional,
        }
    }
}

/// What the tiered store asks of its cache: copies of completed records,
/// and a way to wake waiters in every process.
///
/// Implemented by the Redis store (`redis/cache.rs`; a [`Batched`](batch::Batched)
/// cache is its direct store's). Called by [`TieredStore`](tiered::TieredStore)
/// alone, which touches nothing else of its cache.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub trait RecordCache: Clone + Send + Sync + 'static {
    /// The cached copy of a completed record, with the time it has left.
    fn get_completed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Caches a completed record for `ttl`, counted down by the cache.
    fn put_completed(
        &self,
        record: &Record,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes the cached copy of a record, if any.
    fn forget(&self, scope: &str, key: &str)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Announces that a record changed, waking waiters in every process.
    fn announce(
        &self,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The waiters of this process (shared with the PostgreSQL store).
    fn events(&self) -> &RecordEvents;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease, and a queued claim, share the claim's scope and key: the
    /// same text, not a copy of it.
    #[test]
    fn a_lease_shares_the_text_of_its_claims_scope_and_key() {
        let scope = Scope::new("tenant-a").unwrap();
        let key = IdempotencyKey::from_raw("order-42").unwrap();
        let fingerprint = Fingerprint::from_bytes([1; 32]);
        let new = NewRecord {
            scope: &scope,
            key: &key,
            fingerprint: &fingerprint,
            method: "POST",
            path: "/orders",
            token: LeaseToken::new(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
            transactional: false,
        };
        let lease = new.lease();
        assert_eq!(lease.scope.as_str().as_ptr(), scope.as_str().as_ptr());
        assert_eq!(lease.key.as_str().as_ptr(), key.as_str().as_ptr());
        let queued = ClaimItem::new(&new);
        assert_eq!(queued.scope.as_str().as_ptr(), scope.as_str().as_ptr());
        assert_eq!(queued.key.as_str().as_ptr(), key.as_str().as_ptr());
        let again = queued.as_new().lease();
        assert_eq!(again.key.as_str().as_ptr(), key.as_str().as_ptr());
    }
}
