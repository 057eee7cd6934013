//! Clients for write APIs behind the idempotency guard.
//!
//! - [`status`]: the key-status service's wire types and [`StatusClient`],
//!   which asks whether a write already ran before it is sent again.
//! - [`RetryClient`]: retries that cannot multiply a failure, and that ask
//!   before resending a write.

mod backoff;
mod breaker;
mod budget;
mod decision;
mod error;
mod key;
mod policy;
mod retry;
mod retry_after;
pub mod status;
pub mod telemetry;

pub use backoff::Backoff;
pub use breaker::CircuitBreaker;
pub use budget::RetryBudget;
pub use error::{ErrorKind, Failure, RetryError};
pub use key::{IDEMPOTENCY_KEY, RETRY_ATTEMPT, new_key};
pub use policy::{Kind, Policy};
pub use retry::RetryClient;
pub use status::{Advice, KeyState, KeyStatus, Status, StatusClient, StatusError};
