//! Transactional mode, the engine's half (PostgreSQL): the run's
//! transaction, begun on first use by the work, and what the engine tells
//! the store once a completion committed in it. Its axum half (the `Tx`
//! extractor and `TxRejection`'s response) is in `layer/tx.rs`.
//!
//! This is the engine's only `cfg(feature = "postgres")` code: the rest of
//! the engine calls the same names either way. With PostgreSQL they are
//! `postgres.rs`; without it `absent.rs`, whose types have no values (so a
//! run never has a transaction and the compiler drops those paths).

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub(crate) use postgres::*;
#[cfg(feature = "postgres")]
pub use postgres::{Tx, TxRejection};

#[cfg(not(feature = "postgres"))]
mod absent;
#[cfg(not(feature = "postgres"))]
pub(crate) use absent::*;

/// The transaction a single-commit claim holds the key in, if any.
pub(crate) type Held = Option<Locked>;
