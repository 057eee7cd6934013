//! The benchmark's own resources: a PostgreSQL database created for the run
//! and dropped after it, SQLite files in a temporary directory, Redis keys
//! under a prefix of the run (deleted after each measurement), NATS KV
//! buckets named after that prefix (deleted likewise), and the child
//! processes that serve the apps under test.

use std::net::SocketAddr;
use std::process::Stdio;
use std::str::FromStr as _;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::AsyncBufReadExt as _;

use crate::cli::{App, StoreName};

/// A PostgreSQL database of the run's own.
pub(crate) struct BenchDatabase {
    admin_url: String,
    name: String,
    /// The database's URL.
    pub(crate) url: String,
    /// A small pool on it, for truncating and seeding.
    pub(crate) pool: sqlx::PgPool,
}

impl BenchDatabase {
    /// Creates the database `name` through `admin_url` and migrates it.
    pub(crate) async fn create(admin_url: &str, name: &str) -> anyhow::Result<Self> {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(admin_url)
            .await
            .with_context(|| format!("PostgreSQL at {admin_url}"))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("create database \"{name}\"")))
            .execute(&admin)
            .await?;
        admin.close().await;
        let options = PgConnectOptions::from_str(admin_url)?.database(name);
        let url = format!(
            "postgres://{}@{}:{}/{name}",
            options.get_username(),
            options.get_host(),
            options.get_port()
        );
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        let store = idempotency_guard::store::postgres::PostgresStore::new(pool.clone());
        store.migrate().await?;
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name: name.to_owned(),
            url,
            pool,
        })
    }

    /// Empties the records table, then fills it with 10,000 completed
    /// records of another scope and `ANALYZE`s it: a server's statements
    /// are planned against a table of a steady state's size and statistics,
    /// as in production (24 h of records, analyzed by autovacuum). On an
    /// empty, never-analyzed table, PostgreSQL caches generic plans of the
    /// guard's batch statements that scan the whole table (a hash join),
    /// and keeps them until autovacuum's next `ANALYZE`, a minute or more
    /// later: longer than a run (measured: 578 tuples read per request
    /// instead of 1).
    pub(crate) async fn truncate(&self) -> anyhow::Result<()> {
        sqlx::query("truncate idempotency_records")
            .execute(&self.pool)
            .await?;
        sqlx::query(
            "insert into idempotency_records
                (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
                 transactional, response_status, response_headers, response_body, created_at,
                 completed_at, expires_at)
             select 'bench-seed', 'seed-' || n, sha256(n::text::bytea), 'POST', '/orders',
                    'completed', gen_random_uuid(), now(), false, 201, ''::bytea,
                    '{}'::bytea, now(), now(), now() + interval '1 day'
             from generate_series(1, 10000) as n",
        )
        .execute(&self.pool)
        .await?;
        sqlx::query("analyze idempotency_records")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Drops the database.
    pub(crate) async fn drop_database(self) -> anyhow::Result<()> {
        self.pool.close().await;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.admin_url)
            .await?;
        let sql = format!("drop database if exists \"{}\" with (force)", self.name);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
        admin.close().await;
        Ok(())
    }
}

/// Deletes every key matching `pattern` on each of `nodes` (one Redis, or
/// a cluster's masters), one key per command (no cross-slot commands).
pub(crate) async fn delete_redis_keys(nodes: &[String], pattern: &str) -> anyhow::Result<u64> {
    let mut deleted = 0;
    for node in nodes {
        let client = redis::Client::open(node.as_str())?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await?;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.cmd("UNLINK").arg(key).ignore();
                }
                pipe.query_async::<()>(&mut connection).await?;
                deleted += keys.len() as u64;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(deleted)
}

