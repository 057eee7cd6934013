//! Steps in a run: the [`Run`] handle a run's work gets (through
//! [`RunContext`](super::RunContext), or as an axum extractor), which
//! records named steps in the key's record and gives each step a derived
//! key for the next system; and [`StepError`], why a step did not return.
//!
//! A step's result is stored (serde JSON, fenced by the run's lease) before
//! the step returns it. A run that resumes an abandoned one
//! ([`AbandonedPolicy::Resume`](crate::AbandonedPolicy::Resume)) gets the
//! recorded steps back, in order, without running them; the first step not
//! recorded runs. A step the crash interrupted (ran, not recorded) runs
//! again: pass [`Run::derived_key`] to the system it calls, so that it
//! runs once there.
//!
//! ```no_run
//! use idempotency_guard::engine::{Answer, Engine, Job, Settle};
//! use idempotency_guard::{AbandonedPolicy, Fingerprint, Scope, StoredResponse, store::sqlite::SqliteStore};
//!
//! # async fn f() -> anyhow::Result<()> {
//! let engine = Engine::new(SqliteStore::memory().await?).with_abandoned(AbandonedPolicy::Resume);
//! let job = Job::new(Scope::new("tenant-a")?, "order-42".parse()?, Fingerprint::of_bytes(b"{}"));
//! let answer = engine
//!     .run(job, |run| async move {
//!         let charge_key = run.derived_key("charge");
//!         let charged = run.step("charge", || async move {
//!             // psp.charge(amount, Idempotency-Key: charge_key) ...
//!             format!("ch_{}", &charge_key.as_str()[..8])
//!         });
//!         match charged.await {
//!             Ok(charge) => Settle::Complete { response: StoredResponse::from_bytes(charge), reply: () },
//!             // Not recorded (or the code changed under the key): leave the
//!             // key abandoned; a retry resumes it.
//!             Err(_) => Settle::Abandon { reply: () },
//!         }
//!     })
//!     .await;
//! # let _ = answer; Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::key::{IdempotencyKey, Scope};
use crate::record::Step;
use crate::store::{Lease, Store, StoreError};

use super::Engine;
use super::transaction::TransactionSlot;

