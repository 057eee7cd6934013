//! [`AnyStore`]: the store chosen at run time from a URL.

use std::time::Duration;

use crate::events::RecordEvents;
use crate::key::{IdempotencyKey, Scope};
use crate::record::StoredRequest;
use crate::record::{LeaseToken, Record, Step, StoredResponse};
#[cfg(feature = "postgres")]
use crate::store::TransactionalStore;
use crate::store::encrypted::{EncryptedStore, EncryptionKeys};
use crate::store::{Claim, Lease, NewRecord, Purge, Store, StoreError};

/// One of the stores, chosen at run time (an enum that delegates, so the
/// layer stays monomorphic and nothing is boxed): a [`Backend`], its
/// stored responses in clear or sealed.
///
/// Two variants, each naming its whole composition: a store added to
/// [`Backend`] is at once available plain and sealed, and a `match` on
/// `AnyStore` has no arm that a forgotten variant could fall into.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// The backend, stored responses in clear.
    Plain(Backend),
    /// The backend, its stored responses sealed ([`EncryptedStore`]).
    Sealed(EncryptedStore<Backend>),
}

/// The store that holds the records: one per backend the features compile
/// in.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// See [`PostgresStore`](crate::store::postgres::PostgresStore).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(crate::store::postgres::PostgresStore),
    /// See [`SqliteStore`](crate::store::sqlite::SqliteStore).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(crate::store::sqlite::SqliteStore),
    /// See [`RedisStore`](crate::store::redis::RedisStore) (one Redis or a cluster).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(crate::store::redis::RedisStore),
    /// See [`TieredStore`](crate::store::tiered::TieredStore).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Tiered(crate::store::tiered::TieredStore),
    /// See [`NatsStore`](crate::store::nats::NatsStore).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(crate::store::nats::NatsStore),
}

/// What [`AnyStore::open`] opens.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions<'a> {
    /// Which store.
    pub kind: StoreKind,
    /// The SQL store (`postgres://` or `sqlite:`), and the PostgreSQL of
    /// the tiered store.
    pub database_url: &'a str,
    /// Redis, or a cluster when it lists several comma-separated node URLs.
    pub redis_url: Option<&'a str>,
    /// The prefix of every Redis key.
    pub redis_prefix: &'a str,
    /// PostgreSQL `LISTEN/NOTIFY` wake-ups across processes (see
    /// [`PostgresStore::with_notifications`](crate::store::postgres::PostgresStore::with_notifications)).
    pub notifications: bool,
    /// Encryption at rest of stored responses: `Some` wraps the store in
    /// an [`EncryptedStore`] sealing with these keys (see
    /// [`EncryptionKeys::from_environment`]). Transactional mode is then
    /// unavailable (its completion would bypass the sealing).
    pub encryption: Option<&'a EncryptionKeys>,
    /// With `encryption`: whether a completed response without the sealed
    /// marker is refused ([`StoreError::Corrupt`], 503) instead of replayed
    /// as it is ([`EncryptedStore::with_require_sealed`]). Either way such
    /// a read is logged and counted in
    /// [`idempotency_unsealed_reads_total`](crate::store::encrypted::UNSEALED_READS_TOTAL).
    /// Without `encryption` it has no effect.
    ///
    /// The default value ([`StoreOptions::sql`]) is `true`: a new
    /// deployment stores nothing in clear, so a clear record was planted by
    /// whoever can write the store. When turning encryption on over
    /// records already stored in clear, set it to `false` until their
    /// retention has passed, then back to `true`.
    pub require_sealed: bool,
    /// The NATS JetStream store's server and bucket ([`StoreKind::Nats`]).
    pub nats: Option<NatsOptions<'a>>,
}

