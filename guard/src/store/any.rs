//! [`AnyStore`]: the store chosen at run time from a URL.

use std::time::Duration;

use crate::store::{Claim, Lease, LeaseToken, NewRecord, Store, StoreError};
use crate::{Record, RecordEvents, StoredResponse};

/// One of the stores, chosen at run time (an enum that delegates, so the
/// layer stays monomorphic and nothing is boxed).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// See [`PostgresStore`](crate::store::postgres::PostgresStore).
    #[cfg(feature = "postgres")]
    Postgres(crate::store::postgres::PostgresStore),
    /// See [`SqliteStore`](crate::store::sqlite::SqliteStore).
    #[cfg(feature = "sqlite")]
    Sqlite(crate::store::sqlite::SqliteStore),
}

/// Runs the same expression on whichever store `self` holds.
macro_rules! delegate {
    ($self:expr, $store:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($store) => $body,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($store) => $body,
        }
    };
}

impl AnyStore {
    /// Connects to the store a URL names: `postgres://` (or
    /// `postgresql://`) or `sqlite:`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] for another scheme (or one whose feature
    /// is off), [`StoreError::Unavailable`] when the store cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        #[cfg(feature = "postgres")]
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
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

    /// Applies the store's pending migrations.
    ///
    /// # Errors
    ///
    /// Returns the migration that failed, or the connection error.
    pub async fn migrate(&self) -> Result<(), crate::MigrationError> {
        delegate!(self, store => store.migrate().await)
    }

    /// The store's kind, for logs: `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgres",
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "sqlite",
        }
    }
}

#[cfg(feature = "postgres")]
impl From<crate::store::postgres::PostgresStore> for AnyStore {
    fn from(store: crate::store::postgres::PostgresStore) -> Self {
        Self::Postgres(store)
    }
}

#[cfg(feature = "sqlite")]
impl From<crate::store::sqlite::SqliteStore> for AnyStore {
    fn from(store: crate::store::sqlite::SqliteStore) -> Self {
        Self::Sqlite(store)
    }
}

impl Store for AnyStore {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        delegate!(self, store => store.claim(new).await)
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        delegate!(self, store => store.take_over(previous, new).await)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        delegate!(self, store => store.complete(lease, response).await)
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        delegate!(self, store => store.renew(lease, duration).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        delegate!(self, store => store.release(lease).await)
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        delegate!(self, store => store.get(scope, key).await)
    }

    async fn get_many(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Record>>, StoreError> {
        delegate!(self, store => store.get_many(scope, keys).await)
    }

    async fn purge(&self, limit: u32) -> Result<u64, StoreError> {
        delegate!(self, store => store.purge(limit).await)
    }

    fn events(&self) -> &RecordEvents {
        delegate!(self, store => store.events())
    }

    #[cfg(feature = "postgres")]
    fn transactions(&self) -> Option<&crate::store::postgres::PostgresStore> {
        delegate!(self, store => store.transactions())
    }
}
