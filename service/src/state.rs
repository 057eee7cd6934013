//! What the handlers share: [`AppState`], the body limit and the timed
//! store read that turns a failure into 503 `store-unavailable`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use idempotency_guard::store::AnyStore;

use crate::admin::{AdminState, AdminTokens, ConsoleSessions, Reconciled};
use crate::problem::ApiProblem;
use crate::tokens::Tokens;

/// The largest request body accepted (a lookup of 1000 keys of 255
/// characters, JSON-escaped, fits).
pub(crate) const BODY_LIMIT: usize = 1024 * 1024;

/// How long one store read may take before the answer is 503.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Where the records are.
    pub store: AnyStore,
    /// The bearer tokens and their scopes.
    pub tokens: Arc<Tokens>,
    /// Renders `/metrics`; `None` shows an empty page (tests install no recorder).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The `retry_after_seconds` hint for in-flight keys.
    pub retry_after: Duration,
    /// The admin tokens; none: the admin API refuses every request.
    pub admin_tokens: Arc<AdminTokens>,
    /// The records operators marked reconciled.
    pub reconciled: Arc<Reconciled>,
    /// Whether `/console` is served (`CONSOLE`).
    pub console: bool,
    /// The console's sign-in sessions (used only while `console` is on;
    /// kept in memory: a restart signs every operator out).
    pub console_sessions: Arc<ConsoleSessions>,
}

/// The admin API's part of the state: the same store, the admin tokens.
impl FromRef<AppState> for AdminState {
    fn from_ref(state: &AppState) -> Self {
        Self {
            store: state.store.clone(),
            tokens: state.admin_tokens.clone(),
            reconciled: state.reconciled.clone(),
            sessions: state.console.then(|| state.console_sessions.clone()),
        }
    }
}

/// Awaits one store read, at most [`STORE_TIMEOUT`]: a failure or a
/// timeout is logged and answers 503 `store-unavailable`.
pub(crate) async fn read<T>(
    future: impl std::future::Future<Output = Result<T, idempotency_guard::StoreError>>,
) -> Result<T, ApiProblem> {
    match tokio::time::timeout(STORE_TIMEOUT, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "store read failed");
            Err(ApiProblem::StoreUnavailable)
        }
        Err(_) => {
            tracing::warn!("store read timed out");
            Err(ApiProblem::StoreUnavailable)
        }
    }
}
