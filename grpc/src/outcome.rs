//! Which answers of a guarded method are kept, as one pure table.
//!
//! | gRPC status of the handler's answer | kept? | why |
//! |---|---|---|
//! | `OK` | stored | the answer |
//! | `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `NOT_FOUND`, `PERMISSION_DENIED` | stored | a decision: a retry must get the same one |
//! | `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNKNOWN`, `CANCELLED`, `DEADLINE_EXCEEDED`, `DATA_LOSS` | released | "try again": a retry with the same key runs |
//! | `INVALID_ARGUMENT` (a failed decode or validation), `UNAUTHENTICATED`, `UNIMPLEMENTED` | released | refused before any work was done (Stripe's rule): the corrected request with the same key runs |
//! | any code but `UNAVAILABLE` the handler marked final ([`mark_final`]) | stored | the handler says this answer is its decision |
//! | `UNAVAILABLE` marked final | released | an outage is never a decision: gRPC clients retry it on their own (`retryPolicy`), and a stored one would answer every retry with the outage for the whole retention |
//! | no `grpc-status` at all (a broken answer) | released | not an answer |
//! | any status the handler marked outcome unknown ([`mark_outcome_unknown`], [`step_status`]) | abandoned | the handler lost track of its work (a step did not return): the key keeps its steps, and a retry resumes it under `AbandonedPolicy::Resume` (else `outcome-unknown`) |
//!
//! [`settle`] answers with the guard's engine's own [`Settle`] without
//! payload: the one name every adapter uses for "keep, release or abandon".
//!
//! A handler cut off by the guard's own bound (the engine's maximum handler
//! time) is not in this table: its record is abandoned and later calls get
//! `FAILED_PRECONDITION` with reason `outcome-unknown` (see
//! [`crate::refusal`]).

use std::collections::HashMap;

use idempotency_guard::engine::{Settle, StepError};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::refusal::DOMAIN;

/// The metadata entry with which a handler marks its status final (stored
/// whatever its code). The layer removes it from the answer before it is
/// sent or stored.
pub const FINAL_STATUS: &str = "idempotency-final";

/// The metadata entry with which a handler marks its status "outcome
/// unknown": nothing is stored and the key is left abandoned (with the
/// steps its run recorded). The layer removes it from the answer.
pub const OUTCOME_UNKNOWN_STATUS: &str = "idempotency-outcome-unknown";

/// The table of this module: what becomes of an answer with `code`
/// (`None` when the answer carried no valid `grpc-status`), `marked_final`
/// when the handler marked it final. Kept ([`Settle::Complete`]) or
/// released ([`Settle::Release`], the method's writes rolled back in
/// transactional mode); never abandoned: an answer that came is known.
pub fn settle(code: Option<Code>, marked_final: bool) -> Settle<(), ()> {
    let Some(code) = code else {
        return Settle::RELEASE;
    };
    // UNAVAILABLE is transient by definition (the one code gRPC says is
    // "most likely" fixed by retrying): never kept, marked or not.
    if marked_final && code != Code::Unavailable {
        return Settle::KEEP;
    }
    match code {
        Code::Ok
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::NotFound
        | Code::PermissionDenied => Settle::KEEP,
        Code::Unavailable
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Internal
        | Code::Unknown
        | Code::Cancelled
        | Code::DeadlineExceeded
        | Code::DataLoss
        | Code::InvalidArgument
        | Code::Unauthenticated
        | Code::Unimplemented => Settle::RELEASE,
    }
}

/// What becomes of a handler's answer.
#[deprecated(note = "use `outcome::settle`, which answers with the engine's `Settle`")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Stored: every later call with the key gets it replayed.
    Store,
    /// Released: the key is freed, so a retry runs the method again.
    Release,
}

/// [`settle`] in the old terms.
#[deprecated(note = "use `outcome::settle`, which answers with the engine's `Settle`")]
#[allow(deprecated)]
pub fn keep(code: Option<Code>, marked_final: bool) -> Keep {
    match settle(code, marked_final) {
        Settle::Complete { .. } => Keep::Store,
        Settle::Release { .. } | Settle::Abandon { .. } => Keep::Release,
    }
}

