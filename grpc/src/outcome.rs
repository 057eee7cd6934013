//! Which answers of a guarded method are kept, as one pure table.
//!
//! | gRPC status of the handler's answer | kept? | why |
//! |---|---|---|
//! | `OK` | stored | the answer |
//! | `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `NOT_FOUND`, `PERMISSION_DENIED` | stored | a decision: a retry must get the same one |
//! | `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `UNKNOWN`, `CANCELLED`, `DEADLINE_EXCEEDED`, `DATA_LOSS` | released | "try again": a retry with the same key runs |
//! | `INVALID_ARGUMENT` (a failed decode or validation), `UNAUTHENTICATED`, `UNIMPLEMENTED` | released | refused before any work was done (Stripe's rule): the corrected request with the same key runs |
//! | any code the handler marked final ([`mark_final`]) | stored | the handler says this answer is its decision |
//! | no `grpc-status` at all (a broken answer) | released | not an answer |
//!
//! A handler cut off by the guard's own bound (the engine's maximum handler
//! time) is not in this table: its record is abandoned and later calls get
//! `FAILED_PRECONDITION` with reason `outcome-unknown` (see
//! [`crate::refusal`]).

use tonic::{Code, Status};

/// The metadata entry with which a handler marks its status final (stored
/// whatever its code). The layer removes it from the answer before it is
/// sent or stored.
pub const FINAL_STATUS: &str = "idempotency-final";

/// What becomes of a handler's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Stored: every later call with the key gets it replayed.
    Store,
    /// Released: the key is freed, so a retry runs the method again.
    Release,
}

/// The table of this module: what becomes of an answer with `code`
/// (`None` when the answer carried no valid `grpc-status`), `marked_final`
/// when the handler marked it final.
pub fn keep(code: Option<Code>, marked_final: bool) -> Keep {
    let Some(code) = code else {
        return Keep::Release;
    };
    if marked_final {
        return Keep::Store;
    }
    match code {
        Code::Ok
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::NotFound
        | Code::PermissionDenied => Keep::Store,
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
        | Code::Unimplemented => Keep::Release,
    }
}

/// Marks `status` final: the guard stores it whatever its code, so a retry
/// with the same key gets it again instead of running the method again.
/// For a refusal the handler decided on after looking at the world (an
/// `INVALID_ARGUMENT` for an amount over the account's limit, say).
///
/// ```
/// use tonic::{Code, Status};
///
/// let status = idempotency_grpc::mark_final(Status::invalid_argument("over the limit"));
/// assert_eq!(status.code(), Code::InvalidArgument);
/// assert!(status.metadata().get(idempotency_grpc::FINAL_STATUS).is_some());
/// ```
pub fn mark_final(mut status: Status) -> Status {
    status.metadata_mut().insert(
        FINAL_STATUS,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_table_as_a_truth_table() {
        use Keep::{Release, Store};
        // code, stored when not marked final
        let rows = [
            (Code::Ok, Store),
            (Code::AlreadyExists, Store),
            (Code::FailedPrecondition, Store),
            (Code::OutOfRange, Store),
            (Code::NotFound, Store),
            (Code::PermissionDenied, Store),
            (Code::Unavailable, Release),
            (Code::ResourceExhausted, Release),
            (Code::Aborted, Release),
            (Code::Internal, Release),
            (Code::Unknown, Release),
            (Code::Cancelled, Release),
            (Code::DeadlineExceeded, Release),
            (Code::DataLoss, Release),
            (Code::InvalidArgument, Release),
            (Code::Unauthenticated, Release),
            (Code::Unimplemented, Release),
        ];
        // Every code is in the table once.
        assert_eq!(rows.len(), 17);
        for (code, expected) in rows {
            assert_eq!(keep(Some(code), false), expected, "{code:?}");
            assert_eq!(keep(Some(code), true), Store, "{code:?} marked final");
        }
        assert_eq!(keep(None, false), Release);
        assert_eq!(keep(None, true), Release);
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
