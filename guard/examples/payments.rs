//! A payments API behind the idempotency guard.
//!
//! ```text
//! cargo run -p idempotency-guard --example payments
//! ```
//!
//! - `POST /payments` (guarded; body `{"amount": <int>, "currency": <str>,
//!   "delay_ms": <optional int>}`): sleeps `delay_ms`, inserts one row into
//!   `payments`, answers 201 with the payment and a `Location` header.
//! - `GET /payments/{id}`: the payment, or 404.
//! - `POST /debits` (guarded, resumable; mounted when `PSP_URL` names a
//!   payment service provider and the guard is on; body as `/payments`): a
//!   debit in three recorded steps, `reserve` (a hold row), `charge` (`POST
//!   {PSP_URL}/charges` with `Idempotency-Key` = the run's derived key of
//!   the step; `delay_ms` is slept inside this step, after the PSP
//!   answered) and `record` (a `debits` row), answering 201 with the debit
//!   and its charge. Its layer resumes an abandoned run
//!   (`AbandonedPolicy::Resume`): after a crash, the client's retry runs
//!   the steps not recorded and gets the real answer. The local writes are
//!   keyed by their step's derived key (an upsert that counts its
//!   executions), so a step the crash interrupted runs again without a
//!   second row. With the records in PostgreSQL the route is transactional
//!   and `reserve` and `record` are `step_tx` steps: each one's row commits
//!   with its recorded result, so it runs once whatever the crash
//!   (docs/guide/resume.md).
//! - `GET /metrics`: Prometheus text.
//!
//! Environment: `DATABASE_URL` (`postgres://...` or `sqlite://...`; default
//! `sqlite://payments.db`; the payments live there), `STORE` (where the
//! guard keeps its records: `sql`, the default, is the same database;
//! `redis` or `tiered` with `REDIS_URL`, one URL or a comma-separated
//! cluster, and `REDIS_PREFIX`), `LISTEN` (default `127.0.0.1:3000`),
//! `PG_NOTIFY=true` (wake waiters across processes with PostgreSQL
//! `LISTEN/NOTIFY`), `LEASE_SECS` (default 60), `STORE_TIMEOUT_MS` (default 5000: a store
//! slower than that fails the request closed with 503),
//! `IDEMPOTENCY_GUARD=off` to run without the
//! guard (to watch retries double-charge), `IDEMPOTENCY_ENCRYPTION_KEYS`
//! (or a file named by `IDEMPOTENCY_ENCRYPTION_KEYS_FILE`:
//! `<id>:<base64 of 32 bytes>` entries, the first sealing) to seal stored
//! responses with AES-256-GCM, with `IDEMPOTENCY_REQUIRE_SEALED` (default
//! `true`: a stored response without the sealed marker is refused, 503;
//! `false` replays it, for records stored in clear before encryption was
//! turned on); built with `--features otel`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (e.g. `http://127.0.0.1:4318`) exports
//! the guard's spans over OTLP/HTTP; `PSP_URL` (see `POST /debits`);
//! `CRASH_POINTS=true` (tests only) makes a debit carrying `X-Crash-At:
//! <point>` kill its own process with SIGKILL there (`before-reserve`,
//! `in-reserve`, `after-reserve`, `in-charge`, `after-charge`,
//! `in-record`, `after-record`; `in-` is after the step's work, before its
//! result is recorded). The scope is the `X-Tenant`
//! header (`default` when absent). When the records are in PostgreSQL (the
//! `sql` or `tiered` store) and not encrypted, the guard runs in
//! single-commit transactional mode: the claim, the payment row and the
//! stored response commit together, once, the key held meanwhile by a
//! PostgreSQL advisory lock (`SINGLE_COMMIT=false`: transactional mode with
//! a committed claim and a lease, two commits).

use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotency_guard::server::{BodyTimeoutLayer, Server};
use idempotency_guard::store::TransactionalStore as _;
use idempotency_guard::store::encrypted::{EncryptionKeys, require_sealed_from_environment};
use idempotency_guard::store::{AnyStore, Backend, NatsOptions, StoreKind, StoreOptions};
use idempotency_guard::{AbandonedPolicy, Drain, IdempotencyLayer, Tx};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, SqlitePool};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

