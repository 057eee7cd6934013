//! Clients for write APIs behind the idempotency guard.
//!
//! - [`status`]: the key-status service's wire types and [`StatusClient`],
//!   which asks whether a write already ran before it is sent again.

pub mod status;

pub use status::{Advice, KeyState, KeyStatus, Status, StatusClient, StatusError};
