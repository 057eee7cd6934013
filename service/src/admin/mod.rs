//! The admin API: what an operator may do to one key, without SQL or
//! `redis-cli`.
//!
//! | endpoint | does |
//! |---|---|
//! | `GET /v1/admin/keys?scope=&state=&after=&limit=` | lists a scope's records (`state`: `any`, `in_flight`, `completed`, `abandoned`), by key, a page at a time (`next` is the `after` of the next page) |
//! | `DELETE /v1/admin/keys/{scope}/{key}` | forgets a completed record: its replay is gone, the next request with the key runs |
//! | `DELETE /v1/admin/keys/{scope}/{key}?force=true` | forgets a completed **or abandoned** record |
//! | `POST /v1/admin/keys/{scope}/{key}/release` | frees an abandoned key, so a retry runs (after you reconciled its unknown outcome) |
//! | `POST /v1/admin/keys/{scope}/{key}/give-up` | stops completers from finishing a key that will complete (its kept request marked given up): it stays abandoned, for a decision |
//! | `GET /v1/admin/keys/{scope}/{key}` | one record: its life, its request, a redacted preview of its stored response (sealed ones show their status only) |
//! | `POST /v1/admin/keys/{scope}/{key}/reconcile?reason=` | marks an abandoned record reconciled: kept, no longer listed as needing a decision |
//! | `GET /v1/admin/keys/{scope}/{key}/decisions` | the key's audit trail: every decision taken on it (who, when, why, result), kept after the record is gone |
//! | `GET /v1/admin/keys.csv?scope=&needs_decision=true` | the records that need a decision (or any listing's filters) as CSV, for finance |
//! | `GET /v1/admin/whoami` | the caller's admin token: its name and scopes |
//! | `POST /v1/admin/session`, `DELETE /v1/admin/session` | the console's sign-in (the token exchanged for a session cookie) and sign-out (when `CONSOLE=true`) |
//!
//! The listing and the export filter by `state`, `needs_decision`
//! (abandoned and not marked reconciled: the outcome-unknown runs, in
//! flight past their lease, a person must decide on), `method`,
//! `path_prefix`, `created_after` and `created_before`. The actions
//! (`release`, `forget`, `reconcile`, `give-up`: every call that changes something)
//! require `?reason=` (1 to 500 characters, no control characters;
//! otherwise 422 `reason-required` and nothing is done), written to the
//! audit line and the audit trail. The reconciled marks are kept by the
//! service, not the store: see `reconciled`.
//!
//! A record whose lease is live (its handler is running) is never deleted,
//! with or without `force` (409 `request-in-flight`): deleting it would let
//! a retry run beside the handler. Once its lease lapses the record is
//! abandoned, and `force=true` (or `release`) may remove it: its outcome is
//! unknown, so removing it is a decision an operator takes explicitly,
//! which is why a plain `DELETE` refuses it (409 `outcome-unknown`).
//!
//! # Admin tokens
//!
//! Admin tokens are separate from scope tokens (a scope token answers 401
//! here, an admin token 401 on `/v1/keys`): `ADMIN_TOKENS_FILE` (or
//! `--admin-tokens-file`) holds one `<name> <scopes> <token>` line per
//! token, `#` starting a comment; `ADMIN_TOKENS` the same triples separated
//! by `;`. `<scopes>` is a comma-separated list of the scopes the token may
//! act on, or `*` for all; a scope outside it answers 403
//! `scope-forbidden`. `<name>` names the holder in audit lines (the token
//! itself is never logged).
//!
//! # Audit
//!
//! Every admin action, allowed or refused, writes one `INFO` line on the
//! `idempotency::audit` target with `who` (the token's name), `action`
//! (`list`, `show`, `decisions`, `export`, `forget`, `release`,
//! `reconcile`, `give-up`, `sign-in`, `sign-out`), `scope`, `key` (`-` for a
//! listing, an export, a sign-in or a sign-out), `reason` (`-` for a
//! read), `result` and `at` (RFC 3339, UTC), and is counted in
//! `idempotency_admin_actions_total{action, result}`. A malformed call
//! (400, 422) is no action and writes none. A request refused before it
//! names an action (no token, an ended session, a foreign `Origin`) is
//! counted with `action="any"`.
//!
//! The decisions (`forget`, `release`, `reconcile`, `give-up`), allowed or refused
//! (403 included), are also kept with the store, in the audit trail
//! (`trail`): records of a reserved scope, `idempotency.audit:<scope>`,
//! written through the store's own operations, so the trail is kept on
//! every store the service runs on. A decision's entry is written before
//! its action runs (no entry, no action: 503), completed with its result
//! after, and kept 400 days or the decided record's own retention if
//! longer. No admin action changes a scope starting with
//! `idempotency.audit` (400).
//!
//! # Console sessions
//!
//! With the console on, every endpoint also accepts the console's session
//! cookie instead of a token (`session`): a bearer token, when sent, is
//! the one that counts. A session-authenticated write must come with the
//! console's `Origin` (403 `origin-refused`); an ended session answers
//! 401.
//!
//! # Files
//!
//! `tokens` (who may call: the admin tokens, read by the service's one
//! tokens-file parser), `problem` (the admin API's problems), `bounded`
//! (the bounded store call), `audit` (the audit line and counter of every
//! action), `trail` (the decisions kept with the store), `decision` (a
//! state-changing action: its entry, its work, its line), `reconciled` (the
//! operators' reconciled marks), `dto` (the JSON the endpoints answer),
//! `query` (the queries: one for a listing and an export, its `state` an
//! enum, its filters checked), `extract` (the extractors that parse the
//! path's scope and key and the queries, refusing with the admin
//! problem), `handlers` (the listing and the deleting actions, the
//! bounded store call and the scan), `export` (the CSV export), `record`
//! (one record shown, marked reconciled; whoami), `preview` (a stored
//! response, redacted), `session` (the console's sessions, their cookie
//! and `Origin` rule) and `sign_in` (the console's sign-in and
//! sign-out). The admin API is self-contained: it is built over an
//! [`AdminState`] (the store, the admin tokens, the marks and the
//! console's sessions), which the service's router takes from its own
//! state.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header;
use idempotency_guard::store::AnyStore;

