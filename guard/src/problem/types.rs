//! Every problem the product answers, declared once: its name (the part of
//! `type` after `urn:idempotency:`), its status, its title and the headers
//! that go with it. The guard, the server, the service, the gateway, the
//! webhook receivers, the JSON-RPC and gRPC adapters all render their
//! problems from these, so a name means one thing everywhere; the status
//! service derives its OpenAPI `type` list from [`ALL`].
//!
//! A problem whose status depends on the answer (`key-reused`, 409 or the
//! configured 422; `response-not-replayable`, the stored status) declares
//! its usual status and is rendered with
//! [`Problem::with_status`](super::Problem::with_status).

use http::StatusCode;

use super::{ProblemHeader, ProblemType};

/// Declares each problem type as a `pub const`, and [`ALL`] listing them.
macro_rules! problem_types {
    ($(
        $(#[$doc:meta])*
        $ident:ident: $status:ident $name:literal $title:literal [$($header:ident),*];
    )*) => {
        $(
            $(#[$doc])*
            pub const $ident: ProblemType = ProblemType {
                status: StatusCode::$status,
                name: $name,
                title: $title,
                headers: &[$(ProblemHeader::$header),*],
            };
        )*

        /// Every problem type, in declaration order.
        pub const ALL: &[ProblemType] = &[$($ident),*];
    };
}

problem_types! {
    // --- The guard: the answers it gives instead of the handler's. ---

    /// The route requires a key and the request has none.
    KEY_MISSING: BAD_REQUEST "key-missing" "Idempotency-Key header required" [];
    /// The key is malformed or repeated.
    KEY_INVALID: BAD_REQUEST "key-invalid" "Idempotency-Key header invalid" [];
    /// The request's scope is empty, over 255 bytes or holds a control
    /// character.
    SCOPE_INVALID: BAD_REQUEST "scope-invalid" "Request scope invalid" [];
    /// The request body exceeds the limit.
    BODY_TOO_LARGE: PAYLOAD_TOO_LARGE "body-too-large" "Request body too large" [];
    /// The request body could not be read to its end.
    BODY_UNREADABLE: BAD_REQUEST "body-unreadable" "Request body unreadable" [];
    /// The key was used with another request (409, or the configured 422).
    KEY_REUSED: CONFLICT "key-reused" "Idempotency key reused" [];
    /// The first request with this key still runs.
    REQUEST_IN_FLIGHT: CONFLICT "request-in-flight" "Request in flight" [RetryAfter];
    /// The earlier run was abandoned: whether it took effect is unknown.
    OUTCOME_UNKNOWN: CONFLICT "outcome-unknown" "Outcome unknown" [];
    /// The earlier run's response was too large to store.
    RESPONSE_NOT_STORED: CONFLICT "response-not-stored" "Response not stored" [];
    /// A replay under a status-only policy: the stored status, not the
    /// body.
    RESPONSE_NOT_REPLAYABLE: OK "response-not-replayable" "Response not replayable" [];
    /// The store failed or did not answer; nothing ran.
    STORE_UNAVAILABLE: SERVICE_UNAVAILABLE "store-unavailable" "Idempotency store unavailable" [RetryAfter];
    /// The bodies being buffered fill the layer's budget; nothing ran.
    BODY_BUFFER_FULL: SERVICE_UNAVAILABLE "body-buffer-full" "Request bodies buffer full" [RetryAfter];
    /// The guard cut the handler off at the maximum handler time.
    HANDLER_TIMEOUT: GATEWAY_TIMEOUT "handler-timeout" "Handler timed out" [];
    /// The handler panicked, failed or sent a broken body; the key was
    /// released.
    HANDLER_FAILED: INTERNAL_SERVER_ERROR "handler-failed" "Handler failed" [];
    /// A resumed run asked for its steps in another order, or with another
    /// input, than the run it resumes recorded (the code changed under a
    /// live key): nothing was mixed, the key stays abandoned.
    STEP_MISMATCH: INTERNAL_SERVER_ERROR "step-mismatch" "Recorded steps do not match" [];
    /// Transactional mode: the handler asked for a transaction the run has
    /// not got (not transactional, or already taken).
    TRANSACTION_UNAVAILABLE: INTERNAL_SERVER_ERROR "transaction-unavailable" "Transaction unavailable" [];

    // --- The server: a connection's bounds. ---

    /// The request target is over the server's limit.
    URI_TOO_LONG: URI_TOO_LONG "uri-too-long" "URI too long" [];
    /// The request's header names and values are over the server's limit.
    HEADERS_TOO_LARGE: REQUEST_HEADER_FIELDS_TOO_LARGE "headers-too-large" "Request header fields too large" [];
    /// The request body did not arrive in time; the connection closes.
    BODY_TIMEOUT: REQUEST_TIMEOUT "body-timeout" "Body timeout" [ConnectionClose];

    // --- The status service and its admin API. ---

    /// No bearer token, or an unknown one.
    UNAUTHORIZED: UNAUTHORIZED "unauthorized" "Unauthorized" [BearerChallenge];
    /// The admin token may not act on this scope.
    SCOPE_FORBIDDEN: FORBIDDEN "scope-forbidden" "Scope forbidden" [];
    /// A write signed in by a console session without the console's
    /// `Origin` (missing or foreign).
    ORIGIN_REFUSED: FORBIDDEN "origin-refused" "Origin refused" [];
    /// No record of this key in the caller's scope.
    KEY_NOT_FOUND: NOT_FOUND "key-not-found" "Key not found" [];
    /// The request is malformed; the detail says how.
    BAD_REQUEST: BAD_REQUEST "bad-request" "Bad request" [];
    /// No such endpoint.
    NOT_FOUND: NOT_FOUND "not-found" "Not found" [];
    /// The endpoint exists, not with this method.
    METHOD_NOT_ALLOWED: METHOD_NOT_ALLOWED "method-not-allowed" "Method not allowed" [];
    /// `release` frees abandoned keys; a completed record is forgotten.
    RECORD_COMPLETED: CONFLICT "record-completed" "Record completed" [];
    /// A state-changing admin call without a reason (or one that is empty,
    /// over 500 characters or holds a control character).
    REASON_REQUIRED: UNPROCESSABLE_ENTITY "reason-required" "Reason required" [];

    // --- The gateway. ---

    /// The store or the upstream is not ready.
    NOT_READY: SERVICE_UNAVAILABLE "not-ready" "Not ready" [];
    /// The gateway does not open tunnels (`CONNECT`).
    METHOD_NOT_SUPPORTED: NOT_IMPLEMENTED "method-not-supported" "Method not supported" [];
    /// A guarded method spelled in other than capitals.
    METHOD_NOT_CANONICAL: BAD_REQUEST "method-not-canonical" "Method not canonical" [];
    /// A target with dot segments, encoded separators or another spelling of
    /// a guarded route.
    TARGET_NOT_CANONICAL: BAD_REQUEST "target-not-canonical" "Target not canonical" [];
    /// A request with a key that no guarded route matches.
    ROUTE_NOT_GUARDED: BAD_REQUEST "route-not-guarded" "Route not guarded" [];
    /// The upstream could not be reached; nothing was sent.
    UPSTREAM_UNAVAILABLE: SERVICE_UNAVAILABLE "upstream-unavailable" "Upstream unavailable" [RetryAfter];
    /// The upstream failed after the request was sent.
    UPSTREAM_FAILED: BAD_GATEWAY "upstream-failed" "Upstream failed" [];
    /// The upstream did not answer in time after the request was sent.
    UPSTREAM_TIMEOUT: GATEWAY_TIMEOUT "upstream-timeout" "Upstream timeout" [];

    // --- Webhook receivers. ---

    /// The delivery carries no id to deduplicate it by.
    WEBHOOK_ID_MISSING: BAD_REQUEST "webhook-id-missing" "Webhook id missing" [];
    /// The signed timestamp is missing or not a number.
    WEBHOOK_TIMESTAMP_INVALID: BAD_REQUEST "webhook-timestamp-invalid" "Webhook timestamp invalid" [];
    /// The signed timestamp is outside the tolerance.
    WEBHOOK_TIMESTAMP_EXPIRED: BAD_REQUEST "webhook-timestamp-expired" "Webhook timestamp outside tolerance" [];
    /// No signature matches the delivery.
    WEBHOOK_SIGNATURE_INVALID: UNAUTHORIZED "webhook-signature-invalid" "Webhook signature invalid" [];

    // --- The JSON-RPC and gRPC adapters (their own codes, these names). ---

    /// A JSON-RPC batch holds a guarded call.
    BATCH_NOT_GUARDED: BAD_REQUEST "batch-not-guarded" "Batch not guarded" [];
    /// The gRPC adapter found no scope from its layer (a server wired
    /// without it).
    LAYER_MISSING: INTERNAL_SERVER_ERROR "layer-missing" "Layer missing" [];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_is_declared_once_and_spelled_as_a_urn_segment() {
        let mut names: Vec<&str> = ALL.iter().map(|t| t.name).collect();
        assert!(names.iter().all(|name| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
        }));
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count, "a problem name is declared twice");
    }

    #[test]
    fn the_retry_hints_go_with_the_answers_that_ask_for_a_retry() {
        for kind in ALL {
            let retry = kind.headers.contains(&ProblemHeader::RetryAfter);
            let expected = [
                REQUEST_IN_FLIGHT,
                STORE_UNAVAILABLE,
                BODY_BUFFER_FULL,
                UPSTREAM_UNAVAILABLE,
            ]
            .iter()
            .any(|t| t.name == kind.name);
            assert_eq!(retry, expected, "{}", kind.name);
        }
    }
}
