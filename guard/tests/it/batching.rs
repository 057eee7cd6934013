//! Group commit (`store::batch`): concurrent claims and completions that
//! queue go to the store together, and each still gets its own, exact
//! answer.
//!
//! The tests run on a current-thread runtime with one batch on its way at
//! a time. The first call of a `join_all` finds nothing on its way and goes
//! by itself (the path of a store without load); every later one queues
//! behind it, and they all go in the next batch (the counts prove it). So
//! each test leads its calls with one for another key.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, StatusCode};
use idempotency_guard::store::{BatchLimits, Claim, Lease, LeaseToken, NewRecord};
use idempotency_guard::{Fingerprint, RecordState, Store, StoreError, StoredResponse};

/// One batch on its way at a time, as large as the tests need.
pub(crate) const ONE_AT_A_TIME: BatchLimits = BatchLimits {
    max_batch: 256,
    max_in_flight: 1,
};

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// Instantiates the batching tests for one store; `$batched` turns a
/// fixture's store into one that batches with [`ONE_AT_A_TIME`].
macro_rules! batching_suite {
    ($backend:ident, $fixture:path) => {
        mod $backend {
            use $crate::batching as suite;

            batching_suite!(@tests $fixture;
                two_hundred_claims_of_one_key_in_one_batch_have_one_winner,
                a_mixed_batch_answers_each_claim_for_itself,
                a_batch_of_completions_is_fenced_per_record,
            );
        }
    };
    (@tests $fixture:path; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                let db = $fixture().await;
                let store = db.store.clone().with_batching(suite::ONE_AT_A_TIME);
                let stats = {
                    let store = store.clone();
                    move || store.batch_stats()
                };
                suite::$test(store, stats).await;
            }
        )*
    };
}

fn new_record<'a>(key: &'a str, fingerprint: &'a Fingerprint) -> NewRecord<'a> {
    NewRecord {
        scope: "batch",
        key,
        fingerprint,
        method: "POST",
        path: "/payments",
        token: LeaseToken::new(),
        lease: LEASE,
        retention: DAY,
        transactional: false,
    }
}

fn response(body: &'static str) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: HeaderMap::new(),
        body: Some(Bytes::from_static(body.as_bytes())),
    }
}

/// 200 claims of one key, all in one batch: exactly one holds the lease,
/// the 199 others see its record.
pub(crate) async fn two_hundred_claims_of_one_key_in_one_batch_have_one_winner<S: Store>(
    store: S,
    stats: impl Fn() -> idempotency_guard::store::BatchStats,
) {
    let fingerprint = Fingerprint::from_bytes([1; 32]);
    let lead = new_record("lead", &fingerprint);
    let records: Vec<NewRecord<'_>> = (0..200)
        .map(|_| new_record("one-key", &fingerprint))
        .collect();
    let mut claims = join_all(
        std::iter::once(&lead)
            .chain(&records)
            .map(|new| store.claim(new)),
    )
    .await;
    let counts = stats().claims;
    assert_eq!(
        (counts.batches, counts.largest),
        (2, 200),
        "the 200 claims did not go in one batch behind the lead: {counts:?}"
    );
    assert!(matches!(claims.remove(0), Ok(Claim::Acquired(_))));
    let mut winners = Vec::new();
    for (new, claim) in records.iter().zip(claims) {
        match claim.expect("claim") {
            Claim::Acquired(lease) => {
                assert_eq!(lease.token, new.token, "a lease with another's token");
                winners.push(lease);
            }
            Claim::Existing(_) => {}
        }
    }
    assert_eq!(winners.len(), 1, "{} claims won one key", winners.len());
    let record = store.get("batch", "one-key").await.unwrap().unwrap();
    assert_eq!(record.lease_token, winners[0].token);
    assert_eq!(record.state(), RecordState::InFlight);
}

