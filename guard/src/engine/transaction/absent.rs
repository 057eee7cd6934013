//! Transactional mode without PostgreSQL: the engine's names, over types
//! that have no values. A run never holds a transaction, and each method
//! here is unreachable by construction (`match *self {}`).

use super::super::Engine;
use super::super::answer::Settle;
use super::{Acquired, SettleError};
use crate::record::StoredResponse;
use crate::store::{Claim, Lease, StoreError};

/// No value: nothing to hold without PostgreSQL.
pub(crate) enum Locked {}

/// No value: no run has a transaction without PostgreSQL.
#[derive(Debug, Clone)]
pub(crate) enum TransactionSlot {}

impl TransactionSlot {
    /// Never a slot.
    pub(crate) fn for_run(
        held: Option<Locked>,
        transactions: Option<&Transactions>,
        _lease: &Lease,
    ) -> Option<Self> {
        match (held, transactions) {
            (None, None) => None,
            (Some(locked), _) => match locked {},
            (None, Some(transactions)) => match *transactions {},
        }
    }

    /// Unreachable: there is no slot.
    pub(crate) fn holds_lock(&self) -> bool {
        match *self {}
    }

    /// Unreachable: there is no slot.
    pub(crate) fn note_steps(&self) {
        match *self {}
    }

    /// Unreachable: there is no slot.
    pub(crate) async fn record_in_lock(
        &self,
        _lease: &Lease,
        _steps: &[crate::record::Step],
    ) -> Result<(), StoreError> {
        match *self {}
    }
}

/// No value: transactional mode cannot be turned on without PostgreSQL.
#[derive(Debug, Clone)]
pub(crate) enum Transactions {}

/// Expands to no builders: transactional mode's need PostgreSQL.
#[allow(unused_macros)]
macro_rules! transactional_settings {
    ($expand:ident) => {};
}
pub(crate) use transactional_settings;

impl<S: crate::store::Store> Engine<S> {
    /// Never: no claim is transactional without PostgreSQL.
    pub(in crate::engine) fn claims_transactional(&self) -> bool {
        false
    }

    /// The store's committed claim.
    pub(in crate::engine) async fn claim_once<T>(
        &self,
        new: &crate::store::NewRecord<'_>,
        _wait_until: tokio::time::Instant,
    ) -> Result<Result<Claim, StoreError>, Acquired<T>> {
        Ok(self.claim_committed(new).await)
    }

    /// Unreachable: there is no slot.
    pub(in crate::engine) async fn settle_in_slot<'a>(
        &self,
        _lease: &Lease,
        slot: &TransactionSlot,
        _ending: Settle<(), &'a StoredResponse>,
    ) -> Result<Result<bool, SettleError>, Settle<(), &'a StoredResponse>> {
        match *slot {}
    }
}
