//! Transactional mode over PostgreSQL: the run's transaction, begun on
//! first use by the work, single-commit claims by the key's lock, and the
//! settling of a run inside its transaction.
//!
//! A handler on a route in transactional mode takes a [`Tx`] and writes
//! through it. The guard commits that transaction only together with the
//! completion of the record, so a crash, a timeout or a lost lease rolls both
//! back: a retry then runs exactly once and no outcome is ever unknown.
//!
//! ```no_run
//! use axum::{Json, http::StatusCode};
//! use idempotency_guard::Tx;
//!
//! async fn create_payment(mut tx: Tx, Json(amount): Json<i64>) -> Result<StatusCode, StatusCode> {
//!     sqlx::query("insert into payments (amount) values ($1)")
//!         .bind(amount)
//!         .execute(&mut *tx)
//!         .await
//!         .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
//!     Ok(StatusCode::CREATED) // committed by the guard, with the stored response
//! }
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgConnection;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use super::super::answer::Settle;
use super::super::{Engine, RunContext};
use super::{Acquired, SettleError, as_written};
use crate::record::{Step, StoredResponse};
use crate::store::Lease;
use crate::store::postgres::{PostgresStore, RunTransaction, record_steps_in};
use crate::store::{Claim, StoreError};

/// The handler's share of the guard's transaction: derefs to the
/// [`PgConnection`] of the transaction that will also commit the stored
/// response. Use `&mut *tx` wherever sqlx wants an executor.
///
/// Only one `Tx` exists per request at a time; drop it before the handler
/// returns (a `Tx` moved into a spawned task makes the request fail and
/// roll back).
pub struct Tx(OwnedMappedMutexGuard<SlotState, PgConnection>);

impl std::ops::Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl std::ops::DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

/// Why a [`Tx`] could not be extracted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxRejection {
    /// The route is not guarded in transactional mode.
    #[error("this route is not guarded by an idempotency layer in transactional mode")]
    NotTransactional,
    /// A `Tx` was already extracted for this request and is still alive.
    #[error("the transaction of this request is already in use")]
    InUse,
    /// The transaction could not begin.
    #[error("the transaction could not begin")]
    Begin(#[source] sqlx::Error),
    /// The record could not be marked transactional (the store failed, or
    /// the run no longer holds its lease).
    #[error("the record could not be marked transactional")]
    Mark(#[source] crate::store::StoreError),
}

impl TxRejection {
    /// The refusal an adapter answers with: `store-unavailable` (with
    /// `key` and `retry_after`) when the transaction could not begin or the
    /// record could not be marked, `transaction-unavailable` otherwise.
    pub fn refusal(
        &self,
        key: Option<crate::key::IdempotencyKey>,
        retry_after: Duration,
    ) -> crate::engine::Refusal {
        match self {
            Self::Begin(_) | Self::Mark(_) => {
                crate::engine::Refusal::StoreUnavailable { key, retry_after }
            }
            Self::NotTransactional | Self::InUse => crate::engine::Refusal::TransactionUnavailable,
        }
    }
}

/// The transaction of one run, begun on first use by the work (or, in
/// single-commit mode, the one that holds the key's lock from the claim on).
#[derive(Clone)]
pub(crate) struct TransactionSlot {
    state: Arc<Mutex<SlotState>>,
    holds_lock: bool,
    /// Whether the record holds steps (this run's or a resumed run's): a
    /// run that ends without completing then keeps the key, abandoned,
    /// rather than release it (which would delete them).
    keeps_steps: Arc<AtomicBool>,
}

impl std::fmt::Debug for TransactionSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransactionSlot")
    }
}

/// Where the run's transaction is: not begun yet (or committed with a
/// step, in transactional mode), open, open for a transactional step, or
/// handed back.
pub(crate) enum SlotState {
    Unused(PostgresStore, Lease),
    Open(RunTransaction),
    /// Begun by a transactional step ([`TransactionSlot::begin_step`]),
    /// committed with its record ([`TransactionSlot::commit_step`]).
    InStep(RunTransaction, PostgresStore, Lease),
    Taken,
}

/// Why a transactional step could not begin.
#[derive(Debug)]
pub(crate) enum StepRefused {
    /// As the run's `Tx` would be refused.
    Tx(TxRejection),
    /// The run's transaction holds writes that no step holds (the run's
    /// `Tx` was used since the last step): committed with this step, they
    /// would run again when a resumed run replays it.
    WritesOutsideSteps,
}

