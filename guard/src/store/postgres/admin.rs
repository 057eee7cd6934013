//! The operators' operations on PostgreSQL ([`AdminStore`]): a listing is
//! one keyset-paginated statement; a forget decides and deletes in one
//! statement; a key held by single-commit mode's advisory lock is found by
//! `pg_locks`.

use sqlx::Row;

use super::single_commit::{LOCKS_HELD, lock_key};
use super::{PostgresRecords, record_from_row};
use crate::key::Scope;
use crate::record::RecordState;
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter, get_named};
use crate::store::{AdminStore, StoreError};

/// One page of a scope's records (keyset pagination by key, byte order).
/// `$3` is the state filter's name; expired records are left out.
const ADMIN_LIST: &str = concat!(
    "select key, ",
    record_columns!(),
    " from idempotency_records
    where scope = $1 and key collate \"C\" > $2 and expires_at > now()
      and ($3 = 'any'
        or ($3 = 'completed' and state = 'completed')
        or ($3 = 'in_flight' and state = 'in_flight' and lease_expires_at > now())
        or ($3 = 'abandoned' and state = 'in_flight' and lease_expires_at <= now()
            and not transactional))
    order by key collate \"C\"
    limit $4"
);

/// Deletes the record when the rule allows its state (`$3`: completed ones,
/// `$4`: abandoned ones), deciding and deleting in one statement; a live
/// lease always keeps it.
const ADMIN_FORGET: &str = "delete from idempotency_records
    where scope = $1 and key = $2
      and ((state = 'completed' and $3)
        or (state = 'in_flight' and lease_expires_at <= now() and $4))
    returning state";

impl AdminStore for PostgresRecords {
    async fn list(
        &self,
        scope: &str,
        filter: StateFilter,
        page: PageRequest<'_>,
    ) -> Result<Page, StoreError> {
        let limit = page.clamped_limit();
        // A scope that breaks the rule holds no record.
        let Ok(typed_scope) = Scope::try_from(scope) else {
            return Ok(Page::from_overfetch(Vec::new(), limit));
        };
        let rows = sqlx::query(ADMIN_LIST)
            .bind(scope)
            .bind(page.after.unwrap_or(""))
            .bind(filter.as_str())
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.pool)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                let key: String = row.try_get("key")?;
                record_from_row(row, &typed_scope, &crate::record::stored_key(&key)?)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page::from_overfetch(records, limit))
    }

    async fn forget(
        &self,
        scope: &str,
        key: &str,
        rule: ForgetRule,
    ) -> Result<Forgotten, StoreError> {
        let deleted = sqlx::query(ADMIN_FORGET)
            .bind(scope)
            .bind(key)
            .bind(rule.allows(RecordState::Completed))
            .bind(rule.allows(RecordState::Abandoned))
            .fetch_optional(&self.pool)
            .await?;
        if let Some(row) = deleted {
            let state: String = row.try_get("state")?;
            self.events.publish(scope, key);
            return Ok(Forgotten::Deleted(if state == "completed" {
                RecordState::Completed
            } else {
                RecordState::Abandoned
            }));
        }
        // Nothing deleted: say why (a read after the decision, for the
        // answer only).
        Ok(match get_named(self, scope, key).await? {
            Some(record) => Forgotten::Refused(record.state()),
            None => Forgotten::Missing,
        })
    }

    async fn held_without_record(
        &self,
        scope: &str,
        keys: &[&str],
    ) -> Result<Vec<bool>, StoreError> {
        let locks: Vec<i64> = keys.iter().map(|key| lock_key(scope, key)).collect();
        let rows = sqlx::query(LOCKS_HELD)
            .bind(locks)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| row.try_get::<bool, _>("held").map_err(StoreError::from))
            .collect()
    }
}
