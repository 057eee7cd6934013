//! The guard's integration tests, in one binary: the store conformance
//! suite and the SPEC table, each run against every store on a real server
//! (PostgreSQL, Redis and Redis Cluster as `idempotency_tests::fixtures`
//! finds or starts them; SQLite in a temporary file).

// Test code: a failed unwrap is a failed test (clippy.toml allows it in
// `#[test]` functions; this extends that to the helpers beside them).
#![allow(clippy::unwrap_used)]

mod support;

#[macro_use]
mod batching;

#[macro_use]
mod admin_suite;

#[macro_use]
mod store_suite;
#[macro_use]
mod guard_suite;
#[macro_use]
mod engine_suite;
mod body_budget;
mod cancellation;
mod completion_outage;
mod completion_time;
mod cross_process;
#[macro_use]
mod encrypted;
mod metrics_probe;
mod migrations;
mod nats_reads;
mod nats_storm;
#[cfg(feature = "otel")]
mod otel;
mod postgres_failover;
mod postgres_faults;
mod redis_failover;
mod redis_faults;
mod redis_upgrade;
mod slow_store;
#[macro_use]
mod completer;
#[macro_use]
mod steps;
mod transactional;
mod transactional_steps;

store_suite!(postgres_store, idempotency_tests::postgres);
store_suite!(sqlite_store, idempotency_tests::sqlite);
// `SqliteStore::memory()`, the store for users' tests: one connection to a
// private in-memory database.
store_suite!(memory_store, idempotency_tests::sqlite_memory);
store_suite!(redis_store, idempotency_tests::redis);
store_suite!(redis_cluster_store, idempotency_tests::redis_cluster);
store_suite!(tiered_store, idempotency_tests::tiered);
// Valkey 8.1: the same store, whose completions take the native fence
// (`SET … IFEQ`) instead of the script.
store_suite!(valkey_store, idempotency_tests::valkey);
// Every claim, take-over and completion waits for one replica (`WAIT`).
store_suite!(
    redis_replica_acks_store,
    idempotency_tests::redis_replica_acks
);
// NATS JetStream KV (a private NATS 2.15, a bucket per test).
store_suite!(nats_store, idempotency_tests::nats);

batching_suite!(postgres_batching, idempotency_tests::postgres);
batching_suite!(sqlite_batching, idempotency_tests::sqlite);
batching_suite!(memory_batching, idempotency_tests::sqlite_memory);
batching_suite!(redis_batching, idempotency_tests::redis);
batching_suite!(valkey_batching, idempotency_tests::valkey);
batching_suite!(
    redis_replica_acks_batching,
    idempotency_tests::redis_replica_acks
);

engine_suite!(postgres_engine, idempotency_tests::postgres);
engine_suite!(sqlite_engine, idempotency_tests::sqlite);
engine_suite!(memory_engine, idempotency_tests::sqlite_memory);
engine_suite!(redis_engine, idempotency_tests::redis);
engine_suite!(redis_cluster_engine, idempotency_tests::redis_cluster);
engine_suite!(tiered_engine, idempotency_tests::tiered);
engine_suite!(valkey_engine, idempotency_tests::valkey);
engine_suite!(
    redis_replica_acks_engine,
    idempotency_tests::redis_replica_acks
);
engine_suite!(nats_engine, idempotency_tests::nats);

// Steps and resume (SPEC §12): every store keeps steps.
steps_suite!(sqlite_steps, idempotency_tests::sqlite);
steps_suite!(memory_steps, idempotency_tests::sqlite_memory);
steps_suite!(postgres_steps, idempotency_tests::postgres);
steps_suite!(redis_steps, idempotency_tests::redis);
steps_suite!(redis_cluster_steps, idempotency_tests::redis_cluster);
steps_suite!(valkey_steps, idempotency_tests::valkey);
steps_suite!(tiered_steps, idempotency_tests::tiered);
steps_suite!(nats_steps, idempotency_tests::nats);

// The completer (SPEC §12): the stores that keep stored requests.
completer_suite!(sqlite_completer, idempotency_tests::sqlite);
completer_suite!(postgres_completer, idempotency_tests::postgres);
completer_suite!(redis_completer, idempotency_tests::redis);
completer_suite!(valkey_completer, idempotency_tests::valkey);
completer_suite!(tiered_completer, idempotency_tests::tiered);
completer_suite!(nats_completer, idempotency_tests::nats);

guard_suite!(postgres_guard, idempotency_tests::postgres);
guard_suite!(sqlite_guard, idempotency_tests::sqlite);
guard_suite!(memory_guard, idempotency_tests::sqlite_memory);
guard_suite!(redis_guard, idempotency_tests::redis);
guard_suite!(tiered_guard, idempotency_tests::tiered);
guard_suite!(valkey_guard, idempotency_tests::valkey);
// A cluster client learns node addresses from the cluster, so no partition
// sits in its path to cut: the outage tests run on single Redis, which
// shares every line of the store's error handling with the cluster.
guard_suite!(redis_cluster_guard, idempotency_tests::redis_cluster, outages: []);
guard_suite!(nats_guard, idempotency_tests::nats);

admin_suite!(postgres_admin, idempotency_tests::postgres);
admin_suite!(sqlite_admin, idempotency_tests::sqlite);
admin_suite!(memory_admin, idempotency_tests::sqlite_memory);
admin_suite!(redis_admin, idempotency_tests::redis);
admin_suite!(redis_cluster_admin, idempotency_tests::redis_cluster);
admin_suite!(tiered_admin, idempotency_tests::tiered);
admin_suite!(valkey_admin, idempotency_tests::valkey);
admin_suite!(nats_admin, idempotency_tests::nats);

encrypted_suite!(
    postgres_encrypted,
    idempotency_tests::postgres,
    crate::encrypted::raw_postgres
);
encrypted_suite!(
    sqlite_encrypted,
    idempotency_tests::sqlite,
    crate::encrypted::raw_sqlite
);
encrypted_suite!(
    redis_encrypted,
    idempotency_tests::redis,
    crate::encrypted::raw_redis
);
encrypted_suite!(
    nats_encrypted,
    idempotency_tests::nats,
    crate::nats_reads::raw_nats
);
