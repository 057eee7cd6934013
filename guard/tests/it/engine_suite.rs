//! The run-once engine used directly (no HTTP), and the request-path
//! guarantees that rest on it (leases renewed through a slow body, Stripe's
//! rule for rejections before work, nested mounts), on every store.
//!
//! `engine_suite!(name, fixture)` instantiates the suite for one backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, StatusCode};
use idempotency_guard::engine::{Answer, Engine, Job, Refusal, Settle, Settled};
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord, StoreError};
use idempotency_guard::{
    AbandonedPolicy, FinalResponse, Fingerprint, IdempotencyKey, IdempotencyLayer, OutcomeUnknown,
    Record, RecordEvents, RecordState, Scope, Store, StoredResponse,
};
use idempotency_tests::names;

use crate::support::{TestDb, call};

/// Instantiates the engine suite for one store.
macro_rules! engine_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::engine_suite as suite;

            engine_suite!(@tests $fixture;
                engine_runs_once_under_200_concurrent_callers,
                engine_keeps_json_outcomes,
                replay_cache_answers_without_the_store_until_told,
                the_replay_cache_is_on_by_default_and_can_be_turned_off,
                a_retried_claim_of_our_own_counts_as_acquired,
                a_completion_whose_answer_was_lost_counts_as_stored,
                an_ended_lease_is_never_renewed,
                streamed_body_slower_than_the_lease_is_not_taken_over,
                never_ending_body_ends_in_handler_timeout,
                extractor_rejections_release_the_key,
                final_client_errors_are_stored,
                an_unknown_outcome_abandons_the_key,
                status_only_routes_never_replay_the_body,
                nested_mounts_have_their_own_fingerprints,
                a_work_that_panics_before_its_future_releases_the_key,
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                suite::$test($fixture().await).await;
            }
        )*
    };
}

/// A unique key per test run, so shared stores never mix tests.
fn key(name: &str) -> String {
    format!("{name}-{}", LeaseToken::new().as_uuid().simple())
}

pub(crate) async fn engine_runs_once_under_200_concurrent_callers<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let job = Job::new(
        engine_scope(),
        valid(key("storm")),
        Fingerprint::of_bytes(b"charge 100"),
    );
    let callers: Vec<_> = (0..200)
        .map(|_| {
            let (engine, runs, job) = (engine.clone(), Arc::clone(&runs), job.clone());
            tokio::spawn(async move {
                engine
                    .run(job, move |_run| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Settle::Complete {
                            response: StoredResponse::from_bytes("charged"),
                            reply: "ran here",
                        }
                    })
                    .await
            })
        })
        .collect();
    let (mut ran, mut replayed, mut in_flight) = (0, 0, 0);
    for caller in callers {
        match caller.await.unwrap() {
            Answer::Ran { reply, .. } => {
                assert_eq!(reply, "ran here");
                ran += 1;
            }
            Answer::Replay(stored) => {
                assert_eq!(stored.body.as_deref(), Some(&b"charged"[..]));
                replayed += 1;
            }
            Answer::Refused(Refusal::RequestInFlight { .. }) => in_flight += 1,
            Answer::Refused(other) => panic!("unexpected refusal {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran more than once"
    );
    assert_eq!((ran, ran + replayed + in_flight), (1, 200));
    let again: Answer<()> = engine
        .run(job, |_run| async {
            panic!("a completed key must not run again")
        })
        .await;
    match again {
        Answer::Replay(stored) => assert_eq!(stored.body.as_deref(), Some(&b"charged"[..])),
        other => panic!("expected the replay, got {other:?}"),
    }
}

pub(crate) async fn engine_keeps_json_outcomes<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone());
    let key = key("json");
    let job = Job::new(
        engine_scope(),
        valid(&key),
        Fingerprint::of_bytes(b"order 7"),
    );
    let first: Vec<u32> = engine
        .run_json(job.clone(), |_run| async { vec![7, 42] })
        .await
        .unwrap();
    assert_eq!(first, [7, 42]);
    let replayed: Vec<u32> = engine
        .run_json(job, |_run| async { panic!("ran twice") })
        .await
        .unwrap();
    assert_eq!(replayed, [7, 42]);
    let other = Job::new(
        engine_scope(),
        valid(&key),
        Fingerprint::of_bytes(b"order 8"),
    );
    let reused = engine
        .run_json::<_, _, Vec<u32>>(other, |_run| async { panic!("ran for another payload") })
        .await;
    assert!(
        matches!(reused, Err(Refusal::KeyReused { .. })),
        "{reused:?}"
    );
}

