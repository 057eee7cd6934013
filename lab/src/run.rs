//! One run of the incident: the payments example (and, guarded, the status
//! service) on a fresh SQLite file, the proxy in front, the population's
//! traffic through it, then the ledger and the store read back.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use idempotency_tests::{FakePsp, Process};
use tokio::task::JoinSet;

use crate::callers::{CallOutcome, Caller, DebitRoute};
use crate::capacity::Capacity;
use crate::config::{CRASH_HANDLER_TIME, CRASH_LEASE, IncidentConfig, Mode, RESUME_DEADLINE};
use crate::programs::Programs;
use crate::proxy::{Exchange, FaultProxy};
use crate::schedule::FaultSchedule;
use crate::traffic::{self, Kind, Operation, SEEDED_AMOUNT, SEEDED_PAYMENTS};

/// The status service's token for the app's scope (`default`).
const TOKEN: &str = "token-of-the-incident-lab-0001";
/// The admin token the lab reads the records needing a decision with.
const ADMIN_TOKEN: &str = "admin-token-of-the-incident-lab-01";

/// One logical operation and how its client saw it end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub operation: Operation,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// The store's records that still need a decision after the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unsettled {
    /// Abandoned records (outcome unknown), not marked reconciled.
    pub abandoned: u64,
    /// Records still in flight past their lease.
    pub in_flight_past_lease: u64,
}

/// A key the run left abandoned (its outcome unknown), and the debit it
/// was claimed for: what finance needs to reconcile it, and what a retry
/// resends once an operator released it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonedKey {
    /// The idempotency key (the retry client's, one per debit).
    pub key: String,
    /// Its record's fingerprint (`sha256:...`).
    pub fingerprint: String,
    /// The debit whose request has that fingerprint, when one of the run
    /// has (its body is [`crate::callers::debit`] of it).
    pub debit: Option<Operation>,
}

/// Everything one run leaves to count.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// Naive or guarded.
    pub mode: Mode,
    /// Each operation and its end.
    pub calls: Vec<Call>,
    /// Every request through the fault proxy.
    pub exchanges: Vec<Exchange>,
    /// When each status look-up was made (guarded only).
    pub lookups: Vec<Duration>,
    /// Rows in the ledger per debit amount (`payments`, or `debits` on the
    /// resumable route; debits that never ran are absent).
    pub ledger: HashMap<i64, u64>,
    /// Where the debits went.
    pub route: DebitRoute,
    /// Charges the fake PSP made per debit amount, on the resumable route
    /// (`None` elsewhere: `/payments` charges no PSP).
    pub psp_charges: Option<HashMap<i64, u64>>,
    /// Requests the fake PSP got (a charge step run again sends its
    /// charge a second time, under the same derived key).
    pub psp_requests: u64,
    /// The records left to reconcile (guarded only: the naive run has no
    /// keys to ask about).
    pub unsettled: Option<Unsettled>,
    /// The abandoned keys among them, not marked reconciled, by key.
    pub abandoned: Vec<AbandonedKey>,
    /// From the first operation to the last answer.
    pub elapsed: Duration,
    /// The window (of faults, or of the surge), from the start of the
    /// traffic.
    pub window: std::ops::Range<Duration>,
}

