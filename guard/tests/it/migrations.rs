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
    assert_eq!(
        applied,
        migration_files(SQLITE_MIGRATIONS),
        "each migration ran once"
    );
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
    assert_eq!(applied, migration_files(POSTGRES_MIGRATIONS));
    for store in stores {
        store.pool().close().await;
    }
}

/// `migrations/postgres`, as `sqlx migrate run --source migrations/postgres`
/// reads it from the repository's root.
const POSTGRES_MIGRATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/postgres");

/// `migrations/sqlite`.
const SQLITE_MIGRATIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/sqlite");

/// How many migrations a folder holds (its `.sql` files): each runs once.
fn migration_files(folder: &str) -> i64 {
    let files = std::fs::read_dir(folder)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.path().extension().is_some_and(|ext| ext == "sql"))
        })
        .count();
    i64::try_from(files).unwrap()
}

/// The migrations table the repository's `sqlx.toml` names for sqlx-cli.
fn sqlx_toml_table_name() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../sqlx.toml");
    let config = std::fs::read_to_string(path).unwrap();
    config
        .lines()
        .find_map(|line| line.trim().strip_prefix("table-name"))
        .and_then(|rest| rest.split('"').nth(1))
        .expect("sqlx.toml sets [migrate] table-name")
        .to_owned()
}

/// What sqlx-cli does for `sqlx migrate run --source migrations/postgres`
/// (it is this same `Migrator`, read from the directory at run time):
/// records in `table`, `_sqlx_migrations` unless `sqlx.toml` names another.
async fn sqlx_cli_migrate(pool: &sqlx::PgPool, table: Option<String>) {
    let mut migrator = sqlx::migrate::Migrator::new(std::path::Path::new(POSTGRES_MIGRATIONS))
        .await
        .unwrap();
    if let Some(table) = table {
        migrator.dangerous_set_table_name(table);
    }
    migrator.run(pool).await.expect("sqlx-cli's migration runs");
}

async fn fresh_postgres_store() -> (idempotency_tests::TestDatabase, PostgresStore) {
    let database = idempotency_tests::postgres_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&database.url)
        .await
        .unwrap();
    (database, PostgresStore::new(pool))
}

/// The `(version, checksum)` rows of a migrations table.
async fn applied(pool: &sqlx::PgPool, table: &str) -> Vec<(i64, Vec<u8>)> {
    let sql = format!("select version, checksum from {table} where success order by version");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The records table is there and usable: a row goes in and comes out.
async fn records_table_works(pool: &sqlx::PgPool) {
    sqlx::query(
        "insert into idempotency_records (scope, key, fingerprint, method, path, state, \
         lease_token, lease_expires_at, transactional, created_at, expires_at) \
         values ('s', 'k', decode(repeat('00', 32), 'hex'), 'POST', '/', 'in_flight', \
         gen_random_uuid(), now(), false, now(), now() + interval '1 day')",
    )
    .execute(pool)
    .await
    .unwrap();
    let count: i64 = sqlx::query_scalar("select count(*) from idempotency_records")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn the_repository_sqlx_toml_names_the_guards_table() {
    assert_eq!(sqlx_toml_table_name(), idempotency_guard::MIGRATIONS_TABLE);
}

#[tokio::test]
async fn a_postgres_database_migrated_by_sqlx_cli_outside_the_repository_is_accepted() {
    let (_database, store) = fresh_postgres_store().await;
    // No sqlx.toml: sqlx-cli records in `_sqlx_migrations`.
    sqlx_cli_migrate(store.pool(), None).await;
    let by_cli = applied(store.pool(), "_sqlx_migrations").await;
    assert_eq!(
        i64::try_from(by_cli.len()).unwrap(),
        migration_files(POSTGRES_MIGRATIONS)
    );

    store.migrate().await.expect("our migrate accepts it");
    store.migrate().await.expect("and stays idempotent");
    assert_eq!(
        applied(store.pool(), "_idempotency_migrations").await,
        by_cli,
        "sqlx-cli's rows of our migrations are adopted, not run again"
    );
    records_table_works(store.pool()).await;
    store.pool().close().await;
}

#[tokio::test]
async fn a_postgres_database_migrated_by_sqlx_cli_in_the_repository_is_accepted() {
    let (_database, store) = fresh_postgres_store().await;
    sqlx_cli_migrate(store.pool(), Some(sqlx_toml_table_name())).await;
    store.migrate().await.expect("our migrate accepts it");
    assert_eq!(
        i64::try_from(applied(store.pool(), "_idempotency_migrations").await.len()).unwrap(),
        migration_files(POSTGRES_MIGRATIONS)
    );
    records_table_works(store.pool()).await;
    store.pool().close().await;
}

#[tokio::test]
async fn a_postgres_database_migrated_by_us_is_accepted_by_sqlx_cli_in_the_repository() {
    let (_database, store) = fresh_postgres_store().await;
    store.migrate().await.unwrap();
    let ours = applied(store.pool(), "_idempotency_migrations").await;
    sqlx_cli_migrate(store.pool(), Some(sqlx_toml_table_name())).await;
    assert_eq!(
        applied(store.pool(), "_idempotency_migrations").await,
        ours,
        "sqlx-cli finds nothing left to run"
    );
    records_table_works(store.pool()).await;
    store.pool().close().await;
}