/// A store whose client library sends every claim twice, as the Redis
/// Cluster client does when a script's reply times out: the second claim
/// finds the first one's record, with the request's own token.
#[derive(Clone)]
struct RetriedClaims<S>(S);

impl<S: Store> Store for RetriedClaims<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        let _lost_reply = self.0.claim(new).await?;
        self.0.claim(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.0.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.0.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.0.renew(lease, duration).await
    }

    async fn record_steps(
        &self,
        lease: &Lease,
        steps: &[idempotency_guard::Step],
    ) -> Result<(), StoreError> {
        self.0.record_steps(lease, steps).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.0.release(lease).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.0.get(scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        self.0.events()
    }
}

pub(crate) async fn a_retried_claim_of_our_own_counts_as_acquired<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(RetriedClaims(db.store.clone()));
    let runs = Arc::new(AtomicUsize::new(0));
    let job = Job::new(
        engine_scope(),
        valid(key("retried")),
        Fingerprint::of_bytes(b"x"),
    );
    let counter = Arc::clone(&runs);
    let answer = engine
        .run(job.clone(), move |_run| async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Settle::Complete {
                response: StoredResponse::from_bytes("ok"),
                reply: (),
            }
        })
        .await;
    assert!(
        matches!(answer, Answer::Ran { .. }),
        "the request was refused against its own claim: {answer:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
}

/// A store whose first completion lands but answers an error, as when the
/// connection drops before the answer arrives: the engine sends it again
/// and the resend finds the record completed.
#[derive(Clone)]
struct LostCompletionAnswer<S> {
    store: S,
    lost: Arc<AtomicBool>,
}

impl<S: Store> Store for LostCompletionAnswer<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.store.claim(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.store.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let landed = self.store.complete(lease, response).await;
        if self.lost.swap(true, Ordering::SeqCst) {
            return landed;
        }
        landed?;
        Err(StoreError::Unavailable(
            "the connection dropped before the answer".into(),
        ))
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.store.renew(lease, duration).await
    }

    async fn record_steps(
        &self,
        lease: &Lease,
        steps: &[idempotency_guard::Step],
    ) -> Result<(), StoreError> {
        self.store.record_steps(lease, steps).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.release(lease).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.store.get(scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        self.store.events()
    }
}

/// A completion that landed though its answer was lost is stored, not a
/// lost lease: the resend is refused (the record is completed), and the
/// engine finds the record completed with its own lease.
pub(crate) async fn a_completion_whose_answer_was_lost_counts_as_stored<S: Store>(db: TestDb<S>) {
    let lost = Arc::new(AtomicBool::new(false));
    let store = LostCompletionAnswer {
        store: db.store.clone(),
        lost: Arc::clone(&lost),
    };
    let engine = Engine::new(store).without_replay_cache();
    let job = Job::new(
        engine_scope(),
        valid(key("answer-lost")),
        Fingerprint::of_bytes(b"pay"),
    );
    let answer = engine
        .run(job.clone(), |_run| async {
            Settle::Complete {
                response: StoredResponse::from_bytes("paid"),
                reply: (),
            }
        })
        .await;
    assert!(
        lost.load(Ordering::SeqCst),
        "the first answer was lost: {answer:?}"
    );
    assert!(
        matches!(
            answer,
            Answer::Ran {
                settled: Settled::Stored,
                ..
            }
        ),
        "a landed completion counts as stored: {answer:?}"
    );
    let again: Answer<()> = engine.run(job, |_run| async { panic!("ran twice") }).await;
    match again {
        Answer::Replay(response) => assert_eq!(response, StoredResponse::from_bytes("paid")),
        other => panic!("the retry replays the stored outcome: {other:?}"),
    }
}

/// A store that counts the reads and claims that reach it.
#[derive(Clone)]
struct Counting<S> {
    store: S,
    calls: Arc<AtomicUsize>,
}

impl<S: Store> Store for Counting<S> {
    async fn claim(&self, new: &NewRecord<'_>) -> Result<Claim, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.store.claim(new).await
    }