mod audit;
mod bounded;
mod decision;
pub(crate) mod dto;
pub(crate) mod export;
mod extract;
pub(crate) mod handlers;
mod preview;
mod problem;
pub(crate) mod query;
pub(crate) mod reconciled;
pub(crate) mod record;
mod session;
pub(crate) mod sign_in;
mod tokens;
mod trail;

use audit::ADMIN_ACTIONS_TOTAL;
pub use audit::AUDIT_TARGET;
use export::export_keys;
use handlers::{forget_key, give_up_key, list_keys, release_key};
use problem::AdminProblem;
pub use reconciled::{Reconciled, ReconciledError};
use record::{key_decisions, reconcile_key, show_key, whoami};
pub use session::{ConsoleSessions, SessionSettings};
use session::{Credential, session_id};
use sign_in::{sign_in, sign_out};
pub use tokens::{AdminTokens, AdminTokensError};

/// What the admin handlers share: the store and who may call.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// Where the records are.
    pub store: AnyStore,
    /// The admin tokens; none: the admin API refuses every request.
    pub tokens: Arc<AdminTokens>,
    /// The records operators marked reconciled.
    pub reconciled: Arc<Reconciled>,
    /// The console's sessions; `None` while the console is off (then no
    /// cookie is accepted and the sign-in is not routed).
    pub sessions: Option<Arc<ConsoleSessions>>,
}

/// The admin routes, over `state` (the caller merges them into the
/// service's router).
pub(crate) fn router<S: Clone + Send + Sync + 'static>(state: AdminState) -> Router<S> {
    let console = if state.sessions.is_some() {
        Router::new().route("/v1/admin/session", post(sign_in).delete(sign_out))
    } else {
        Router::new()
    };
    console
        .route("/v1/admin/keys", get(list_keys))
        .route("/v1/admin/keys.csv", get(export_keys))
        .route("/v1/admin/whoami", get(whoami))
        .route(
            "/v1/admin/keys/{scope}/{key}",
            get(show_key).delete(forget_key),
        )
        .route("/v1/admin/keys/{scope}/{key}/release", post(release_key))
        .route("/v1/admin/keys/{scope}/{key}/give-up", post(give_up_key))
        .route(
            "/v1/admin/keys/{scope}/{key}/reconcile",
            post(reconcile_key),
        )
        .route("/v1/admin/keys/{scope}/{key}/decisions", get(key_decisions))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_admin_token,
        ))
        .with_state(state)
}

/// Refuses requests without a known admin token or live console session
/// (401), and session-authenticated writes without the console's
/// `Origin` (403); passes the admin and how it signed in on.
async fn require_admin_token(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let authorization = headers.get(header::AUTHORIZATION);
    let session = match (authorization, state.sessions.as_deref()) {
        (None, Some(sessions)) => session_id(headers).map(|id| (sessions, id)),
        _ => None,
    };
    let signed_in = if let Some((sessions, id)) = session {
        let authority = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()));
        if !sessions.origin_allows(request.method(), headers, authority) {
            return refused(AdminProblem::OriginRefused);
        }
        match sessions.admin_of(id, Instant::now()) {
            Some(admin) => (admin, Credential::Session(id.to_owned())),
            None => return refused(AdminProblem::SessionEnded),
        }
    } else {
        match state.tokens.authenticate(authorization) {
            Some(admin) => (admin, Credential::Token),
            None => return refused(AdminProblem::Unauthorized),
        }
    };
    let (admin, credential) = signed_in;
    request.extensions_mut().insert(admin);
    request.extensions_mut().insert(credential);
    next.run(request).await
}

/// Counts a request refused before any action, and answers `problem`.
fn refused(problem: AdminProblem) -> Response {
    metrics::counter!(ADMIN_ACTIONS_TOTAL, "action" => "any", "result" => problem.result())
        .increment(1);
    problem.into_response()
}
