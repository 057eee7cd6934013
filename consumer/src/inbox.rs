//! The broker-independent core: one message in, the engine runs its handler
//! at most once per key, and one [`Verdict`] out that the broker adapter
//! turns into an ack, a delayed redelivery, a parked or a dead-lettered
//! message.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idempotency_guard::AbandonedPolicy;
use idempotency_guard::engine::{Answer, Engine, Job, Refusal, RunContext, Settle, Settled};
use idempotency_guard::{Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};
use tokio::sync::Semaphore;

use crate::local::{Entry, LocalRuns};

/// The metric counting every message by its verdict (`source`, `verdict`).
pub const MESSAGES_TOTAL: &str = "idempotency_consumer_messages_total";

/// One message as the handler sees it.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The queue or stream it came from.
    pub source: String,
    /// The scope its key lives in.
    pub scope: String,
    /// Its idempotency key.
    pub key: String,
    /// Its payload.
    pub payload: Bytes,
    /// Which delivery this is for a failing message (1 on the first try).
    pub attempt: u32,
}

/// What the adapter does with a message after the engine answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Done (it ran now, or ran before and its outcome is stored): ack.
    Ack,
    /// Not done yet: have it delivered again after `delay`, without acking.
    /// `failed` tells whether this delivery counts as a failed attempt (the
    /// handler failed) or not (the key is in flight elsewhere, the store is
    /// down).
    Redeliver {
        /// How long to hold it back.
        delay: Duration,
        /// Whether the handler failed on it.
        failed: bool,
    },
    /// Its outcome is unknown (an earlier run was abandoned) or its key was
    /// reused for another payload: set it aside for a person and ack it.
    /// Never run again blindly.
    Park(ParkReason),
    /// It failed on every one of its attempts, or carries no usable key:
    /// move it to the dead-letter queue and ack it. Its key was released.
    DeadLetter(DeadReason),
}

/// Why a message was parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParkReason {
    /// An earlier run of the key was abandoned: its effects are unknown.
    OutcomeUnknown,
    /// The key was used before for another payload.
    KeyReused,
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// The handler failed on every attempt.
    Poison,
    /// The message carries no key (or one that is not 1 to 255 visible ASCII).
    NoKey,
    /// The message's scope cannot be stored (empty, over 255 bytes, or a
    /// control character): no redelivery would ever run it.
    ScopeInvalid,
}

impl Verdict {
    /// The `verdict` label of [`MESSAGES_TOTAL`].
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Redeliver { failed: false, .. } => "redeliver",
            Self::Redeliver { failed: true, .. } => "retry",
            Self::Park(ParkReason::OutcomeUnknown) => "parked-outcome-unknown",
            Self::Park(ParkReason::KeyReused) => "parked-key-reused",
            Self::DeadLetter(DeadReason::Poison) => "dead-letter",
            Self::DeadLetter(DeadReason::NoKey) => "dead-letter-no-key",
            Self::DeadLetter(DeadReason::ScopeInvalid) => "dead-letter-scope-invalid",
        }
    }

    /// The reason written on a parked or dead-lettered message.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Park(ParkReason::OutcomeUnknown) => "outcome-unknown",
            Self::Park(ParkReason::KeyReused) => "key-reused",
            Self::DeadLetter(DeadReason::Poison) => "poison",
            Self::DeadLetter(DeadReason::NoKey) => "no-key",
            Self::DeadLetter(DeadReason::ScopeInvalid) => "scope-invalid",
            Self::Ack | Self::Redeliver { .. } => "",
        }
    }
}

/// What the engine made of one message, reduced to what the verdict needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// The handler succeeded now, or had before (replayed), or its run is
    /// beyond doing again (a stored outcome too large): done.
    Done,
    /// The handler failed (an error, a panic, a cut-off whose writes rolled
    /// back); the key was released.
    Failed,
    /// The key is held by a run elsewhere, or the store is down: not now.
    NotNow(Duration),
    /// The outcome of an earlier run (or of this one) is unknown.
    Unknown,
    /// This run was abandoned with its recorded steps kept (it failed
    /// after a step), and the engine resumes abandoned runs: a copy sent
    /// back resumes it from its steps.
    Resumable,
    /// The key was used for another payload.
    Reused,
}

