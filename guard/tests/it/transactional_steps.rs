//! Transactional steps on PostgreSQL (issue 52, item 2): a step's writes
//! through its `Tx` and its recorded result commit in one transaction, so a
//! local step is exactly once. Proven against a real PostgreSQL: they
//! commit together; a step cut off (its future dropped) or whose connection
//! dies before the commit leaves neither; a resumed run skips the committed
//! step and its writes are there once. In transactional mode (a committed
//! claim) and in single-commit mode (one transaction for the whole run).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use idempotency_guard::engine::{Answer, Engine, Job, Refusal, Run, Settle, StepError};
use idempotency_guard::store::postgres::PostgresStore;
use idempotency_guard::{
    Fingerprint, IdempotencyKey, IdempotencyLayer, OutcomeUnknown, RecordState, Scope, Store,
    StoredResponse, Tx,
};
use idempotency_tests::{TestDb, postgres};

use crate::support::send;

/// A fresh database with a ledger, and a transactional engine over it.
async fn setup(single_commit: bool) -> (TestDb<PostgresStore>, Engine<PostgresStore>) {
    let db = postgres().await;
    sqlx::query("create table ledger_t (id bigserial primary key, entry text not null)")
        .execute(db.store.pool())
        .await
        .unwrap();
    let engine = Engine::new(db.store.clone())
        .with_transactional_mode(true)
        .with_single_commit(single_commit);
    (db, engine)
}

/// How many committed ledger rows say `entry`.
async fn rows(db: &TestDb<PostgresStore>, entry: &str) -> i64 {
    sqlx::query_scalar("select count(*) from ledger_t where entry = $1")
        .bind(entry)
        .fetch_one(db.store.pool())
        .await
        .unwrap()
}

/// Writes one ledger row through `tx`; its id.
async fn write(tx: &mut Tx, entry: &str) -> i64 {
    sqlx::query_scalar("insert into ledger_t (entry) values ($1) returning id")
        .bind(entry)
        .fetch_one(&mut **tx)
        .await
        .unwrap()
}

fn job(name: &str) -> Job {
    let key =
        IdempotencyKey::from_raw(&format!("{name}-{}", uuid::Uuid::new_v4().simple())).unwrap();
    Job::new(
        Scope::new("tx-steps").unwrap(),
        key,
        Fingerprint::of_bytes(b"debit"),
    )
}

/// Runs of a step's closure.
#[derive(Clone, Default)]
struct Ran(Arc<AtomicUsize>);

impl Ran {
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A step's writes and its record commit at the step, before the run
/// ends: the run then "dies" (abandons), its later writes roll back, and
/// the retry (under the default policy: a transactional record is taken
/// over) resumes: the step is replayed, not run, and its row is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_steps_writes_commit_with_its_record_and_a_resumed_run_skips_it() {
    let (db, engine) = setup(false).await;
    let job = job("phase");
    let ran = Ran::default();

    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let id: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    first.hit();
                    write(&mut tx, "reserve").await
                })
                .await
                .unwrap();
            // After the step, in the run's next transaction: rolled back
            // when the run dies.
            let mut tx = run.run().tx().await.unwrap();
            write(&mut tx, "after").await;
            drop(tx);
            Settle::Abandon { reply: id }
        })
        .await;
    let Answer::Ran {
        reply: reserved, ..
    } = answer
    else {
        panic!("the first run did not run: {answer:?}");
    };
    assert_eq!(rows(&db, "reserve").await, 1, "the step's write committed");
    assert_eq!(rows(&db, "after").await, 0, "the rest rolled back");
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Abandoned);
    assert!(record.transactional);
    assert_eq!(record.steps.len(), 1);
    assert_eq!(record.steps[0].name, "reserve");
    assert_eq!(record.steps[0].value, serde_json::json!(reserved));

    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let id: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    second.hit();
                    write(&mut tx, "reserve").await
                })
                .await
                .unwrap();
            // A plain step (another system) in transactional mode: recorded
            // on its own, fenced by the lease.
            let charge: String = run
                .step("charge", || async { "ch_1".to_owned() })
                .await
                .unwrap();
            assert_eq!(charge, "ch_1");
            let mut tx = run.run().tx().await.unwrap();
            write(&mut tx, "after").await;
            drop(tx);
            Settle::Complete {
                response: StoredResponse::from_bytes(id.to_string()),
                reply: id,
            }
        })
        .await;
    assert!(
        matches!(answer, Answer::Ran { reply, .. } if reply == reserved),
        "{answer:?}"
    );
    assert_eq!(ran.count(), 1, "the committed step never ran again");
    assert_eq!(rows(&db, "reserve").await, 1);
    assert_eq!(rows(&db, "after").await, 1);
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let names: Vec<&str> = record.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["reserve", "charge"]);
}

