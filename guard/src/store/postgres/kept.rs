//! The run's connection: kept between runs instead of given back to sqlx's
//! pool, and the transaction a run drives on it ([`RunTransaction`]).
//!
//! sqlx pings every connection it takes back into its pool (a `Sync` and
//! its `ReadyForQuery`, in a task of its own): one more round trip after
//! every run's `COMMIT`, and about a sixth of the single-commit example's
//! throughput (docs/BENCHMARKS.md, issue 56). A run's transaction ends in a
//! known state (its `COMMIT` or `ROLLBACK` answered), so its connection
//! needs no such check: the store keeps it ([`KeptConnections`]) and hands
//! it to the next run.
//!
//! A kept connection stays checked out of the pool, so that nothing of
//! the application's own use of the pool ever waits on it:
//!
//! - it is kept only while the pool has room (an idle connection, or fewer
//!   open than its maximum: nobody is waiting for one); otherwise it goes
//!   back to the pool at once;
//! - one left unused for [`KEPT_FOR`] goes back to the pool (pinged there
//!   as usual) at the next sweep (one every [`KEPT_FOR`] while any is
//!   kept: 20 to 40 ms unused in all), so that a store that turns idle
//!   holds nothing;
//! - a connection whose statement failed, whose commit or rollback failed,
//!   or that sqlx still counts inside a transaction is never kept;
//! - one out of the pool for [`MAX_SPAN`] goes back to it at its next
//!   give-back, however busy, so that the pool's own checks of its
//!   connections (their maximum lifetime) still reach each of them.
//!
//! A pool's `before_acquire` and `after_release` hooks run when a
//! connection leaves and rejoins the pool, not between the store's uses.
//!
//! The transaction is driven with sqlx's own transaction manager (`BEGIN`,
//! `COMMIT`, and on drop a `ROLLBACK` queued for the connection's next
//! use, exactly as a `sqlx::Transaction` does), so sqlx's nesting depth
//! holds: a handler's `(&mut *tx).begin()` is a savepoint, as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{PgConnection, PgPool, Postgres};
use sqlx_core::transaction::TransactionManager;

/// How long a kept connection waits for the next run before it goes back
/// to the pool.
pub(crate) const KEPT_FOR: Duration = Duration::from_millis(20);

/// How long a connection stays out of the pool, kept and used again, before
/// it goes back at its next give-back.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(10);

/// The most connections kept at once (beyond the pool's own bound, which
/// the room check keeps anyway).
const MAX_KEPT: usize = 256;

/// Connections runs gave back, the last given back on top.
#[derive(Debug, Default)]
pub(crate) struct KeptConnections {
    kept: Mutex<Vec<(KeptConnection, Instant)>>,
    /// Whether a task sweeps the connections left unused.
    sweeping: AtomicBool,
}

impl KeptConnections {
    /// A kept connection (the last given back), or one from `pool`.
    pub(crate) async fn acquire(&self, pool: &PgPool) -> Result<KeptConnection, sqlx::Error> {
        let kept = self
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match kept {
            Some((connection, _)) => Ok(connection),
            None => Ok(KeptConnection {
                connection: pool.acquire().await?,
                since: Instant::now(),
            }),
        }
    }

    /// Keeps `connection` for the next run, or gives it back to `pool` when
    /// the pool has no room left (someone may be waiting for it), sqlx
    /// still counts it inside a transaction, or it has been out of the pool
    /// for [`MAX_SPAN`].
    pub(crate) fn give_back(self: &Arc<Self>, pool: &PgPool, connection: KeptConnection) {
        let in_transaction = PgTransactionManager::get_transaction_depth(&connection) != 0;
        let room = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        if in_transaction || !room || connection.since.elapsed() >= MAX_SPAN {
            drop(connection);
            return;
        }
        {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.len() >= MAX_KEPT {
                drop(kept);
                drop(connection);
                return;
            }
            kept.push((connection, Instant::now()));
        }
        self.sweep_later();
    }

    /// Keeps the connection of a transaction that ended.
    fn keep_ended(self: &Arc<Self>, pool: &PgPool, mut open: OpenConnection) {
        if let Some(connection) = open.0.take() {
            self.give_back(pool, connection);
        }
    }