/// Runs the incident once in `mode`; the SQLite file lives in `dir`.
///
/// # Errors
///
/// When the seed payments cannot be made, or the ledger or the store
/// cannot be read.
///
/// # Panics
///
/// When a program does not start (the message says which).
pub async fn run(
    mode: Mode,
    config: &IncidentConfig,
    programs: &Programs,
    dir: &Path,
) -> anyhow::Result<RunRecord> {
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.join(format!("{}.db", mode.as_str())).display()
    );
    let guard = match mode {
        Mode::Naive => "off",
        Mode::Guarded => "on",
    };
    let lease = match config.crash_at {
        Some(_) => CRASH_LEASE,
        None => Duration::from_secs(60),
    }
    .as_secs()
    .to_string();
    // The resumable route, for the guarded run of a crash: its PSP lives
    // here, across the app's restart.
    let route = match mode {
        Mode::Guarded if config.crash_at.is_some() && config.resume => DebitRoute::Resumable,
        _ => DebitRoute::Payments,
    };
    let psp = match route {
        DebitRoute::Resumable => Some(FakePsp::start().await),
        DebitRoute::Payments => None,
    };
    let mut app_env = vec![
        ("DATABASE_URL", url.clone()),
        ("IDEMPOTENCY_GUARD", guard.to_owned()),
        ("LEASE_SECS", lease),
        ("RUST_LOG", "off".to_owned()),
    ];
    if let Some(psp) = &psp {
        app_env.push(("PSP_URL", psp.url()));
    }
    let app = start_app(&programs.payments, None, &app_env).await;
    seed_payments(app.address).await?;
    let service = match mode {
        Mode::Naive => None,
        Mode::Guarded => {
            let tokens = format!("default {TOKEN}");
            let admin = format!("lab * {ADMIN_TOKEN}");
            let env = [
                ("DATABASE_URL", url.as_str()),
                ("TOKENS", tokens.as_str()),
                ("ADMIN_TOKENS", admin.as_str()),
                ("MIGRATE_ON_START", "false"),
                ("RUST_LOG", "off"),
            ];
            Some(Process::start(&programs.status_service, &env, "/readyz").await)
        }
    };

    let schedule = config.schedule;
    let window = schedule.start..schedule.start + schedule.window;
    let surge = config.overload.map(|overload| traffic::Surge {
        window: window.clone(),
        factor: overload.surge,
    });
    let mut operations = traffic::plan_with_surge(
        schedule.seed,
        config.rate,
        config.duration,
        config.writes,
        config.clients,
        surge.as_ref(),
    );
    if config.crash_at.is_some() {
        for operation in operations.iter_mut().filter(|o| o.kind == Kind::Write) {
            operation.handler_time = CRASH_HANDLER_TIME;
        }
    }
    let origin = Instant::now();
    let capacity = config
        .overload
        .map(|overload| Capacity::new(overload.capacity));
    let proxy = FaultProxy::start(app.address, schedule, origin, capacity).await?;
    // The status service's traffic, counted and never faulted.
    let calm = FaultSchedule {
        window: Duration::ZERO,
        ..schedule
    };
    let status_proxy = match &service {
        Some(service) => Some(FaultProxy::start(service.address, calm, origin, None).await?),
        None => None,
    };
    let app_address = app.address;
    let (app, crash) = match config.crash_at {
        None => (Some(app), None),
        Some(at) => {
            let writes = proxy.writes_at_upstream();
            let program = programs.payments.clone();
            let admin = service.as_ref().map(|service| service.address);
            let crash = tokio::spawn(async move {
                tokio::time::sleep_until((origin + at).into()).await;
                // Kill while a debit runs in its handler (waiting up to
                // 5 s for one). Guarded: once the store holds a claimed
                // record (its handler asleep), so that the crash leaves
                // its key abandoned; the proxy's view is not enough, as a
                // loaded machine may take longer than half the handler
                // time to claim. Naive (no records): once the first
                // attempt of a debit has been at the app for half its
                // handler time.
                let http = reqwest::Client::new();
                let waiting = Instant::now();
                while waiting.elapsed() < Duration::from_secs(5) {
                    let running = match admin {
                        Some(service) => claimed(&http, service).await,
                        None => writes
                            .oldest()
                            .is_some_and(|age| age >= CRASH_HANDLER_TIME / 2),
                    };
                    if running {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                app.kill().await;
                start_app(&program, Some(app_address), &app_env).await
            });
            (None, Some(crash))
        }
    };
    let caller = match (&status_proxy, route) {
        (None, _) => Caller::naive(config.naive.clone())?,
        (Some(_), DebitRoute::Resumable) => Caller::resumable(config.clients, RESUME_DEADLINE)?,
        (Some(status), DebitRoute::Payments) => {
            Caller::guarded(config.clients, &format!("http://{}", status.address), TOKEN)?
        }
    };
    let caller = Arc::new(caller);
    let base: Arc<str> = format!("http://{}", proxy.address).into();
    let debits: Vec<Operation> = operations
        .iter()
        .filter(|o| o.kind == Kind::Write)
        .copied()
        .collect();
    let mut running = JoinSet::new();
    for operation in operations {
        tokio::time::sleep_until((origin + operation.at).into()).await;
        let (caller, base) = (Arc::clone(&caller), Arc::clone(&base));
        running.spawn(async move {
            let outcome = caller.call(&operation, &base).await;
            Call { operation, outcome }
        });
    }
    let mut calls = Vec::new();
    while let Some(call) = running.join_next().await {
        calls.push(call.context("a client task")?);
    }
    let elapsed = origin.elapsed();
    // The app started again after the crash stays up until the end.
    let _app = match crash {
        Some(restarted) => Some(restarted.await.context("the crash task")?),
        None => app,
    };
    calls.sort_by_key(|call| call.operation.index);
    // The proxy logs an exchange once its client has gone: give the last
    // ones a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let ledger = ledger(&url, route).await?;
    let charges = psp.map(|psp| psp.charges()).unwrap_or_default();
    let psp_requests = charges.iter().map(|charge| charge.requests).sum();
    let psp_charges = (route == DebitRoute::Resumable).then(|| {
        let mut by_amount: HashMap<i64, u64> = HashMap::new();
        for charge in &charges {
            *by_amount.entry(charge.amount).or_default() += 1;
        }
        by_amount
    });
    let (unsettled, abandoned) = match &service {
        Some(service) => {
            let (unsettled, abandoned) = unsettled(service.address, &debits, route).await?;
            (Some(unsettled), abandoned)
        }
        None => (None, Vec::new()),
    };
    let lookups = status_proxy
        .map(|proxy| proxy.exchanges().iter().map(|e| e.at).collect())
        .unwrap_or_default();
    Ok(RunRecord {
        mode,
        calls,
        exchanges: proxy.exchanges(),
        lookups,
        ledger,
        route,
        psp_charges,
        psp_requests,
        unsettled,
        abandoned,
        elapsed,
        window,
    })
}

/// Starts the payments example (on `address`, when it restarts where it
/// was) with `env`.
async fn start_app(
    program: &str,
    address: Option<std::net::SocketAddr>,
    env: &[(&str, String)],
) -> Process {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    match address {
        Some(address) => Process::start_at(program, address, &env, "/metrics").await,
        None => Process::start(program, &env, "/metrics").await,
    }
}

/// Whether the store holds a claimed record (a debit in its handler), from
/// the admin API.
async fn claimed(http: &reqwest::Client, service: std::net::SocketAddr) -> bool {
    let listing = http
        .get(format!(
            "http://{service}/v1/admin/keys?scope=default&state=in_flight&limit=1"
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await;
    let page: Option<serde_json::Value> = match listing {
        Ok(answer) if answer.status().is_success() => answer.json().await.ok(),
        _ => None,
    };
    page.is_some_and(|page| {
        page["records"]
            .as_array()
            .is_some_and(|records| !records.is_empty())
    })
}

/// Writes the payments reads read, straight to the app.
async fn seed_payments(app: std::net::SocketAddr) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    for n in 0..SEEDED_PAYMENTS {
        let answer = http
            .post(format!("http://{app}/payments"))
            .header("idempotency-key", format!("lab-seed-{n}"))
            .json(&serde_json::json!({"amount": SEEDED_AMOUNT + n as i64, "currency": "EUR"}))
            .send()
            .await
            .context("make a seed payment")?;
        anyhow::ensure!(
            answer.status() == 201,
            "a seed payment answered {}",
            answer.status()
        );
    }
    Ok(())
}

/// Rows of the ledger (`payments`, or `debits` on the resumable route)
/// per debit amount.
async fn ledger(url: &str, route: DebitRoute) -> anyhow::Result<HashMap<i64, u64>> {
    let pool = sqlx::SqlitePool::connect(url)
        .await
        .context("open the ledger")?;
    let query = match route {
        DebitRoute::Payments => {
            "select amount, count(*) from payments where amount < ?1 group by amount"
        }
        DebitRoute::Resumable => {
            "select amount, count(*) from debits where amount < ?1 group by amount"
        }
    };
    let rows: Vec<(i64, i64)> = sqlx::query_as(query)
        .bind(SEEDED_AMOUNT)
        .fetch_all(&pool)
        .await
        .context("count the ledger's rows")?;
    pool.close().await;
    Ok(rows
        .into_iter()
        .map(|(amount, n)| (amount, n.unsigned_abs()))
        .collect())
}

/// The records that need a decision, from the admin API, and the
/// abandoned keys among them with the debits (of `debits`) they belong to.
async fn unsettled(
    service: std::net::SocketAddr,
    debits: &[Operation],
    route: DebitRoute,
) -> anyhow::Result<(Unsettled, Vec<AbandonedKey>)> {
    let http = reqwest::Client::new();
    let now = time::OffsetDateTime::now_utc();
    let by_fingerprint: HashMap<String, Operation> = debits
        .iter()
        .map(|debit| {
            (
                crate::callers::debit_fingerprint(debit, route).to_string(),
                *debit,
            )
        })
        .collect();
    let mut found = Unsettled::default();
    let mut abandoned = Vec::new();
    for state in ["abandoned", "in_flight"] {
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![
                ("scope", "default".to_owned()),
                ("state", state.to_owned()),
                ("limit", "1000".to_owned()),
            ];
            if let Some(after) = &after {
                query.push(("after", after.clone()));
            }
            let url =
                reqwest::Url::parse_with_params(&format!("http://{service}/v1/admin/keys"), &query)
                    .context("the listing's URL")?;
            let page: serde_json::Value = http
                .get(url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .context("list the records")?
                .error_for_status()
                .context("list the records")?
                .json()
                .await
                .context("read the listing")?;
            for record in page["records"].as_array().into_iter().flatten() {
                let lapsed = record["lease_expires_at"]
                    .as_str()
                    .and_then(|at| {
                        time::OffsetDateTime::parse(
                            at,
                            &time::format_description::well_known::Rfc3339,
                        )
                        .ok()
                    })
                    .is_some_and(|at| at < now);
                match state {
                    "abandoned" if record["needs_decision"] == true => {
                        found.abandoned += 1;
                        let fingerprint = record["fingerprint"].as_str().unwrap_or_default();
                        abandoned.push(AbandonedKey {
                            key: record["key"].as_str().unwrap_or_default().to_owned(),
                            fingerprint: fingerprint.to_owned(),
                            debit: by_fingerprint.get(fingerprint).copied(),
                        });
                    }
                    "in_flight" if lapsed => found.in_flight_past_lease += 1,
                    _ => {}
                }
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
    }
    Ok((found, abandoned))
}

impl RunRecord {
    /// The debits of the run (logical writes).
    pub fn debits(&self) -> impl Iterator<Item = &Call> {
        self.calls
            .iter()
            .filter(|call| call.operation.kind == Kind::Write)
    }
}
