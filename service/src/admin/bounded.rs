//! The admin API's one bounded store call: every store operation an
//! admin handler awaits goes through [`store_call`], so a slow or failing
//! store answers 503 `store-unavailable`, never a hung request.

use super::problem::AdminProblem;

/// Awaits one store operation, at most 10 seconds: a failure or a
/// timeout is logged and answers 503 `store-unavailable`.
pub(super) async fn store_call<T>(
    future: impl Future<Output = Result<T, idempotency_guard::StoreError>>,
) -> Result<T, AdminProblem> {
    match tokio::time::timeout(std::time::Duration::from_secs(10), future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            tracing::warn!(error = %error, "admin store operation failed");
            Err(AdminProblem::StoreUnavailable)
        }
        Err(_) => {
            tracing::warn!("admin store operation timed out");
            Err(AdminProblem::StoreUnavailable)
        }
    }
}
