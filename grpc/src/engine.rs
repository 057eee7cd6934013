//! The adapter's one touchpoint with the guard's engine: a call becomes a
//! [`Job`], the work settles with the engine's own [`Settle`] (keeping an
//! `Option<StoredResponse>`: `None` when the answer was too large to
//! keep), and the engine's own [`Answer`] comes back (its refusals
//! rendered by [`crate::refusal::to_status`]).

use std::future::Future;

use futures_util::FutureExt;
use idempotency_guard::engine::{Answer, Job, RunContext, Settle};
use idempotency_guard::telemetry::Outcome;
use idempotency_guard::{Engine, Fingerprint, IdempotencyKey, Scope, Store, StoredResponse};

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

/// The fingerprint of a call: SHA-256 over the full method name, a zero
/// byte and the request message bytes.
pub(crate) fn fingerprint(method: &str, message: &[u8]) -> Fingerprint {
    Fingerprint::of_parts(&[method.as_bytes(), &[0], message])
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
        .map(|answer| {
            let outcome = answer.outcome();
            (answer, outcome)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_covers_the_method_and_the_message() {
        let a = fingerprint("/p.S/A", b"m");
        assert_eq!(a, fingerprint("/p.S/A", b"m"));
        assert_ne!(a, fingerprint("/p.S/B", b"m"));
        assert_ne!(a, fingerprint("/p.S/A", b"n"));
        // The separator keeps "method + message" splits apart.
        assert_ne!(fingerprint("/p.S/A", b"Bm"), fingerprint("/p.S/AB", b"m"));
        // The digest of the method, a zero byte and the message joined, as
        // records stored by earlier releases hold it.
        assert_eq!(a, Fingerprint::of_bytes(b"/p.S/A\0m"));
    }
}
