//! Transactional mode through the gRPC layer (PostgreSQL): the method's
//! writes through `idempotency_grpc::tx` commit with its stored answer,
//! roll back with a released one, and roll back when the run is cut off
//! (`UNAVAILABLE` `handler-timeout` + `RetryInfo`: safe to resend, and the
//! resend runs once).

use std::time::Duration;

use idempotency_guard::Engine;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_tests::TestDb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::server::start;

fn call(account: &str, key: &str) -> tonic::Request<crate::server::proto::CreatePaymentRequest> {
    let mut request = tonic::Request::new(crate::server::proto::CreatePaymentRequest {
        account: account.to_owned(),
        amount_cents: 10,
        currency: "EUR".to_owned(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

async fn rows(db: &TestDb<PostgresStore>, account: &str) -> i64 {
    sqlx::query_scalar("select count(*) from grpc_tx_writes where account = $1")
        .bind(account)
        .fetch_one(db.store.pool())
        .await
        .unwrap()
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// The method's writes follow its answer, and a cut-off run leaves
/// nothing behind.
pub(crate) async fn the_methods_writes_commit_with_its_stored_answer(db: TestDb<PostgresStore>) {
    sqlx::query("create table if not exists grpc_tx_writes (account text not null)")
        .execute(db.store.pool())
        .await
        .unwrap();
    let engine = Engine::new(db.store.clone())
        .with_transactional_mode(true)
        .with_max_handler_time(Duration::from_millis(1000));
    let server = start(engine).await;
    let mut client = server.client().await;
    let run = uuid::Uuid::new_v4().simple().to_string();

    // Stored: committed once, replayed.
    let account = format!("tx:ok:{run}");
    let key = format!("{run}-ok");
    let first = client.create_payment(call(&account, &key)).await.unwrap();
    let again = client.create_payment(call(&account, &key)).await.unwrap();
    assert_eq!(first.get_ref(), again.get_ref());
    assert_eq!(rows(&db, &account).await, 1);
    assert_eq!(server.runs.of(&account), 1);

    // Released: rolled back each time, the retry runs.
    let account = format!("tx:14:{run}");
    let key = format!("{run}-released");
    for run in 1..=2 {
        let status = client
            .create_payment(call(&account, &key))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            reason(&status),
            format!("handler-{}", Code::Unavailable as i32)
        );
        assert_eq!(server.runs.of(&account), run);
        assert_eq!(rows(&db, &account).await, 0);
    }

    // Cut off after writing: rolled back, safe to resend; the resend runs
    // once and commits once.
    let account = format!("tx:slowonce:{run}");
    let key = format!("{run}-cut");
    let status = client
        .create_payment(call(&account, &key))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "handler-timeout");
    assert!(status.get_details_retry_info().is_some());
    assert_eq!(rows(&db, &account).await, 0);
    let resent = client.create_payment(call(&account, &key)).await.unwrap();
    assert_eq!(resent.get_ref().executions, 2);
    let replayed = client.create_payment(call(&account, &key)).await.unwrap();
    assert_eq!(replayed.get_ref(), resent.get_ref());
    assert_eq!(rows(&db, &account).await, 1);

    // Outside transactional mode the method gets no transaction; its
    // refusal releases the key.
    let plain = start(Engine::new(db.store.clone())).await;
    let mut client = plain.client().await;
    let account = format!("tx:ok:{run}-plain");
    let status = client
        .create_payment(call(&account, &format!("{run}-plain")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(reason(&status), "transaction-unavailable");
    assert_eq!(rows(&db, &account).await, 0);
}