/// Where the NATS JetStream store keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatsOptions<'a> {
    /// The servers: one, or several separated by commas (`host:port` or
    /// `nats://host:port`).
    pub url: &'a str,
    /// The KV bucket (`[A-Za-z0-9_-]+`), created if missing.
    pub bucket: &'a str,
    /// The bucket's replicas when it is created: `None` for 3 on a
    /// cluster, 1 on a single server.
    pub replicas: Option<usize>,
}

impl<'a> NatsOptions<'a> {
    /// The bucket's name when none is given.
    pub const DEFAULT_BUCKET: &'static str = "idempotency";

    /// The servers at `url`, the default bucket and replicas.
    pub fn new(url: &'a str) -> Self {
        Self {
            url,
            bucket: Self::DEFAULT_BUCKET,
            replicas: None,
        }
    }
}

impl<'a> StoreOptions<'a> {
    /// The SQL store at `database_url`, everything else at its default.
    pub fn sql(database_url: &'a str) -> Self {
        Self {
            kind: StoreKind::Sql,
            database_url,
            redis_url: None,
            redis_prefix: "idem",
            notifications: false,
            encryption: None,
            require_sealed: true,
            nats: None,
        }
    }
}

#[cfg(feature = "postgres")]
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Which store [`AnyStore::open`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreKind {
    /// The SQL store the database URL names (`postgres://` or `sqlite:`).
    #[default]
    Sql,
    /// Redis, or Redis Cluster when the Redis URL lists several nodes.
    Redis,
    /// Redis in front of PostgreSQL.
    Tiered,
    /// A NATS JetStream KV bucket.
    Nats,
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sql" => Ok(Self::Sql),
            "redis" => Ok(Self::Redis),
            "tiered" => Ok(Self::Tiered),
            "nats" => Ok(Self::Nats),
            other => Err(format!(
                "unknown store {other:?}: expected sql, redis, tiered or nats"
            )),
        }
    }
}

/// Runs the same expression on whichever backend `self` holds.
macro_rules! on_backend {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            Backend::Postgres($store) => $body,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite($store) => $body,
            #[cfg(feature = "redis")]
            Backend::Redis($store) => $body,
            #[cfg(feature = "redis")]
            Backend::Tiered($store) => $body,
            #[cfg(feature = "nats")]
            Backend::Nats($store) => $body,
        }
    };
}

/// Runs the same expression on the plain or the sealed store.
macro_rules! on_store {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            AnyStore::Plain($store) => $body,
            AnyStore::Sealed($store) => $body,
        }
    };
}

impl Backend {
    /// Connects to the store a URL names: `postgres://` (or
    /// `postgresql://`) or `sqlite:`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] for another scheme (or one whose feature
    /// is off), [`StoreError::Unavailable`] when the store cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        #[cfg(feature = "postgres")]
        if is_postgres(url) {
            let store = crate::store::postgres::PostgresStore::connect(url, 32).await?;
            return Ok(Self::Postgres(store));
        }
        #[cfg(feature = "sqlite")]
        if url.starts_with("sqlite:") {
            let store = crate::store::sqlite::SqliteStore::connect(url).await?;
            return Ok(Self::Sqlite(store));
        }
        Err(StoreError::Unsupported("this database URL scheme"))
    }

    /// Applies the store's pending migrations (Redis has none).
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), crate::migrate::MigrationError> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(store) => store.migrate().await,
            #[cfg(feature = "sqlite")]
            Self::Sqlite(store) => store.migrate().await,
            #[cfg(feature = "redis")]
            Self::Redis(_) => Ok(()),
            #[cfg(feature = "redis")]
            Self::Tiered(store) => store.database().migrate().await,
            #[cfg(feature = "nats")]
            Self::Nats(_) => Ok(()),
        }
    }

    /// The backend's kind, for logs: `postgres`, `sqlite`, `redis`,
    /// `tiered` or `nats`.
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "sqlite",
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis",
            #[cfg(feature = "redis")]
            Self::Tiered(_) => "tiered",
            #[cfg(feature = "nats")]
            Self::Nats(_) => "nats",
        }
    }
}