const CREATE_POSTGRES: &str = "create table if not exists payments (
    id bigserial primary key,
    tenant text not null,
    amount bigint not null,
    currency text not null,
    created_at timestamptz not null default now())";
const CREATE_SQLITE: &str = "create table if not exists payments (
    id integer primary key autoincrement,
    tenant text not null,
    amount integer not null,
    currency text not null,
    created_at text not null default current_timestamp)";
const INSERT_POSTGRES: &str =
    "insert into payments (tenant, amount, currency) values ($1, $2, $3) returning id";
const INSERT_SQLITE: &str =
    "insert into payments (tenant, amount, currency) values (?1, ?2, ?3) returning id";
const SELECT_POSTGRES: &str =
    "select id, tenant, amount, currency from payments where id = $1 and tenant = $2";
const SELECT_SQLITE: &str =
    "select id, tenant, amount, currency from payments where id = ?1 and tenant = ?2";

/// The database of the payments (the same one the guard keeps records in).
#[derive(Clone)]
enum Db {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

#[derive(Clone)]
struct AppState {
    db: Db,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

#[derive(Deserialize)]
struct NewPayment {
    amount: i64,
    currency: String,
    delay_ms: Option<u64>,
}

#[derive(Serialize)]
struct Payment {
    id: i64,
    tenant: String,
    amount: i64,
    currency: String,
}

/// The scope of a request: its `X-Tenant` header, `default` when absent.
fn tenant(parts: &Parts) -> String {
    tenant_of(&parts.headers)
}

fn tenant_of(headers: &HeaderMap) -> String {
    headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("default")
        .to_owned()
}

/// An error answered as 500 (and logged); the guard releases the key.
struct Failure(anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        tracing::error!(error = %self.0, "request failed");
        // A database that cannot be reached is a transient failure: 503
        // tells the client to retry (the guard releases the key for it).
        let unreachable = self.0.downcast_ref::<sqlx::Error>().is_some_and(|e| {
            matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed)
                || matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08")))
        });
        if unreachable {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable, retry later",
            )
                .into_response()
        } else {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    }
}

fn created(payment: Payment) -> Response {
    let location = HeaderValue::from_str(&format!("/payments/{}", payment.id)).ok();
    let mut response = (StatusCode::CREATED, Json(payment)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// Why a payment is refused before anything runs, if it is.
fn invalid(payment: &NewPayment) -> Option<Response> {
    let valid = payment.amount > 0 && !payment.currency.is_empty() && payment.currency.len() <= 16;
    (!valid).then(|| {
        let body = "amount must be positive and currency 1 to 16 characters";
        (StatusCode::UNPROCESSABLE_ENTITY, body).into_response()
    })
}

async fn pause(payment: &NewPayment) {
    if let Some(ms) = payment.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
    }
}

/// Inserts a payment through a PostgreSQL connection, pool or transaction.
async fn insert_postgres<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenant: &str,
    new: &NewPayment,
) -> sqlx::Result<i64> {
    let (id,): (i64,) = sqlx::query_as(INSERT_POSTGRES)
        .bind(tenant)
        .bind(new.amount)
        .bind(&new.currency)
        .fetch_one(executor)
        .await?;
    Ok(id)
}

/// The 201 answer for a payment just made.
fn made(id: i64, tenant: String, new: NewPayment) -> Response {
    created(Payment {
        id,
        tenant,
        amount: new.amount,
        currency: new.currency,
    })
}

/// `POST /payments` on PostgreSQL: the row is written through the guard's
/// transaction, so it commits with the stored response or not at all.
async fn create_in_transaction(
    headers: HeaderMap,
    mut tx: Tx,
    Json(new): Json<NewPayment>,
) -> Result<Response, Failure> {
    if let Some(rejection) = invalid(&new) {
        return Ok(rejection);
    }
    pause(&new).await;
    let tenant = tenant_of(&headers);
    let id = insert_postgres(&mut *tx, &tenant, &new).await?;
    Ok(made(id, tenant, new))
}