impl Ran {
    /// What `answer` says, given whether the engine resumes abandoned
    /// runs (`resumes`).
    fn of<T>(answer: &Answer<Result<(), T>>, resumes: bool) -> Self {
        match answer {
            Answer::Ran { settled, reply } => match (settled, reply) {
                (Settled::Abandoned, _) if resumes => Self::Resumable,
                (Settled::Abandoned, _) => Self::Unknown,
                (_, Err(_)) => Self::Failed,
                (_, Ok(())) => Self::Done,
            },
            Answer::Replay(_) => Self::Done,
            Answer::Refused(refusal) => match refusal {
                Refusal::KeyReused { .. } => Self::Reused,
                Refusal::RequestInFlight { retry_after, .. }
                | Refusal::StoreUnavailable { retry_after, .. }
                | Refusal::BodyBufferFull { retry_after, .. } => Self::NotNow(*retry_after),
                Refusal::OutcomeUnknown { .. }
                | Refusal::HandlerTimeout {
                    rolled_back: false, ..
                } => Self::Unknown,
                Refusal::ResponseNotStored { .. } => Self::Done,
                Refusal::HandlerTimeout {
                    rolled_back: true, ..
                }
                | Refusal::HandlerFailed { .. } => Self::Failed,
                // A request's own refusals, which the engine never gives a
                // message (the inbox reads its key and scope itself): were
                // one to come, the message is not fit to run: retried, then
                // dead-lettered as poison.
                Refusal::KeyMissing
                | Refusal::KeyInvalid(_)
                | Refusal::ScopeInvalid
                | Refusal::BodyTooLarge { .. }
                | Refusal::BodyUnreadable
                | Refusal::BatchNotGuarded
                | Refusal::LayerMissing
                | Refusal::TransactionUnavailable => Self::Failed,
            },
        }
    }
}

/// The policy, in one pure function: what to do with a message given what
/// the engine made of it, which attempt this was and how many are allowed.
pub(crate) fn decide(ran: Ran, attempt: u32, max_attempts: u32, retry_delay: Duration) -> Verdict {
    match ran {
        Ran::Done => Verdict::Ack,
        Ran::Failed if attempt >= max_attempts => Verdict::DeadLetter(DeadReason::Poison),
        Ran::Failed => Verdict::Redeliver {
            delay: retry_delay,
            failed: true,
        },
        Ran::NotNow(delay) => Verdict::Redeliver {
            delay,
            failed: false,
        },
        // Past its attempts a resumable run waits for a person, as any
        // abandoned one (its steps kept: a release there resumes nothing).
        Ran::Resumable if attempt >= max_attempts => Verdict::Park(ParkReason::OutcomeUnknown),
        Ran::Resumable => Verdict::Redeliver {
            delay: retry_delay,
            failed: true,
        },
        Ran::Unknown => Verdict::Park(ParkReason::OutcomeUnknown),
        Ran::Reused => Verdict::Park(ParkReason::KeyReused),
    }
}

/// The inbox's settings. Each default says why it is the default.
#[derive(Debug, Clone)]
struct InboxConfig {
    /// 5: enough for a transient failure to pass, few enough that a poison
    /// message leaves the queue within seconds.
    max_attempts: u32,
    /// 1 s: a failing handler is not hammered, a transient failure is
    /// retried soon.
    retry_delay: Duration,
    /// 60 s (the engine's default lease): past it a twin running here is
    /// hung, and the copy asks the store like any other.
    twin_wait: Duration,
}

impl Default for InboxConfig {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            retry_delay: Duration::from_secs(1),
            twin_wait: Duration::from_secs(60),
        }
    }
}

/// The run-once engine plus the message policy: each message runs its
/// handler at most once per key, and gets a [`Verdict`].
///
/// With an engine in transactional mode (PostgreSQL,
/// [`Engine::with_transactional_mode`] and
/// [`Engine::with_transactional_claims`]) this is a transactional inbox:
/// the handler writes through [`RunContext::tx`], and its writes, the
/// stored outcome and the dedup record commit together.
///
/// A copy of a message whose twin runs in this process (on any clone of
/// the inbox) waits for the twin's end, woken when it ends, and is then
/// answered from the stored outcome; it holds no handler slot meanwhile.
#[derive(Debug, Clone)]
pub struct Inbox<S> {
    engine: Engine<S>,
    config: Arc<InboxConfig>,
    local: Arc<LocalRuns>,
}

impl<S: Store> Inbox<S> {
    /// An inbox over an engine, with every setting at its default.
    pub fn new(engine: Engine<S>) -> Self {
        Self {
            engine,
            config: Arc::new(InboxConfig::default()),
            local: Arc::default(),
        }
    }

    /// The engine the inbox runs handlers through (for its [`idempotency_guard::Drain`]).
    pub fn engine(&self) -> &Engine<S> {
        &self.engine
    }

