//! What one attempt says about the server, for the retry budget's
//! accounting: an answer, a server error, a lost answer, or a server that
//! says it is overloaded. The budget treats them apart (see
//! [`crate::budget`]): a lost answer on a server that answers the others
//! is a blip worth retrying (Finagle's floor of retries per second serves
//! it), while a server that sheds load must not be sent more (the overload
//! limiter, after gRPC's retry throttling and the AWS SDKs' adaptive mode,
//! which react to throttling answers only). Which outcome is which signal
//! is the pure table `Signal::of`, in `decision.rs` with the other rules.

/// What an attempt got, as the budget counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// An answer below 500 (a 429 aside): the server answers.
    Answered,
    /// A 408 or a 5xx without `Retry-After`: the server answered with an
    /// error, quickly or not; its retries take the budget's share only.
    ServerError,
    /// No answer: a connect error, a timeout, a connection reset or
    /// dropped. A blip when the server answers the client's other
    /// attempts.
    LostAnswer,
    /// A 429, or a 5xx with `Retry-After` (a 503 shedding load): the
    /// server says it is overloaded. The overload limiter counts these.
    Overload,
}
