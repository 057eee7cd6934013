//! The operators' operations on SQLite ([`AdminStore`]): a listing is one
//! keyset-paginated statement; a forget decides and deletes in one
//! statement.

use sqlx::Row;
use time::OffsetDateTime;

use super::{SqliteRecords, now_millis, record_from_row, to_millis};
use crate::key::Scope;
use crate::record::RecordState;
use crate::store::admin::{ForgetRule, Forgotten, Page, PageRequest, StateFilter, get_named};
use crate::store::{AdminStore, StoreError};

/// One page of a scope's records (keyset pagination by key; SQLite compares
/// text bytewise). `?3` is the state filter's name, `?5` the clock.
const ADMIN_LIST: &str = "select key, fingerprint, method, path, lease_token, lease_expires_at, \
    transactional, response_status, response_headers, response_body, created_at, completed_at, \
    expires_at, steps, request from idempotency_records
    where scope = ?1 and key > ?2 and expires_at > ?5
      and (?3 = 'any'
        or (?3 = 'completed' and state = 'completed')
        or (?3 = 'in_flight' and state = 'in_flight' and lease_expires_at > ?5)
        or (?3 = 'abandoned' and state = 'in_flight' and lease_expires_at <= ?5
            and transactional = 0))
    order by key
    limit ?4";

/// Deletes the record when the rule allows its state (`?3`: completed ones,
/// `?4`: abandoned ones; `?5` the clock), deciding and deleting in one
/// statement; a live lease always keeps it.
const ADMIN_FORGET: &str = "delete from idempotency_records
    where scope = ?1 and key = ?2
      and ((state = 'completed' and ?3) or (state = 'in_flight' and lease_expires_at <= ?5 and ?4))
    returning state";

impl AdminStore for SqliteRecords {
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
        let observed_at = OffsetDateTime::now_utc();
        let rows = sqlx::query(ADMIN_LIST)
            .bind(scope)
            .bind(page.after.unwrap_or(""))
            .bind(filter.as_str())
            .bind(i64::from(limit) + 1)
            .bind(to_millis(observed_at))
            .fetch_all(&self.pool)
            .await?;
        let records = rows
            .iter()
            .map(|row| {
                let key: String = row.try_get("key")?;
                let key = crate::record::stored_key(&key)?;
                record_from_row(row, &typed_scope, &key, observed_at)
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
            .bind(now_millis())
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
}
