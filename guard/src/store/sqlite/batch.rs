//! Batches on SQLite ([`BatchedStore`]): a batch of claims reads every
//! key first on one connection (a replay takes no write lock), then
//! inserts the misses in one `BEGIN IMMEDIATE` transaction (one commit,
//! one fsync); a batch of completions is one such transaction, fenced per
//! row.

use time::OffsetDateTime;

use super::{COMPLETE, GET, INSERT, SqliteRecords, now_millis, record_from_row, token_bytes};
use crate::record::StoredResponse;
use crate::store::sql::{fenced, millis};
use crate::store::{BatchedStore, Claim, ClaimItem, Lease, StoreError};

/// A completion waiting in a batch.
type CompleteItem = (Lease, StoredResponse);

impl BatchedStore for SqliteRecords {
    type Completion = CompleteItem;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> CompleteItem {
        (lease.clone(), response.clone())
    }

    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        // Reads first, on one connection: replays take no write lock.
        let mut results: Vec<Option<Claim>> = Vec::with_capacity(items.len());
        {
            let mut connection = self.pool.acquire().await?;
            for item in &items {
                let observed_at = OffsetDateTime::now_utc();
                let row = sqlx::query(GET)
                    .bind(item.scope.as_str())
                    .bind(item.key.as_str())
                    .fetch_optional(&mut *connection)
                    .await?;
                results.push(
                    row.map(|row| record_from_row(&row, &item.scope, &item.key, observed_at))
                        .transpose()?
                        .map(|record| Claim::Existing(Box::new(record))),
                );
            }
        }
        if results.iter().any(Option::is_none) {
            // The misses, in one write transaction: each insert arbitrates
            // (`on conflict do nothing`); a lost one reads the winner,
            // which the write lock keeps in place until the commit.
            let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let now = now_millis();
            for (item, result) in items.iter().zip(&mut results) {
                if result.is_some() {
                    continue;
                }
                let inserted = sqlx::query(INSERT)
                    .bind(item.scope.as_str())
                    .bind(item.key.as_str())
                    .bind(item.fingerprint.as_bytes().as_slice())
                    .bind(&item.method)
                    .bind(&item.path)
                    .bind(token_bytes(item.token))
                    .bind(now)
                    .bind(millis(item.lease))
                    .bind(i64::from(item.transactional))
                    .bind(millis(item.retention))
                    .execute(&mut *transaction)
                    .await?;
                if inserted.rows_affected() == 1 {
                    *result = Some(Claim::Acquired(item.as_new().lease()));
                    continue;
                }
                let observed_at = OffsetDateTime::now_utc();
                let row = sqlx::query(GET)
                    .bind(item.scope.as_str())
                    .bind(item.key.as_str())
                    .fetch_one(&mut *transaction)
                    .await?;
                let record = record_from_row(&row, &item.scope, &item.key, observed_at)?;
                *result = Some(Claim::Existing(Box::new(record)));
            }
            transaction.commit().await?;
        }
        Ok(results
            .into_iter()
            .map(|claim| {
                claim.ok_or_else(|| {
                    StoreError::Unavailable("a claim of the batch went unanswered".into())
                })
            })
            .collect())
    }

    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_millis();
        let mut results = Vec::with_capacity(items.len());
        for (lease, response) in &items {
            let result = sqlx::query(COMPLETE)
                .bind(lease.scope.as_str())
                .bind(lease.key.as_str())
                .bind(token_bytes(lease.token))
                .bind(i64::from(response.status.as_u16()))
                .bind(response.encode_headers())
                .bind(response.body.as_ref().map(|b| b.to_vec()))
                .bind(now)
                .execute(&mut *transaction)
                .await?;
            results.push(fenced(result.rows_affected()));
        }
        transaction.commit().await?;
        Ok(results)
    }
}