/// Why a step did not return its result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The run resumes one that recorded another step at this position
    /// (another name, or another input): the code changed under a live
    /// key. Nothing ran; the recorded steps are never mixed with others.
    #[error(
        "step {index} is `{asked}` here, but the run being resumed recorded `{recorded}` there"
    )]
    Mismatch {
        /// The step's position (0 for the first).
        index: usize,
        /// The step recorded there (its name, and its input hash if any).
        recorded: String,
        /// The step this run asked for.
        asked: String,
    },
    /// A recorded result does not deserialize into the type asked for.
    #[error("the recorded result of step `{name}` does not fit the type asked for")]
    Decode {
        /// The step.
        name: String,
        /// The deserializer's account.
        #[source]
        source: serde_json::Error,
    },
    /// The step ran, but its result does not serialize: it is not recorded.
    #[error("the result of step `{name}` does not serialize; it is not recorded")]
    Encode {
        /// The step.
        name: String,
        /// The serializer's account.
        #[source]
        source: serde_json::Error,
    },
    /// The step ran, but its result could not be recorded (the store
    /// failed, or the run lost its lease: [`StoreError::LeaseLost`]). The
    /// run must stop: a resumed run runs the step again.
    #[error("the result of step `{name}` could not be recorded")]
    Record {
        /// The step.
        name: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Another step of this run is running (a step asked for inside a
    /// step, or two at once): steps are taken one at a time, in an order a
    /// resumed run can ask for again. Nothing ran.
    #[error("step `{name}` was asked for while another step of this run is running")]
    Overlapping {
        /// The step asked for.
        name: String,
    },
    /// This step cannot be taken here (a transactional step outside
    /// transactional mode, or after writes through the run's `Tx` that no
    /// step holds). Nothing ran.
    #[error("this step cannot be taken here: {0}")]
    Unsupported(&'static str),
}

/// The run's handle: records its steps ([`Run::step`]) and derives the keys
/// it passes on ([`Run::derived_key`]). Cloning shares it; an axum handler
/// behind the [`IdempotencyLayer`](crate::IdempotencyLayer) extracts it.
#[derive(Clone)]
pub struct Run {
    inner: Arc<dyn Steps>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (scope, key) = self.inner.names();
        f.debug_struct("Run")
            .field("scope", scope)
            .field("key", key)
            .finish_non_exhaustive()
    }
}

/// Where a run's steps are kept: the engine over its store, erased so that
/// [`Run`] has no type parameter (an axum handler extracts it).
trait Steps: Send + Sync + 'static {
    /// The run's scope and key.
    fn names(&self) -> (&Scope, &IdempotencyKey);
    /// The steps so far, and how many of them this run has asked for.
    fn log(&self) -> &tokio::sync::Mutex<Log>;
    /// The run's lease (`None` when the run is unguarded).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn lease(&self) -> Option<&Arc<Lease>>;
    /// The run's transaction, in transactional mode.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn slot(&self) -> Option<&TransactionSlot>;
    /// Stores the whole list, fenced by the run's lease (nothing when the
    /// run is unguarded): in the run's transaction when it holds the key
    /// (single-commit mode: the record is uncommitted there), else on its
    /// own.
    fn record(&self, steps: Vec<Step>) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// The steps recorded (those of the run resumed, then this run's), and the
/// position of the next step this run asks for.
#[derive(Debug, Default)]
struct Log {
    steps: Vec<Step>,
    next: usize,
}

/// [`Steps`] over an engine's store.
struct EngineSteps<S> {
    engine: Engine<S>,
    scope: Scope,
    key: IdempotencyKey,
    /// `None` when the run is unguarded (the engine failed open).
    lease: Option<Arc<Lease>>,
    slot: Option<TransactionSlot>,
    log: tokio::sync::Mutex<Log>,
}

impl<S: Store> Steps for EngineSteps<S> {
    fn names(&self) -> (&Scope, &IdempotencyKey) {
        (&self.scope, &self.key)
    }

    fn log(&self) -> &tokio::sync::Mutex<Log> {
        &self.log
    }

    fn lease(&self) -> Option<&Arc<Lease>> {
        self.lease.as_ref()
    }

    fn slot(&self) -> Option<&TransactionSlot> {
        self.slot.as_ref()
    }

    fn record(&self, steps: Vec<Step>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let Some(lease) = &self.lease else {
                return Ok(());
            };
            if let Some(slot) = self.slot.as_ref().filter(|slot| slot.holds_lock()) {
                return self
                    .engine
                    .timed("record_steps", slot.record_in_lock(lease, &steps))
                    .await;
            }
            self.engine
                .timed(
                    "record_steps",
                    self.engine.inner.store.record_steps(lease, &steps),
                )
                .await
        })
    }
}

impl Run {
    /// Whether the key's record holds steps (this run's or a resumed
    /// run's; a step running counts): a failed run then ends its lease
    /// rather than release the key, which would delete them and run them
    /// again (`model/resume.pml`'s control `release-drops-steps`).
    pub(crate) fn holds_steps(&self) -> bool {
        self.inner
            .log()
            .try_lock()
            .map_or(true, |log| !log.steps.is_empty())
    }

    /// The handle of a run holding `lease` (or unguarded, `None`), resuming
    /// `recorded` steps, with its transaction in transactional mode.
    pub(super) fn new<S: Store>(
        engine: &Engine<S>,
        scope: Scope,
        key: IdempotencyKey,
        lease: Option<Arc<Lease>>,
        recorded: Vec<Step>,
        slot: Option<TransactionSlot>,
    ) -> Self {
        if let Some(slot) = slot.as_ref().filter(|_| !recorded.is_empty()) {
            slot.note_steps();
        }
        Self {
            inner: Arc::new(EngineSteps {
                engine: engine.clone(),
                scope,
                key,
                lease,
                slot,
                log: tokio::sync::Mutex::new(Log {
                    steps: recorded,
                    next: 0,
                }),
            }),
        }
    }

