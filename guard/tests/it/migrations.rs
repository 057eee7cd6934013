//! Migrations run from several processes at once (deploy jobs, an app and
//! the service starting together) all succeed, and leave one schema.

use std::str::FromStr;

use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::sqlite::SqliteStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sqlite_migrations_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    // Separate pools, as separate processes would have.
    let mut stores = Vec::new();
    for _ in 0..6 {
        stores.push(SqliteStore::connect(&url).await.unwrap());
    }
    let results = futures_util::future::join_all(stores.iter().map(SqliteStore::migrate)).await;
    for result in results {
        result.expect("every concurrent migration succeeds");
    }
    let applied: i64 = sqlx::query_scalar("select count(*) from _idempotency_migrations")
        .fetch_one(stores[0].pool())
        .await
        .unwrap();
    assert_eq!(applied, 1, "the migration ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_postgres_migrations_all_succeed() {
    let database = idempotency_tests::postgres_database().await;
    let mut stores = Vec::new();
    for _ in 0..6 {
        let options = PgConnectOptions::from_str(&database.url).unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .unwrap();
        stores.push(PostgresStore::new(pool));
    }
    let results = futures_util::future::join_all(stores.iter().map(PostgresStore::migrate)).await;
    for result in results {
        result.expect("every concurrent migration succeeds");
    }
    let applied: i64 = sqlx::query_scalar("select count(*) from _idempotency_migrations")
        .fetch_one(stores[0].pool())
        .await
        .unwrap();
    assert_eq!(applied, 1);
    for store in stores {
        store.pool().close().await;
    }
}