    /// Sets how many deliveries a failing message gets before it is
    /// dead-lettered.
    ///
    /// The default value is 5.
    ///
    /// # Panics
    ///
    /// When `attempts` is 0.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        assert!(attempts > 0, "a message needs at least one attempt");
        Arc::make_mut(&mut self.config).max_attempts = attempts;
        self
    }

    /// Sets how long a failed message is held back before its next attempt.
    ///
    /// The default value is 1 second.
    pub fn with_retry_delay(mut self, delay: Duration) -> Self {
        Arc::make_mut(&mut self.config).retry_delay = delay;
        self
    }

    /// Sets how long a copy waits for its twin running in this process
    /// before it asks the store like any other copy (which answers "in
    /// flight" while the twin runs).
    ///
    /// The default value is 60 seconds (the engine's default lease).
    pub fn with_twin_wait(mut self, wait: Duration) -> Self {
        Arc::make_mut(&mut self.config).twin_wait = wait;
        self
    }

    /// The verdict for a message without a usable key (counted).
    pub(crate) fn no_key(&self, source: &str) -> Verdict {
        let verdict = Verdict::DeadLetter(DeadReason::NoKey);
        count(source, verdict);
        verdict
    }

    /// Runs `handler` on `incoming` at most once for its key, and answers
    /// what to do with the message (counted in [`MESSAGES_TOTAL`]).
    pub async fn process<H, Fut, E>(&self, incoming: Incoming, handler: &Arc<H>) -> Verdict
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        self.process_with(incoming, handler, None).await
    }

    /// [`Inbox::process`], holding one of `permits` (the adapter's handler
    /// slots) only while the engine runs: never while the copy waits for
    /// its twin running here.
    pub(crate) async fn process_with<H, Fut, E>(
        &self,
        incoming: Incoming,
        handler: &Arc<H>,
        permits: Option<&Semaphore>,
    ) -> Verdict
    where
        H: Fn(Incoming, RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let source = incoming.source.clone();
        let Ok(key) = IdempotencyKey::from_raw(&incoming.key) else {
            return self.no_key(&source);
        };
        let Ok(scope) = Scope::new(incoming.scope.as_str()) else {
            let verdict = Verdict::DeadLetter(DeadReason::ScopeInvalid);
            count(&source, verdict);
            return verdict;
        };
        // Held until this copy's run has settled: a copy behind it waits.
        let _running_here = loop {
            match self.local.enter(&incoming.scope, &incoming.key) {
                Entry::Mine(here) => break Some(here),
                Entry::Twin(twin) => {
                    if tokio::time::timeout(self.config.twin_wait, twin.ended())
                        .await
                        .is_err()
                    {
                        // Hung: ask the store, which answers "in flight".
                        break None;
                    }
                }
            }
        };
        let _permit = match permits {
            Some(permits) => permits.acquire().await.ok(),
            None => None,
        };
        let attempt = incoming.attempt;
        let job = Job::new(scope, key, Fingerprint::of_bytes(&incoming.payload))
            .with_request("MESSAGE", incoming.source.clone())
            .with_route(incoming.source.clone());
        let handler = Arc::clone(handler);
        let answer = self
            .engine
            .run(job, move |run| async move {
                match handler(incoming, run).await {
                    Ok(()) => Settle::Complete {
                        response: StoredResponse::from_bytes("done"),
                        reply: Ok(()),
                    },
                    Err(error) => Settle::Release {
                        reply: Err(error.to_string()),
                        keep_writes: false,
                    },
                }
            })
            .await;
        if let Answer::Ran {
            reply: Err(error), ..
        } = &answer
        {
            tracing::warn!(source, attempt, error = %error, "the message handler failed; its key is released");
        }
        let resumes = matches!(self.engine.abandoned_policy(), AbandonedPolicy::Resume);
        let verdict = decide(
            Ran::of(&answer, resumes),
            attempt,
            self.config.max_attempts,
            self.config.retry_delay,
        );
        count(&source, verdict);
        verdict
    }
}