/// Deletes every NATS KV bucket whose name `matches` (the stream
/// `KV_<bucket>` of each) on the NATS at `url`; returns how many.
pub(crate) async fn delete_nats_buckets(
    url: &str,
    matches: impl Fn(&str) -> bool,
) -> anyhow::Result<usize> {
    use futures_util::TryStreamExt as _;
    let servers: Vec<&str> = url.split(',').map(str::trim).collect();
    let client = async_nats::connect(servers.as_slice())
        .await
        .with_context(|| format!("NATS at {url}"))?;
    let jetstream = async_nats::jetstream::new(client);
    let streams: Vec<String> = jetstream.stream_names().try_collect().await?;
    let mut deleted = 0;
    for stream in streams
        .iter()
        .filter(|name| name.strip_prefix("KV_").is_some_and(&matches))
    {
        jetstream.delete_stream(stream).await?;
        deleted += 1;
    }
    Ok(deleted)
}

/// A server under test, running as a child process.
pub(crate) struct Child {
    process: tokio::process::Child,
    /// Where it listens.
    pub(crate) address: SocketAddr,
}

/// What a child needs to know about the stores.
pub(crate) struct ChildConfig<'a> {
    pub(crate) app: App,
    pub(crate) store: Option<StoreName>,
    pub(crate) database_url: &'a str,
    pub(crate) redis_url: &'a str,
    pub(crate) redis_cluster_urls: &'a [String],
    pub(crate) nats_url: &'a str,
    pub(crate) nats_replicas: Option<usize>,
    /// The Redis key prefix, and the NATS store's bucket.
    pub(crate) prefix: &'a str,
    pub(crate) pool_size: u32,
    /// Serve the guard's metrics at `/metrics` (guard apps).
    pub(crate) metrics: bool,
    /// The binary of the peer 2.0.0 (`--app peer2`).
    pub(crate) peer2_bin: Option<&'a std::path::Path>,
}

impl Child {
    /// Starts this binary as `serve` and waits for its address.
    pub(crate) async fn start(config: &ChildConfig<'_>) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("serve")
            .arg("--app")
            .arg(
                clap::ValueEnum::to_possible_value(&config.app)
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default(),
            )
            .arg("--database-url")
            .arg(config.database_url)
            .arg("--redis-url")
            .arg(config.redis_url)
            .arg("--nats-url")
            .arg(config.nats_url)
            .arg("--prefix")
            .arg(config.prefix)
            .arg("--pool-size")
            .arg(config.pool_size.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if !config.redis_cluster_urls.is_empty() {
            command
                .arg("--redis-cluster-urls")
                .arg(config.redis_cluster_urls.join(","));
        }
        if let Some(replicas) = config.nats_replicas {
            command.arg("--nats-replicas").arg(replicas.to_string());
        }
        if let Some(store) = config.store {
            command.arg("--store").arg(store.as_str());
        }
        if config.metrics
            && matches!(
                config.app,
                App::Guard
                    | App::GuardCached
                    | App::GuardTx
                    | App::GuardSingleCommit
                    | App::GuardReplicaAcks
            )
        {
            command.arg("--metrics");
        }
        if let Some(bin) = config.peer2_bin {
            command.arg("--peer2-bin").arg(bin);
        }
        let mut process = command.spawn().context("start the server under test")?;
        let stdout = process.stdout.take().context("the child's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the server under test did not start within 60 s")??
            .context("the server under test exited before listening")?;
        let address = line
            .strip_prefix("listening ")
            .context("unexpected first line from the server under test")?
            .parse()?;
        Ok(Self { process, address })
    }

    /// The child's peak resident set size (`VmHWM`), in KiB.
    pub(crate) fn peak_rss_kib(&self) -> Option<u64> {
        let pid = self.process.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The CPU time the child's threads have used so far, in nanoseconds
    /// (the sum of `/proc/<pid>/task/*/schedstat`).
    pub(crate) fn cpu_nanos(&self) -> Option<u64> {
        let pid = self.process.id()?;
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let mut total = 0;
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        Some(total)
    }

    /// Stops the child.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.process.start_kill()?;
        self.process.wait().await?;
        Ok(())
    }
}
