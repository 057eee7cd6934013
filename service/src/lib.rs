//! The key-status service: a client that timed out, got a 502/504 or lost
//! its connection asks here whether its idempotency key already ran, before
//! it retries.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v1/keys/{key}` (`?fingerprint=sha256:...`) | 200 with the key's state and advice (`wait`, `replay`, `reconcile`), or 404 `key-not-found` with `advice: retry` |
//! | `POST /v1/keys/lookup` `{"keys": [...]}` | 200 with one result per key (1 to 1000), in order |
//! | `GET /v1/admin/keys`, `DELETE /v1/admin/keys/{scope}/{key}`, `POST /v1/admin/keys/{scope}/{key}/release` | the admin API, for admin tokens only (see [`admin`]) |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers, 503 otherwise |
//! | `GET /metrics` | Prometheus text |
//! | `GET /openapi.json` | the OpenAPI 3.1 document |
//!
//! `/v1` needs `Authorization: Bearer <token>`; each token maps to one scope
//! (401 `unauthorized` otherwise). A key of another scope answers exactly
//! like an absent one.

pub mod admin;
pub mod auth;
pub mod config;
pub mod openapi;
pub mod problem;
pub mod routes;
pub mod serve;
pub mod status;
pub mod tokens;

pub use config::{Cli, Command, Config};
pub use routes::{AppState, build_router};
pub use serve::{ServiceError, migrate, serve};
