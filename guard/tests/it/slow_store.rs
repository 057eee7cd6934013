//! A slow store: PostgreSQL with its records table locked by another
//! session. Requests must time out into 503 within the configured bound,
//! none may hang, and nothing may be left stuck once the lock is gone.

use std::time::{Duration, Instant};

use http::StatusCode;
use idempotency_guard::IdempotencyLayer;

use crate::support::{app, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_locked_store_times_out_into_503_within_the_bound_and_frees_every_key() {
    let db = idempotency_tests::postgres().await;
    let bound = Duration::from_millis(500);
    let (router, runs) = app(IdempotencyLayer::new(db.store.clone()).with_store_timeout(bound));
    let mut locker = db.store.pool().begin().await.unwrap();
    sqlx::query("lock table idempotency_records in access exclusive mode")
        .execute(&mut *locker)
        .await
        .unwrap();

    let answers = futures_util::future::join_all((0..20).map(|i| {
        let router = router.clone();
        async move {
            let started = Instant::now();
            let answer = send(&router, &format!("slow-{i}"), "{}").await;
            (answer, started.elapsed())
        }
    }))
    .await;
    for (answer, took) in &answers {
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.problem(), "store-unavailable");
        assert!(
            *took < Duration::from_secs(3),
            "answered in {took:?}: none hangs past the bound"
        );
    }
    assert_eq!(
        runs.get(),
        0,
        "no handler ran while the store could not answer"
    );

    // The lock goes; the claims that were queued behind it land and are
    // freed again, so every key runs on its retry, once.
    locker.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for i in 0..20 {
        let retry = send(&router, &format!("slow-{i}"), "{}").await;
        assert_eq!(
            retry.status,
            StatusCode::CREATED,
            "slow-{i}: {}",
            String::from_utf8_lossy(&retry.body)
        );
        assert!(!retry.replayed());
    }
    assert_eq!(runs.get(), 20);
}
