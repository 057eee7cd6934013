//! Each guarded call is counted once in `idempotency_requests_total`,
//! through the engine (`Engine::tally`), with the guard's outcome
//! and attempt labels; a caller that goes away is counted `caller-gone`.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use idempotency_guard::telemetry::REQUESTS_TOTAL;
use idempotency_guard::{Engine, Store};
use metrics::Key;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tonic::Request;

use crate::server::proto::CreatePaymentRequest;
use crate::server::{CREATE, start};

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in the test binary");
        snapshotter
    })
}

/// The sum of `idempotency_requests_total` over the series whose labels
/// include every pair of `labels`, since the recorder was installed (a
/// snapshot resets the recorder's counters: the totals add them up).
fn counted(labels: &[(&str, &str)]) -> u64 {
    static TOTALS: Mutex<Vec<(Key, u64)>> = Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().unwrap_or_else(PoisonError::into_inner);
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let key = key.key().clone();
        match totals.iter_mut().find(|(k, _)| *k == key) {
            Some((_, total)) => *total += n,
            None => totals.push((key, n)),
        }
    }
    totals
        .iter()
        .filter(|(key, _)| key.name() == REQUESTS_TOTAL)
        .filter(|(key, _)| {
            labels.iter().all(|(label, value)| {
                key.labels()
                    .any(|l| l.key() == *label && l.value() == *value)
            })
        })
        .map(|(_, total)| total)
        .sum()
}

/// The attempt this test's calls say they are (`x-retry-attempt`): no
/// other test sends it, so its series are this test's alone.
const ATTEMPT: &str = "7";

fn call(account: &str, amount_cents: i64, key: Option<&str>) -> Request<CreatePaymentRequest> {
    let mut request = Request::new(CreatePaymentRequest {
        account: account.to_owned(),
        amount_cents,
        currency: "EUR".to_owned(),
    });
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    request
        .metadata_mut()
        .insert("x-retry-attempt", ATTEMPT.parse().unwrap());
    request
}

/// Executed, replayed, key-reused, rejected and caller-gone: one count
/// each, under the method's full name and the call's attempt.
pub(crate) async fn each_guarded_call_is_counted_once<S: Store>(store: S) {
    let _ = snapshotter();
    let engine = Engine::new(store);
    let server = start(engine.clone()).await;
    let mut client = server.client().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let count = |outcome: &str| {
        counted(&[
            ("route", CREATE),
            ("attempt", ATTEMPT),
            ("outcome", outcome),
        ])
    };
    let before: Vec<u64> = [
        "executed",
        "replayed",
        "key-reused",
        "rejected",
        "caller-gone",
    ]
    .iter()
    .map(|outcome| count(outcome))
    .collect();

    let key = format!("{run}-counted");
    client
        .create_payment(call(&run, 5, Some(&key)))
        .await
        .unwrap();
    client
        .create_payment(call(&run, 5, Some(&key)))
        .await
        .unwrap();
    client
        .create_payment(call(&run, 6, Some(&key)))
        .await
        .unwrap_err();
    client
        .create_payment(call(&run, 5, None))
        .await
        .unwrap_err();
    // The caller gives up while the method runs: counted when its call's
    // future is dropped; the run goes on to its end.
    // (The method sleeps far longer than the caller waits, so that a
    // loaded machine still delivers the call before the caller leaves.)
    let mut slow = call("sleep:3000", 5, Some(&format!("{run}-gone")));
    slow.set_timeout(Duration::from_millis(600));
    client.create_payment(slow).await.unwrap_err();
    tokio::time::timeout(Duration::from_secs(10), engine.drain().wait())
        .await
        .unwrap();

    for (outcome, before) in [
        "executed",
        "replayed",
        "key-reused",
        "rejected",
        "caller-gone",
    ]
    .iter()
    .zip(before)
    {
        assert_eq!(count(outcome) - before, 1, "{outcome}");
    }
}
