//! The guard's integration tests, in one binary: the store conformance
//! suite and the SPEC table, each run against every store on a real server
//! (PostgreSQL at `TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`;
//! SQLite in a temporary file).

// Test code: a failed unwrap is a failed test (clippy.toml allows it in
// `#[test]` functions; this extends that to the helpers beside them).
#![allow(clippy::unwrap_used)]

mod support;

#[macro_use]
mod store_suite;
#[macro_use]
mod guard_suite;
mod transactional;

store_suite!(postgres_store, idempotency_tests::postgres);
store_suite!(sqlite_store, idempotency_tests::sqlite);

guard_suite!(postgres_guard, idempotency_tests::postgres);
guard_suite!(sqlite_guard, idempotency_tests::sqlite);
