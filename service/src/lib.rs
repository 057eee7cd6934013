//! The key-status service: a client that timed out, got a 502/504 or lost
//! its connection asks here whether its idempotency key already ran, before
//! it retries.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v1/keys/{key}` (`?fingerprint=sha256:...`) | 200 with the key's state and advice (`wait`, `replay`, `reconcile`), or 404 `key-not-found` with `advice: retry` |
//! | `POST /v1/keys/lookup` `{"keys": [...]}` | 200 with one result per key (1 to 1000), in order |
//! | `GET /v1/admin/keys`, `GET /v1/admin/keys.csv`, `GET /v1/admin/whoami`, `GET`/`DELETE /v1/admin/keys/{scope}/{key}`, `POST /v1/admin/keys/{scope}/{key}/release`, `POST /v1/admin/keys/{scope}/{key}/reconcile`, `GET /v1/admin/keys/{scope}/{key}/decisions` | the admin API, for admin tokens only ([`AdminTokens`]; its actions are logged on [`AUDIT_TARGET`], its decisions, which need a reason, also kept with the store) |
//! | `GET /console` | the operators' console, when `CONSOLE=true` (`POST`/`DELETE /v1/admin/session` sign in and out: the admin token exchanged for a session cookie) |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers, 503 otherwise |
//! | `GET /metrics` | Prometheus text |
//! | `GET /openapi.json` | the OpenAPI 3.1 document ([`ApiDoc`]) |
//!
//! `/v1` needs `Authorization: Bearer <token>`; each token maps to one scope
//! (401 `unauthorized` otherwise). A key of another scope answers exactly
//! like an absent one.
//!
//! # Embedding
//!
//! The binary runs [`serve()`] (or [`migrate()`]) with the [`Config`] its
//! [`Cli`] read. To serve the routes from your own server, build an
//! [`AppState`] (the store, the scope [`Tokens`], the [`AdminTokens`],
//! the [`Reconciled`] marks, the [`ConsoleSessions`]) and take
//! [`build_router`]. [`key_status`] is
//! the service's answer about one record, for a program that reads the
//! store itself.
//!
//! # Files
//!
//! The modules are private; the items above are re-exported here. Each
//! file imports only those above it in this list, never one below
//! (`scripts/check-module-cycles` holds the crate to it):
//!
//! | file | holds |
//! |---|---|
//! | `tokens` | the one tokens-file parser and the scope tokens |
//! | `problem`, `status`, `config` | the service's problems, a record's status and advice, the settings |
//! | `admin` | the admin API, self-contained over its state: its tokens, problems, audit log and trail, reconciled marks, extractors and handlers |
//! | `console` | the operators' console: its page, script and stylesheet, embedded, and their headers |
//! | `state` | [`AppState`] and what the handlers share (the body limit, the timed store read) |
//! | `keys`, `ops` | the key-status endpoints; health, readiness and metrics |
//! | `openapi` | the OpenAPI document (from the handlers above) and `/openapi.json` |
//! | `router` | [`build_router`]: every route and the layers around them |
//! | `serve` | [`serve()`] and [`migrate()`] |

mod admin;
mod config;
mod console;
mod keys;
mod openapi;
mod ops;
mod problem;
mod router;
mod serve;
mod state;
mod status;
mod tokens;

pub use admin::{
    AUDIT_TARGET, AdminTokens, AdminTokensError, ConsoleSessions, Reconciled, ReconciledError,
    SessionSettings,
};
pub use config::{Cli, Command, Config, ConfigError};
pub use openapi::ApiDoc;
pub use router::build_router;
pub use serve::{ServiceError, migrate, serve};
pub use state::AppState;
pub use status::key_status;
pub use tokens::{MIN_TOKEN_LEN, Tokens, TokensError};
