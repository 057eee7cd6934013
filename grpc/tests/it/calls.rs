//! The test bodies, generic over the store (instantiated per store in
//! `main.rs`).

use std::time::Duration;

use idempotency_guard::{Engine, Store};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use crate::server::proto::{CreatePaymentRequest, ListPaymentsRequest, RefundPaymentRequest};
use crate::server::start;

fn create(account: &str, key: &str) -> Request<CreatePaymentRequest> {
    let mut request = Request::new(CreatePaymentRequest {
        account: account.to_owned(),
        amount_cents: 1250,
        currency: "EUR".to_owned(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

fn reason(status: &Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// 200 concurrent identical calls: the method runs once, every call that
/// got an answer got that run's payment or `request-in-flight`.
pub(crate) async fn concurrent_identical_calls_run_once<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let account = fresh("storm");
    let key = fresh("key");
    let client = server.client().await;
    let mut calls = Vec::new();
    for _ in 0..200 {
        let mut client = client.clone();
        let request = create(&account, &key);
        calls.push(tokio::spawn(
            async move { client.create_payment(request).await },
        ));
    }
    let mut ids = std::collections::HashSet::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(response) => {
                ids.insert(response.into_inner().id);
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert_eq!(reason(&status), "request-in-flight");
                assert!(status.get_details_retry_info().is_some());
            }
        }
    }
    assert_eq!(server.runs.of(&account), 1);
    assert!(ids.len() <= 1, "{ids:?}");
    // Once settled, every call gets the one payment.
    let mut client = server.client().await;
    let replayed = client.create_payment(create(&account, &key)).await.unwrap();
    assert_eq!(replayed.get_ref().executions, 1);
    if let Some(id) = ids.iter().next() {
        assert_eq!(&replayed.get_ref().id, id);
    }
    assert_eq!(server.runs.of(&account), 1);
}

/// A replay is the first answer: the same message, metadata and trailers
/// (for an OK answer and for a stored error status), marked replayed.
pub(crate) async fn a_replay_returns_the_same_message_metadata_and_trailers<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let (account, key) = (fresh("replay"), fresh("key"));
    let first = client.create_payment(create(&account, &key)).await.unwrap();
    let again = client.create_payment(create(&account, &key)).await.unwrap();
    assert_eq!(server.runs.of(&account), 1);
    assert_eq!(first.get_ref(), again.get_ref());
    assert!(first.metadata().get("idempotent-replayed").is_none());
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    for name in ["x-payment-cost", "content-type"] {
        assert_eq!(
            first.metadata().get(name),
            again.metadata().get(name),
            "{name}"
        );
    }
    assert_eq!(
        first
            .metadata()
            .get_bin("x-trace-bin")
            .unwrap()
            .to_bytes()
            .unwrap(),
        again
            .metadata()
            .get_bin("x-trace-bin")
            .unwrap()
            .to_bytes()
            .unwrap(),
    );

    // A stored error status (a decision), with its trailing metadata.
    let key = fresh("key");
    let first = client
        .create_payment(create("code:6", &key))
        .await
        .unwrap_err();
    let again = client
        .create_payment(create("code:6", &key))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::AlreadyExists);
    assert_eq!(again.code(), first.code());
    assert_eq!(again.message(), first.message());
    assert_eq!(again.details(), first.details());
    assert_eq!(again.metadata().get("x-run"), first.metadata().get("x-run"));
    assert!(first.metadata().get("idempotent-replayed").is_none());
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
}

/// Another message under the same key: `FAILED_PRECONDITION` `key-reused`,
/// and the method does not run.
pub(crate) async fn another_message_under_the_same_key_is_refused<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let (account, key) = (fresh("reuse"), fresh("key"));
    client.create_payment(create(&account, &key)).await.unwrap();
    let mut other = create(&account, &key);
    other.get_mut().amount_cents = 99;
    let refused = client.create_payment(other).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(info.reason, "key-reused");
    assert_eq!(info.domain, "idempotency");
    assert_eq!(info.metadata.get("key"), Some(&key));
    assert!(refused.get_details_retry_info().is_none());
    assert_eq!(server.runs.of(&account), 1);
    // The same key in another scope is another record.
    let mut elsewhere = create(&account, &key);
    elsewhere.get_mut().amount_cents = 99;
    elsewhere
        .metadata_mut()
        .insert("x-tenant", "other".parse().unwrap());
    client.create_payment(elsewhere).await.unwrap();
    assert_eq!(server.runs.of(&account), 2);
}

/// Each row of the outcome table, through the server: a stored code runs
/// once for two calls, a released one runs twice; a marked-final status is
/// stored whatever its code but `UNAVAILABLE`.
pub(crate) async fn each_outcome_row_is_stored_or_released<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let stored = [6, 9, 11, 5, 7];
    let released = [14, 8, 10, 13, 2, 1, 3, 16, 12, 4, 15];
    for (codes, runs) in [(&stored[..], 1), (&released[..], 2)] {
        for code in codes {
            let account = format!("code:{code}");
            let key = fresh("row");
            let before = server.runs.of(&account);
            for _ in 0..2 {
                let status = client
                    .create_payment(create(&account, &key))
                    .await
                    .unwrap_err();
                assert_eq!(status.code(), Code::from_i32(*code));
                assert!(status.metadata().get("idempotency-final").is_none());
            }
            assert_eq!(server.runs.of(&account) - before, runs, "code {code}");
        }
    }
    // OK is stored (the other tests), a final INVALID_ARGUMENT too.
    let (account, key) = ("final:3", fresh("row"));
    let before = server.runs.of(account);
    for _ in 0..2 {
        let status = client
            .create_payment(create(account, &key))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.metadata().get("idempotency-final").is_none());
    }
    assert_eq!(server.runs.of(account) - before, 1);
    // UNAVAILABLE marked final is released all the same: an outage is
    // never replayed, the retry runs the method.
    let (account, key) = ("final:14", fresh("row"));
    let before = server.runs.of(account);
    for _ in 0..2 {
        let status = client
            .create_payment(create(account, &key))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.metadata().get("idempotent-replayed").is_none());
        assert!(status.metadata().get("idempotency-final").is_none());
    }
    assert_eq!(
        server.runs.of(account) - before,
        2,
        "UNAVAILABLE never stored"
    );
}

