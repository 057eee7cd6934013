//! Steps in an axum handler: the [`Run`] extractor (the run's handle, from
//! the request's extensions) and the problem+json answer of a
//! [`StepError`], which leaves the key abandoned. The engine's half is
//! `engine/steps.rs`.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use super::OutcomeUnknown;
use crate::engine::Refusal;
use crate::engine::{Run, StepError};

impl<S: Send + Sync> FromRequestParts<S> for Run {
    type Rejection = Refusal;

    /// The run's handle; refused (`layer-missing`) on a route the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) does not guard, or on
    /// a request it did not guard (no key where none is required).
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Run>()
            .cloned()
            .ok_or(Refusal::LayerMissing)
    }
}

/// The answer of a step that did not return: a problem+json marked
/// [`OutcomeUnknown`], so the key is left abandoned (earlier steps may have
/// had effects), nothing is stored, and a retry under
/// [`AbandonedPolicy::Resume`](crate::AbandonedPolicy::Resume) resumes it.
///
/// The problem is the adapter kit's
/// [`step_problem`](crate::adapter::step_problem), the same in every
/// adapter (`step-mismatch`, `outcome-unknown`, `store-unavailable` or
/// `handler-failed`).
impl IntoResponse for StepError {
    fn into_response(self) -> Response {
        let kind = crate::adapter::step_problem(&self);
        tracing::error!(error = %self, "a step did not return; the key is left abandoned");
        (OutcomeUnknown, kind.problem(self.to_string())).into_response()
    }
}