    /// Runs `work` as the step `name`, once: the first time, runs it and
    /// records its result in the key's record (fenced by the run's lease)
    /// before returning it; in a resumed run whose earlier run recorded it,
    /// returns the recorded result without running `work`.
    ///
    /// Steps are ordered: the `n`-th step a resumed run asks for must be
    /// the `n`-th one recorded, or [`StepError::Mismatch`] (nothing runs).
    /// Steps of one run are taken one at a time: a step asked for while
    /// another runs (inside it, or beside it in a `join`) is refused,
    /// [`StepError::Overlapping`], as its place in the order would be left
    /// to chance.
    ///
    /// A step is **at least once**: one that ran but was not recorded (the
    /// process died in between) runs again when the run resumes. Pass
    /// [`Run::derived_key`] to the system it calls so that system runs it
    /// once. An unguarded run (the store failed and the engine fails open)
    /// runs every step and records none.
    ///
    /// # Errors
    ///
    /// See [`StepError`]: on any of them the run should stop and leave the
    /// key abandoned ([`Settle::Abandon`](super::Settle::Abandon); in an axum
    /// handler, return the error, whose response says so).
    pub async fn step<T, F, Fut>(&self, name: &str, work: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_step(name, None, work).await
    }

    /// [`Run::step`], for a step whose result depends on `input`: its hash
    /// is recorded with the result, and a resumed run that asks for the step
    /// with another input is refused ([`StepError::Mismatch`]) rather than
    /// given the result of the other input.
    ///
    /// # Errors
    ///
    /// As [`Run::step`].
    pub async fn step_with_input<I, T, F, Fut>(
        &self,
        name: &str,
        input: &I,
        work: F,
    ) -> Result<T, StepError>
    where
        I: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let encoded = serde_json::to_vec(input).map_err(|source| StepError::Encode {
            name: name.to_owned(),
            source,
        })?;
        self.run_step(name, Some(hex(&Sha256::digest(&encoded))), work)
            .await
    }

    async fn run_step<T, F, Fut>(
        &self,
        name: &str,
        input: Option<String>,
        work: F,
    ) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        self.take_step(name, input, |steps| async move {
            let result = work().await;
            let steps = steps.with(&result)?;
            self.inner
                .record(steps.clone())
                .await
                .map_err(|source| StepError::Record {
                    name: name.to_owned(),
                    source,
                })?;
            Ok((result, Some(steps)))
        })
        .await
    }

    /// [`Run::step`] for work that can fail: only a success is recorded.
    /// `Ok(value)` is recorded and returned as a step's result is (a
    /// resumed run gets it back without running `work`); `Err(error)` is
    /// returned and **not** recorded, so the step is not taken: the run
    /// may try it again (in a loop, or on the client's retry, which
    /// resumes from the steps before it). For a call to another system
    /// whose failures are passing (a PSP answering 503), with the step's
    /// [`Run::derived_key`] sent along so that a try that did land runs
    /// once there.
    ///
    /// The outer `Result` is the step's own error, as for [`Run::step`];
    /// the inner one is `work`'s.
    ///
    /// # Errors
    ///
    /// As [`Run::step`].
    pub async fn try_step<T, E, F, Fut>(
        &self,
        name: &str,
        work: F,
    ) -> Result<Result<T, E>, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let tried: Tried<T, E> = self
            .take_step(name, None, |steps| async move {
                match work().await {
                    Ok(value) => {
                        let steps = steps.with(&value)?;
                        self.inner.record(steps.clone()).await.map_err(|source| {
                            StepError::Record {
                                name: name.to_owned(),
                                source,
                            }
                        })?;
                        Ok((Tried(Ok(value)), Some(steps)))
                    }
                    Err(error) => Ok((Tried(Err(error)), None)),
                }
            })
            .await?;
        Ok(tried.0)
    }

    /// Takes the step `name` in order: its recorded result, when the run
    /// being resumed recorded it, else what `execute` returns (the result,
    /// and the steps it recorded, given what to append to; `None` when it
    /// recorded nothing: the step is not taken, the next one asked for
    /// takes its place).
    pub(super) async fn take_step<T, E, Fut>(
        &self,
        name: &str,
        input: Option<String>,
        execute: E,
    ) -> Result<T, StepError>
    where
        T: DeserializeOwned,
        E: FnOnce(NextStep) -> Fut,
        Fut: Future<Output = Result<(T, Option<Vec<Step>>), StepError>>,
    {
        let Ok(mut log) = self.inner.log().try_lock() else {
            return Err(StepError::Overlapping {
                name: name.to_owned(),
            });
        };
        let index = log.next;
        if let Some(recorded) = log.steps.get(index) {
            if recorded.name != name || recorded.input != input {
                return Err(StepError::Mismatch {
                    index,
                    recorded: describe(&recorded.name, recorded.input.as_deref()),
                    asked: describe(name, input.as_deref()),
                });
            }
            let value = T::deserialize(&recorded.value).map_err(|source| StepError::Decode {
                name: name.to_owned(),
                source,
            })?;
            log.next += 1;
            return Ok(value);
        }
        let next = NextStep {
            before: log.steps.clone(),
            name: name.to_owned(),
            input,
        };
        let (result, steps) = execute(next).await?;
        if let Some(steps) = steps {
            log.steps = steps;
            log.next += 1;
            if let Some(slot) = self.inner.slot() {
                slot.note_steps();
            }
        }
        Ok(result)
    }

    /// Runs `work` as the step `name` on the run's database transaction
    /// (transactional mode, PostgreSQL): `work` writes through the [`Tx`](crate::Tx)
    /// it is given, and the step's result is recorded by an `UPDATE` in
    /// that same transaction, fenced by the run's lease, which then
    /// commits. The step's writes and its record commit together or not
    /// at all: a local step is **exactly once**. A crash before the commit
    /// leaves neither (the step runs again when the run resumes); after
    /// it, a resumed run gets the recorded result and the writes are there
    /// once.
    ///
    /// Each transactional step is a phase of its own: the run's
    /// transaction is cut at the step (what follows it begins anew).
    /// Writes through the run's own `Tx` ([`Run::tx`], the axum extractor)
    /// belong after the last step, where they commit with the stored
    /// answer: a transactional step asked for while the run's transaction
    /// holds such writes is refused ([`StepError::Unsupported`], nothing
    /// runs), as they would commit with the step and run again on a
    /// resume. In single-commit mode the run has one transaction: the step
    /// is a savepoint in it, its record is written there too, and all of
    /// it commits once, with the answer (nothing is ever resumed there).
    ///
    /// The result is recorded whatever it is: to undo the step's writes,
    /// let a statement fail (the transaction is then aborted, the record
    /// cannot be written, and the step returns [`StepError::Record`]).
    /// Drop the `Tx` before `work`'s future ends.
    ///
    /// # Errors
    ///
    /// As [`Run::step`]; [`StepError::Unsupported`] outside transactional
    /// mode, while the run's `Tx` is held, or after writes through it that
    /// no step holds.
    #[cfg(feature = "postgres")]
    pub async fn step_tx<T, F, Fut>(&self, name: &str, work: F) -> Result<T, StepError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(crate::Tx) -> Fut,
        Fut: Future<Output = T>,
    {
        use super::transaction::{StepRefused, TxRejection};
        let (Some(slot), Some(lease)) = (self.inner.slot(), self.inner.lease()) else {
            return Err(StepError::Unsupported(
                "a transactional step outside transactional mode",
            ));
        };
        self.take_step(name, None, |next| async move {
            let tx = slot.begin_step().await.map_err(|refused| match refused {
                StepRefused::WritesOutsideSteps => StepError::Unsupported(
                    "a transactional step after writes through the run's Tx that no step holds \
                     (make them a step, or write them after the last step)",
                ),
                StepRefused::Tx(TxRejection::Mark(source)) => StepError::Record {
                    name: next.name().to_owned(),
                    source,
                },
                StepRefused::Tx(TxRejection::Begin(error)) => StepError::Record {
                    name: next.name().to_owned(),
                    source: error.into(),
                },
                StepRefused::Tx(_) => {
                    StepError::Unsupported("a transactional step while the run's Tx is held")
                }
            })?;
            let result = work(tx).await;
            let name = next.name().to_owned();
            let steps = match next.with(&result) {
                Ok(steps) => steps,
                Err(error) => {
                    slot.abort_step().await;
                    return Err(error);
                }
            };
            slot.commit_step(lease, &steps)
                .await
                .map_err(|source| StepError::Record { name, source })?;
            Ok((result, Some(steps)))
        })
        .await
    }

    /// The run's own transaction (transactional mode), for writes after
    /// the last step: they commit with the stored answer. Begun on first
    /// use, as the axum [`Tx`](crate::Tx) extractor begins it; after a
    /// transactional step ([`Run::step_tx`]), a new one.
    ///
    /// # Errors
    ///
    /// [`TxRejection`](crate::transaction::TxRejection) as for the extractor.
    #[cfg(feature = "postgres")]
    pub async fn tx(&self) -> Result<crate::Tx, super::transaction::TxRejection> {
        match self.inner.slot() {
            Some(slot) => slot.tx().await,
            None => Err(super::transaction::TxRejection::NotTransactional),
        }
    }

    /// A key derived from the run's scope and key and `step`: the same for
    /// every run of this key (a resumed one included), another for another
    /// step, key or scope. Pass it to the system the step calls (as its
    /// `Idempotency-Key`, a PSP's idempotency key, a message id), so that a
    /// step that runs again after a crash runs once there.
    ///
    /// It is 64 lowercase hex characters (a SHA-256), valid as an
    /// `Idempotency-Key` anywhere; it reveals neither the key nor the scope.
    pub fn derived_key(&self, step: &str) -> IdempotencyKey {
        let (scope, key) = self.inner.names();
        derived_key(scope, key, step)
    }
}

