//! The completion time a Redis record shows (docs/GUARANTEES.md, "Status
//! answers"): after a completion by the fenced script (Redis 7.0), the
//! time since the claim on the server's clock; after a native `SET … IFEQ
//! … KEEPTTL` (Valkey 8.1), the holder's own measured duration since its
//! claim. Either way, a holder that completes a known time after its
//! claim is read back as completed that long after its creation, within a
//! generous bound (a correctness bound, not a speed target).

use std::time::Duration;

use idempotency_guard::store::redis::RedisStore;
use idempotency_guard::store::{Claim, Lease, LeaseToken, NewRecord, Store};
use idempotency_guard::{Fingerprint, RecordState, StoredResponse};
use idempotency_tests::names;

/// How long the holder works between its claim and its completion.
const WORK: Duration = Duration::from_millis(400);

/// How far past [`WORK`] the completion time may read: scheduling and
/// round trips on a loaded machine, never a second of them in practice.
const SLACK: Duration = Duration::from_secs(2);

/// The server's script calls so far (`EVAL`, `EVALSHA` and their
/// variants), from `INFO commandstats`.
async fn script_calls(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .filter(|line| {
            [
                "eval",
                "evalsha",
                "eval_ro",
                "evalsha_ro",
                "fcall",
                "fcall_ro",
            ]
            .iter()
            .any(|name| line.starts_with(&format!("cmdstat_{name}:")))
        })
        .filter_map(|line| {
            line.split([':', ','])
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.parse::<u64>().ok())
        })
        .sum()
}

/// Claims `key`, works [`WORK`], completes: the lease and the response.
async fn claim_work_complete(store: &RedisStore, key: &str) -> (Lease, StoredResponse) {
    let fingerprint = Fingerprint::from_bytes([8; 32]);
    let new = NewRecord {
        scope: names::scope("s"),
        key: names::key(key),
        fingerprint: &fingerprint,
        method: "POST",
        path: "/orders",
        token: LeaseToken::new(),
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        transactional: false,
    };
    let Claim::Acquired(lease) = store.claim(&new).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    tokio::time::sleep(WORK).await;
    (lease, StoredResponse::from_bytes("done"))
}

/// Reads `key` back and checks its completion time against [`WORK`].
async fn assert_completed_after_the_work(store: &RedisStore, key: &str, path: &str) {
    let record = store
        .get(names::scope("s"), names::key(key))
        .await
        .unwrap()
        .expect("the completed record is there");
    assert_eq!(record.state(), RecordState::Completed);
    let completed_at = record.completed_at.expect("a completed record's time");
    let took = completed_at - record.created_at;
    assert!(
        took >= WORK && took < WORK + SLACK,
        "after {path}, the completion reads {took} after the creation; the holder worked \
         {WORK:?} (at most {SLACK:?} more allowed)"
    );
}

/// Valkey 8.1: the completion is one native `SET … IFEQ` (no script runs on
/// the private server meanwhile), and the completion time it carries is the
/// holder's measured time since its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ifeq_completion_time_is_the_holders_work_valkey() {
    let server = idempotency_tests::RedisServer::start_valkey().await;
    let url = server.url();
    let prefix = format!("test-completion-time-{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::connect(&url, &prefix).await.unwrap();
    assert!(store.native_fence(), "Valkey 8.1 has SET … IFEQ");

    let (lease, response) = claim_work_complete(&store, "native").await;
    let before = script_calls(&url).await;
    store.complete(&lease, &response).await.unwrap();
    assert_eq!(
        script_calls(&url).await,
        before,
        "the completion went as SET … IFEQ, not by script"
    );
    assert_completed_after_the_work(&store, "native", "SET … IFEQ").await;
}

/// Redis 7.0 (no `IFEQ`): the fenced script completes, and the completion
/// time it writes is the time since the claim on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_completion_time_is_the_holders_work_redis() {
    let db = idempotency_tests::redis().await;
    assert!(
        !db.store.native_fence(),
        "the shared Redis (7.0) has no SET … IFEQ, so completions go by script"
    );
    let url = idempotency_tests::fixtures::redis_url();

    let (lease, response) = claim_work_complete(&db.store, "script").await;
    let before = script_calls(&url).await;
    db.store.complete(&lease, &response).await.unwrap();
    assert!(
        script_calls(&url).await > before,
        "the completion ran the fenced script"
    );
    assert_completed_after_the_work(&db.store, "script", "the script").await;
}
