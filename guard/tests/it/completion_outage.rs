//! A store that fails while a run's outcome is being stored (an election, a
//! failover, a network partition): the engine sends the completion again,
//! with backoff, for as long as its completion retry window and its lease
//! allow (`engine/retry.rs`). An outage shorter than the window ends in a
//! stored outcome that the retry replays; one that outlasts the lease ends
//! as before: not stored, the key abandoned (`outcome-unknown`), never run
//! again. Each test cuts the store's path (the shared fixtures' `Partition`
//! proxy) between the work's end and its completion.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotency_guard::engine::{Answer, Engine, Job, Refusal, Settle, Settled};
use idempotency_guard::store::LeaseToken;
use idempotency_guard::{Fingerprint, RecordState, Store, StoredResponse};
use idempotency_tests::TestDb;
use tokio::sync::oneshot;

/// How long the store stays cut off in the first test: far longer than the
/// engine's former three attempts (pauses of 50 and 100 ms), as long as a
/// NATS JetStream leader election (4.6 to 8.3 s), within the default 30 s
/// completion retry window.
const OUTAGE: Duration = Duration::from_secs(6);
/// The most a test waits for a run's answer: far beyond what the bounds
/// under test allow.
const ANSWER_BOUND: Duration = Duration::from_secs(40);

macro_rules! completion_outage {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_completion_held_up_six_seconds_is_stored_and_replayed() {
                super::a_completion_held_up_six_seconds_is_stored_and_replayed($fixture().await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_outage_that_outlasts_the_lease_ends_in_outcome_unknown() {
                super::an_outage_that_outlasts_the_lease_ends_in_outcome_unknown($fixture().await)
                    .await;
            }
        }
    };
}

completion_outage!(redis_completion, idempotency_tests::redis);
completion_outage!(nats_completion, idempotency_tests::nats);

fn job(name: &str) -> Job {
    let key = format!("{name}-{}", LeaseToken::new().as_uuid().simple());
    Job::new(
        idempotency_guard::Scope::new("outage").expect("a valid scope"),
        idempotency_guard::IdempotencyKey::from_raw(&key).expect("a valid key"),
        Fingerprint::of_bytes(b"charge 100"),
    )
}

/// Starts a run of `job` whose work counts itself, says it started, and
/// completes once told to.
fn start<S: Store>(
    engine: &Engine<S>,
    job: Job,
    runs: &Arc<AtomicUsize>,
) -> (
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Answer<()>>,
) {
    let (started_tx, started) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let (engine, runs) = (engine.clone(), Arc::clone(runs));
    let run = tokio::spawn(async move {
        engine
            .run(job, move |_run| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Settle::Complete {
                    response: StoredResponse::from_bytes("charged"),
                    reply: (),
                }
            })
            .await
    });
    (started, finish, run)
}

/// The store is cut off as the work ends and comes back 6 s later: the
/// completion, sent again meanwhile with the engine's defaults, is stored;
/// the caller's answer waited for it, and a retry replays it.
async fn a_completion_held_up_six_seconds_is_stored_and_replayed<S: Store>(db: TestDb<S>) {
    let partition = db
        .redis_partition()
        .expect("the store is behind a partition");
    let engine = Engine::new(db.store.clone()).without_replay_cache();
    let runs = Arc::new(AtomicUsize::new(0));
    let job = job("held-up");
    let (started, finish, run) = start(&engine, job.clone(), &runs);
    started.await.expect("the work started");
    partition.cut();
    finish.send(()).expect("the work waits");
    tokio::time::sleep(OUTAGE).await;
    assert!(
        !run.is_finished(),
        "the completion was held up by the outage, not stored before it"
    );
    partition.heal();
    let answer = tokio::time::timeout(ANSWER_BOUND, run)
        .await
        .expect("the run answered")
        .expect("the run did not panic");
    assert!(
        matches!(
            answer,
            Answer::Ran {
                settled: Settled::Stored,
                ..
            }
        ),
        "the completion outlasted the outage: {answer:?}"
    );
    let again: Answer<()> = engine
        .run(job.clone(), |_run| async { panic!("the key ran twice") })
        .await;
    match again {
        Answer::Replay(stored) => assert_eq!(stored.body.as_deref(), Some(b"charged".as_slice())),
        other => panic!("the retry replays the stored outcome: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The store is cut off as the work ends and stays so past the run's
/// 3 s lease: the completion's retries stop before the lease's end (the
/// 60 s window notwithstanding), the caller gets its reply as not stored,
/// and once the store is back and the lease has lapsed, the key is
/// abandoned: a retry answers `outcome-unknown` and the work never runs
/// again (fail closed).
async fn an_outage_that_outlasts_the_lease_ends_in_outcome_unknown<S: Store>(db: TestDb<S>) {
    let partition = db
        .redis_partition()
        .expect("the store is behind a partition");
    let engine = Engine::new(db.store.clone())
        .without_replay_cache()
        .with_lease(Duration::from_secs(3))
        .with_store_timeout(Duration::from_millis(500))
        .with_completion_retry_window(Duration::from_secs(60));
    let runs = Arc::new(AtomicUsize::new(0));
    let job = job("outlasted");
    let (started, finish, run) = start(&engine, job.clone(), &runs);
    started.await.expect("the work started");
    partition.cut();
    finish.send(()).expect("the work waits");
    // Were the lease not a bound, the 60 s window would hold the answer
    // past this wait.
    let answer = tokio::time::timeout(ANSWER_BOUND, run)
        .await
        .expect("the retries ended at the lease, not at the window")
        .expect("the run did not panic");
    assert!(
        matches!(
            answer,
            Answer::Ran {
                settled: Settled::NotStored,
                ..
            }
        ),
        "the caller gets its reply, not stored: {answer:?}"
    );
    partition.heal();
    // The lease lapses on its own (nothing renews it any more).
    let mut record = None;
    for _ in 0..100 {
        record = db.store.get(&job.scope, &job.key).await.ok().flatten();
        if record
            .as_ref()
            .is_some_and(|r| r.state() == RecordState::Abandoned)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        record.map(|r| r.state()),
        Some(RecordState::Abandoned),
        "the key lapsed into abandoned"
    );
    let again: Answer<()> = engine
        .run(job, |_run| async { panic!("an abandoned key ran again") })
        .await;
    assert!(
        matches!(again, Answer::Refused(Refusal::OutcomeUnknown { .. })),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
