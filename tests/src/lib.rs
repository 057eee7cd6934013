//! Test support shared by every crate's integration tests, and the
//! end-to-end tests that span crates and real servers (`tests/e2e/`).
//!
//! Tests talk to real servers: PostgreSQL at `TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), SQLite in temporary files.
//! A test whose server is missing fails and says what to start.

pub mod answer;
pub mod fixtures;
pub mod partition;
pub mod postgres_server;
pub mod process;
pub mod proxy;
pub mod raw_http;
pub mod redis_server;
pub mod storm;

pub use answer::{Answer, call};
pub use fixtures::{
    TestDatabase, TestDb, postgres, postgres_database, redis, redis_cluster, sqlite, tiered,
};
pub use partition::Partition;
pub use postgres_server::PostgresServer;
pub use process::Process;
pub use proxy::{Faults, FaultyProxy, ProxyCounts};
pub use redis_server::RedisServer;