    async fn take_over(
        &self,
        previous: LeaseToken,
        new: &NewRecord<'_>,
    ) -> Result<Option<Lease>, StoreError> {
        self.store.take_over(previous, new).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.store.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        self.store.renew(lease, duration).await
    }

    async fn record_steps(
        &self,
        lease: &Lease,
        steps: &[idempotency_guard::Step],
    ) -> Result<(), StoreError> {
        self.store.record_steps(lease, steps).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.release(lease).await
    }

    async fn get(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.store.get(scope, key).await
    }

    fn events(&self) -> &RecordEvents {
        self.store.events()
    }
}

pub(crate) async fn replay_cache_answers_without_the_store_until_told<S: Store>(db: TestDb<S>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Counting {
        store: db.store.clone(),
        calls: Arc::clone(&calls),
    };
    let engine = Engine::new(store).with_replay_cache(1 << 20, Duration::from_secs(60));
    let key = key("cached");
    let job = Job::new(engine_scope(), valid(&key), Fingerprint::of_bytes(b"a"));
    let first: u32 = engine
        .run_json(job.clone(), |_run| async { 7 })
        .await
        .unwrap();
    assert_eq!((first, calls.load(Ordering::SeqCst)), (7, 1));
    // A store that echoes its own completion to every process (Redis pub/sub)
    // drops the fresh copy once: the first replay may read the store.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let replayed: u32 = engine
        .run_json(job.clone(), |_run| async { panic!("ran twice") })
        .await
        .unwrap();
    assert_eq!(replayed, 7);
    let cached = calls.load(Ordering::SeqCst);
    assert!(cached <= 2, "{cached} store calls for one replay");
    for _ in 0..3 {
        let replayed: u32 = engine
            .run_json(job.clone(), |_run| async { panic!("ran twice") })
            .await
            .unwrap();
        assert_eq!(replayed, 7);
    }
    let reused = engine
        .run_json::<_, _, u32>(
            Job::new(engine_scope(), valid(&key), Fingerprint::of_bytes(b"b")),
            |_run| async { panic!("ran for another payload") },
        )
        .await;
    assert!(
        matches!(reused, Err(Refusal::KeyReused { .. })),
        "{reused:?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        cached,
        "a cached replay reached the store"
    );
    // The store says the record changed: the copy is dropped, the store read.
    db.store.events().publish("engine", &key);
    let replayed: u32 = engine
        .run_json(job, |_run| async { panic!("ran twice") })
        .await
        .unwrap();
    assert_eq!(replayed, 7);
    assert_eq!(calls.load(Ordering::SeqCst), cached + 1);
}

/// `Engine::new` keeps replays in its cache (a replay after the first
/// reads the store at most once); `without_replay_cache` reads the store
/// for every replay.
pub(crate) async fn the_replay_cache_is_on_by_default_and_can_be_turned_off<S: Store>(
    db: TestDb<S>,
) {
    for cached in [true, false] {
        let calls = Arc::new(AtomicUsize::new(0));
        let store = Counting {
            store: db.store.clone(),
            calls: Arc::clone(&calls),
        };
        let engine = match cached {
            true => Engine::new(store),
            false => Engine::new(store).without_replay_cache(),
        };
        let key = key("default-cache");
        let job = Job::new(engine_scope(), valid(&key), Fingerprint::of_bytes(b"a"));
        let first: u32 = engine
            .run_json(job.clone(), |_run| async { 7 })
            .await
            .unwrap();
        assert_eq!(first, 7);
        // As above: Redis's echo of the completion may drop the first copy.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = calls.load(Ordering::SeqCst);
        for _ in 0..4 {
            let replayed: u32 = engine
                .run_json(job.clone(), |_run| async { panic!("ran twice") })
                .await
                .unwrap();
            assert_eq!(replayed, 7);
        }
        let reads = calls.load(Ordering::SeqCst) - before;
        if cached {
            assert!(
                reads <= 1,
                "{reads} store calls for 4 replays with the default cache"
            );
        } else {
            assert_eq!(reads, 4, "without the cache every replay reads the store");
        }
    }
}

