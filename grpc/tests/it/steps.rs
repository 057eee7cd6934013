//! Steps and resume through the gRPC layer: a method records a step with
//! the run's handle from its request's extensions, loses track (a status
//! marked outcome unknown: the key is left abandoned), and the retry with
//! the same key resumes it (the step is not run again) under
//! `AbandonedPolicy::Resume`, or is refused `outcome-unknown` without it.

use idempotency_guard::{AbandonedPolicy, Engine, Store};
use tonic::{Code, Request};
use tonic_types::StatusExt;

use crate::server::proto::CreatePaymentRequest;
use crate::server::start;

fn create(account: &str, key: &str) -> Request<CreatePaymentRequest> {
    let mut request = Request::new(CreatePaymentRequest {
        account: account.to_owned(),
        amount_cents: 700,
        currency: "EUR".to_owned(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

/// The first call records its step and is abandoned; the tonic client's
/// retry resumes it: the step returns its recorded result, the method
/// answers for real, and a third call gets that answer replayed.
pub(crate) async fn an_abandoned_call_resumes_with_its_recorded_step<S: Store>(store: S) {
    let engine = Engine::new(store).with_abandoned(AbandonedPolicy::Resume);
    let server = start(engine).await;
    let mut client = server.client().await;
    let suffix = uuid::Uuid::new_v4();
    let (account, key) = (format!("step:{suffix}"), format!("resume-{suffix}"));
    let lost = client
        .create_payment(create(&account, &key))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::FailedPrecondition, "{lost:?}");
    assert!(
        lost.metadata()
            .get(idempotency_grpc::OUTCOME_UNKNOWN_STATUS)
            .is_none(),
        "the marker is the layer's, not the caller's"
    );
    assert_eq!(server.runs.of(&format!("{account}/charge")), 1);

    let resumed = client.create_payment(create(&account, &key)).await.unwrap();
    assert!(resumed.metadata().get("idempotent-replayed").is_none());
    let payment = resumed.into_inner();
    assert_eq!(payment.executions, 2, "the method ran again");
    assert!(payment.id.starts_with("pay-charge-1-"), "{}", payment.id);
    assert_eq!(
        server.runs.of(&format!("{account}/charge")),
        1,
        "the recorded step did not run again"
    );

    let replayed = client.create_payment(create(&account, &key)).await.unwrap();
    assert_eq!(
        replayed
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(replayed.into_inner().id, payment.id);
    assert_eq!(server.runs.of(&account), 2);
}

/// Without `Resume` the retry of an abandoned call is refused
/// `FAILED_PRECONDITION` `outcome-unknown`, as before: nothing runs.
pub(crate) async fn without_resume_the_retry_is_refused_outcome_unknown<S: Store>(store: S) {
    let server = start(Engine::new(store)).await;
    let mut client = server.client().await;
    let suffix = uuid::Uuid::new_v4();
    let (account, key) = (format!("step:{suffix}"), format!("refuse-{suffix}"));
    let lost = client
        .create_payment(create(&account, &key))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::FailedPrecondition, "{lost:?}");
    assert_eq!(lost.message(), "lost track after the charge");
    let refused = client
        .create_payment(create(&account, &key))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.get_details_error_info().map(|info| info.reason),
        Some(String::from("outcome-unknown"))
    );
    assert_eq!(server.runs.of(&account), 1, "the method did not run again");
    assert_eq!(server.runs.of(&format!("{account}/charge")), 1);
}