/// A step whose future is dropped before its commit (the run cut off at
/// the maximum handler time, as a crash cuts it) leaves neither its write
/// nor its record; nor does one whose connection dies before the commit.
/// The retry runs the step, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_cut_off_or_disconnected_before_its_commit_leaves_neither() {
    let (db, engine) = setup(false).await;
    let engine = engine.with_max_handler_time(Duration::from_millis(300));

    // Cut off inside the step, after its write.
    let job = job("cut");
    let answer = engine
        .run(job.clone(), |run| async move {
            let _: Result<(), _> = run
                .step_tx("reserve", |mut tx| async move {
                    write(&mut tx, "cut").await;
                    std::future::pending::<()>().await;
                })
                .await;
            Settle::Abandon { reply: () }
        })
        .await;
    assert!(
        matches!(answer, Answer::Refused(Refusal::HandlerTimeout { .. })),
        "{answer:?}"
    );
    assert_eq!(rows(&db, "cut").await, 0, "the step's write rolled back");
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert!(record.steps.is_empty(), "{:?}", record.steps);

    // Its connection killed between the write and the commit.
    let dead = self::job("dead");
    let answer = engine
        .run(dead.clone(), |run| async move {
            let step = run
                .step_tx("reserve", |mut tx| async move {
                    write(&mut tx, "dead").await;
                    sqlx::query("select pg_terminate_backend(pg_backend_pid())")
                        .execute(&mut *tx)
                        .await
                        .is_ok()
                })
                .await;
            Settle::Abandon { reply: step }
        })
        .await;
    assert!(
        matches!(
            answer,
            Answer::Ran {
                reply: Err(StepError::Record { .. }),
                ..
            }
        ),
        "{answer:?}"
    );
    assert_eq!(rows(&db, "dead").await, 0, "the step's write is gone");
    let record = db.store.get(&dead.scope, &dead.key).await.unwrap().unwrap();
    assert!(record.steps.is_empty(), "{:?}", record.steps);

    // The retries run the step once each.
    let engine = engine.with_max_handler_time(Duration::from_secs(30));
    for (job, entry) in [(job, "cut"), (dead, "dead")] {
        let ran = Ran::default();
        let counted = ran.clone();
        let answer = engine
            .run(job.clone(), move |run| async move {
                let id: i64 = run
                    .step_tx("reserve", |mut tx| async move {
                        counted.hit();
                        write(&mut tx, entry).await
                    })
                    .await
                    .unwrap();
                Settle::Complete {
                    response: StoredResponse::from_bytes(id.to_string()),
                    reply: (),
                }
            })
            .await;
        assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
        assert_eq!(ran.count(), 1);
        assert_eq!(rows(&db, entry).await, 1);
    }
}

/// A run that panics once a transactional step committed keeps the key,
/// abandoned (a release would delete the step, and the retry would write
/// its row again): the retry resumes, and the row is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panic_after_a_committed_step_keeps_it_for_the_retry() {
    let (db, engine) = setup(false).await;
    let job = job("panic");
    let ran = Ran::default();
    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let id: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    first.hit();
                    write(&mut tx, "panic").await
                })
                .await
                .unwrap();
            // The handler fails after its step (an id is never negative).
            assert!(id < 0, "the handler panics after its step");
            Settle::Abandon { reply: () }
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
            let _: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    second.hit();
                    write(&mut tx, "panic").await
                })
                .await
                .unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes("done"),
                reply: (),
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    assert_eq!(ran.count(), 1);
    assert_eq!(rows(&db, "panic").await, 1);
}

/// Writes through the run's `Tx` before a transactional step would commit
/// with it and run again on a resume: the step is refused, nothing runs.
/// Outside transactional mode there is no transaction to step in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transactional_step_after_writes_no_step_holds_is_refused() {
    let (db, engine) = setup(false).await;
    let ran = Ran::default();
    let counted = ran.clone();
    let answer = engine
        .run(job("before"), move |run| async move {
            let mut tx = run.run().tx().await.unwrap();
            write(&mut tx, "before").await;
            drop(tx);
            let step = run
                .step_tx("reserve", |_tx| async move { counted.hit() })
                .await;
            Settle::Release {
                reply: step,
                keep_writes: false,
            }
        })
        .await;
    assert!(
        matches!(
            answer,
            Answer::Ran {
                reply: Err(StepError::Unsupported(_)),
                ..
            }
        ),
        "{answer:?}"
    );
    assert_eq!(ran.count(), 0);
    assert_eq!(rows(&db, "before").await, 0);

    let plain = Engine::new(db.store.clone());
    let answer = plain
        .run(job("plain"), |run| async move {
            let step = run.step_tx("reserve", |_tx| async { 1 }).await;
            Settle::Abandon { reply: step }
        })
        .await;
    assert!(
        matches!(
            answer,
            Answer::Ran {
                reply: Err(StepError::Unsupported(_)),
                ..
            }
        ),
        "{answer:?}"
    );
}