pub(crate) async fn an_ended_lease_is_never_renewed<S: Store>(db: TestDb<S>) {
    let fingerprint = Fingerprint::of_bytes(b"renew");
    let key = key("renew");
    let new = NewRecord {
        scope: names::scope("engine"),
        key: names::key(&key),
        fingerprint: &fingerprint,
        method: "RUN",
        path: "",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = db.store.claim(&new).await.unwrap() else {
        panic!("a fresh key was not acquired");
    };
    db.store
        .renew(&lease, Duration::from_secs(30))
        .await
        .unwrap();
    // The cut-off ends the lease; a renewal that was on its way lands late.
    db.store.renew(&lease, Duration::ZERO).await.unwrap();
    let late = db.store.renew(&lease, Duration::from_secs(30)).await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost)),
        "a late renewal revived an ended lease: {late:?}"
    );
    let record = db
        .store
        .get(names::scope("engine"), names::key(&key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
}

/// Runs per test router, and a guarded router over `handler` at `/things`.
fn router<S: Store, H, T>(layer: IdempotencyLayer<S>, handler: H) -> (Router, Arc<AtomicUsize>)
where
    H: axum::handler::Handler<T, Arc<AtomicUsize>>,
    T: 'static,
{
    let runs = Arc::new(AtomicUsize::new(0));
    let router = Router::new()
        .route("/things", post(handler))
        .route_layer(layer)
        .with_state(Arc::clone(&runs));
    (router, runs)
}

fn post_json(key: &str, content_type: &str, body: &str) -> Request<Body> {
    Request::post("/things")
        .header("idempotency-key", key)
        .header("content-type", content_type)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// Answers 201 at once, then sends its body in six chunks 400 ms apart:
/// 2.4 s of body against a 1 s lease.
async fn slow_body(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    let chunks = futures_util::stream::iter(0..6).then(|i| async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, std::io::Error>(Bytes::from(format!("chunk {i};")))
    });
    (StatusCode::CREATED, Body::from_stream(chunks))
}

pub(crate) async fn streamed_body_slower_than_the_lease_is_not_taken_over<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_lease(Duration::from_secs(1))
        .with_abandoned(AbandonedPolicy::RunAgain);
    let (router, runs) = router(layer, slow_body);
    let key = key("slow-body");
    let first = tokio::spawn({
        let (router, key) = (router.clone(), key.clone());
        async move { call(&router, post_json(&key, "application/json", "{}")).await }
    });
    // Past the lease, while the body is still being captured.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let during = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(
        during.problem(),
        "request-in-flight",
        "the key was taken over while its body was still being captured"
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body,
        "chunk 0;chunk 1;chunk 2;chunk 3;chunk 4;chunk 5;"
    );
    let replay = call(&router, post_json(&key, "application/json", "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran twice");
}

/// Answers 201 with a body that never ends.
async fn endless_body(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    let endless = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
    (StatusCode::CREATED, Body::from_stream(endless))
}

pub(crate) async fn never_ending_body_ends_in_handler_timeout<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_lease(Duration::from_secs(1))
        .with_max_handler_time(Duration::from_millis(1500));
    let (router, runs) = router(layer, endless_body);
    let key = key("endless");
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        call(&router, post_json(&key, "application/json", "{}")),
    )
    .await
    .expect("a body that never ends held the request past the maximum handler time");
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(answer.problem(), "handler-timeout");
    let retry = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(retry.problem(), "outcome-unknown");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Payment {
    amount: u64,
}

/// A handler whose `Json` extractor rejects malformed requests (415, 422)
/// before it starts.
async fn typed(
    State(runs): State<Arc<AtomicUsize>>,
    axum::Json(payment): axum::Json<Payment>,
) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, format!("paid {}", payment.amount))
}

