//! The guard's metrics, through the [`metrics`] facade: whatever recorder
//! the app installs (the service and the example app export Prometheus text
//! at `/metrics`) receives them.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idempotency_requests_total` | counter | `route`, `outcome`, `attempt` |
//! | `idempotency_store_duration_seconds` | histogram | `operation`, `result` |
//! | `idempotency_lease_lost_total` | counter | `route`, `operation` |
//!
//! `attempt` is the `X-Retry-Attempt` request header (`0` is the first try),
//! `0` to `9`, then `10+`; `unknown` when the header is absent or invalid.
//! From these, with PromQL (see the guide's `docs/guide/metrics.md`):
//!
//! - retry rate: `sum(rate(idempotency_requests_total{attempt!~"0|unknown"}[5m])) / sum(rate(idempotency_requests_total{attempt!="unknown"}[5m]))`
//! - amplification factor: `sum(rate(idempotency_requests_total{attempt!="unknown"}[5m])) / sum(rate(idempotency_requests_total{attempt="0"}[5m]))`

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

#[cfg(feature = "logs")]
#[cfg_attr(docsrs, doc(cfg(feature = "logs")))]
pub mod logs;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;

use http::{HeaderMap, HeaderName};
use metrics::{Counter, Histogram};

/// Requests the guard saw, by route, outcome and attempt.
pub const REQUESTS_TOTAL: &str = "idempotency_requests_total";
/// Time each store operation took, by operation and result.
pub const STORE_DURATION_SECONDS: &str = "idempotency_store_duration_seconds";
/// Fenced writes the store refused because the lease was lost.
pub const LEASE_LOST_TOTAL: &str = "idempotency_lease_lost_total";

/// The request header clients set to the attempt number (0 = first try).
pub const RETRY_ATTEMPT: &str = "x-retry-attempt";

/// What the guard did with one request (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its response was stored (or, for a response over
    /// the stored-response limit, marked as not stored).
    Executed,
    /// The stored response was replayed.
    Replayed,
    /// The key was used with another request.
    KeyReused,
    /// The first request with the key was still running.
    InFlight,
    /// The handler ran but its answer is not stored (5xx, 408, 425, 429,
    /// `no-store`, a failure): the key was released.
    Released,
    /// The guard refused the request (missing or invalid key, body too
    /// large, outcome unknown, response not stored).
    Rejected,
    /// The store failed; the request was refused (or, failing open, ran unguarded).
    StoreUnavailable,
    /// The guard cut the handler off at the maximum handler time.
    Abandoned,
    /// The request ran without the guard (no key on a route where it is optional).
    Unguarded,
    /// The caller went away (closed the connection, or its request was
    /// cancelled) before the guard answered. A run that had started goes on
    /// to its end and settles its record; the status service tells how.
    CallerGone,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::KeyReused => "key-reused",
            Self::InFlight => "in-flight",
            Self::Released => "released",
            Self::Rejected => "rejected",
            Self::StoreUnavailable => "store-unavailable",
            Self::Abandoned => "abandoned",
            Self::Unguarded => "unguarded",
            Self::CallerGone => "caller-gone",
        }
    }
}

