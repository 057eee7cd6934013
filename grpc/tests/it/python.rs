//! A client nobody here wrote: Python's `grpcio` (installed by
//! `scripts/grpcio-venv`, a pinned version from PyPI) with a service-config
//! `retryPolicy` (maxAttempts 5, retryable `UNAVAILABLE`), against a server
//! whose first answer per key is turned into `UNAVAILABLE` after the
//! method ran (a layer above the guard). Each payment runs once and every
//! call ends with its payment.
//!
//! Hedging is not tested: grpcio (gRPC C-core) does not implement the
//! service config's `hedgingPolicy`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use idempotency_guard::{Engine, Store};

use crate::clients::{CallSpec, ROOT, grpcio_calls, python};
use crate::server::start_behind;

/// A layer above the guard that turns the first answer of each key into a
/// trailers-only `UNAVAILABLE`, after the method ran.
#[derive(Clone, Default)]
pub(crate) struct FirstAnswerLost(Arc<Mutex<HashSet<String>>>);

impl<I> tower::Layer<I> for FirstAnswerLost {
    type Service = FirstAnswerLostService<I>;

    fn layer(&self, inner: I) -> Self::Service {
        FirstAnswerLostService {
            inner,
            seen: self.clone(),
        }
    }
}

/// The service of [`FirstAnswerLost`].
#[derive(Clone)]
pub(crate) struct FirstAnswerLostService<I> {
    inner: I,
    seen: FirstAnswerLost,
}

impl<I> tower::Service<http::Request<tonic::body::Body>> for FirstAnswerLostService<I>
where
    I: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Send
        + 'static,
    I::Future: Send + 'static,
{
    type Response = I::Response;
    type Error = I::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<I::Response, I::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let key = request
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let seen = self.seen.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            let first = key.is_some_and(|key| seen.0.lock().unwrap().insert(key));
            if first {
                // The write ran and its answer is stored; this caller loses it.
                return Ok(tonic::Status::unavailable("the answer was lost").into_http());
            }
            Ok(response)
        })
    }
}

/// Python's grpcio retries each lost answer; each payment runs once.
pub(crate) async fn grpcio_retries_run_each_payment_once<S: Store>(store: S) {
    let root = ROOT;
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let server = start_behind(Engine::new(store), FirstAnswerLost::default()).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let payments = 40;
    let output = tokio::process::Command::new(&python)
        .arg(format!("{root}/grpc/tests/python/retry_client.py"))
        .arg(server.address.to_string())
        .arg(&run)
        .arg(payments.to_string())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "the grpcio client failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines = String::from_utf8(output.stdout).unwrap();
    let mut ended = 0;
    for line in lines.lines() {
        let (account, executions) = line.split_once(' ').unwrap();
        // Every call ended with its payment, from its one run.
        assert_eq!(executions, "1", "{line}");
        assert_eq!(server.runs.of(account), 1, "{line}");
        ended += 1;
    }
    assert_eq!(ended, payments);
}

/// Counts the attempts of each key that reach the server (above the
/// guard), and the retries among them (`grpc-previous-rpc-attempts`).
#[derive(Clone, Default)]
pub(crate) struct Attempts(Arc<Mutex<HashMap<String, (u64, u64)>>>);

impl Attempts {
    /// The attempts of `key`, and how many of them were retries.
    fn of(&self, key: &str) -> (u64, u64) {
        self.0.lock().unwrap().get(key).copied().unwrap_or_default()
    }
}

impl<I> tower::Layer<I> for Attempts {
    type Service = AttemptsService<I>;

    fn layer(&self, inner: I) -> Self::Service {
        AttemptsService {
            inner,
            attempts: self.clone(),
        }
    }
}

/// The service of [`Attempts`].
#[derive(Clone)]
pub(crate) struct AttemptsService<I> {
    inner: I,
    attempts: Attempts,
}

