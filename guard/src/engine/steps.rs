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
    /// This run cannot record steps (transactional mode, not yet). Nothing
    /// ran.
    #[error("steps cannot be recorded here: {0}")]
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
    /// Why this run records nothing, if it cannot.
    fn unsupported(&self) -> Option<&'static str>;
    /// Stores the whole list, fenced by the run's lease (nothing when the
    /// run is unguarded).
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
    unsupported: Option<&'static str>,
    log: tokio::sync::Mutex<Log>,
}

impl<S: Store> Steps for EngineSteps<S> {
    fn names(&self) -> (&Scope, &IdempotencyKey) {
        (&self.scope, &self.key)
    }

    fn log(&self) -> &tokio::sync::Mutex<Log> {
        &self.log
    }

    fn unsupported(&self) -> Option<&'static str> {
        self.unsupported
    }

    fn record(&self, steps: Vec<Step>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let Some(lease) = &self.lease else {
                return Ok(());
            };
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
    /// `recorded` steps.
    pub(super) fn new<S: Store>(
        engine: &Engine<S>,
        scope: Scope,
        key: IdempotencyKey,
        lease: Option<Arc<Lease>>,
        recorded: Vec<Step>,
        unsupported: Option<&'static str>,
    ) -> Self {
        Self {
            inner: Arc::new(EngineSteps {
                engine: engine.clone(),
                scope,
                key,
                lease,
                unsupported,
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
        if let Some(why) = self.inner.unsupported() {
            return Err(StepError::Unsupported(why));
        }
        let result = work().await;
        let value = serde_json::to_value(&result).map_err(|source| StepError::Encode {
            name: name.to_owned(),
            source,
        })?;
        let mut steps = log.steps.clone();
        steps.push(Step {
            name: name.to_owned(),
            input,
            value,
        });
        self.inner
            .record(steps.clone())
            .await
            .map_err(|source| StepError::Record {
                name: name.to_owned(),
                source,
            })?;
        log.steps = steps;
        log.next += 1;
        Ok(result)
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
