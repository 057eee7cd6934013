//! The harness: the state of a run ([`Bench`]) and how one planned step is
//! measured (a server started on a store, a load run against it, the
//! figures collected, the keys cleaned up). The plan itself is in
//! `orchestrate.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use idempotency_guard::store::nats::NatsStore;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::store::tiered::TieredStore;
use idempotency_guard::store::{AnyStore, Backend};

use crate::batches::BatchSizes;
use crate::cli::{App, RunArgs, StoreName};
use crate::load::{self, Keys, Load};
use crate::raw::{self, RawOp};
use crate::results::{Row, Scenario};
use crate::setup::{BenchDatabase, Child, ChildConfig, delete_nats_buckets, delete_redis_keys};
use crate::stats::Sample;

/// One planned run.
#[derive(Debug, Clone)]
pub(crate) enum Step {
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

/// The state of a run.
pub(crate) struct Bench {
    pub(crate) args: RunArgs,
    pub(crate) run_id: String,
    pub(crate) counter: usize,
    pub(crate) db: BenchDatabase,
    pub(crate) sqlite_dir: tempfile::TempDir,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    /// The binary of the peer `idempotent` 2.0.0, when it is measured.
    pub(crate) peer2_bin: Option<PathBuf>,
}

/// The body of the large-body run: a JSON document of exactly 1 MiB.
pub(crate) fn large_body() -> Bytes {
    let size = 1024 * 1024;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(br#"{"data":""#);
    body.resize(size - 2, b'a');
    body.extend_from_slice(br#""}"#);
    Bytes::from(body)
}

impl Bench {
    pub(crate) async fn measure(&mut self, plan: Vec<Step>) -> anyhow::Result<Vec<Row>> {
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

    /// A Redis key prefix of its own for the next run (and the NATS
    /// store's bucket: `idem-bench-<run>-<n>`).
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
            Some(StoreName::Nats) => {
                delete_nats_buckets(&self.args.nats_url, |bucket| bucket == prefix).await?;
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
            nats_url: &self.args.nats_url,
            nats_replicas: self.args.nats_replicas,
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
        // Every PostgreSQL run starts on the same steady-state table (see
        // `Database::truncate`), the first one too.
        if matches!(store, Some(StoreName::Postgres | StoreName::Tiered)) {
            self.db.truncate().await?;
        }
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
        let scrapes = matches!(
            app,
            App::Guard
                | App::GuardCached
                | App::GuardTx
                | App::GuardSingleCommit
                | App::GuardReplicaAcks
        ) && !self.args.no_server_metrics;
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
                AnyStore::from(PostgresStore::connect(&self.db.url, pool_size).await?)
            }
            StoreName::Sqlite => {
                let url = self.sqlite_url().await?;
                AnyStore::from(SqliteStore::connect(&url).await?)
            }
            StoreName::Redis => {
                AnyStore::from(RedisStore::connect(&self.args.redis_url, prefix).await?)
            }
            StoreName::RedisCluster => {
                let nodes: Vec<&str> = self
                    .args
                    .redis_cluster_urls
                    .iter()
                    .map(String::as_str)
                    .collect();
                AnyStore::from(RedisStore::connect_cluster(&nodes, prefix).await?)
            }
            StoreName::Tiered => AnyStore::from(TieredStore::new(
                PostgresStore::connect(&self.db.url, pool_size).await?,
                RedisStore::connect(&self.args.redis_url, prefix).await?,
            )),
            StoreName::Nats => AnyStore::from(
                NatsStore::connect_with_replicas(
                    &self.args.nats_url,
                    prefix,
                    self.args.nats_replicas,
                )
                .await?,
            ),
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
        if matches!(store, StoreName::Postgres | StoreName::Tiered) {
            self.db.truncate().await?;
        }
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
    match store.backend() {
        Backend::Postgres(store) => store.pool().close().await,
        Backend::Sqlite(store) => store.pool().close().await,
        Backend::Tiered(store) => store.database().pool().close().await,
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
