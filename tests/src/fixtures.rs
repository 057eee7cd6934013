//! A fresh store per test, on a real server: PostgreSQL (a schema of its
//! own in the test database) or SQLite (a file in a temporary directory).
//! Both are dropped with the [`TestDb`].

use std::str::FromStr;
use std::time::Duration;

use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::sqlite::SqliteStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The PostgreSQL server tests use (`TEST_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`); each test gets a schema of
/// its own in it.
pub fn postgres_url() -> String {
    std::env::var("TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A store on a fresh database that is dropped with it.
pub struct TestDb<S> {
    /// The store.
    pub store: S,
    cleanup: Cleanup,
}

enum Cleanup {
    PostgresSchema(String),
    SqliteDir(#[allow(dead_code)] tempfile::TempDir),
}

impl<S> Drop for TestDb<S> {
    fn drop(&mut self) {
        if let Cleanup::PostgresSchema(schema) = &self.cleanup {
            let schema = schema.clone();
            // Drop runs inside the test's runtime: clean up from a thread of its own.
            let _ = std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    if let Ok(pool) = admin_pool().await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "drop schema if exists \"{schema}\" cascade"
                        )))
                        .execute(&pool)
                        .await;
                        pool.close().await;
                    }
                });
            })
            .join();
        }
    }
}

async fn admin_pool() -> Result<sqlx::PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&postgres_url())
        .await
}

/// A PostgreSQL store in a fresh schema of the test database, migrated.
pub async fn postgres() -> TestDb<PostgresStore> {
    let url = postgres_url();
    let admin = admin_pool().await.unwrap_or_else(|error| {
        panic!(
            "PostgreSQL is not answering at {url} ({error}). Start it with \
             `pg_ctlcluster --skip-systemctl-redirect 15 main start`, or point TEST_POSTGRES_URL at a server."
        )
    });
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("create schema \"{schema}\"")))
        .execute(&admin)
        .await
        .expect("create the test schema");
    admin.close().await;
    let options = PgConnectOptions::from_str(&url)
        .expect("TEST_POSTGRES_URL is a postgres URL")
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .expect("connect to the test schema");
    let store = PostgresStore::new(pool);
    store.migrate().await.expect("migrate the test schema");
    TestDb {
        store,
        cleanup: Cleanup::PostgresSchema(schema),
    }
}

/// An SQLite store in a fresh file of a temporary directory, migrated.
pub async fn sqlite() -> TestDb<SqliteStore> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("records.db").display());
    let store = SqliteStore::connect(&url)
        .await
        .expect("open the SQLite file");
    store.migrate().await.expect("migrate SQLite");
    TestDb {
        store,
        cleanup: Cleanup::SqliteDir(dir),
    }
}

/// Makes a store unreachable, as if its server went away.
pub trait Breakable {
    /// Closes the store's connections for good.
    fn break_store(&self) -> impl std::future::Future<Output = ()> + Send;
}

impl Breakable for PostgresStore {
    async fn break_store(&self) {
        self.pool().close().await;
    }
}

impl Breakable for SqliteStore {
    async fn break_store(&self) {
        self.pool().close().await;
    }
}

/// A fresh PostgreSQL database (not just a schema), for processes that take
/// a `DATABASE_URL`; dropped with this value.
pub struct TestDatabase {
    /// The URL of the database.
    pub url: String,
    name: String,
}

/// Creates a fresh, empty PostgreSQL database on the test server.
///
/// # Panics
///
/// When PostgreSQL does not answer (the message says how to start it).
pub async fn postgres_database() -> TestDatabase {
    let admin = admin_pool().await.unwrap_or_else(|error| {
        panic!(
            "PostgreSQL is not answering at {} ({error}). Start it with \
             `pg_ctlcluster --skip-systemctl-redirect 15 main start`, or point TEST_POSTGRES_URL at a server.",
            postgres_url()
        )
    });
    let name = format!("e2e_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("create database \"{name}\"")))
        .execute(&admin)
        .await
        .expect("create the test database");
    admin.close().await;
    let mut options =
        PgConnectOptions::from_str(&postgres_url()).expect("TEST_POSTGRES_URL is a postgres URL");
    options = options.database(&name);
    let url = format!(
        "postgres://{}@{}:{}/{name}",
        options.get_username(),
        options.get_host(),
        options.get_port()
    );
    TestDatabase { url, name }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(pool) = admin_pool().await {
                    let sql = format!("drop database if exists \"{name}\" with (force)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
                    pool.close().await;
                }
            });
        })
        .join();
    }
}
