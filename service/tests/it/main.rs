//! The key-status service's integration tests: every endpoint on every
//! store, the OpenAPI document, and one run over a real socket.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

#[macro_use]
mod admin_api;
#[macro_use]
mod api_suite;
mod console;
mod hostile_clients;
mod openapi;
#[macro_use]
mod resuming;
mod single_commit;
mod socket;
mod startup;

api_suite!(postgres_api, idempotency_tests::postgres);
api_suite!(sqlite_api, idempotency_tests::sqlite);
api_suite!(redis_api, idempotency_tests::redis);
api_suite!(tiered_api, idempotency_tests::tiered);
api_suite!(nats_api, idempotency_tests::nats);

// A key the completer will finish: the stores that keep steps and requests.
resuming_suite!(sqlite_resuming, idempotency_tests::sqlite);
resuming_suite!(postgres_resuming, idempotency_tests::postgres);
resuming_suite!(redis_resuming, idempotency_tests::redis);
resuming_suite!(nats_resuming, idempotency_tests::nats);

admin_api!(postgres_admin, idempotency_tests::postgres);
admin_api!(sqlite_admin, idempotency_tests::sqlite);
admin_api!(redis_admin, idempotency_tests::redis);
admin_api!(redis_cluster_admin, idempotency_tests::redis_cluster);
admin_api!(tiered_admin, idempotency_tests::tiered);
// NATS: the whole admin suite, the audit trail's tests included.
admin_api!(nats_admin, idempotency_tests::nats);