/// The savepoint a transactional step begins in single-commit mode (the
/// run's one transaction), released once its record is written there, and
/// rolled back to when the step fails.
const STEP_SAVEPOINT: &str = "savepoint idempotency_step";
/// See [`STEP_SAVEPOINT`].
const STEP_RELEASE: &str = "release savepoint idempotency_step";
/// See [`STEP_SAVEPOINT`].
const STEP_ROLLBACK: &str = "rollback to savepoint idempotency_step";

/// The handler still holds its [`Tx`] after it returned.
#[derive(Debug)]
pub(crate) struct TxStillInUse;

impl TransactionSlot {
    pub(crate) fn new(postgres: PostgresStore, lease: Lease) -> Self {
        Self {
            state: Arc::new(Mutex::new(SlotState::Unused(postgres, lease))),
            holds_lock: false,
            keeps_steps: Arc::default(),
        }
    }

    /// The slot of a single-commit run: its transaction is open from the
    /// claim on and holds the key's lock and its uncommitted record.
    pub(crate) fn locked(transaction: RunTransaction) -> Self {
        Self {
            state: Arc::new(Mutex::new(SlotState::Open(transaction))),
            holds_lock: true,
            keeps_steps: Arc::default(),
        }
    }

    /// Whether the transaction holds the key (single-commit mode): its
    /// record is uncommitted, so nothing is renewed or released outside it.
    pub(crate) fn holds_lock(&self) -> bool {
        self.holds_lock
    }

    /// Hands out the run's transaction, beginning it on first use. Before it
    /// begins, the record is marked transactional (fenced, committed on its
    /// own): from then on a lapsed lease means the writes were rolled back.
    pub(crate) async fn tx(&self) -> Result<Tx, TxRejection> {
        let mut state = Arc::clone(&self.state)
            .try_lock_owned()
            .map_err(|_| TxRejection::InUse)?;
        if let SlotState::Unused(postgres, lease) = &*state {
            postgres
                .mark_transactional(lease)
                .await
                .map_err(TxRejection::Mark)?;
            let transaction = postgres.begin_run().await.map_err(TxRejection::Begin)?;
            *state = SlotState::Open(transaction);
        }
        OwnedMutexGuard::try_map(state, |state| match state {
            SlotState::Open(transaction) => Some(&mut **transaction),
            _ => None,
        })
        .map(Tx)
        .map_err(|_| TxRejection::InUse)
    }

    /// Takes the transaction back after the work returned: `None` when the
    /// work never began one (or its last write committed with a step). A
    /// step that never ended (its future dropped) is rolled back: its
    /// writes never commit without its record.
    pub(crate) fn take(&self) -> Result<Option<RunTransaction>, TxStillInUse> {
        let mut state = self.state.try_lock().map_err(|_| TxStillInUse)?;
        match std::mem::replace(&mut *state, SlotState::Taken) {
            SlotState::Open(transaction) => Ok(Some(transaction)),
            SlotState::Unused(..) | SlotState::InStep(..) | SlotState::Taken => Ok(None),
        }
    }

    /// Notes that the record holds steps.
    pub(crate) fn note_steps(&self) {
        self.keeps_steps.store(true, Ordering::Relaxed);
    }

    /// Whether the record holds steps.
    fn keeps_steps(&self) -> bool {
        self.keeps_steps.load(Ordering::Relaxed)
    }

    /// Begins a transactional step and hands out the transaction it writes
    /// through. In transactional mode, a transaction of its own (the
    /// record marked transactional first, as [`TransactionSlot::tx`] does),
    /// refused while the run's transaction holds writes no step holds; in
    /// single-commit mode, a savepoint in the run's one transaction.
    pub(crate) async fn begin_step(&self) -> Result<Tx, StepRefused> {
        let mut state = Arc::clone(&self.state)
            .try_lock_owned()
            .map_err(|_| StepRefused::Tx(TxRejection::InUse))?;
        match std::mem::replace(&mut *state, SlotState::Taken) {
            SlotState::Unused(postgres, lease) => {
                let begun = async {
                    postgres
                        .mark_transactional(&lease)
                        .await
                        .map_err(TxRejection::Mark)?;
                    postgres.begin_run().await.map_err(TxRejection::Begin)
                };
                match begun.await {
                    Ok(transaction) => *state = SlotState::InStep(transaction, postgres, lease),
                    Err(rejection) => {
                        *state = SlotState::Unused(postgres, lease);
                        return Err(StepRefused::Tx(rejection));
                    }
                }
            }
            SlotState::Open(mut transaction) if self.holds_lock => {
                let saved = sqlx::query(STEP_SAVEPOINT).execute(&mut *transaction).await;
                *state = SlotState::Open(transaction);
                saved.map_err(|error| StepRefused::Tx(TxRejection::Begin(error)))?;
            }
            SlotState::Open(transaction) => {
                *state = SlotState::Open(transaction);
                return Err(StepRefused::WritesOutsideSteps);
            }
            other => {
                *state = other;
                return Err(StepRefused::Tx(TxRejection::InUse));
            }
        }
        OwnedMutexGuard::try_map(state, |state| match state {
            SlotState::Open(transaction) | SlotState::InStep(transaction, ..) => {
                Some(&mut **transaction)
            }
            _ => None,
        })
        .map(Tx)
        .map_err(|_| StepRefused::Tx(TxRejection::InUse))
    }

