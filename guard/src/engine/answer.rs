//! What the engine and the work tell each other: how the work ended
//! ([`Settle`]), what became of its outcome ([`Settled`]), why it did not
//! run ([`Refusal`]) and the caller's [`Answer`].
//!
//! # Glossary: the "what happened" types
//!
//! One name per idea; every adapter (the axum layer, gRPC, JSON-RPC, the
//! consumers, the webhook receivers, the gateway) uses these and declares
//! no copy of them.
//!
//! | type | who says it | what it says |
//! |---|---|---|
//! | `decision::Decision` | the pure policy | on an existing record: replay, refuse, wait or take over |
//! | `claim::Acquired` (private) | the claim step | this run holds the lease, or answer now, or the store failed |
//! | [`Settle`] | the work | keep this outcome (complete), release the key, or abandon it |
//! | `Settle<(), ()>` | an adapter's pure classifier (the axum layer's `classify`, `idempotency_grpc::outcome::settle`, JSON-RPC's rule) | the same three cases from an answer's head, before its body is read |
//! | `Settle<(), &StoredResponse>` | the engine's settle step | what it writes (a cut-off run is abandoned as [`Settle::Abandon`]) |
//! | [`Settled`] | the engine | what became of a run's outcome (stored, released, abandoned, not stored, unguarded) |
//! | [`Refusal`] | the engine and every adapter | why the work did not run (or cannot be vouched for): the one refusal vocabulary, declared in `refusal.rs` |
//! | [`Answer`] | the engine | the caller's answer: ran, replay, refused (the only `Answer`: every adapter renders this one) |
//! | [`crate::telemetry::Outcome`] | [`Answer::outcome`] | the metrics label, one per answer (the only `Outcome`) |
//! | `Verdict` | the consumer crate | what a broker is told: ack, redeliver, retry, dead-letter, park (the only `Verdict`) |
//! | `Exchange` | the gateway crate | how a forwarded request ended upstream |

use crate::record::StoredResponse;
pub use crate::refusal::Refusal;
use crate::telemetry::Outcome;

/// How the work ended, as the work tells the engine: keep its outcome
/// (complete), release the key, or abandon it.
///
/// `R` is what is kept: the engine stores a [`StoredResponse`]; an adapter
/// may settle in its own terms first (a gRPC answer too large to keep, a
/// JSON-RPC response and its form) and turn that into one. `Settle<(), ()>`
/// is the bare decision a classifier makes from an answer's head, before
/// its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle<T, R = StoredResponse> {
    /// Keep `response` as the key's outcome (replayed to every later
    /// caller); hand `reply` to this caller.
    Complete {
        /// The outcome to store.
        response: R,
        /// What this caller gets.
        reply: T,
    },
    /// Keep nothing: release the key, so a retry runs the work again.
    Release {
        /// What this caller gets.
        reply: T,
        /// In transactional mode, whether the work's writes commit (a
        /// success that is not to be stored) or roll back (a failure).
        keep_writes: bool,
    },
    /// The work's outcome is unknown (it handed the job to something that
    /// went silent after receiving it: an upstream reset mid-request, a
    /// timeout): end the lease so the key is abandoned, answered
    /// `outcome-unknown` and never run again blindly. In transactional mode
    /// the work's writes roll back and the key is released instead.
    Abandon {
        /// What this caller gets.
        reply: T,
    },
}

impl<T, R> Settle<T, R> {
    /// The same ending with what is kept turned by `f` (how an adapter
    /// turns its own terms into a [`StoredResponse`]).
    pub fn map_response<U>(self, f: impl FnOnce(R) -> U) -> Settle<T, U> {
        match self {
            Self::Complete { response, reply } => Settle::Complete {
                response: f(response),
                reply,
            },
            Self::Release { reply, keep_writes } => Settle::Release { reply, keep_writes },
            Self::Abandon { reply } => Settle::Abandon { reply },
        }
    }

