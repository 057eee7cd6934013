//! Steps in a run and resuming an abandoned run (SPEC §12), on every store
//! that keeps steps: a step runs once and replays its recorded result when
//! the run resumes; a runner whose lease ended or was taken over records
//! nothing; a resumed run that asks for other steps is refused; through the
//! axum layer, a retry of an abandoned request resumes it and answers for
//! real.
//!
//! `steps_suite!(name, fixture)` instantiates the suite for one backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{Request, StatusCode};
use idempotency_guard::engine::{Answer, Engine, Job, Refusal, Run, Settle, StepError};
use idempotency_guard::store::{Claim, LeaseToken, NewRecord, StoreError};
use idempotency_guard::{
    AbandonedPolicy, Fingerprint, IdempotencyKey, IdempotencyLayer, OutcomeUnknown, RecordState,
    Scope, Step, Store, StoredResponse,
};

use crate::support::{TestDb, call};

/// Instantiates the steps suite for one store.
macro_rules! steps_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::steps as suite;

            steps_suite!(@tests $fixture;
                a_step_runs_once_then_replays_its_result_on_resume,
                a_runner_whose_lease_ended_or_was_taken_over_records_nothing,
                a_resumed_run_asking_for_other_steps_is_refused,
                a_take_over_of_an_expired_record_drops_its_steps,
                resume_through_the_layer_answers_for_real,
                resume_without_steps_runs_again,
                steps_are_sealed_in_an_encrypted_store,
                a_step_inside_a_step_is_refused,
                a_run_that_fails_after_a_step_keeps_it_instead_of_releasing,
                a_run_that_panics_after_a_step_keeps_it_instead_of_releasing,
                a_tried_step_records_only_its_success,
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
    IdempotencyKey::from_raw(&format!("{name}-{}", LeaseToken::new().as_uuid().simple())).unwrap()
}

fn scope() -> Scope {
    Scope::new("steps").unwrap()
}

/// Counts how often each step's closure ran.
#[derive(Clone, Default)]
struct Ran(Arc<[AtomicUsize; 3]>);

impl Ran {
    fn count(&self, step: usize) -> usize {
        self.0[step].load(Ordering::SeqCst)
    }

    fn hit(&self, step: usize) {
        self.0[step].fetch_add(1, Ordering::SeqCst);
    }
}

pub(crate) async fn a_step_runs_once_then_replays_its_result_on_resume<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("once"), Fingerprint::of_bytes(b"debit 100"));
    let ran = Ran::default();

    // The first run records `reserve`, then dies before `charge` is
    // recorded (its work gives up: the key is abandoned, as a crash leaves it).
    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let reserved: u32 = run
                .step("reserve", || async {
                    first.hit(0);
                    41
                })
                .await
                .unwrap();
            assert_eq!(reserved, 41);
            Settle::Abandon { reply: "crashed" }
        })
        .await;
    assert!(matches!(
        answer,
        Answer::Ran {
            reply: "crashed",
            ..
        }
    ));
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(
        record.steps,
        vec![Step {
            name: "reserve".into(),
            input: None,
            value: serde_json::json!(41),
        }]
    );

    // The retry resumes: `reserve` comes back recorded, `charge` runs.
    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let reserved: u32 = run
                .step("reserve", || async {
                    second.hit(0);
                    0
                })
                .await
                .unwrap();
            let charge_key = run.derived_key("charge");
            let charged: String = run
                .step("charge", || async {
                    second.hit(1);
                    format!("charged {reserved} with {}", &charge_key.as_str()[..8])
                })
                .await
                .unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes(charged.clone()),
                reply: charged,
            }
        })
        .await;
    let Answer::Ran { reply, .. } = answer else {
        panic!("the retry did not run: {answer:?}");
    };
    assert!(reply.starts_with("charged 41 with "), "{reply}");
    assert_eq!((ran.count(0), ran.count(1)), (1, 1));
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let names: Vec<&str> = record.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["reserve", "charge"]);

    // Completed: the stored answer, nothing runs.
    let third = ran.clone();
    let answer = engine
        .run(job.clone(), move |_run| async move {
            third.hit(2);
            Settle::Complete {
                response: StoredResponse::from_bytes("again"),
                reply: String::new(),
            }
        })
        .await;
    match answer {
        Answer::Replay(stored) => assert_eq!(stored.body.as_deref(), Some(reply.as_bytes())),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(ran.count(2), 0);
}