/// The request header a gRPC client's retry policy sets on every retry to
/// the number of attempts before it (gRPC's retry design, A6).
pub const GRPC_PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// The `attempt` label of a request: its `X-Retry-Attempt` header, else
/// gRPC's [`GRPC_PREVIOUS_ATTEMPTS`], `0` to `9`, then `10+`; `unknown`
/// when neither is there or valid.
pub fn attempt_label(headers: &HeaderMap) -> &'static str {
    const LABELS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    // Looked up by their `HeaderName`s: looking up a `&str` parses and
    // checks the name first, for every request (460 instructions of a
    // fresh request's 79k; docs/BENCHMARKS.md, issue 56).
    static RETRY: HeaderName = HeaderName::from_static(RETRY_ATTEMPT);
    static GRPC_PREVIOUS: HeaderName = HeaderName::from_static(GRPC_PREVIOUS_ATTEMPTS);
    let attempt = headers
        .get(&RETRY)
        .or_else(|| headers.get(&GRPC_PREVIOUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match attempt {
        Some(n) => usize::try_from(n)
            .ok()
            .and_then(|n| LABELS.get(n).copied())
            .unwrap_or("10+"),
        None => "unknown",
    }
}

/// The handles of the per-request metrics of one engine (and the layer
/// over it), registered with the recorder on first use and reused.
///
/// Registering a labelled series (building its key, hashing it, finding it
/// in the recorder's registry) costs more than the rest of a request's
/// bookkeeping, and it happened for every request and store call. Handles
/// belong to the recorder installed when they were first used: install it
/// before the first request (as every exporter's setup does).
///
/// Only the routes are hashed: the other labels come from a few constants
/// of the guard's code (store operations, outcomes, attempt labels), found
/// by comparing them in a short list, as cheaply as a hash map finds them
/// without the hashing (SipHash, about 100 instructions a lookup, three
/// lookups a request).
#[derive(Default)]
pub(crate) struct MetricHandles {
    /// `idempotency_requests_total` by route.
    requests: RwLock<HashMap<Box<str>, RouteCounters>>,
    /// `idempotency_store_duration_seconds` by operation and success.
    store: RwLock<Vec<((&'static str, bool), Histogram)>>,
}

/// One route's `idempotency_requests_total` series, by outcome and attempt.
type RouteCounters = Vec<((Outcome, &'static str), Counter)>;

/// The handle of `labels` in a short list of handles.
fn find<K: PartialEq, H: Clone>(handles: &[(K, H)], labels: &K) -> Option<H> {
    handles
        .iter()
        .find(|(found, _)| found == labels)
        .map(|(_, handle)| handle.clone())
}

/// Adds the handle of `labels` to a short list, unless another caller
/// added one meanwhile (then that one is kept and returned).
fn add<K: PartialEq, H: Clone>(handles: &mut Vec<(K, H)>, labels: K, handle: H) -> H {
    if let Some(found) = find(handles, &labels) {
        return found;
    }
    handles.push((labels, handle.clone()));
    handle
}

impl std::fmt::Debug for MetricHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricHandles").finish_non_exhaustive()
    }
}

impl MetricHandles {
    /// Counts one request.
    pub(crate) fn count_request(&self, route: &str, outcome: Outcome, attempt: &'static str) {
        let found = self
            .requests
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(route)
            .and_then(|series| find(series, &(outcome, attempt)));
        let counter = found.unwrap_or_else(|| {
            let counter = metrics::counter!(
                REQUESTS_TOTAL,
                "route" => route.to_owned(),
                "outcome" => outcome.as_str(),
                "attempt" => attempt,
            );
            let mut requests = self
                .requests
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            add(
                requests.entry(route.into()).or_default(),
                (outcome, attempt),
                counter,
            )
        });
        counter.increment(1);
    }

    /// Records how long a store operation took.
    pub(crate) fn observe_store(&self, operation: &'static str, started: Instant, ok: bool) {
        let found = find(
            &self.store.read().unwrap_or_else(PoisonError::into_inner),
            &(operation, ok),
        );
        let histogram = found.unwrap_or_else(|| {
            let histogram = metrics::histogram!(
                STORE_DURATION_SECONDS,
                "operation" => operation,
                "result" => if ok { "ok" } else { "error" },
            );
            add(
                &mut self.store.write().unwrap_or_else(PoisonError::into_inner),
                (operation, ok),
                histogram,
            )
        });
        histogram.record(started.elapsed());
    }
}

/// Counts one request of an adapter in `idempotency_requests_total`
/// exactly once, through its engine's metrics: with [`Tally::count`] when
/// its answer is ready, or as [`Outcome::CallerGone`] when it is dropped
/// uncounted (the request's future was dropped: its caller went away; a
/// run that had started goes on to its end and settles its key). Made by
/// [`Engine::tally`](crate::Engine::tally); the axum layer, the gRPC and
/// the JSON-RPC adapters count with it.
///
/// ```
/// use idempotency_guard::{Engine, Store, telemetry};
/// # fn f<S: Store>(engine: &Engine<S>, headers: &http::HeaderMap) {
/// let tally = engine.tally("send_email", telemetry::attempt_label(headers));
/// // ... the request is answered:
/// tally.count(telemetry::Outcome::Executed);
/// # }
/// ```
#[derive(Debug)]
#[must_use = "dropped uncounted, it counts the request as caller-gone"]
pub struct Tally {
    metrics: Arc<MetricHandles>,
    route: Arc<str>,
    attempt: &'static str,
    /// Whether dropping it counts a caller gone.
    armed: bool,
}

impl Tally {
    /// A tally of one request on `route` with `attempt`.
    pub(crate) fn new(metrics: Arc<MetricHandles>, route: Arc<str>, attempt: &'static str) -> Self {
        Self {
            metrics,
            route,
            attempt,
            armed: true,
        }
    }

    /// Counts the request under `outcome`.
    pub fn count(mut self, outcome: Outcome) {
        self.armed = false;
        self.metrics
            .count_request(&self.route, outcome, self.attempt);
    }

    /// Counts nothing: the request turned out to be one the adapter does
    /// not count.
    pub fn forget(mut self) {
        self.armed = false;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        if self.armed {
            self.metrics
                .count_request(&self.route, Outcome::CallerGone, self.attempt);
        }
    }
}

/// Counts a fenced write that the store refused.
pub(crate) fn count_lease_lost(route: &str, operation: &'static str) {
    metrics::counter!(LEASE_LOST_TOTAL, "route" => route.to_owned(), "operation" => operation)
        .increment(1);
}

/// Describes the metrics for exporters that show help text.
pub fn describe() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        "Requests on guarded routes, by route, outcome and X-Retry-Attempt."
    );
    metrics::describe_histogram!(
        STORE_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "Latency of idempotency store operations."
    );
    metrics::describe_counter!(
        LEASE_LOST_TOTAL,
        "Fenced writes refused because the lease had passed to another request."
    );
}

/// The histogram buckets the exporters use for store latency, in seconds.
pub const STORE_DURATION_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0,
];

