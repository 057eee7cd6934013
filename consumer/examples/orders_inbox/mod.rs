//! What the two order-consumer examples share: the engine, which is the
//! transactional inbox in single-commit mode when the records are in
//! PostgreSQL, and the order's effect.
//!
//! On PostgreSQL each order is a row of `handled_orders`, written in the
//! run's transaction: the key's claim, the row and the outcome commit once,
//! together, so a consumer killed mid-order leaves nothing behind and the
//! redelivery runs it, once; nothing is parked. Elsewhere (SQLite, Redis)
//! the effect is the printed line alone, and a kill between the claim and
//! the ack parks the order as `outcome-unknown` for a person.
//!
//! Both read their store settings the same way ([`Settings`]), and exit 2
//! with one line naming the variable on a configuration error.

use std::time::Duration;

use idempotency_consumer::Incoming;
use idempotency_guard::Engine;
use idempotency_guard::engine::RunContext;
use idempotency_guard::store::{
    AnyStore, SettingNames, StoreKind, StoreOptions, TransactionalStore as _,
};
use idempotency_guard::transaction::TxRejection;

/// The exit code of a configuration error (as clap's own usage errors).
const CONFIGURATION_ERROR: u8 = 2;

/// The engine's default retention, which the examples keep.
const RETENTION_SECS: u64 = 24 * 3600;
/// The engine's default maximum handler time, which the examples keep.
const MAX_HANDLER_SECS: u64 = 600;

/// The store settings both examples read: `DATABASE_URL`, `STORE`,
/// `REDIS_URL`, `REDIS_PREFIX`, `LEASE_SECS` and `CONCURRENCY`.
pub(crate) struct Settings {
    /// `DATABASE_URL` (default `sqlite://orders-consumer.db?mode=rwc`).
    pub(crate) database: String,
    /// `STORE`: `sql`, `redis` or `tiered`.
    pub(crate) kind: StoreKind,
    redis_url: Option<String>,
    prefix: String,
    /// How long a killed consumer's keys stay in flight before they turn
    /// abandoned (and are parked): the engine's lease.
    pub(crate) lease: Duration,
    /// `CONCURRENCY`: orders handled at once.
    pub(crate) concurrency: usize,
}

impl Settings {
    /// Reads and checks the settings.
    pub(crate) fn from_env() -> anyhow::Result<Self> {
        let kind: StoreKind = std::env::var("STORE")
            .unwrap_or_else(|_| "sql".to_owned())
            .parse()
            .map_err(|error: String| anyhow::anyhow!("STORE: {error}"))?;
        let lease = number("LEASE_SECS", 60)?;
        // What the engine would refuse with a panic (a lease under 1 s), and
        // the retention rule the axum layer checks and the consumers do not
        // pass through: the lease plus the maximum handler time under the
        // retention (the engine's defaults, 10 min and 24 h).
        anyhow::ensure!(lease >= 1, "LEASE_SECS must be at least 1, not {lease}");
        anyhow::ensure!(
            lease < RETENTION_SECS - MAX_HANDLER_SECS,
            "LEASE_SECS ({lease}) plus the maximum handler time ({MAX_HANDLER_SECS} s) must stay \
             under the retention ({RETENTION_SECS} s)"
        );
        let settings = Self {
            database: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "sqlite://orders-consumer.db?mode=rwc".to_owned()),
            kind,
            redis_url: std::env::var("REDIS_URL").ok(),
            prefix: std::env::var("REDIS_PREFIX").unwrap_or_else(|_| "orders".to_owned()),
            lease: Duration::from_secs(lease),
            concurrency: usize::try_from(number("CONCURRENCY", 16)?).unwrap_or(usize::MAX),
        };
        settings.options().check(SettingNames::ENVIRONMENT)?;
        Ok(settings)
    }

    fn options(&self) -> StoreOptions<'_> {
        StoreOptions {
            kind: self.kind,
            database_url: &self.database,
            redis_url: self.redis_url.as_deref(),
            redis_prefix: &self.prefix,
            notifications: false,
            encryption: None,
            require_sealed: true,
            nats: None,
        }
    }

    /// Opens the store and applies its migrations.
    pub(crate) async fn open(&self) -> anyhow::Result<AnyStore> {
        let store = AnyStore::open(&self.options()).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// The store, for a log line: its kind and the database's scheme (a
    /// URL may hold a password).
    pub(crate) fn describe(&self) -> String {
        let scheme = self.database.split(':').next().unwrap_or_default();
        format!("STORE={:?}, DATABASE_URL={scheme}:…", self.kind)
    }
}

/// A variable's value parsed, or its default when unset.
fn number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name} must be a whole number, not {value:?}")),
        Err(_) => Ok(default),
    }
}

/// Runs an example's `main`: a configuration error exits 2, a runtime
/// failure 1, each with one line on standard error (no backtrace).
pub(crate) async fn main<F, Fut>(name: &str, run: F) -> std::process::ExitCode
where
    F: FnOnce(Settings) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("{name}: {error:#}");
            return std::process::ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    match run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The orders handled, on PostgreSQL (the primary key refuses a second run).
const CREATE: &str = "create table if not exists handled_orders (
    order_id text primary key,
    payload bytea not null,
    handled_at timestamptz not null default now())";

/// The engine over `store`: in single-commit transactional mode when its
/// records are in PostgreSQL (not sealed), with `lease` otherwise.
pub(crate) async fn engine(store: AnyStore, lease: Duration) -> anyhow::Result<Engine<AnyStore>> {
    let postgres = store.postgres().cloned();
    let engine = Engine::new(store).with_lease(lease);
    Ok(match postgres {
        Some(postgres) => {
            sqlx::query(CREATE).execute(postgres.pool()).await?;
            println!("records in PostgreSQL: the transactional inbox, one commit per order");
            engine
                .with_transactional_mode(true)
                .with_single_commit(true)
        }
        None => engine,
    })
}

/// Handles one order: on PostgreSQL its row commits with the record; the
/// printed line is outside any transaction (a killed run prints again).
pub(crate) async fn handle(order: Incoming, run: RunContext) -> Result<(), String> {
    match run.tx().await {
        Ok(mut tx) => {
            sqlx::query("insert into handled_orders (order_id, payload) values ($1, $2)")
                .bind(&order.key)
                .bind(order.payload.to_vec())
                .execute(&mut *tx)
                .await
                .map_err(|error| format!("record the order: {error}"))?;
        }
        Err(TxRejection::NotTransactional) => {}
        Err(error) => return Err(error.to_string()),
    }
    println!(
        "order {} handled: {}",
        order.key,
        String::from_utf8_lossy(&order.payload)
    );
    Ok(())
}
