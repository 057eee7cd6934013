//! The completer (SPEC §12), on every store that keeps steps and stored
//! requests: a run abandoned after its first step is finished by the
//! completer (through the axum layer and through `Engine::run`), the step
//! already recorded does not run again, and the client's retry gets the
//! stored answer; attempts run out into a stored give-up; nothing happens
//! without opting in; the completer and a client's retry never both run a
//! key; a stored request is sealed in an encrypted store.
//!
//! No test waits on a clock: the grace period and backoff are zero, and
//! each test calls `Completer::run_once` itself.
//!
//! `completer_suite!(name, fixture)` instantiates the suite for one backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use idempotency_guard::Store as _;
use idempotency_guard::engine::{
    Answer, Completer, CompleterRound, Engine, Job, Run, RunContext, Settle,
};
use idempotency_guard::store::encrypted::{EncryptedStore, EncryptionKeys};
use idempotency_guard::store::{AdminStore, Claim, LeaseToken, NewRecord, StoreError};
use idempotency_guard::{
    AbandonedPolicy, Fingerprint, IdempotencyKey, IdempotencyLayer, OutcomeUnknown, RecordState,
    Scope, Step, StoredRequest, StoredResponse,
};
use tokio::sync::Semaphore;

use crate::support::{TestDb, call};

/// Instantiates the completer suite for one store.
macro_rules! completer_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::completer as suite;

            completer_suite!(@tests $fixture;
                the_completer_finishes_a_route_abandoned_after_a_step,
                the_completer_finishes_an_engine_run_from_its_stored_request,
                attempts_run_out_into_a_stored_give_up,
                a_client_retry_keeps_the_completers_attempts,
                nothing_is_kept_or_completed_without_opting_in,
                the_completer_and_a_client_retry_never_both_run_a_key,
                a_stored_request_is_sealed_in_an_encrypted_store,
                a_kept_request_is_fenced_and_survives_the_holders_writes,
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
fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::from_raw(&format!(
        "{name}-{}",
        idempotency_guard::store::LeaseToken::new()
            .as_uuid()
            .simple()
    ))
    .unwrap()
}

/// The permits of the charge's gate: a test that takes them all closes it.
const GATE: usize = 1_000_000;

/// The app's state: how often each step ran, whether the next request
/// "crashes" after its first step, whether every charge fails, and a gate
/// the charge waits at (open unless a test closes it).
#[derive(Clone)]
struct Debits {
    reserved: Arc<AtomicUsize>,
    charged: Arc<AtomicUsize>,
    crash: Arc<AtomicUsize>,
    psp_down: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Default for Debits {
    fn default() -> Self {
        Self {
            reserved: Arc::default(),
            charged: Arc::default(),
            crash: Arc::default(),
            psp_down: Arc::default(),
            gate: Arc::new(Semaphore::new(GATE)),
        }
    }
}

impl Debits {
    fn counts(&self) -> (usize, usize) {
        (
            self.reserved.load(Ordering::SeqCst),
            self.charged.load(Ordering::SeqCst),
        )
    }

