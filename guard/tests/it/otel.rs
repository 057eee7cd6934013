//! OpenTelemetry traces (feature `otel`): the guard's spans exist, carry
//! the key's hash, the route and the outcome, never the key or the body,
//! and a request's W3C `traceparent` makes them part of the caller's trace.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::layer::SubscriberExt as _;

use idempotency_guard::IdempotencyLayer;
use idempotency_guard::telemetry::otel::{KEY_HASH, OUTCOME, key_hash, layer};

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Recorded(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Recorded {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

const KEY: &str = "otel-key-7f3a9c41d2";
const BODY_SECRET: &str = "otel-body-secret-5521";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn attribute(span: &SpanData, name: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| kv.value.to_string())
}

// One thread: the subscriber set for this test sees the engine's tasks too.
#[tokio::test(flavor = "current_thread")]
async fn spans_carry_the_key_hash_and_never_the_key_or_the_body() {
    let exporter = Recorded::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(layer(&provider));
    let _default = tracing::subscriber::set_default(subscriber);
    let db = idempotency_tests::sqlite().await;
    // Other tests run in parallel threads with no subscriber, and tracing's
    // interest cache is global: a callsite another thread registers while
    // this subscriber is being set may cache "never" (seen as missing spans
    // in cold runs, once even after a rebuild). So every callsite of a fresh
    // request and of a replay is registered first, by a warm-up on another
    // key and app, then the cache is rebuilt with this subscriber in place
    // (a registered callsite is never registered again), and the warm-up's
    // spans are dropped.
    tracing::callsite::rebuild_interest_cache();
    let (warm_up, _) = crate::support::app(IdempotencyLayer::new(db.store.clone()));
    for _ in 0..2 {
        crate::support::send(&warm_up, "otel-warm-up", "{}").await;
    }
    tracing::callsite::rebuild_interest_cache();
    provider.force_flush().unwrap();
    exporter.0.lock().unwrap().clear();

    let (router, runs) = crate::support::app(IdempotencyLayer::new(db.store.clone()));
    let body = format!(r#"{{"secret":"{BODY_SECRET}"}}"#);
    let request = crate::support::request(Some(KEY))
        .header("traceparent", format!("00-{TRACE_ID}-{PARENT_ID}-01"))
        .body(Body::from(body.clone()))
        .unwrap();
    let first = idempotency_tests::call(&router, request).await;
    let replay = crate::support::send(&router, KEY, &body).await;
    assert_eq!(runs.get(), 1);
    assert!(replay.replayed(), "{} then {}", first.status, replay.status);
    provider.force_flush().unwrap();

    let spans = exporter.0.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    for name in [
        "idempotency.request",
        "idempotency.run",
        "idempotency.claim",
        "idempotency.handler",
        "idempotency.store",
        "idempotency.settle",
    ] {
        assert!(names.contains(&name), "no {name} span in {names:?}");
    }
    let hash = key_hash("default", KEY);
    let runs: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "idempotency.run")
        .collect();
    assert_eq!(runs.len(), 2, "{names:?}");
    for run in &runs {
        assert_eq!(attribute(run, KEY_HASH).as_deref(), Some(hash.as_str()));
        assert_eq!(
            attribute(run, "idempotency.route").as_deref(),
            Some("/things")
        );
    }
    let mut outcomes: Vec<String> = runs.iter().filter_map(|s| attribute(s, OUTCOME)).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["executed", "replayed"]);
    let requests: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "idempotency.request")
        .collect();
    assert!(
        requests
            .iter()
            .all(|s| attribute(s, "http.route").as_deref() == Some("/things"))
    );

    // The first request continues the caller's trace; its spans share it.
    let trace = TraceId::from_hex(TRACE_ID).unwrap();
    let continued = requests
        .iter()
        .find(|s| s.span_context.trace_id() == trace)
        .expect("the request span continues the traceparent's trace");
    assert_eq!(
        continued.parent_span_id,
        SpanId::from_hex(PARENT_ID).unwrap()
    );
    assert_eq!(attribute(continued, OUTCOME).as_deref(), Some("executed"));
    let in_trace: Vec<&str> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .map(|s| s.name.as_ref())
        .collect();
    for name in [
        "idempotency.run",
        "idempotency.handler",
        "idempotency.settle",
    ] {
        assert!(
            in_trace.contains(&name),
            "{name} not in the caller's trace: {in_trace:?}"
        );
    }

    // Never the key in clear, never the body.
    for span in &spans {
        let mut text = format!("{} {:?}", span.name, span.attributes);
        for event in span.events.iter() {
            text.push_str(&format!(" {} {:?}", event.name, event.attributes));
        }
        assert!(!text.contains(KEY), "the key in span {}: {text}", span.name);
        assert!(
            !text.contains(BODY_SECRET),
            "the body in span {}: {text}",
            span.name
        );
    }
}
