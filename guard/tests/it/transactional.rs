//! Transactional mode on PostgreSQL: the handler's writes commit with the
//! stored response, or not at all. Every test of both modes runs in each
//! ([`Mode`]); a few are one mode's own.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::{IdempotencyLayer, RecordState, Store, Tx};
use tokio::sync::Notify;

use crate::support::{abandon, call, request, send};
use idempotency_tests::{names, postgres};

/// Lets a test hold the handler between its write and its answer.
#[derive(Clone, Default)]
struct Hooks {
    wrote: Arc<Notify>,
    proceed: Arc<Notify>,
}

/// Inserts one payment row through the guard's transaction, then obeys
/// `x-delay-ms`, `x-status`, `x-hold` (wait for the test), `x-panic` and
/// `x-no-store`.
async fn pay(
    State(hooks): State<Hooks>,
    mut tx: Tx,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, String) {
    let (id,): (i64,) = sqlx::query_as("insert into payments_t (body) values ($1) returning id")
        .bind(body.to_vec())
        .fetch_one(&mut *tx)
        .await
        .expect("insert the payment");
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if header("x-hold").is_some() {
        hooks.wrote.notify_one();
        hooks.proceed.notified().await;
    }
    if let Some(ms) = header("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if header("x-panic").is_some() {
        panic!("told to panic after writing");
    }
    let status = header("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut out = HeaderMap::new();
    if header("x-no-store").is_some() {
        out.insert("cache-control", "no-store".parse().unwrap());
    }
    (status, out, format!(r#"{{"id":{id}}}"#))
}

/// The two transactional modes: a committed claim with a lease, or the
/// key held by an advisory lock in one transaction that commits once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Claimed,
    SingleCommit,
}

/// Runs each named test (an `async fn(Mode)`) in both modes.
macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod claimed {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Mode::Claimed).await
                }
            )*
        }
        mod single_commit {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Mode::SingleCommit).await
                }
            )*
        }
    };
}

in_both_modes!(
    writes_commit_with_the_stored_response,
    a_failure_status_rolls_writes_back_and_frees_the_key,
    a_panic_rolls_writes_back,
    a_timeout_rolls_back_and_the_retry_runs_once,
    a_crashed_run_is_taken_over_and_runs_once,
    no_store_keeps_the_writes_and_frees_the_key,
    concurrent_identical_requests_write_once,
    a_savepoint_in_the_handlers_tx_nests,
);

async fn setup(
    mode: Mode,
    layer: impl FnOnce(IdempotencyLayer<PostgresStore>) -> IdempotencyLayer<PostgresStore>,
) -> (idempotency_tests::TestDb<PostgresStore>, Router, Hooks) {
    let db = postgres().await;
    sqlx::query("create table payments_t (id bigserial primary key, body bytea not null)")
        .execute(db.store.pool())
        .await
        .unwrap();
    let hooks = Hooks::default();
    let guard = layer(
        IdempotencyLayer::new(db.store.clone())
            .with_transactional_mode(true)
            .with_single_commit(mode == Mode::SingleCommit),
    );
    let router = Router::new()
        .route("/things", post(pay))
        .route_layer(guard)
        .with_state(hooks.clone());
    (db, router, hooks)
}