/// Counts one message's verdict: the one place messages are counted.
fn count(source: &str, verdict: Verdict) {
    metrics::counter!(MESSAGES_TOTAL, "source" => source.to_owned(), "verdict" => verdict.as_str())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(1);
    const W: Duration = Duration::from_millis(300);

    fn key() -> idempotency_guard::IdempotencyKey {
        idempotency_guard::IdempotencyKey::from_raw("k").expect("a key")
    }

    #[test]
    fn the_policy_as_a_truth_table() {
        let rows = [
            // ran, attempt, max => verdict
            (Ran::Done, 1, 3, Verdict::Ack),
            (Ran::Done, 3, 3, Verdict::Ack),
            (
                Ran::Failed,
                1,
                3,
                Verdict::Redeliver {
                    delay: D,
                    failed: true,
                },
            ),
            (
                Ran::Failed,
                2,
                3,
                Verdict::Redeliver {
                    delay: D,
                    failed: true,
                },
            ),
            (Ran::Failed, 3, 3, Verdict::DeadLetter(DeadReason::Poison)),
            (Ran::Failed, 9, 3, Verdict::DeadLetter(DeadReason::Poison)),
            (Ran::Failed, 1, 1, Verdict::DeadLetter(DeadReason::Poison)),
            (
                Ran::NotNow(W),
                1,
                3,
                Verdict::Redeliver {
                    delay: W,
                    failed: false,
                },
            ),
            (
                Ran::NotNow(W),
                3,
                3,
                Verdict::Redeliver {
                    delay: W,
                    failed: false,
                },
            ),
            (
                Ran::Unknown,
                1,
                3,
                Verdict::Park(ParkReason::OutcomeUnknown),
            ),
            (
                Ran::Unknown,
                3,
                3,
                Verdict::Park(ParkReason::OutcomeUnknown),
            ),
            (Ran::Reused, 1, 3, Verdict::Park(ParkReason::KeyReused)),
            (
                Ran::Resumable,
                1,
                3,
                Verdict::Redeliver {
                    delay: D,
                    failed: true,
                },
            ),
            (
                Ran::Resumable,
                3,
                3,
                Verdict::Park(ParkReason::OutcomeUnknown),
            ),
        ];
        for (ran, attempt, max, expected) in rows {
            assert_eq!(
                decide(ran, attempt, max, D),
                expected,
                "{ran:?} attempt {attempt}/{max}"
            );
        }
    }

    #[test]
    fn answers_reduce_to_what_the_policy_needs() {
        type A = Answer<Result<(), String>>;
        let rows: Vec<(A, Ran)> = vec![
            (
                A::Ran {
                    reply: Ok(()),
                    settled: Settled::Stored,
                },
                Ran::Done,
            ),
            (
                A::Ran {
                    reply: Ok(()),
                    settled: Settled::NotStored,
                },
                Ran::Done,
            ),
            (
                A::Ran {
                    reply: Err("x".into()),
                    settled: Settled::Released,
                },
                Ran::Failed,
            ),
            (
                A::Ran {
                    reply: Ok(()),
                    settled: Settled::Abandoned,
                },
                Ran::Unknown,
            ),
            (A::Replay(StoredResponse::from_bytes("done")), Ran::Done),
            (A::Refused(Refusal::KeyReused { key: key() }), Ran::Reused),
            (
                A::Refused(Refusal::RequestInFlight {
                    key: key(),
                    retry_after: W,
                }),
                Ran::NotNow(W),
            ),
            (
                A::Refused(Refusal::StoreUnavailable {
                    key: Some(key()),
                    retry_after: W,
                }),
                Ran::NotNow(W),
            ),
            (
                A::Refused(Refusal::OutcomeUnknown { key: key() }),
                Ran::Unknown,
            ),
            (
                A::Refused(Refusal::HandlerTimeout {
                    key: key(),
                    rolled_back: false,
                }),
                Ran::Unknown,
            ),
            (
                A::Refused(Refusal::HandlerTimeout {
                    key: key(),
                    rolled_back: true,
                }),
                Ran::Failed,
            ),
            (
                A::Refused(Refusal::HandlerFailed { key: key() }),
                Ran::Failed,
            ),
            (
                A::Refused(Refusal::ResponseNotStored { key: key() }),
                Ran::Done,
            ),
            (A::Refused(Refusal::KeyMissing), Ran::Failed),
        ];
        for (answer, expected) in rows {
            assert_eq!(Ran::of(&answer, false), expected, "{answer:?}");
        }
        // An engine that resumes sends its own abandoned run back; an
        // earlier run's unknown outcome (a refusal) stays parked.
        let abandoned: A = Answer::Ran {
            settled: Settled::Abandoned,
            reply: Err("failed after a step".to_owned()),
        };
        assert_eq!(Ran::of(&abandoned, true), Ran::Resumable);
        assert_eq!(Ran::of(&abandoned, false), Ran::Unknown);
        let refused: A = A::Refused(Refusal::OutcomeUnknown { key: key() });
        assert_eq!(Ran::of(&refused, true), Ran::Unknown);
    }
}