/// `POST /payments` on SQLite (or with the guard off).
async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(new): Json<NewPayment>,
) -> Result<Response, Failure> {
    if let Some(rejection) = invalid(&new) {
        return Ok(rejection);
    }
    pause(&new).await;
    let tenant = tenant_of(&headers);
    let id = match &state.db {
        Db::Postgres(pool) => insert_postgres(pool, &tenant, &new).await?,
        Db::Sqlite(pool) => {
            let (id,): (i64,) = sqlx::query_as(INSERT_SQLITE)
                .bind(&tenant)
                .bind(new.amount)
                .bind(&new.currency)
                .fetch_one(pool)
                .await?;
            id
        }
    };
    Ok(made(id, tenant, new))
}

/// `GET /payments/{id}`, within the caller's tenant.
async fn show(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Result<Response, Failure> {
    let tenant = tenant_of(&headers);
    // A row as the SELECTs list it: id, tenant, amount, currency.
    let row: Option<(i64, String, i64, String)> = match &state.db {
        Db::Postgres(pool) => {
            sqlx::query_as(SELECT_POSTGRES)
                .bind(id)
                .bind(&tenant)
                .fetch_optional(pool)
                .await?
        }
        Db::Sqlite(pool) => {
            sqlx::query_as(SELECT_SQLITE)
                .bind(id)
                .bind(&tenant)
                .fetch_optional(pool)
                .await?
        }
    };
    Ok(match row {
        Some((id, tenant, amount, currency)) => Json(Payment {
            id,
            tenant,
            amount,
            currency,
        })
        .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.metrics.render()
}

/// The exit code of a configuration error (as clap's own usage errors).
const CONFIGURATION_ERROR: u8 = 2;

/// What the environment asks for, checked before anything starts.
struct Settings {
    log_format: idempotency_guard::telemetry::logs::LogFormat,
    url: String,
    listen: std::net::SocketAddr,
    lease: u64,
    store_timeout: u64,
    guarded: bool,
    single_commit: bool,
    kind: StoreKind,
    redis_url: Option<String>,
    prefix: String,
    nats_url: Option<String>,
    nats_bucket: String,
    notifications: bool,
    encryption: Option<EncryptionKeys>,
    require_sealed: bool,
    psp_url: Option<String>,
    crash_points: bool,
}

/// The guard's default retention and maximum handler time, in seconds
/// (the example keeps both): retention must exceed the maximum handler time
/// plus the lease.
const RETENTION_SECS: u64 = 24 * 3600;
const MAX_HANDLER_SECS: u64 = 600;

/// A variable's value parsed, or its default when unset; the error names
/// the variable and what it expects.
fn number(name: &str, default: u64) -> anyhow::Result<u64> {
    std::env::var(name).map_or(Ok(default), |value| {
        value
            .trim()
            .parse()
            .with_context(|| format!("{name} must be a whole number, not {value:?}"))
    })
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        use idempotency_guard::store::SettingNames;
        use idempotency_guard::telemetry::logs::LogFormat;
        let log_format = LogFormat::from_env(LogFormat::Text)?;
        let url =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://payments.db".to_owned());
        let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
        let listen = listen.parse().with_context(|| {
            format!("LISTEN must be an address such as 127.0.0.1:3000, not {listen:?}")
        })?;
        let single_commit = match std::env::var("SINGLE_COMMIT").as_deref() {
            Err(_) | Ok("true") => true,
            Ok("false") => false,
            Ok(other) => anyhow::bail!("SINGLE_COMMIT must be true or false, not {other:?}"),
        };
        let kind: StoreKind = std::env::var("STORE")
            .unwrap_or_else(|_| "sql".into())
            .parse()
            .map_err(|error: String| anyhow::anyhow!("STORE: {error}"))?;
        let settings = Self {
            log_format,
            listen,
            lease: number("LEASE_SECS", 60)?,
            store_timeout: number("STORE_TIMEOUT_MS", 5000)?,
            guarded: std::env::var("IDEMPOTENCY_GUARD").map_or(true, |v| v != "off"),
            single_commit,
            kind,
            redis_url: std::env::var("REDIS_URL").ok(),
            prefix: std::env::var("REDIS_PREFIX").unwrap_or_else(|_| "idem".into()),
            // STORE=nats: NATS_URL (host:port, comma-separated for a
            // cluster) and NATS_BUCKET (default `idempotency`).
            nats_url: std::env::var("NATS_URL").ok(),
            nats_bucket: std::env::var("NATS_BUCKET")
                .unwrap_or_else(|_| NatsOptions::DEFAULT_BUCKET.to_owned()),
            notifications: std::env::var("PG_NOTIFY").is_ok_and(|v| v == "true"),
            // Encryption at rest: IDEMPOTENCY_ENCRYPTION_KEYS or
            // IDEMPOTENCY_ENCRYPTION_KEYS_FILE (`<id>:<base64 of 32 bytes>`,
            // the first sealing); unset, responses are stored in clear.
            encryption: EncryptionKeys::from_environment()
                .context("IDEMPOTENCY_ENCRYPTION_KEYS or IDEMPOTENCY_ENCRYPTION_KEYS_FILE")?,
            // IDEMPOTENCY_REQUIRE_SEALED (default true): with encryption, a
            // record without the sealed marker is refused (503), not
            // replayed; `false` while records stored in clear before
            // encryption was turned on age out.
            require_sealed: require_sealed_from_environment()?,
            psp_url: std::env::var("PSP_URL").ok().filter(|url| !url.is_empty()),
            crash_points: std::env::var("CRASH_POINTS").is_ok_and(|v| v == "true"),
            url,
        };
        settings.store_options().check(SettingNames::ENVIRONMENT)?;
        // What the guard refuses with a panic when the layer is built: a
        // lease under one second, and a retention (the default 24 h) not
        // above the maximum handler time (the default 10 min) plus the lease.
        anyhow::ensure!(
            settings.lease >= 1,
            "LEASE_SECS must be at least 1, not {}",
            settings.lease
        );
        anyhow::ensure!(
            settings.lease < RETENTION_SECS - MAX_HANDLER_SECS,
            "LEASE_SECS ({}) plus the maximum handler time ({MAX_HANDLER_SECS} s) must stay \
             under the retention ({RETENTION_SECS} s)",
            settings.lease
        );
        Ok(settings)
    }

    fn store_options(&self) -> StoreOptions<'_> {
        StoreOptions {
            kind: self.kind,
            database_url: &self.url,
            redis_url: self.redis_url.as_deref(),
            redis_prefix: &self.prefix,
            notifications: self.notifications,
            encryption: self.encryption.as_ref(),
            require_sealed: self.require_sealed,
            nats: self.nats_url.as_deref().map(|url| NatsOptions {
                url,
                bucket: &self.nats_bucket,
                replicas: None,
            }),
        }
    }
}

/// Configuration errors exit 2 and runtime failures 1, each with one line
/// on standard error (the error and its causes, no backtrace).
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("payments: {error:#}");
            return std::process::ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    match run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("payments: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with(idempotency_guard::telemetry::logs::fmt_layer(
            settings.log_format,
        ));
    // Traces over OTLP/HTTP when built with `--features otel` and
    // OTEL_EXPORTER_OTLP_ENDPOINT is set (e.g. http://127.0.0.1:4318).
    #[cfg(feature = "otel")]
    let traces = idempotency_guard::telemetry::otel::install_from_env("payments-example")?;
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(
        traces
            .as_ref()
            .map(idempotency_guard::telemetry::otel::layer),
    );
    subscriber.init();
    let Settings {
        ref url,
        listen,
        lease,
        store_timeout,
        guarded,
        single_commit,
        kind,
        ref encryption,
        require_sealed,
        ref psp_url,
        crash_points,
        ..
    } = settings;
    let options = settings.store_options();
    let store = AnyStore::open(&options)
        .await
        .with_context(|| format!("open the {kind:?} store"))?;
    store
        .migrate()
        .await
        .context("run the idempotency migrations")?;
    // The payments live in DATABASE_URL, whichever store keeps the records.
    let payments_db = AnyStore::connect(url)
        .await
        .with_context(|| format!("connect to {url}"))?;
    let db = match payments_db.backend() {
        Backend::Postgres(payments) => {
            sqlx::query(CREATE_POSTGRES)
                .execute(payments.pool())
                .await?;
            Db::Postgres(payments.pool().clone())
        }
        Backend::Sqlite(payments) => {
            sqlx::query(CREATE_SQLITE).execute(payments.pool()).await?;
            Db::Sqlite(payments.pool().clone())
        }
        _ => anyhow::bail!("DATABASE_URL must name PostgreSQL or SQLite"),
    };
    // Records in PostgreSQL (the sql or tiered store): transactional mode
    // (not over an encrypted store, whose completions it would bypass).
    let transactional = store.postgres().is_some();
    let metrics = idempotency_guard::telemetry::install_prometheus()?;
    tokio::spawn(idempotency_guard::purge_periodically(
        store.clone(),
        Duration::from_secs(60),
        1000,
    ));

    let create_route = if transactional && guarded {
        post(create_in_transaction)
    } else {
        post(create)
    };
    let mut payments = Router::new().route("/payments", create_route);
    let mut drains: Vec<Drain> = Vec::new();
    let mut resumable: Option<Router> = None;
    if let Some(psp_url) = psp_url {
        if guarded {
            // Its own layer: resumable; transactional when the records are
            // in PostgreSQL (its local steps commit with their records).
            let guard = IdempotencyLayer::new(store.clone())
                .with_scope(tenant)
                .with_lease(Duration::from_secs(lease))
                .with_store_timeout(Duration::from_millis(store_timeout))
                .with_abandoned(AbandonedPolicy::Resume)
                .with_transactional_mode(transactional);
            drains.push(guard.drain());
            let state =
                debits::Debits::new(db.clone(), psp_url, crash_points, transactional).await?;
            resumable = Some(
                Router::new()
                    .route("/debits", post(debits::debit))
                    .route_layer(guard)
                    .with_state(state),
            );
        } else {
            tracing::warn!("IDEMPOTENCY_GUARD=off: POST /debits needs the guard, it is not served");
        }
    }
    if guarded {
        let guard = IdempotencyLayer::new(store)
            .with_scope(tenant)
            .with_lease(Duration::from_secs(lease))
            .with_store_timeout(Duration::from_millis(store_timeout))
            .with_transactional_mode(transactional)
            .with_single_commit(transactional && single_commit);
        drains.push(guard.drain());
        payments = payments.route_layer(guard);
    } else {
        tracing::warn!("IDEMPOTENCY_GUARD=off: retries will run the handler again");
    }
    let mut app = payments
        .route("/payments/{id}", get(show))
        .route("/metrics", get(render_metrics))
        .with_state(AppState { db, metrics });
    if let Some(resumable) = resumable {
        app = app.merge(resumable);
    }

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    tracing::info!(%listen, database = %url.split('@').next_back().unwrap_or(""), transactional, single_commit = transactional && single_commit, guarded, encrypted = encryption.is_some(), require_sealed = encryption.is_some() && require_sealed, "payments example listening");
    // Every connection bounded (the guard's `server`, at its defaults: a
    // 10 s header read, 60 s idle, a cap under the descriptor limit, 414
    // and 431 problems), every request body given 30 s (408 problem).
    let app = app.layer(BodyTimeoutLayer::new(Duration::from_secs(30)));
    Server::new()
        .serve(listener, move |_client| app.clone(), shutdown_signal())
        .await;
    // Payments whose clients already left still finish and are stored.
    for drain in drains {
        drain.wait().await;
    }
    #[cfg(feature = "otel")]
    if let Some(traces) = traces {
        // Sends the spans still buffered.
        traces.shutdown()?;
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C; in-flight requests then finish.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        if let Ok(mut signal) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            signal.recv().await;
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// `POST /debits`: a debit in three recorded steps (`reserve`, `charge` at
/// the PSP, `record`), resumed by the client's retry after a crash.
mod debits {
    use std::time::Duration;

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::{Json, body::Bytes};
    use idempotency_guard::engine::Run;
    use serde::{Deserialize, Serialize};

    use super::{Db, Tx, tenant_of};

    const CREATE_POSTGRES: [&str; 2] = [
        "create table if not exists reservations (
            step_key text primary key,
            tenant text not null,
            amount bigint not null,
            executions bigint not null default 1)",
        "create table if not exists debits (
            id bigserial primary key,
            step_key text not null unique,
            tenant text not null,
            amount bigint not null,
            currency text not null,
            charge text not null,
            executions bigint not null default 1)",
    ];
    const CREATE_SQLITE: [&str; 2] = [
        "create table if not exists reservations (
            step_key text primary key,
            tenant text not null,
            amount integer not null,
            executions integer not null default 1)",
        "create table if not exists debits (
            id integer primary key autoincrement,
            step_key text not null unique,
            tenant text not null,
            amount integer not null,
            currency text not null,
            charge text not null,
            executions integer not null default 1)",
    ];
    /// A hold, keyed by the step's derived key: running the step again
    /// adds no row, it counts an execution.
    const RESERVE_POSTGRES: &str = "insert into reservations (step_key, tenant, amount) \
        values ($1, $2, $3) on conflict (step_key) \
        do update set executions = reservations.executions + 1 returning step_key";
    const RESERVE_SQLITE: &str = "insert into reservations (step_key, tenant, amount) \
        values (?1, ?2, ?3) on conflict (step_key) \
        do update set executions = reservations.executions + 1 returning step_key";
    /// The debit in the ledger, keyed likewise.
    const RECORD_POSTGRES: &str = "insert into debits (step_key, tenant, amount, currency, charge) \
        values ($1, $2, $3, $4, $5) on conflict (step_key) \
        do update set executions = debits.executions + 1 returning id";
    const RECORD_SQLITE: &str = "insert into debits (step_key, tenant, amount, currency, charge) \
        values (?1, ?2, ?3, ?4, ?5) on conflict (step_key) \
        do update set executions = debits.executions + 1 returning id";

    /// How often a step tries the system it calls before its failure is
    /// its result (recorded: the run API records whatever a step returns).
    const ATTEMPTS: u32 = 5;

    /// The route's state: the database and the PSP.
    #[derive(Clone)]
    pub(super) struct Debits {
        db: Db,
        psp: reqwest::Client,
        charges: String,
        crash_points: bool,
        /// The records and the ledger are in one PostgreSQL database: the
        /// local steps are transactional (`step_tx`), exactly once.
        transactional: bool,
    }

    impl Debits {
        /// Creates the route's tables.
        pub(super) async fn new(
            db: Db,
            psp_url: &str,
            crash_points: bool,
            transactional: bool,
        ) -> anyhow::Result<Self> {
            match &db {
                Db::Postgres(pool) => {
                    for create in CREATE_POSTGRES {
                        sqlx::query(create).execute(pool).await?;
                    }
                }
                Db::Sqlite(pool) => {
                    for create in CREATE_SQLITE {
                        sqlx::query(create).execute(pool).await?;
                    }
                }
            }
            let psp = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?;
            Ok(Self {
                db,
                psp,
                charges: format!("{}/charges", psp_url.trim_end_matches('/')),
                crash_points,
                transactional,
            })
        }
    }

    /// A debit's request body.
    #[derive(Deserialize)]
    pub(super) struct NewDebit {
        amount: i64,
        currency: String,
        delay_ms: Option<u64>,
    }

    /// The 201 answer.
    #[derive(Serialize)]
    struct Debit {
        id: i64,
        tenant: String,
        amount: i64,
        currency: String,
        charge: String,
    }

    /// Where this request asked its process to die, if crash points are on.
    struct CrashAt(Option<String>);

    impl CrashAt {
        fn of(headers: &HeaderMap, enabled: bool) -> Self {
            Self(
                headers
                    .get("x-crash-at")
                    .filter(|_| enabled)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
            )
        }

        /// Kills this process with SIGKILL when `point` is the one asked
        /// for: nothing after it runs, as in a real crash.
        fn here(&self, point: &str) {
            if self.0.as_deref() == Some(point) {
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid])
                    .status();
                std::process::abort();
            }
        }
    }

    /// A step's failure that is its result (a decline, a database error
    /// that outlasted the step's attempts).
    fn failed(step: &str, error: &str) -> Response {
        tracing::error!(step, error, "a debit step failed");
        (StatusCode::BAD_GATEWAY, format!("{step} failed: {error}")).into_response()
    }

    /// `POST /debits`.
    pub(super) async fn debit(
        State(state): State<Debits>,
        run: Run,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        let new: NewDebit = match serde_json::from_slice(&body) {
            Ok(new) => new,
            Err(error) => {
                return (StatusCode::UNPROCESSABLE_ENTITY, error.to_string()).into_response();
            }
        };
        if new.amount <= 0 || new.currency.is_empty() || new.currency.len() > 16 {
            let body = "amount must be positive and currency 1 to 16 characters";
            return (StatusCode::UNPROCESSABLE_ENTITY, body).into_response();
        }
        let tenant = tenant_of(&headers);
        let crash = CrashAt::of(&headers, state.crash_points);
        crash.here("before-reserve");

        let reserve_key = run.derived_key("reserve");
        let reserved = if state.transactional {
            // The hold and the step's record commit together: once.
            run.step_tx("reserve", |tx| async {
                let held = reserve_in(tx, reserve_key.as_str(), &tenant, new.amount).await;
                crash.here("in-reserve");
                held
            })
            .await
        } else {
            run.step("reserve", || async {
                let held = reserve(&state.db, reserve_key.as_str(), &tenant, new.amount).await;
                crash.here("in-reserve");
                held
            })
            .await
        };
        let _hold = match reserved {
            Ok(Ok(hold)) => hold,
            Ok(Err(error)) => return failed("reserve", &error),
            Err(error) => return error.into_response(),
        };
        crash.here("after-reserve");

        // The same key in every run of this request: the PSP charges once.
        let charge_key = run.derived_key("charge");
        let charged = run
            .step("charge", || async {
                let charge = charge(&state, charge_key.as_str(), &new).await;
                if let Some(ms) = new.delay_ms {
                    tokio::time::sleep(Duration::from_millis(ms.min(600_000))).await;
                }
                crash.here("in-charge");
                charge
            })
            .await;
        let charge = match charged {
            Ok(Ok(charge)) => charge,
            Ok(Err(error)) => return failed("charge", &error),
            Err(error) => return error.into_response(),
        };
        crash.here("after-charge");

        let record_key = run.derived_key("record");
        let recorded = if state.transactional {
            run.step_tx("record", |tx| async {
                let id = record_in(tx, record_key.as_str(), &tenant, &new, &charge).await;
                crash.here("in-record");
                id
            })
            .await
        } else {
            run.step("record", || async {
                let id = record(&state.db, record_key.as_str(), &tenant, &new, &charge).await;
                crash.here("in-record");
                id
            })
            .await
        };
        let id = match recorded {
            Ok(Ok(id)) => id,
            Ok(Err(error)) => return failed("record", &error),
            Err(error) => return error.into_response(),
        };
        crash.here("after-record");
        let debit = Debit {
            id,
            tenant,
            amount: new.amount,
            currency: new.currency,
            charge,
        };
        (StatusCode::CREATED, Json(debit)).into_response()
    }

    /// Tries `attempt` up to [`ATTEMPTS`] times, 100 ms apart, while it
    /// fails: the step's own retries, safe because its write or call is
    /// keyed by the step's derived key.
    async fn tried<T, F, Fut>(mut attempt: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Retry>>,
    {
        let mut last = String::new();
        for n in 0..ATTEMPTS {
            if n > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            match attempt().await {
                Ok(value) => return Ok(value),
                Err(Retry::Again(error)) => last = error,
                Err(Retry::Final(error)) => return Err(error),
            }
        }
        Err(last)
    }

    /// Whether a failed attempt may be tried again.
    enum Retry {
        /// Transient (a connection, a 5xx): try again.
        Again(String),
        /// The answer (a decline): stop.
        Final(String),
    }

    async fn reserve(db: &Db, key: &str, tenant: &str, amount: i64) -> Result<String, String> {
        tried(|| async {
            let held: sqlx::Result<(String,)> = match db {
                Db::Postgres(pool) => {
                    sqlx::query_as(RESERVE_POSTGRES)
                        .bind(key)
                        .bind(tenant)
                        .bind(amount)
                        .fetch_one(pool)
                        .await
                }
                Db::Sqlite(pool) => {
                    sqlx::query_as(RESERVE_SQLITE)
                        .bind(key)
                        .bind(tenant)
                        .bind(amount)
                        .fetch_one(pool)
                        .await
                }
            };
            held.map(|(key,)| key)
                .map_err(|error| Retry::Again(error.to_string()))
        })
        .await
    }

    async fn charge(state: &Debits, key: &str, new: &NewDebit) -> Result<String, String> {
        let body = serde_json::json!({"amount": new.amount, "currency": new.currency});
        tried(|| async {
            let answer = state
                .psp
                .post(&state.charges)
                .header("idempotency-key", key)
                .json(&body)
                .send()
                .await
                .map_err(|error| Retry::Again(error.to_string()))?;
            let status = answer.status();
            let text = answer
                .text()
                .await
                .map_err(|error| Retry::Again(error.to_string()))?;
            if status.is_server_error() {
                return Err(Retry::Again(format!("the PSP answered {status}")));
            }
            if !status.is_success() {
                return Err(Retry::Final(format!("the PSP answered {status}: {text}")));
            }
            let charge: serde_json::Value =
                serde_json::from_str(&text).map_err(|error| Retry::Final(error.to_string()))?;
            charge["id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| Retry::Final("the PSP's charge has no id".to_owned()))
        })
        .await
    }

    /// The hold, through a transactional step's `Tx` (dropped here, before
    /// the step commits it with its record). A failed statement aborts the
    /// transaction: the step then records nothing and fails.
    async fn reserve_in(
        mut tx: Tx,
        key: &str,
        tenant: &str,
        amount: i64,
    ) -> Result<String, String> {
        let held: sqlx::Result<(String,)> = sqlx::query_as(RESERVE_POSTGRES)
            .bind(key)
            .bind(tenant)
            .bind(amount)
            .fetch_one(&mut *tx)
            .await;
        held.map(|(key,)| key).map_err(|error| error.to_string())
    }

    /// The ledger's row, through a transactional step's `Tx`.
    async fn record_in(
        mut tx: Tx,
        key: &str,
        tenant: &str,
        new: &NewDebit,
        charge: &str,
    ) -> Result<i64, String> {
        let id: sqlx::Result<(i64,)> = sqlx::query_as(RECORD_POSTGRES)
            .bind(key)
            .bind(tenant)
            .bind(new.amount)
            .bind(&new.currency)
            .bind(charge)
            .fetch_one(&mut *tx)
            .await;
        id.map(|(id,)| id).map_err(|error| error.to_string())
    }

    async fn record(
        db: &Db,
        key: &str,
        tenant: &str,
        new: &NewDebit,
        charge: &str,
    ) -> Result<i64, String> {
        tried(|| async {
            let id: sqlx::Result<(i64,)> = match db {
                Db::Postgres(pool) => {
                    sqlx::query_as(RECORD_POSTGRES)
                        .bind(key)
                        .bind(tenant)
                        .bind(new.amount)
                        .bind(&new.currency)
                        .bind(charge)
                        .fetch_one(pool)
                        .await
                }
                Db::Sqlite(pool) => {
                    sqlx::query_as(RECORD_SQLITE)
                        .bind(key)
                        .bind(tenant)
                        .bind(new.amount)
                        .bind(&new.currency)
                        .bind(charge)
                        .fetch_one(pool)
                        .await
                }
            };
            id.map(|(id,)| id)
                .map_err(|error| Retry::Again(error.to_string()))
        })
        .await
    }
}