    /// Ends a transactional step that returned: writes `steps` (the whole
    /// list, its own last) in its transaction, fenced by `lease`, and
    /// commits it with the step's writes (transactional mode), or releases
    /// its savepoint (single-commit mode: the run's commit carries both).
    /// On failure the step's writes are rolled back.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`
    /// (or its lease ended); [`StoreError::Unavailable`] when the write or
    /// the commit failed (a commit whose answer was lost may have landed:
    /// the record then holds the step, and a resumed run replays it).
    pub(crate) async fn commit_step(
        &self,
        lease: &Lease,
        steps: &[Step],
    ) -> Result<(), StoreError> {
        let mut state = self
            .state
            .try_lock()
            .map_err(|_| StoreError::Unsupported("a step's Tx kept after the step returned"))?;
        match std::mem::replace(&mut *state, SlotState::Taken) {
            SlotState::InStep(mut transaction, postgres, owner) => {
                *state = SlotState::Unused(postgres, owner);
                if let Err(error) = record_steps_in(&mut transaction, lease, steps, false).await {
                    let _ = transaction.rollback().await;
                    return Err(error);
                }
                transaction.commit().await.map_err(StoreError::from)
            }
            SlotState::Open(mut transaction) if self.holds_lock => {
                let recorded = async {
                    record_steps_in(&mut transaction, lease, steps, true).await?;
                    sqlx::query(STEP_RELEASE).execute(&mut *transaction).await?;
                    Ok::<_, StoreError>(())
                }
                .await;
                if recorded.is_err() {
                    let _ = sqlx::query(STEP_ROLLBACK).execute(&mut *transaction).await;
                }
                *state = SlotState::Open(transaction);
                recorded
            }
            other => {
                *state = other;
                Err(StoreError::Unsupported(
                    "a transactional step that did not begin",
                ))
            }
        }
    }

    /// Rolls back a transactional step that failed before its record was
    /// written (its result does not serialize).
    pub(crate) async fn abort_step(&self) {
        let Ok(mut state) = self.state.try_lock() else {
            return;
        };
        match std::mem::replace(&mut *state, SlotState::Taken) {
            SlotState::InStep(transaction, postgres, owner) => {
                let _ = transaction.rollback().await;
                *state = SlotState::Unused(postgres, owner);
            }
            SlotState::Open(mut transaction) => {
                if self.holds_lock {
                    let _ = sqlx::query(STEP_ROLLBACK).execute(&mut *transaction).await;
                }
                *state = SlotState::Open(transaction);
            }
            other => *state = other,
        }
    }

    /// Records `steps` in the run's transaction, which holds the key and
    /// its uncommitted record (single-commit mode): they commit with it.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when the record no longer holds `lease`;
    /// [`StoreError::Unsupported`] while the work holds its `Tx`.
    pub(crate) async fn record_in_lock(
        &self,
        lease: &Lease,
        steps: &[Step],
    ) -> Result<(), StoreError> {
        let mut state = self.state.try_lock().map_err(|_| {
            StoreError::Unsupported("a step recorded while the work holds its Tx (drop it first)")
        })?;
        match &mut *state {
            SlotState::Open(transaction) => record_steps_in(transaction, lease, steps, true).await,
            _ => Err(StoreError::LeaseLost),
        }
    }
}