/// Claims `key` in the store with a lease of `lease`, as a runner does.
async fn claim<S: Store>(
    store: &S,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    lease: Duration,
    retention: Duration,
) -> Claim {
    let scope = scope();
    store
        .claim(&NewRecord {
            scope: &scope,
            key,
            fingerprint,
            method: "POST",
            path: "/debits",
            token: LeaseToken::new(),
            lease,
            retention,
            transactional: false,
        })
        .await
        .unwrap()
}

fn step(name: &str, value: serde_json::Value) -> Step {
    Step {
        name: name.into(),
        input: None,
        value,
    }
}

pub(crate) async fn a_runner_whose_lease_ended_or_was_taken_over_records_nothing<S: Store>(
    db: TestDb<S>,
) {
    let store = &db.store;
    let key = key("stale");
    let fingerprint = Fingerprint::of_bytes(b"debit 100");
    let Claim::Acquired(stale) = claim(
        store,
        &key,
        &fingerprint,
        Duration::from_millis(300),
        Duration::from_secs(3600),
    )
    .await
    else {
        panic!("a fresh key is acquired");
    };
    let reserve = step("reserve", serde_json::json!({"hold": 7}));
    store
        .record_steps(&stale, std::slice::from_ref(&reserve))
        .await
        .unwrap();

    // Its lease ends: it can no longer record.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let charge = step("charge", serde_json::json!("ch_1"));
    let both = [reserve.clone(), charge.clone()];
    assert!(matches!(
        store.record_steps(&stale, &both).await,
        Err(StoreError::LeaseLost)
    ));
    let record = store.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(record.steps, std::slice::from_ref(&reserve));

    // Taken over within its retention: the steps stay for the new runner,
    // and the stale runner still records nothing.
    let scope = scope();
    let new = NewRecord {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        method: "POST",
        path: "/debits",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let fresh = store
        .take_over(record.lease_token, &new)
        .await
        .unwrap()
        .expect("an abandoned record is taken over");
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::InFlight);
    assert_eq!(record.steps, std::slice::from_ref(&reserve));
    assert!(matches!(
        store.record_steps(&stale, &both).await,
        Err(StoreError::LeaseLost)
    ));
    store.record_steps(&fresh, &both).await.unwrap();
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!(record.steps, both);

    // Completed: nobody records any more.
    store
        .complete(&fresh, &StoredResponse::from_bytes("done"))
        .await
        .unwrap();
    assert!(matches!(
        store.record_steps(&fresh, &[reserve]).await,
        Err(StoreError::LeaseLost)
    ));
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!(record.steps, both);
}

pub(crate) async fn a_resumed_run_asking_for_other_steps_is_refused<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("order"), Fingerprint::of_bytes(b"debit 100"));
    let ran = Ran::default();
    let first = ran.clone();
    engine
        .run(job.clone(), move |run| async move {
            run.step_with_input("reserve", &100, || async {
                first.hit(0);
                "held".to_owned()
            })
            .await
            .unwrap();
            Settle::Abandon { reply: () }
        })
        .await;

    // Another order: refused, nothing runs, the key stays abandoned with
    // the steps it had.
    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let asked = run
                .step("charge", || async {
                    second.hit(1);
                    "charged".to_owned()
                })
                .await;
            Settle::Abandon { reply: asked }
        })
        .await;
    let Answer::Ran { reply, .. } = answer else {
        panic!("the resumed run did not run: {answer:?}");
    };
    match reply {
        Err(StepError::Mismatch {
            index,
            recorded,
            asked,
        }) => {
            assert_eq!(index, 0);
            assert!(recorded.starts_with("reserve"), "{recorded}");
            assert_eq!(asked, "charge");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }

    // The same step with another input: refused too.
    let third = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let asked = run
                .step_with_input("reserve", &200, || async {
                    third.hit(0);
                    "held".to_owned()
                })
                .await;
            Settle::Abandon { reply: asked }
        })
        .await;
    assert!(matches!(
        answer,
        Answer::Ran {
            reply: Err(StepError::Mismatch { index: 0, .. }),
            ..
        }
    ));

    // A recorded result of another type: refused, not garbled.
    let answer = engine
        .run(job.clone(), move |run| async move {
            let asked = run
                .step_with_input("reserve", &100, || async { 0_u64 })
                .await;
            Settle::Abandon { reply: asked }
        })
        .await;
    assert!(matches!(
        answer,
        Answer::Ran {
            reply: Err(StepError::Decode { .. }),
            ..
        }
    ));
    assert_eq!((ran.count(0), ran.count(1)), (1, 0));
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(record.steps.len(), 1);

    // The default policy never resumes: outcome-unknown, as before.
    let rejecting = Engine::new(db.store.clone());
    let answer = rejecting
        .run(job.clone(), |_run| async {
            Settle::Complete {
                response: StoredResponse::from_bytes("no"),
                reply: (),
            }
        })
        .await;
    assert!(matches!(
        answer,
        Answer::Refused(Refusal::OutcomeUnknown { .. })
    ));
}

