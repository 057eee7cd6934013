//! The SQL migrations in `migrations/`, embedded at compile time.
//!
//! Each file is listed here and read with `include_str!`, and the
//! [`Migrator`](sqlx::migrate::Migrator) is built from them at run time:
//! the same versions, descriptions and checksums as `sqlx::migrate!` (a
//! test compares them with sqlx's own reading of the folders), without
//! sqlx's `macros` feature, whose proc-macro would build sqlx and its
//! database drivers a second time, for the compiler's host, in every
//! build that depends on the guard. A new file in `migrations/` must be
//! added to the list (that test fails until it is).
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

/// One migration file: its version and description as sqlx reads them from
/// the file's name (`0001_idempotency_records.sql`: version 1,
/// "idempotency records") and its SQL.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
struct MigrationFile {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

/// The files of `migrations/postgres`, in order.
#[cfg(feature = "postgres")]
const POSTGRES_MIGRATIONS: &[MigrationFile] = &[
    MigrationFile {
        version: 1,
        description: "idempotency records",
        sql: include_str!("../migrations/postgres/0001_idempotency_records.sql"),
    },
    MigrationFile {
        version: 2,
        description: "recorded steps",
        sql: include_str!("../migrations/postgres/0002_recorded_steps.sql"),
    },
    MigrationFile {
        version: 3,
        description: "stored requests",
        sql: include_str!("../migrations/postgres/0003_stored_requests.sql"),
    },
];

/// The files of `migrations/sqlite`, in order.
#[cfg(feature = "sqlite")]
const SQLITE_MIGRATIONS: &[MigrationFile] = &[
    MigrationFile {
        version: 1,
        description: "idempotency records",
        sql: include_str!("../migrations/sqlite/0001_idempotency_records.sql"),
    },
    MigrationFile {
        version: 2,
        description: "recorded steps",
        sql: include_str!("../migrations/sqlite/0002_recorded_steps.sql"),
    },
    MigrationFile {
        version: 3,
        description: "stored requests",
        sql: include_str!("../migrations/sqlite/0003_stored_requests.sql"),
    },
];

/// A migrator of `files` that records in [`MIGRATIONS_TABLE`], as
/// `sqlx::migrate!` builds it: simple (up-only) migrations, each in a
/// transaction unless its SQL starts with `-- no-transaction`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn migrator(files: &[MigrationFile]) -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr as _;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    let migrations = files
        .iter()
        .map(|file| {
            Migration::new(
                file.version,
                file.description.into(),
                MigrationType::Simple,
                file.sql.into_sql_str(),
                file.sql.starts_with("-- no-transaction"),
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The migrations of `migrations/postgres`. PostgreSQL runs them under an
/// advisory lock: several deploy jobs may run them at once.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_migrator() -> sqlx::migrate::Migrator {
    migrator(POSTGRES_MIGRATIONS)
}

/// The migrations of `migrations/sqlite`.
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_migrator() -> sqlx::migrate::Migrator {
    migrator(SQLITE_MIGRATIONS)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sqlx::migrate::Migrator;

    /// What decides whether a database is migrated: version, description,
    /// type, checksum and transaction mode, in order.
    fn identity(migrator: &Migrator) -> Vec<(i64, String, String, Vec<u8>, bool)> {
        migrator
            .iter()
            .map(|migration| {
                (
                    migration.version,
                    migration.description.to_string(),
                    format!("{:?}", migration.migration_type),
                    migration.checksum.to_vec(),
                    migration.no_tx,
                )
            })
            .collect()
    }

    /// sqlx's own reading of a folder (what `sqlx::migrate!` and sqlx-cli
    /// see) against the embedded list: a file added to the folder and not
    /// to the list, or a name that parses otherwise, fails here.
    async fn same_as_sqlx_reads(folder: &str, embedded: Migrator) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
        let read = Migrator::new(path.as_path())
            .await
            .unwrap_or_else(|error| panic!("sqlx cannot read {}: {error}", path.display()));
        assert!(
            embedded.iter().next().is_some(),
            "{folder}: no migration embedded"
        );
        assert_eq!(identity(&embedded), identity(&read), "{folder}");
        assert_eq!(embedded.table_name, super::MIGRATIONS_TABLE);
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_migrations_are_the_folders_files() {
        same_as_sqlx_reads("migrations/postgres", super::postgres_migrator()).await;
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_migrations_are_the_folders_files() {
        same_as_sqlx_reads("migrations/sqlite", super::sqlite_migrator()).await;
    }
}
