//! A request waiting for an in-flight key is woken by the completion in
//! another process: PostgreSQL `LISTEN/NOTIFY`, Redis pub/sub, and the
//! tiered store. Each "process" here is a store of its own (its own event
//! registry and listener) over the same database.

use std::time::{Duration, Instant};

use http::StatusCode;
use idempotency_guard::store::batch::BatchLimits;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::tiered::TieredStore;
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, IdempotencyLayer, InFlightPolicy, Store, StoredResponse};
use idempotency_tests::names;

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

/// Redis publishes the end of a record (completion, release, abandonment)
/// only when a reader marked it watched, as a waiter does when it reads the
/// record before it waits: a fresh key nobody waits for sends no pub/sub
/// message to every process.
async fn redis_publishes_only_watched_ends(batching: BatchLimits) {
    use futures_util::StreamExt;
    let server = idempotency_tests::RedisServer::start(false).await;
    let store = RedisStore::connect(&server.url(), "watched")
        .await
        .unwrap()
        .with_batching(batching);
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("watched:events").await.unwrap();
    let mut messages = pubsub.on_message();
    let fingerprint = Fingerprint::from_bytes([1; 32]);
    let claim = |key: &'static str| {
        let store = store.clone();
        async move {
            let new = NewRecord {
                scope: names::scope("s"),
                key: names::key(key),
                fingerprint: &fingerprint,
                method: "POST",
                path: "/payments",
                token: LeaseToken::new(),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(60),
                transactional: false,
            };
            match store.claim(&new).await.unwrap() {
                Claim::Acquired(lease) => lease,
                Claim::Existing(record) => panic!("{key} was taken: {record:?}"),
            }
        }
    };
    let ok = StoredResponse::from_bytes("ok");
    let unwatched: Vec<Lease> = vec![claim("quiet-1").await, claim("quiet-2").await];
    store.complete(&unwatched[0], &ok).await.unwrap();
    store.release(&unwatched[1]).await.unwrap();
    let mut watched = Vec::new();
    for key in ["completed", "released", "abandoned"] {
        let lease = claim(key).await;
        let read = store
            .get(names::scope("s"), names::key(key))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.lease_token, lease.token);
        watched.push(lease);
    }
    store.complete(&watched[0], &ok).await.unwrap();
    store.release(&watched[1]).await.unwrap();
    store.renew(&watched[2], Duration::ZERO).await.unwrap();
    // Messages arrive in the order Redis ran the scripts: had an unwatched
    // end been published, it would come first.
    for key in ["completed", "released", "abandoned"] {
        let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
            .await
            .unwrap_or_else(|_| panic!("the end of watched {key} was not published"))
            .unwrap();
        let payload: String = message.get_payload().unwrap();
        assert!(
            payload.ends_with(&format!(":{key}")),
            "expected {key}, got {payload} (an unwatched end was published)"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), messages.next())
            .await
            .is_err(),
        "a message nobody should have sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_publishes_a_records_end_only_when_a_reader_watches_it() {
    redis_publishes_only_watched_ends(BatchLimits::OFF).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_redis_completions_publish_only_watched_ends() {
    redis_publishes_only_watched_ends(idempotency_guard::store::redis::PIPELINED_BATCHING).await;
}