/// One batch of claims for a fresh key, a completed key (claimed again with
/// its own fingerprint and with another), an in-flight key, and the fresh
/// key twice: each claim gets the answer it would get alone.
pub(crate) async fn a_mixed_batch_answers_each_claim_for_itself<S: Store>(
    store: S,
    stats: impl Fn() -> idempotency_guard::store::BatchStats,
) {
    let paid = Fingerprint::from_bytes([2; 32]);
    let other = Fingerprint::from_bytes([3; 32]);
    // A completed record and an in-flight one, made before the batch.
    let done = acquire(&store, &new_record("done", &paid)).await;
    store.complete(&done, &response("paid")).await.unwrap();
    let running = acquire(&store, &new_record("running", &paid)).await;
    let before = stats().claims.batches;

    let lead = new_record("lead", &paid);
    let batch = [
        new_record("fresh", &paid),
        new_record("done", &paid),
        new_record("done", &other),
        new_record("running", &paid),
        new_record("fresh", &other),
    ];
    let mut claims: Vec<Claim> = join_all(
        std::iter::once(&lead)
            .chain(&batch)
            .map(|new| store.claim(new)),
    )
    .await
    .into_iter()
    .map(|claim| claim.expect("claim"))
    .collect();
    assert_eq!(
        (stats().claims.batches, stats().claims.largest),
        (before + 2, 5),
        "the five claims did not go in one batch behind the lead"
    );
    claims.remove(0);

    match &claims[0] {
        Claim::Acquired(lease) => assert_eq!(lease.token, batch[0].token),
        other => panic!("the fresh key was not acquired: {other:?}"),
    }
    for index in [1, 2] {
        match &claims[index] {
            Claim::Existing(record) => {
                assert_eq!(record.state(), RecordState::Completed);
                assert_eq!(record.lease_token, done.token);
                assert_eq!(record.fingerprint, paid, "the record is the first one's");
                let body = record.response.as_ref().and_then(|r| r.body.clone());
                assert_eq!(body.as_deref(), Some(b"paid".as_slice()));
            }
            other => panic!("claim {index} of the completed key: {other:?}"),
        }
    }
    match &claims[3] {
        Claim::Existing(record) => {
            assert_eq!(record.state(), RecordState::InFlight);
            assert_eq!(record.lease_token, running.token);
        }
        other => panic!("the in-flight key: {other:?}"),
    }
    match &claims[4] {
        Claim::Existing(record) => {
            assert_eq!(
                record.lease_token, batch[0].token,
                "not the first claim's record"
            );
            assert_eq!(record.fingerprint, paid);
        }
        other => panic!("the fresh key's second claim in the batch: {other:?}"),
    }
}

/// One batch of completions: the holder's completes; a completion with a
/// stale token and one for a released record are refused, and the records
/// they name are untouched.
///
/// The three go in one batch only if the lead's completion is still on its
/// way while they queue. A store that answers the lead within its first
/// poll (seen once in a loaded full run on PostgreSQL) sends them otherwise:
/// every answer is still checked, and the scenario runs again on fresh keys
/// (at most five times) until the three went as one batch.
pub(crate) async fn a_batch_of_completions_is_fenced_per_record<S: Store>(
    store: S,
    stats: impl Fn() -> idempotency_guard::store::BatchStats,
) {
    for attempt in 0..5 {
        if completions_fenced_per_record(&store, &stats, attempt).await {
            return;
        }
    }
    panic!("in five attempts, the three completions never went as one batch behind the lead");
}