/// Transactional mode: the PostgreSQL store whose transactions carry the
/// work's writes, and what to tell the store after one commits.
#[derive(Clone)]
pub(crate) struct Transactions {
    pub(crate) postgres: PostgresStore,
    pub(crate) committed:
        Arc<dyn Fn(Lease) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>,
}

impl Transactions {
    /// Tells the store that a completion committed in a run's transaction.
    pub(crate) async fn committed(&self, lease: &Lease) {
        (self.committed)(lease.clone()).await;
    }
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactions").finish_non_exhaustive()
    }
}

/// Transactional mode's builders, each written once (as
/// `engine_settings!` in `config.rs` writes the others):
/// `transactional_settings!(m)` hands them to the macro `m`, which makes
/// them the engine's own or an adapter's forwarders with the same docs.
macro_rules! transactional_settings {
    ($expand:ident) => {
        $expand! {
            /// Turns transactional mode on or off: the work writes through a
            /// [`crate::Tx`] (see [`RunContext::tx`](crate::engine::RunContext::tx)), and the engine commits those
            /// writes together with the stored outcome, so a crash or timeout
            /// leaves nothing behind. A run that never begins its transaction is an
            /// ordinary run (its record is marked transactional only when the
            /// transaction begins).
            ///
            /// The default value is `false`.
            ///
            /// # Panics
            ///
            /// When turned on over a store without PostgreSQL.
            pub fn with_transactional_mode(mut self, on: bool) -> Self {
                let transactions = on.then(|| {
                    let postgres = self
                        .inner
                        .store
                        .postgres()
                        .cloned()
                        .expect("transactional mode needs a PostgreSQL store");
                    let store = self.inner.store.clone();
                    Transactions {
                        postgres,
                        committed: Arc::new(move |lease: Lease| {
                            let store = store.clone();
                            Box::pin(async move { store.committed(&lease).await })
                        }),
                    }
                });
                self.config_mut().transactions = transactions;
                self
            }

            /// Marks every record transactional from its claim on (in
            /// transactional mode), not only once the work begins its transaction:
            /// a run that dies between its claim and its commit is then taken over
            /// by the next caller, never left with an unknown outcome. For a
            /// transactional inbox, whose handler writes only through its
            /// transaction.
            ///
            /// The default value is `false`.
            ///
            /// # Warning
            ///
            /// A write of the work that does not go through [`RunContext::tx`](crate::engine::RunContext::tx) (a
            /// call to another service, say) is repeated when a dead run is taken
            /// over.
            pub fn with_transactional_claims(mut self, on: bool) -> Self {
                self.config_mut().transactional_claims = on;
                self
            }

            /// Single-commit transactional mode (in transactional mode): the key is
            /// held by a transaction-scoped advisory lock instead of a committed
            /// claim, and the claim, the work's writes and the stored outcome
            /// commit together, once. Others see the key in flight through the
            /// lock (the status service too); a crash, a timeout or a rollback
            /// frees it with the transaction, so the next request runs, once. No
            /// lease is renewed and nothing is ever taken over.
            ///
            /// Each running work holds one pooled connection (its transaction)
            /// from its claim to its end: size the pool for the runs in flight at
            /// once, work that calls other services included. PostgreSQL itself
            /// ends a transaction that stays idle past the maximum handler time.
            ///
            /// The default value is `false`.
            ///
            /// # Warning
            ///
            /// As with
            /// [`with_transactional_claims`](crate::engine::Engine::with_transactional_claims),
            /// a run that dies left nothing committed, so the next request runs
            /// the work again: an effect outside the transaction (an email, a
            /// call to another service) is then repeated. Use it where every effect goes through the
            /// transaction (a transactional inbox, a payment row).
            pub fn with_single_commit(mut self, on: bool) -> Self {
                self.config_mut().single_commit = on;
                self
            }
        }
    };
}
pub(crate) use transactional_settings;

impl<S: crate::store::TransactionalStore> Engine<S> {
    transactional_settings!(as_written);
}

/// What a single-commit claim ([`Engine::claim_locked`]) ends with.
pub(super) enum LockedStep {
    /// This run holds the key: its lock and uncommitted claim are in the
    /// transaction.
    Held(Lease, RunTransaction),
    /// A committed record to decide about.
    Record(Box<crate::record::Record>),
    /// Another run holds the key (and the wait, if any, ran out).
    InFlight,
    /// The store failed: nothing was committed.
    Failed,
}

