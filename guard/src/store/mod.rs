//! The [`Store`] trait: a small set of atomic operations on records, and
//! the types they trade in. One file per backend lives under `store/`.
//!
//! Every operation is one atomic step in its store. None of them decides
//! policy: the layer reads what [`Store::claim`] returns and asks
//! `decision::decide` (a pure function) what to do.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::{Fingerprint, Record, RecordEvents, StoredResponse};

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
pub use admin::AdminStore;

pub mod batch;
pub use batch::{BatchCounts, BatchLimits, BatchStats};

pub mod encrypted;
pub use encrypted::{EncryptedStore, EncryptionKeys};

/// The random token that identifies one lease on a record.
///
/// Every write after the claim (complete, renew, release, take over) names
/// the token it holds; a store refuses the write when the record's token is
/// another one. That fence is what keeps a holder that lost its lease from
/// overwriting the record of the request that took over.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(uuid::Uuid);

impl LeaseToken {
    /// Draws a new random token.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// Wraps a token read from a store.
    pub fn from_uuid(uuid: uuid::Uuid) -> Self {
        Self(uuid)
    }

    /// The token as a UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

/// A held lease: the right to complete, renew or release one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// The token every later write is fenced by.
    pub token: LeaseToken,
}

/// What a request asks the store to create when it claims a key.
#[derive(Debug, Clone)]
pub struct NewRecord<'a> {
    /// The namespace of the key.
    pub scope: &'a str,
    /// The idempotency key.
    pub key: &'a str,
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
    /// The lease this claim holds once it succeeds.
    pub fn lease(&self) -> Lease {
        Lease {
            scope: self.scope.to_owned(),
            key: self.key.to_owned(),
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

    /// Deletes the in-flight record held by `lease`, so the key may run again.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads the record of `(scope, key)`, if any (expired ones included).
    fn get(
        &self,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// Reads the records of many keys of one scope, in the order of `keys`.
    ///
    /// The default reads them one by one; stores override it with one
    /// round trip.
    fn get_many(
        &self,
        scope: &str,
        keys: &[&str],
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

/// A store that can delete the records past their retention (every store
/// here; Redis does it by itself and answers 0). See [`purge_periodically`](crate::purge_periodically).
pub trait Purge: Store {
    /// Deletes up to `limit` records past their retention; returns how many.
    fn purge(&self, limit: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A store with PostgreSQL behind it, for transactional mode.
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