impl AnyStore {
    /// Connects to the store a URL names: `postgres://` (or
    /// `postgresql://`) or `sqlite:`, its responses in clear.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] for another scheme (or one whose feature
    /// is off), [`StoreError::Unavailable`] when the store cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Ok(Self::Plain(Backend::connect(url).await?))
    }

    /// Opens the store `options` describe.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] when a URL the kind needs is missing or
    /// of the wrong scheme, [`StoreError::Unavailable`] when a server
    /// cannot be reached.
    pub async fn open(options: &StoreOptions<'_>) -> Result<Self, StoreError> {
        let store = Self::Plain(Self::open_plain(options).await?);
        Ok(match options.encryption {
            Some(keys) => store
                .with_encryption(keys.clone())
                .with_require_sealed(options.require_sealed),
            None => store,
        })
    }

    /// Opens the store `options` describe, without encryption.
    async fn open_plain(options: &StoreOptions<'_>) -> Result<Backend, StoreError> {
        let StoreOptions {
            kind,
            database_url,
            redis_url,
            redis_prefix,
            notifications,
            encryption: _,
            require_sealed: _,
            nats,
        } = *options;
        match kind {
            #[cfg(feature = "postgres")]
            StoreKind::Sql if notifications && is_postgres(database_url) => {
                // Irrefutable when PostgreSQL is the only store compiled in.
                #[allow(irrefutable_let_patterns)]
                let Backend::Postgres(postgres) = Backend::connect(database_url).await? else {
                    return Err(StoreError::Unsupported("notifications on this database"));
                };
                Ok(Backend::Postgres(postgres.with_notifications().await?))
            }
            StoreKind::Sql => Backend::connect(database_url).await,
            #[cfg(feature = "redis")]
            StoreKind::Redis => {
                let url = redis_url.ok_or(StoreError::Unsupported(
                    "the Redis store without a Redis URL",
                ))?;
                Ok(Backend::Redis(connect_redis(url, redis_prefix).await?))
            }
            #[cfg(feature = "redis")]
            StoreKind::Tiered => {
                let url = redis_url.ok_or(StoreError::Unsupported(
                    "the tiered store without a Redis URL",
                ))?;
                let Backend::Postgres(postgres) = Backend::connect(database_url).await? else {
                    return Err(StoreError::Unsupported(
                        "the tiered store over a database that is not PostgreSQL",
                    ));
                };
                let cache = connect_redis(url, redis_prefix).await?;
                // One registry of waiters for both sides; with notifications,
                // PostgreSQL wakes them too (and alone while Redis is down).
                let postgres = postgres.with_events(cache.events().clone());
                let postgres = if notifications {
                    postgres.with_notifications().await?
                } else {
                    postgres
                };
                Ok(Backend::Tiered(crate::store::tiered::TieredStore::new(
                    postgres, cache,
                )))
            }
            #[cfg(not(feature = "redis"))]
            StoreKind::Redis | StoreKind::Tiered => {
                let _ = (redis_url, redis_prefix, notifications);
                Err(StoreError::Unsupported("Redis (the redis feature is off)"))
            }
            #[cfg(feature = "nats")]
            StoreKind::Nats => {
                let nats =
                    nats.ok_or(StoreError::Unsupported("the NATS store without a NATS URL"))?;
                Ok(Backend::Nats(
                    crate::store::nats::NatsStore::connect_with_replicas(
                        nats.url,
                        nats.bucket,
                        nats.replicas,
                    )
                    .await?,
                ))
            }
            #[cfg(not(feature = "nats"))]
            StoreKind::Nats => {
                let _ = nats;
                Err(StoreError::Unsupported("NATS (the nats feature is off)"))
            }
        }
    }

    /// The backend, sealed or not.
    pub fn backend(&self) -> &Backend {
        match self {
            Self::Plain(backend) => backend,
            Self::Sealed(sealed) => sealed.inner(),
        }
    }

    /// Applies the store's pending migrations (Redis has none).
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), crate::migrate::MigrationError> {
        self.backend().migrate().await
    }

    /// Seals this store's responses with `keys` from now on (an
    /// [`EncryptedStore`] around it; a store already sealed takes the new
    /// keys and keeps its `require_sealed`). A store in clear becomes one
    /// that refuses a completed record without the sealed marker
    /// (`require_sealed` on, the documented default: fail closed); when
    /// turning encryption on over records stored in clear, follow with
    /// [`AnyStore::with_require_sealed`]`(false)` until their retention has
    /// passed. Sealed records stay readable while their key is among
    /// `keys`.
    ///
    /// Transactional mode is unavailable over the result
    /// ([`TransactionalStore::postgres`](crate::store::TransactionalStore::postgres)
    /// answers `None`): its completion would store the response in clear.
    pub fn with_encryption(self, keys: EncryptionKeys) -> Self {
        match self {
            Self::Plain(backend) => {
                Self::Sealed(EncryptedStore::new(backend, keys).with_require_sealed(true))
            }
            Self::Sealed(sealed) => {
                let required = sealed.requires_sealed();
                Self::Sealed(
                    EncryptedStore::new(sealed.inner().clone(), keys).with_require_sealed(required),
                )
            }
        }
    }

    /// Over an encrypted store: sets whether a completed response without
    /// the sealed marker is refused (see
    /// [`EncryptedStore::with_require_sealed`]). A store in clear is
    /// returned as it is.
    ///
    /// The default value is `true`, after [`AnyStore::with_encryption`] as
    /// after [`AnyStore::open`] (which applies
    /// [`StoreOptions::require_sealed`], default `true`).
    #[must_use]
    pub fn with_require_sealed(self, required: bool) -> Self {
        match self {
            Self::Plain(backend) => Self::Plain(backend),
            Self::Sealed(sealed) => Self::Sealed(sealed.with_require_sealed(required)),
        }
    }

    /// Whether records without the sealed marker are refused: `Some` over
    /// an encrypted store, `None` over one in clear.
    pub fn requires_sealed(&self) -> Option<bool> {
        match self {
            Self::Plain(_) => None,
            Self::Sealed(sealed) => Some(sealed.requires_sealed()),
        }
    }

    /// Whether stored responses are sealed (encryption at rest).
    pub fn is_encrypted(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Sealed(_) => true,
        }
    }

    /// The store's kind, for logs: `postgres`, `sqlite`, `redis`, `tiered` or `nats`
    /// (sealed or not: see [`AnyStore::is_encrypted`]).
    pub fn kind(&self) -> &'static str {
        self.backend().kind()
    }
}

