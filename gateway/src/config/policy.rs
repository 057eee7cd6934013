//! `[policy]`: leases, retention, and what to do with in-flight and
//! abandoned keys, as in the layer.

use std::time::Duration;

use http::StatusCode;
use serde::Deserialize;

use super::de;

/// What a request gets while its key's first run is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InFlight {
    /// 409 `request-in-flight` with `Retry-After`.
    Reject,
    /// The first run's answer, replayed when it ends, waiting up to
    /// `in_flight_wait_seconds`.
    Wait,
}

/// What a request gets when its key's run was abandoned (its outcome is
/// unknown: the upstream may have done the work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Abandoned {
    /// 409 `outcome-unknown`: a person or a reconciler decides.
    Reject,
    /// The request runs again (`run-again`), for upstreams that are
    /// idempotent by themselves.
    RunAgain,
}

/// What to do with a request on a guarded method that carries
/// `Idempotency-Key` but matches no guarded route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteNotGuarded {
    /// 400 `route-not-guarded`: a misspelled or missing route never runs
    /// unguarded.
    Refuse,
    /// Forwarded unguarded.
    Pass,
}

/// Leases, retention and policies, as in the layer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The lease a run holds on its key (renewed while it runs); at least
    /// 1 s. TOML: `lease_seconds`.
    #[serde(rename = "lease_seconds", deserialize_with = "de::seconds")]
    pub lease: Duration,
    /// How long records live; more than `max_handler_seconds` plus
    /// `lease_seconds`. TOML: `retention_seconds`.
    #[serde(rename = "retention_seconds", deserialize_with = "de::seconds")]
    pub retention: Duration,
    /// The longest an upstream request may run, its body included. TOML:
    /// `max_handler_seconds`.
    #[serde(rename = "max_handler_seconds", deserialize_with = "de::seconds")]
    pub max_handler_time: Duration,
    /// `reject` or `wait`; see [`InFlight`].
    pub in_flight: InFlight,
    /// The bound of `in_flight = "wait"`. TOML: `in_flight_wait_seconds`.
    #[serde(rename = "in_flight_wait_seconds", deserialize_with = "de::seconds")]
    pub in_flight_wait: Duration,
    /// `reject` or `run-again`; see [`Abandoned`].
    pub abandoned: Abandoned,
    /// The status of `key-reused` answers (409; the IETF draft says 422).
    #[serde(deserialize_with = "de::status")]
    pub mismatch_status: StatusCode,
    /// The `Retry-After` hint of 409 `request-in-flight` and 503 answers.
    /// TOML: `retry_after_seconds`.
    #[serde(rename = "retry_after_seconds", deserialize_with = "de::seconds")]
    pub retry_after: Duration,
    /// Whether the upstream's 400, 413, 415 and 422 are stored like any
    /// answer. The gateway cannot tell a backend's validation error (nothing
    /// done) from a decision it took after working, so it stores them;
    /// `false` releases them (Stripe's rule), for backends that answer
    /// those only before doing anything.
    pub store_client_errors: bool,
    /// `refuse` or `pass`; see [`RouteNotGuarded`].
    pub route_not_guarded: RouteNotGuarded,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            // The engine's defaults (see its `EngineConfig`): long enough
            // that renewals (every third of it) are rare, short enough that
            // a crashed gateway's keys free up within a minute.
            lease: Duration::from_secs(60),
            // As Stripe keeps keys: covers any sane retry schedule.
            retention: Duration::from_secs(24 * 3600),
            // No write should hold a key longer.
            max_handler_time: Duration::from_secs(600),
            // A retry that cannot wait is told to come back.
            in_flight: InFlight::Reject,
            // Well under the usual 30 s client timeout, so the waiting
            // client still gets its answer or a 409.
            in_flight_wait: Duration::from_secs(10),
            // Fail closed: the upstream may have done the work.
            abandoned: Abandoned::Reject,
            // 409 as for every other clash on a key; 422 is the draft's.
            mismatch_status: StatusCode::CONFLICT,
            // The engine's: a second, then the client asks again.
            retry_after: Duration::from_secs(1),
            // The gateway cannot tell a validation error from a decision.
            store_client_errors: true,
            // Fail closed: the client asked for a guard.
            route_not_guarded: RouteNotGuarded::Refuse,
        }
    }
}