/// A tried step's outcome ([`Run::try_step`]): only a success is ever
/// recorded, so a recorded one reads back as `Ok`.
struct Tried<T, E>(Result<T, E>);

impl<'de, T: serde::Deserialize<'de>, E> serde::Deserialize<'de> for Tried<T, E> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(|value| Self(Ok(value)))
    }
}

/// The step a run is about to record: the steps before it, its name and
/// its input's hash.
pub(super) struct NextStep {
    before: Vec<Step>,
    name: String,
    input: Option<String>,
}

impl NextStep {
    /// The step's name.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The whole list once the step returned `result`.
    ///
    /// # Errors
    ///
    /// [`StepError::Encode`] when `result` does not serialize.
    pub(super) fn with<T: Serialize>(self, result: &T) -> Result<Vec<Step>, StepError> {
        let value = serde_json::to_value(result).map_err(|source| StepError::Encode {
            name: self.name.clone(),
            source,
        })?;
        let mut steps = self.before;
        steps.push(Step {
            name: self.name,
            input: self.input,
            value,
        });
        Ok(steps)
    }
}

/// The derived key of `step` of `(scope, key)`: the SHA-256 of the three,
/// each length-prefixed (no two triples share an encoding), in hex.
pub(crate) fn derived_key(scope: &Scope, key: &IdempotencyKey, step: &str) -> IdempotencyKey {
    let mut hasher = Sha256::new();
    hasher.update(b"idempotency-guard step key v1");
    for part in [scope.as_str(), key.as_str(), step] {
        hasher.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    IdempotencyKey::from_hex(hex(&hasher.finalize()))
}

/// Lowercase hex.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A step as an error shows it: its name, and its input hash if any.
fn describe(name: &str, input: Option<&str>) -> String {
    match input {
        Some(input) => format!("{name} (input {})", &input[..input.len().min(12)]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_key_is_stable_hex_and_differs_by_scope_key_and_step() {
        let scope = Scope::new("tenant-a").unwrap();
        let key = IdempotencyKey::from_raw("order-42").unwrap();
        let charge = derived_key(&scope, &key, "charge");
        assert_eq!(charge, derived_key(&scope, &key, "charge"));
        assert_eq!(charge.as_str().len(), 64);
        assert!(IdempotencyKey::from_raw(charge.as_str()).is_ok());
        assert_ne!(charge, derived_key(&scope, &key, "reserve"));
        let other_key = IdempotencyKey::from_raw("order-43").unwrap();
        assert_ne!(charge, derived_key(&scope, &other_key, "charge"));
        let other_scope = Scope::new("tenant-b").unwrap();
        assert_ne!(charge, derived_key(&other_scope, &key, "charge"));
        // Length prefixes: moving a character between parts changes it.
        let ab = Scope::new("ab").unwrap();
        let a = Scope::new("a").unwrap();
        let c = IdempotencyKey::from_raw("c").unwrap();
        let bc = IdempotencyKey::from_raw("bc").unwrap();
        assert_ne!(derived_key(&ab, &c, "s"), derived_key(&a, &bc, "s"));
    }
}