/// One Redis, or a cluster when `url` lists several nodes.
#[cfg(feature = "redis")]
async fn connect_redis(
    url: &str,
    prefix: &str,
) -> Result<crate::store::redis::RedisStore, StoreError> {
    let nodes: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    match nodes.as_slice() {
        [one] => crate::store::redis::RedisStore::connect(one, prefix).await,
        many => crate::store::redis::RedisStore::connect_cluster(many, prefix).await,
    }
}

impl From<Backend> for AnyStore {
    fn from(backend: Backend) -> Self {
        Self::Plain(backend)
    }
}

/// `From<store>` for [`Backend`] and, in clear, for [`AnyStore`].
macro_rules! from_store {
    ($(#[$cfg:meta])* $variant:ident($store:ty)) => {
        $(#[$cfg])*
        impl From<$store> for Backend {
            fn from(store: $store) -> Self {
                Self::$variant(store)
            }
        }

        $(#[$cfg])*
        impl From<$store> for AnyStore {
            fn from(store: $store) -> Self {
                Self::Plain(Backend::$variant(store))
            }
        }
    };
}

from_store!(
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(crate::store::postgres::PostgresStore)
);
from_store!(
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(crate::store::sqlite::SqliteStore)
);
from_store!(
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(crate::store::redis::RedisStore)
);
from_store!(
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Tiered(crate::store::tiered::TieredStore)
);
from_store!(
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    Nats(crate::store::nats::NatsStore)
);

// The backend's calls box the delegated future: an `async fn` that matches
// on the store would otherwise be as large as the largest store's future
// (the tiered store's, PostgreSQL and Redis together, KiBs), and so would
// every guard future that awaits it, copied whole into its box and into
// each spawned task. One small allocation per call is cheaper. `AnyStore`
// then holds a small future whichever way it is composed.
impl Store for Backend {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        on_backend!(self, store => Box::pin(store.claim(new)).await)
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        on_backend!(self, store => Box::pin(store.take_over(previous, new)).await)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.complete(lease, response)).await)
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.renew(lease, duration)).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.release(lease)).await)
    }

    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.settle(lease, wait)).await)
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.record_steps(lease, steps)).await)
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        on_backend!(self, store => Box::pin(store.record_request(lease, request)).await)
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        on_backend!(self, store => Box::pin(store.get(scope, key)).await)
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        on_backend!(self, store => store.get_many(scope, keys).await)
    }

    fn events(&self) -> &RecordEvents {
        on_backend!(self, store => store.events())
    }
}

