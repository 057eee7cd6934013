//! Test support shared by every crate's integration tests, and the
//! end-to-end tests that span crates and real servers (`tests/e2e/`).
//!
//! Tests talk to real servers: PostgreSQL, Redis and a Redis Cluster
//! (named by `TEST_POSTGRES_URL`, `TEST_REDIS_URL` and
//! `TEST_REDIS_CLUSTER_URLS`; else the shared ones on their default ports
//! when they answer; else private ones the test process starts for itself
//! and tears down when it exits, see [`fixtures`]), SQLite in temporary
//! files. A test whose server cannot be had fails and says what to install
//! or start.

pub mod answer;
pub mod broker_server;
pub mod console_browser;
pub mod fixtures;
pub mod mcp_sdk;
pub mod names;
pub mod nats_server;
pub mod partition;
pub mod postgres_replication;
pub mod postgres_server;
pub mod process;
pub mod programs;
pub mod proxy;
pub mod psp;
pub mod raw_http;
pub mod redis_server;
pub mod replication;
#[cfg(feature = "storm")]
pub mod storm;
mod watchdog;

pub use answer::{Answer, call};
pub use fixtures::{
    TestDatabase, TestDb, nats, postgres, postgres_database, redis, redis_cluster,
    redis_replica_acks, sqlite, sqlite_memory, tiered, valkey,
};
pub use nats_server::{ClusterOptions, NatsCluster};
pub use partition::Partition;
pub use postgres_replication::{Commit, ReplicatedPostgres};
pub use postgres_server::PostgresServer;
pub use process::Process;
pub use proxy::{Faults, FaultyProxy, ProxyCounts};
pub use psp::{Charge, FakePsp};
pub use redis_server::RedisServer;
pub use replication::{RedisNode, ReplicatedCluster, ReplicatedRedis};