/// One attempt of [`a_batch_of_completions_is_fenced_per_record`] on keys
/// of its own; whether the three completions went as one batch.
async fn completions_fenced_per_record<S: Store>(
    store: &S,
    stats: &impl Fn() -> idempotency_guard::store::BatchStats,
    attempt: u32,
) -> bool {
    let fingerprint = Fingerprint::from_bytes([4; 32]);
    let key = |name: &str| format!("{name}-{attempt}");
    let (held_key, taken_key, released_key, lead_key) =
        (key("held"), key("taken"), key("released"), key("lead"));
    let held = acquire(store, &new_record(&held_key, &fingerprint)).await;
    let taken = acquire(store, &new_record(&taken_key, &fingerprint)).await;
    let released = acquire(store, &new_record(&released_key, &fingerprint)).await;
    store.release(&released).await.unwrap();
    let lead = acquire(store, &new_record(&lead_key, &fingerprint)).await;
    let stale = Lease {
        token: LeaseToken::new(),
        ..taken.clone()
    };
    let before = stats().completions;

    let first = response("first");
    let mut answers = join_all([
        store.complete(&lead, &first),
        store.complete(&held, &first),
        store.complete(&stale, &first),
        store.complete(&released, &first),
    ])
    .await;
    let after = stats().completions;
    assert!(answers.remove(0).is_ok(), "the lead's completion");
    assert!(
        answers[0].is_ok(),
        "the holder's completion: {:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Err(StoreError::LeaseLost)),
        "a stale token completed: {:?}",
        answers[1]
    );
    assert!(
        matches!(answers[2], Err(StoreError::LeaseLost)),
        "a released record completed: {:?}",
        answers[2]
    );

    let record = store.get("batch", &held_key).await.unwrap().unwrap();
    assert_eq!(record.state(), RecordState::Completed);
    let record = store.get("batch", &taken_key).await.unwrap().unwrap();
    assert_eq!(
        record.state(),
        RecordState::InFlight,
        "the stale write landed"
    );
    assert_eq!(record.lease_token, taken.token);
    assert!(store.get("batch", &released_key).await.unwrap().is_none());
    // Four items sent: the lead by itself, then the three behind it.
    assert_eq!(after.items, before.items + 4, "{after:?}");
    after.batches == before.batches + 2 && after.largest == 3
}

async fn acquire<S: Store>(store: &S, new: &NewRecord<'_>) -> Lease {
    match store.claim(new).await.expect("claim") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(record) => panic!("expected a new claim, found {record:?}"),
    }
}

/// A batch whose statement fails (a trigger refuses one of its keys) answers
/// every claim of it with the error, writes none of them, and leaves the
/// records it did not claim as they were.
async fn a_failing_batch_writes_nothing<S: Store>(
    store: S,
    stats: impl Fn() -> idempotency_guard::store::BatchStats,
) {
    let fingerprint = Fingerprint::from_bytes([5; 32]);
    let done = acquire(&store, &new_record("done", &fingerprint)).await;
    store.complete(&done, &response("paid")).await.unwrap();
    let running = acquire(&store, &new_record("running", &fingerprint)).await;
    let before = stats().claims.batches;

    let lead = new_record("lead", &fingerprint);
    let batch = [
        new_record("fresh", &fingerprint),
        new_record("done", &fingerprint),
        new_record("poison", &fingerprint),
        new_record("running", &fingerprint),
    ];
    let mut claims = join_all(
        std::iter::once(&lead)
            .chain(&batch)
            .map(|new| store.claim(new)),
    )
    .await;
    assert_eq!(
        (stats().claims.batches, stats().claims.largest),
        (before + 2, 4),
        "not one batch behind the lead"
    );
    assert!(matches!(claims.remove(0), Ok(Claim::Acquired(_))));
    for (new, claim) in batch.iter().zip(&claims) {
        assert!(
            matches!(claim, Err(StoreError::Unavailable(_))),
            "the claim of {} in the failed batch answered {claim:?}",
            new.key
        );
    }
    assert!(store.get("batch", "fresh").await.unwrap().is_none());
    assert!(store.get("batch", "poison").await.unwrap().is_none());
    let record = store.get("batch", "done").await.unwrap().unwrap();
    assert_eq!(
        (record.state(), record.lease_token),
        (RecordState::Completed, done.token)
    );
    let record = store.get("batch", "running").await.unwrap().unwrap();
    assert_eq!(
        (record.state(), record.lease_token),
        (RecordState::InFlight, running.token)
    );
    // The store still works for the keys that were not poisoned.
    let fresh = acquire(&store, &new_record("fresh", &fingerprint)).await;
    store.complete(&fresh, &response("later")).await.unwrap();
}