/// The histogram buckets, in seconds, of every other latency histogram
/// (the key-status service's requests, the gateway's upstream requests).
pub const REQUEST_DURATION_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The histogram buckets of `idempotency_store_batch_size` (items per batch).
pub const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The Prometheus exporter's configuration: every histogram exported as a
/// Prometheus histogram (`_bucket`, `_sum`, `_count`, which dashboards
/// aggregate across instances with `histogram_quantile`), never as a
/// summary: store latency with [`STORE_DURATION_BUCKETS`], batch sizes with
/// [`BATCH_SIZE_BUCKETS`], any other with [`REQUEST_DURATION_BUCKETS`]. (A
/// summary's quantiles cannot be aggregated, and each of its samples costs
/// a sketch insertion.)
///
/// # Errors
///
/// Never for these buckets (the exporter refuses empty ones).
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub fn prometheus_builder()
-> Result<metrics_exporter_prometheus::PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets(REQUEST_DURATION_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(STORE_DURATION_SECONDS.to_owned()),
            STORE_DURATION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(crate::store::batch::BATCH_SIZE.to_owned()),
            BATCH_SIZE_BUCKETS,
        )
}

/// Installs a Prometheus recorder for the guard's metrics (configured by
/// [`prometheus_builder`]) and returns its handle: serve `handle.render()`
/// at `/metrics`. Histograms are compacted by a background task every 5
/// seconds.
///
/// # Errors
///
/// When a global recorder is already installed.
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub fn install_prometheus()
-> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = prometheus_builder()?.install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[cfg(feature = "prometheus")]
    #[test]
    fn every_histogram_is_exported_as_a_prometheus_histogram() {
        let recorder = prometheus_builder().unwrap().build_recorder();
        let handle = recorder.handle();
        let names = [
            STORE_DURATION_SECONDS,
            crate::store::batch::BATCH_SIZE,
            "idempotency_status_request_duration_seconds",
            "idempotency_gateway_upstream_duration_seconds",
        ];
        metrics::with_local_recorder(&recorder, || {
            for name in names {
                metrics::histogram!(name).record(0.003);
            }
        });
        let text = handle.render();
        for name in names {
            assert!(
                text.contains(&format!("# TYPE {name} histogram")),
                "{name} is a histogram:\n{text}"
            );
            assert!(
                text.contains(&format!("{name}_bucket{{le=")),
                "{name} has buckets"
            );
        }
        assert!(!text.contains("quantile="), "no summary:\n{text}");
        assert!(text.contains("idempotency_store_batch_size_bucket{le=\"4\"} 1"));
        assert!(text.contains("idempotency_store_duration_seconds_bucket{le=\"0.005\"} 1"));
    }

    #[test]
    fn attempt_labels_are_bounded() {
        let mut headers = HeaderMap::new();
        assert_eq!(attempt_label(&headers), "unknown");
        for (value, label) in [
            ("0", "0"),
            ("3", "3"),
            (" 9 ", "9"),
            ("10", "10+"),
            ("99999999999999999999", "unknown"),
            ("-1", "unknown"),
            ("x", "unknown"),
        ] {
            headers.insert(RETRY_ATTEMPT, HeaderValue::from_static(value));
            assert_eq!(attempt_label(&headers), label, "{value}");
        }
    }

    #[test]
    fn the_attempt_of_a_grpc_retry_is_its_own_header_unless_the_client_set_ours() {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_PREVIOUS_ATTEMPTS, HeaderValue::from_static("12"));
        assert_eq!(attempt_label(&headers), "10+");
        headers.insert(GRPC_PREVIOUS_ATTEMPTS, HeaderValue::from_static("2"));
        assert_eq!(attempt_label(&headers), "2");
        headers.insert(RETRY_ATTEMPT, HeaderValue::from_static("3"));
        assert_eq!(attempt_label(&headers), "3");
    }
}
