//! The run: plans every measurement, executes them one after another (each
//! concurrency level's runs back to back, so ratios compare figures taken
//! minutes apart at most), cleans up, and writes the report and the plot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use idempotency_guard::store::AnyStore;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::store::tiered::TieredStore;

use crate::batches::BatchSizes;
use crate::cli::{App, RunArgs, StoreName};
use crate::load::{self, Keys, Load};
use crate::raw::{self, RawOp};
use crate::setup::{BenchDatabase, Child, ChildConfig, delete_redis_keys};
use crate::stats::{Sample, Summary};

/// What one row of the table measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    Bare,
    GuardFresh,
    GuardReplay,
    RawWrite,
    RawRead,
    RawClaimExisting,
    PeerFresh,
    PeerReplay,
    Peer2Fresh,
    Peer2Replay,
    GuardTxFresh,
    LargeBare,
    LargeGuard,
    LargePeer,
    LargePeer2,
    GuardEncryptedFresh,
    GuardEncryptedReplay,
    GuardCachedReplay,
}

impl Scenario {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare handler",
            Self::GuardFresh => "guard, fresh keys",
            Self::GuardReplay => "guard, replays",
            Self::RawWrite => "raw claim+complete",
            Self::RawRead => "raw single read",
            Self::RawClaimExisting => "raw claim of a completed key",
            Self::PeerFresh => "peer 0.3.0, fresh keys",
            Self::PeerReplay => "peer 0.3.0, replays",
            Self::Peer2Fresh => "peer 2.0.0, fresh keys",
            Self::Peer2Replay => "peer 2.0.0, replays",
            Self::GuardTxFresh => "guard, transactional mode, fresh keys",
            Self::LargeBare => "bare handler, 1 MiB bodies",
            Self::LargeGuard => "guard, 1 MiB bodies, fresh keys",
            Self::LargePeer => "peer 0.3.0, 1 MiB bodies, fresh keys",
            Self::LargePeer2 => "peer 2.0.0, 1 MiB bodies, fresh keys",
            Self::GuardEncryptedFresh => "guard, sealed responses, fresh keys",
            Self::GuardEncryptedReplay => "guard, sealed responses, replays",
            Self::GuardCachedReplay => "guard, replays, replay cache",
        }
    }
}

/// One measured run.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// `postgres`, `sqlite`, `redis`, `redis-cluster`, `tiered`, or `-` (no store).
    pub(crate) store: &'static str,
    pub(crate) scenario: Scenario,
    pub(crate) concurrency: usize,
    pub(crate) summary: Summary,
    /// The server's peak RSS (HTTP runs).
    pub(crate) rss_kib: Option<u64>,
    /// The server's CPU time per request, in microseconds (HTTP runs): all
    /// its threads, warm-up included, over every request it answered.
    pub(crate) cpu_us: Option<f64>,
    /// The guard's mean store batch sizes over the run's load (guard runs
    /// whose server exported its metrics).
    pub(crate) batches: Option<BatchSizes>,
}

/// One planned run.
#[derive(Debug, Clone)]
enum Step {
    Http {
        app: App,
        store: Option<StoreName>,
        scenario: Scenario,
        concurrency: usize,
        large: bool,
    },
    Raw {
        store: StoreName,
        op: RawOp,
        scenario: Scenario,
        concurrency: usize,
    },
}

/// Everything a run measured, for the report.
pub(crate) struct Results {
    pub(crate) rows: Vec<Row>,
    pub(crate) growth: Vec<crate::growth::GrowthRow>,
    pub(crate) settings: Settings,
}

/// The settings the report repeats.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) command: String,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) pool_size: u32,
    pub(crate) replay_keys: usize,
    pub(crate) large_body_connections: usize,
    pub(crate) smoke: bool,
    /// Whether the peer `idempotent` 2.0.0 was measured.
    pub(crate) peer2: bool,
    /// Whether the guard's servers ran with a Prometheus recorder.
    pub(crate) server_metrics: bool,
    pub(crate) started: time::OffsetDateTime,
    pub(crate) machine_before: crate::machine::Load,
    pub(crate) machine_after: Option<crate::machine::Load>,
}

/// The state of a run.
pub(crate) struct Bench {
    pub(crate) args: RunArgs,
    run_id: String,
    counter: usize,
    pub(crate) db: BenchDatabase,
    sqlite_dir: tempfile::TempDir,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// The binary of the peer `idempotent` 2.0.0, when it is measured.
    peer2_bin: Option<PathBuf>,
}