impl Store for AnyStore {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        on_store!(self, store => store.claim(new).await)
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        on_store!(self, store => store.take_over(previous, new).await)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        on_store!(self, store => store.complete(lease, response).await)
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        on_store!(self, store => store.renew(lease, duration).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        on_store!(self, store => store.release(lease).await)
    }

    async fn settle(&self, lease: &Lease, wait: Duration) -> Result<(), StoreError> {
        on_store!(self, store => store.settle(lease, wait).await)
    }

    async fn record_steps(&self, lease: &Lease, steps: &[Step]) -> Result<(), StoreError> {
        on_store!(self, store => store.record_steps(lease, steps).await)
    }

    async fn record_request(
        &self,
        lease: &Lease,
        request: Option<&StoredRequest>,
    ) -> Result<(), StoreError> {
        on_store!(self, store => store.record_request(lease, request).await)
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        on_store!(self, store => store.get(scope, key).await)
    }

    async fn get_many(
        &self,
        scope: &Scope,
        keys: &[IdempotencyKey],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        on_store!(self, store => store.get_many(scope, keys).await)
    }

    fn events(&self) -> &RecordEvents {
        on_store!(self, store => store.events())
    }
}

impl Purge for Backend {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        on_backend!(self, store => store.purge(limit).await)
    }
}

impl Purge for AnyStore {
    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        on_store!(self, store => store.purge(limit).await)
    }
}

/// Transactional mode runs over a plain PostgreSQL or tiered backend only:
/// over a sealed store its completion would store the response in clear.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl TransactionalStore for AnyStore {
    fn postgres(&self) -> Option<&crate::store::postgres::PostgresStore> {
        match self {
            Self::Plain(Backend::Postgres(store)) => Some(store),
            #[cfg(feature = "redis")]
            Self::Plain(Backend::Tiered(store)) => Some(store.database()),
            #[cfg(feature = "sqlite")]
            Self::Plain(Backend::Sqlite(_)) => None,
            #[cfg(feature = "redis")]
            Self::Plain(Backend::Redis(_)) => None,
            #[cfg(feature = "nats")]
            Self::Plain(Backend::Nats(_)) => None,
            Self::Sealed(_) => None,
        }
    }

    async fn committed(&self, lease: &Lease) {
        #[cfg(feature = "redis")]
        if let Self::Plain(Backend::Tiered(store)) = self {
            store.committed(lease).await;
        }
        let _ = lease;
    }
}

// After the `on_backend!` and `on_store!` macros, which it uses.
mod admin;