pub(crate) async fn a_take_over_of_an_expired_record_drops_its_steps<S: Store>(db: TestDb<S>) {
    let store = &db.store;
    let key = key("expired");
    let fingerprint = Fingerprint::of_bytes(b"debit 100");
    let Claim::Acquired(lease) = claim(
        store,
        &key,
        &fingerprint,
        Duration::from_millis(200),
        Duration::from_millis(400),
    )
    .await
    else {
        panic!("a fresh key is acquired");
    };
    store
        .record_steps(&lease, &[step("reserve", serde_json::json!(1))])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Past its retention the key is free again: a new request claims it
    // with nothing of the old run's.
    match claim(
        store,
        &key,
        &fingerprint,
        Duration::from_secs(30),
        Duration::from_secs(3600),
    )
    .await
    {
        Claim::Acquired(_) => {} // the store expired it natively
        Claim::Existing(record) => {
            assert!(record.is_expired());
            let scope = scope();
            let new = NewRecord {
                scope: &scope,
                key: &key,
                fingerprint: &fingerprint,
                method: "POST",
                path: "/debits",
                token: LeaseToken::new(),
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(3600),
                transactional: false,
            };
            store
                .take_over(record.lease_token, &new)
                .await
                .unwrap()
                .expect("an expired record is taken over");
        }
    }
    let record = store.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::InFlight);
    assert!(record.steps.is_empty(), "{:?}", record.steps);
}

/// The app's state: what each step ran, and whether the next request
/// "crashes" after its first step.
#[derive(Clone, Default)]
struct Debits {
    ran: Ran,
    crash: Arc<AtomicUsize>,
}

/// A resumable debit: reserve, (crash?), charge with the derived key.
async fn debit(State(debits): State<Debits>, run: Run, body: String) -> Response {
    let reserve = run.step("reserve", || async {
        debits.ran.hit(0);
        format!("hold for {body}")
    });
    let hold = match reserve.await {
        Ok(hold) => hold,
        Err(error) => return error.into_response(),
    };
    if debits.crash.swap(0, Ordering::SeqCst) == 1 {
        // The process "dies" here: the answer is lost, the key abandoned.
        return (StatusCode::BAD_GATEWAY, OutcomeUnknown, "lost").into_response();
    }
    let psp_key = run.derived_key("charge");
    let charge = run.step("charge", || async {
        debits.ran.hit(1);
        format!("charged at the PSP with key {}", psp_key.as_str())
    });
    match charge.await {
        Ok(charge) => (StatusCode::CREATED, format!("{hold}; {charge}")).into_response(),
        Err(error) => error.into_response(),
    }
}

fn debit_app<S: Store>(layer: IdempotencyLayer<S>) -> (Router, Debits) {
    let debits = Debits::default();
    let router = Router::new()
        .route("/debits", post(debit))
        .route_layer(layer)
        .with_state(debits.clone());
    (router, debits)
}

fn debit_request(key: &IdempotencyKey) -> Request<Body> {
    Request::post("/debits")
        .header("idempotency-key", key.as_str())
        .body(Body::from("100"))
        .unwrap()
}

