//! Throughput as the table grows (`--growth`): PostgreSQL seeded with 1M
//! and 10M completed records (10% of them past their retention), then the
//! guard on fresh keys, once alone and once while the purge deletes the
//! expired records, to show that the cost per request stays flat and that
//! purging keeps up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idempotency_guard::Purge as _;
use idempotency_guard::store::postgres::PostgresStore;
use sqlx::Connection as _;

use crate::cli::{App, StoreName};
use crate::harness::Bench;
use crate::load::{self, Keys, Load};
use crate::results::GrowthRow;
use crate::stats::Summary;

/// Rows inserted by one statement while seeding.
const CHUNK: u64 = 1_000_000;
/// Records deleted by one purge statement (as `purge_expired` is called
/// with by the service).
const PURGE_BATCH: u32 = 1000;

/// Measures every size of `--growth-rows` and an empty table.
pub(crate) async fn run(bench: &mut Bench) -> anyhow::Result<Vec<GrowthRow>> {
    let concurrency = if bench.args.concurrency.contains(&16) {
        16
    } else {
        bench.args.concurrency.first().copied().unwrap_or(1)
    };
    let mut sizes = vec![0];
    sizes.extend(bench.args.growth_rows.iter().copied());
    let mut out = Vec::new();
    for rows in sizes {
        bench.db.truncate().await?;
        eprintln!("growth: seeding {rows} records");
        let started = Instant::now();
        seed(bench, rows).await?;
        let seed_seconds = started.elapsed().as_secs_f64();
        let (table_bytes,): (i64,) =
            sqlx::query_as("select pg_total_relation_size('idempotency_records')")
                .fetch_one(&bench.db.pool)
                .await?;
        let alone = measure(bench, concurrency).await?;
        let (purging, purged, purge_seconds) = {
            let (summary, purge) = measure_with_purge(bench, concurrency).await?;
            (summary, purge.0, purge.1)
        };
        let row = GrowthRow {
            rows,
            expired: rows / 10,
            seed_seconds,
            table_mib: table_bytes as f64 / 1024.0 / 1024.0,
            concurrency,
            alone,
            purging,
            purged,
            purge_seconds,
        };
        eprintln!(
            "growth: {rows} records: {:.0}/s alone, {:.0}/s while purging; purged {} in {:.1} s",
            row.alone.throughput, row.purging.throughput, row.purged, row.purge_seconds
        );
        out.push(row);
    }
    bench.db.truncate().await?;
    Ok(out)
}

/// Seeds `rows` completed records, every tenth past its retention, with
/// the indexes rebuilt after the load (as a restore would).
async fn seed(bench: &Bench, rows: u64) -> anyhow::Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let mut connection = sqlx::PgConnection::connect(&bench.db.url).await?;
    for statement in [
        "set synchronous_commit = off",
        "set maintenance_work_mem = '1GB'",
        "alter table idempotency_records drop constraint idempotency_records_pkey",
        "drop index idempotency_records_expires_at",
    ] {
        sqlx::query(statement).execute(&mut connection).await?;
    }
    let headers = b"content-type: application/json\r\n".to_vec();
    let body = crate::server::RESPONSE_BODY.to_vec();
    let mut from = 1;
    while from <= rows {
        let to = (from + CHUNK - 1).min(rows);
        sqlx::query(
            "insert into idempotency_records
                (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
                 transactional, response_status, response_headers, response_body,
                 created_at, completed_at, expires_at)
             select 'default', 'seed-' || n, sha256(int8send(n)), 'POST', '/orders', 'completed',
                 md5(n::text)::uuid, now() - interval '1 hour', false, 201, $3, $4,
                 now() - case when n % 10 = 0 then interval '25 hours' else interval '1 hour' end,
                 now() - case when n % 10 = 0 then interval '25 hours' else interval '1 hour' end,
                 now() + case when n % 10 = 0 then interval '-1 hour' else interval '23 hours' end
             from generate_series($1::bigint, $2::bigint) as n",
        )
        .bind(i64::try_from(from)?)
        .bind(i64::try_from(to)?)
        .bind(&headers)
        .bind(&body)
        .execute(&mut connection)
        .await?;
        from = to + 1;
    }
    for statement in [
        "alter table idempotency_records add primary key (scope, key)",
        "create index idempotency_records_expires_at on idempotency_records (expires_at)",
        "vacuum analyze idempotency_records",
    ] {
        sqlx::query(statement).execute(&mut connection).await?;
    }
    connection.close().await?;
    Ok(())
}

async fn measure(bench: &mut Bench, concurrency: usize) -> anyhow::Result<Summary> {
    let prefix = bench.next_prefix();
    let child = bench
        .start(App::Guard, Some(StoreName::Postgres), &prefix)
        .await?;
    let sample = load::run(&Load {
        address: child.address,
        connections: concurrency,
        warmup: bench.warmup,
        duration: bench.duration,
        keys: Keys::Fresh(Arc::from(prefix.as_str())),
        body: Bytes::from_static(crate::server::REQUEST_BODY),
    })
    .await;
    child.stop().await?;
    Ok(sample?.summary())
}

/// The guard's run with the purge deleting expired records from its start;
/// returns the run and (records purged, seconds to purge them all).
async fn measure_with_purge(
    bench: &mut Bench,
    concurrency: usize,
) -> anyhow::Result<(Summary, (u64, f64))> {
    let store = PostgresStore::connect(&bench.db.url, 2).await?;
    let purge = tokio::spawn({
        let store = store.clone();
        async move {
            let started = Instant::now();
            let mut total = 0;
            loop {
                let deleted = store.purge(PURGE_BATCH).await?;
                total += deleted;
                if deleted < u64::from(PURGE_BATCH) || started.elapsed() > Duration::from_secs(900)
                {
                    return anyhow::Ok((total, started.elapsed().as_secs_f64()));
                }
            }
        }
    });
    let summary = measure(bench, concurrency).await;
    let purged = purge.await??;
    store.pool().close().await;
    Ok((summary?, purged))
}