impl<I> tower::Service<http::Request<tonic::body::Body>> for AttemptsService<I>
where
    I: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = I::Response;
    type Error = I::Error;
    type Future = I::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let headers = request.headers();
        if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
            let retry = headers.contains_key("grpc-previous-rpc-attempts");
            let mut attempts = self.attempts.0.lock().unwrap();
            let entry = attempts.entry(key.to_owned()).or_default();
            entry.0 += 1;
            entry.1 += u64::from(retry);
        }
        self.inner.call(request)
    }
}

/// The service config the guide recommends (the first `json` block of its
/// gRPC page, docs/guide/grpc.md), for the example's service.
fn recommended_service_config() -> serde_json::Value {
    let page = std::fs::read_to_string(format!("{ROOT}/docs/guide/grpc.md")).unwrap();
    let block = page
        .split_once("```json\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("docs/guide/grpc.md has no json block: the recommended service config")
        .0;
    serde_json::from_str(block).expect("docs/guide/grpc.md's service config is not JSON")
}

/// grpcio with the guide's `retryPolicy`: 30 identical concurrent calls
/// whose first run takes longer than a pushback, a method whose first run
/// answers `UNAVAILABLE`, and a run cut off at the maximum handler time.
/// The in-flight refusals are absorbed by the client (every call ends with
/// the one payment, after retries the server saw); the handler's own
/// `UNAVAILABLE` released the key and the retry ran it again; the unknown
/// outcome is never resent (one attempt per call).
pub(crate) async fn a_retry_policy_absorbs_in_flight_and_never_resends_an_unknown_outcome<
    S: Store,
>(
    store: S,
) {
    let config = recommended_service_config();
    let policy = &config["methodConfig"][0]["retryPolicy"];
    assert_eq!(
        policy["retryableStatusCodes"],
        serde_json::json!(["UNAVAILABLE"])
    );
    let engine = Engine::new(store)
        .with_retry_after(Duration::from_millis(250))
        .with_max_handler_time(Duration::from_millis(1500));
    let attempts = Attempts::default();
    let server = start_behind(engine, attempts.clone()).await;
    let run = uuid::Uuid::new_v4().simple().to_string();

    // In flight: 30 copies of one call, the first run 400 ms long.
    let storm = format!("sleep:400:{run}");
    let storm_key = format!("{run}-storm");
    // The handler's own UNAVAILABLE on its first run.
    let flaky = format!("once:14:{run}");
    let flaky_key = format!("{run}-flaky");
    let mut calls = vec![CallSpec::new(&storm, Some(&storm_key)); 30];
    calls.push(CallSpec::new(&flaky, Some(&flaky_key)));
    let seen = grpcio_calls(server.address, &calls, calls.len(), Some(config.clone())).await;
    let payments: HashSet<_> = seen[..30]
        .iter()
        .map(|answer| {
            assert_eq!(
                answer.code, 0,
                "an in-flight refusal reached the caller: {answer:?}"
            );
            answer.body.clone().unwrap()
        })
        .collect();
    assert_eq!(payments.len(), 1, "every copy ends with the one payment");
    assert_eq!(server.runs.of(&storm), 1);
    let (tries, retries) = attempts.of(&storm_key);
    assert!(
        retries > 0 && tries == 30 + retries,
        "the client retried the in-flight refusals: {tries} attempts, {retries} retries"
    );
    assert_eq!(seen[30].code, 0, "{:?}", seen[30]);
    assert_eq!(server.runs.of(&flaky), 2);
    assert_eq!(attempts.of(&flaky_key), (2, 1));

    // An unknown outcome: cut off, then abandoned; each call one attempt.
    let cut = format!("sleep:5000:{run}");
    let cut_key = format!("{run}-cut");
    let call = CallSpec::new(&cut, Some(&cut_key));
    let seen = grpcio_calls(server.address, &[call.clone(), call], 1, Some(config)).await;
    for answer in &seen {
        assert_eq!(
            answer.code,
            tonic::Code::FailedPrecondition as i32,
            "{answer:?}"
        );
    }
    assert_eq!(
        attempts.of(&cut_key),
        (2, 0),
        "an unknown outcome was resent"
    );
    assert_eq!(server.runs.of(&cut), 0);
}