    /// The debit's steps: reserve, then (unless it crashes or the PSP is
    /// down) charge with the derived key. `Err` leaves the key abandoned.
    async fn debit(&self, run: &Run, amount: &str) -> Result<String, String> {
        let hold = run
            .step("reserve", || async {
                self.reserved.fetch_add(1, Ordering::SeqCst);
                format!("hold for {amount}")
            })
            .await
            .map_err(|error| error.to_string())?;
        if self.crash.swap(0, Ordering::SeqCst) == 1 {
            return Err("crashed".into());
        }
        let _open = self.gate.acquire().await.map_err(|e| e.to_string())?;
        if self.psp_down.load(Ordering::SeqCst) == 1 {
            self.charged.fetch_add(1, Ordering::SeqCst);
            return Err("psp down".into());
        }
        let psp_key = run.derived_key("charge");
        let charge = run
            .step("charge", || async {
                self.charged.fetch_add(1, Ordering::SeqCst);
                format!("charged with key {}", &psp_key.as_str()[..8])
            })
            .await
            .map_err(|error| error.to_string())?;
        Ok(format!("{hold}; {charge}"))
    }
}

/// The resumable debit route.
async fn debit(State(debits): State<Debits>, run: Run, body: String) -> Response {
    match debits.debit(&run, &body).await {
        Ok(answer) => (StatusCode::CREATED, answer).into_response(),
        // The process "dies" (or the PSP fails): the key is left abandoned.
        Err(why) => (StatusCode::BAD_GATEWAY, OutcomeUnknown, why).into_response(),
    }
}

/// A router with the debit route behind `layer`, and its engine.
fn debit_app<S: idempotency_guard::Store>(
    layer: IdempotencyLayer<S>,
) -> (Router, Debits, Engine<S>) {
    let debits = Debits::default();
    let engine = layer.engine().clone();
    let router = Router::new()
        .route("/debits", post(debit))
        .route_layer(layer)
        .with_state(debits.clone());
    (router, debits, engine)
}

fn debit_request(key: &IdempotencyKey) -> Request<Body> {
    Request::post("/debits")
        .header("idempotency-key", key.as_str())
        .header("content-type", "text/plain")
        .header("x-tenant-note", "kept")
        .header("authorization", "Bearer not-kept")
        .body(Body::from("100"))
        .unwrap()
}

/// A resumable layer that keeps its requests for the completer.
fn resumable<S: idempotency_guard::Store>(store: S) -> IdempotencyLayer<S> {
    IdempotencyLayer::new(store)
        .with_abandoned(AbandonedPolicy::Resume)
        .with_stored_request([http::HeaderName::from_static("x-tenant-note")])
}

fn default_scope() -> Scope {
    Scope::new("default").unwrap()
}

fn completer_of<S: AdminStore>(engine: Engine<S>, router: Router) -> Completer<S> {
    Completer::for_service(engine, router)
        .with_grace(Duration::ZERO)
        .with_backoff(Duration::ZERO, Duration::ZERO)
}

fn round(completed: usize, failed: usize, gave_up: usize, skipped: usize) -> CompleterRound {
    let mut round = CompleterRound::default();
    (round.completed, round.failed, round.gave_up, round.skipped) =
        (completed, failed, gave_up, skipped);
    round
}

pub(crate) async fn the_completer_finishes_a_route_abandoned_after_a_step<S: AdminStore>(
    db: TestDb<S>,
) {
    let (router, debits, engine) = debit_app(resumable(db.store.clone()));
    let key = key("route");
    debits.crash.store(1, Ordering::SeqCst);
    let crashed = call(&router, debit_request(&key)).await;
    assert_eq!(crashed.status, StatusCode::BAD_GATEWAY);
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(record.steps.len(), 1);
    let stored = record.request.as_deref().expect("the request is kept");
    assert_eq!(
        (stored.method.as_str(), stored.path.as_str()),
        ("POST", "/debits")
    );
    assert_eq!(&stored.body[..], b"100");
    assert_eq!(stored.headers.get("x-tenant-note").unwrap(), "kept");
    assert_eq!(stored.headers.get("idempotency-key").unwrap(), key.as_str());
    assert!(
        stored.headers.get("authorization").is_none(),
        "only named headers"
    );
    assert_eq!((stored.attempts, stored.gave_up), (0, false));

    // The completer finishes it: `reserve` comes back recorded, `charge` runs.
    let completer = completer_of(engine, router.clone());
    assert_eq!(completer.run_once().await, round(1, 0, 0, 0));
    assert_eq!(debits.counts(), (1, 1));
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    // Its one attempt is counted (the tiered store's cache keeps a
    // completed record without its request).
    assert_eq!(record.request.as_deref().map_or(1, |r| r.attempts), 1);

    // The client's retry gets the stored answer; nothing runs again.
    let replayed = call(&router, debit_request(&key)).await;
    assert_eq!(replayed.status, StatusCode::CREATED);
    let text = String::from_utf8_lossy(&replayed.body).into_owned();
    assert!(
        text.starts_with("hold for 100; charged with key "),
        "{text}"
    );
    assert_eq!(
        replayed
            .headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(debits.counts(), (1, 1));
    // A completed key is not the completer's any more.
    assert_eq!(completer.run_once().await, CompleterRound::default());
}

/// The work of an `Engine::run` debit, rebuilt from its stored request.
async fn engine_debit(debits: Debits, request: StoredRequest, context: RunContext) -> Settle<()> {
    let amount = String::from_utf8_lossy(&request.body).into_owned();
    match debits.debit(context.run(), &amount).await {
        Ok(answer) => Settle::Complete {
            response: StoredResponse::from_bytes(answer),
            reply: (),
        },
        Err(_) => Settle::Abandon { reply: () },
    }
}

fn engine_job(key: &IdempotencyKey) -> Job {
    Job::new(
        Scope::new("completer").unwrap(),
        key.clone(),
        Fingerprint::of_bytes(b"debit 250"),
    )
    .with_request("RUN", "debit")
    .with_stored_request(StoredRequest::new("RUN", "debit", HeaderMap::new(), "250"))
}

pub(crate) async fn the_completer_finishes_an_engine_run_from_its_stored_request<S: AdminStore>(
    db: TestDb<S>,
) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let debits = Debits::default();
    let key = key("engine");
    let job = engine_job(&key);
    debits.crash.store(1, Ordering::SeqCst);
    let first = debits.clone();
    let request = job.stored_request.as_deref().cloned().unwrap();
    let answer = engine
        .run(job.clone(), move |context| {
            engine_debit(first, request, context)
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(&record.request.as_deref().unwrap().body[..], b"250");

    let work = debits.clone();
    let completer = Completer::for_work(engine.clone(), move |request, context| {
        engine_debit(work.clone(), request, context)
    })
    .with_scopes([Scope::new("completer").unwrap()])
    .with_grace(Duration::ZERO);
    assert_eq!(completer.run_once().await, round(1, 0, 0, 0));
    assert_eq!(debits.counts(), (1, 1));

    // The client's retry: the stored answer, built from the stored body.
    let again = debits.clone();
    let answer = engine
        .run(job, move |_context| async move {
            again.reserved.fetch_add(1, Ordering::SeqCst);
            Settle::Abandon { reply: () }
        })
        .await;
    assert_eq!(debits.counts(), (1, 1), "a completed key runs nothing");
    match answer {
        Answer::Replay(stored) => {
            let body = String::from_utf8_lossy(stored.body.as_deref().unwrap()).into_owned();
            assert!(body.starts_with("hold for 250; charged"), "{body}");
        }
        other => panic!("expected the replay, got {other:?}"),
    }
}

pub(crate) async fn attempts_run_out_into_a_stored_give_up<S: AdminStore>(db: TestDb<S>) {
    let (router, debits, engine) = debit_app(resumable(db.store.clone()));
    let key = key("give-up");
    debits.psp_down.store(1, Ordering::SeqCst);
    let failed = call(&router, debit_request(&key)).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(debits.counts(), (1, 1));

    let completer = completer_of(engine, router.clone()).with_max_attempts(2);
    assert_eq!(completer.run_once().await, round(0, 1, 0, 0));
    assert_eq!(completer.run_once().await, round(0, 1, 0, 0));
    // Two attempts ran the failing charge; `reserve` never ran again.
    assert_eq!(debits.counts(), (1, 3));
    assert_eq!(completer.run_once().await, round(0, 0, 1, 0));
    assert_eq!(debits.counts(), (1, 3), "giving up runs nothing");
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(record.steps.len(), 1, "the give-up keeps the steps");
    let stored = record.request.as_deref().unwrap();
    assert_eq!((stored.attempts, stored.gave_up), (2, true));
    // Given up: left alone, for a person.
    assert_eq!(completer.run_once().await, CompleterRound::default());
    assert_eq!(debits.counts(), (1, 3));
}

pub(crate) async fn a_client_retry_keeps_the_completers_attempts<S: AdminStore>(db: TestDb<S>) {
    let (router, debits, engine) = debit_app(resumable(db.store.clone()));
    let key = key("retry-count");
    debits.psp_down.store(1, Ordering::SeqCst);
    let failed = call(&router, debit_request(&key)).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    let attempts = || async {
        let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
        record.request.expect("the request is kept").attempts
    };

    let completer = completer_of(engine, router.clone()).with_max_attempts(2);
    assert_eq!(completer.run_once().await, round(0, 1, 0, 0));
    assert_eq!(attempts().await, 1);
    // The client's retry resumes the run (the charge fails again) and keeps
    // its request again: the completer's count goes on, not from zero.
    let retried = call(&router, debit_request(&key)).await;
    assert_eq!(retried.status, StatusCode::BAD_GATEWAY);
    assert_eq!(debits.counts(), (1, 3));
    assert_eq!(
        attempts().await,
        1,
        "a client's retry gives the completer no fresh attempts"
    );
    // One attempt left, then the give-up.
    assert_eq!(completer.run_once().await, round(0, 1, 0, 0));
    assert_eq!(completer.run_once().await, round(0, 0, 1, 0));
    assert_eq!(debits.counts(), (1, 4));
}

pub(crate) async fn nothing_is_kept_or_completed_without_opting_in<S: AdminStore>(db: TestDb<S>) {
    // A resumable route that does not keep its request.
    let layer = IdempotencyLayer::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let (router, debits, engine) = debit_app(layer);
    let key = key("off");
    debits.crash.store(1, Ordering::SeqCst);
    call(&router, debit_request(&key)).await;
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert!(record.request.is_none());
    // Even a completer finds nothing to finish there.
    let completer = completer_of(engine, router.clone());
    assert_eq!(completer.run_once().await, CompleterRound::default());
    assert_eq!(debits.counts(), (1, 0));
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
}

pub(crate) async fn the_completer_and_a_client_retry_never_both_run_a_key<S: AdminStore>(
    db: TestDb<S>,
) {
    let (router, debits, engine) = debit_app(resumable(db.store.clone()));
    let key = key("fenced");
    debits.crash.store(1, Ordering::SeqCst);
    call(&router, debit_request(&key)).await;

    // The completer's attempt holds the key (its charge waits at the gate):
    // the client's retry meanwhile is refused in flight, and runs nothing.
    let held = debits
        .gate
        .acquire_many(u32::try_from(GATE).unwrap())
        .await
        .unwrap();
    let completer = completer_of(engine, router.clone());
    let attempt = tokio::spawn({
        let completer = completer.clone();
        async move { completer.run_once().await }
    });
    let in_flight = loop {
        let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
        if record.state() == RecordState::InFlight {
            break record;
        }
        tokio::task::yield_now().await;
    };
    let refused = call(&router, debit_request(&key)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(
        refused.problem().ends_with("request-in-flight"),
        "{}",
        refused.problem()
    );
    // A second completer finds nothing due: the key is in flight.
    assert_eq!(completer.run_once().await, CompleterRound::default());
    drop(held);
    assert_eq!(attempt.await.unwrap(), round(1, 0, 0, 0));
    assert_eq!(debits.counts(), (1, 1));
    let record = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    assert_eq!(
        record.lease_token, in_flight.lease_token,
        "the completer's own run"
    );
}

pub(crate) async fn a_stored_request_is_sealed_in_an_encrypted_store<S: AdminStore>(db: TestDb<S>) {
    const KEY_A: &str = "a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEY_B: &str = "b:HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=";
    let encrypted = EncryptedStore::new(db.store.clone(), EncryptionKeys::parse(KEY_A).unwrap());
    let (router, debits, engine) = debit_app(resumable(encrypted.clone()));
    let key = key("sealed");
    debits.crash.store(1, Ordering::SeqCst);
    call(&router, debit_request(&key)).await;
    // The inner store keeps it sealed: neither the body nor a header shows.
    let raw = db.store.get(&default_scope(), &key).await.unwrap().unwrap();
    let sealed = raw.request.as_deref().unwrap();
    assert!(sealed.is_sealed());
    assert!(sealed.path.is_empty() && sealed.headers.is_empty());
    let bytes = String::from_utf8_lossy(&sealed.body).into_owned();
    assert!(!bytes.contains("100") && !bytes.contains("kept"), "{bytes}");
    // Opened through the encrypted store; refused under a key it lacks.
    let opened = encrypted
        .get(&default_scope(), &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&opened.request.as_deref().unwrap().body[..], b"100");
    let other = EncryptedStore::new(db.store.clone(), EncryptionKeys::parse(KEY_B).unwrap());
    assert!(other.get(&default_scope(), &key).await.is_err());
    // The completer, over the encrypted store, finishes it.
    let completer = completer_of(engine, router.clone());
    assert_eq!(completer.run_once().await, round(1, 0, 0, 0));
    assert_eq!(debits.counts(), (1, 1));
}

/// A kept request is written like the steps: it survives the holder's
/// other writes (renewal, steps, completion) and a take-over within the
/// retention; a
/// runner whose lease ended, or was taken over, keeps none.
pub(crate) async fn a_kept_request_is_fenced_and_survives_the_holders_writes<S: AdminStore>(
    db: TestDb<S>,
) {
    let store = &db.store;
    let (scope, key) = (default_scope(), key("fenced"));
    let fingerprint = Fingerprint::of_bytes(b"debit 100");
    let new = |token| NewRecord {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        method: "POST",
        path: "/debits",
        token,
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(stale) = store.claim(&new(LeaseToken::new())).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let kept = |attempts| {
        let mut request =
            StoredRequest::new("POST", "/debits", HeaderMap::new(), format!("{attempts}"));
        request.attempts = attempts;
        request
    };
    let request_of = || async {
        let record = store.get(&scope, &key).await.unwrap().unwrap();
        (record.request.map(|request| *request), record.steps.len())
    };
    let reserve = Step {
        name: "reserve".into(),
        input: None,
        value: serde_json::json!({"hold": 7}),
    };
    store.record_request(&stale, Some(&kept(0))).await.unwrap();
    store
        .record_steps(&stale, std::slice::from_ref(&reserve))
        .await
        .unwrap();
    store.renew(&stale, Duration::from_secs(30)).await.unwrap();
    assert_eq!(request_of().await, (Some(kept(0)), 1));
    store.record_request(&stale, Some(&kept(1))).await.unwrap();
    assert_eq!(request_of().await, (Some(kept(1)), 1), "the steps stay");

    // Its lease ends: it can no longer keep a request.
    store.renew(&stale, Duration::ZERO).await.unwrap();
    assert!(matches!(
        store.record_request(&stale, Some(&kept(2))).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(request_of().await, (Some(kept(1)), 1));

    // Taken over: the request stays for the new runner; the stale one
    // still keeps nothing, the new one replaces or clears it.
    let fresh = store
        .take_over(stale.token, &new(LeaseToken::new()))
        .await
        .unwrap()
        .expect("an abandoned record is taken over");
    assert_eq!(request_of().await, (Some(kept(1)), 1));
    assert!(matches!(
        store.record_request(&stale, None).await,
        Err(StoreError::LeaseLost)
    ));
    store.record_request(&fresh, Some(&kept(2))).await.unwrap();
    assert_eq!(request_of().await, (Some(kept(2)), 1));
    store.record_request(&fresh, None).await.unwrap();
    assert_eq!(request_of().await, (None, 1));
    store.record_request(&fresh, Some(&kept(3))).await.unwrap();

    // Completed: nobody keeps one any more.
    store
        .complete(&fresh, &StoredResponse::from_bytes("done"))
        .await
        .unwrap();
    assert_eq!(
        request_of().await,
        (Some(kept(3)), 1),
        "kept by the completion"
    );
    assert!(matches!(
        store.record_request(&fresh, Some(&kept(4))).await,
        Err(StoreError::LeaseLost)
    ));
}