    /// The same ending with the reply turned by `f` (how a classifier's
    /// bare decision, `Settle<(), R>`, gets the caller's reply).
    pub fn map_reply<U>(self, f: impl FnOnce(T) -> U) -> Settle<U, R> {
        match self {
            Self::Complete { response, reply } => Settle::Complete {
                response,
                reply: f(reply),
            },
            Self::Release { reply, keep_writes } => Settle::Release {
                reply: f(reply),
                keep_writes,
            },
            Self::Abandon { reply } => Settle::Abandon { reply: f(reply) },
        }
    }

    /// The reply this caller gets, whatever the ending.
    pub fn into_reply(self) -> T {
        match self {
            Self::Complete { reply, .. }
            | Self::Release { reply, .. }
            | Self::Abandon { reply } => reply,
        }
    }
}

impl Settle<(), ()> {
    /// The bare decision "keep this outcome": what an adapter's classifier
    /// says of an answer to store (declared once for every adapter).
    pub const KEEP: Self = Settle::Complete {
        response: (),
        reply: (),
    };

    /// The bare decision "release the key" (the work's writes roll back in
    /// transactional mode): what an adapter's classifier says of an answer
    /// a retry must be able to change.
    pub const RELEASE: Self = Settle::Release {
        reply: (),
        keep_writes: false,
    };

    /// The bare decision "abandon the key": the outcome is unknown.
    pub const ABANDON: Self = Settle::Abandon { reply: () };
}

/// What became of the outcome of work that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The outcome was stored: later callers get it replayed.
    Stored,
    /// The key was released: a retry runs the work again.
    Released,
    /// The work said its outcome is unknown: the key is abandoned.
    Abandoned,
    /// The work ran but its outcome could not be stored (the store failed):
    /// later callers see the run as abandoned.
    NotStored,
    /// The store was down and the engine fails open: the work ran unguarded.
    Unguarded,
}

/// The engine's answer to one [`Engine::run`](crate::Engine::run).
#[derive(Debug)]
pub enum Answer<T> {
    /// The work ran for this caller.
    Ran {
        /// What the work handed back.
        reply: T,
        /// What became of its outcome.
        settled: Settled,
    },
    /// The work ran before: its stored outcome.
    Replay(StoredResponse),
    /// The work did not run for this caller.
    Refused(Refusal),
}

impl<T> Answer<T> {
    /// The metrics outcome of this answer (the `outcome` label).
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Ran { settled, .. } => match settled {
                Settled::Stored | Settled::NotStored => Outcome::Executed,
                Settled::Released => Outcome::Released,
                Settled::Abandoned => Outcome::Abandoned,
                Settled::Unguarded => Outcome::StoreUnavailable,
            },
            Self::Replay(_) => Outcome::Replayed,
            Self::Refused(refusal) => match refusal {
                Refusal::KeyReused { .. } => Outcome::KeyReused,
                Refusal::RequestInFlight { .. } => Outcome::InFlight,
                Refusal::OutcomeUnknown { .. } | Refusal::ResponseNotStored { .. } => {
                    Outcome::Rejected
                }
                Refusal::StoreUnavailable { .. } => Outcome::StoreUnavailable,
                Refusal::HandlerTimeout {
                    rolled_back: true, ..
                }
                | Refusal::HandlerFailed { .. } => Outcome::Released,
                Refusal::HandlerTimeout {
                    rolled_back: false, ..
                } => Outcome::Abandoned,
                // An adapter's own refusals, before the engine ran anything.
                Refusal::KeyMissing
                | Refusal::KeyInvalid(_)
                | Refusal::ScopeInvalid
                | Refusal::BodyTooLarge { .. }
                | Refusal::BodyUnreadable
                | Refusal::BodyBufferFull { .. }
                | Refusal::BatchNotGuarded
                | Refusal::LayerMissing
                | Refusal::TransactionUnavailable => Outcome::Rejected,
            },
        }
    }
}
