//! The SQL migrations in `migrations/`, embedded at compile time.
//!
//! They record what ran in their own table, `_idempotency_migrations`, so
//! an app that keeps its own sqlx migrations in the same database
//! (`_sqlx_migrations`) does not see ours as unknown, nor we its.
//!
//! The same files also deploy with sqlx-cli,
//! `sqlx migrate run --source migrations/postgres`, and either way accepts a
//! database migrated the other way:
//!
//! - run from the repository's root, sqlx-cli reads its `sqlx.toml`, which
//!   names our table: both record in `_idempotency_migrations`;
//! - run elsewhere, sqlx-cli records in `_sqlx_migrations`; before it runs,
//!   the PostgreSQL store's `migrate` copies into our table the rows of
//!   `_sqlx_migrations` that are exactly ours (same version and checksum),
//!   so it does not run them a second time.

/// The table the guard's migrations record themselves in.
pub const MIGRATIONS_TABLE: &str = "_idempotency_migrations";

/// A migration failed, or the database could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("the idempotency migrations failed")]
pub struct MigrationError(#[source] pub sqlx::migrate::MigrateError);

/// The table sqlx-cli records migrations in when no `sqlx.toml` names another.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const SQLX_CLI_MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// The migrations of `migrations/postgres`. PostgreSQL runs them under an
/// advisory lock: several deploy jobs may run them at once.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("migrations/postgres");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The migrations of `migrations/sqlite`.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("migrations/sqlite");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// Runs the PostgreSQL migrations, after adopting those sqlx-cli already
/// applied under its default table (see the module docs).
#[cfg(feature = "postgres")]
pub(crate) async fn run_postgres(pool: &sqlx::PgPool) -> Result<(), MigrationError> {
    let migrator = postgres_migrator();
    adopt_sqlx_cli_history(&migrator, pool)
        .await
        .map_err(MigrationError)?;
    migrator.run(pool).await.map_err(MigrationError)
}

/// Copies into `_idempotency_migrations` the successful rows of
/// `_sqlx_migrations` whose version and checksum are those of one of our
/// migrations: sqlx-cli applied exactly that file. Safe to run from several
/// processes at once (`on conflict do nothing`); a no-op without
/// `_sqlx_migrations`.
#[cfg(feature = "postgres")]
async fn adopt_sqlx_cli_history(
    migrator: &sqlx::migrate::Migrator,
    pool: &sqlx::PgPool,
) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::migrate::Migrate as _;

    let mut connection = pool.acquire().await?;
    let cli_table_exists: bool = sqlx::query_scalar("select to_regclass($1) is not null")
        .bind(SQLX_CLI_MIGRATIONS_TABLE)
        .fetch_one(&mut *connection)
        .await?;
    if !cli_table_exists {
        return Ok(());
    }
    connection.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    let ours = migrator
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration());
    let (versions, checksums): (Vec<i64>, Vec<Vec<u8>>) = ours
        .map(|migration| (migration.version, migration.checksum.to_vec()))
        .unzip();
    sqlx::query(
        "insert into _idempotency_migrations \
             (version, description, installed_on, success, checksum, execution_time) \
         select cli.version, cli.description, cli.installed_on, cli.success, cli.checksum, \
                cli.execution_time \
         from _sqlx_migrations cli \
         join unnest($1::bigint[], $2::bytea[]) as ours (version, checksum) \
           on cli.version = ours.version and cli.checksum = ours.checksum \
         where cli.success \
         on conflict (version) do nothing",
    )
    .bind(versions)
    .bind(checksums)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