    /// Starts the task that gives back connections left unused, unless one
    /// runs. It stops once nothing is kept.
    fn sweep_later(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(KEPT_FOR).await;
                if this.sweep() > 0 {
                    continue;
                }
                this.sweeping.store(false, Ordering::Release);
                // A connection kept between the sweep and the flag's reset
                // found the flag set and started no task: sweep on, unless
                // another task has started meanwhile.
                if this.len() == 0 || this.sweeping.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Gives back to the pool the connections unused for [`KEPT_FOR`];
    /// returns how many are left.
    fn sweep(&self) -> usize {
        let stale: Vec<_> = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            // The oldest are at the bottom.
            let fresh = kept
                .iter()
                .position(|(_, at)| at.elapsed() < KEPT_FOR)
                .unwrap_or(kept.len());
            kept.drain(..fresh).collect()
        };
        // Dropped outside the lock: each goes back to its pool.
        drop(stale);
        self.len()
    }

    /// How many connections are kept.
    pub(crate) fn len(&self) -> usize {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A connection out of the pool, kept between uses: derefs to the
/// [`PgConnection`]. `since` is when it left the pool.
pub(crate) struct KeptConnection {
    connection: PoolConnection<Postgres>,
    since: Instant,
}

impl std::fmt::Debug for KeptConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptConnection")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for KeptConnection {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.connection
    }
}

impl std::ops::DerefMut for KeptConnection {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.connection
    }
}

/// A run's transaction on a connection the store keeps between runs: derefs
/// to the [`PgConnection`] (`&mut *transaction` is an executor), commits or
/// rolls back like a `sqlx::Transaction`, and, dropped while open, rolls
/// back on the connection's next use as `sqlx::Transaction` does.
pub struct RunTransaction {
    /// `None` once committed or rolled back.
    connection: Option<KeptConnection>,
    pool: PgPool,
    kept: Arc<KeptConnections>,
}

impl std::fmt::Debug for RunTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunTransaction")
            .field("open", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl RunTransaction {
    /// Begins a transaction on a kept connection, or on one of `pool`'s.
    pub(crate) async fn begin(
        pool: &PgPool,
        kept: &Arc<KeptConnections>,
    ) -> Result<Self, sqlx::Error> {
        let mut connection = kept.acquire(pool).await?;
        // A failed `BEGIN` leaves nothing to roll back; the connection goes
        // back to the pool, which checks it.
        PgTransactionManager::begin(&mut connection, None).await?;
        Ok(Self {
            connection: Some(connection),
            pool: pool.clone(),
            kept: Arc::clone(kept),
        })
    }

    /// Commits, and keeps the connection for the next run.
    ///
    /// # Errors
    ///
    /// What the `COMMIT` answered; the transaction is then rolled back and
    /// its connection given back to the pool.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        let mut open = self.open();
        PgTransactionManager::commit(&mut open).await?;
        self.kept.keep_ended(&self.pool, open);
        Ok(())
    }

    /// Rolls back, and keeps the connection for the next run.
    ///
    /// # Errors
    ///
    /// What the `ROLLBACK` answered; the connection then goes back to the
    /// pool with a rollback queued, as a dropped transaction's does.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        let mut open = self.open();
        PgTransactionManager::rollback(&mut open).await?;
        self.kept.keep_ended(&self.pool, open);
        Ok(())
    }

    /// The connection, out of `self` while it commits or rolls back: if
    /// that future is dropped or fails, its drop queues the rollback.
    fn open(&mut self) -> OpenConnection {
        OpenConnection(self.connection.take())
    }
}

/// A transaction's connection while its `COMMIT` or `ROLLBACK` is on its
/// way; dropped (that failed, or its future was dropped) it queues a
/// rollback, as a dropped transaction does.
struct OpenConnection(Option<KeptConnection>);

impl std::ops::Deref for OpenConnection {
    type Target = KeptConnection;

    fn deref(&self) -> &KeptConnection {
        self.0
            .as_ref()
            .expect("an open transaction has its connection")
    }
}

impl std::ops::DerefMut for OpenConnection {
    fn deref_mut(&mut self) -> &mut KeptConnection {
        self.0
            .as_mut()
            .expect("an open transaction has its connection")
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(connection) = self.0.as_mut() {
            PgTransactionManager::start_rollback(connection);
        }
    }
}

impl std::ops::Deref for RunTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.connection
            .as_ref()
            .expect("an open transaction has its connection")
    }
}

impl std::ops::DerefMut for RunTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.connection
            .as_mut()
            .expect("an open transaction has its connection")
    }
}

impl Drop for RunTransaction {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.as_mut() {
            // Queued, sent with the connection's next use; the pool takes
            // the connection back (and its ping flushes the rollback).
            PgTransactionManager::start_rollback(connection);
        }
    }
}