/// The body of the large-body run: a JSON document of exactly 1 MiB.
fn large_body() -> Bytes {
    let size = 1024 * 1024;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(br#"{"data":""#);
    body.resize(size - 2, b'a');
    body.extend_from_slice(br#""}"#);
    Bytes::from(body)
}

/// Runs the benchmark with `args`.
pub(crate) async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    let command = command_line(&args);
    args.redis_cluster_urls.retain(|url| !url.trim().is_empty());
    if args.smoke {
        args.duration_ms = 100;
        args.warmup_ms = 50;
        args.concurrency = vec![2];
        args.replay_keys = 16;
        args.large_body_connections = 4;
        args.growth = true;
        args.growth_rows = vec![2000];
        // CI must not compile the peer 2.0.0 crate.
        args.no_peer2 = true;
    }
    let wants_peer2 =
        !args.no_peer2 && !args.growth_only && args.stores.iter().any(|store| store == "redis");
    let peer2_bin = match (&args.peer2_bin, wants_peer2) {
        (_, false) => None,
        (Some(bin), true) => Some(bin.clone()),
        (None, true) => Some(crate::peer2::build().await?),
    };
    let smoke_dir;
    let out_dir = match (&args.out_dir, args.smoke) {
        (Some(dir), _) => dir.clone(),
        (None, true) => {
            smoke_dir = tempfile::tempdir()?;
            smoke_dir.path().to_owned()
        }
        (None, false) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs"),
    };
    let settings = Settings {
        command,
        warmup: Duration::from_millis(args.warmup_ms),
        duration: Duration::from_millis(args.duration_ms),
        concurrency: args.concurrency.clone(),
        pool_size: args.pool_size,
        replay_keys: args.replay_keys,
        large_body_connections: args.large_body_connections,
        smoke: args.smoke,
        peer2: peer2_bin.is_some(),
        server_metrics: !args.no_server_metrics,
        started: time::OffsetDateTime::now_utc(),
        machine_before: crate::machine::Load::now(),
        machine_after: None,
    };
    eprintln!(
        "load before the run: {} (2 cores are shared with PostgreSQL, Redis and the load generator)",
        settings.machine_before
    );
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let db = BenchDatabase::create(&args.postgres_url, &format!("idem_bench_{run_id}")).await?;
    let mut bench = Bench {
        warmup: settings.warmup,
        duration: settings.duration,
        args,
        run_id,
        counter: 0,
        db,
        sqlite_dir: tempfile::tempdir()?,
        peer2_bin,
    };
    let measured = if bench.args.growth_only {
        Ok(Vec::new())
    } else if bench.args.encryption_only {
        bench.measure(bench.encryption_plan()).await
    } else {
        bench.measure_all().await
    };
    let growth = match (
        &measured,
        (bench.args.growth || bench.args.growth_only) && !bench.args.encryption_only,
    ) {
        (Ok(_), true) => crate::growth::run(&mut bench).await,
        _ => Ok(Vec::new()),
    };
    // Clean up whatever happened.
    let pattern = format!("idem-bench-{}-*", bench.run_id);
    let mut nodes = vec![bench.args.redis_url.clone()];
    nodes.extend(bench.args.redis_cluster_urls.iter().cloned());
    if let Err(error) = delete_redis_keys(&nodes, &pattern).await {
        eprintln!("warning: could not delete the Redis keys {pattern}: {error:#}");
    }
    if let Err(error) = bench.db.drop_database().await {
        eprintln!("warning: could not drop the benchmark database: {error:#}");
    }
    let rows = measured?;
    let growth = growth?;
    let mut settings = settings;
    settings.machine_after = Some(crate::machine::Load::now());
    let results = Results {
        rows,
        growth,
        settings,
    };
    std::fs::create_dir_all(&out_dir)?;
    let markdown = out_dir.join("BENCHMARKS.md");
    if bench.args.encryption_only {
        crate::report::replace_encryption(&results, &markdown)?;
        eprintln!("updated the encryption section of {}", markdown.display());
        return Ok(());
    }
    if bench.args.growth_only {
        crate::report::replace_growth(&results, &markdown)?;
        eprintln!("updated the growth section of {}", markdown.display());
        return Ok(());
    }
    crate::report::write(&results, &markdown, &bench.args).await?;
    let png = out_dir.join("benchmarks.png");
    match crate::plot::draw(&results, &png, &bench.args.font) {
        Ok(()) => {}
        Err(error) if bench.args.smoke => eprintln!("warning: no plot: {error:#}"),
        Err(error) => return Err(error),
    }
    eprintln!("wrote {} and {}", markdown.display(), png.display());
    if bench.args.smoke {
        eprintln!("smoke run: every path ran; figures are not meaningful");
    }
    Ok(())
}

/// The command line that reproduces this run, for the report.
fn command_line(args: &RunArgs) -> String {
    let mut command = String::from("cargo run --release -p idempotency-bench");
    let mut extra = Vec::new();
    if args.smoke {
        extra.push("--smoke".to_owned());
    }
    if args.growth {
        extra.push("--growth".to_owned());
    }
    if args.growth_only {
        extra.push("--growth-only".to_owned());
    }
    if args.no_peer2 && !args.smoke {
        extra.push("--no-peer2".to_owned());
    }
    if args.no_server_metrics {
        extra.push("--no-server-metrics".to_owned());
    }
    if args.encryption_only {
        extra.push("--encryption-only".to_owned());
        if args.encryption_rounds != 3 {
            extra.push(format!("--encryption-rounds {}", args.encryption_rounds));
        }
    }
    if args.stores != ["postgres", "sqlite", "redis", "tiered"] {
        extra.push(format!("--stores {}", args.stores.join(",")));
    }
    if args.concurrency != [1, 16, 64, 256] && !args.smoke {
        let levels: Vec<String> = args.concurrency.iter().map(ToString::to_string).collect();
        extra.push(format!("--concurrency {}", levels.join(",")));
    }
    if args
        .redis_cluster_urls
        .iter()
        .all(|url| url.trim().is_empty())
    {
        extra.push("--redis-cluster-urls ''".to_owned());
    }
    if args.duration_ms != 3000 {
        extra.push(format!("--duration-ms {}", args.duration_ms));
    }
    if args.warmup_ms != 1000 {
        extra.push(format!("--warmup-ms {}", args.warmup_ms));
    }
    if !extra.is_empty() {
        command.push_str(" -- ");
        command.push_str(&extra.join(" "));
    }
    command
}

impl Bench {
    fn stores(&self) -> anyhow::Result<Vec<StoreName>> {
        self.args
            .stores
            .iter()
            .map(|name| StoreName::parse(name))
            .collect()
    }

    fn plan(&self) -> anyhow::Result<Vec<Step>> {
        let stores = self.stores()?;
        let cluster = !self.args.redis_cluster_urls.is_empty();
        // The diagnostic raw claim of completed keys runs at 16 (or the
        // first level when 16 is not measured).
        let diagnostic = if self.args.concurrency.contains(&16) {
            16
        } else {
            self.args.concurrency.first().copied().unwrap_or(1)
        };
        let mut plan = Vec::new();
        for &concurrency in &self.args.concurrency {
            let http = |app, store, scenario| Step::Http {
                app,
                store,
                scenario,
                concurrency,
                large: false,
            };
            let raw = |store, op, scenario| Step::Raw {
                store,
                op,
                scenario,
                concurrency,
            };
            plan.push(http(App::Bare, None, Scenario::Bare));
            for &store in &stores {
                plan.push(raw(store, RawOp::Write, Scenario::RawWrite));
                plan.push(http(App::Guard, Some(store), Scenario::GuardFresh));
                // Encryption at rest, measured on Redis right beside its
                // plain run (the docs' target: < 5 % of fresh keys).
                let sealed = store == StoreName::Redis;
                if sealed {
                    plan.push(http(
                        App::GuardEncrypted,
                        Some(store),
                        Scenario::GuardEncryptedFresh,
                    ));
                }
                plan.push(raw(store, RawOp::Read, Scenario::RawRead));
                plan.push(http(App::Guard, Some(store), Scenario::GuardReplay));
                // The same replays answered from the in-process cache (64 MiB).
                plan.push(http(
                    App::GuardCached,
                    Some(store),
                    Scenario::GuardCachedReplay,
                ));
                if sealed {
                    plan.push(http(
                        App::GuardEncrypted,
                        Some(store),
                        Scenario::GuardEncryptedReplay,
                    ));
                }
                if concurrency == diagnostic {
                    plan.push(raw(store, RawOp::ClaimExisting, Scenario::RawClaimExisting));
                }
            }
            if stores.contains(&StoreName::Redis) {
                plan.push(http(App::Peer, Some(StoreName::Redis), Scenario::PeerFresh));
                plan.push(http(
                    App::Peer,
                    Some(StoreName::Redis),
                    Scenario::PeerReplay,
                ));
                if self.peer2_bin.is_some() {
                    plan.push(http(
                        App::Peer2,
                        Some(StoreName::Redis),
                        Scenario::Peer2Fresh,
                    ));
                    plan.push(http(
                        App::Peer2,
                        Some(StoreName::Redis),
                        Scenario::Peer2Replay,
                    ));
                }
            }
            if stores.contains(&StoreName::Postgres) {
                plan.push(http(
                    App::GuardTx,
                    Some(StoreName::Postgres),
                    Scenario::GuardTxFresh,
                ));
            }
            if cluster {
                plan.push(raw(
                    StoreName::RedisCluster,
                    RawOp::Write,
                    Scenario::RawWrite,
                ));
                plan.push(http(
                    App::Guard,
                    Some(StoreName::RedisCluster),
                    Scenario::GuardFresh,
                ));
            }
        }
        let concurrency = self.args.large_body_connections;
        let large = |app, store, scenario| Step::Http {
            app,
            store,
            scenario,
            concurrency,
            large: true,
        };
        plan.push(large(App::Bare, None, Scenario::LargeBare));
        for &store in &stores {
            plan.push(large(App::Guard, Some(store), Scenario::LargeGuard));
        }
        if stores.contains(&StoreName::Redis) {
            plan.push(large(
                App::Peer,
                Some(StoreName::Redis),
                Scenario::LargePeer,
            ));
            if self.peer2_bin.is_some() {
                plan.push(large(
                    App::Peer2,
                    Some(StoreName::Redis),
                    Scenario::LargePeer2,
                ));
            }
        }
        if !self.args.only.is_empty() {
            plan.retain(|step| {
                let (Step::Http { scenario, .. } | Step::Raw { scenario, .. }) = step;
                self.args
                    .only
                    .iter()
                    .any(|only| scenario.label().contains(only.as_str()))
            });
        }
        Ok(plan)
    }

    /// The encryption-only runs: on Redis, at each concurrency level, plain
    /// and sealed servers alternated `encryption_rounds` times, fresh keys
    /// then replays.
    fn encryption_plan(&self) -> Vec<Step> {
        let mut plan = Vec::new();
        for &concurrency in &self.args.concurrency {
            for _ in 0..self.args.encryption_rounds.max(1) {
                for (app, scenario) in [
                    (App::Guard, Scenario::GuardFresh),
                    (App::GuardEncrypted, Scenario::GuardEncryptedFresh),
                    (App::Guard, Scenario::GuardReplay),
                    (App::GuardEncrypted, Scenario::GuardEncryptedReplay),
                ] {
                    plan.push(Step::Http {
                        app,
                        store: Some(StoreName::Redis),
                        scenario,
                        concurrency,
                        large: false,
                    });
                }
            }
        }
        plan
    }

    async fn measure_all(&mut self) -> anyhow::Result<Vec<Row>> {
        let plan = self.plan()?;
        self.measure(plan).await
    }

    async fn measure(&mut self, plan: Vec<Step>) -> anyhow::Result<Vec<Row>> {
        let total = plan.len();
        let mut rows = Vec::with_capacity(total);
        for (index, step) in plan.into_iter().enumerate() {
            let row = match step {
                Step::Http {
                    app,
                    store,
                    scenario,
                    concurrency,
                    large,
                } => self.http(app, store, scenario, concurrency, large).await,
                Step::Raw {
                    store,
                    op,
                    scenario,
                    concurrency,
                } => self.raw(store, op, scenario, concurrency).await,
            }?;
            eprintln!("[{:>3}/{total}] {}", index + 1, describe(&row));
            if let Some(error) = &row.summary.first_error {
                eprintln!("        {} errors, first: {error}", row.summary.errors);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// A Redis key prefix of its own for the next run.
    pub(crate) fn next_prefix(&mut self) -> String {
        self.counter += 1;
        format!("idem-bench-{}-{}", self.run_id, self.counter)
    }

    /// Cleans up after the run that used `prefix`.
    pub(crate) async fn clean_up(
        &self,
        prefix: &str,
        store: Option<StoreName>,
    ) -> anyhow::Result<()> {
        match store {
            Some(StoreName::Postgres) => self.db.truncate().await?,
            Some(StoreName::Tiered) => {
                self.db.truncate().await?;
                self.delete_keys(std::slice::from_ref(&self.args.redis_url), prefix)
                    .await?;
            }
            Some(StoreName::Redis) => {
                self.delete_keys(std::slice::from_ref(&self.args.redis_url), prefix)
                    .await?;
            }
            Some(StoreName::RedisCluster) => {
                self.delete_keys(&self.args.redis_cluster_urls, prefix)
                    .await?;
            }
            Some(StoreName::Sqlite) | None => {}
        }
        Ok(())
    }

    async fn delete_keys(&self, nodes: &[String], prefix: &str) -> anyhow::Result<()> {
        // `:` after our stores' prefix, `-` after the peer's.
        delete_redis_keys(nodes, &format!("{prefix}[:-]*")).await?;
        Ok(())
    }

    /// A fresh, migrated SQLite database file.
    async fn sqlite_url(&mut self) -> anyhow::Result<String> {
        self.counter += 1;
        let path = self
            .sqlite_dir
            .path()
            .join(format!("run-{}.db", self.counter));
        let url = format!("sqlite://{}", path.display());
        let store = SqliteStore::connect(&url).await?;
        store.migrate().await?;
        store.pool().close().await;
        Ok(url)
    }

    /// The database URL a store of `store` uses.
    async fn database_url(&mut self, store: Option<StoreName>) -> anyhow::Result<String> {
        Ok(match store {
            Some(StoreName::Sqlite) => self.sqlite_url().await?,
            _ => self.db.url.clone(),
        })
    }

    /// Starts the server of `app` on `store`.
    pub(crate) async fn start(
        &mut self,
        app: App,
        store: Option<StoreName>,
        prefix: &str,
    ) -> anyhow::Result<Child> {
        let database_url = self.database_url(store).await?;
        Child::start(&ChildConfig {
            app,
            store,
            database_url: &database_url,
            redis_url: &self.args.redis_url,
            redis_cluster_urls: &self.args.redis_cluster_urls,
            prefix,
            pool_size: self.args.pool_size,
            metrics: !self.args.no_server_metrics,
            peer2_bin: self.peer2_bin.as_deref(),
        })
        .await
    }

    async fn http(
        &mut self,
        app: App,
        store: Option<StoreName>,
        scenario: Scenario,
        concurrency: usize,
        large: bool,
    ) -> anyhow::Result<Row> {
        let prefix = self.next_prefix();
        let child = self.start(app, store, &prefix).await?;
        let body = if large {
            large_body()
        } else {
            Bytes::from_static(crate::server::REQUEST_BODY)
        };
        let replay = matches!(
            scenario,
            Scenario::GuardReplay
                | Scenario::PeerReplay
                | Scenario::Peer2Replay
                | Scenario::GuardEncryptedReplay
                | Scenario::GuardCachedReplay
        );
        let keys = if replay {
            let keys = Arc::new(
                (0..self.args.replay_keys)
                    .map(|i| format!("{prefix}-replay-{i}"))
                    .collect::<Vec<_>>(),
            );
            // Complete every key, then replay each once (a tiered store
            // caches it then), before the warm-up.
            load::seed(child.address, 32, Arc::clone(&keys), body.clone(), false).await?;
            load::seed(child.address, 32, Arc::clone(&keys), body.clone(), true).await?;
            Keys::Replay(keys)
        } else {
            Keys::Fresh(prefix.clone().into())
        };
        // The guard's batch sizes over the load alone (seeding excluded).
        let scrapes = matches!(app, App::Guard | App::GuardCached | App::GuardTx)
            && !self.args.no_server_metrics;
        let batches_before = if scrapes {
            scrape(child.address).await
        } else {
            None
        };
        let cpu_before = child.cpu_nanos();
        let sample = load::run(&Load {
            address: child.address,
            connections: concurrency,
            warmup: self.warmup,
            duration: self.duration,
            keys,
            body,
        })
        .await;
        let cpu = cpu_before
            .zip(child.cpu_nanos())
            .map(|(a, b)| b.saturating_sub(a));
        let rss_kib = child.peak_rss_kib();
        let batches = match &batches_before {
            Some(before) => scrape(child.address)
                .await
                .map(|after| BatchSizes::between(before, &after)),
            None => None,
        };
        child.stop().await?;
        self.clean_up(&prefix, store).await?;
        let sample = sample?;
        let cpu_us = cpu
            .filter(|_| sample.total > 0)
            .map(|nanos| nanos as f64 / 1000.0 / sample.total as f64);
        Ok(Row {
            store: store.map_or("-", StoreName::as_str),
            scenario,
            concurrency,
            summary: sample.summary(),
            rss_kib,
            cpu_us,
            batches,
        })
    }

    /// Connects the store `store` as the server under test would.
    pub(crate) async fn connect(
        &mut self,
        store: StoreName,
        prefix: &str,
    ) -> anyhow::Result<AnyStore> {
        let pool_size = self.args.pool_size;
        Ok(match store {
            StoreName::Postgres => {
                AnyStore::Postgres(PostgresStore::connect(&self.db.url, pool_size).await?)
            }
            StoreName::Sqlite => {
                let url = self.sqlite_url().await?;
                AnyStore::Sqlite(SqliteStore::connect(&url).await?)
            }
            StoreName::Redis => {
                AnyStore::Redis(RedisStore::connect(&self.args.redis_url, prefix).await?)
            }
            StoreName::RedisCluster => {
                let nodes: Vec<&str> = self
                    .args
                    .redis_cluster_urls
                    .iter()
                    .map(String::as_str)
                    .collect();
                AnyStore::Redis(RedisStore::connect_cluster(&nodes, prefix).await?)
            }
            StoreName::Tiered => AnyStore::Tiered(TieredStore::new(
                PostgresStore::connect(&self.db.url, pool_size).await?,
                RedisStore::connect(&self.args.redis_url, prefix).await?,
            )),
        })
    }

    async fn raw(
        &mut self,
        store: StoreName,
        op: RawOp,
        scenario: Scenario,
        concurrency: usize,
    ) -> anyhow::Result<Row> {
        let prefix = self.next_prefix();
        let connected = self.connect(store, &prefix).await?;
        let keys = Arc::new(
            (0..self.args.replay_keys)
                .map(|i| format!("{prefix}-replay-{i}"))
                .collect::<Vec<_>>(),
        );
        if op != RawOp::Write {
            raw::seed(&connected, 32, Arc::clone(&keys))
                .await
                .context("seeding the raw read run")?;
        }
        let sample: anyhow::Result<Sample> = raw::run(
            &connected,
            op,
            concurrency,
            self.warmup,
            self.duration,
            &prefix,
            keys,
        )
        .await;
        close(connected).await;
        self.clean_up(&prefix, Some(store)).await?;
        Ok(Row {
            store: store.as_str(),
            scenario,
            concurrency,
            summary: sample?.summary(),
            rss_kib: None,
            cpu_us: None,
            batches: None,
        })
    }
}

/// Closes a store's pools, so the next run starts from none.
pub(crate) async fn close(store: AnyStore) {
    match store {
        AnyStore::Postgres(store) => store.pool().close().await,
        AnyStore::Sqlite(store) => store.pool().close().await,
        AnyStore::Tiered(store) => store.database().pool().close().await,
        _ => {}
    }
}

/// Scrapes a guard's server for its batch sizes; a failure is logged, not
/// fatal (the run's figures stand without them).
async fn scrape(address: std::net::SocketAddr) -> Option<crate::batches::Scrape> {
    match crate::batches::scrape(address).await {
        Ok(scrape) => Some(scrape),
        Err(error) => {
            eprintln!("warning: no batch sizes: {error:#}");
            None
        }
    }
}

fn describe(row: &Row) -> String {
    let s = &row.summary;
    format!(
        "{:<13} {:<38} c={:<3} {:>9.0} /s  p50 {:>8.0} µs  p99 {:>8.0} µs  p999 {:>8.0} µs{}",
        row.store,
        row.scenario.label(),
        row.concurrency,
        s.throughput,
        s.p50_us,
        s.p99_us,
        s.p999_us,
        row.rss_kib
            .map(|kib| format!("  rss {:.1} MiB", kib as f64 / 1024.0))
            .unwrap_or_default()
            + &row
                .cpu_us
                .map(|us| format!("  cpu {us:.0} µs/req"))
                .unwrap_or_default()
            + &row
                .batches
                .map(|sizes| format!("  {sizes}"))
                .unwrap_or_default()
    )
}
