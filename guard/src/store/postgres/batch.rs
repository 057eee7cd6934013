//! Batches on PostgreSQL ([`BatchedStore`]): the claims of a batch are one
//! `insert … select from unnest(…) on conflict do nothing` (one row of
//! answer per claim, in input order), its completions one `update … from
//! unnest(…)`, fenced per row: one statement and one commit serve many
//! requests.

use sqlx::Row;

use super::{NOTIFY_CHANNEL, PostgresRecords, record_from_row};
use crate::record::StoredResponse;
use crate::store::sql::{CLAIM_ATTEMPTS, millis};
use crate::store::{BatchedStore, Claim, ClaimItem, Lease, Store, StoreError};

/// The claims of a batch, one statement: like the single claim's, per row of the
/// input arrays, answering one row per claim in input order (`n`). Rows are
/// inserted in key order, so two batches never wait on each other's keys in
/// opposite orders.
const CLAIM_BATCH: &str = "with input as (
        select * from unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[],
                             $6::uuid[], $7::int8[], $8::bool[], $9::int8[])
            with ordinality as input(scope, key, fingerprint, method, path, token,
                                     lease_ms, transactional, retention_ms, n)
    ), existing as (
        select input.n, r.fingerprint, r.method, r.path, r.lease_token, r.lease_expires_at,
               r.transactional, r.response_status, r.response_headers, r.response_body,
               r.created_at, r.completed_at, r.expires_at, r.steps, r.request
        from input join idempotency_records r on r.scope = input.scope and r.key = input.key
    ), inserted as (
        insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
        select scope, key, fingerprint, method, path, 'in_flight', token,
               now() + lease_ms * interval '1 millisecond', transactional, now(),
               now() + retention_ms * interval '1 millisecond'
        from input
        where not exists (select 1 from existing where existing.n = input.n)
        order by scope, key, n
        on conflict (scope, key) do nothing
        returning lease_token
    )
    select input.n,
           exists (select 1 from inserted where inserted.lease_token = input.token) as acquired,
           existing.fingerprint, existing.method, existing.path, existing.lease_token,
           existing.lease_expires_at, existing.transactional, existing.response_status,
           existing.response_headers, existing.response_body, existing.created_at,
           existing.completed_at, existing.expires_at, existing.steps, existing.request,
           now() as observed_at
    from input left join existing on existing.n = input.n
    order by input.n";

/// The completions of a batch, one statement, fenced per row: answers the
/// input positions (`n`) of the rows it completed.
const COMPLETE_BATCH: &str = "with input as (
        select * from unnest($1::text[], $2::text[], $3::uuid[], $4::int2[], $5::bytea[],
                             $6::bytea[])
            with ordinality as input(scope, key, token, status, headers, body, n)
    ), updated as (
        update idempotency_records r set
            state = 'completed', response_status = input.status,
            response_headers = input.headers, response_body = input.body,
            completed_at = clock_timestamp()
        from input
        where r.scope = input.scope and r.key = input.key and r.lease_token = input.token
          and r.state = 'in_flight'
        returning input.n, r.scope, r.key
    )
    select n, case when $7 then pg_notify($8, octet_length(scope)::text || ':' || scope || key)
              end::text as notified
    from updated";

/// A completion waiting in a batch.
type CompleteItem = (Lease, StoredResponse);

impl BatchedStore for PostgresRecords {
    type Completion = CompleteItem;

    fn completion(&self, lease: &Lease, response: &StoredResponse) -> CompleteItem {
        (lease.clone(), response.clone())
    }

    /// Claims a batch: one statement, then again for the rows that raced a
    /// concurrent insert committed after its snapshot.
    async fn claim_batch(
        &self,
        items: Vec<ClaimItem>,
    ) -> Result<Vec<Result<Claim, StoreError>>, StoreError> {
        // A batch of one (no load): the single-claim statement, which is
        // cheaper to run than the batch's.
        if let [item] = items.as_slice() {
            return Ok(vec![self.claim(&item.as_new()).await]);
        }
        let mut results: Vec<Option<Result<Claim, StoreError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let mut connection = self.connection().await?;
        for _ in 0..CLAIM_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let column = |f: &dyn Fn(&ClaimItem) -> &str| -> Vec<&str> {
                pending.iter().map(|&i| f(&items[i])).collect()
            };
            let rows = sqlx::query(CLAIM_BATCH)
                .bind(column(&|item| item.scope.as_str()))
                .bind(column(&|item| item.key.as_str()))
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].fingerprint.as_bytes().to_vec())
                        .collect::<Vec<_>>(),
                )
                .bind(column(&|item| &item.method))
                .bind(column(&|item| &item.path))
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].token.as_uuid())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| millis(items[i].lease))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| items[i].transactional)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    pending
                        .iter()
                        .map(|&i| millis(items[i].retention))
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *connection)
                .await?;
            if rows.len() != pending.len() {
                return Err(StoreError::Unavailable(
                    "the batch claim answered the wrong number of rows".into(),
                ));
            }
            let mut again = Vec::new();
            for (row, &index) in rows.iter().zip(&pending) {
                let item = &items[index];
                if row.try_get::<bool, _>("acquired")? {
                    results[index] = Some(Ok(Claim::Acquired(item.as_new().lease())));
                } else if row.try_get::<Option<Vec<u8>>, _>("fingerprint")?.is_some() {
                    results[index] = Some(
                        record_from_row(row, &item.scope, &item.key)
                            .map(|record| Claim::Existing(Box::new(record))),
                    );
                } else {
                    // Raced an insert committed after the snapshot (or one
                    // of this batch's own rows for the same key): again.
                    again.push(index);
                }
            }
            pending = again;
        }
        self.keep(connection);
        Ok(results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(StoreError::Unavailable(
                        "the claim kept racing a concurrent insert".into(),
                    ))
                })
            })
            .collect())
    }

    /// Completes a batch: one statement, fenced per row.
    async fn complete_batch(
        &self,
        items: Vec<CompleteItem>,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        if let [(lease, response)] = items.as_slice() {
            return Ok(vec![self.complete(lease, response).await]);
        }
        let mut connection = self.connection().await?;
        let rows = sqlx::query(COMPLETE_BATCH)
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.scope.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(lease, _)| lease.token.as_uuid())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| {
                        i16::try_from(response.status.as_u16()).unwrap_or(i16::MAX)
                    })
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| response.encode_headers())
                    .collect::<Vec<_>>(),
            )
            .bind(
                items
                    .iter()
                    .map(|(_, response)| response.body.as_ref().map(|b| b.to_vec()))
                    .collect::<Vec<_>>(),
            )
            .bind(self.listener.is_some())
            .bind(NOTIFY_CHANNEL)
            .fetch_all(&mut *connection)
            .await?;
        self.keep(connection);
        let mut completed = vec![false; items.len()];
        for row in &rows {
            let n: i64 = row.try_get("n")?;
            if let Some(slot) = usize::try_from(n - 1)
                .ok()
                .and_then(|i| completed.get_mut(i))
            {
                *slot = true;
            }
        }
        Ok(completed
            .into_iter()
            .map(|done| {
                if done {
                    Ok(())
                } else {
                    Err(StoreError::LeaseLost)
                }
            })
            .collect())
    }
}
