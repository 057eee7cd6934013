//! The marks a handler puts on its response to tell the guard what it is:
//! [`FinalResponse`] (a client error the handler decided on: keep it) and
//! [`OutcomeUnknown`] (the handler lost track of its work: abandon the
//! key). `classify.rs` reads them.

/// Marks a client-error response (400, 413, 415, 422) that the handler
/// decided on after starting its work, so the guard stores it like any
/// other answer. Without it such a response is taken for an extractor's
/// rejection (nothing ran) and releases the key, as Stripe does: the
/// corrected request with the same key then runs.
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use idempotency_guard::layer::FinalResponse;
///
/// async fn create_payment() -> impl IntoResponse {
///     // ... the card was declined: that is the answer, keep it.
///     (StatusCode::UNPROCESSABLE_ENTITY, FinalResponse, "card declined")
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinalResponse;

impl axum::response::IntoResponseParts for FinalResponse {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}

/// Marks a response whose outcome the handler does not know: it handed the
/// request on and lost track of it (an upstream reset the connection after
/// receiving the request, or timed out). The guard sends the response, but
/// stores nothing and ends the lease: the key is abandoned, later requests
/// get 409 `outcome-unknown` and the status service says `reconcile`, so
/// nothing runs twice blindly. (The gateway marks its 502/504 answers so.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeUnknown;

impl axum::response::IntoResponseParts for OutcomeUnknown {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut parts: axum::response::ResponseParts,
    ) -> Result<axum::response::ResponseParts, Self::Error> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}
