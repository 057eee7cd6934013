//! A request waiting for an in-flight key is woken by the completion in
//! another process: PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub, and the
//! tiered store. Each "process" here is a store of its own (its own event
//! registry and listener) over the same database.

use std::time::{Duration, Instant};

use http::StatusCode;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::tiered::TieredStore;
use idempotency_guard::{IdempotencyLayer, InFlightPolicy, Store};

use crate::support::{app, call, request, send};

/// A waits-for-replay request through `waiting` is answered as soon as the
/// first request, through `running`, completes: long before its 20 s bound.
async fn a_waiter_elsewhere_is_woken_by_the_completion<S: Store>(running: S, waiting: S) {
    let (first, first_runs) = app(IdempotencyLayer::new(running));
    let (second, second_runs) = app(IdempotencyLayer::new(waiting)
        .with_in_flight(InFlightPolicy::Wait(Duration::from_secs(20))));
    let slow = tokio::spawn(async move {
        call(
            &first,
            request(Some("shared"))
                .header("x-delay-ms", "800")
                .body("{}".into())
                .unwrap(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let waited = send(&second, "shared", "{}").await;
    let took = started.elapsed();
    let original = slow.await.unwrap();
    assert_eq!(waited.status, StatusCode::CREATED);
    assert!(waited.replayed());
    assert_eq!(waited.body, original.body);
    assert!(
        took < Duration::from_secs(5),
        "woken after {took:?}, not at the 20 s bound"
    );
    assert_eq!(first_runs.get() + second_runs.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_notifications_wake_waiters_in_other_processes() {
    let db = idempotency_tests::postgres().await;
    let running = PostgresStore::new(db.store.pool().clone())
        .with_notifications()
        .await
        .unwrap();
    let waiting = PostgresStore::new(db.store.pool().clone())
        .with_notifications()
        .await
        .unwrap();
    a_waiter_elsewhere_is_woken_by_the_completion(running, waiting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_pub_sub_wakes_waiters_in_other_processes() {
    let server = idempotency_tests::RedisServer::start(false).await;
    let running = RedisStore::connect(&server.url(), "wake").await.unwrap();
    let waiting = RedisStore::connect(&server.url(), "wake").await.unwrap();
    a_waiter_elsewhere_is_woken_by_the_completion(running, waiting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tiered_store_wakes_waiters_in_other_processes_even_with_redis_down() {
    let db = idempotency_tests::postgres().await;
    let server = idempotency_tests::RedisServer::start(false).await;
    let partition = idempotency_tests::Partition::start(server.address).await;
    let tiered = |url: String| {
        let pool = db.store.pool().clone();
        async move {
            let cache = RedisStore::connect(&url, "wake").await.unwrap();
            let postgres = PostgresStore::new(pool)
                .with_events(cache.events().clone())
                .with_notifications()
                .await
                .unwrap();
            TieredStore::new(postgres, cache)
        }
    };
    let via_partition = format!("redis://{}", partition.address);
    let running = tiered(via_partition.clone()).await;
    let waiting = tiered(via_partition).await;
    // Redis is cut off: PostgreSQL notifications carry the wake-up alone.
    partition.cut();
    a_waiter_elsewhere_is_woken_by_the_completion(running, waiting).await;
}
