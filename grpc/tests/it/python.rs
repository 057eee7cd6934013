//! A client nobody here wrote: Python's `grpcio` (installed by
//! `scripts/grpcio-venv`, a pinned version from PyPI) with a service-config
//! `retryPolicy` (maxAttempts 5, retryable `UNAVAILABLE`), against a server
//! whose first answer per key is turned into `UNAVAILABLE` after the
//! method ran (a layer above the guard). Each payment runs once and every
//! call ends with its payment.
//!
//! Hedging is not tested: grpcio (gRPC C-core) does not implement the
//! service config's `hedgingPolicy`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use idempotency_guard::{Engine, Store};

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
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let venv = std::process::Command::new(format!("{root}/scripts/grpcio-venv"))
        .output()
        .expect("scripts/grpcio-venv could not start: it installs grpcio for this test");
    assert!(
        venv.status.success(),
        "scripts/grpcio-venv failed to install grpcio (PyPI must be reachable): {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python = String::from_utf8(venv.stdout).unwrap().trim().to_owned();
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