/// Single-commit mode: the run is one transaction, the claim included; a
/// step is a savepoint in it and its record is written there too, so
/// the step's write, its record and the answer commit once, together. A
/// run that dies leaves nothing (no record, no row), and the retry runs
/// the step once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_commit_step_commits_once_with_the_answer() {
    let (db, engine) = setup(true).await;
    let job = job("single");
    let ran = Ran::default();

    let first = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let _: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    first.hit();
                    write(&mut tx, "single").await
                })
                .await
                .unwrap();
            Settle::Abandon { reply: () }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    assert_eq!(
        rows(&db, "single").await,
        0,
        "nothing of a dead run commits"
    );
    assert!(db.store.get(&job.scope, &job.key).await.unwrap().is_none());

    let second = ran.clone();
    let answer = engine
        .run(job.clone(), move |run| async move {
            let id: i64 = run
                .step_tx("reserve", |mut tx| async move {
                    second.hit();
                    write(&mut tx, "single").await
                })
                .await
                .unwrap();
            let charge: String = run
                .step("charge", || async { "ch_1".to_owned() })
                .await
                .unwrap();
            Settle::Complete {
                response: StoredResponse::from_bytes(format!("{id} {charge}")),
                reply: (),
            }
        })
        .await;
    assert!(matches!(answer, Answer::Ran { .. }), "{answer:?}");
    assert_eq!(ran.count(), 2, "each run ran it: the first left nothing");
    assert_eq!(rows(&db, "single").await, 1);
    let record = db.store.get(&job.scope, &job.key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let names: Vec<&str> = record.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["reserve", "charge"]);
}

/// A debit behind the transactional layer: a transactional step, then
/// (unless told to "crash" after the step) a write through the run's own
/// transaction, committed with the answer.
async fn debit(State(crash): State<Arc<AtomicUsize>>, run: Run) -> Response {
    let hold = run
        .step_tx("reserve", |mut tx| async move {
            write(&mut tx, "layer-reserve").await
        })
        .await;
    let hold: i64 = match hold {
        Ok(hold) => hold,
        Err(error) => return error.into_response(),
    };
    if crash.swap(0, Ordering::SeqCst) == 1 {
        // The process "dies" here: the answer is lost, the key abandoned.
        return (StatusCode::BAD_GATEWAY, OutcomeUnknown, "lost").into_response();
    }
    let mut tx = match run.tx().await {
        Ok(tx) => tx,
        Err(rejection) => return rejection.into_response(),
    };
    write(&mut tx, "layer-after").await;
    drop(tx);
    (StatusCode::CREATED, hold.to_string()).into_response()
}

/// Through the axum layer in transactional mode, under the default policy:
/// the run dies after its transactional step; the client's retry resumes
/// it (a transactional record is resumed from its committed steps) and
/// gets the real answer, with the step's row there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn through_the_layer_a_retry_resumes_after_the_committed_step() {
    let db = postgres().await;
    sqlx::query("create table ledger_t (id bigserial primary key, entry text not null)")
        .execute(db.store.pool())
        .await
        .unwrap();
    let crash = Arc::new(AtomicUsize::new(1));
    let router = Router::new()
        .route("/things", post(debit))
        .route_layer(IdempotencyLayer::new(db.store.clone()).with_transactional_mode(true))
        .with_state(Arc::clone(&crash));
    let lost = send(&router, "debit-1", "{}").await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY);
    assert_eq!(rows(&db, "layer-reserve").await, 1);
    assert_eq!(rows(&db, "layer-after").await, 0);

    let resumed = send(&router, "debit-1", "{}").await;
    assert_eq!(
        resumed.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&resumed.body)
    );
    assert!(!resumed.replayed());
    assert_eq!(rows(&db, "layer-reserve").await, 1, "the step ran once");
    assert_eq!(rows(&db, "layer-after").await, 1);
    let replayed = send(&router, "debit-1", "{}").await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, resumed.body);
}
