//! The SQL migrations in `migrations/`, embedded at compile time.
//!
//! They record what ran in their own table, `_idempotency_migrations`, so
//! an app that keeps its own sqlx migrations in the same database
//! (`_sqlx_migrations`) does not see ours as unknown, nor we its.

/// The table the guard's migrations record themselves in.
pub const MIGRATIONS_TABLE: &str = "_idempotency_migrations";

/// A migration failed, or the database could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency migrations failed")]
pub struct MigrationError(#[source] pub sqlx::migrate::MigrateError);

/// The migrations of `migrations/postgres`. PostgreSQL runs them under an
/// advisory lock: several deploy jobs may run them at once.
#[cfg(feature = "postgres")]
pub fn postgres_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("../migrations/postgres");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The migrations of `migrations/sqlite`.
#[cfg(feature = "sqlite")]
pub fn sqlite_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("../migrations/sqlite");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}