impl<S: crate::store::Store> Engine<S> {
    /// Claims the key by its lock (single-commit mode). While another run
    /// holds it, waits as the policy says: woken by the holder's commit or
    /// rollback, and asking again every `retry_after` in case the holder
    /// died (which announces nothing).
    pub(super) async fn claim_locked(
        &self,
        postgres: &PostgresStore,
        new: &crate::store::NewRecord<'_>,
        wait_until: tokio::time::Instant,
    ) -> LockedStep {
        use crate::store::postgres::LockedClaim;
        let idle_bound = self.inner.config.max_handler_time + self.inner.config.store_timeout;
        let mut subscription = None;
        loop {
            let claimed = self
                .timed("claim", postgres.claim_locked(new, idle_bound))
                .await;
            match claimed {
                Ok(LockedClaim::Acquired { transaction, lease }) => {
                    return LockedStep::Held(lease, transaction);
                }
                Ok(LockedClaim::Existing(record)) => return LockedStep::Record(record),
                Ok(LockedClaim::Busy) => {
                    let wait_left =
                        wait_until.saturating_duration_since(tokio::time::Instant::now());
                    if wait_left.is_zero() {
                        return LockedStep::InFlight;
                    }
                    // Subscribed before the next claim, so a commit right
                    // after it is not missed.
                    if let Some(subscription) = subscription.take() {
                        let bound = wait_left.min(self.inner.config.policy.retry_after);
                        let _ = tokio::time::timeout(
                            bound,
                            crate::events::Subscription::changed(&subscription),
                        )
                        .await;
                    }
                    subscription = Some(
                        self.inner
                            .store
                            .events()
                            .subscribe(new.scope.as_str(), new.key.as_str()),
                    );
                }
                Err(error) => {
                    // Nothing committed: the lock went with the transaction.
                    tracing::warn!(error = %error, "idempotency store failed during a single-commit claim");
                    return LockedStep::Failed;
                }
            }
        }
    }

    /// The PostgreSQL store that holds keys by lock, in single-commit mode.
    pub(super) fn single_commit_store(&self) -> Option<&PostgresStore> {
        let config = &self.inner.config;
        config
            .transactions
            .as_ref()
            .filter(|_| config.single_commit)
            .map(|transactions| &transactions.postgres)
    }
}

/// The transaction a single-commit claim holds the key in.
pub(crate) type Locked = RunTransaction;

impl TransactionSlot {
    /// The slot of a run: the transaction its claim holds (single-commit
    /// mode), else one to begin on first use in transactional mode, else
    /// none.
    pub(crate) fn for_run(
        held: Option<Locked>,
        transactions: Option<&Transactions>,
        lease: &Lease,
    ) -> Option<Self> {
        match held {
            Some(transaction) => Some(Self::locked(transaction)),
            None => transactions
                .map(|transactions| Self::new(transactions.postgres.clone(), lease.clone())),
        }
    }
}

impl RunContext {
    /// Begins (on first call) the run's transaction in transactional mode:
    /// writes through it commit together with the stored outcome.
    ///
    /// # Errors
    ///
    /// [`crate::transaction::TxRejection`] when the engine is not in
    /// transactional mode, the transaction is in use, or it cannot begin.
    pub async fn tx(&self) -> Result<Tx, TxRejection> {
        match &self.slot {
            Some(slot) => slot.tx().await,
            None => Err(TxRejection::NotTransactional),
        }
    }

    /// The transaction slot, for adapters that hand it on (the axum layer
    /// puts it in the request's extensions for the [`crate::Tx`] extractor).
    pub(crate) fn slot(&self) -> Option<&TransactionSlot> {
        self.slot.as_ref()
    }
}

impl<S: crate::store::Store> Engine<S> {
    /// Whether a claim is marked transactional from the start.
    pub(in crate::engine) fn claims_transactional(&self) -> bool {
        self.inner.config.transactional_claims && self.inner.config.transactions.is_some()
    }

    /// One claim: by the key's lock in single-commit mode, else the
    /// store's committed claim. `Err` is an answer the run ends with.
    pub(in crate::engine) async fn claim_once<T>(
        &self,
        new: &crate::store::NewRecord<'_>,
        wait_until: tokio::time::Instant,
    ) -> Result<Result<Claim, StoreError>, Acquired<T>> {
        let Some(postgres) = self.single_commit_store() else {
            return Ok(self.claim_committed(new).await);
        };
        match Box::pin(self.claim_locked(postgres, new, wait_until)).await {
            LockedStep::Held(lease, transaction) => Err(Acquired::Locked(lease, transaction)),
            LockedStep::Record(record) => Ok(Ok(Claim::Existing(record))),
            LockedStep::InFlight => Err(Acquired::InFlight),
            LockedStep::Failed => Err(Acquired::StoreFailed),
        }
    }

