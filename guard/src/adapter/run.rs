//! The run's handle, handed to the code an adapter calls: every adapter
//! that calls an inner service with an HTTP request (the axum layer, the
//! gRPC layer, the JSON-RPC layer) puts the run's [`Run`] into that
//! request's extensions with [`hand_run`], where the handler reads it (an
//! axum handler extracts `run: Run`; a tonic handler reads
//! `request.extensions().get::<Run>()`). A step that did not return is
//! answered by each adapter with the problem type [`step_problem`] names,
//! marked "outcome unknown" in the adapter's own way, so the key is left
//! abandoned with its steps and a retry under
//! [`AbandonedPolicy::Resume`](crate::AbandonedPolicy::Resume) resumes it.

use crate::engine::{Run, RunContext, StepError};
use crate::problem::{ProblemType, types};
use crate::store::StoreError;

/// Puts `context`'s run handle into `extensions` (a clone shares the run).
pub fn hand_run(extensions: &mut http::Extensions, context: &RunContext) {
    extensions.insert::<Run>(context.run().clone());
}

/// The problem type of a step that did not return, the same in every
/// adapter:
///
/// | error | problem |
/// |---|---|
/// | [`StepError::Mismatch`], [`StepError::Decode`] | 500 `step-mismatch` |
/// | [`StepError::Record`] with a lost lease | 409 `outcome-unknown` |
/// | [`StepError::Record`] otherwise | 503 `store-unavailable` |
/// | [`StepError::Encode`], [`StepError::Overlapping`], [`StepError::Unsupported`] | 500 `handler-failed` |
pub fn step_problem(error: &StepError) -> ProblemType {
    match error {
        StepError::Mismatch { .. } | StepError::Decode { .. } => types::STEP_MISMATCH,
        StepError::Record {
            source: StoreError::LeaseLost,
            ..
        } => types::OUTCOME_UNKNOWN,
        StepError::Record { .. } => types::STORE_UNAVAILABLE,
        StepError::Encode { .. } | StepError::Overlapping { .. } | StepError::Unsupported(_) => {
            types::HANDLER_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_error_has_its_problem() {
        let mismatch = StepError::Mismatch {
            index: 0,
            recorded: "a".into(),
            asked: "b".into(),
        };
        assert_eq!(step_problem(&mismatch).name, "step-mismatch");
        let lost = StepError::Record {
            name: "a".into(),
            source: StoreError::LeaseLost,
        };
        assert_eq!(step_problem(&lost).name, "outcome-unknown");
        let overlapping = StepError::Overlapping { name: "a".into() };
        assert_eq!(step_problem(&overlapping).name, "handler-failed");
    }
}
