//! The service over a real socket, asked through the typed client.

use std::time::Duration;

use idempotency_client::status::{LookupResult, Status, StatusClient, StatusError};
use idempotency_guard::store::AnyStore;

use crate::support::{FP, Seed, TOKEN_A, TOKEN_B, router, seed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typed_client_reads_every_state_over_a_socket() {
    let db = idempotency_tests::sqlite().await;
    for (key, state) in [
        ("done", Seed::Completed),
        ("running", Seed::InFlight),
        ("lost", Seed::Abandoned),
    ] {
        seed(&db.store, "tenant-a", key, state).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server =
        tokio::spawn(axum::serve(listener, router(AnyStore::from(db.store.clone()))).into_future());
    let base = format!("http://{address}");
    let client = StatusClient::new(&base, TOKEN_A);

    assert_eq!(client.status("done").await.unwrap(), Status::Ran(201));
    assert_eq!(
        client.status("running").await.unwrap(),
        Status::Running(Duration::from_secs(1))
    );
    assert_eq!(client.status("lost").await.unwrap(), Status::Unknown);
    assert_eq!(client.status("never").await.unwrap(), Status::NotFound);
    let details = client
        .details("done", Some(&FP.to_string()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(details.fingerprint_matches, Some(true));

    let other_tenant = StatusClient::new(&base, TOKEN_B);
    assert_eq!(
        other_tenant.status("done").await.unwrap(),
        Status::NotFound,
        "another scope's key is absent"
    );
    let stranger = StatusClient::new(&base, "token-of-nobody-0123456789");
    assert!(matches!(
        stranger.status("done").await,
        Err(StatusError::Unauthorized)
    ));
    assert!(matches!(
        client.status("has space").await,
        Err(StatusError::BadRequest(_))
    ));

    let results = client.lookup(&["done", "never"]).await.unwrap();
    assert!(
        matches!(&results[0], LookupResult::Found(status) if status.key == "done" && status.found == Some(true))
    );
    assert!(
        matches!(&results[1], LookupResult::Missing(missing) if missing.key == "never" && !missing.found)
    );
    server.abort();
}
