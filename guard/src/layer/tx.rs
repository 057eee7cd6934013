//! Transactional mode, the axum half: the [`Tx`] extractor (the run's
//! transaction, from the request's extensions) and the problem+json answer
//! of a [`TxRejection`]. The engine's half is `engine/transaction/`.

use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::engine::transaction::{TransactionSlot, Tx, TxRejection};

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        // The refusal's problem type (the one mapping, shared with gRPC);
        // the detail is this error's own account.
        let kind = self.refusal(None, Duration::from_secs(1)).problem_type();
        tracing::error!(error = %self, "transactional mode: no transaction for the handler");
        kind.problem(self.to_string()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tx {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let slot = parts
            .extensions
            .get::<TransactionSlot>()
            .ok_or(TxRejection::NotTransactional)?;
        slot.tx().await
    }
}
