//! Signing in to the console and out of it: `POST /v1/admin/session`
//! exchanges the admin token for a session cookie, `DELETE
//! /v1/admin/session` ends the session on the server (see `session`).
//! Routed only when the console is on.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::AdminState;
use super::audit::audit;
use super::dto::AdminIdentity;
use super::problem::AdminProblem;
use super::record::identity;
use super::session::{ConsoleSessions, Credential, session_id};
use super::tokens::Admin;

/// The sessions, which exist only while the console is on.
fn sessions(state: &AdminState) -> Result<&ConsoleSessions, AdminProblem> {
    state.sessions.as_deref().ok_or(AdminProblem::Unauthorized)
}

/// Signs in to the console: the admin token (as a bearer token, sent
/// once) is exchanged for a short-lived session, whose id comes back in
/// an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over TLS) that the
/// admin API accepts instead of the token. A session ends when signed
/// out, after `CONSOLE_SESSION_IDLE_SECS` unused or
/// `CONSOLE_SESSION_MAX_SECS` after sign-in, and when the service
/// restarts. Served when `CONSOLE=true`.
#[utoipa::path(
    post,
    path = "/v1/admin/session",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Signed in: who, and the session cookie", body = AdminIdentity,
            headers(("set-cookie" = String, description = "`idempotency-console=<id>; Path=/v1/admin; HttpOnly; SameSite=Strict` (and `Secure` over TLS)"))),
        (status = 401, description = "No admin token (a scope token or a session is not one)", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn sign_in(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    Extension(credential): Extension<Credential>,
    headers: HeaderMap,
) -> Result<Response, AdminProblem> {
    let sessions = sessions(&state)?;
    if credential != Credential::Token {
        audit(&admin, "sign-in", "-", "-", "-", "unauthorized");
        return Err(AdminProblem::Unauthorized);
    }
    if let Some(old) = session_id(&headers) {
        sessions.end(old);
    }
    let id = sessions.start(admin.clone(), Instant::now());
    audit(&admin, "sign-in", "-", "-", "-", "ok");
    let mut response = Json(identity(&admin)).into_response();
    let answer = response.headers_mut();
    answer.insert(header::SET_COOKIE, sessions.cookie(&id, &headers));
    answer.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// Signs out of the console: the session ends on the server (its cookie
/// is refused from then on, 401) and the browser is told to drop it.
/// Signed in by a session, the request needs the console's `Origin`.
#[utoipa::path(
    delete,
    path = "/v1/admin/session",
    tag = "admin",
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Signed out: the session ended",
            headers(("set-cookie" = String, description = "The session cookie, emptied (`Max-Age=0`)"))),
        (status = 401, description = "No admin token or live session", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Signed in by a session, without the console's `Origin`", body = crate::problem::Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn sign_out(
    State(state): State<AdminState>,
    Extension(admin): Extension<Admin>,
    Extension(credential): Extension<Credential>,
    headers: HeaderMap,
) -> Result<Response, AdminProblem> {
    let sessions = sessions(&state)?;
    if let Credential::Session(id) = &credential {
        sessions.end(id);
    }
    audit(&admin, "sign-out", "-", "-", "-", "ok");
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sessions.removal(&headers));
    Ok(response)
}