pub(crate) async fn resume_through_the_layer_answers_for_real<S: Store>(db: TestDb<S>) {
    let layer = IdempotencyLayer::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let (router, debits) = debit_app(layer);
    let key = key("layer");
    debits.crash.store(1, Ordering::SeqCst);
    let crashed = call(&router, debit_request(&key)).await;
    assert_eq!(crashed.status, StatusCode::BAD_GATEWAY);
    let record = db
        .store
        .get(&Scope::new("default").unwrap(), &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert_eq!(record.steps.len(), 1);

    // The client's retry resumes the run: the real answer, not a 409.
    let resumed = call(&router, debit_request(&key)).await;
    let text = String::from_utf8_lossy(&resumed.body).into_owned();
    assert_eq!(resumed.status, StatusCode::CREATED, "{text}");
    let psp_key = text
        .strip_prefix("hold for 100; charged at the PSP with key ")
        .unwrap_or_else(|| panic!("not the real answer: {text}"));
    // The key the charge step passed on is the run's derived key.
    assert_eq!(psp_key.len(), 64);
    assert!(IdempotencyKey::from_raw(psp_key).is_ok());
    assert_eq!((debits.ran.count(0), debits.ran.count(1)), (1, 1));

    // And again: the stored answer.
    let replayed = call(&router, debit_request(&key)).await;
    assert_eq!(replayed.status, StatusCode::CREATED);
    assert_eq!(replayed.body, resumed.body);
    assert_eq!(
        replayed
            .headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!((debits.ran.count(0), debits.ran.count(1)), (1, 1));

    // The same crash under the default policy: 409 outcome-unknown.
    let (router, debits) = debit_app(IdempotencyLayer::new(db.store.clone()));
    let key = self::key("default");
    debits.crash.store(1, Ordering::SeqCst);
    call(&router, debit_request(&key)).await;
    let refused = call(&router, debit_request(&key)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(
        refused.problem().ends_with("outcome-unknown"),
        "{}",
        refused.problem()
    );
    assert_eq!((debits.ran.count(0), debits.ran.count(1)), (1, 0));
}

pub(crate) async fn resume_without_steps_runs_again<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("again"), Fingerprint::of_bytes(b"ping"));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = Arc::clone(&runs);
    engine
        .run(job.clone(), move |_run| async move {
            first.fetch_add(1, Ordering::SeqCst);
            Settle::Abandon { reply: () }
        })
        .await;
    let second = Arc::clone(&runs);
    let answer = engine
        .run(job.clone(), move |_run| async move {
            second.fetch_add(1, Ordering::SeqCst);
            Settle::Complete {
                response: StoredResponse::from_bytes("pong"),
                reply: (),
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub(crate) async fn steps_are_sealed_in_an_encrypted_store<S: Store>(db: TestDb<S>) {
    use idempotency_guard::store::encrypted::{EncryptedStore, EncryptionKeys};
    const KEY_A: &str = "a:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEY_B: &str = "b:HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4=";
    let encrypted = EncryptedStore::new(db.store.clone(), EncryptionKeys::parse(KEY_A).unwrap());
    let key = key("sealed");
    let Claim::Acquired(lease) = claim(
        &encrypted,
        &key,
        &Fingerprint::of_bytes(b"debit"),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    )
    .await
    else {
        panic!("a fresh key is acquired");
    };
    let secret = step("charge", serde_json::json!({"card": "4242 4242 4242 4242"}));
    encrypted
        .record_steps(&lease, std::slice::from_ref(&secret))
        .await
        .unwrap();
    // The inner store keeps the name, never the result.
    let raw = db.store.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(raw.steps.len(), 1);
    assert_eq!(raw.steps[0].name, "charge");
    let sealed = raw.steps[0]
        .value
        .as_str()
        .expect("a sealed result is a string");
    assert!(sealed.starts_with("v1 a "), "{sealed}");
    assert!(!sealed.contains("4242"), "{sealed}");
    // Opened through the encrypted store; refused under a key it lacks.
    let read = encrypted.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(read.steps, [secret]);
    let other = EncryptedStore::new(db.store.clone(), EncryptionKeys::parse(KEY_B).unwrap());
    assert!(matches!(
        other.get(&scope(), &key).await,
        Err(StoreError::Corrupt(_))
    ));
}

pub(crate) async fn a_step_inside_a_step_is_refused<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("nested"), Fingerprint::of_bytes(b"debit"));
    let answer = engine
        .run(job, |context| async move {
            let run = context.run().clone();
            let outer = context
                .step("outer", || async move {
                    match run.step("inner", || async { 1 }).await {
                        Err(StepError::Overlapping { name }) => name,
                        other => panic!("a step inside a step ran: {other:?}"),
                    }
                })
                .await;
            Settle::Abandon { reply: outer }
        })
        .await;
    assert!(
        matches!(&answer, Answer::Ran { reply: Ok(inner), .. } if inner == "inner"),
        "{answer:?}"
    );
}

/// A run that fails (it would release the key) once the record holds a
/// step ends its lease instead: a release would delete the step and run it
/// again (the model's control `release-drops-steps`). The retry resumes
/// with the step recorded; a run with no step still releases.
pub(crate) async fn a_run_that_fails_after_a_step_keeps_it_instead_of_releasing<S: Store>(
    db: TestDb<S>,
) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("fails"), Fingerprint::of_bytes(b"debit 7"));
    let ran = Ran::default();
    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let _: u32 = run
                .step("reserve", || async {
                    first.hit(0);
                    7
                })
                .await
                .unwrap();
            Settle::Release {
                reply: "psp down",
                keep_writes: false,
            }
        })
        .await;
    assert!(
        matches!(
            answer,
            Answer::Ran {
                reply: "psp down",
                ..
            }
        ),
        "{answer:?}"
    );
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned, "kept, not released");
    assert_eq!(record.steps.len(), 1);

    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let reserved: u32 = run
                .step("reserve", || async {
                    second.hit(0);
                    0
                })
                .await
                .unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes(reserved.to_string()),
                reply: reserved,
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { reply: 7, .. }), "{answer:?}");
    assert_eq!(ran.count(0), 1, "the recorded step never ran again");

    // No step recorded: a failure releases the key, as before.
    let plain = Job::new(scope(), key("plain"), Fingerprint::of_bytes(b"debit 8"));
    let answer = engine
        .run(plain.clone(), |_run| async {
            Settle::Release {
                reply: (),
                keep_writes: false,
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    assert!(
        db.store
            .get(&plain.scope, &plain.key)
            .await
            .unwrap()
            .is_none()
    );
}

/// A run that panics once it recorded a step: like a failure, the key is
/// abandoned with its step kept (a release would delete it), and the
/// resumed retry gets the step's result without running it again.
pub(crate) async fn a_run_that_panics_after_a_step_keeps_it_instead_of_releasing<S: Store>(
    db: TestDb<S>,
) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("panics"), Fingerprint::of_bytes(b"debit 9"));
    let ran = Ran::default();
    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let reserved: u32 = run
                .step("reserve", || async {
                    first.hit(0);
                    9
                })
                .await
                .unwrap();
            if reserved == 9 {
                panic!("a bug after the step");
            }
            Settle::Release {
                reply: reserved,
                keep_writes: false,
            }
        })
        .await;
    assert!(
        matches!(answer, Answer::Refused(Refusal::HandlerFailed { .. })),
        "{answer:?}"
    );
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned, "kept, not released");
    assert_eq!(record.steps.len(), 1);

    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let reserved: u32 = run
                .step("reserve", || async {
                    second.hit(0);
                    0
                })
                .await
                .unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes(reserved.to_string()),
                reply: reserved,
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { reply: 9, .. }), "{answer:?}");
    assert_eq!(ran.count(0), 1, "the recorded step never ran again");
}

