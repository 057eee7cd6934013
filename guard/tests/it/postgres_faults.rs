//! PostgreSQL under fire: every connection of the pool cut at once (a
//! server restart, a failover, a partition), then the server back.

use std::time::{Duration, Instant};

use http::StatusCode;
use idempotency_guard::IdempotencyLayer;
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_tests::{Answer, Partition, call};
use sqlx::postgres::PgConnectOptions;

use crate::redis_faults::{Runs, app, request};

/// While PostgreSQL is cut off, requests are refused and no handler runs
/// (fail closed); once it answers again, the same store serves, with no
/// restart of the app: the pool's dead connections are replaced, whether
/// the requests ran in the caller's task or in tasks of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_store_serves_again_once_its_cut_connections_are_back() {
    let database = idempotency_tests::postgres_database().await;
    let options: PgConnectOptions = database.url.parse().unwrap();
    let target = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let partition = Partition::start(target).await;
    let through_partition = format!(
        "postgres://{}@{}/{}",
        options.get_username(),
        partition.address,
        options.get_database().unwrap()
    );
    // The store as users open it (no ping before each statement).
    let store = PostgresStore::connect(&through_partition, 8).await.unwrap();
    store.migrate().await.unwrap();
    let runs = Runs::default();
    let router = app(IdempotencyLayer::new(store), &runs, "pg");
    let spawned = |key: String| {
        let router = router.clone();
        tokio::spawn(async move { call(&router, request(&key, 20)).await })
    };

    // Several requests at once, so the pool holds several connections.
    for answer in
        futures_util::future::join_all((0..8).map(|i| spawned(format!("before-{i}")))).await
    {
        assert_eq!(answer.unwrap().status, StatusCode::CREATED);
    }

    partition.cut();
    let during: Vec<Answer> =
        futures_util::future::join_all((0..6).map(|i| spawned(format!("during-{i}"))))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    for (i, answer) in during.iter().enumerate() {
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "refused while the store is cut off: {answer:?}"
        );
        assert_eq!(runs.of(&format!("during-{i}")), 0, "no handler ran");
    }

    partition.heal();
    let healed = Instant::now();
    loop {
        let answer = call(&router, request("after-heal", 0)).await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(15),
            "the store still refuses 15 s after PostgreSQL came back: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every connection serves again, from spawned tasks too (a dead
    // connection may fail one statement each, never more): within a few
    // rounds, a round of concurrent requests all run.
    let mut rounds = 0;
    loop {
        rounds += 1;
        let answers =
            futures_util::future::join_all((0..8).map(|i| spawned(format!("after-{rounds}-{i}"))))
                .await;
        if answers
            .iter()
            .all(|answer| answer.as_ref().unwrap().status == StatusCode::CREATED)
        {
            break;
        }
        assert!(rounds < 10, "a round still failed after {rounds} rounds");
    }
    // The keys refused during the cut were never claimed: they run now.
    for i in 0..6 {
        let key = format!("during-{i}");
        assert_eq!(
            call(&router, request(&key, 0)).await.status,
            StatusCode::CREATED
        );
        assert_eq!(runs.of(&key), 1);
    }
    assert!(call(&router, request("during-0", 0)).await.replayed());
}