async fn payments(store: &PostgresStore) -> i64 {
    sqlx::query_scalar("select count(*) from payments_t")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn post_with(key: &str, name: &str, value: &str) -> http::Request<Body> {
    request(Some(key))
        .header(name, value)
        .body(Body::from("{}"))
        .unwrap()
}

async fn writes_commit_with_the_stored_response(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    let first = send(&router, "k", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = send(&router, "k", "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(payments(&db.store).await, 1);
    let record = db
        .store
        .get(names::scope("default"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert!(record.transactional);
    assert_eq!(record.state(), RecordState::Completed);
}

async fn a_failure_status_rolls_writes_back_and_frees_the_key(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    assert_eq!(
        call(&router, post_with("k", "x-status", "500"))
            .await
            .status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(payments(&db.store).await, 0, "the write was rolled back");
    assert!(
        db.store
            .get(names::scope("default"), names::key("k"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(send(&router, "k", "{}").await.status, StatusCode::CREATED);
    assert_eq!(payments(&db.store).await, 1);
}

async fn a_panic_rolls_writes_back(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    let answer = call(&router, post_with("k", "x-panic", "1")).await;
    assert_eq!(answer.problem(), "handler-failed");
    assert_eq!(payments(&db.store).await, 0);
    assert_eq!(send(&router, "k", "{}").await.status, StatusCode::CREATED);
    assert_eq!(payments(&db.store).await, 1);
}

async fn a_timeout_rolls_back_and_the_retry_runs_once(mode: Mode) {
    let (db, router, _) = setup(mode, |l| {
        l.with_max_handler_time(Duration::from_millis(300))
    })
    .await;
    let answer = call(&router, post_with("k", "x-delay-ms", "3000")).await;
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(answer.problem(), "handler-timeout");
    assert_eq!(payments(&db.store).await, 0, "cut off: nothing committed");
    assert!(
        db.store
            .get(names::scope("default"), names::key("k"))
            .await
            .unwrap()
            .is_none(),
        "and the key is free"
    );
    assert_eq!(send(&router, "k", "{}").await.status, StatusCode::CREATED);
    assert!(send(&router, "k", "{}").await.replayed());
    assert_eq!(payments(&db.store).await, 1);
}

async fn a_crashed_run_is_taken_over_and_runs_once(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    // A process claimed the key, wrote in its transaction and died: the
    // transaction rolled back and its lease lapsed.
    abandon(&db.store, "crashed", "{}", true).await;
    let answers =
        futures_util::future::join_all((0..20).map(|_| send(&router, "crashed", "{}"))).await;
    let executed = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .count();
    assert_eq!(executed, 1, "exactly one retry takes over");
    assert!(
        answers
            .iter()
            .all(|a| a.status == StatusCode::CREATED || a.problem() == "request-in-flight")
    );
    assert_eq!(payments(&db.store).await, 1, "no duplicate row");
    assert!(send(&router, "crashed", "{}").await.replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_refuses_the_completion_and_rolls_back() {
    let (db, router, hooks) = setup(Mode::Claimed, |l| l).await;
    let first = tokio::spawn({
        let router = router.clone();
        async move { call(&router, post_with("k", "x-hold", "1")).await }
    });
    hooks.wrote.notified().await;
    // Another request takes the record over (as after a lapsed lease).
    sqlx::query("update idempotency_records set lease_token = gen_random_uuid()")
        .execute(db.store.pool())
        .await
        .unwrap();
    hooks.proceed.notify_one();
    let answer = first.await.unwrap();
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(
        answer.problem(),
        "request-in-flight",
        "the new holder answers for the key"
    );
    assert_eq!(
        payments(&db.store).await,
        0,
        "the fenced-out run committed nothing"
    );
}

async fn no_store_keeps_the_writes_and_frees_the_key(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    assert_eq!(
        call(&router, post_with("k", "x-no-store", "1"))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(payments(&db.store).await, 1);
    assert!(
        db.store
            .get(names::scope("default"), names::key("k"))
            .await
            .unwrap()
            .is_none()
    );
}

async fn concurrent_identical_requests_write_once(mode: Mode) {
    let (db, router, _) = setup(mode, |l| l).await;
    let answers = futures_util::future::join_all((0..200).map(|_| {
        let router = router.clone();
        async move { call(&router, post_with("same", "x-delay-ms", "200")).await }
    }))
    .await;
    assert_eq!(payments(&db.store).await, 1);
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
            .count(),
        1
    );
    for answer in &answers {
        assert!(
            answer.status == StatusCode::CREATED || answer.problem() == "request-in-flight",
            "{mode:?}: {} {}",
            answer.status,
            answer.problem()
        );
    }
}

/// A handler on a transactional route that never takes its `Tx`: its
/// effects (here, only a counter) are outside any transaction.
async fn outside_effect(State(runs): State<Arc<std::sync::atomic::AtomicUsize>>) -> StatusCode {
    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    StatusCode::CREATED
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_without_tx_killed_mid_way_is_not_run_again() {
    a_run_without_tx_killed_mid_way(Mode::Claimed).await;
}

/// Single-commit mode keeps nothing of a dead run: the retry runs (which
/// repeats an effect outside the transaction, as documented).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_commit_run_killed_mid_way_leaves_nothing_and_runs_again() {
    a_run_without_tx_killed_mid_way(Mode::SingleCommit).await;
}

/// Counts its runs and answers at once (the retry after a crash).
async fn quick_effect(State(runs): State<Arc<std::sync::atomic::AtomicUsize>>) -> StatusCode {
    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    StatusCode::CREATED
}

async fn a_run_without_tx_killed_mid_way(mode: Mode) {
    let db = postgres().await;
    let schema: String = sqlx::query_scalar("select current_schema()")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The "process" that crashes: a runtime of its own, shut down mid-run
    // (its tasks vanish, nothing renews the 1 s lease).
    let (running_tx, running) = std::sync::mpsc::channel();
    let (crash, crashed) = std::sync::mpsc::channel::<()>();
    let process = std::thread::spawn({
        let runs = Arc::clone(&runs);
        move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.spawn(async move {
                let url = format!(
                    "{}?options=-csearch_path%3D{schema}",
                    idempotency_tests::fixtures::postgres_url()
                );
                let store = PostgresStore::connect(&url, 4).await.unwrap();
                let layer = IdempotencyLayer::new(store)
                    .with_transactional_mode(true)
                    .with_single_commit(mode == Mode::SingleCommit)
                    .with_lease(Duration::from_secs(1));
                let router = Router::new()
                    .route("/things", post(outside_effect))
                    .route_layer(layer)
                    .with_state(Arc::clone(&runs));
                let pending = tokio::spawn(async move { send(&router, "no-tx", "{}").await });
                while runs.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                running_tx.send(()).unwrap();
                let _ = pending.await;
            });
            crashed.recv().unwrap();
            runtime.shutdown_background();
        }
    });
    running
        .recv_timeout(Duration::from_secs(20))
        .expect("the handler started");
    crash.send(()).unwrap();
    process.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if mode == Mode::SingleCommit {
        // The dead process's connection went with it: so did the lock and
        // the uncommitted claim.
        assert_eq!(
            db.store.locks_held("default", &["no-tx"]).await.unwrap(),
            vec![false]
        );
        assert!(
            db.store
                .get(names::scope("default"), names::key("no-tx"))
                .await
                .unwrap()
                .is_none()
        );
        let guard = IdempotencyLayer::new(db.store.clone())
            .with_transactional_mode(true)
            .with_single_commit(true);
        let router = Router::new()
            .route("/things", post(quick_effect))
            .route_layer(guard)
            .with_state(Arc::clone(&runs));
        assert_eq!(
            send(&router, "no-tx", "{}").await.status,
            StatusCode::CREATED
        );
        assert!(send(&router, "no-tx", "{}").await.replayed());
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
        return;
    }
    let record = db
        .store
        .get(names::scope("default"), names::key("no-tx"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !record.transactional,
        "a run that never began its transaction was recorded as transactional"
    );
    assert_eq!(record.state(), RecordState::Abandoned);
    // After the restart: the same request must not run again.
    let guard = IdempotencyLayer::new(db.store.clone()).with_transactional_mode(true);
    let router = Router::new()
        .route("/things", post(outside_effect))
        .route_layer(guard)
        .with_state(Arc::clone(&runs));
    let retry = send(&router, "no-tx", "{}").await;
    assert_eq!(retry.problem(), "outcome-unknown");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A handler that opens a transaction of its own in its `Tx` gets a
/// savepoint: rolling it back undoes its writes alone, and the run's
/// transaction (kept on the store's connection, `store/postgres/kept.rs`)
/// still commits the rest with the stored response.
async fn a_savepoint_in_the_handlers_tx_nests(mode: Mode) {
    async fn nested(mut tx: Tx) -> StatusCode {
        use sqlx::Connection as _;
        let mut savepoint = tx.begin().await.expect("a savepoint");
        sqlx::query("insert into payments_t (body) values ('undone')")
            .execute(&mut *savepoint)
            .await
            .expect("insert in the savepoint");
        savepoint.rollback().await.expect("roll the savepoint back");
        sqlx::query("insert into payments_t (body) values ('kept')")
            .execute(&mut *tx)
            .await
            .expect("insert after it");
        StatusCode::CREATED
    }
    let (db, _, _) = setup(mode, |l| l).await;
    let router = Router::new().route("/things", post(nested)).route_layer(
        IdempotencyLayer::new(db.store.clone())
            .with_transactional_mode(true)
            .with_single_commit(mode == Mode::SingleCommit),
    );
    for key in ["a", "b"] {
        assert_eq!(send(&router, key, "{}").await.status, StatusCode::CREATED);
    }
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar("select body from payments_t order by id")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(bodies, vec![b"kept".to_vec(), b"kept".to_vec()]);
    assert!(
        send(&router, "a", "{}").await.replayed(),
        "the run was stored"
    );
}

/// The connection a run's transaction ended on is kept for the next run
/// (out of sqlx's pool, which would ping it: `store/postgres/kept.rs`),
/// and goes back to the pool once unused: an application sharing a pool
/// of two gets both connections at once soon after the runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_kept_between_runs_goes_back_to_the_pool_unused() {
    let (db, _, _) = setup(Mode::SingleCommit, |l| l).await;
    let options = db.store.pool().connect_options().as_ref().clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .unwrap();
    let store = PostgresStore::new(pool.clone());
    let router = Router::new()
        .route("/things", post(pay))
        .route_layer(
            IdempotencyLayer::new(store)
                .with_transactional_mode(true)
                .with_single_commit(true),
        )
        .with_state(Hooks::default());
    for key in ["a", "b", "c"] {
        assert_eq!(send(&router, key, "{}").await.status, StatusCode::CREATED);
    }
    // Kept: checked out of the pool, not idle in it.
    assert_eq!(
        (pool.size(), pool.num_idle()),
        (1, 0),
        "one connection served the three runs, kept between them"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pool.num_idle(), 1, "unused, it went back to the pool");
    let started = std::time::Instant::now();
    let held = (pool.acquire().await, pool.acquire().await);
    assert!(
        held.0.is_ok() && held.1.is_ok(),
        "the application gets every connection of its pool"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(payments(&db.store).await, 3);
}

// ---------------------------------------------------------------------------
// Single-commit mode's own promises.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_commit_holds_the_key_by_its_lock_alone() {
    let (db, router, hooks) = setup(Mode::SingleCommit, |l| l).await;
    let first = tokio::spawn({
        let router = router.clone();
        async move { call(&router, post_with("k", "x-hold", "1")).await }
    });
    hooks.wrote.notified().await;
    assert!(
        db.store
            .get(names::scope("default"), names::key("k"))
            .await
            .unwrap()
            .is_none(),
        "nothing is committed while the handler runs"
    );
    assert_eq!(
        db.store
            .locks_held("default", &["k", "other"])
            .await
            .unwrap(),
        vec![true, false],
        "the key's advisory lock says it is in flight"
    );
    let second = send(&router, "k", "{}").await;
    assert_eq!(second.problem(), "request-in-flight");
    hooks.proceed.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        db.store.locks_held("default", &["k"]).await.unwrap(),
        vec![false],
        "the commit freed the lock"
    );
    let record = db
        .store
        .get(names::scope("default"), names::key("k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    assert!(send(&router, "k", "{}").await.replayed());
    assert_eq!(payments(&db.store).await, 1);
}

/// Advisory locks are per database: two stores in two schemas of one
/// database (one per tenant) each hold the same key at once; neither
/// answers "in flight" because of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_commit_stores_in_two_schemas_do_not_share_locks() {
    let (tenant_a, router_a, hooks_a) = setup(Mode::SingleCommit, |l| l).await;
    let (tenant_b, router_b, _) = setup(Mode::SingleCommit, |l| l).await;
    let held = tokio::spawn({
        let router = router_a.clone();
        async move { call(&router, post_with("k", "x-hold", "1")).await }
    });
    hooks_a.wrote.notified().await;
    assert_eq!(
        tenant_b.store.locks_held("default", &["k"]).await.unwrap(),
        vec![false],
        "tenant a's lock is not tenant b's"
    );
    let other = send(&router_b, "k", "{}").await;
    assert_eq!(other.status, StatusCode::CREATED, "{:?}", other.body);
    hooks_a.proceed.notify_one();
    assert_eq!(held.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(payments(&tenant_a.store).await, 1);
    assert_eq!(payments(&tenant_b.store).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_commit_waiters_get_the_replay() {
    let (db, router, _) = setup(Mode::SingleCommit, |l| {
        l.with_in_flight(idempotency_guard::InFlightPolicy::Wait(
            Duration::from_secs(10),
        ))
    })
    .await;
    let answers = futures_util::future::join_all((0..20).map(|_| {
        let router = router.clone();
        async move { call(&router, post_with("waited", "x-delay-ms", "300")).await }
    }))
    .await;
    assert!(
        answers.iter().all(|a| a.status == StatusCode::CREATED),
        "every waiter gets the first run's answer"
    );
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(payments(&db.store).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_single_commit_run_is_ended_by_postgresql() {
    let db = postgres().await;
    let fingerprint = idempotency_guard::Fingerprint::of_bytes(b"{}");
    let new = idempotency_guard::store::NewRecord {
        scope: names::scope("default"),
        key: names::key("hung"),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/things",
        token: idempotency_guard::store::LeaseToken::new(),
        lease: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        transactional: true,
    };
    // A process that claimed and then hung (never used its transaction again).
    let claimed = db
        .store
        .claim_locked(&new, Duration::from_millis(300))
        .await
        .unwrap();
    let idempotency_guard::store::postgres::LockedClaim::Acquired { transaction, .. } = claimed
    else {
        panic!("the first claim takes the lock: {claimed:?}");
    };
    assert_eq!(
        db.store.locks_held("default", &["hung"]).await.unwrap(),
        vec![true]
    );
    let mut freed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if db.store.locks_held("default", &["hung"]).await.unwrap() == vec![false] {
            freed = true;
            break;
        }
    }
    assert!(
        freed,
        "idle_in_transaction_session_timeout ended the transaction"
    );
    assert!(
        transaction.commit().await.is_err(),
        "the hung run cannot commit afterwards"
    );
    let retry = db
        .store
        .claim_locked(
            &idempotency_guard::store::NewRecord {
                token: idempotency_guard::store::LeaseToken::new(),
                ..new
            },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            retry,
            idempotency_guard::store::postgres::LockedClaim::Acquired { .. }
        ),
        "the retry runs: {retry:?}"
    );
}
