//! Redis under fire: restarts, partitions, lost leases, and the tiered
//! store running on PostgreSQL alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::tiered::FALLBACKS_TOTAL;
use idempotency_guard::telemetry::LEASE_LOST_TOTAL;
use idempotency_guard::{AbandonedPolicy, IdempotencyLayer, Store};
use idempotency_tests::{Answer, Partition, RedisServer, call, names};

use crate::metrics_probe;

/// Runs per key, and a handler that counts them.
#[derive(Clone, Default)]
pub(crate) struct Runs(Arc<Mutex<HashMap<String, usize>>>);

impl Runs {
    pub(crate) fn of(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

/// Counts a run of the request's key, sleeps `x-delay-ms`, answers 201
/// with the key and which layer ran it (`x-layer`).
async fn handler(
    State((runs, layer)): State<(Runs, &'static str)>,
    headers: HeaderMap,
) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    *runs.0.lock().unwrap().entry(key.clone()).or_default() += 1;
    if let Some(ms) = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    (StatusCode::CREATED, format!("{key} ran on {layer}"))
}

pub(crate) fn app<S: Store>(layer: IdempotencyLayer<S>, runs: &Runs, name: &'static str) -> Router {
    Router::new()
        .route("/faults", post(handler))
        .route_layer(layer)
        .with_state((runs.clone(), name))
}

pub(crate) fn request(key: &str, delay_ms: u64) -> Request<Body> {
    Request::post("/faults")
        .header("idempotency-key", key)
        .header("x-delay-ms", delay_ms.to_string())
        .body(Body::from("{}"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_restart_mid_run_never_runs_a_handler_twice() {
    // Durable Redis (append-only file, fsync always): a restart forgets nothing.
    let mut server = RedisServer::start(true).await;
    let store = RedisStore::connect(&server.url(), "restart").await.unwrap();
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(store)
        .with_store_timeout(Duration::from_millis(500))
        .with_lease(Duration::from_secs(2));
    let router = app(layer, &runs, "a");

    // 20 clients pay 15 times each, one payment after another, retrying
    // each until it answers, while Redis dies and comes back.
    let clients: Vec<_> = (0..20)
        .map(|client| {
            let router = router.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                let mut unavailable = 0;
                for payment in 0..15 {
                    let key = format!("payment-{client}-{payment}");
                    let outcome = 'retry: {
                        for _ in 0..100 {
                            let answer = call(&router, request(&key, 40)).await;
                            let problem = answer.status.is_client_error().then(|| answer.problem());
                            match (answer.status, problem.as_deref()) {
                                (StatusCode::CREATED, _) => break 'retry Some(answer),
                                (StatusCode::SERVICE_UNAVAILABLE, _) => unavailable += 1,
                                (StatusCode::CONFLICT, Some("request-in-flight")) => {}
                                // Its completion could not be stored during the outage.
                                (StatusCode::CONFLICT, Some("outcome-unknown")) => {
                                    break 'retry None;
                                }
                                (status, _) => panic!(
                                    "{key}: unexpected {status}: {}",
                                    String::from_utf8_lossy(&answer.body)
                                ),
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        panic!("{key}: no answer after 100 tries");
                    };
                    outcomes.push((key, outcome));
                }
                (outcomes, unavailable)
            })
        })
        .collect();
    // Down for longer than a completion's retries may last under the 2 s
    // lease (none runs past 200 ms before the lease's end), so some
    // outcomes are not stored, and new claims meet the outage too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart().await;

    let mut answered = 0;
    let mut unavailable = 0;
    for client in clients {
        let (outcomes, refused) = client.await.unwrap();
        unavailable += refused;
        for (key, answer) in outcomes {
            assert!(runs.of(&key) <= 1, "{key} ran {} times", runs.of(&key));
            if let Some(answer) = answer {
                answered += 1;
                assert_eq!(
                    runs.of(&key),
                    1,
                    "{key} answered 201, so it ran exactly once"
                );
                assert!(
                    String::from_utf8_lossy(&answer.body).starts_with(&key),
                    "{key} got its own answer"
                );
            }
        }
    }
    assert!(
        unavailable > 0,
        "the outage was real: some requests were refused with 503"
    );
    assert!(
        answered >= 270,
        "nearly every payment completed once Redis was back ({answered}/300)"
    );
    // Service resumed without restarting anything: a new key runs and replays.
    let fresh = call(&router, request("after-restart", 0)).await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert!(call(&router, request("after-restart", 0)).await.replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_lost_in_a_partition_is_fenced_and_reported() {
    metrics_probe::install();
    let server = RedisServer::start(false).await;
    let partition = Partition::start(server.address).await;
    // Instance A reaches Redis through a partition; instance B directly.
    let store_a = RedisStore::connect(&format!("redis://{}", partition.address), "lease")
        .await
        .unwrap();
    let store_b = RedisStore::connect(&server.url(), "lease").await.unwrap();
    let runs = Runs::default();
    let layer_a = IdempotencyLayer::new(store_a).with_lease(Duration::from_secs(1));
    let layer_b = IdempotencyLayer::new(store_b.clone()).with_abandoned(AbandonedPolicy::RunAgain);
    let (a, b) = (app(layer_a, &runs, "a"), app(layer_b, &runs, "b"));
    let lost_before = metrics_probe::counter(LEASE_LOST_TOTAL, &[("route", "/faults")]);

    let slow = tokio::spawn(async move { call(&a, request("contested", 3000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs.of("contested"), 1, "A holds the key and runs");
    partition.cut(); // A can no longer renew its 1 s lease
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let taken_over = call(&b, request("contested", 0)).await;
    assert_eq!(taken_over.status, StatusCode::CREATED);
    assert_eq!(
        taken_over.body, "contested ran on b",
        "B took the lapsed lease over"
    );
    partition.heal();
    let first = slow.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "A's caller still gets what A did"
    );

    // A's late completion was refused: the record holds B's answer.
    let record = store_b
        .get(names::scope("default"), names::key("contested"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.response.unwrap().body.unwrap(), "contested ran on b");
    assert!(call(&b, request("contested", 0)).await.body == "contested ran on b");
    let lost = metrics_probe::counter(LEASE_LOST_TOTAL, &[("route", "/faults")]) - lost_before;
    assert!(lost >= 1, "the refused completion was reported");
    assert_eq!(runs.total(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tiered_store_keeps_working_on_postgres_and_serves_replays_from_redis() {
    metrics_probe::install();
    let db = idempotency_tests::tiered().await;
    let runs = Runs::default();
    let router = app(IdempotencyLayer::new(db.store.clone()), &runs, "t");
    let replay = |key: &'static str| {
        let router = router.clone();
        async move { call(&router, request(key, 0)).await }
    };
    assert_eq!(replay("before").await.status, StatusCode::CREATED);
    assert!(replay("before").await.replayed());

    // Redis cut off: everything still works, on PostgreSQL alone.
    let fallbacks_before = metrics_probe::counter(FALLBACKS_TOTAL, &[]);
    db.redis_partition().unwrap().cut();
    let during: Vec<Answer> =
        futures_util::future::join_all((0..5).map(|_| replay("during"))).await;
    assert!(
        during
            .iter()
            .all(|a| a.status == StatusCode::CREATED || a.problem() == "request-in-flight")
    );
    assert!(replay("during").await.replayed());
    assert!(replay("before").await.replayed());
    assert!(
        metrics_probe::counter(FALLBACKS_TOTAL, &[]) > fallbacks_before,
        "fallbacks are counted"
    );

    // Redis back: the store uses it again, without a restart. Once a replay
    // goes through without a fallback, the copy is in Redis.
    db.redis_partition().unwrap().heal();
    let mut cached = false;
    for _ in 0..50 {
        let before = metrics_probe::counter(FALLBACKS_TOTAL, &[]);
        assert!(replay("during").await.replayed());
        if metrics_probe::counter(FALLBACKS_TOTAL, &[]) == before {
            cached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cached, "Redis was used again after it came back");
    // With PostgreSQL gone, completed keys still replay from Redis; new
    // keys fail closed.
    db.break_store().await;
    let replayed = replay("during").await;
    assert_eq!(replayed.status, StatusCode::CREATED);
    assert!(replayed.replayed(), "served from Redis alone");
    assert_eq!(
        replay("new-while-postgres-is-down").await.problem(),
        "store-unavailable"
    );
    assert_eq!(runs.of("during"), 1);
    assert_eq!(runs.of("before"), 1);
    assert_eq!(runs.of("new-while-postgres-is-down"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_copy_never_outlives_its_record() {
    let db = idempotency_tests::tiered().await;
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_lease(Duration::from_secs(1))
        .with_max_handler_time(Duration::from_millis(500))
        .with_retention(Duration::from_secs(3));
    let router = app(layer, &runs, "t");
    assert_eq!(
        call(&router, request("short-lived", 0)).await.status,
        StatusCode::CREATED
    );
    assert!(
        call(&router, request("short-lived", 0)).await.replayed(),
        "copied to Redis"
    );
    assert!(
        call(&router, request("short-lived", 0)).await.replayed(),
        "served from Redis"
    );
    tokio::time::sleep(Duration::from_millis(3300)).await;
    // The record's retention ended: the key is free, whatever Redis held.
    let again = call(&router, request("short-lived", 0)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed(), "a new run, not a stale copy");
    assert_eq!(runs.of("short-lived"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_reply_comes_too_late_is_released_and_runs_once_later() {
    let db = idempotency_tests::redis().await;
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(db.store.clone()).with_store_timeout(Duration::from_secs(1));
    let router = app(layer, &runs, "slow");
    // Redis acts on the claim at once, but its reply arrives after the
    // engine's 1 s store timeout (the connection arms no timer of its own:
    // the engine's alone answers): the request is refused (503) at that
    // bound, yet the record exists. Some task must free it.
    let partition = db.redis_partition().unwrap();
    partition.delay_replies(Duration::from_millis(1600));
    let started = std::time::Instant::now();
    let refused = call(&router, request("late-reply", 0)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.problem(), "store-unavailable");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "refused after {:?}: the store timeout did not bound the claim",
        started.elapsed()
    );
    partition.delay_replies(Duration::ZERO);
    // The background release lands (it went to Redis right behind the claim).
    let mut record = db
        .store
        .get(names::scope("default"), names::key("late-reply"))
        .await;
    for _ in 0..50 {
        if matches!(record, Ok(None)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        record = db
            .store
            .get(names::scope("default"), names::key("late-reply"))
            .await;
    }
    assert!(
        matches!(record, Ok(None)),
        "the late claim was left behind: {record:?}"
    );
    let retry = call(&router, request("late-reply", 0)).await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry got {:?}",
        retry.body
    );
    assert_eq!(runs.of("late-reply"), 1);
    let replay = call(&router, request("late-reply", 0)).await;
    assert!(replay.replayed());
    assert_eq!(runs.of("late-reply"), 1);
}

/// Redis forgets its scripts (a restart, a failover, `SCRIPT FLUSH`): each
/// store call that meets `NOSCRIPT` loads its script and is sent again,
/// once, and answers as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_call_loads_its_script_again_after_a_script_flush() {
    use idempotency_guard::store::batch::BatchLimits;
    use idempotency_guard::store::{Claim, LeaseToken, NewRecord};
    use idempotency_guard::{Fingerprint, RecordState, StoredResponse};

    let server = RedisServer::start(false).await;
    let client = redis::Client::open(server.url()).unwrap();
    let admin = client.get_multiplexed_async_connection().await.unwrap();
    let flush = || {
        let mut admin = admin.clone();
        async move {
            let () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut admin)
                .await
                .unwrap();
        }
    };
    let fingerprint = Fingerprint::from_bytes([9; 32]);
    for (name, batching) in [
        ("single", BatchLimits::OFF),
        (
            "batched",
            idempotency_guard::store::redis::PIPELINED_BATCHING,
        ),
    ] {
        let store = RedisStore::connect(&server.url(), name)
            .await
            .unwrap()
            .with_batching(batching);
        let new = NewRecord {
            scope: names::scope("s"),
            key: names::key("k"),
            fingerprint: &fingerprint,
            method: "POST",
            path: "/payments",
            token: LeaseToken::new(),
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(60),
            transactional: false,
        };
        flush().await;
        let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
            panic!("{name}: the fresh key was taken");
        };
        flush().await;
        store.renew(&lease, Duration::from_secs(30)).await.unwrap();
        flush().await;
        let read = store
            .get(names::scope("s"), names::key("k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.lease_token, lease.token, "{name}");
        flush().await;
        store
            .complete(&lease, &StoredResponse::from_bytes("paid"))
            .await
            .unwrap();
        flush().await;
        let Claim::Existing(record) = store.claim(&new).await.unwrap() else {
            panic!("{name}: the completed key was claimed again");
        };
        assert_eq!(record.state(), RecordState::Completed, "{name}");
        assert_eq!(
            record.response.unwrap().body.as_deref(),
            Some(b"paid".as_slice()),
            "{name}"
        );
    }
}