pub(crate) async fn extractor_rejections_release_the_key<S: Store>(db: TestDb<S>) {
    let (router, runs) = router(IdempotencyLayer::new(db.store.clone()), typed);
    let key = key("typed");
    let wrong_type = call(&router, post_json(&key, "text/plain", r#"{"amount":5}"#)).await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let wrong_shape = call(&router, post_json(&key, "application/json", r#"{"amt":5}"#)).await;
    assert_eq!(wrong_shape.status, StatusCode::UNPROCESSABLE_ENTITY);
    let corrected = call(
        &router,
        post_json(&key, "application/json", r#"{"amount":5}"#),
    )
    .await;
    assert_eq!(
        corrected.status,
        StatusCode::CREATED,
        "the corrected request was refused: {:?}",
        corrected.body
    );
    assert_eq!(corrected.body, "paid 5");
    let replay = call(
        &router,
        post_json(&key, "application/json", r#"{"amount":5}"#),
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler that decides on a 422 after starting its work, and says so.
async fn declines(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::UNPROCESSABLE_ENTITY, FinalResponse, "declined")
}

pub(crate) async fn final_client_errors_are_stored<S: Store>(db: TestDb<S>) {
    let (router, runs) = router(IdempotencyLayer::new(db.store.clone()), declines);
    let key = key("declined");
    let first = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
    let replay = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(replay.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(replay.replayed(), "a final 422 was not stored");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler that lost track of its request (an upstream went silent).
async fn lost_track(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::BAD_GATEWAY, OutcomeUnknown, "upstream reset")
}

pub(crate) async fn an_unknown_outcome_abandons_the_key<S: Store>(db: TestDb<S>) {
    let (router, runs) = router(IdempotencyLayer::new(db.store.clone()), lost_track);
    let key = key("unknown");
    let first = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    assert_eq!(first.body, "upstream reset");
    let record = db
        .store
        .get(names::scope("default"), names::key(&key))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    let retry = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(retry.problem(), "outcome-unknown");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler that mints a secret.
async fn mints_a_secret(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, r#"{"api_key":"sk_live_secret"}"#)
}

pub(crate) async fn status_only_routes_never_replay_the_body<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone())
        .with_replay_policy(idempotency_guard::ReplayPolicy::status_only());
    let (router, runs) = router(layer, mints_a_secret);
    let key = key("secret");
    let first = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, r#"{"api_key":"sk_live_secret"}"#);
    let replay = call(&router, post_json(&key, "application/json", "{}")).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed());
    assert_eq!(replay.problem(), "response-not-replayable");
    let record = db
        .store
        .get(names::scope("default"), names::key(&key))
        .await
        .unwrap()
        .unwrap();
    let stored = record.response.unwrap();
    assert!(
        !String::from_utf8_lossy(stored.body.as_deref().unwrap_or_default()).contains("sk_live"),
        "the secret was stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn created(State(runs): State<Arc<AtomicUsize>>) -> impl IntoResponse {
    runs.fetch_add(1, Ordering::SeqCst);
    StatusCode::CREATED
}

pub(crate) async fn nested_mounts_have_their_own_fingerprints<S: Store>(db: TestDb<S>) {
    let (inner, runs) = router(IdempotencyLayer::new(db.store.clone()), created);
    let router = Router::new().nest("/a", inner.clone()).nest("/b", inner);
    let key = key("nested");
    let send = |path: &'static str| {
        Request::post(path)
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap()
    };
    let first = call(&router, send("/a/things")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other_mount = call(&router, send("/b/things")).await;
    assert_eq!(
        other_mount.problem(),
        "key-reused",
        "two mounts shared one fingerprint"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A work closure that panics while it makes its future (before any
/// `await`) is caught like a panic inside the future: the caller gets
/// `Failed`, the key is released, and a retry runs.
pub(crate) async fn a_work_that_panics_before_its_future_releases_the_key<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone());
    let job = Job::new(
        engine_scope(),
        valid(key("panics-early")),
        Fingerprint::of_bytes(b"x"),
    );
    let answer = engine
        .run(job.clone(), |_run| -> std::future::Ready<Settle<()>> {
            panic!("the work failed before its future existed")
        })
        .await;
    assert!(
        matches!(answer, Answer::Refused(Refusal::HandlerFailed { .. })),
        "{answer:?}"
    );
    let mut record = db.store.get(&job.scope, &job.key).await.unwrap();
    for _ in 0..50 {
        if record.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        record = db.store.get(&job.scope, &job.key).await.unwrap();
    }
    assert!(record.is_none(), "the key was not released: {record:?}");
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let retried = engine
        .run(job, move |_run| async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Settle::Complete {
                response: StoredResponse::from_bytes("ok"),
                reply: (),
            }
        })
        .await;
    assert!(matches!(retried, Answer::Ran { .. }), "{retried:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The scope of the engine suite's jobs.
fn engine_scope() -> idempotency_guard::Scope {
    idempotency_guard::Scope::new("engine").expect("a valid scope")
}

/// `key`, validated as the engine takes it.
fn valid(key: impl AsRef<str>) -> idempotency_guard::IdempotencyKey {
    idempotency_guard::IdempotencyKey::from_raw(key.as_ref()).expect("a valid key")
}
