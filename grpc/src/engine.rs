//! The adapter's one touchpoint with the guard's engine: a call becomes a
//! [`Job`], the work settles with the engine's own [`Settle`] (keeping an
//! `Option<StoredResponse>`: `None` when the answer was too large to
//! keep), and the engine's answer becomes an [`Answer`] in this crate's
//! terms (its refusal a [`GrpcRefusal`]).

use std::future::Future;

use futures_util::FutureExt;
use idempotency_guard::engine::{self as guard, Job, Refusal, RunContext, Settle};
use idempotency_guard::telemetry::Outcome;
use idempotency_guard::{Engine, Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};

use crate::refusal::GrpcRefusal;

/// What identifies one guarded call.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    /// The scope (a tenant, a principal).
    pub(crate) scope: Scope,
    /// The idempotency key, validated.
    pub(crate) key: IdempotencyKey,
    /// The full method name, `/pkg.Service/Method`.
    pub(crate) method: &'a str,
    /// The request message as it came (for a layer: the length-prefixed
    /// frames of the body; for a typed handler: the encoded message).
    pub(crate) message: &'a [u8],
}

/// The engine's [`guard::Answer`] to one call, its refusal in gRPC terms.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// The work ran for this caller.
    Ran(T),
    /// The work ran before: its stored outcome.
    Replay(StoredResponse),
    /// The work did not run for this caller (or was cut off).
    Refused(GrpcRefusal),
}

/// The fingerprint of a call: SHA-256 over the full method name, a zero
/// byte and the request message bytes.
pub(crate) fn fingerprint(method: &str, message: &[u8]) -> Fingerprint {
    let mut input = Vec::with_capacity(method.len() + 1 + message.len());
    input.extend_from_slice(method.as_bytes());
    input.push(0);
    input.extend_from_slice(message);
    Fingerprint::of_bytes(&input)
}

/// Runs `work` at most once for `call`'s key on `engine` (handing it the
/// run's context: its transaction in transactional mode); answers with
/// how it ended and the `outcome` label of the guard's metrics. The work
/// keeps `None` for an answer too large to keep: the key is completed
/// without a body, so replays answer `response-not-stored`.
///
/// The record shows method `POST` (gRPC's HTTP method) and the full method
/// name as its path, so the key-status service answers for gRPC keys as
/// for HTTP ones.
pub(crate) fn run<S, F, Fut, T>(
    engine: &Engine<S>,
    call: Call<'_>,
    work: F,
) -> impl Future<Output = (Answer<T>, Outcome)>
where
    S: Store,
    F: FnOnce(RunContext) -> Fut + Send + 'static,
    Fut: Future<Output = Settle<T, Option<StoredResponse>>> + Send + 'static,
    T: Send + 'static,
{
    let key = call.key.as_str().to_owned();
    let job = Job::new(call.scope, call.key, fingerprint(call.method, call.message))
        .with_request("POST", call.method)
        .with_route(call.method);
    engine
        .run(job, move |context| {
            work(context).map(|settle| {
                settle.map_response(|kept| {
                    kept.unwrap_or_else(|| StoredResponse {
                        body: None,
                        ..StoredResponse::from_bytes(bytes::Bytes::new())
                    })
                })
            })
        })
        .map(move |answer| {
            let outcome = answer.outcome();
            let answer = match answer {
                guard::Answer::Ran { reply, .. } => Answer::Ran(reply),
                guard::Answer::Replay(stored) => Answer::Replay(stored),
                guard::Answer::Refused(refusal) => Answer::Refused(refused(refusal, key)),
            };
            (answer, outcome)
        })
}

/// The gRPC answer for an engine's refusal of the call with `key`.
fn refused(refusal: Refusal, key: String) -> GrpcRefusal {
    match refusal {
        Refusal::KeyReused => GrpcRefusal::KeyReused { key },
        Refusal::InFlight { retry_after } => GrpcRefusal::InFlight { key, retry_after },
        Refusal::OutcomeUnknown => GrpcRefusal::OutcomeUnknown {
            key,
            cut_off: false,
        },
        Refusal::ResponseNotStored => GrpcRefusal::ResponseNotStored { key },
        Refusal::StoreUnavailable { retry_after } => {
            GrpcRefusal::StoreUnavailable { key, retry_after }
        }
        Refusal::TimedOut { rolled_back: false } => {
            GrpcRefusal::OutcomeUnknown { key, cut_off: true }
        }
        Refusal::TimedOut { rolled_back: true } => GrpcRefusal::TimedOutRolledBack { key },
        Refusal::Failed => GrpcRefusal::HandlerFailed { key },
        // A refusal added later: the safe side is "do not retry blindly".
        _ => GrpcRefusal::OutcomeUnknown {
            key,
            cut_off: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_engine_refusals_map_to_the_grpc_refusals() {
        let d = Duration::from_secs(1);
        let k = || String::from("k");
        let rows = [
            (Refusal::KeyReused, GrpcRefusal::KeyReused { key: k() }),
            (
                Refusal::InFlight { retry_after: d },
                GrpcRefusal::InFlight {
                    key: k(),
                    retry_after: d,
                },
            ),
            (
                Refusal::OutcomeUnknown,
                GrpcRefusal::OutcomeUnknown {
                    key: k(),
                    cut_off: false,
                },
            ),
            (
                Refusal::ResponseNotStored,
                GrpcRefusal::ResponseNotStored { key: k() },
            ),
            (
                Refusal::StoreUnavailable { retry_after: d },
                GrpcRefusal::StoreUnavailable {
                    key: k(),
                    retry_after: d,
                },
            ),
            // The guard's own bound: outcome unknown, as on HTTP.
            (
                Refusal::TimedOut { rolled_back: false },
                GrpcRefusal::OutcomeUnknown {
                    key: k(),
                    cut_off: true,
                },
            ),
            (
                Refusal::TimedOut { rolled_back: true },
                GrpcRefusal::TimedOutRolledBack { key: k() },
            ),
            (Refusal::Failed, GrpcRefusal::HandlerFailed { key: k() }),
        ];
        for (refusal, expected) in rows {
            assert_eq!(refused(refusal, k()), expected);
        }
    }

    #[test]
    fn the_fingerprint_covers_the_method_and_the_message() {
        let a = fingerprint("/p.S/A", b"m");
        assert_eq!(a, fingerprint("/p.S/A", b"m"));
        assert_ne!(a, fingerprint("/p.S/B", b"m"));
        assert_ne!(a, fingerprint("/p.S/A", b"n"));
        // The separator keeps "method + message" splits apart.
        assert_ne!(fingerprint("/p.S/A", b"Bm"), fingerprint("/p.S/AB", b"m"));
    }
}