/// The guard's own bound: a run cut off at the maximum handler time is an
/// unknown outcome (`FAILED_PRECONDITION` `handler-timeout` for that call,
/// as HTTP's 504 `handler-timeout`; then `outcome-unknown` for the
/// abandoned record; never `RetryInfo`), and the key is never run again
/// blindly.
pub(crate) async fn a_run_cut_off_at_the_maximum_handler_time_is_outcome_unknown<S: Store>(
    store: S,
) {
    let engine = Engine::new(store).with_max_handler_time(Duration::from_millis(300));
    let server = start(engine).await;
    let mut client = server.client().await;
    let (account, key) = ("sleep:2000", fresh("cut"));
    for expected in ["handler-timeout", "outcome-unknown"] {
        let status = client
            .create_payment(create(account, &key))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(&status), expected);
        assert!(status.get_details_retry_info().is_none());
    }
    // Cut off before it counted its run: it never ran to its end, nor again.
    assert_eq!(server.runs.of(account), 0);
}

/// A client deadline shorter than the handler: the client gets its
/// deadline error, the handler finishes and its answer is stored, the
/// retry gets the replay.
pub(crate) async fn a_client_deadline_shorter_than_the_handler_gets_the_replay_on_retry<
    S: Store,
>(
    store: S,
) {
    let engine = Engine::new(store);
    let server = start(engine.clone()).await;
    let mut client = server.client().await;
    let account = "sleep:600";
    let key = fresh("deadline");
    let mut request = create(account, &key);
    request.set_timeout(Duration::from_millis(150));
    let before = server.runs.of(account);
    let status = client.create_payment(request).await.unwrap_err();
    // tonic's client reports its own deadline as `CANCELLED` "Timeout
    // expired" (other clients say `DEADLINE_EXCEEDED`).
    assert!(
        status.code() == Code::DeadlineExceeded
            || (status.code() == Code::Cancelled && status.message() == "Timeout expired"),
        "{status:?}"
    );
    // The run goes on: wait for it through the engine's drain.
    tokio::time::timeout(Duration::from_secs(10), engine.drain().wait())
        .await
        .unwrap();
    assert_eq!(server.runs.of(account) - before, 1);
    let replayed = client.create_payment(create(account, &key)).await.unwrap();
    assert_eq!(
        replayed.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(server.runs.of(account) - before, 1);
}

/// No key, a malformed key, two keys: `INVALID_ARGUMENT` with the
/// problem's reason, and the method does not run.
pub(crate) async fn a_missing_or_invalid_key_is_refused_before_the_method_runs<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let account = fresh("nokey");
    let mut bare = create(&account, "k");
    bare.metadata_mut().remove("idempotency-key");
    let status = client.create_payment(bare).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(reason(&status), "key-missing");
    let mut two = create(&account, "k1");
    two.metadata_mut()
        .append("idempotency-key", "k2".parse().unwrap());
    let status = client.create_payment(two).await.unwrap_err();
    assert_eq!(reason(&status), "key-invalid");
    let long = "x".repeat(256);
    let status = client
        .create_payment(create(&account, &long))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "key-invalid");
    assert_eq!(server.runs.of(&account), 0);
}

/// A streaming method passes through, unguarded (no key needed).
pub(crate) async fn a_streaming_method_passes_through<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let mut stream = client
        .list_payments(ListPaymentsRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    while let Some(payment) = stream.message().await.unwrap() {
        ids.push(payment.id);
    }
    assert_eq!(ids, ["pay-1", "pay-2", "pay-3"]);
}

/// AIP-155: the key is the message's `request_id`; the typed handler runs
/// once per id, a retry gets the stored refund.
pub(crate) async fn an_aip_155_request_id_runs_the_typed_handler_once<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let payment = fresh("pay");
    let refund = |request_id: &str, amount| RefundPaymentRequest {
        request_id: request_id.to_owned(),
        payment_id: payment.clone(),
        amount_cents: amount,
    };
    let id = uuid::Uuid::new_v4().to_string();
    let first = client.refund_payment(refund(&id, 100)).await.unwrap();
    let again = client.refund_payment(refund(&id, 100)).await.unwrap();
    assert_eq!(first.get_ref(), again.get_ref());
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(server.runs.of(&payment), 1);
    let reused = client.refund_payment(refund(&id, 200)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(reason(&reused), "key-reused");
    let missing = client.refund_payment(refund("", 100)).await.unwrap_err();
    assert_eq!(reason(&missing), "key-missing");
    assert_eq!(server.runs.of(&payment), 1);
}