    /// Settles the run in its transaction, if the work began one: `Err`
    /// hands the ending back when it did not.
    pub(in crate::engine) async fn settle_in_slot<'a>(
        &self,
        lease: &Lease,
        slot: &TransactionSlot,
        ending: Settle<(), &'a StoredResponse>,
    ) -> Result<Result<bool, SettleError>, Settle<(), &'a StoredResponse>> {
        match slot.take() {
            Ok(Some(open)) => {
                // Boxed: its PostgreSQL futures would otherwise enlarge
                // every run's future, transactional or not.
                let locked = slot.holds_lock();
                let keeps_steps = slot.keeps_steps();
                Ok(
                    Box::pin(self.settle_in_transaction(lease, open, locked, keeps_steps, ending))
                        .await,
                )
            }
            Ok(None) if slot.keeps_steps() && matches!(ending, Settle::Release { .. }) => {
                // A run that failed (a panic) once steps committed with
                // their writes keeps the key, abandoned: a release would
                // delete the steps, and a retry would run them again.
                Ok(self
                    .timed("renew", self.inner.store.renew(lease, Duration::ZERO))
                    .await
                    .map(|()| false)
                    .map_err(|error| SettleError {
                        error,
                        rolled_back: false,
                    }))
            }
            Ok(None) => Err(ending),
            Err(TxStillInUse) => {
                // A leaked `Tx` keeps the transaction: it rolls back when
                // dropped. Free the key so a retry runs.
                tracing::error!(
                    "the work kept its Tx after it returned; its writes are rolled back"
                );
                let error = match self.timed("release", self.inner.store.release(lease)).await {
                    Ok(()) => StoreError::Unsupported("a Tx outliving its work"),
                    Err(error) => error,
                };
                Ok(Err(SettleError {
                    error,
                    rolled_back: true,
                }))
            }
        }
    }

    /// Writes the ending in the run's transaction and commits it (or
    /// rolls it back and frees the key, or, when the record `keeps_steps`,
    /// ends the lease: the key stays abandoned). `Ok(false)` for the last.
    async fn settle_in_transaction(
        &self,
        lease: &Lease,
        mut transaction: Locked,
        locked: bool,
        keeps_steps: bool,
        ending: Settle<(), &StoredResponse>,
    ) -> Result<bool, SettleError> {
        let rolled_back = |error| SettleError {
            error,
            rolled_back: true,
        };
        let Some(transactions) = self.inner.config.transactions.as_ref() else {
            return Err(rolled_back(StoreError::Unsupported("transactions")));
        };
        let postgres = &transactions.postgres;
        let written = match ending {
            Settle::Complete {
                response: stored, ..
            } => {
                self.timed(
                    "complete",
                    postgres.complete_in(&mut transaction, lease, stored),
                )
                .await
            }
            Settle::Release {
                keep_writes: true, ..
            } => {
                self.timed("release", postgres.release_in(&mut transaction, lease))
                    .await
            }
            Settle::Release {
                keep_writes: false, ..
            }
            | Settle::Abandon { .. } => {
                // Roll the writes back, then free the key: nothing ran.
                let _ = transaction.rollback().await;
                if locked {
                    // The claim was in the transaction too: the rollback
                    // freed the key. Wake waiters elsewhere.
                    transactions.postgres.announce_rolled_back(lease).await;
                    return Ok(true);
                }
                if keeps_steps {
                    // Steps committed with their writes: keep the key,
                    // abandoned, for a retry to resume from them.
                    return self
                        .timed("renew", self.inner.store.renew(lease, Duration::ZERO))
                        .await
                        .map(|()| false)
                        .map_err(|error| SettleError {
                            error,
                            rolled_back: false,
                        });
                }
                return self
                    .timed("release", self.inner.store.release(lease))
                    .await
                    .map(|()| true)
                    .map_err(rolled_back);
            }
        };
        if let Err(error) = written {
            let _ = transaction.rollback().await;
            return Err(rolled_back(error));
        }
        let commit = async { transaction.commit().await.map_err(StoreError::from) };
        self.timed("commit", commit).await.map_err(rolled_back)?;
        transactions.committed(lease).await;
        Ok(true)
    }
}
