//! Single-commit transactional mode, the store's half: the key is held by a
//! transaction-scoped advisory lock, not by a committed claim.
//!
//! One transaction per run: `BEGIN`; one statement takes the lock
//! (`pg_try_advisory_xact_lock` on a 64-bit hash of the scope and key),
//! reads the committed record and, when the lock is taken and there is
//! none, inserts the claim (uncommitted, seen by nobody else); the work
//! writes in the same transaction; the completion is written in it and the
//! whole commits once. A crash, a timeout or a rollback ends the
//! transaction and frees the lock with it, so nothing is left to take over
//! and no lease needs renewing.
//!
//! Why it is exclusive: only the lock holder inserts, and PostgreSQL frees
//! a transaction-scoped lock only when the transaction ends, after its
//! commit. The statement that takes the lock takes its snapshot a moment
//! before the lock is granted, though: a record the previous holder
//! committed in between is invisible to its read but not to its insert
//! (`on conflict` sees every committed row), which then inserts nothing;
//! the claim reads the record again in a statement of its own, whose
//! snapshot does see it.
//!
//! Two keys whose hashes collide share a lock: one of them waits or answers
//! in flight while the other runs (with 64 bits, about one pair in 4·10⁹
//! keys running *at the same moment*); neither ever runs twice, because the
//! record, not the lock, says what ran. Advisory locks are per database, so
//! the lock taken is the key's hash XOR the records table's OID: stores in
//! two schemas of one database (one per tenant, say) do not hold each
//! other's keys. An application that takes its own advisory locks on 64-bit
//! keys there may collide in the same harmless way.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Row;

use super::{GET, PostgresStore, RunTransaction, millis, record_from_row};
use crate::record::Record;
use crate::store::{Lease, NewRecord, StoreError};

/// The lock, the read and the claim of one key, in one statement. `$10` is
/// the key's [`lock_key`], taken XOR the records table's OID (so two
/// stores in different schemas of one database never share a lock), `$11` the server's bound on the transaction's idle time
/// (`idle_in_transaction_session_timeout`, local to the transaction).
const CLAIM_LOCKED: &str = concat!(
    "with lock as (
        select pg_try_advisory_xact_lock($10 # 'idempotency_records'::regclass::oid::int8) as held,
               set_config('idle_in_transaction_session_timeout', $11, true) as idle_bound
    ), existing as (
        select ",
    record_columns!(),
    " from idempotency_records where scope = $1 and key = $2
    ), inserted as (
        insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
        select $1, $2, $3, $4, $5, 'in_flight', $6, now() + $7 * interval '1 millisecond',
               $8, now(), now() + $9 * interval '1 millisecond'
        where (select held from lock) and not exists (select 1 from existing)
        on conflict (scope, key) do nothing
        returning 1
    )
    select (select held from lock) as held, exists (select 1 from inserted) as acquired,
           existing.*
    from (values (1)) as one
    left join existing on true"
);

/// Which of the given lock keys some transaction of this database holds.
pub(super) const LOCKS_HELD: &str = "select exists (
        select 1 from pg_locks l
        where l.locktype = 'advisory' and l.granted and l.objsubid = 1
          and l.database = (select oid from pg_database where datname = current_database())
          and ((l.classid::int8 << 32) | l.objid::int8)
              = input.lock # 'idempotency_records'::regclass::oid::int8
    ) as held
    from unnest($1::int8[]) with ordinality as input(lock, n)
    order by input.n";

