//! OpenTelemetry traces (feature `otel`).
//!
//! With the feature on, the guard opens [`tracing`] spans, which the
//! [`tracing_opentelemetry`] layer of [`layer`] turns into OpenTelemetry
//! spans:
//!
//! | span | where | attributes |
//! |---|---|---|
//! | `idempotency.request` | the axum layer, one per guarded request | `http.route`, `http.request.method`, `idempotency.outcome` |
//! | `idempotency.run` | [`Engine::run`](crate::engine::Engine::run) | `idempotency.route`, `idempotency.key_hash`, `idempotency.outcome` |
//! | `idempotency.claim` | the claim (and a takeover or wait) | |
//! | `idempotency.handler` | the work (the route's handler) | |
//! | `idempotency.store` | every store call | `idempotency.store.operation` |
//! | `idempotency.settle` | storing the outcome or releasing the key | `idempotency.settle.ending` |
//!
//! The key is never an attribute, and neither is a body: spans carry
//! [`key_hash`], a hash of the scope and the key, so one key's runs can be
//! found (compute the hash of the key you look for) without the key, which
//! may be a secret of its own, leaving the process. [`layer`] passes spans
//! only, not log events (some log lines name the key, for operators' logs).
//!
//! W3C trace context: a request carrying `traceparent` (and `tracestate`)
//! that arrives with no span around it (no tracing layer of the app's own
//! in front) makes the `idempotency.request` span a child of the caller's
//! span.
//!
//! Export: [`install_from_env`] sets up an OTLP/HTTP (protobuf) exporter
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the standard variables of
//! the OTLP exporter (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`) apply;
//! add [`layer`] to the app's subscriber:
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt as _;
//! use tracing_subscriber::util::SubscriberInitExt as _;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = idempotency_guard::telemetry::otel::install_from_env("payments")?;
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer())
//!     .with(provider.as_ref().map(idempotency_guard::telemetry::otel::layer))
//!     .init();
//! // ... serve; on shutdown, flush what is buffered:
//! if let Some(provider) = provider {
//!     provider.shutdown()?;
//! }
//! # Ok(()) }
//! ```

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sha2::{Digest as _, Sha256};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The attribute holding [`key_hash`].
pub const KEY_HASH: &str = "idempotency.key_hash";
/// The attribute holding the outcome (the `outcome` label of the metrics).
pub const OUTCOME: &str = "idempotency.outcome";

/// The name of the instrumentation scope of the guard's spans.
const SCOPE_NAME: &str = "idempotency-guard";

/// A hash of a record's scope and key, as the spans carry it: the first
/// 8 bytes of SHA-256 over the scope's length (4 bytes, big-endian), the
/// scope and the key, in lowercase hex (16 characters).
///
/// ```
/// let hash = idempotency_guard::telemetry::otel::key_hash("default", "order-1");
/// assert_eq!(hash.len(), 16);
/// assert_ne!(hash, idempotency_guard::telemetry::otel::key_hash("other", "order-1"));
/// ```
///
/// # Warning
///
/// A hash hides a key that is hard to guess (a UUID); a key made of a
/// small guessable value (an order number) can be found again by hashing
/// candidates.
pub fn key_hash(scope: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(u32::try_from(scope.len()).unwrap_or(u32::MAX).to_be_bytes());
    hasher.update(scope.as_bytes());
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    digest
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// The OTLP span exporter could not be built (an invalid endpoint, say).
    #[error("cannot build the OTLP span exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// Sets up the OTLP/HTTP span exporter when `OTEL_EXPORTER_OTLP_ENDPOINT`
/// or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (`None` otherwise):
/// spans are batched and sent from a thread of their own, the resource
/// names `service_name`, and the W3C trace-context propagator becomes the
/// global one. Add [`layer`] of the provider to the subscriber, and call
/// [`SdkTracerProvider::shutdown`] on exit to flush.
///
/// # Errors
///
/// [`OtelError::Exporter`] when the exporter cannot be built.
pub fn install_from_env(service_name: &str) -> Result<Option<SdkTracerProvider>, OtelError> {
    let set = |name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(OtelError::Exporter)?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Some(provider))
}

/// The [`tracing_subscriber`] layer that turns spans into OpenTelemetry
/// spans of `provider` (spans only: log events stay in the logs).
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SCOPE_NAME))
        .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span()
        }))
}

/// Reads `traceparent` and `tracestate` from request headers.
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The `idempotency.request` span of one guarded request, a child of the
/// caller's span when the request carries W3C trace context and no span
/// of the app's own is around it.
pub(crate) fn request_span<B>(request: &http::Request<B>) -> tracing::Span {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", axum::extract::MatchedPath::as_str);
    let enclosed = !tracing::Span::current().is_none();
    let span = tracing::info_span!(
        "idempotency.request",
        http.route = route,
        http.request.method = request.method().as_str(),
        idempotency.outcome = tracing::field::Empty,
    );
    if !enclosed && request.headers().contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
        // Fails only when the span is disabled (no subscriber wants it).
        let _ = span.set_parent(parent);
    }
    span
}