#[tokio::test]
async fn a_failing_postgres_batch_writes_nothing() {
    let db = idempotency_tests::postgres().await;
    for statement in [
        "create function poison() returns trigger language plpgsql as $$
         begin
           if new.key = 'poison' then raise exception 'poisoned key'; end if;
           return new;
         end $$",
        "create trigger poison before insert on idempotency_records
         for each row execute function poison()",
    ] {
        sqlx::query(statement)
            .execute(db.store.pool())
            .await
            .unwrap();
    }
    let store = db.store.clone().with_batching(ONE_AT_A_TIME);
    let stats = {
        let store = store.clone();
        move || store.batch_stats()
    };
    a_failing_batch_writes_nothing(store, stats).await;
}

#[tokio::test]
async fn a_failing_sqlite_batch_writes_nothing() {
    let db = idempotency_tests::sqlite().await;
    sqlx::query(
        "create trigger poison before insert on idempotency_records
         when new.key = 'poison'
         begin select raise(abort, 'poisoned key'); end",
    )
    .execute(db.store.pool())
    .await
    .unwrap();
    let store = db.store.clone().with_batching(ONE_AT_A_TIME);
    let stats = {
        let store = store.clone();
        move || store.batch_stats()
    };
    a_failing_batch_writes_nothing(store, stats).await;
}

/// A caller that goes away while its claim waits in a batch held up by a
/// lock: the batch lands after it left, and the batcher, which owns the
/// batch, releases the claim nobody will run (no engine involved here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_acquired_for_a_caller_that_left_is_released_by_the_batcher() {
    let db = idempotency_tests::sqlite().await;
    // Every insert leaves a trace, so the test knows the claim landed.
    for statement in [
        "create table claims_seen (key text)",
        "create trigger seen after insert on idempotency_records
         begin insert into claims_seen values (new.key); end",
    ] {
        sqlx::query(statement)
            .execute(db.store.pool())
            .await
            .unwrap();
    }
    let landed = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from claims_seen where key = 'left'")
            .fetch_one(db.store.pool())
            .await
            .unwrap()
            == 1
    };
    let store = db.store.clone().with_batching(ONE_AT_A_TIME);
    let mut blocker = db.store.pool().acquire().await.unwrap();
    sqlx::query("begin immediate")
        .execute(&mut *blocker)
        .await
        .unwrap();
    // A lead claim goes by itself (nothing is on its way) and waits for the
    // lock; the claim of the caller that leaves queues behind it, in the
    // batcher's hands.
    let lead = tokio::spawn({
        let store = store.clone();
        async move {
            let fingerprint = Fingerprint::from_bytes([6; 32]);
            store
                .claim(&new_record("lead", &fingerprint))
                .await
                .map(|_| ())
        }
    });
    for _ in 0..100 {
        if store.batch_stats().claims.batches == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.batch_stats().claims.batches, 1, "the lead did not go");
    let fingerprint = Fingerprint::from_bytes([6; 32]);
    let new = new_record("left", &fingerprint);
    let gone = tokio::time::timeout(Duration::from_millis(300), store.claim(&new)).await;
    assert!(gone.is_err(), "the claim was not held up by the write lock");
    sqlx::query("commit").execute(&mut *blocker).await.unwrap();
    drop(blocker);
    lead.await.unwrap().expect("the lead's claim");
    // The batch now commits the claim, finds its caller gone and releases it.
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if landed().await && store.get("batch", "left").await.unwrap().is_none() {
            return;
        }
    }
    let record = store.get("batch", "left").await.unwrap();
    panic!(
        "the claim of a caller that left landed: {}, its record: {record:?}",
        landed().await
    );
}