/// `try_step` records a success only: a failed try is not recorded (the
/// step is not taken), a second try in the same run runs and records its
/// success, and a resumed run gets that success back without running.
pub(crate) async fn a_tried_step_records_only_its_success<S: Store>(db: TestDb<S>) {
    let engine = Engine::new(db.store.clone()).with_abandoned(AbandonedPolicy::Resume);
    let job = Job::new(scope(), key("tried"), Fingerprint::of_bytes(b"debit 10"));
    let ran = Ran::default();
    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let failed: Result<u32, &str> = run
                .try_step("charge", || async {
                    first.hit(0);
                    Err("psp 503")
                })
                .await
                .unwrap();
            assert_eq!(failed, Err("psp 503"));
            let charged: Result<u32, &str> = run
                .try_step("charge", || async {
                    first.hit(0);
                    Ok(42)
                })
                .await
                .unwrap();
            assert_eq!(charged, Ok(42));
            Settle::Abandon { reply: () }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.steps.len(), 1, "the failed try left no step");
    assert_eq!(record.steps[0].value, serde_json::json!(42));
    assert_eq!(ran.count(0), 2);

    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let charged: Result<u32, &str> = run
                .try_step("charge", || async {
                    second.hit(0);
                    Ok(0)
                })
                .await
                .unwrap();
            let charged = charged.unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes(charged.to_string()),
                reply: charged,
            }
        })
        .await;
    assert!(
        matches!(answer, Answer::Ran { reply: 42, .. }),
        "{answer:?}"
    );
    assert_eq!(ran.count(0), 2, "the recorded success never ran again");
}
