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

// What the engine's steps and this, their transactional half, both name:
// kept here, below both, so imports go one way (the steps import this
// folder, never the other way round).

/// What [`Engine::acquire`](super::Engine::acquire) ends with (the claim step).
pub(super) enum Acquired<T> {
    /// This run holds the lease: run the work.
    Lease(crate::store::Lease),
    /// This run took over an abandoned run to resume it: run the work with
    /// what that run left.
    Resumed(crate::store::Lease, Resume),
    /// Single-commit mode: this run holds the key's lock, and its
    /// uncommitted claim, in this transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Locked(crate::store::Lease, Locked),
    /// Answer the caller without running.
    Answer(super::Answer<T>),
    /// Another run holds the key (single-commit mode's lock, or claims
    /// that kept changing hands): answer `request-in-flight`.
    InFlight,
    /// The store failed: fail closed or open.
    StoreFailed,
}

/// What a resumed run takes from the record it took over.
#[derive(Debug, Default)]
pub(super) struct Resume {
    /// The steps that run recorded.
    pub(super) steps: Vec<crate::record::Step>,
    /// The completer's attempts on its stored request so far: a client's
    /// retry that keeps its request again keeps this count, so that retries
    /// never give the completer fresh attempts.
    pub(super) attempts: u32,
}

impl Resume {
    /// What `record` leaves to the run that resumes it.
    pub(super) fn of(record: crate::record::Record) -> Self {
        Self {
            attempts: record
                .request
                .as_ref()
                .map_or(0, |request| request.attempts),
            steps: record.steps,
        }
    }
}

/// A failed settlement, and whether the work's writes were rolled back (or
/// may have been: a commit that did not confirm).
pub(super) struct SettleError {
    pub(super) error: crate::store::StoreError,
    pub(super) rolled_back: bool,
}

/// Expands a list of builders as written: the engine's own (its settings
/// in `config.rs`, transactional mode's here).
macro_rules! as_written {
    ($($item:tt)*) => {
        $($item)*
    };
}
pub(crate) use as_written;
