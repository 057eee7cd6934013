//! The README's mount snippet and the client's README snippet, run: the
//! client's write reaches the guarded route with a key (a write without one
//! gets 400 there).

use axum::http::StatusCode;

#[tokio::test]
async fn the_mounted_guard_answers_the_readme_client() {
    // The mount snippet opens `app.db` in the working directory.
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::env::set_current_dir(dir.path()).expect("enter the temporary directory");
    let app = idempotency_outside::mount()
        .await
        .expect("the mount snippet");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let api = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let response = idempotency_outside::pay(&api, "http://127.0.0.1:9")
        .await
        .expect("the client's payment");
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response.text().await.expect("the body"),
        r#"{"amount":4200,"currency":"EUR"}"#
    );

    // The same route without a key: 400, so the 201 above came with one.
    let unkeyed = reqwest::Client::new()
        .post(format!("{api}/payments"))
        .body("{}")
        .send()
        .await
        .expect("an answer");
    assert_eq!(unkeyed.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_readme_engine_runs_a_message_once() {
    use idempotency_guard::engine::Refusal;
    use idempotency_guard::store::{AnyStore, sqlite::SqliteStore};

    let store = AnyStore::from(SqliteStore::memory().await.expect("a memory store"));
    let first = idempotency_outside::consume(store.clone(), "m-1", b"12345".to_vec())
        .await
        .expect("the first delivery runs");
    assert_eq!(first.charged, 5);
    let again = idempotency_outside::consume(store.clone(), "m-1", b"12345".to_vec())
        .await
        .expect("a redelivery gets the stored receipt");
    assert_eq!(again.charged, 5);
    let reused = idempotency_outside::consume(store, "m-1", b"other".to_vec())
        .await
        .expect_err("the same id with another payload is refused");
    assert!(
        matches!(
            reused.downcast_ref::<Refusal>(),
            Some(Refusal::KeyReused { key }) if key.as_str() == "m-1"
        ),
        "{reused}"
    );
}
