//! Test support shared by every crate's integration tests, and the
//! end-to-end tests that span crates and real servers (`tests/e2e/`).
//!
//! Tests talk to real servers: PostgreSQL at `TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), SQLite in temporary files.
//! A test whose server is missing fails and says what to start.

pub mod answer;
pub mod fixtures;
pub mod process;
pub mod proxy;

pub use answer::{Answer, call};
pub use fixtures::{Breakable, TestDatabase, TestDb, postgres, postgres_database, sqlite};
pub use process::Process;
pub use proxy::{Faults, FaultyProxy, ProxyCounts};