/// Marks `status` final: the guard stores it whatever its code, so a retry
/// with the same key gets it again instead of running the method again.
/// For a refusal the handler decided on after looking at the world (an
/// `INVALID_ARGUMENT` for an amount over the account's limit, say).
///
/// `UNAVAILABLE` is the exception: it is never stored, marked or not (the
/// key is released and a retry runs the method), and marking it logs a
/// warning. It says the server could not serve the call; clients retry it
/// by themselves, and a stored one would answer every retry with the
/// outage until the record's retention ends. Answer a decision with the
/// code that says so (`FAILED_PRECONDITION`, `ABORTED`, …).
///
/// ```
/// use tonic::{Code, Status};
///
/// let status = idempotency_grpc::mark_final(Status::invalid_argument("over the limit"));
/// assert_eq!(status.code(), Code::InvalidArgument);
/// assert!(status.metadata().get(idempotency_grpc::FINAL_STATUS).is_some());
/// ```
pub fn mark_final(mut status: Status) -> Status {
    if status.code() == Code::Unavailable {
        tracing::warn!(
            "UNAVAILABLE marked final: it is never stored (the key is released and a retry runs the method); answer a decision with another code"
        );
    }
    status.metadata_mut().insert(
        FINAL_STATUS,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    status
}

/// Marks `status` "outcome unknown": the layer stores nothing and leaves
/// the key abandoned, with the steps the run recorded. The caller gets
/// `status`; a retry with the key gets `FAILED_PRECONDITION`
/// `outcome-unknown`, or, when the engine resumes abandoned runs
/// (`with_abandoned(AbandonedPolicy::Resume)`), runs the method again with
/// the recorded steps. For a method that lost track of its work.
pub fn mark_outcome_unknown(mut status: Status) -> Status {
    status.metadata_mut().insert(
        OUTCOME_UNKNOWN_STATUS,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    status
}

/// The status of a step that did not return, marked outcome unknown
/// ([`mark_outcome_unknown`]): the key is left abandoned with its steps.
/// Its `ErrorInfo` reason is the adapter kit's problem for the error
/// ([`step_problem`](idempotency_guard::adapter::step_problem)):
/// `step-mismatch` and `handler-failed` are `INTERNAL`, `outcome-unknown`
/// (the run lost its lease) `FAILED_PRECONDITION`, `store-unavailable`
/// `UNAVAILABLE`.
///
/// ```
/// use idempotency_guard::engine::Run;
/// use tonic::{Request, Response, Status};
///
/// async fn charge(request: Request<()>) -> Result<Response<String>, Status> {
///     let run = request.extensions().get::<Run>().cloned()
///         .ok_or_else(|| Status::internal("not guarded"))?;
///     let charge = run
///         .step("charge", || async { String::from("ch_1") })
///         .await
///         .map_err(idempotency_grpc::step_status)?;
///     Ok(Response::new(charge))
/// }
/// ```
pub fn step_status(error: StepError) -> Status {
    let problem = idempotency_guard::adapter::step_problem(&error);
    let code = match problem.status.as_u16() {
        409 => Code::FailedPrecondition,
        503 => Code::Unavailable,
        _ => Code::Internal,
    };
    tracing::error!(error = %error, "a step did not return; the key is left abandoned");
    let details = ErrorDetails::with_error_info(problem.name, DOMAIN, HashMap::new());
    mark_outcome_unknown(Status::with_error_details(code, error.to_string(), details))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_table_as_a_truth_table() {
        let (keep, release) = (Settle::KEEP, Settle::RELEASE);
        // code, stored when not marked final
        let rows = [
            (Code::Ok, keep),
            (Code::AlreadyExists, keep),
            (Code::FailedPrecondition, keep),
            (Code::OutOfRange, keep),
            (Code::NotFound, keep),
            (Code::PermissionDenied, keep),
            (Code::Unavailable, release),
            (Code::ResourceExhausted, release),
            (Code::Aborted, release),
            (Code::Internal, release),
            (Code::Unknown, release),
            (Code::Cancelled, release),
            (Code::DeadlineExceeded, release),
            (Code::DataLoss, release),
            (Code::InvalidArgument, release),
            (Code::Unauthenticated, release),
            (Code::Unimplemented, release),
        ];
        // Every code is in the table once.
        assert_eq!(rows.len(), 17);
        for (code, expected) in rows {
            assert_eq!(settle(Some(code), false), expected, "{code:?}");
            let marked = if code == Code::Unavailable {
                release
            } else {
                keep
            };
            assert_eq!(settle(Some(code), true), marked, "{code:?} marked final");
        }
        assert_eq!(settle(None, false), release);
        assert_eq!(settle(None, true), release);
    }

    #[test]
    #[allow(deprecated)]
    fn the_deprecated_keep_says_what_settle_says() {
        for code in [
            Code::Ok,
            Code::NotFound,
            Code::Unavailable,
            Code::InvalidArgument,
        ] {
            for marked_final in [false, true] {
                let kept = settle(Some(code), marked_final) == Settle::KEEP;
                let expected = if kept { Keep::Store } else { Keep::Release };
                assert_eq!(keep(Some(code), marked_final), expected, "{code:?}");
            }
        }
        assert_eq!(keep(None, true), Keep::Release);
    }

    #[test]
    fn a_step_status_is_marked_outcome_unknown() {
        let status = step_status(StepError::Overlapping { name: "a".into() });
        assert_eq!(status.code(), Code::Internal);
        assert!(status.metadata().get(OUTCOME_UNKNOWN_STATUS).is_some());
        assert_eq!(
            status.get_details_error_info().map(|info| info.reason),
            Some(String::from("handler-failed"))
        );
    }

    #[test]
    fn a_marked_status_carries_the_marker() {
        let status = mark_final(Status::invalid_argument("no"));
        assert_eq!(
            status.metadata().get(FINAL_STATUS).map(|v| v.to_str().ok()),
            Some(Some("true"))
        );
    }
}