/// The advisory lock key of `(scope, key)`: the first 8 bytes of a
/// SHA-256 over a domain tag, the scope's length, the scope and the key
/// (so no two `(scope, key)` pairs are spelled alike). The lock the store
/// takes is this value XOR the OID of its `idempotency_records` table, so
/// that stores in different schemas of one database never share one.
pub fn lock_key(scope: &str, key: &str) -> i64 {
    let mut hash = Sha256::new();
    hash.update(b"idempotency-guard single-commit lock v1\0");
    hash.update((scope.len() as u64).to_be_bytes());
    hash.update(scope.as_bytes());
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// What [`PostgresStore::claim_locked`] found.
pub enum LockedClaim {
    /// This run holds the key's lock and its uncommitted claim, in
    /// `transaction`: write through it, complete in it, commit once.
    Acquired {
        /// The run's transaction.
        transaction: RunTransaction,
        /// The lease the claim carries (it fences the completion).
        lease: Lease,
    },
    /// The key has a committed record (the transaction was rolled back).
    Existing(Box<Record>),
    /// Another transaction holds the key's lock and nothing is committed:
    /// a run is in flight (the transaction was rolled back).
    Busy,
}

impl std::fmt::Debug for LockedClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Acquired { lease, .. } => {
                f.debug_struct("Acquired").field("lease", lease).finish()
            }
            Self::Existing(record) => f.debug_tuple("Existing").field(record).finish(),
            Self::Busy => f.write_str("Busy"),
        }
    }
}

impl PostgresStore {
    /// Claims `new`'s key in a transaction of its own, held by the key's
    /// advisory lock (single-commit transactional mode). PostgreSQL ends
    /// the transaction by itself once it stays idle longer than
    /// `idle_bound` (a hung process cannot hold the key forever).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails; nothing is then
    /// committed and the lock is gone with the transaction.
    pub async fn claim_locked(
        &self,
        new: &NewRecord<'_>,
        idle_bound: Duration,
    ) -> Result<LockedClaim, StoreError> {
        let mut transaction = self.begin_run().await?;
        let row = sqlx::query(CLAIM_LOCKED)
            .bind(new.scope.as_str())
            .bind(new.key.as_str())
            .bind(new.fingerprint.as_bytes().as_slice())
            .bind(new.method)
            .bind(new.path)
            .bind(new.token.as_uuid())
            .bind(millis(new.lease))
            .bind(true)
            .bind(millis(new.retention))
            .bind(lock_key(new.scope.as_str(), new.key.as_str()))
            .bind(format!("{}ms", millis(idle_bound).max(1)))
            .fetch_one(&mut *transaction)
            .await?;
        if row.try_get::<bool, _>("acquired")? {
            return Ok(LockedClaim::Acquired {
                transaction,
                lease: new.lease(),
            });
        }
        let held: bool = row.try_get("held")?;
        let found = if row.try_get::<Option<Vec<u8>>, _>("fingerprint")?.is_some() {
            Some(record_from_row(&row, new.scope, new.key)?)
        } else if held {
            // Committed by the previous holder after this statement's
            // snapshot: a statement of its own sees it.
            sqlx::query(GET)
                .bind(new.scope.as_str())
                .bind(new.key.as_str())
                .fetch_optional(&mut *transaction)
                .await?
                .map(|row| record_from_row(&row, new.scope, new.key))
                .transpose()?
        } else {
            None
        };
        // Frees the lock at once (dropping the transaction would leave the
        // rollback to the pool).
        let _ = transaction.rollback().await;
        Ok(match found {
            Some(record) => LockedClaim::Existing(Box::new(record)),
            // Held by another run, or deleted right after it committed:
            // either way the caller asks again later.
            None => LockedClaim::Busy,
        })
    }

    /// Which of `keys` of `scope` a single-commit run holds right now (its
    /// advisory lock is taken), one answer per key, in order. A key that has
    /// no committed record but is held is in flight.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store fails.
    pub async fn locks_held(&self, scope: &str, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        use crate::store::AdminStore;
        self.direct().held_without_record(scope, keys).await
    }

    /// Wakes waiters in other processes after a single-commit run rolled
    /// back (nothing committed, so nothing else sends the `NOTIFY`).
    pub(crate) async fn announce_rolled_back(&self, lease: &Lease) {
        if let Err(error) = self.direct().notify(self.pool(), lease).await {
            tracing::debug!(error = %error, "could not announce a rolled-back run");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_separate_scope_from_key() {
        assert_ne!(lock_key("ab", "c"), lock_key("a", "bc"));
        assert_ne!(lock_key("", "abc"), lock_key("abc", ""));
        assert_eq!(lock_key("tenant", "k"), lock_key("tenant", "k"));
    }
}
